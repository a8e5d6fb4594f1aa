"""A baseline proposal from good runs (``dspark-ci baseline record``): reference values, the run-to-run
noise measured across the runs, and the stated tolerances, as a baseline file (baselines/README.md).

Given several runs of the same cells, each value is the median over the runs and ``noise`` their
standard deviation as a fraction of the value (the gate widens to ``NOISE_RUN_SDS`` of it when that is
looser than the stated ratio). GPQA keeps its own sampling error instead: the mean accuracy, and the
standard error of that mean.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

import yaml

from ground.errors import BadInput
from ground.identity import unlike
from ground.records import CellResult, RunResults, Status
from reports.baseline import NOISE_RUN_SDS, SCHEMA

# metric -> its gate in a recorded baseline. Tolerances are the ones gates in the wild use
# (FIELD_NOTES.md): throughput -3%, median TTFT/TPOT +2.5%, accept length at 95% of the baseline.
RECORDED_GATES: dict[str, dict[str, float]] = {
    "accept_length": {"min_ratio": 0.95},
    "accept_rate": {"min_ratio": 0.95},
    "output_throughput_tok_s": {"min_ratio": 0.97},
    "tpot_ms_median": {"max_ratio": 1.025},
    "ttft_ms_median": {"max_ratio": 1.025},
    "gpqa_accuracy": {"max_drop_stderr": 2},
    "parity_mismatches": {"max": 0},
}
DIGITS = 4  # significant digits kept in recorded values


@dataclass(frozen=True)
class Proposal:
    text: str  # the baseline file
    cells: int
    runs: int


def propose(runs: Sequence[tuple[str, RunResults]], description: str | None = None) -> Proposal:
    """A baseline file from ``runs`` ((where, results) each); raises ``BadInput`` for a run that is not good."""
    for where, results in runs:
        _check_good(where, results)
    gated = _gated_cells(runs)
    cells = {cell_id: _cell_specs(measured) for cell_id, measured in gated.items()}
    header = _header(runs, gated)
    body = {"schema": SCHEMA,
            "description": description or f"Recorded by dspark-ci baseline record from {len(runs)} run(s)",
            "source": ", ".join(results.run_id or where for where, results in runs),
            "cells": cells}
    text = header + yaml.safe_dump(body, sort_keys=False, default_flow_style=None, allow_unicode=True, width=120)
    return Proposal(text=text, cells=len(cells), runs=len(runs))


def _check_good(where: str, results: RunResults) -> None:
    if results.interrupted:
        raise BadInput(where, "the run was interrupted", "record a baseline from a run that finished")
    bad = [cell for cell in results.cells if cell.status.failing]
    if bad:
        shown = ", ".join(f"{cell.id} ({cell.status.value})" for cell in bad[:3])
        raise BadInput(where, f"not a good run: {shown}{' ...' if len(bad) > 3 else ''}",
                       "record a baseline only from a run in which every cell passed")
    if not any(cell.status is Status.PASSED for cell in results.cells):
        raise BadInput(where, "no cell was measured", "record a baseline from a run that served and measured cells")


def _gated_cells(runs: Sequence[tuple[str, RunResults]]) -> dict[str, list[CellResult]]:
    """cell id -> its measured results, one per run; every run must hold the same measured cells."""
    gated: dict[str, list[CellResult]] = {}
    for _, results in runs:
        for cell in results.cells:
            if cell.status is Status.PASSED:
                gated.setdefault(cell.id, []).append(cell)
    for where, results in runs:
        ids = {cell.id for cell in results.cells if cell.status is Status.PASSED}
        if ids != set(gated):
            missing = sorted(set(gated) - ids)
            raise BadInput(where, f"does not measure the same cells as the other runs (missing {missing[:3]})",
                           "record from repeats of one run: same matrices, same --cell selection")
    for cell_id, cells in gated.items():
        _check_same_identity(cell_id, cells, [where for where, _ in runs])
    return gated


def _check_same_identity(cell_id: str, cells: list[CellResult], wheres: list[str]) -> None:
    """Repeats of one measurement only: a baseline's noise over unlike setups or builds measures the difference."""
    first = next((cell for cell in cells if cell.identity is not None), None)
    for where, cell in zip(wheres, cells):
        if first is None or cell.identity is None or cell.identity.hash == first.identity.hash:
            continue
        why = unlike(first.identity, cell.identity) or f"build {first.identity.build} vs {cell.identity.build}"
        raise BadInput(where, f"{cell_id} was not measured as in the other runs ({why})",
                       "record a baseline from repeats of one setup on one build")


def _cell_specs(cells: list[CellResult]) -> dict[str, dict[str, float]]:
    specs: dict[str, dict[str, float]] = {}
    for metric, gate in RECORDED_GATES.items():
        values = [cell.metrics.get(metric) for cell in cells]
        if any(value is None or not math.isfinite(value) for value in values):
            continue
        if metric == "gpqa_accuracy":
            spec = _gpqa_spec(cells, values)
        elif "max" in gate:
            spec = {}
        else:
            spec = {"value": _round(statistics.median(values))}
            if len(values) > 1 and spec["value"]:
                spec["noise"] = _round(statistics.stdev(values) / abs(statistics.median(values)))
        if spec is not None:
            specs[metric] = {**spec, **gate}
    return specs


def _gpqa_spec(cells: list[CellResult], values: list[float]) -> dict[str, float] | None:
    errors = [cell.metrics.get("gpqa_stderr") for cell in cells]
    if any(se is None or not math.isfinite(se) for se in errors):
        return None  # a floor without its sampling error is a flake waiting to happen
    # Repeated runs ask the same questions: they add no questions, so the error bar is one run's, not
    # one run's divided by the square root of the number of runs.
    return {"value": _round(statistics.fmean(values)), "stderr": _round(statistics.fmean(errors))}


def _round(value: float) -> float:
    return float(f"{value:.{DIGITS}g}")


def _header(runs: Sequence[tuple[str, RunResults]], gated: dict[str, list[CellResult]]) -> str:
    """Comment lines a reviewer reads first: where the numbers come from and what to check."""
    lines = ["Baseline proposal written by `dspark-ci baseline record`: review it before committing."]
    for where, results in runs:
        env = results.environment
        lines.append(f"run {results.run_id or where}: started {results.started_at or '?'}, "
                     f"server {env.get('server', '?')}, SGLang {env.get('sglang_version', '?')}, "
                     f"launcher {results.launcher or '?'}, host {env.get('hostname', '?')}")
    for cell_id, cells in gated.items():
        config = cells[0].config
        lines.append(f"{cell_id}: runner {cells[0].runner or '?'}, device {config.get('device', '?')}")
    if len(runs) == 1:
        lines.append("One run: no run-to-run noise measured; record from three or more runs "
                     "(`dspark-ci baseline record RUN1 RUN2 RUN3`) so ratio gates widen to the noise.")
    else:
        lines.append("noise: run-to-run standard deviation over the runs as a fraction of the value; a ratio "
                     f"gate is never tighter than {NOISE_RUN_SDS:g} of them.")
    if any(results.environment.get("server") != "sglang" for _, results in runs):
        lines.append("Measured on the simulated SGLang server (or a run that did not record its server): "
                     "re-record on GPUs with --server sglang before gating real hardware.")
    return "".join(f"# {line}\n" for line in lines)
