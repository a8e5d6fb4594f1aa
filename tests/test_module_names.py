"""Distinct module names for distinct things (docs/ARCHITECTURE.md, "Module names").

A basename may repeat only between role-named packages: the launcher products (``launchers/<kind>/``: each
has its ``options.py``, ``lifecycle.py``, ``client.py``...) and the verbs (``dspark_ci/verbs/``: each module
is named after its verb, so ``verbs/cleanup.py`` beside ``launchers/k8s/cleanup.py`` is fine). Every other
module has a name no other module has, so a traceback, an import or a grep names one thing.
"""

from __future__ import annotations

import subprocess
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Packages whose modules are named after their role, shared by design across the family (as testcontainers'
# modules share container/waiting/client). Keep in step with docs/ARCHITECTURE.md.
ROLE_FAMILIES = {
    "launcher products": ("launchers/local", "launchers/docker", "launchers/slurm", "launchers/k8s"),
    "verbs": ("dspark_ci/verbs",),
}
EVERYWHERE = {"__init__", "__main__", "conftest"}
# A boot directory leads the PYTHONPATH of SGLang's own processes: its modules carry the names Python or SGLang
# import them by (``sitecustomize``, the ``sgl_kernel`` package a stand-in replaces), not names of our choosing.
BOOT_DIR = "boot"


def family_of(path: Path) -> str | None:
    folder = path.parent.as_posix()
    return next((name for name, folders in ROLE_FAMILIES.items() if folder in folders), None)


def python_modules() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()
    return [Path(p) for p in listed if (REPO / p).is_file()]


def repeated(paths: list[Path]) -> dict[str, list[str]]:
    by_name: dict[str, list[Path]] = defaultdict(list)
    for path in paths:
        if path.stem not in EVERYWHERE and BOOT_DIR not in path.parts:
            by_name[path.stem].append(path)
    return {name: sorted(p.as_posix() for p in found) for name, found in by_name.items()
            if len(found) > 1 and any(family_of(p) is None for p in found)}


def test_no_module_basename_repeats_outside_the_role_named_packages():
    clashes = repeated(python_modules())
    assert not clashes, ("modules sharing a name (rename the one outside launchers/<kind>/ to say what it is):\n"
                         + "\n".join(f"  {name}: {', '.join(paths)}" for name, paths in sorted(clashes.items())))


def test_the_rule_catches_a_pipeline_module_named_like_a_verb_or_a_product_role():
    assert repeated([Path("dspark_ci/run.py"), Path("dspark_ci/verbs/run.py")]) == {
        "run": ["dspark_ci/run.py", "dspark_ci/verbs/run.py"]}
    assert "options" in repeated([Path("launchers/options.py"), Path("launchers/slurm/options.py")])
    assert repeated([Path("launchers/slurm/options.py"), Path("launchers/k8s/options.py"),
                     Path("launchers/k8s/cleanup.py"), Path("dspark_ci/verbs/cleanup.py"),
                     Path("launchers/k8s/__init__.py"), Path("tests/__init__.py")]) == {}
