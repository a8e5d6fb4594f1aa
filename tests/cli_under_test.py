"""The command line of the tree under test: ``python -m dspark_ci`` with this interpreter, never whatever
``dspark-ci`` comes first on PATH (an install of another checkout would answer for this one)."""

from __future__ import annotations

import sys

DSPARK_CI = (sys.executable, "-m", "dspark_ci")
