import sys

from dspark_ci.ci.workflows.definitions import main

sys.exit(main())
