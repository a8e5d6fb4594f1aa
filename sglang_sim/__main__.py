"""``python -m sglang_sim [SGLang launch_server flags]``: the simulated SGLang server."""

import sys

from sglang_sim.main import main

sys.exit(main())
