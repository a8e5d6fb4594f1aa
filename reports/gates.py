"""Gates: what a cell's measurements must satisfy, as ``GateResult`` records (CONTRACT.md gate dicts on disk).

Two sources:
- floors that need no baseline: a speculative cell's accept length must stay above the collapse
  floor (a draft model that never gets accepted serves correct text, only slowly), and GPQA accuracy
  must beat guessing by a margin that shrinks with the number of questions (``chance_floor``);
- a baseline's specs for the cell (``reports.baseline``): ratio gates widened to the run-to-run noise
  measured for the cell when the baseline records it (``MetricSpec.ratio``).

A gated metric that was not measured gives ``value: None, passed: False``: a gate that silently
passes because its suite did not run would hide exactly the regressions it exists for.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping

from ground.records import CellResult, GateResult, RunResults, Status
from reports.baseline import NOISE_RUN_SDS, Baseline, MetricSpec
from reports.metrics import STDERR_OF, format_value, in_table_order

COLLAPSE_FLOOR = 1.2  # accept_length at or below ~1 means no draft token is being accepted
GPQA_CHANCE = 0.25  # four choices
CHANCE_MARGIN_SE = 2.0  # standard errors of a guesser's score above chance
GATE_PRECISION = 6  # decimals kept in thresholds (ratios make long floats)


def evaluate(cell: CellResult, metrics: Mapping, baseline: Baseline | None) -> tuple[GateResult, ...]:
    """All gates for one cell: floors first, then the baseline's, in the metric table's order."""
    return tuple(_gate(metric, op, threshold, metrics.get(metric))
                 for metric, op, threshold, _ in _limits(cell, metrics, baseline))


def explain(cell: CellResult, metrics: Mapping, baseline: Baseline | None) -> dict[tuple, str]:
    """Where each gate's threshold comes from, keyed by (metric, op, threshold) as in the gate dict."""
    return {(metric, op, round(threshold, GATE_PRECISION)): basis
            for metric, op, threshold, basis in _limits(cell, metrics, baseline)}


def _limits(cell: CellResult, metrics: Mapping, baseline: Baseline | None) -> list[tuple[str, str, float, str]]:
    """(metric, op, threshold, basis) for every limit that applies to the cell."""
    if cell.expect.rejects:
        return []  # nothing is measured on a deployment that must not come up
    limits = _floor_limits(cell, metrics)
    if baseline is not None:
        specs = baseline.specs_for(cell.id)
        for name in in_table_order(specs):
            limits.extend(_spec_limits(specs[name], metrics))
    return limits


def _floor_limits(cell: CellResult, metrics: Mapping) -> list[tuple[str, str, float, str]]:
    return _collapse_floor(cell, metrics) + _chance_floor(metrics)


def _collapse_floor(cell: CellResult, metrics: Mapping) -> list[tuple[str, str, float, str]]:
    speculative = cell.speculative
    if not speculative or metrics.get("accept_length") is None:
        return []
    floor = (cell.suites.get("accept") or {}).get("min_accept_length")
    if floor is None:
        return [("accept_length", ">=", COLLAPSE_FLOOR, "collapse floor")]
    return [("accept_length", ">=", float(floor), "collapse floor (suites.accept.min_accept_length)")]


def chance_floor(num_questions: float) -> float:
    """The accuracy a guesser stays below 97.7% of the time on ``num_questions`` questions: chance (one in
    four) plus CHANCE_MARGIN_SE standard errors of a guesser's score. Repeats of a question do not count as
    more questions (they are correlated), so the floor uses the question count."""
    return GPQA_CHANCE + CHANCE_MARGIN_SE * math.sqrt(GPQA_CHANCE * (1 - GPQA_CHANCE) / num_questions)


def _chance_floor(metrics: Mapping) -> list[tuple[str, str, float, str]]:
    """GPQA must beat guessing, with or without a baseline: a broken model that answers at random or not at
    all (0%) never passes."""
    questions = metrics.get("gpqa_num_questions")
    if metrics.get("gpqa_accuracy") is None or not questions:
        return []
    return [("gpqa_accuracy", ">=", chance_floor(questions),
             f"above chance: 25% + {CHANCE_MARGIN_SE:g}·√(0.25·0.75/n), n = {questions:.0f} questions")]


def _spec_limits(spec: MetricSpec, metrics: Mapping) -> list[tuple[str, str, float, str]]:
    """(metric, op, threshold, basis) for each limit a baseline spec sets."""
    name, where, limits = spec.metric, spec.where, []
    reference = format_value(name, spec.value)
    if spec.min is not None:
        limits.append((name, ">=", spec.min, f"min ({where})"))
    if spec.min_ratio is not None:
        ratio = spec.ratio("min_ratio")
        limits.append((name, ">=", spec.value * ratio, f"{reference} × {ratio:g}{_widened(spec, 'min_ratio')} ({where})"))
    if spec.max_drop_stderr is not None:
        limits.append((name, ">=", noise_floor(spec, metrics.get(STDERR_OF[name])),
                       f"{reference} − {spec.max_drop_stderr:g}·√(se_base² + se_now²) ({where})"))
    if spec.max is not None:
        limits.append((name, "<=", spec.max, f"max ({where})"))
    if spec.max_ratio is not None:
        ratio = spec.ratio("max_ratio")
        limits.append((name, "<=", spec.value * ratio, f"{reference} × {ratio:g}{_widened(spec, 'max_ratio')} ({where})"))
    return limits


def _widened(spec: MetricSpec, key: str) -> str:
    """How the ratio came about when the baseline measured noise: " (the larger of 1.025 and 3 × 0.5% run-to-run noise)"."""
    if not spec.noise:
        return ""
    return f" (the larger of {getattr(spec, key):g} and {NOISE_RUN_SDS:g} × {spec.noise:.1%} run-to-run noise)"


def noise_floor(spec: MetricSpec, stderr_now: float | None) -> float:
    """baseline − k·sqrt(se_base² + se_now²): fail only on a drop sampling error does not explain.

    Without a measured stderr the new run is assumed as noisy as the baseline (same question count).
    """
    se_now = spec.stderr if stderr_now is None else stderr_now
    return spec.value - spec.max_drop_stderr * math.sqrt(spec.stderr ** 2 + se_now ** 2)


_OPS = {">=": lambda value, threshold: value >= threshold, "<=": lambda value, threshold: value <= threshold}


def _gate(metric: str, op: str, threshold: float, value) -> GateResult:
    passed = value is not None and _OPS[op](value, threshold)
    return GateResult(metric, op, round(threshold, GATE_PRECISION), value, passed)


def regate(results: RunResults, baseline: Baseline) -> RunResults:
    """A copy of ``results`` with every serving cell's gates evaluated against ``baseline``.

    Status follows the new gates, except that a cell which also failed for another reason (a suite
    test failed, an expected rejection did not happen) stays failed.
    """
    cells = []
    for cell in results.cells:
        if cell.status in (Status.PASSED, Status.FAILED):
            gates = evaluate(cell, cell.metrics, baseline)
            failed = _failed_apart_from_gates(cell) or not all(g.passed for g in gates)
            cell = replace(cell, gates=gates, status=Status.FAILED if failed else Status.PASSED, exit_code=None)
        cells.append(cell)
    return replace(results, cells=tuple(cells))


def _failed_apart_from_gates(cell: CellResult) -> bool:
    if cell.status is not Status.FAILED:
        return False
    if cell.expect.rejects:
        return True  # it served when it should have been rejected (or the other way round)
    if cell.tests is not None:  # the suites' own test outcomes, as the run records them
        return bool(cell.failed_tests)
    return bool(cell.error)


def describe_gate(gate: GateResult) -> str:
    """"accept_length = 1.00, needs >= 1.20" / "ttft_ms_median not measured (gate <= 51.2)"."""
    threshold = format_value(gate.metric, gate.threshold)
    if gate.value is None:
        return f"{gate.metric} not measured (gate {gate.op} {threshold})"
    value = format_value(gate.metric, gate.value)
    return f"{gate.metric} = {value}, needs {gate.op} {threshold}"
