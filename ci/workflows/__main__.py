import sys

from ci.workflows.definitions import main

sys.exit(main())
