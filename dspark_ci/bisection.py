"""Bisect: which build in an ordered range made a cell regress, decided by re-running it, never by guessing.

    ends (is there a regression at all?) → midpoints (good or bad?) → culprit vs its parent (A/B) → report

Each decision is the gates' statistical verdict (``dspark_ci.ground.stats.compare_samples``: Welch t on log values, the
effect with its interval against a tolerance, passed | regressed | inconclusive), taken sequentially: a build
is measured ``LOOKS[0]`` times, then more (``LOOKS``) while the verdict is inconclusive, with the step's error
budget split over the planned looks so that looking again never inflates it (``Levels``). A build is compared with
the good end and every build conclusively judged good since (one change in the range: they share its level);
its tolerance is half the regression between that pool and the bad end's (with the builds judged bad), and the
interval is read against it on both sides (``surely_past`` and ``detect``), so "regressed" means "surely nearer the
bad end" and "passed" "surely nearer the good end". A step still inconclusive after the last look follows the nearer end
by the point estimate and says so (its error is not bounded; the confirmation A/B is what then stands).

A failure (not a metric) is chased as pass/fail: a build is bad when one of ``FAILURE_TRIES`` runs fails for
the cell's own reasons, good when all pass. Infrastructure failures (launch timeout, engine unreachable, node
lost) are never evidence: a run is retried up to ``INFRA_RETRIES`` times, then the build is skipped and a
neighbour in the remaining range is measured instead.

Everything here is plain records and one ``measure(ref) -> Sample`` callable, so the benchmark
(bench/bisect_accuracy.py) runs this exact search against a simulated measurement and the CLI against real runs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from dspark_ci.ground import stats

GOOD, BAD, SKIPPED = "good", "bad", "skipped"
FOUND, NO_REGRESSION, NOT_SHOWN = "found", "no_regression", "not_shown"
LOOKS = (3, 6, 9, 12)  # samples of a build at each look while its verdict is inconclusive
END_LOOKS = (8, 12, 16)  # samples of each end while the regression is inconclusive (8: the pools' start)
STEP_ERROR = 0.10  # a step's error budget (false bad + false good), split over its looks (bench/bisect_accuracy.py)
FAILURE_TRIES = 3  # runs of a build when chasing a failure
INFRA_RETRIES = 2  # re-runs of one sample after an infrastructure failure before the build is skipped


@dataclass(frozen=True)
class Sample:
    """One run of the cell at one build."""

    value: float | None  # the chased metric (None: not measured)
    failed: bool = False  # the cell failed for its own reasons (a crash, a gate, a wrong rejection)
    infrastructure: bool = False  # the machine failed (never evidence about the build)
    where: str | None = None  # the run directory
    setup: str | None = None  # the cell identity's setup (every sample must share it)
    note: str = ""


@dataclass(frozen=True)
class Chase:
    """What is chased: a metric (with its better direction) or, when ``metric`` is None, a failure."""

    metric: str | None
    better: str = stats.LOWER

    @property
    def failure(self) -> bool:
        return self.metric is None


@dataclass(frozen=True)
class Judged:
    """One build's evidence and what it was judged."""

    index: int
    ref: str
    judged: str  # GOOD | BAD | SKIPPED
    values: tuple[float, ...] = ()
    failures: int = 0
    infra_failures: int = 0
    verdict: stats.Verdict | None = None
    error: float = 0.0  # bound on the chance this judgement is wrong (0.5: a point estimate)
    how: str = ""
    runs: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"index": self.index, "ref": self.ref, "judged": self.judged, "values": list(self.values),
                "failures": self.failures, "infra_failures": self.infra_failures, "error_bound": self.error,
                "verdict": _verdict_dict(self.verdict), "evidence": self.how, "runs": list(self.runs)}


def _verdict_dict(verdict: stats.Verdict | None) -> dict | None:
    if verdict is None:
        return None
    return {"verdict": verdict.verdict, "effect": verdict.effect, "low": verdict.low, "high": verdict.high,
            "tolerance": verdict.tolerance, "test": verdict.test, "alpha": verdict.alpha, "beta": verdict.beta,
            "samples": verdict.samples, "text": verdict.describe()}


@dataclass(frozen=True)
class Outcome:
    builds: tuple[str, ...]
    chase: Chase
    outcome: str  # FOUND | NO_REGRESSION | NOT_SHOWN
    ends: tuple[Judged, Judged]
    steps: tuple[Judged, ...] = ()
    culprit: str | None = None
    parent: str | None = None
    confirmation: stats.Verdict | None = None
    ab: tuple[Judged, ...] = ()  # parent and culprit with every run the A/B added
    confirmed: bool = False
    why: str = ""
    runs: int = 0  # runs of the cell, infrastructure failures included

    @property
    def confidence(self) -> float:
        """A lower bound on P(the culprit is the build that regressed). Confirmed by the A/B: one minus the A/B's
        false-red bound (culprit and parent differ, so the change is between them). Otherwise one minus the sum
        of every step's error bound (Bonferroni over the steps; a step that followed a point estimate counts
        0.5), at least 0."""
        if self.outcome != FOUND or self.culprit is None:
            return 0.0
        if self.confirmed:  # the A/B's own error bound: a false red (metric), or the parent passing while bad
            return 1.0 - (self.ab[0].error if self.chase.failure else STEP_ERROR / 2)
        return max(0.0, 1.0 - sum(step.error for step in self.steps))

    def to_dict(self) -> dict:
        return {"outcome": self.outcome, "why": self.why, "metric": self.chase.metric or "failure",
                "better": self.chase.better, "builds": list(self.builds),
                "good": self.ends[0].to_dict(), "bad": self.ends[1].to_dict(),
                "steps": [step.to_dict() for step in self.steps], "culprit": self.culprit, "parent": self.parent,
                "confirmation": _verdict_dict(self.confirmation), "ab": [j.to_dict() for j in self.ab],
                "confirmed": self.confirmed, "confidence": round(self.confidence, 4), "runs": self.runs}


Measure = Callable[[str], Sample]


@dataclass
class Evidence:
    """Samples gathered per build index (kept for the confirmation A/B)."""

    measure: Measure
    builds: Sequence[str]
    chase: Chase
    values: dict[int, list[float]] = field(default_factory=dict)
    failures: dict[int, int] = field(default_factory=dict)
    infra: dict[int, int] = field(default_factory=dict)
    runs: dict[int, list[str]] = field(default_factory=dict)
    setup: str | None = None
    count: int = 0
    # builds conclusively judged good / bad: one change in the range, so each pool shares one level
    good: list[int] = field(default_factory=list)
    bad: list[int] = field(default_factory=list)

    def pooled(self, indices: list[int]) -> list[float]:
        return [value for index in indices for value in self.values.get(index, ())]

    def regression(self) -> float:
        """The relative change from the good pool to the bad one (geometric means)."""
        def log_mean(values: list[float]) -> float:
            return statistics.fmean(math.log(v) for v in values)
        return math.expm1(log_mean(self.pooled(self.bad)) - log_mean(self.pooled(self.good)))

    def sample(self, index: int) -> bool:
        """One more run of build ``index``; False when every try failed for infrastructure reasons (or, chasing a
        metric, left it unmeasured). Chasing a failure, a pass counts as the value 0."""
        for _ in range(1 + INFRA_RETRIES):
            got = self.measure(self.builds[index])
            self.count += 1
            self.runs.setdefault(index, []).append(got.where or "")
            if got.infrastructure:
                self.infra[index] = self.infra.get(index, 0) + 1
                continue
            self._check_setup(got)
            if self.chase.failure and got.failed:
                self.failures[index] = self.failures.get(index, 0) + 1
            elif self.chase.failure or got.value is not None:
                self.values.setdefault(index, []).append(got.value if got.value is not None and not self.chase.failure
                                                         else 0.0)
            else:
                self.failures[index] = self.failures.get(index, 0) + 1  # crashed before measuring: try again
                continue
            return True
        return False

    def _check_setup(self, got: Sample) -> None:
        if got.setup and self.setup and got.setup != self.setup:
            raise UnlikeMeasurements(f"a run at {got.where} measured the cell differently (identity setup "
                                     f"{got.setup}, earlier runs {self.setup}): the bisect would compare unlike things")
        self.setup = self.setup or got.setup

    def judged(self, index: int, judged: str, **changes) -> Judged:
        return Judged(index, self.builds[index], judged, tuple(self.values.get(index, ())),
                      self.failures.get(index, 0), self.infra.get(index, 0), runs=tuple(self.runs.get(index, ())),
                      **changes)


class UnlikeMeasurements(Exception):
    """Two runs of the bisect had different cell identity setups."""


def levels(looks: int) -> stats.Levels:
    return stats.Levels(alpha=STEP_ERROR / 2 / looks, beta=STEP_ERROR / 2 / looks, looks=looks)


def bisect(builds: Sequence[str], chase: Chase, measure: Measure) -> Outcome:
    """Find the first bad build in ``builds`` (oldest first; the first is good, the last bad)."""
    evidence = Evidence(measure, builds, chase)
    ends, regression, why = (_failure_ends if chase.failure else _metric_ends)(evidence, chase)
    if regression is None:
        return Outcome(tuple(builds), chase, NO_REGRESSION if why.startswith("no ") else NOT_SHOWN, ends, why=why,
                       runs=evidence.count)
    good, bad, steps = 0, len(builds) - 1, []
    evidence.good, evidence.bad = [good], [bad]
    pending = list(range(1, len(builds) - 1))  # builds not yet skipped
    while bad - good > 1:
        index = _midpoint(good, bad, pending)
        if index is None:
            break
        step = _judge(evidence, index, chase, regression)
        steps.append(step)
        if step.judged == SKIPPED:
            pending.remove(index)
        elif step.judged == GOOD:
            good = index
        else:
            bad = index
    outcome = Outcome(tuple(builds), chase, FOUND, ends, tuple(steps), builds[bad], builds[good])
    if bad - good > 1:
        outcome = replace(outcome, why=f"every build between {builds[good]} and {builds[bad]} was skipped "
                                       "(infrastructure failures): the culprit is one of them or the latter")
    else:
        outcome = _confirm(outcome, evidence, good, bad, chase, regression)
    return replace(outcome, runs=evidence.count)


def _midpoint(good: int, bad: int, pending: list[int]) -> int | None:
    """The unskipped build nearest the middle of (good, bad)."""
    inside = [i for i in pending if good < i < bad]
    return min(inside, key=lambda i: (abs(i - (good + bad) / 2), i)) if inside else None


def _metric_ends(evidence: Evidence, chase: Chase) -> tuple[tuple[Judged, Judged], float | None, str]:
    """Measure both ends until the verdict on their difference is conclusive: regressed means the bad end is
    worse than the good one beyond sampling error (tolerance 0: any real regression is worth finding)."""
    last = len(evidence.builds) - 1
    verdict: stats.Verdict | None = None
    for count in END_LOOKS:
        for index in (0, last):
            while len(evidence.values.get(index, ())) < count:
                if not evidence.sample(index):
                    ends = (evidence.judged(0, SKIPPED), evidence.judged(last, SKIPPED))
                    return ends, None, f"{evidence.builds[index]} could not be measured (infrastructure failures)"
        verdict = stats.compare_samples(evidence.values[last], evidence.values[0], chase.better, 0.0,
                                        levels(len(END_LOOKS)))
        if verdict.conclusive:
            break
    assert verdict is not None  # END_LOOKS is not empty
    ends = (evidence.judged(0, GOOD, verdict=verdict, how="the good end"),
            evidence.judged(last, BAD, verdict=verdict, how="the bad end"))
    if verdict.verdict == stats.REGRESSED:
        return ends, verdict.effect, ""
    if verdict.verdict == stats.PASSED:
        return ends, None, f"no regression between the ends: {verdict.describe()}"
    return ends, None, f"the ends do not show a regression conclusively: {verdict.describe()}"


def _failure_ends(evidence: Evidence, chase: Chase) -> tuple[tuple[Judged, Judged], float | None, str]:
    last = len(evidence.builds) - 1
    for index in (0, last):
        for _ in range(FAILURE_TRIES):
            if not evidence.sample(index):
                break
    good_fails, bad_fails = evidence.failures.get(0, 0), evidence.failures.get(last, 0)
    ends = (evidence.judged(0, GOOD, how=f"{good_fails} of {FAILURE_TRIES} runs failed"),
            evidence.judged(last, BAD, how=f"{bad_fails} of {FAILURE_TRIES} runs failed"))
    if good_fails:
        return ends, None, (f"the good end {evidence.builds[0]} fails too ({good_fails} of {FAILURE_TRIES} runs): "
                            "flaky or broken, not a regression in this range")
    if not bad_fails:
        return ends, None, f"no failure at the bad end {evidence.builds[last]} in {FAILURE_TRIES} runs"
    return ends, bad_fails / FAILURE_TRIES, ""


def _judge(evidence: Evidence, index: int, chase: Chase, regression: float) -> Judged:
    return (_judge_failure if chase.failure else _judge_metric)(evidence, index, chase, regression)


def _judge_failure(evidence: Evidence, index: int, chase: Chase, fail_rate: float) -> Judged:
    for tries in range(1, FAILURE_TRIES + 1):
        if not evidence.sample(index):
            return evidence.judged(index, SKIPPED, how="infrastructure failures on every retry")
        if evidence.failures.get(index, 0):
            return evidence.judged(index, BAD, how=f"failed on run {tries}")
    miss = (1 - fail_rate) ** FAILURE_TRIES  # a bad build that failed at the bad end's rate, passing every try
    return evidence.judged(index, GOOD, error=miss,
                           how=f"passed {FAILURE_TRIES} runs (a build failing as often as the bad end would pass "
                               f"them all {miss:.1%} of the time)")


def half_way(regression: float) -> float:
    """Half the relative regression, on the log scale the verdict works on."""
    return math.expm1(math.log1p(regression) / 2)


def _judge_metric(evidence: Evidence, index: int, chase: Chase, regression: float) -> Judged:
    regression = evidence.regression()
    tolerance, verdict = half_way(regression), None
    for count in LOOKS:
        while len(evidence.values.get(index, ())) < count:
            if not evidence.sample(index):
                return evidence.judged(index, SKIPPED, how="not measured on any retry (infrastructure failures, or "
                                                           "the run ended before the metric was measured)")
        verdict = stats.compare_samples(evidence.values[index], evidence.pooled(evidence.good), chase.better,
                                        tolerance, levels(len(LOOKS)), detect=tolerance, surely_past=tolerance)
        if verdict.conclusive:
            judged = BAD if verdict.verdict == stats.REGRESSED else GOOD
            (evidence.good if judged == GOOD else evidence.bad).append(index)
            return evidence.judged(index, judged, verdict=verdict, error=STEP_ERROR / 2,
                                   how=f"{verdict.verdict} against the good end at half the regression")
    assert verdict is not None
    judged = BAD if _nearer_bad(verdict.effect, regression) else GOOD
    return evidence.judged(index, judged, verdict=verdict, error=0.5,
                           how=f"inconclusive after {LOOKS[-1]} runs; followed the nearer end by the point estimate")


def _nearer_bad(effect: float, regression: float) -> bool:
    return abs(math.log1p(effect) - math.log1p(regression)) < abs(math.log1p(effect))


def _confirm(outcome: Outcome, evidence: Evidence, good: int, bad: int, chase: Chase, regression: float) -> Outcome:
    """The culprit against its parent, A/B: more runs of both until the verdict is conclusive; confirmed when the
    culprit is worse beyond sampling error (tolerance 0), i.e. the change happened between the two."""
    if chase.failure:
        confirmed = evidence.failures.get(bad, 0) > 0 and not evidence.failures.get(good, 0)
        passes = len(evidence.values.get(good, ()))
        miss = (1 - regression) ** passes  # the parent passing every run while failing at the bad end's rate
        ab = (evidence.judged(good, GOOD, error=miss, how=f"the parent: passed {passes} runs"),
              evidence.judged(bad, BAD, how=f"the culprit: {evidence.failures.get(bad, 0)} failed"))
        return replace(outcome, confirmed=confirmed, ab=ab,
                       why="" if confirmed else "the culprit's parent failed too: not confirmed")
    verdict = None
    for count in LOOKS[1:]:
        for index in (good, bad):
            while len(evidence.values.get(index, ())) < count:
                if not evidence.sample(index):
                    return replace(outcome, why=f"{evidence.builds[index]} could not be measured for the A/B")
        verdict = stats.compare_samples(evidence.values[bad], evidence.values[good], chase.better, 0.0,
                                        levels(len(LOOKS) - 1))
        if verdict.conclusive:
            break
    assert verdict is not None
    confirmed = verdict.verdict == stats.REGRESSED
    ab = (evidence.judged(good, GOOD, verdict=verdict, how="the parent, A/B"),
          evidence.judged(bad, BAD, verdict=verdict, how="the culprit, A/B"))
    return replace(outcome, confirmation=verdict, ab=ab, confirmed=confirmed,
                   why="" if confirmed else f"the A/B of culprit and parent did not confirm it: {verdict.describe()}")

