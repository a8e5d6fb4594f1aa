"""Where this dspark-ci lives, for the processes that import it without having it installed: SGLang's own venv
(the front end, the CPU engine and every process they spawn), a Slurm task, a container.

``IMPORT_ROOT`` holds the ``dspark_ci`` package: a clone's top, or the site-packages a wheel went into. ``TREE``
holds every file of the packages: a clone's top, or the installed ``dspark_ci`` folder. A clone's top holds
nothing importable but ours; a wheel's site-packages holds every package of this environment, which on another
Python's path would shadow that Python's own (numpy, openai...): ``alone_on_path`` gives a folder that holds our
package and nothing else.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import dspark_ci

PACKAGE = Path(dspark_ci.__file__).resolve().parent
IMPORT_ROOT = PACKAGE.parent
IS_CLONE = not (PACKAGE / "suites").is_dir()  # a clone (or an editable install) keeps the folders at its top
TREE = IMPORT_ROOT if IS_CLONE else PACKAGE


def alone_on_path(cache: Path) -> Path:
    """A folder for another Python's PYTHONPATH where ``import dspark_ci`` finds this package and nothing else
    of this environment: a clone's top as it is; for a wheel, a folder under ``cache`` with one link to it."""
    if IS_CLONE:
        return IMPORT_ROOT
    folder = cache / "import-root" / hashlib.sha256(str(PACKAGE).encode()).hexdigest()[:12]
    link = folder / "dspark_ci"
    if not link.is_symlink():
        folder.mkdir(parents=True, exist_ok=True)
        try:
            link.symlink_to(PACKAGE, target_is_directory=True)
        except FileExistsError:
            pass  # a concurrent launch made it first: the same link
    return folder
