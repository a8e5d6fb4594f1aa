"""Matrices: YAML files that say which deployments to test, expanded into validated ``Cell`` records.

    from matrices import load_cells
    cells = load_cells(["matrices/nightly.yaml"])

Stages: ``yaml_lines`` (YAML with line numbers) -> ``schema`` (strict input records) ->
``expand`` (axes, exclude, include, overrides) -> ``build`` (defaults, layout, runner, id) -> Cell.
Any problem is ``dspark_ci.errors.BadInput`` naming ``file:line`` and the fix.
"""

from __future__ import annotations

from matrices.build import build_cell
from matrices.cell import Cell, Expect
from matrices.expand import expand
from matrices.schema import MatrixSpec, Where, parse_matrix
from matrices.yaml_lines import load_yaml

__all__ = ["Cell", "Expect", "load_cells", "load_matrix"]


def load_matrix(path: str) -> MatrixSpec:
    """One matrix file, validated into its input record."""
    return parse_matrix(load_yaml(path), path)


def load_cells(paths: list[str]) -> list[Cell]:
    """Every cell of the given matrices, in file order; ids unique across all of them."""
    cells: list[Cell] = []
    seen: dict[str, Cell] = {}
    for path in paths:
        spec = load_matrix(path)
        for fragment in expand(spec):
            cell = build_cell(fragment, spec)
            if cell.id in seen:
                first = seen[cell.id]
                raise Where(path, cell.line).error(
                    f"cell id {cell.id!r} is already used by the cell at {first.matrix}:{first.line}",
                    "give one of them `id_suffix:` (or an explicit `id:`), or remove the duplicate")
            seen[cell.id] = cell
            cells.append(cell)
    return cells
