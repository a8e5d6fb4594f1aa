"""dspark-ci: one namespace. Everything installs under ``dspark_ci`` (``dspark_ci.suites``, ``dspark_ci.reports``,
``dspark_ci.ground``...), so that an environment with its own ``ci``, ``reports`` or ``suites`` is never shadowed.

An installed wheel has the packages inside this folder (pyproject's ``package-dir``). A clone keeps them at the
top of the repository (``suites/``, ``reports/``...: ``pytest suites/`` and the docs' paths stay as they are), so
there this package's path also reaches the repository's top. Import-light on purpose: SGLang's own processes
import ``dspark_ci.sglang_sim...`` and ``dspark_ci.ground...`` through the engine's boot path, and pay for nothing
else here.
"""

import os

# The packages of the namespace that a clone keeps beside this folder (pyproject's package-dir maps the same list).
CLONE_FOLDERS = ("ground", "matrices", "sglang_sim", "launchers", "suites", "reports", "ci")

_HERE = os.path.dirname(os.path.abspath(__file__))
_TOP = os.path.dirname(_HERE)
if not os.path.isdir(os.path.join(_HERE, "suites")) and os.path.isfile(os.path.join(_TOP, "suites", "__init__.py")):
    __path__.append(_TOP)  # a clone: dspark_ci.suites is the repository's suites/
