"""The house has floors: each package imports only floors below it (docs/ARCHITECTURE.md).

Read from the import statements of every module (AST, nothing imported), so a new arrow pointing up
fails here with the file and line that drew it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Lowest first. A package may import its own floor and any floor below it, never one above.
FLOORS = (
    ("ground",),
    ("matrices", "sglang_sim"),  # the simulator is a product of its own: it stands on the ground only
    ("launchers",),
    ("suites",),
    ("reports",),
    ("ci",),
    ("dspark_ci",),  # the CLI and the run pipeline, on top
)
FLOOR_OF = {package: level for level, packages in enumerate(FLOORS) for package in packages}


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) for every absolute import of one of our packages."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(node.lineno, name.split(".")[0]) for name in names if name.split(".")[0] in FLOOR_OF]
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


def test_the_layering_itself_is_checked_on_every_package():
    on_disk = {p.name for p in REPO.iterdir() if (p / "__init__.py").exists()}
    assert on_disk == set(FLOOR_OF), "a new package needs a floor in FLOORS"


def test_reports_know_exactly_the_metrics_the_suites_report():
    from dspark_ci.ground.suites import METRIC_SUITE, SUITE_DEFAULTS
    from dspark_ci.reports.metrics import METRICS

    assert set(METRICS) == set(METRIC_SUITE)
    assert set(METRIC_SUITE.values()) <= set(SUITE_DEFAULTS)


def _resolves(module: str) -> bool:
    """``module`` (dotted, one of ours) names a module file or a package folder of the repository."""
    path = REPO.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_every_import_of_our_own_modules_names_one_that_exists():
    """A module renamed or removed leaves no import behind (type checking ignores unknown modules here)."""
    broken = []
    for path in [*modules(), *sorted((REPO / "tests").rglob("*.py")), *sorted((REPO / "bench").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] in FLOOR_OF and not _resolves(node.module):
                    broken.append(f"{path.relative_to(REPO)}:{node.lineno}: from {node.module}")
            elif isinstance(node, ast.Import):
                broken += [f"{path.relative_to(REPO)}:{node.lineno}: import {alias.name}" for alias in node.names
                           if alias.name.split(".")[0] in FLOOR_OF and not _resolves(alias.name)]
    assert not broken, "imports of modules that do not exist:\n" + "\n".join(broken)
