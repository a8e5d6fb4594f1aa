"""More evidence for a cell whose first measurement did not settle it: sequential looks and retries.

- **Sequential sampling.** A cell whose gates are inconclusive is measured again on a fresh boot (the per-boot
  component of the noise is what more requests on one boot cannot average away), only the suites whose gates are
  undecided, until every gate decides or the budget runs out: looks after 1, 2, 4, ... boots
  (``dspark_ci.ground.stats.look_boots``), at most ``Sampling.max_boots``. Every boot's figures are kept
  (``CellResult.boots``) and gated together; the statistical gates' levels are split over the planned looks
  (``Levels.family(..., max_boots)``, alpha in proportion to each look's boots), so the extra looks never inflate the
  false-red or false-pass rates.
- **Retries.** A cell that failed (a crash, a failed suite test, a regressed gate) is run again up to
  ``Sampling.retries`` times. A retry adds evidence, never re-rolls a verdict: its boots are pooled with the
  first attempt's, and a cell that failed and then passed stays failed, labelled ``flaky`` (report.md, results.json
  ``labels``, the run history), so a flaky cell is never silently green.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

from dspark_ci.ground.errors import ExitCode
from dspark_ci.ground.measurements import BootMetrics, McSummary
from dspark_ci.ground.records import CellResult, Status
from dspark_ci.ground.stats import look_boots
from dspark_ci.ground.suites import suite_of

FLAKY = "flaky"
# `run --max-boots` by default: a clean cell under 2 % run-to-run noise stops after 3-4 boots on average and a 5 %
# regression is red in about 6, within this budget (bench/gate_power.py, BENCHMARKS.md)
MAX_BOOTS = 12


@dataclass(frozen=True)
class Sampling:
    max_boots: int = 1  # boots a cell may use when its gates are inconclusive (1: no sequential looks)
    retries: int = 0  # extra attempts for a cell that failed


# measure(attempt number, suites) -> that boot's judged result; judge(pooled result, suites) -> re-gated result
Measure = Callable[[int, tuple[str, ...]], CellResult]
Judge = Callable[[CellResult, tuple[str, ...]], CellResult]


def more_evidence(first: CellResult, names: tuple[str, ...], sampling: Sampling, measure: Measure,
                  judge: Judge) -> CellResult:
    """The cell's result after its retries and sequential looks (``first`` itself when neither applies).

    Each judgement is one planned look (``dspark_ci.ground.stats.planned_boots``: one after each retry, then the
    sequential looks): a look the retries already reached is not judged again, so no share of alpha is spent twice. A
    cell that failed and ends green after any retry, whether the retry alone passed or the pooled boots did, is
    labelled flaky and stays failed."""
    attempts = [first]
    current = first
    for _ in range(sampling.retries):
        if not _retryable(current):
            break
        attempts.append(measure(len(attempts) + 1, names))
        current = attempts[-1] if not _measured(attempts[-1]) else judge(pooled(attempts), names)
        if not attempts[-1].status.failing:
            return _flaky(current, attempts)
    for wanted in look_boots(sampling.max_boots)[1:]:
        if current.status is not Status.INCONCLUSIVE:
            break
        undecided = tuple(dict.fromkeys(suite_of(g.metric) for g in current.gates if _undecided(g)))
        if not undecided or wanted <= len(attempts):
            continue  # nothing more boots could inform, or the retries already took this look
        while len(attempts) < wanted:
            attempts.append(measure(len(attempts) + 1, tuple(n for n in names if n in undecided)))
            if attempts[-1].status is Status.ERROR or attempts[-1].failed_tests:
                return _with_evidence(attempts[-1], attempts)  # a crash on a later boot is this cell's outcome
        current = judge(pooled(attempts), names)
    if len(attempts) > 1 and first.status.failing and current.status is Status.PASSED and _retryable(first):
        return _flaky(current, attempts)  # green only with a retry's boots pooled in: a label, never a pass
    return current


def _undecided(gate) -> bool:
    """Inconclusive, and more boots could change it (a GPQA gate on fixed answers cannot: ``Verdict.final``)."""
    return gate.inconclusive and not (gate.statistic is not None and gate.statistic.final)


def _retryable(result: CellResult) -> bool:
    return result.status.failing and result.exit_code != ExitCode.BAD_INPUT and not result.expect.rejects


def _measured(result: CellResult) -> bool:
    return bool(result.metrics)


def _flaky(current: CellResult, attempts: list[CellResult]) -> CellResult:
    """Failed, then passed: failed it stays (a retry buys a label, never a pass), labelled flaky, saying so."""
    first = attempts[0]
    why = first.error or "; ".join(g.metric for g in first.gates if not g.passed) or first.status.text
    last = f"attempt {len(attempts)} {attempts[-1].status.text}"
    if attempts[-1].status is not Status.PASSED:  # green only with every attempt's boots pooled
        last += f", then passed with {len(attempts)} boots pooled"
    error = (f"flaky: attempt 1 {first.status.text} ({why.splitlines()[0]}), {last}; a retry adds evidence, it "
             "does not turn a cell green")
    return replace(current, labels=tuple(dict.fromkeys((*current.labels, FLAKY)))).finished(
        Status.FAILED, error, ExitCode.FELL_SHORT)


def _with_evidence(last: CellResult, attempts: list[CellResult]) -> CellResult:
    measured = [a for a in attempts if _measured(a)]
    if len(measured) < 2:
        return last
    pool = pooled(measured)
    return replace(last, metrics=pool.metrics, boots=pool.boots, gpqa=pool.gpqa, mc=pool.mc)


def pooled(attempts: list[CellResult]) -> CellResult:
    """The attempts' measurements as one cell: every boot's metrics kept, each metric the mean over the boots that
    measured it, GPQA's questions added up, every suite test and warning kept."""
    measured = [a for a in attempts if _measured(a)]
    boots = tuple(boot for a in measured for boot in (a.boots or (BootMetrics(a.metrics),)))
    names = dict.fromkeys(name for boot in boots for name in boot.metrics)
    values = {name: [float(v) for b in boots if (v := b.value(name)) is not None] for name in names}
    metrics = {name: statistics.fmean(found) for name, found in values.items() if found}
    questions: dict[str, tuple[int, int]] = {}
    for attempt in measured:
        for question, (right, asked) in (attempt.gpqa.per_question if attempt.gpqa else {}).items():
            so_far = questions.get(question, (0, 0))
            questions[question] = (so_far[0] + right, so_far[1] + asked)
    gpqa = next((a.gpqa for a in reversed(measured) if a.gpqa), None)
    if gpqa is not None and questions:
        asked = sum(n for _, n in questions.values())
        gpqa = replace(gpqa, per_question=questions, samples=asked)
        metrics["gpqa_accuracy"] = sum(r for r, _ in questions.values()) / asked
    mc = _pooled_mc(measured, metrics)
    tests = tuple(t for a in measured for t in a.tests or ())
    warnings = tuple(dict.fromkeys(w for a in measured for w in a.warnings))
    # a later boot re-runs only the undecided suites: the sweep or acceptance detail of a suite it did not run is
    # the latest boot's that did, not lost (its gate would turn inconclusive with nothing to test)
    acceptance = next((a.acceptance for a in reversed(measured) if a.acceptance is not None), None)
    envelope = next((a.envelope for a in reversed(measured) if a.envelope is not None), None)
    return replace(measured[-1], metrics=metrics, boots=boots if len(boots) > 1 else (), gpqa=gpqa, mc=mc,
                   tests=tests, warnings=warnings, acceptance=acceptance, envelope=envelope)


def _pooled_mc(measured: list[CellResult], metrics: dict) -> McSummary | None:
    """The boots' multiple-choice items added up, as GPQA's questions (``mc_accuracy`` over all of them)."""
    items: dict[str, tuple[int, int]] = {}
    for attempt in measured:
        for item, (right, asked) in (attempt.mc.per_item if attempt.mc else {}).items():
            so_far = items.get(item, (0, 0))
            items[item] = (so_far[0] + right, so_far[1] + asked)
    mc = next((a.mc for a in reversed(measured) if a.mc), None)
    if mc is None or not items:
        return mc
    asked = sum(n for _, n in items.values())
    metrics["mc_accuracy"] = sum(r for r, _ in items.values()) / asked
    return replace(mc, per_item=items, items=asked, accuracy=metrics["mc_accuracy"])
