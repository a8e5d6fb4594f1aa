"""Statistical verdicts: does a measurement show a regression beyond a stated tolerance?

Every comparison answers with a ``Verdict`` record: ``passed``, ``regressed`` or ``inconclusive``, the effect
(the change of the new measurement against the reference), its interval, the tolerance and the test used.

The decision reads the effect in the metric's *worse* direction against two lines, as Mozilla's Perfherder does
(a t-test and a magnitude threshold) with a detection line added so a pass means something:

- ``regressed`` when the change is both *real* and *material*: the interval's better end, at one-sided level
  ``alpha``, lies on the worse side of no change at all (an unchanged metric turns red at most ``alpha`` of the
  time: that is what the run's family-wise false-red rate is split into), and the effect itself is beyond the
  stated ``tolerance`` (a real but smaller shift is not a regression; a shift right at the tolerance is red at
  most half the time);
- ``passed`` when the interval's worse end, at one-sided level ``beta``, is inside the ``detect`` line (by default
  ``DETECT_FACTOR`` × the tolerance: a regression that large passes at most ``beta`` of the time);
- ``inconclusive`` otherwise: the data cannot tell, and the verdict says so instead of flipping a coin.

Regressed wins when both hold (a narrow interval around a real shift between the two lines). The interval is
[better bound at 1 − alpha, worse bound at 1 − beta]. Why two lines: testing "beyond the tolerance" at the family's
alpha (the design before) needs about 20 boots to see a 5 % regression under 2 % run-to-run noise, so it was
almost always inconclusive; significance against no change plus a material effect catches it in a few
(``bench/gate_power.py``, BENCHMARKS.md). A bisect step asks another question, nearer which end, and reads the
whole interval against half-way on both sides (``surely_past``).

Distributions come from scipy (t, normal, binomial, bootstrap); nothing here re-derives them. Everything is
plain floats in and a frozen record out, so the bisect, the gates and the power benchmark share one decision.

The API, smallest first:
- ``decide(effect, low, high, tolerance, detect, better, surely_past=0)``: the three-way rule on an effect and
  its interval;
- ``compare_samples(new, base, better, tolerance, levels)``: two samples of a metric (e.g. per-boot values of
  two commits) → ``Verdict`` (Welch t on log values: the effect is relative);
- ``compare_boots(new_boots, reference, ...)``: per-boot values against a recorded baseline summary
  (``BootReference``: value, runs, run-to-run noise and its per-request part), the per-boot component of the
  variance modelled apart from the per-request one;
- ``compare_paired(new_by_unit, base_by_unit, ...)``: paired over units (GPQA questions, clustered, repeats
  averaged within a question);
- ``compare_estimates(new, new_se, base, base_se, ...)``: two estimates with standard errors (normal);
- ``chance_floor(n, chance, false_pass)``: the exact binomial score a guesser reaches at most ``false_pass``
  of the time.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass, replace
from typing import Mapping, Sequence


PASSED, REGRESSED, INCONCLUSIVE = "passed", "regressed", "inconclusive"
VERDICTS = (PASSED, REGRESSED, INCONCLUSIVE)
HIGHER, LOWER = "higher", "lower"  # which direction of the metric is better
RELATIVE, ABSOLUTE = "relative", "absolute"  # the effect's scale: new/base − 1, or new − base

# Stated defaults (report.md's statistical-gates line prints the run's false-red rate and the levels derived here):
RUN_FALSE_RED = 0.01  # a whole run (every cell × gated metric) is red by luck at most 1 % of the time
GATE_FALSE_PASS = 0.02  # a regression right at the detection line passes a gate at most 2 % of the time
MEDIAN_VARIANCE = math.pi / 2  # var(median of k normal values) / var(their mean), for large k
DETECT_FACTOR = 2.0  # the detection line (what a pass rules out) as a multiple of the tolerance


def _scipy():
    """scipy.stats, imported on first use: records import this module, and most commands never compute a verdict."""
    from scipy import stats

    return stats


def look_boots(max_boots: int) -> tuple[int, ...]:
    """Boots measured at each sequential look within a budget of ``max_boots``: 1, 2, 4, ... doubling, and the
    budget itself last (``look_boots(8)`` = (1, 2, 4, 8), ``look_boots(6)`` = (1, 2, 4, 6))."""
    looks = [1]
    while looks[-1] * 2 < max_boots:
        looks.append(looks[-1] * 2)
    if max_boots > looks[-1]:
        looks.append(max_boots)
    return tuple(looks)


@dataclass(frozen=True)
class Levels:
    """The error levels of one look at one gate: ``alpha`` (false red: an unchanged metric turns red), ``beta``
    (false pass: a regression at the detection line passes)."""

    alpha: float
    beta: float = GATE_FALSE_PASS
    looks: int = 1  # planned looks these levels are already split over
    # (boots, alpha) of each planned look when a gate's alpha is spent in proportion to the boots each look rests on
    # (``family(..., max_boots=N)``); empty: ``alpha`` at every look
    plan: tuple[tuple[int, float], ...] = ()

    @classmethod
    def family(cls, gates: int, run_false_red: float = RUN_FALSE_RED, beta: float = GATE_FALSE_PASS,
               looks: int = 1, max_boots: int | None = None) -> "Levels":
        """Per-gate, per-look levels for a run of ``gates`` gates: Bonferroni over gates (the run's false-red rate),
        and over the looks: ``looks`` equal shares, or with ``max_boots`` the sequential looks of
        ``look_boots(max_boots)``, each look's share of alpha in proportion to its boots (1, 2, 4, 8 of 15: most of
        it where the evidence is, so a small regression seen at the last look is not lost to the early ones; a
        loud one is red at the first look anyway). Beta is split equally (a clean cell may stop early)."""
        gate_alpha = run_false_red / max(1, gates)
        if max_boots is None or max_boots <= 1:
            return cls(alpha=gate_alpha / looks, beta=beta / looks, looks=looks)
        boots = look_boots(max_boots)
        plan = tuple((n, gate_alpha * n / sum(boots)) for n in boots)
        return cls(alpha=plan[0][1], beta=beta / len(boots), looks=len(boots), plan=plan)

    def at_boots(self, boots: int) -> "Levels":
        """The levels of the look that ``boots`` boots make (the last look's beyond the plan)."""
        if not self.plan:
            return self
        return replace(self, alpha=next((a for n, a in self.plan if boots <= n), self.plan[-1][1]))

    def describe(self) -> str:
        if self.plan:
            shares = ", ".join(f"{a:.2g} at {n} boot{'s' * (n > 1)}" for n, a in self.plan)
            return f"α = {shares} (false red), β = {self.beta:.2g} (false pass) per look ({self.looks} planned)"
        looks = f" per look ({self.looks} planned)" if self.looks > 1 else ""
        return f"α = {self.alpha:.2g} (false red), β = {self.beta:.2g} (false pass){looks}"


@dataclass(frozen=True)
class Verdict:
    """One gate's statistical decision. ``effect``, ``low``, ``high`` and ``tolerance`` are on ``scale``:
    relative (new/base − 1, so +0.05 is 5 % more) or absolute (new − base, so −0.05 is 5 points less)."""

    verdict: str  # PASSED | REGRESSED | INCONCLUSIVE
    effect: float
    low: float
    high: float
    tolerance: float  # the signed limit of the effect in the worse direction (e.g. +0.025 TPOT, −0.03 throughput)
    scale: str
    test: str  # the test used, in words a reader can look up
    alpha: float
    beta: float
    samples: int  # new samples the decision rests on (boots, questions, ...)
    detect: float | None = None  # the signed detection line a pass rules out; None (files before it): the tolerance

    @property
    def detection(self) -> float:
        return self.tolerance if self.detect is None else self.detect

    @property
    def conclusive(self) -> bool:
        return self.verdict != INCONCLUSIVE

    def describe(self) -> str:
        """"+5.1% [+3.9%, +6.3%] vs tolerance +2.5%, detect +5.0%: regressed (Welch t on log values, 3 boots)"."""
        unit = (lambda v: f"{v:+.1%}") if self.scale == RELATIVE else (lambda v: f"{v * 100:+.1f} pt")
        lines = f"tolerance {unit(self.tolerance)}"
        if self.detection != self.tolerance:
            lines += f", detect {unit(self.detection)}"
        return f"{unit(self.effect)} [{unit(self.low)}, {unit(self.high)}] vs {lines}: {self.verdict} ({self.test})"


def decide(effect: float, low: float, high: float, tolerance: float, detect: float, better: str,
           surely_past: float = 0.0) -> str:
    """The three-way rule: ``effect`` and its interval [low, high] against the signed ``tolerance`` (red needs the
    better end past ``surely_past``, by default no change, and the effect past the tolerance) and the signed
    ``detect`` line (green needs the worse end inside it)."""
    sign = 1.0 if better == LOWER else -1.0  # worse-direction values are positive
    worse_end, better_end = (high, low) if better == LOWER else (low, high)
    if sign * better_end > sign * surely_past and sign * effect > sign * tolerance:
        return REGRESSED
    if sign * worse_end <= sign * detect:
        return PASSED
    return INCONCLUSIVE


def _interval(effect: float, se: float, df: float | None, levels: Levels, better: str) -> tuple[float, float]:
    """[low, high] of the signed effect: the better end at 1 − alpha, the worse end at 1 − beta."""
    to_better, to_worse = _quantile(1 - levels.alpha, df) * se, _quantile(1 - levels.beta, df) * se
    if better == LOWER:
        return effect - to_better, effect + to_worse
    return effect - to_worse, effect + to_better


def _quantile(p: float, df: float | None) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom (normal when None or infinite): scipy.special's
    ``stdtrit``/``ndtri``, the functions behind scipy.stats' t and norm, without a frozen distribution per call."""
    from scipy import special

    return float(special.ndtri(p) if df is None or math.isinf(df) else special.stdtrit(df, p))


def _verdict(effect: float, se: float, df: float | None, tolerance: float, better: str, levels: Levels,
             scale: str, test: str, samples: int, detect: float | None = None, surely_past: float = 0.0) -> Verdict:
    """The verdict on ``effect`` (log ratio when relative) with standard error ``se``; ``tolerance``, ``detect``
    (default ``DETECT_FACTOR`` × the tolerance) and ``surely_past`` (``decide``) on the shown scale."""
    detect = DETECT_FACTOR * tolerance if detect is None else detect
    low, high = _interval(effect, se, df, levels, better)
    if scale == RELATIVE:  # computed on log values; shown as ratios − 1
        effect, low, high = (math.expm1(v) for v in (effect, low, high))
    return Verdict(decide(effect, low, high, tolerance, detect, better, surely_past), effect, low, high, tolerance,
                   scale, test, levels.alpha, levels.beta, samples, detect)


@dataclass(frozen=True)
class BootReference:
    """A baseline's summary of one metric over ``runs`` boots: its value, the run-to-run standard deviation
    (``noise``, a fraction of the value, per-request sampling included) and the part of it that per-request
    sampling explains (``request_noise``: one boot's own standard error, as a fraction)."""

    value: float
    runs: int
    noise: float
    request_noise: float = 0.0


def compare_boots(new_boots: Sequence[float], reference: BootReference, better: str, tolerance: float,
                  levels: Levels, detect: float | None = None) -> Verdict:
    """Per-boot values of a run (each a whole boot's figure, e.g. median TPOT) against a recorded baseline.

    On log values, so the effect is relative. One boot's figure varies by the run-to-run noise: the baseline's
    (over its runs), pooled with the new boots' own spread when there are several, so a machine noisier today
    than when the baseline was recorded widens the interval as its boots come in. The baseline value's own
    error is added: it is the median of its runs (``baseline record``), whose variance is π/2 times the mean's
    (noise² / runs) for normal values. Student t with the pooled degrees of freedom.

    A boot's per-request standard error is not added: the suites send the same prompts every boot, so the
    spread between requests (which the bootstrap measures, ``request_noise``) is mostly not run-to-run noise:
    more requests on one boot would not narrow the interval, another boot does (``dspark_ci.evidence``).
    """
    logs = [math.log(value) for value in new_boots]
    n, k = len(logs), max(1, reference.runs)
    total_var, df = reference.noise ** 2, k - 1
    if n > 1:  # the new boots' spread is evidence about the run-to-run noise too
        total_var = (df * total_var + (n - 1) * statistics.variance(logs)) / (df + n - 1)
        df += n - 1
    se = math.sqrt(total_var / n + MEDIAN_VARIANCE * reference.noise ** 2 / k)
    effect = statistics.fmean(logs) - math.log(reference.value)
    test = f"t on log values, {n} boot(s) vs {k} baseline run(s)"
    return _verdict(effect, se, max(df, 1), tolerance, better, levels, RELATIVE, test, n, detect)


def compare_samples(new: Sequence[float], base: Sequence[float], better: str, tolerance: float,
                    levels: Levels, detect: float | None = None, surely_past: float = 0.0) -> Verdict:
    """Two samples of one metric (e.g. per-boot throughput at two commits): Welch's t on log values, the
    effect relative. Each side needs two values or more. A bisect step, which asks "nearer which end?", passes
    ``detect`` and ``surely_past`` equal to the tolerance: red only when the whole interval is past it."""
    new_logs, base_logs = [math.log(v) for v in new], [math.log(v) for v in base]
    if len(new_logs) < 2 or len(base_logs) < 2:
        raise ValueError("compare_samples needs at least two values on each side")
    var_new, var_base = statistics.variance(new_logs) / len(new_logs), statistics.variance(base_logs) / len(base_logs)
    se = math.sqrt(var_new + var_base)
    df = ((var_new + var_base) ** 2 / (var_new ** 2 / (len(new_logs) - 1) + var_base ** 2 / (len(base_logs) - 1))
          if se > 0 else math.inf)  # Welch–Satterthwaite
    effect = statistics.fmean(new_logs) - statistics.fmean(base_logs)
    test = f"Welch t on log values, {len(new_logs)} vs {len(base_logs)} samples"
    return _verdict(effect, se, df, tolerance, better, levels, RELATIVE, test, len(new_logs), detect, surely_past)


def compare_paired(new_by_unit: Mapping[str, Sequence[float]], base_by_unit: Mapping[str, float], better: str,
                   tolerance: float, levels: Levels, unit: str = "questions", detect: float | None = None) -> Verdict:
    """Paired over the units both sides measured (GPQA: questions; each side's repeats averaged within a
    question, so the question is the unit and repeats are clustered). Effect: mean of the per-unit
    differences (absolute), Student t over units; the between-unit variance cancels."""
    common = [u for u in new_by_unit if u in base_by_unit and new_by_unit[u]]
    if len(common) < 2:
        raise ValueError(f"compare_paired needs at least two {unit} measured on both sides")
    differences = [statistics.fmean(new_by_unit[u]) - base_by_unit[u] for u in common]
    repeats = statistics.fmean(len(new_by_unit[u]) for u in common)
    se = float(_scipy().sem(differences))
    test = f"paired t over {len(common)} {unit} (clustered, {repeats:g} repeat(s) each)"
    return _verdict(statistics.fmean(differences), se, len(common) - 1, tolerance, better, levels, ABSOLUTE, test,
                    len(common), detect)


def compare_estimates(new: float, new_se: float, base: float, base_se: float, better: str, tolerance: float,
                      levels: Levels, samples: int, what: str = "", detect: float | None = None) -> Verdict:
    """Two independent estimates with standard errors (e.g. GPQA accuracy against a baseline that kept no
    per-question record): normal interval of the absolute difference."""
    se = math.hypot(new_se, base_se)
    test = f"unpaired normal interval{' over ' + what if what else ''} (no per-unit baseline record)"
    return _verdict(new - base, se, None, tolerance, better, levels, ABSOLUTE, test, samples, detect)


@functools.lru_cache(maxsize=256)
def chance_floor(questions: int, chance: float = 0.25, false_pass: float = 0.01) -> float:
    """The smallest accuracy k/n that a guesser (each answer right with probability ``chance``) reaches at most
    ``false_pass`` of the time on ``questions`` questions: exact binomial."""
    k = int(_scipy().binom.isf(false_pass, questions, chance)) + 1  # P(X >= k) <= false_pass
    return k / questions


def chance_pass_probability(floor: float, questions: int, accuracy: float) -> float:
    """P(score >= floor) for a model answering each question right with probability ``accuracy`` (exact)."""
    k = math.ceil(floor * questions - 1e-3)  # a floor read back from a gate is rounded (6 decimals)
    return float(_scipy().binom.sf(k - 1, questions, accuracy))


def bootstrap_stderr(values: Sequence[float], statistic: str = "median", resamples: int = 1000,
                     seed: int = 0) -> float | None:
    """Standard error of ``statistic`` ("median" | "mean") over one boot's per-request values (scipy's
    bootstrap); None with fewer than two values."""
    if len(values) < 2:
        return None
    import numpy

    function = {"median": numpy.median, "mean": numpy.mean}[statistic]
    result = _scipy().bootstrap((list(values),), function,
                                   n_resamples=resamples, method="percentile", random_state=seed, vectorized=True)
    return float(result.standard_error)


def ratio_stderr(numerators: Sequence[float], denominators: Sequence[float], resamples: int = 1000,
                 seed: int = 0) -> float | None:
    """Standard error of Σ numerators / Σ denominators over requests (e.g. accept length = Σ tokens / Σ verify
    steps), by the paired bootstrap over requests; None with fewer than two requests."""
    if len(numerators) < 2 or sum(denominators) <= 0:
        return None
    result = _scipy().bootstrap((list(numerators), list(denominators)),
                                   lambda num, den, axis: num.sum(axis=axis) / den.sum(axis=axis),
                                   paired=True, n_resamples=resamples, method="percentile", random_state=seed,
                                   vectorized=True)
    return float(result.standard_error)

