"""``python -m dspark_ci.sglang_sim [SGLang launch_server flags]``: the simulated SGLang server."""

import sys

from dspark_ci.sglang_sim.main import main

sys.exit(main())
