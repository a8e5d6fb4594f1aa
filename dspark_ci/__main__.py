import sys

from dspark_ci.cli import main

sys.exit(main())
