"""Statistical verdicts: does a measurement show a regression beyond a stated tolerance? (issue 22)

Every comparison answers with a ``Verdict`` record: ``passed``, ``regressed`` or ``inconclusive``, the effect
(the change of the new measurement against the reference), its interval, the tolerance and the test used.

The decision is non-inferiority style, on the effect in the metric's *worse* direction:

- ``regressed`` when the whole interval lies beyond the tolerance (its better end is worse than the
  tolerance at one-sided level ``alpha``: a false red happens at most ``alpha`` of the time for a metric that
  really is within tolerance);
- ``passed`` when the whole interval lies within the tolerance (its worse end, at one-sided level ``beta``, is
  inside it: a regression right at the tolerance passes at most ``beta`` of the time);
- ``inconclusive`` otherwise: the data cannot tell, and the verdict says so instead of flipping a coin.

The interval is therefore [better bound at 1 − alpha, worse bound at 1 − beta] (coverage 1 − alpha − beta).
Sequential looks (more boots, more requests, more GPQA repeats when a first look is inconclusive) split both
levels evenly over the planned looks (``Levels.per_look``): Bonferroni over looks, valid whatever the
dependence between them, so repeated looks never inflate the error rates. A whole run's false-red rate is split
over its gates the same way (``Levels.family``).

Distributions come from scipy (t, normal, binomial, bootstrap); nothing here re-derives them. Everything is
plain floats in and a frozen record out, so the bisect, the gates and the power benchmark share one decision.

The API, smallest first:
- ``decide(effect_low, effect_high, tolerance, better)``: the three-way rule on an interval;
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
from dataclasses import dataclass
from typing import Mapping, Sequence


PASSED, REGRESSED, INCONCLUSIVE = "passed", "regressed", "inconclusive"
VERDICTS = (PASSED, REGRESSED, INCONCLUSIVE)
HIGHER, LOWER = "higher", "lower"  # which direction of the metric is better
RELATIVE, ABSOLUTE = "relative", "absolute"  # the effect's scale: new/base − 1, or new − base

# Stated defaults (printed in every report that uses them):
RUN_FALSE_RED = 0.01  # a whole run (every cell × gated metric) is red by luck at most 1 % of the time
GATE_FALSE_PASS = 0.05  # a regression right at the tolerance passes a gate at most 5 % of the time
MAX_LOOKS = 4  # one measurement and up to three more when inconclusive (sequential sampling budget)


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
    """The error levels of one look at one gate: ``alpha`` (false red), ``beta`` (false pass)."""

    alpha: float
    beta: float = GATE_FALSE_PASS
    looks: int = 1  # planned looks these levels are already split over

    @classmethod
    def family(cls, gates: int, run_false_red: float = RUN_FALSE_RED, beta: float = GATE_FALSE_PASS,
               looks: int = 1) -> "Levels":
        """Per-gate, per-look levels for a run of ``gates`` gates with ``looks`` planned looks each: Bonferroni
        over gates (the run's false-red rate) and over looks (both rates)."""
        gates = max(1, gates)
        return cls(alpha=run_false_red / gates / looks, beta=beta / looks, looks=looks)

    def describe(self) -> str:
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

    @property
    def conclusive(self) -> bool:
        return self.verdict != INCONCLUSIVE

    def describe(self) -> str:
        """"+5.1% [+3.9%, +6.3%] vs tolerance +2.5%: regressed (Welch t on log values, 3 boots)"."""
        unit = (lambda v: f"{v:+.1%}") if self.scale == RELATIVE else (lambda v: f"{v * 100:+.1f} pt")
        return (f"{unit(self.effect)} [{unit(self.low)}, {unit(self.high)}] vs tolerance {unit(self.tolerance)}: "
                f"{self.verdict} ({self.test})")


def decide(low: float, high: float, tolerance: float, better: str) -> str:
    """The three-way rule: the interval [low, high] of the signed effect against the signed ``tolerance``."""
    worse_end, better_end = (high, low) if better == LOWER else (-low, -high)
    limit = tolerance if better == LOWER else -tolerance
    if better_end > limit:
        return REGRESSED
    if worse_end <= limit:
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
             scale: str, test: str, samples: int) -> Verdict:
    low, high = _interval(effect, se, df, levels, better)
    if scale == RELATIVE:  # computed on log values; shown as ratios − 1
        effect, low, high, tolerance = (math.expm1(v) for v in (effect, low, high, math.log1p(tolerance)))
    return Verdict(decide(low, high, tolerance, better), effect, low, high, tolerance, scale, test,
                   levels.alpha, levels.beta, samples)


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
                  levels: Levels) -> Verdict:
    """Per-boot values of a run (each a whole boot's figure, e.g. median TPOT) against a recorded baseline.

    On log values, so the effect is relative. One boot's figure varies by the run-to-run noise: the baseline's
    (over its runs), pooled with the new boots' own spread when there are several, so a machine noisier today
    than when the baseline was recorded widens the interval as its boots come in. The baseline mean's own
    error (noise² / runs) is added. Student t with the pooled degrees of freedom.

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
    se = math.sqrt(total_var / n + reference.noise ** 2 / k)
    effect = statistics.fmean(logs) - math.log(reference.value)
    test = f"t on log values, {n} boot(s) vs {k} baseline run(s)"
    return _verdict(effect, se, max(df, 1), tolerance, better, levels, RELATIVE, test, n)


def compare_samples(new: Sequence[float], base: Sequence[float], better: str, tolerance: float,
                    levels: Levels) -> Verdict:
    """Two samples of one metric (e.g. per-boot throughput at two commits): Welch's t on log values, the
    effect relative. Each side needs two values or more."""
    new_logs, base_logs = [math.log(v) for v in new], [math.log(v) for v in base]
    if len(new_logs) < 2 or len(base_logs) < 2:
        raise ValueError("compare_samples needs at least two values on each side")
    var_new, var_base = statistics.variance(new_logs) / len(new_logs), statistics.variance(base_logs) / len(base_logs)
    se = math.sqrt(var_new + var_base)
    df = ((var_new + var_base) ** 2 / (var_new ** 2 / (len(new_logs) - 1) + var_base ** 2 / (len(base_logs) - 1))
          if se > 0 else math.inf)  # Welch–Satterthwaite
    effect = statistics.fmean(new_logs) - statistics.fmean(base_logs)
    test = f"Welch t on log values, {len(new_logs)} vs {len(base_logs)} samples"
    return _verdict(effect, se, df, tolerance, better, levels, RELATIVE, test, len(new_logs))


def compare_paired(new_by_unit: Mapping[str, Sequence[float]], base_by_unit: Mapping[str, float], better: str,
                   tolerance: float, levels: Levels, unit: str = "questions") -> Verdict:
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
                    len(common))


def compare_estimates(new: float, new_se: float, base: float, base_se: float, better: str, tolerance: float,
                      levels: Levels, samples: int, what: str = "") -> Verdict:
    """Two independent estimates with standard errors (e.g. GPQA accuracy against a baseline that kept no
    per-question record): normal interval of the absolute difference."""
    se = math.hypot(new_se, base_se)
    test = f"unpaired normal interval{' over ' + what if what else ''} (no per-unit baseline record)"
    return _verdict(new - base, se, None, tolerance, better, levels, ABSOLUTE, test, samples)


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

