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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from dspark_ci.ground.errors import BadInput
from dspark_ci.ground.identity import unlike
from dspark_ci.ground.records import CellResult, RunResults, Status
from dspark_ci.ground.stats import RESOLUTION
from dspark_ci.ground.suites import ACCEPT_CATEGORIES, MAX_POSITIONS, category_metric
from dspark_ci.reports.baseline_file import NEVER_INWARD_KEY, NEVER_INWARD_METRICS, NOISE_RUN_SDS, SCHEMA
from dspark_ci.reports.metrics import REQUEST_STDERR_OF, STDERR_OF

# metric -> its gate in a recorded baseline. Tolerances are the ones gates in the wild use
# (FIELD_NOTES.md): throughput -3%, median TTFT/TPOT +2.5%, accept length at 98% of the baseline. The detection line
# (what a pass rules out) is twice the tolerance unless written: throughput's would be 6 %, and a 5 % loss must
# not pass.
RECORDED_GATES: dict[str, dict[str, float]] = {
    "accept_length": {"min_ratio": 0.98},
    "accept_rate": {"min_ratio": 0.98},
    "output_throughput_tok_s": {"min_ratio": 0.97, "detect": 0.05},
    "tpot_ms_median": {"max_ratio": 1.025},
    "ttft_ms_median": {"max_ratio": 1.025},
    "gpqa_accuracy": {"max_drop_stderr": 2, "max_drop": 0.02},
    # log-likelihood multiple choice: the same paired gate over items (reports/gates.py; BENCHMARKS.md: its power)
    "mc_accuracy": {"max_drop_stderr": 2, "max_drop": 0.02},
    "parity_mismatches": {"max": 0},
    "speculative_speedup": {"min_ratio": 0.95},
    # per draft position and per category of the accept workload: fewer verify steps or requests each, so 10 %
    **{f"accept_rate_pos{k}": {"min_ratio": 0.9} for k in range(1, MAX_POSITIONS + 1)},
    **{category_metric(category): {"min_ratio": 0.9} for category in ACCEPT_CATEGORIES},
    # where speculation pays: the envelope gate (dspark_ci.reports.gates), at the boundary every recorded run reached
    "speculation_boundary_concurrency": {NEVER_INWARD_KEY: True},
}
# metric -> the ceiling a recorded baseline writes for it: this many times the highest reading of the runs, and never
# below the second figure (a fixed `max`, beside the median as `value`). For a figure that sits near zero on a healthy
# server and that a fault raises by what it adds rather than by a ratio of itself: the scheduler's blocked time per
# output token (suites/offcpu.py) moves with the machine's load (0.x to a few ms on a shared 2-core CPU) while a 20 ms
# sleep per decode step adds 20 ms / (tokens per step), e.g. 10 at two streams. The floor: three quiet engine runs
# read 0.1 ms, and twice that would call a page fault a finding.
RECORDED_CEILINGS: dict[str, tuple[float, float]] = {"scheduler_blocked_ms_per_token": (2.0, 2.0)}
# Why a metric a cell measured is not recorded for it: the reason, whether it applies to the cell, the metrics. Absolute
# speed on a CPU is the shared machine's (TTFT moved 30 % between two quiet engine runs): the scheduler's blocked time
# and the speedup over the reference booted beside the cell are gated instead. A model answering GPQA at chance is held
# to the guesser's band (gpqa.answers_at_chance), not to a recorded accuracy.
NOT_RECORDED: tuple[tuple[str, Callable[[CellResult], bool], tuple[str, ...]], ...] = (
    ("absolute speed on a CPU, the shared machine's", lambda cell: bool(cell.config and cell.config.device == "cpu"),
     ("output_throughput_tok_s", "tpot_ms_median", "ttft_ms_median")),
    ("GPQA answered at chance (its gate is the guesser's band)",
     lambda cell: bool((cell.suites.get("gpqa") or {}).get("answers_at_chance")), ("gpqa_accuracy",)),
)
DIGITS = 4  # significant digits kept in recorded values
RECOMMENDED_RUNS = 30  # runs a baseline should be recorded from for the gates' stated power (BENCHMARKS.md)
# Cells whose measurements a baseline may be recorded from: passed, or undecided against an older baseline.
MEASURED = (Status.PASSED, Status.INCONCLUSIVE)


def recorded_gates_text() -> str:
    """What ``propose`` writes per metric, for the CLI's help: from RECORDED_GATES and RECORDED_CEILINGS themselves."""
    families = ("accept_rate_pos", "accept_length_")  # per draft position, per workload category: one line each

    def said(gate) -> str:
        return ", ".join(key if isinstance(value, bool) else f"{key} {value:g}" for key, value in gate)

    shown = [f"{metric} ({said(gate.items())})" for metric, gate in RECORDED_GATES.items()
             if not metric.startswith(families)]
    for family, name in zip(families, ("per draft position", "per workload category"), strict=True):
        gates = {tuple(g.items()) for m, g in RECORDED_GATES.items() if m.startswith(family)}
        shown += [f"{name} ({said(gate)})" for gate in sorted(gates)]
    shown += [f"{metric} (max {factor:g} x the highest reading, at least {least:g})"
              for metric, (factor, least) in RECORDED_CEILINGS.items()]
    return "; ".join(shown)


@dataclass(frozen=True)
class Proposal:
    text: str  # the baseline file
    cells: int
    runs: int
    # file name (beside the baseline) -> {question id: mean score}: GPQA's per-question record, for paired gates
    per_question: Mapping[str, Mapping[str, float]] = field(default_factory=dict)



# What a run's server was, as a baseline's reader needs to hear it (environment.server; None: not recorded).
SERVER_SAYS = {"sim": "the simulated SGLang server",
               "sglang-frontend": "SGLang's front end before the simulated engine",
               "sglang-engine": "SGLang's real engine on a CPU (the model each cell names)",
               None: "a server the run did not record"}

def propose(runs: Sequence[tuple[str, RunResults]], description: str | None = None,
            per_question_stem: str | None = None) -> Proposal:
    """A baseline file from ``runs`` ((where, results) each); raises ``BadInput`` for a run that is not good.
    With ``per_question_stem`` each GPQA cell's per-question record goes to ``STEM.CELL.gpqa.json`` and each MC cell's
    per-item record to ``STEM.CELL.mc.json`` (named by its spec's ``per_question``), so both are gated paired over
    questions (items)."""
    for where, results in runs:
        _check_good(where, results)
    gated = _gated_cells(runs)
    too_noisy: list[str] = []  # "cell: metric (noise)" left ungated: the loader refuses a gate this noisy
    unestimated: list[str] = []  # "cell: metric: why" whose noise the runs could not estimate
    left_out = [f"{cell_id}: {', '.join(metrics)}: {why}" for cell_id, measured in gated.items()
                for why, applies, metrics in NOT_RECORDED if applies(measured[0])
                and any(measured[0].metrics.get(metric) is not None for metric in metrics)]
    cells: dict[str, dict[str, dict[str, Any]]] = {cell_id: _cell_specs(cell_id, measured, too_noisy, unestimated)
                                                   for cell_id, measured in gated.items()}
    records: dict[str, dict[str, float]] = {}
    for cell_id, measured in gated.items():
        for metric, (suite, tallies) in PAIRED_RECORDS.items():
            units = _per_question(measured, tallies)
            if per_question_stem and units and metric in cells[cell_id]:
                name = f"{per_question_stem}.{cell_id}.{suite}.json"
                records[name] = units
                cells[cell_id][metric]["per_question"] = name
    header = _header(runs, gated, too_noisy, unestimated, left_out)
    body = {"schema": SCHEMA,
            "description": description or f"Recorded by dspark-ci baseline record from {len(runs)} run(s)",
            "source": ", ".join(results.run_id or where for where, results in runs),
            "cells": cells}
    text = header + yaml.safe_dump(body, sort_keys=False, default_flow_style=None, allow_unicode=True, width=120)
    return Proposal(text=text, cells=len(cells), runs=len(runs), per_question=records)


# An accuracy gated paired over its units: the suite naming its record file (STEM.CELL.SUITE.json), and a cell's
# per-unit tallies (unit id -> (right, asked)).
PAIRED_RECORDS: dict[str, tuple[str, Callable[[CellResult], Mapping[str, tuple[int, int]]]]] = {
    "gpqa_accuracy": ("gpqa", lambda cell: cell.gpqa.per_question if cell.gpqa else {}),
    "mc_accuracy": ("mc", lambda cell: cell.mc.per_item if cell.mc else {}),
}


def _per_question(cells: list[CellResult],
                  of: Callable[[CellResult], Mapping[str, tuple[int, int]]] = PAIRED_RECORDS["gpqa_accuracy"][1],
                  ) -> dict[str, float]:
    """Mean score per question (item) over every run's repeats (the runs ask the same questions)."""
    tallies: dict[str, list[int]] = {}
    for cell in cells:
        for question, (right, asked) in of(cell).items():
            tally = tallies.setdefault(question, [0, 0])
            tally[0], tally[1] = tally[0] + right, tally[1] + asked
    return {question: round(right / asked, DIGITS) for question, (right, asked) in sorted(tallies.items()) if asked}


def _check_good(where: str, results: RunResults) -> None:
    if results.interrupted:
        raise BadInput(where, "the run was interrupted", "record a baseline from a run that finished")
    bad = [cell for cell in results.cells if cell.status.failing]
    if bad:
        shown = ", ".join(f"{cell.id} ({cell.status.value})" for cell in bad[:3])
        raise BadInput(where, f"not a good run: {shown}{' ...' if len(bad) > 3 else ''}",
                       "record a baseline only from a run in which every cell passed")
    if not any(cell.status in MEASURED for cell in results.cells):
        raise BadInput(where, "no cell was measured", "record a baseline from a run that served and measured cells")


def _gated_cells(runs: Sequence[tuple[str, RunResults]]) -> dict[str, list[CellResult]]:
    """cell id -> its measured results, one per run; every run must hold the same measured cells."""
    gated: dict[str, list[CellResult]] = {}
    for _, results in runs:
        for cell in results.cells:
            if cell.status in MEASURED:
                gated.setdefault(cell.id, []).append(cell)
    for where, results in runs:
        ids = {cell.id for cell in results.cells if cell.status in MEASURED}
        if ids != set(gated):
            missing = sorted(set(gated) - ids)
            raise BadInput(where, f"does not measure the same cells as the other runs (missing {missing[:3]})",
                           "record from repeats of one run: same matrices, same --cell selection")
    for cell_id, cells in gated.items():
        _check_same_identity(cell_id, cells, [where for where, _ in runs])
    return gated


def _check_same_identity(cell_id: str, cells: list[CellResult], wheres: list[str]) -> None:
    """Repeats of one measurement only: a baseline's noise over unlike setups or builds measures the difference."""
    first = next((cell.identity for cell in cells if cell.identity is not None), None)
    for where, cell in zip(wheres, cells, strict=False):
        if first is None or cell.identity is None or cell.identity.hash == first.hash:
            continue
        why = unlike(first, cell.identity) or f"build {first.build} vs {cell.identity.build}"
        raise BadInput(where, f"{cell_id} was not measured as in the other runs ({why})",
                       "record a baseline from repeats of one setup on one build")


def _cell_specs(cell_id: str, cells: list[CellResult], too_noisy: list[str],
                unestimated: list[str] | None = None) -> dict[str, dict[str, Any]]:
    specs: dict[str, dict[str, Any]] = {}
    for metric, gate in RECORDED_GATES.items():
        if any(metric in metrics and applies(cells[0]) for _, applies, metrics in NOT_RECORDED):
            continue
        found = [cell.metrics.get(metric) for cell in cells]
        values = [value for value in found if value is not None and math.isfinite(value)]
        if len(values) < len(found):
            continue
        if metric in PAIRED_RECORDS:
            spec = _accuracy_spec(cells, metric, values)
        elif metric in NEVER_INWARD_METRICS:
            # the smallest reading, not the median: a busy run's client holds fewer streams open, and every run
            # that was good must pass the gate it records (only points at or below the value are tested)
            spec = {"value": math.floor(min(values))} if min(values) >= 1 else None
        elif "max" in gate:
            spec = {}
        else:
            spec = {"value": _round(statistics.median(values))}
            if len(values) > 1 and spec["value"]:
                spec.update(_noise(cells, metric, values, unestimated, cell_id))
            if spec.get("noise", 0.0) >= 1 / NOISE_RUN_SDS:  # what dspark_ci.reports.baseline_file refuses to read back
                too_noisy.append(f"{cell_id}: {metric} (noise {spec['noise']:.0%} run to run)")
                continue
        if spec is not None:
            statistical = "noise" in spec or metric in PAIRED_RECORDS  # `detect` belongs to a statistical gate
            specs[metric] = {**spec, **{k: v for k, v in gate.items() if statistical or k != "detect"}}
    return {**specs, **_ceilings(cells)}


def _ceilings(cells: list[CellResult]) -> dict[str, dict[str, float]]:
    """RECORDED_CEILINGS of the metrics every run measured."""
    specs = {}
    for metric, (factor, least) in RECORDED_CEILINGS.items():
        found = [cell.metrics.get(metric) for cell in cells]
        values = [float(value) for value in found if value is not None and math.isfinite(value)]
        if values and len(values) == len(found):
            ceiling = max(factor * max(values), least)
            specs[metric] = {"value": _round(statistics.median(values)), "max": _round(ceiling)}
    return specs


def _noise(cells: list[CellResult], metric: str, values: list[float], unestimated: list[str] | None = None,
           cell_id: str = "") -> dict[str, float]:
    """The run-to-run noise over the runs, how many runs, and the part of it that per-request sampling within
    one boot explains (the mean of each run's own per-request standard error, as a fraction).

    Identical runs measure no noise: a 0 is never written. Their per-request standard error is the lower bound
    written instead (and said in the header, ``unestimated``); without one, no noise at all (the gate stays a fixed
    limit, and the header says why)."""
    spec: dict[str, float] = {"noise": _round(statistics.stdev(values) / abs(statistics.median(values))),
                              "runs": len(values)}
    name = REQUEST_STDERR_OF.get(metric)
    within = [stderr / value for cell, value in zip(cells, values, strict=False)
              if name and (stderr := cell.metrics.get(name))]
    if len(within) == len(values):
        spec["request_noise"] = _round(statistics.fmean(within))
    if spec["noise"] <= RESOLUTION:
        notes = unestimated if unestimated is not None else []
        if spec.get("request_noise"):
            spec["noise"] = spec["request_noise"]
            notes.append(f"{cell_id}: {metric}: the {len(values)} runs were identical, which measures no noise; "
                         f"written as its lower bound, one boot's per-request standard error ({spec['noise']:.2%})")
        else:
            notes.append(f"{cell_id}: {metric}: the {len(values)} runs were identical and no per-request error was "
                         "measured: no noise can be estimated, so none is written (a fixed ratio limit)")
            return {}
    return spec


def _accuracy_spec(cells: list[CellResult], metric: str, values: list[float]) -> dict[str, float] | None:
    found = [cell.metrics.get(STDERR_OF[metric]) for cell in cells]
    errors = [se for se in found if se is not None and math.isfinite(se)]
    if len(errors) < len(found):
        return None  # a floor without its sampling error is a flake waiting to happen
    # Repeated runs ask the same questions: they add no questions, so the error bar is one run's, not
    # one run's divided by the square root of the number of runs.
    return {"value": _round(statistics.fmean(values)), "stderr": _round(statistics.fmean(errors))}


def _round(value: float) -> float:
    return float(f"{value:.{DIGITS}g}")


def _header(runs: Sequence[tuple[str, RunResults]], gated: dict[str, list[CellResult]],
            too_noisy: Sequence[str] = (), unestimated: Sequence[str] = (), left_out: Sequence[str] = ()) -> str:
    """Comment lines a reviewer reads first: where the numbers come from and what to check."""
    lines = ["Baseline proposal written by `dspark-ci baseline record`: review it before committing."]
    for where, results in runs:
        env = results.environment
        lines.append(f"run {results.run_id or where}: started {results.started_at or '?'}, "
                     f"server {env.get('server', '?')}, SGLang {env.get('sglang_version', '?')}, "
                     f"launcher {results.launcher or '?'}, host {env.get('hostname', '?')}")
    for cell_id, cells in gated.items():
        config = cells[0].config
        lines.append(f"{cell_id}: runner {cells[0].runner or '?'}, device {config.device if config else '?'}")
    if len(runs) == 1:
        lines.append("One run: no run-to-run noise measured; record from three or more runs "
                     "(`dspark-ci baseline record RUN1 RUN2 RUN3`) so ratio gates widen to the noise.")
    else:
        lines.append("noise: run-to-run standard deviation over the runs as a fraction of the value; a ratio "
                     f"gate is never tighter than {NOISE_RUN_SDS:g} of them.")
        if len(runs) < RECOMMENDED_RUNS:
            lines.append(f"{len(runs)} runs: the statistical gates' power grows with them; from {RECOMMENDED_RUNS} "
                         "(a month of green nights) a 5 % speed regression under 2 % run-to-run noise is red >= 95 % "
                         "of the time, from 10 about 60 % (bench/gate_power.py --baseline-runs N).")
    lines += [f"Noise not estimated: {note}" for note in unestimated]
    lines += [f"Not recorded: {note}" for note in left_out]
    if too_noisy:
        lines.append(f"Not gated, too noisy to gate anything (run-to-run noise of {1 / NOISE_RUN_SDS:.0%} or more; "
                     "re-record on a quieter machine): " + "; ".join(too_noisy))
    servers = {results.environment.get("server") for _, results in runs} - {"sglang"}
    if servers:
        lines.append(f"Measured on {' and '.join(sorted(SERVER_SAYS.get(s, SERVER_SAYS[None]) for s in servers))}: "
                     "re-record on GPUs with --server sglang before gating real hardware.")
    return "".join(f"# {line}\n" for line in lines)
