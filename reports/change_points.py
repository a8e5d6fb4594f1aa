"""Change points: where a cell's metric moved to a new level across the recorded runs, and from which run on.

A nightly gate compares one night with a baseline, so a shift smaller than its tolerance never fails one: TPOT
3 % slower since Tuesday is green every night. Over the history it is plain. Detection is ruptures' PELT with
the least-squares (mean-shift) cost (``ruptures``: a maintained library; docs/DEVELOPMENT.md says why
not Otava or signal-processing-algorithms). Its penalty is ``PENALTY_K · σ² · ln n``, with σ the run-to-run
noise estimated robustly from the series itself (median absolute successive difference), so a noisy metric
needs a larger shift than a quiet one; on series of 10 to 30 runs of pure noise about 1 in 50 (n = 10: 1 in 15)
shows a change, while a shift of 6 σ is found at the right run in more than 9 of 10 (tests/test_change_points.py).

Only runs of one setup are compared (``dspark_ci.ground.identity``): the series is cut where the cell's setup last
changed, and that cut is reported, not mistaken for a change of the build. A gradual drift shows as several
breaks in one direction close together; they are reported as one change from its first run to its last.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from dspark_ci.reports.metrics import HIGHER, LOWER, METRICS

MIN_POINTS = 6  # fewer runs than this say nothing about levels
PENALTY_K = 6.0
MIN_SEGMENT = 2  # runs: one odd night is an outlier, not a level
DRIFT_GAP = 10  # breaks in one direction at most this many runs apart are one drift
MIN_RELATIVE_NOISE = 0.001  # a series that never moved still has this much noise (a step in it is then a change)


@dataclass(frozen=True)
class ChangePoint:
    metric: str
    run_id: str  # the first run at the new level (for a drift: the first run that moved)
    started_at: str | None
    last_run_id: str  # where the level settled (== run_id for a step)
    before: float  # median level of the runs before it
    after: float  # median level of the runs after it settled
    noise: float  # the run-to-run noise it was judged against, in the metric's unit

    @property
    def relative(self) -> float | None:
        return self.after / self.before - 1 if self.before else None

    @property
    def kind(self) -> str:
        return "step" if self.run_id == self.last_run_id else "drift"

    @property
    def worse(self) -> bool | None:
        better = METRICS[self.metric].better if self.metric in METRICS else None
        if better not in (HIGHER, LOWER):
            return None
        return (self.after < self.before) if better == HIGHER else (self.after > self.before)

    def to_dict(self) -> dict:
        return {"metric": self.metric, "run_id": self.run_id, "started_at": self.started_at,
                "last_run_id": self.last_run_id, "kind": self.kind, "before": self.before, "after": self.after,
                "relative": self.relative, "worse": self.worse, "noise": self.noise}

    def describe(self) -> str:
        """"tpot_ms_median: +3.0% (worse) from run N3 (step), 20.00 → 20.60, noise ±0.10"."""
        change = f"{self.relative:+.1%}" if self.relative is not None else f"{self.after - self.before:+g}"
        verdict = {True: " (worse)", False: " (better)", None: ""}[self.worse]
        span = "step" if self.kind == "step" else f"drift until {self.last_run_id}"
        return (f"{self.metric}: {change}{verdict} from run {self.run_id} ({span}), "
                f"{self.before:.4g} → {self.after:.4g}, run-to-run noise ±{self.noise:.2g}")


def noise_of(values: Sequence[float] | np.ndarray) -> float:
    """Run-to-run standard deviation, robust to the level shifts being looked for: the median absolute
    difference of successive runs, scaled to a normal's σ (a shift moves one difference, not the median)."""
    diffs = np.diff(np.asarray(values, dtype=float))
    mad = float(np.median(np.abs(diffs - np.median(diffs))))
    floor = MIN_RELATIVE_NOISE * abs(float(np.median(values)))
    return max(1.4826 * mad / float(np.sqrt(2)), floor)


def change_points(metric: str, points: Sequence) -> list[ChangePoint]:
    """Level shifts in ``points`` (oldest first, each with ``run_id``, ``started_at``, ``value``)."""
    if len(points) < MIN_POINTS:
        return []
    values = np.asarray([p.value for p in points], dtype=float)
    sigma = noise_of(values)
    import ruptures  # on use: with its scipy.spatial it costs a second that only history and report.html need

    breaks = ruptures.Pelt(model="l2", min_size=MIN_SEGMENT, jump=1).fit(values.reshape(-1, 1)).predict(
        pen=PENALTY_K * sigma ** 2 * np.log(len(values)))[:-1]
    edges = [0, *breaks, len(values)]
    levels = [float(np.median(values[a:b])) for a, b in zip(edges, edges[1:], strict=False)]
    found = []
    for first, last in _groups(breaks, levels):
        start, end = edges[first], edges[last + 2]
        onset, settled = _onset(values[start:end], breaks[first] - start, breaks[last] - start, sigma)
        found.append(ChangePoint(metric, points[start + onset].run_id, points[start + onset].started_at,
                                 points[start + settled].run_id, levels[first], levels[last + 1], sigma))
    return found


def _onset(window: np.ndarray, first_break: int, last_break: int, sigma: float) -> tuple[int, int]:
    """(first run that moved, first run at the new level) within ``window``, the runs around one detected change.

    PELT's mean-shift cost puts a gradual drift's break in its middle. Where a ramp (old level, straight line,
    new level) fits the window better than the detected step by more than a ramp's extra freedom explains
    (``RAMP_EVIDENCE · σ² · ln n``), the change is a drift from the ramp's first run to its last; otherwise a step where
    found."""
    n = len(window)
    if n > MAX_RAMP_WINDOW:
        return first_break, last_break
    step_sse = _ramp_sse(window, first_break - 1, first_break)
    best_sse, best = step_sse, (first_break, last_break)
    for a in range(0, n - 1):
        for b in range(a + 2, n):
            sse = _ramp_sse(window, a, b)
            if sse < best_sse:
                best_sse, best = sse, (a + 1, b)
    return best if step_sse - best_sse > RAMP_EVIDENCE * sigma ** 2 * np.log(n) else (first_break, last_break)


MAX_RAMP_WINDOW = 80  # runs; the ramp search is quadratic in them
RAMP_EVIDENCE = 2.0  # a ramp must beat the step by this many σ² · ln n (1: 4 % of 3 % steps misread as drifts)


def _ramp_sse(window: np.ndarray, a: int, b: int) -> float:
    """Squared error of the best fit "level until run a, straight line to run b, level from b on"."""
    t = np.arange(len(window))
    design = np.column_stack([np.ones(len(window)), np.clip((t - a) / (b - a), 0.0, 1.0)])
    coefficients = np.linalg.lstsq(design, window, rcond=None)[0]
    return float(((design @ coefficients - window) ** 2).sum())


def _groups(breaks: list[int], levels: list[float]) -> list[tuple[int, int]]:
    """(first, last) indices into ``breaks`` of each change: consecutive breaks moving the same way and at most
    DRIFT_GAP runs apart are one drift."""
    groups: list[tuple[int, int]] = []
    for i in range(len(breaks)):
        up = levels[i + 1] > levels[i]
        if groups:
            first, last = groups[-1]
            same_way = (levels[last + 1] > levels[last]) == up
            if same_way and breaks[i] - breaks[last] <= DRIFT_GAP:
                groups[-1] = (first, i)
                continue
        groups.append((i, i))
    return groups
