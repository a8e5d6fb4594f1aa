"""Turn a validated matrix into one fragment per cell: cross the axes, drop `exclude` matches, add
`include` entries, apply `overrides`. A rule that matches nothing is an error: it is stale or
misspelt, and silently ignoring it would test something other than what the author meant."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping
from functools import reduce
from typing import Any

from dspark_ci.ground.sglang.settings import DEFAULTS
from dspark_ci.matrices.schema import CONFIG_KEYS, Fragment, MatrixSpec, Where

# What a cell is when the matrix does not say: each setting's default (ground/sglang/settings.py).
CODE_DEFAULTS: Mapping[str, Any] = DEFAULTS


# Past this many cells a matrix is refused before anything is built: counted from the axes' lengths, so a typo that
# crosses to 10^9 cells answers in milliseconds instead of filling memory. 10,000 cells is already 40 GitHub matrices.
MAX_CELLS = 10_000


def effective(fragment: Fragment) -> dict:
    """The fragment's config keys with code defaults filled in, plus its env."""
    values = {**CODE_DEFAULTS, **{k: v for k, v in fragment.values.items() if k in CONFIG_KEYS}}
    values["env"] = dict(fragment.values.get("env", {}))
    return values


def matches(rule: Fragment, cell: Fragment) -> bool:
    have = effective(cell)
    for key, want in rule.values.items():
        if key == "env":
            if any(have["env"].get(name) != value for name, value in want.items()):
                return False
        elif have.get(key) != want:
            return False
    return True


def _crossed(spec: MatrixSpec) -> list[Fragment]:
    if not spec.axes:
        return []
    combos = itertools.product(*(axis.values for axis in spec.axes))
    return [reduce(Fragment.merged, combo, spec.defaults) for combo in combos]


def _describe(rule: Fragment) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in rule.values.items())


def count_cells(spec: MatrixSpec) -> int:
    """How many cells the matrix can produce (crossed axes plus includes), without building any."""
    return (math.prod(len(axis.values) for axis in spec.axes) if spec.axes else 0) + len(spec.include)


def _check_size(spec: MatrixSpec) -> None:
    count = count_cells(spec)
    if count <= MAX_CELLS:
        return
    sizes = " × ".join(f"{axis.key} {len(axis.values)}" for axis in spec.axes)
    extra = f" + {len(spec.include)} include entries" if spec.include else ""
    line = spec.axes[0].line if spec.axes else 1
    raise Where(spec.path, line).error(
        f"this matrix expands to {count:,} cells (axes: {sizes}{extra}), more than the {MAX_CELLS:,} a matrix may hold",
        "cross fewer values, or split it into several matrices")


def expand(spec: MatrixSpec) -> list[Fragment]:
    _check_size(spec)
    cells = _crossed(spec)
    for rule in spec.exclude:
        kept = [cell for cell in cells if not matches(rule, cell)]
        if len(kept) == len(cells):
            raise Where(spec.path, rule.line).error(
                f"this exclude ({_describe(rule)}) matches none of the crossed axes",
                "fix its keys/values to name a combination the axes produce, or remove it")
        cells = kept
    cells += [spec.defaults.merged(entry) for entry in spec.include]
    for override in spec.overrides:
        hits = [i for i, cell in enumerate(cells) if matches(override.match, cell)]
        if not hits:
            raise Where(spec.path, override.line).error(
                f"this override's match ({_describe(override.match)}) matches no cell",
                "fix its keys/values (values are compared after defaults apply), or remove it")
        for i in hits:
            # The cell keeps the line it was declared at; the patched keys remember the override's lines.
            cells[i] = dataclasses.replace(cells[i].merged(override.set), line=cells[i].line)
    if not cells:
        raise Where(spec.path, 1).error("this matrix defines no cells",
                                        "add `axes:` to cross, or `include:` entries")
    return cells
