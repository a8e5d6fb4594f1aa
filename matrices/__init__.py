"""Matrices: YAML files that say which deployments to test, expanded into validated ``Cell`` records.

    from dspark_ci.matrices import load_cells
    cells = load_cells(["matrices/nightly.yaml"])

Stages: ``dspark_ci.ground.yaml_lines`` (YAML with line numbers) -> ``schema`` (strict input records) ->
``expand`` (axes, exclude, include, overrides) -> ``build`` (defaults, layout, runner, id) -> Cell.
Any problem is ``dspark_ci.ground.errors.BadInput`` naming ``file:line`` and the fix.
"""

from __future__ import annotations

from dspark_ci.ground.yaml_lines import config_file_words, load_yaml
from dspark_ci.matrices.build import build_cell
from dspark_ci.matrices.cell import Cell, Expect
from dspark_ci.matrices.expand import expand
from dspark_ci.matrices.schema import MatrixSpec, Where, parse_matrix

__all__ = ["MATRIX_FILE", "Cell", "Expect", "load_cells", "load_matrix"]

# How a matrix file that cannot be read or parsed is reported.
MATRIX_FILE = config_file_words("matrix file", "check the path (matrices live in matrices/*.yaml)")


def load_matrix(path: str) -> MatrixSpec:
    """One matrix file, validated into its input record."""
    return parse_matrix(load_yaml(path, MATRIX_FILE), path)


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
                raise Where(path, cell.line or 1).error(
                    f"cell id {cell.id!r} is already used by the cell at {first.matrix}:{first.line}",
                    "give one of them `id_suffix:` (or an explicit `id:`), or remove the duplicate")
            seen[cell.id] = cell
            cells.append(cell)
    return cells
