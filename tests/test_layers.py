"""The house has floors: each package imports only floors below it (docs/ARCHITECTURE.md).

Read from the import statements of every module (AST, nothing imported), so a new arrow pointing up
fails here with the file and line that drew it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "dspark_ci"

# Lowest first. A package may import its own floor and any floor below it, never one above. Every package lives in
# the dspark_ci namespace (dspark_ci.ground, ...; a clone keeps their folders at the top); the namespace's own
# modules (dspark_ci/*.py, dspark_ci/verbs/) are orchestration, on top.
FLOORS = (
    ("ground",),  # records, statistics, SGLang's facts, and process control: groups, signals, interrupts, the ledger
    ("matrices", "sglang_sim"),  # the simulator is a product of its own: it stands on the ground only
    ("launchers",),
    ("suites",),  # the measurements, run standalone by pytest against any URL
    ("reports",),
    ("ci",),
    (NAMESPACE,),  # orchestration: the CLI, the run pipeline, starting the suites against a deployment
)
FLOOR_OF = {package: level for level, packages in enumerate(FLOORS) for package in packages}
PACKAGES = tuple(package for package in FLOOR_OF if package != NAMESPACE)


def floor_package(dotted: str, names: list[str] = ()) -> str | None:
    """The floor's package a dotted import names (``dspark_ci.suites.x`` -> suites, ``dspark_ci.cli`` -> dspark_ci);
    ``from dspark_ci import suites`` names ``names``' package. None: not ours, or the namespace's bare root."""
    parts = dotted.split(".")
    if parts[0] != NAMESPACE:
        return None
    if len(parts) > 1:
        return parts[1] if parts[1] in PACKAGES else NAMESPACE
    return next((name for name in names if name in PACKAGES), NAMESPACE if names else None)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, floor's package) for every absolute import of one of our modules."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [floor_package(alias.name) for alias in node.names if "." in alias.name]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            targets = [floor_package(node.module, [alias.name for alias in node.names])]
        else:
            continue
        found += [(node.lineno, target) for target in targets if target is not None]
    return found


def modules():
    for package in FLOOR_OF:
        yield from sorted((REPO / package).rglob("*.py"))


@pytest.mark.parametrize("path", list(modules()), ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_imports_a_floor_above_its_own(path):
    own = path.relative_to(REPO).parts[0]
    upward = [f"{path.relative_to(REPO)}:{line}: imports {target}" for line, target in imports_of(path)
              if FLOOR_OF[target] > FLOOR_OF[own] or (FLOOR_OF[target] == FLOOR_OF[own] and target != own)]
    assert not upward, "imports pointing up a floor:\n" + "\n".join(upward)


def test_the_ground_imports_no_stage():
    stages = [f"{p.relative_to(REPO)}:{line}: {target}" for p in sorted((REPO / "ground").rglob("*.py"))
              for line, target in imports_of(p) if target != "ground"]
    assert stages == []


def test_process_control_is_the_floors_and_starting_the_suites_is_orchestrations():
    """Groups, signals, interrupts and the ledger stand below the launchers; the suites and the reports import no
    launcher (starting the suites against a deployment is the pipeline's, above them)."""
    assert {"processes.py", "interrupts.py", "ledger.py"} <= {p.name for p in (REPO / "ground").glob("*.py")}
    upward = [f"{p.relative_to(REPO)}:{line}" for package in ("suites", "reports")
              for p in sorted((REPO / package).rglob("*.py"))
              for line, target in imports_of(p) if target == "launchers"]
    assert upward == []


def test_the_layering_itself_is_checked_on_every_package():
    on_disk = {p.name for p in REPO.iterdir() if (p / "__init__.py").exists()}
    assert on_disk == set(FLOOR_OF), "a new package needs a floor in FLOORS"


def test_every_floor_is_a_folder_the_namespace_reaches():
    import dspark_ci

    assert set(dspark_ci.CLONE_FOLDERS) == set(PACKAGES)


def test_reports_know_exactly_the_metrics_the_suites_report():
    from dspark_ci.ground.suites import METRIC_SUITE, SUITE_DEFAULTS
    from dspark_ci.reports.metrics import METRICS

    assert set(METRICS) == set(METRIC_SUITE)
    assert set(METRIC_SUITE.values()) <= set(SUITE_DEFAULTS)


def _resolves(module: str) -> bool:
    """``module`` (dotted, one of ours) names a module file or a package folder of the repository."""
    parts = module.split(".")[1:]
    path = REPO.joinpath(*parts) if parts and parts[0] in PACKAGES else REPO.joinpath(NAMESPACE, *parts)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_every_import_of_our_own_modules_names_one_that_exists():
    """A module renamed or removed leaves no import behind (type checking ignores unknown modules here)."""
    broken = []
    for path in [*modules(), *sorted((REPO / "tests").rglob("*.py")), *sorted((REPO / "bench").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] == NAMESPACE and not _resolves(node.module):
                    broken.append(f"{path.relative_to(REPO)}:{node.lineno}: from {node.module}")
            elif isinstance(node, ast.Import):
                broken += [f"{path.relative_to(REPO)}:{node.lineno}: import {alias.name}" for alias in node.names
                           if alias.name.split(".")[0] == NAMESPACE and not _resolves(alias.name)]
    assert not broken, "imports of modules that do not exist:\n" + "\n".join(broken)
