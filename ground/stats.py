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

Which test, and why (each verdict names its test, results.json key ``test``):
- speed and acceptance, per-boot figures against a baseline: t on log values, because a boot's figure is a mean or
  median of many requests (near normal on the log scale) and the baseline's noise is itself estimated from a few
  runs (t's degrees of freedom carry that), with a floor where the runs could not estimate it and a drift allowance
  for what changed since;
- GPQA paired over questions: exact, because its differences are whole questions, mostly zero, and tested at the
  family's small alpha, where a t tail on a handful of ±1 values is meaningless (one lost question of 20 gives t = 1
  at any alpha); t only with many fractional differences (averaged repeats), where the central limit holds;
- GPQA without a per-question record: two estimates with their standard errors (normal).

Distributions come from scipy (t, normal, binomial, Clopper–Pearson, bootstrap); nothing here re-derives them.
Everything is plain floats in and a frozen record out, so the bisect, the gates and the power benchmark share one
decision.

The API, smallest first:
- ``decide(effect, low, high, tolerance, detect, better, surely_past=0)``: the three-way rule on an effect and
  its interval;
- ``compare_samples(new, base, better, tolerance, levels)``: two samples of a metric (e.g. per-boot values of
  two commits) → ``Verdict`` (Welch t on log values: the effect is relative);
- ``compare_boots(new_boots, reference, ...)``: per-boot values against a recorded baseline summary
  (``BootReference``: value, runs, run-to-run noise, its per-request part and the drift allowance), Student t on
  log values: every variance has a source and a floor (``BootReference.boot_noise``), never 0;
- ``compare_paired(new_by_unit, base_by_unit, ...)``: paired over units (GPQA questions, clustered, repeats
  averaged within a question): the exact sign test (McNemar's when the differences are whole questions,
  ``sign_test``) where the differences are binary or few, Student t where many units differ by fractions;
- ``compare_estimates(new, new_se, base, base_se, ...)``: two estimates with standard errors (normal);
- ``chance_floor(n, chance, false_pass)``: the exact binomial score a guesser reaches at most ``false_pass``
  of the time.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

PASSED, REGRESSED, INCONCLUSIVE = "passed", "regressed", "inconclusive"
VERDICTS = (PASSED, REGRESSED, INCONCLUSIVE)
HIGHER, LOWER = "higher", "lower"  # which direction of the metric is better
RELATIVE, ABSOLUTE = "relative", "absolute"  # the effect's scale: new/base − 1, or new − base

# Stated defaults (report.md's statistical-gates line prints the run's false-red rate and the levels derived here):
RUN_FALSE_RED = 0.01  # a whole run (every cell × gated metric) is red by luck at most 1 % of the time
GATE_FALSE_PASS = 0.02  # a regression right at the detection line passes a gate at most 2 % of the time
MEDIAN_VARIANCE = math.pi / 2  # var(median of k normal values) / var(their mean), for large k
DETECT_FACTOR = 2.0  # the detection line (what a pass rules out) as a multiple of the tolerance
# The relative resolution of a recorded figure: `baseline record` keeps 4 significant digits, so a noise below this
# was not measured (identical runs) and is never taken as 0 (``BootReference.boot_noise``).
RESOLUTION = 5e-4
# The stated drift model: between the baseline's runs and today the environment (drivers, kernels, neighbours) may
# have moved a metric by this much (one standard deviation, a fraction of the value), which no boot today averages
# away. A baseline states its own per metric (`drift:`); 0.5 % is a quarter of the 2-2.5 % speed tolerances, so a
# clean cell at one boot stays green while a drift of a whole tolerance still needs several standard deviations.
DEFAULT_DRIFT = 0.005
# Fewer discordant units than this, or binary differences: GPQA's paired comparison is the exact sign test, not t
MIN_T_DISCORDANT = 30
# How a gate's false-pass rate β is spread over its planned looks (weights per look, from the looks' boots).
# "equal": the same share at every look. "front": most at the first look (weights 1/boots): a clean cell, which
# needs its worse end inside the detection line, passes at one boot more often, while a regression that passes
# early does so at most β in all; alpha stays where the evidence is (in proportion to the boots).
BETA_SPENDING = {"equal": lambda boots: [1.0] * len(boots), "front": lambda boots: [1.0 / n for n in boots]}
BETA_SCHEDULE = "equal"


def scipy_stats():
    """scipy.stats, imported on first use: records import this module, and most commands never compute a verdict."""
    from scipy import stats

    return stats


def planned_boots(max_boots: int, retries: int = 0) -> tuple[int, ...]:
    """Every boot count a cell may be judged at: the sequential looks of ``look_boots(max_boots)`` and one
    judgement after each retry (1 + r boots for r = 1 .. ``retries``), each a look of its own."""
    return tuple(sorted(set(look_boots(max_boots)) | set(range(1, retries + 2))))


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
    beta_plan: tuple[tuple[int, float], ...] = ()  # (boots, beta) per planned look; empty: ``beta`` at every look

    @classmethod
    def family(cls, gates: int, run_false_red: float = RUN_FALSE_RED, beta: float = GATE_FALSE_PASS,
               looks: int = 1, max_boots: int | None = None, retries: int = 0) -> Levels:
        """Per-gate, per-look levels for a run of ``gates`` gates: Bonferroni over gates (the run's false-red rate),
        and over the looks: ``looks`` equal shares, or with ``max_boots`` (and ``retries``) the planned looks of
        ``planned_boots``, each look's share of alpha in proportion to its boots (1, 2, 4, 8 of 15: most of it
        where the evidence is, so a small regression seen at the last look is not lost to the early ones; a loud
        one is red at the first look anyway). Beta is split equally (a clean cell may stop early)."""
        gate_alpha = run_false_red / max(1, gates)
        boots = planned_boots(max_boots or 1, retries)
        if len(boots) == 1:
            return cls(alpha=gate_alpha / looks, beta=beta / looks, looks=looks)
        plan = tuple((n, gate_alpha * n / sum(boots)) for n in boots)
        weights = BETA_SPENDING[BETA_SCHEDULE](boots)
        beta_plan = tuple((n, beta * w / sum(weights)) for n, w in zip(boots, weights, strict=False))
        return cls(alpha=plan[0][1], beta=beta_plan[0][1], looks=len(boots), plan=plan, beta_plan=beta_plan)

    def at_boots(self, boots: int) -> Levels:
        """The levels of the look that ``boots`` boots make. Every planned boot count is one look with its own
        share; a count the plan does not hold (a file written by another plan) gets the smallest share, so no
        decision ever spends more than one look's share, and none spends the same share twice."""
        if not self.plan:
            return self
        shares, betas = dict(self.plan), dict(self.beta_plan)
        beta = betas.get(boots, min(betas.values())) if betas else self.beta
        return replace(self, alpha=shares.get(boots, min(shares.values())), beta=beta)

    def single_look(self) -> Levels:
        """The gate's whole share at one look, for a gate that more boots cannot inform (answers fixed per
        question: a later boot repeats them), decided so before any live data is seen."""
        alpha = sum(a for _, a in self.plan) if self.plan else self.alpha * self.looks
        beta = sum(b for _, b in self.beta_plan) if self.beta_plan else self.beta * self.looks
        return Levels(alpha=alpha, beta=beta, looks=1)

    def describe(self) -> str:
        if self.plan:
            shares = ", ".join(f"{a:.2g} at {n} boot{'s' * (n > 1)}" for n, a in self.plan)
            betas = ", ".join(f"{b:.2g}" for _, b in self.beta_plan) or f"{self.beta:.2g}"
            return f"α = {shares} (false red), β = {betas} (false pass) per look ({self.looks} planned)"
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
    final: bool = False  # more boots cannot change it (e.g. GPQA answers fixed per question): no more looks for it

    @property
    def detection(self) -> float:
        return self.tolerance if self.detect is None else self.detect

    @property
    def conclusive(self) -> bool:
        return self.verdict != INCONCLUSIVE

    @property
    def measured(self) -> bool:
        """A test decided (False: no statistic could be computed, ``test`` says why; the verdict is inconclusive)."""
        return self.samples > 0

    def describe(self) -> str:
        """"+5.1% [+3.9%, +6.3%] vs tolerance +2.5%, detect +5.0%: regressed (Welch t on log values, 3 boots)";
        a pass inside the indifference zone (past the tolerance, the detection line ruled out) says so:
        "+3.2% [...]: passed: beyond the +2.5% tolerance, but +5.0% ruled out (...)"."""
        unit = (lambda v: f"{v:+.1%}") if self.scale == RELATIVE else (lambda v: f"{v * 100:+.1f} pt")
        if not self.measured:
            return f"inconclusive: no statistic ({self.test})"
        lines = f"tolerance {unit(self.tolerance)}"
        if self.detection != self.tolerance:
            lines += f", detect {unit(self.detection)}"
        verdict = self.verdict
        if self.in_indifference_zone:
            verdict = (f"passed: beyond the {unit(self.tolerance)} tolerance, but {unit(self.detection)} ruled out "
                       "(the indifference zone: a change this small is not told apart from one at the tolerance)")
        return f"{unit(self.effect)} [{unit(self.low)}, {unit(self.high)}] vs {lines}: {verdict} ({self.test})"

    @property
    def in_indifference_zone(self) -> bool:
        """Passed, with the effect past the tolerance (worse than it) but the detection line ruled out."""
        return self.verdict == PASSED and abs(self.effect) > abs(self.tolerance) and \
            math.copysign(1.0, self.effect) == math.copysign(1.0, self.tolerance)


def no_statistic(why: str, effect: float, tolerance: float, scale: str, levels: Levels,
                 detect: float | None = None) -> Verdict:
    """An inconclusive verdict for a gate whose test could not be computed: never a fallback to a fixed line."""
    return Verdict(INCONCLUSIVE, effect, effect, effect, tolerance, scale, why, levels.alpha, levels.beta, 0, detect)


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
    (``noise``, a fraction of the value, per-request sampling included), the part of it that per-request
    sampling explains (``request_noise``: one boot's own standard error, as a fraction) and the allowance for
    drift between the baseline's runs and today (``drift``, a fraction: ``DEFAULT_DRIFT`` unless stated)."""

    value: float
    runs: int
    noise: float
    request_noise: float = 0.0
    drift: float | None = None

    def boot_noise(self, live_request_se: Sequence[float] = ()) -> tuple[float, str]:
        """One boot's run-to-run standard deviation (log scale) and where it comes from. Never 0: the baseline's
        spread when its runs measured one (above ``RESOLUTION``), widened when today's boots are noisier within
        than the baseline's were (their per-request standard error, root mean square, above ``request_noise``:
        that part of a boot's figure varies by the excess, which the baseline's spread cannot have seen); when its
        runs were identical (a deterministic recording), the largest per-request standard error known, the
        baseline's or the live boots' own (a boot whose requests draw fresh randomness varies at least that much),
        and never less than ``RESOLUTION``."""
        if self.noise > RESOLUTION:
            source = f"the baseline's {self.runs} runs"
            today = math.sqrt(statistics.fmean([se ** 2 for se in live_request_se])) if live_request_se else 0.0
            if self.request_noise and today > self.request_noise:
                widened = math.sqrt(self.noise ** 2 + today ** 2 - self.request_noise ** 2)
                return widened, (f"{source} ({self.noise:.2%}), widened by today's per-request error {today:.2%} "
                                 f"over theirs {self.request_noise:.2%}")
            return self.noise, source
        floor = max([RESOLUTION, self.request_noise, *live_request_se])
        source = "per-request standard error" if floor > RESOLUTION else "the metric's resolution"
        return floor, f"{source}: the baseline's runs were identical"

    @property
    def drift_allowance(self) -> float:
        return DEFAULT_DRIFT if self.drift is None else self.drift


def compare_boots(new_boots: Sequence[float], reference: BootReference, better: str, tolerance: float,
                  levels: Levels, detect: float | None = None, live_request_se: Sequence[float] = ()) -> Verdict:
    """Per-boot values of a run (each a whole boot's figure, e.g. median TPOT) against a recorded baseline.

    On log values, so the effect is relative. Every variance has a source and a floor (``BootReference.boot_noise``):
    one boot's figure varies by the run-to-run noise, the baseline's (over its runs; floored when they could not
    measure it), pooled with the new boots' own spread when there are several, so a machine noisier today than
    when the baseline was recorded widens the interval as its boots come in. The baseline value's own error is
    added: it is the median of its runs (``baseline record``), whose variance is π/2 times the mean's (noise² /
    runs) for normal values. So is the drift allowance: the environment may have moved between the baseline's runs
    and today by ``drift`` (one standard deviation, a fraction), which no number of boots today averages away.
    Student t with the pooled degrees of freedom.

    A boot's per-request standard error (``live_request_se``, fractions) is not added whole where the baseline's
    runs measured the noise: the suites send the same prompts every boot, so the spread between requests is mostly
    not run-to-run noise, and what is lies in the runs' spread already. Only its excess over the baseline's own
    (``request_noise``) is: a boot noisier within than the recorded ones varies more, seen from one boot. Where the
    runs could not measure the noise, it is the floor.

    A boot that measured 0 (or less) stays in: on a higher-is-better metric that is a collapse (red, effect
    −100 %); on a lower-is-better one a figure the metric cannot take (inconclusive, saying so).
    """
    if any(value <= 0 for value in new_boots):
        return _zero_boot(new_boots, reference, better, tolerance, levels, detect)
    logs = [math.log(value) for value in new_boots]
    n, k = len(logs), max(1, reference.runs)
    noise, source = reference.boot_noise(live_request_se)
    total_var, df = noise ** 2, max(1, k - 1)
    if n > 1:  # the new boots' spread is evidence about the run-to-run noise too
        total_var = (df * total_var + (n - 1) * statistics.variance(logs)) / (df + n - 1)
        df += n - 1
    drift = reference.drift_allowance
    se = math.sqrt(total_var / n + MEDIAN_VARIANCE * noise ** 2 / k + drift ** 2)
    effect = statistics.fmean(logs) - math.log(reference.value)
    test = (f"t on log values, {n} boot(s) vs {k} baseline run(s); per-boot noise {noise:.2%} from {source}, "
            f"drift allowance {drift:.2%}")
    return _verdict(effect, se, df, tolerance, better, levels, RELATIVE, test, n, detect)


def _zero_boot(new_boots: Sequence[float], reference: BootReference, better: str, tolerance: float,
               levels: Levels, detect: float | None) -> Verdict:
    zeros = sum(value <= 0 for value in new_boots)
    if better == HIGHER:
        detect = DETECT_FACTOR * tolerance if detect is None else detect
        return Verdict(REGRESSED, -1.0, -1.0, -1.0, tolerance, RELATIVE,
                       f"{zeros} of {len(new_boots)} boot(s) measured 0: a collapse", levels.alpha, levels.beta,
                       len(new_boots), detect)
    return no_statistic(f"{zeros} of {len(new_boots)} boot(s) measured 0, which this metric cannot be",
                        float(statistics.fmean(new_boots)) / reference.value - 1, tolerance, RELATIVE, levels, detect)


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
    question, so the question is the unit and repeats are clustered, and identical repeats add nothing). Effect:
    the mean of the per-unit differences (absolute); the between-unit variance cancels.

    Which test fits the data:
    - an exact sign test over the discordant units (``sign_test``; McNemar's exact test when every difference is
      −1, 0 or +1, as with one answer per question or repeats that always agree) when the differences are binary
      or fewer than ``MIN_T_DISCORDANT`` units differ: on mostly-zero, binary differences at the family's small
      alpha a t tail is unreliable (one lost question of 20 gives t = 1 whatever the alpha);
    - Student t over units when many units differ by fractions (averaged repeats): the central limit holds there
      and the sign test would throw the sizes away."""
    common = [u for u in new_by_unit if u in base_by_unit and new_by_unit[u]]
    if len(common) < 2:
        raise ValueError(f"compare_paired needs at least two {unit} measured on both sides")
    differences = [statistics.fmean(new_by_unit[u]) - base_by_unit[u] for u in common]
    repeats = statistics.fmean(len(new_by_unit[u]) for u in common)
    discordant = [d for d in differences if abs(d) > 1e-12]
    binary = all(abs(abs(d) - 1) < 1e-9 for d in discordant)
    if binary or len(discordant) < MIN_T_DISCORDANT:
        return sign_test(differences, better, tolerance, levels, unit, detect, repeats)
    se = float(scipy_stats().sem(differences))
    test = f"paired t over {len(common)} {unit} (clustered, {repeats:g} repeat(s) each, {len(discordant)} differ)"
    return _verdict(statistics.fmean(differences), se, len(common) - 1, tolerance, better, levels, ABSOLUTE, test,
                    len(common), detect)


def sign_test(differences: Sequence[float], better: str, tolerance: float, levels: Levels, unit: str = "questions",
              detect: float | None = None, repeats: float = 1.0) -> Verdict:
    """Exact sign test over the discordant units (scipy's ``binomtest``), conditional on how many differ: under
    no change a discordant unit is as likely to move either way. The interval is Clopper–Pearson's on the share of
    discordant units that moved the worse way (better end at 1 − alpha, worse end at 1 − beta), times the share of
    units that differ and their mean size (exact when every difference is ±1: McNemar). No discordant unit: the
    effect is 0 and so is its interval, conditionally on nothing having moved."""
    detect = DETECT_FACTOR * tolerance if detect is None else detect
    n = len(differences)
    discordant = [d for d in differences if abs(d) > 1e-12]
    m = len(discordant)
    worse = sum((d < 0) == (better == HIGHER) for d in discordant)
    binary = all(abs(abs(d) - 1) < 1e-9 for d in discordant)
    name = "McNemar exact test" if binary else "exact sign test"
    test = (f"{name} over {m} discordant of {n} {unit} ({worse} worse, {m - worse} better; clustered, "
            f"{repeats:g} repeat(s) each)")
    effect = statistics.fmean(differences)
    if m == 0:
        low = high = 0.0
    else:
        size = statistics.fmean(abs(d) for d in discordant) * m / n
        result = scipy_stats().binomtest(worse, m, 0.5)
        worse_low = result.proportion_ci(1 - 2 * levels.alpha, method="exact").low  # one-sided at 1 − alpha
        worse_high = result.proportion_ci(1 - 2 * levels.beta, method="exact").high  # one-sided at 1 − beta
        sign = 1.0 if better == HIGHER else -1.0  # a worse unit moves the effect by −sign
        ends = (sign * size * (1 - 2 * worse_low), sign * size * (1 - 2 * worse_high))  # better end, worse end
        low, high = min(ends), max(ends)
    return Verdict(decide(effect, low, high, tolerance, detect, better), effect, low, high, tolerance, ABSOLUTE,
                   test, levels.alpha, levels.beta, n, detect)


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
    k = int(scipy_stats().binom.isf(false_pass, questions, chance)) + 1  # P(X >= k) <= false_pass
    return k / questions


@functools.lru_cache(maxsize=256)
def chance_band(questions: int, chance: float = 0.25, false_alarm: float = 0.01) -> tuple[float, float]:
    """The accuracies (low, high) a guesser stays within on ``questions`` questions but ``false_alarm`` of the time,
    split evenly between the two tails: exact binomial. A model that answers at chance is expected inside."""
    low = int(scipy_stats().binom.ppf(false_alarm / 2, questions, chance))  # P(X < low) <= false_alarm / 2
    high = int(scipy_stats().binom.isf(false_alarm / 2, questions, chance))  # P(X > high) <= false_alarm / 2
    return low / questions, high / questions


def chance_pass_probability(floor: float, questions: int, accuracy: float) -> float:
    """P(score >= floor) for a model answering each question right with probability ``accuracy`` (exact)."""
    k = math.ceil(floor * questions - 1e-3)  # a floor read back from a gate is rounded (6 decimals)
    return float(scipy_stats().binom.sf(k - 1, questions, accuracy))


def bootstrap_stderr(values: Sequence[float], statistic: str = "median", resamples: int = 1000,
                     seed: int = 0) -> float | None:
    """Standard error of ``statistic`` ("median" | "mean") over one boot's per-request values (scipy's
    bootstrap); None with fewer than two values."""
    if len(values) < 2:
        return None
    import numpy

    function = {"median": numpy.median, "mean": numpy.mean}[statistic]
    result = scipy_stats().bootstrap((list(values),), function,
                                   n_resamples=resamples, method="percentile", random_state=seed, vectorized=True)
    return float(result.standard_error)


def ratio_stderr(numerators: Sequence[float], denominators: Sequence[float], resamples: int = 1000,
                 seed: int = 0) -> float | None:
    """Standard error of Σ numerators / Σ denominators over requests (e.g. accept length = Σ tokens / Σ verify
    steps), by the paired bootstrap over requests; None with fewer than two requests."""
    if len(numerators) < 2 or sum(denominators) <= 0:
        return None
    result = scipy_stats().bootstrap((list(numerators), list(denominators)),
                                   lambda num, den, axis: num.sum(axis=axis) / den.sum(axis=axis),
                                   paired=True, n_resamples=resamples, method="percentile", random_state=seed,
                                   vectorized=True)
    return float(result.standard_error)

