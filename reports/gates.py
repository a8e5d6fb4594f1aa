"""Gates: what a cell's measurements must satisfy, as ``GateResult`` records (CONTRACT.md gate dicts on disk).

Two sources:
- floors that need no baseline: a speculative cell's accept length must stay above the collapse
  floor (a draft model that never gets accepted serves correct text, only slowly), and GPQA accuracy
  must beat guessing by a margin that shrinks with the number of questions (``chance_floor``);
- a baseline's specs for the cell (``dspark_ci.reports.baseline_file``). A ratio gate whose baseline recorded the
  run-to-run noise, and every GPQA gate, is a statistical decision (``dspark_ci.ground.stats``): ``passed``,
  ``regressed`` or ``inconclusive`` on the effect's interval against the stated tolerance (``max_ratio``/``min_ratio``,
  GPQA ``max_drop``), at levels split over the run's gates (``family_levels``); GPQA is paired over questions when
  the baseline kept its per-question record. Without recorded noise a ratio gate is the fixed limit it was.

The ``threshold`` of a gate dict is today's line (value × ratio, widened to the noise; GPQA's
value − k·√(s² + s_now²)) so old readers keep working; ``passed`` is the verdict being ``passed``.

A gated metric that was not measured gives ``value: None, passed: False``: a gate that silently
passes because its suite did not run would hide exactly the regressions it exists for.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from dspark_ci.ground import position_homogeneity as homogeneity
from dspark_ci.ground import stats
from dspark_ci.ground.measurements import BootMetrics, Envelope, EnvelopePoint, crossing
from dspark_ci.ground.position_homogeneity import ENDED, POOLED, POWER_BETA, PositionTest, detectable_shift, judge
from dspark_ci.ground.records import CellResult, GateResult, RunResults, Status
from dspark_ci.ground.suites import SATURATED_LOOP_LAG_MS, SUITE_DEFAULTS, suite_of
from dspark_ci.reports.baseline_file import NEVER_INWARD_KEY, NOISE_RUN_SDS, Baseline, MetricSpec
from dspark_ci.reports.metrics import HIGHER, LOWER, METRICS, PAIRED_STDERR_OF, STDERR_OF, format_value, in_table_order

LOOP_LAG_METRIC = "client_loop_lag_ms_p99"  # the speed suite's measure of its own CPU starvation

# accept_length at or below ~1 means no draft token is being accepted: the accept suite's own floor, one fact
COLLAPSE_FLOOR = SUITE_DEFAULTS["accept"]["min_accept_length"]
SPEEDUP_FLOOR = 1.0  # a speculative deployment no faster than the same one without speculation does not pay
GPQA_CHANCE = 0.25  # four choices
CHANCE_FALSE_PASS = 0.01  # a guesser passes the chance floor at most this often (exact binomial)
GATE_PRECISION = 6  # decimals kept in thresholds (ratios make long floats)
LOSSLESS_METRIC = "sampled_lossless_p"  # the per-position test's family p (ground/position_homogeneity.py)
DEFAULT_RUNS = 3  # boots behind a baseline's `noise` when it does not say (`baseline record` needs three)


def evaluate(cell: CellResult, metrics: Mapping, baseline: Baseline | None,
             levels: stats.Levels | None = None) -> tuple[GateResult, ...]:
    """All gates for one cell: floors first, then the baseline's, in the metric table's order. ``levels``: each
    statistical gate's error levels (``family_levels``; default: this cell's gates alone at the run's rate)."""
    if levels is None:
        levels = family_levels([cell], baseline)
    evidence = Evidence.of(cell, metrics)
    levels = levels.at_boots(len(evidence.boots))
    gates = []
    for limit in _limits(cell, metrics, baseline):
        value = metrics.get(limit.metric)
        if limit.statistical is not None:
            statistic = _statistic(limit.statistical, evidence, metrics, levels)
            if statistic is None and value is not None:  # measured, yet no test: never a fixed line
                statistic = stats.no_statistic(f"{limit.metric} measured but no test could be computed from the "
                                               "boots kept", 0.0, 0.0, stats.ABSOLUTE, levels)
        else:
            statistic = _floor_statistic(limit.metric, cell, metrics, levels)
        gates.append(_gate(limit.metric, limit.op, limit.threshold, value, statistic))
    return tuple(gates)


def family_levels(cells, baseline: Baseline | None, max_boots: int = 1, retries: int = 0) -> stats.Levels:
    """Per-gate levels for a run of ``cells`` gated against one baseline: the run's false-red rate
    (``stats.RUN_FALSE_RED``) split over every statistical gate, and over the looks that ``max_boots`` and
    ``retries`` plan (``stats.planned_boots``)."""
    return stats.Levels.family(sum(statistical_gates(cell, baseline) for cell in cells), max_boots=max_boots,
                               retries=retries)


def statistical_gates(cell: CellResult, baseline: Baseline | None) -> int:
    """How many statistical gates ``baseline`` sets for ``cell`` (none for an expected rejection)."""
    if baseline is None or cell.expect.rejects:
        return 0
    return sum(len(_statistical_keys(spec)) for spec in baseline.specs_for(cell.id).values())


def _statistical_keys(spec: MetricSpec) -> list[str]:
    keys = ["max_drop_stderr"] if spec.max_drop_stderr is not None else []
    keys += [NEVER_INWARD_KEY] if spec.never_inward else []
    if spec.noise is not None:
        keys += [key for key in ("min_ratio", "max_ratio") if getattr(spec, key) is not None]
    return keys


@dataclass(frozen=True)
class Evidence:
    """What a cell measured that a statistical gate reads: the figure of each boot (one boot unless the run
    sampled more) and GPQA's per-question outcomes."""

    boots: tuple[BootMetrics, ...]
    gpqa_questions: Mapping[str, tuple[float, ...]]
    envelope: Envelope | None = None  # the speed suite's sweep: where speculation pays
    mc_items: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # the mc suite's items, as GPQA's questions
    accept_requests: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # accept length per request

    @classmethod
    def of(cls, cell: CellResult, metrics: Mapping) -> Evidence:
        return cls(boots=cell.boots or (BootMetrics(metrics),),
                   gpqa_questions=_scores(cell.gpqa.per_question if cell.gpqa else {}), envelope=cell.envelope,
                   mc_items=_scores(cell.mc.per_item if cell.mc else {}), accept_requests=accept_units(cell))

    def paired_units(self, metric: str) -> Mapping[str, tuple[float, ...]]:
        """Each unit's scores (question or item id -> 1/0 per sample; request -> accept length) that ``metric``'s
        paired gate reads."""
        return {"gpqa_accuracy": self.gpqa_questions, "mc_accuracy": self.mc_items,
                "accept_length": self.accept_requests}.get(metric, {})

    def values(self, metric: str) -> list[float]:
        """Every boot's figure of ``metric``, zeros included (a boot that measured 0 is evidence, not noise)."""
        return [float(value) for boot in self.boots if (value := boot.value(metric)) is not None]

    def request_errors(self, metric: str) -> list[float]:
        """Each boot's own per-request standard error of ``metric``, as a fraction of its figure (where known)."""
        name = STDERR_OF.get(metric)
        return [float(error) / float(value) for boot in self.boots
                if name and (error := boot.value(name)) is not None and (value := boot.value(metric))]

    def timed_by_the_server(self) -> tuple[Evidence, tuple[float, ...]]:
        """The boots whose timings are the server's, and the client lags (p99, ms) of those set aside: a client
        event loop that ran ``SATURATED_LOOP_LAG_MS`` late was starved of CPU, so its TTFT, TPOT and throughput
        may measure the machine."""
        lags = [boot.value(LOOP_LAG_METRIC) for boot in self.boots]
        kept = tuple(boot for boot, lag in zip(self.boots, lags, strict=False)
                     if lag is None or lag <= SATURATED_LOOP_LAG_MS)
        dropped = tuple(float(lag) for lag in lags if lag is not None and lag > SATURATED_LOOP_LAG_MS)
        return replace(self, boots=kept), dropped


def accept_units(cell: CellResult) -> Mapping[str, tuple[float, ...]]:
    """Accept length per request, by the request's place in the order sent ("1", "2", ...): the accept suite sends
    the same prompts in the same order every run, so a deterministic engine's request N is the same prompt and, on
    a clean server, the same figure (``POSITIONAL_UNITS``)."""
    drift = cell.acceptance.drift if cell.acceptance else None
    return {str(place): (value,) for place, value in enumerate(drift.series, 1)} if drift else {}


def _scores(tallies: Mapping[str, tuple[int, int]]) -> Mapping[str, tuple[float, ...]]:
    return {unit: (1.0,) * right + (0.0,) * (asked - right) for unit, (right, asked) in tallies.items()}


def explain(cell: CellResult, metrics: Mapping, baseline: Baseline | None) -> dict[tuple, str]:
    """Where each gate's threshold comes from, keyed by (metric, op, threshold) as in the gate dict."""
    return {(limit.metric, limit.op, round(limit.threshold, GATE_PRECISION)): limit.basis
            for limit in _limits(cell, metrics, baseline)}


@dataclass(frozen=True)
class Limit:
    """One limit that applies to a cell: ``metric op threshold``, where the threshold comes from (``basis``), and
    for a statistical gate the baseline spec and the key that sets it (None: a plain comparison)."""

    metric: str
    op: str  # ">=" or "<="
    threshold: float
    basis: str
    statistical: tuple[MetricSpec, str] | None = None


def _limits(cell: CellResult, metrics: Mapping, baseline: Baseline | None) -> list[Limit]:
    """(metric, op, threshold, basis, statistical spec) for every limit that applies to the cell."""
    if cell.expect.rejects:
        return []  # nothing is measured on a deployment that must not come up
    limits = _floor_limits(cell, metrics)
    if baseline is not None:
        specs = baseline.specs_for(cell.id)
        for name in in_table_order(specs):
            limits.extend(_spec_limits(specs[name], metrics))
    return limits


def _floor_limits(cell: CellResult, metrics: Mapping) -> list[Limit]:
    return _collapse_floor(cell, metrics) + _speedup_floor(metrics) + _chance_limits(cell, metrics) + _lossless(metrics)


def _lossless(metrics: Mapping) -> list[Limit]:
    """Sampling stays lossless under speculation: no generated position's token distribution differs from the
    non-speculative reference's (per-position chi-square, Holm), at the gate's alpha."""
    if metrics.get(LOSSLESS_METRIC) is None:
        return []
    return [Limit(LOSSLESS_METRIC, ">=", stats.RUN_FALSE_RED, "lossless sampling: the family p of the per-position "
                  "tests above the gate's α (the run's false-red rate, split over its statistical gates)")]


def _floor_statistic(metric: str, cell: CellResult, metrics: Mapping, levels: stats.Levels) -> stats.Verdict | None:
    """The statistical decision of a floor that has one (losslessness: the per-position tests), else None."""
    if metric != LOSSLESS_METRIC:
        return None
    lossless = cell.acceptance.lossless if cell.acceptance is not None else None
    tests, samples = int(metrics.get("sampled_lossless_tests") or 0), int(metrics.get("sampled_lossless_samples") or 0)
    untested = lossless.untested or 0 if lossless is not None else 0
    verdict, why = judge(float(metrics[metric]), tests, untested, samples, levels.alpha)
    shift = detectable_shift(samples, samples, tests, levels.alpha)
    worst = min(lossless.positions, key=lambda t: t.p_value) if lossless is not None and lossless.positions else None
    effect = 0.0 if worst is None else worst.speculative_share - worst.reference_share
    test = f"chi-square homogeneity per prompt × generated position, Holm: {why}"
    red = [t for t in lossless.positions if t.adjusted_p <= levels.alpha] if lossless is not None else []
    if red:
        test += f"; {len(red)} red position{'s' * (len(red) > 1)} (prompt, position): " + ", ".join(
            f"({t.prompt}, {t.position})" for t in red)
    if worst is not None:
        test += f"; {_position_words(worst, levels.alpha)}"
    if not tests:
        return stats.no_statistic(test, 0.0, 0.0, stats.ABSOLUTE, levels)
    return stats.Verdict(_VERDICTS[verdict], effect, effect, effect, 0.0, stats.ABSOLUTE, test, levels.alpha,
                         POWER_BETA, tests * samples, None if math.isinf(shift) else shift)


_VERDICTS = {homogeneity.GREEN: stats.PASSED, homogeneity.RED: stats.REGRESSED,
             homogeneity.INCONCLUSIVE: stats.INCONCLUSIVE}


def _position_words(test: PositionTest, alpha: float) -> str:
    """"red at prompt 2, position 3: token 1234 in 52% of draws with speculation, 2% without (χ² 31.2, 1 df, p 2e-08,
    Holm 4e-07)"."""
    pooled = {ENDED: "the end of the reply", POOLED: "the rare tokens pooled"}
    token = pooled.get(test.token, f"token {test.token_shown}")
    state = "red" if test.adjusted_p <= alpha else "most significant"
    return (f"{state} at prompt {test.prompt}, position {test.position}: {token} in {test.speculative_share:.0%} of "
            f"draws with speculation, {test.reference_share:.0%} without (χ² {test.statistic:.1f}, {test.dof} df, "
            f"p {test.p_value:.2g}, Holm {test.adjusted_p:.2g}, {test.samples} draws per side)")


def _speedup_floor(metrics: Mapping) -> list[Limit]:
    """Speculation must pay: where the speedup over the same deployment without speculation was measured, it must
    exceed 1 (acceptance can stay flat while the speedup vanishes). A baseline's `speculative_speedup` spec adds a
    statistical gate against the recorded speedup."""
    if metrics.get("speculative_speedup") is None:
        return []
    return [Limit("speculative_speedup", ">=", SPEEDUP_FLOOR, "speculation must pay: faster than without it")]


def _collapse_floor(cell: CellResult, metrics: Mapping) -> list[Limit]:
    speculative = cell.speculative
    if not speculative or metrics.get("accept_length") is None:
        return []
    floor = (cell.suites.get("accept") or {}).get("min_accept_length")
    if floor is None:
        return [Limit("accept_length", ">=", COLLAPSE_FLOOR, "collapse floor")]
    return [Limit("accept_length", ">=", float(floor), "collapse floor (dspark_ci.suites.accept.min_accept_length)")]


def chance_floor(num_questions: float) -> float:
    """The smallest accuracy a guesser (one in four right) reaches at most CHANCE_FALSE_PASS of the time on
    ``num_questions`` questions, exact binomial. Repeats of a question do not count as more questions (a
    guesser's repeats are as random, but a broken model's are not), so the floor uses the question count."""
    return stats.chance_floor(int(num_questions), GPQA_CHANCE, CHANCE_FALSE_PASS)


def _chance_limits(cell: CellResult, metrics: Mapping) -> list[Limit]:
    """GPQA must beat guessing, with or without a baseline: a broken model that answers at random or not at
    all (0%) passes at most CHANCE_FALSE_PASS of the time; a weak model well above chance still passes it.
    A model that answers at chance by design (``gpqa.answers_at_chance``: random weights) is held to the guesser's
    band instead, with every reply's answer extracted: what is tested there is the path from prompt to score."""
    questions = metrics.get("gpqa_num_questions")
    if metrics.get("gpqa_accuracy") is None or not questions:
        return []
    if (cell.suites.get("gpqa") or {}).get("answers_at_chance"):
        return _at_chance(int(questions))
    floor = chance_floor(questions)
    guesser = stats.chance_pass_probability(floor, int(questions), GPQA_CHANCE)
    return [Limit("gpqa_accuracy", ">=", floor, f"above chance: a guesser reaches {floor:.1%} on {questions:.0f} "
                  f"questions {guesser:.2%} of the time (exact binomial)")]


def _at_chance(questions: int) -> list[Limit]:
    low, high = stats.chance_band(questions, GPQA_CHANCE, CHANCE_FALSE_PASS)
    band = (f"at chance (random weights): a guesser stays within {low:.1%}-{high:.1%} on {questions} questions "
            f"but {CHANCE_FALSE_PASS:.0%} of the time (exact binomial)")
    return [Limit("gpqa_accuracy", ">=", low, band), Limit("gpqa_accuracy", "<=", high, band),
            Limit("gpqa_no_answer", "<=", 0.0, "every reply's answer extracted (held to the answer format)")]


def _spec_limits(spec: MetricSpec, metrics: Mapping) -> list[Limit]:
    """(metric, op, threshold, basis, statistical spec) for each limit a baseline spec sets."""
    name, where = spec.metric, spec.where
    limits: list[Limit] = []
    reference = format_value(name, spec.value)
    statistical = set(_statistical_keys(spec))
    if spec.min is not None:
        limits.append(Limit(name, ">=", spec.min, f"min ({where})"))
    if spec.min_ratio is not None:
        ratio = spec.ratio("min_ratio")
        limits.append(Limit(name, ">=", spec.reference * ratio,
                            f"{reference} × {ratio:g}{_widened(spec, 'min_ratio')} ({where})",
                            (spec, "min_ratio") if "min_ratio" in statistical else None))
    if spec.max_drop_stderr is not None:
        limits.append(Limit(name, ">=", noise_floor(spec, metrics.get(PAIRED_STDERR_OF[name])),
                            f"{reference} − {spec.max_drop_stderr:g}·√(se_base² + se_now²) ({where})",
                            (spec, "max_drop_stderr")))
    if spec.max is not None:
        limits.append(Limit(name, "<=", spec.max, f"max ({where})"))
    if spec.max_ratio is not None:
        ratio = spec.ratio("max_ratio")
        limits.append(Limit(name, "<=", spec.reference * ratio,
                            f"{reference} × {ratio:g}{_widened(spec, 'max_ratio')} ({where})",
                            (spec, "max_ratio") if "max_ratio" in statistical else None))
    return limits + _never_inward_limits(spec)


def _statistic(spec_key: tuple[MetricSpec, str], evidence: Evidence, metrics: Mapping,
               levels: stats.Levels) -> stats.Verdict | None:
    """The statistical decision of one gate, or None when its metric was not measured (the gate then fails)."""
    spec, key = spec_key
    if key == "max_drop_stderr":
        return _paired_statistic(spec, evidence, metrics, levels)
    if key == NEVER_INWARD_KEY:
        return envelope_statistic(evidence.envelope, spec.reference, levels)
    values = evidence.values(spec.metric)
    if not values:
        return None
    better = LOWER if key == "max_ratio" else HIGHER
    tolerance = getattr(spec, key) - 1
    # noise None (a gate without it is not statistical) or 0 (identical runs): BootReference floors it
    reference = stats.BootReference(spec.reference, int(spec.runs or DEFAULT_RUNS), spec.noise or 0.0,
                                    spec.request_noise or 0.0, spec.drift)

    def compare(boots: Evidence) -> stats.Verdict:
        return stats.compare_boots(boots.values(spec.metric), reference, better, tolerance, levels,
                                   _detect(spec, tolerance), boots.request_errors(spec.metric))

    verdict = compare(evidence)
    if verdict.verdict == stats.PASSED or METRICS[spec.metric].group != "speed":
        return verdict
    return _without_starved_clients(verdict, evidence, spec.metric, compare)


def _without_starved_clients(verdict: stats.Verdict, evidence: Evidence, metric: str,
                             compare: Callable[[Evidence], stats.Verdict]) -> stats.Verdict:
    """A timing gate that did not pass, decided again on the boots whose client had the CPU. A client starved of
    CPU reads every timing worse (TTFT and TPOT longer, throughput lower), never better: its boots may show a pass,
    but anything else is for the other boots to show (set aside by the lag alone, whatever they read). Without
    such a boot a regression stays inconclusive, and the gate waits for one (another look)."""
    timed, saturated = evidence.timed_by_the_server()
    if not saturated:
        return verdict
    # Said with the verdict: a user who reads "1 boot(s)" after a run of twelve learns where the others went
    starved = f"timed by a client starved of CPU (event-loop lag p99 over {SATURATED_LOOP_LAG_MS:g} ms)"
    if timed.values(metric):
        decided = compare(timed)
        return replace(decided, test=f"{decided.test}; {len(saturated)} boot(s) set aside, {starved}")
    if verdict.verdict == stats.INCONCLUSIVE:
        return replace(verdict, test=f"{verdict.test}; every boot was {starved}")
    lags = ", ".join(f"{lag:.1f}" for lag in saturated)
    why = (f"{verdict.describe()}, but every boot was timed by a client starved of CPU (event-loop lag p99 {lags} "
           f"ms, over {SATURATED_LOOP_LAG_MS:g} ms), which reads every timing worse: the machine may have set them")
    return replace(verdict, verdict=stats.INCONCLUSIVE, low=verdict.effect, high=verdict.effect, test=why, samples=0)


def _detect(spec: MetricSpec, tolerance: float) -> float | None:
    """The spec's detection line, signed like ``tolerance`` (None: the default multiple of the tolerance)."""
    return None if spec.detect is None else math.copysign(spec.detect, tolerance)


# A figure gated paired over its units (``max_drop_stderr`` with a `per_question` record): what the unit is called
# and the metric counting them ("": the units the run measured).
PAIRED_UNITS = {"gpqa_accuracy": ("questions", "gpqa_num_questions"), "mc_accuracy": ("items", "mc_num_items"),
                "accept_length": ("requests", "")}
# Units named by their place, not by what they are: paired only when both sides have exactly the same places (a
# request that verified nothing is left out of the accept series and would shift every later one onto another
# prompt); otherwise the two means are compared.
POSITIONAL_UNITS = frozenset({"accept_length"})


def _paired_statistic(spec: MetricSpec, evidence: Evidence, metrics: Mapping,
                      levels: stats.Levels) -> stats.Verdict | None:
    """GPQA's and MC's accuracy, and accept length: paired over questions (items, requests) when both sides kept
    them; else the two figures (pooled over every boot that ran the suite, never only the last boot) and their
    standard errors.

    A baseline whose per-unit record is all 0 or 1 was recorded from a server that answers each unit the same way
    every time: a later boot repeats its answers and adds nothing, so the gate is planned as one look with its whole
    share of alpha (``Levels.single_look``), and its verdict is final (no more boots for it); so is accept length's,
    whose pairs are the last boot's requests."""
    tolerance = -spec.drop_tolerance
    better = METRICS[spec.metric].better
    unit, count = PAIRED_UNITS.get(spec.metric, ("samples", ""))
    units = evidence.paired_units(spec.metric)
    aligned = spec.metric not in POSITIONAL_UNITS or set(units) == set(spec.per_question or ())
    if spec.per_question and len(set(spec.per_question) & set(units)) > 1 and aligned:
        # Answers fixed per unit repeat on a later boot, and the accept series paired is the last boot's alone:
        # either way more boots inform nothing, so the gate is one look with its whole share of alpha, and final.
        once = spec.metric in POSITIONAL_UNITS or all(score in (0.0, 1.0) for score in spec.per_question.values())
        verdict = stats.compare_paired(units, spec.per_question, better, tolerance,
                                       levels.single_look() if once else levels, unit=unit,
                                       detect=_detect(spec, tolerance))
        return replace(verdict, final=once)
    value, se_now = metrics.get(spec.metric), metrics.get(PAIRED_STDERR_OF[spec.metric])
    if value is None:
        return None
    questions = int(metrics.get(count) or 0) if count else len(units)  # accept: the requests its series holds
    se_base = spec.reference_stderr
    return stats.compare_estimates(value, se_base if se_now is None else se_now, spec.reference, se_base, better,
                                   tolerance, levels, questions, f"{questions} {unit}", _detect(spec, tolerance))


# --- Where speculation pays: the boundary does not move inward (baseline key `never_inward`) ---
# A pass rules out a sweep point at or below the baseline's boundary whose speedup is this far below break-even.
ENVELOPE_DETECT = 0.05
# The tolerance: no loss at all below break-even (a speedup under 1 is red once shown). Negative zero, so the verdict
# reads it as a limit on the lower side (Verdict.in_indifference_zone compares signs).
ENVELOPE_TOLERANCE = -0.0


def _never_inward_limits(spec: MetricSpec) -> list[Limit]:
    if not spec.never_inward:
        return []
    return [Limit(spec.metric, ">=", spec.reference, f"speculation still pays at every sweep concurrency up to the "
                  f"baseline's boundary {spec.reference:g}, none shown below a speedup of 1 ({spec.where})",
                  (spec, NEVER_INWARD_KEY))]


def envelope_statistic(envelope: Envelope | None, boundary: float, levels: stats.Levels) -> stats.Verdict | None:
    """The boundary where speculation pays has not moved inward of ``boundary`` (the baseline's): at every sweep
    concurrency at or below it (the shortest input length, where speculation_boundary_concurrency is read) the
    speedup must not be shown below 1, nor the boundary's interval lie wholly inward of it.

    Each point's speedup (reference median TPOT / speculative) has its standard error from the bootstrap over both
    servers' requests; on the log scale, Student t (``_speedup_interval``). Red when any point's interval at
    1 − alpha/m lies below 1, or the boundary computed from the points' upper ends falls inward of ``boundary``
    (Bonferroni over the m = points + 1 tests: the gate's alpha holds for the lot); green when every point's lower
    end at 1 − beta is above 1 − ENVELOPE_DETECT; inconclusive otherwise (an interval that straddles break-even is
    not a coin flip).
    None when no sweep was measured (the gate then fails as not measured)."""
    length = envelope.shortest_input_len if envelope is not None else None
    if envelope is None or length is None:
        return None
    row = envelope.row(length)
    inside = [p for p in row if p.concurrency <= boundary]
    if not inside:
        return stats.no_statistic(f"no sweep point at input length {length} at or below the baseline's boundary "
                                  f"{boundary:g}", 0.0, ENVELOPE_TOLERANCE, stats.RELATIVE, levels, -ENVELOPE_DETECT)
    point_levels = replace(levels, alpha=levels.alpha / (len(inside) + 1))
    ends = {p.concurrency: _speedup_interval(p, point_levels) for p in row}
    upper = crossing([(c, 1 + high) for c, (_, _, high) in ends.items()])
    lower = crossing([(c, 1 + low) for c, (_, low, _) in ends.items()])
    verdicts = [(p, stats.decide(*ends[p.concurrency], ENVELOPE_TOLERANCE, -ENVELOPE_DETECT,
                                              stats.HIGHER)) for p in inside]
    inward = upper[0] is not None and not upper[1] and upper[0] < boundary
    if inward or any(v == stats.REGRESSED for _, v in verdicts):
        verdict = stats.REGRESSED
    else:
        verdict = stats.PASSED if all(v == stats.PASSED for _, v in verdicts) else stats.INCONCLUSIVE
    worst = min(inside, key=lambda p: ends[p.concurrency][2 if verdict == stats.REGRESSED else 1])
    effect, low, high = ends[worst.concurrency]
    test = (f"speedup at each of {len(inside)} sweep concurrencies <= {boundary:g} (input {length} tokens; worst at "
            f"{worst.concurrency}: {1 + effect:.2f} [{1 + low:.2f}, {1 + high:.2f}]) against 1, t on log speedup (√n "
            f"degrees of freedom) with bootstrap errors over both servers' requests, Bonferroni over "
            f"{len(inside) + 1} tests; boundary {_boundary_text(lower)}-{_boundary_text(upper)} vs the baseline's "
            f"{boundary:g}")
    return stats.Verdict(verdict, effect, low, high, ENVELOPE_TOLERANCE, stats.RELATIVE, test, point_levels.alpha,
                         levels.beta,
                         sum(p.requests for p in inside), -ENVELOPE_DETECT)


def _speedup_interval(point: EnvelopePoint, levels: stats.Levels) -> tuple[float, float, float]:
    """(speedup − 1, its lower end at 1 − beta, its upper end at 1 − alpha), from the point's bootstrap error; an
    unknown error (one request) is an unbounded interval: that point cannot decide.

    Student t with √n degrees of freedom (n: the point's requests), not normal: a bootstrap (or any) estimate of a
    median's error is itself uncertain, with a relative error of order n^(-1/4) (Hall and Martin, 1988), and a
    normal quantile on it is red several times too often at a family's small alpha (bench/gate_power.py
    --envelope: 1.5 % red at break-even against the 0.015 % planned; measured there)."""
    speedup = point.speedup or 0.0
    if speedup <= 0:
        return -1.0, -1.0, -1.0
    if not point.speedup_stderr:
        return speedup - 1, -1.0, math.inf
    student, se = stats.scipy_stats().t, point.speedup_stderr / speedup
    df = math.sqrt(max(point.requests, 1))
    low = math.exp(math.log(speedup) - student.isf(levels.beta, df) * se)
    high = math.exp(math.log(speedup) + student.isf(levels.alpha, df) * se)
    return speedup - 1, low - 1, high - 1


def _boundary_text(found: tuple[float | None, bool]) -> str:
    concurrency, censored = found
    return "?" if concurrency is None else f"{concurrency:.0f}{'+' if censored else ''}"


def _widened(spec: MetricSpec, key: str) -> str:
    """How the ratio came about when the baseline measured noise: " (the larger of 1.025 and 3 × 0.5% run-to-run
    noise)"."""
    if not spec.noise:
        return ""
    return f" (the larger of {getattr(spec, key):g} and {NOISE_RUN_SDS:g} × {spec.noise:.1%} run-to-run noise)"


def noise_floor(spec: MetricSpec, stderr_now: float | None) -> float:
    """baseline − k·sqrt(se_base² + se_now²): fail only on a drop sampling error does not explain.

    Without a measured stderr the new run is assumed as noisy as the baseline (same question count).
    """
    if spec.max_drop_stderr is None:
        raise ValueError(f"{spec.where}: {spec.metric}: no max_drop_stderr to apply")
    se_base = spec.reference_stderr
    se_now = se_base if stderr_now is None else stderr_now
    return spec.reference - spec.max_drop_stderr * math.sqrt(se_base ** 2 + se_now ** 2)


_OPS = {">=": lambda value, threshold: value >= threshold, "<=": lambda value, threshold: value <= threshold}


def _gate(metric: str, op: str, threshold: float, value, statistic: stats.Verdict | None) -> GateResult:
    if statistic is not None:
        return GateResult(metric, op, round(threshold, GATE_PRECISION), value, statistic.verdict == stats.PASSED,
                          statistic)
    passed = value is not None and _OPS[op](value, threshold)
    return GateResult(metric, op, round(threshold, GATE_PRECISION), value, passed)


# `dspark-ci run` defaults, for results files whose options do not say (kept equal to dspark_ci.evidence's by
# tests/test_reports_gates.py: reports sit below dspark_ci and cannot import it)
RUN_MAX_BOOTS, RUN_RETRIES = 12, 0


def regate(results: RunResults, baseline: Baseline) -> RunResults:
    """A copy of ``results`` with every serving cell's gates evaluated against ``baseline``: the same decision as
    the run's. The levels are the run's own plan (its ``--max-boots`` and ``--retries`` from the options it
    recorded, split over the gates ``baseline`` sets), each cell judged at the look its recorded boots make, and
    only on the suites that ran (a gate on a suite the run did not select is not applied, as in the run).

    Status follows the new gates, except that a cell which also failed for another reason (a suite
    test failed, an expected rejection did not happen) stays failed.
    """
    max_boots, retries = recorded_plan(results.run_options)
    levels = family_levels(results.cells, baseline, max_boots, retries)
    cells = []
    for cell in results.cells:
        if cell.status in (Status.PASSED, Status.FAILED, Status.INCONCLUSIVE):
            ran = suites_ran(cell)
            gates = tuple(g for g in evaluate(cell, cell.metrics, baseline, levels)
                          if ran is None or suite_of(g.metric) in ran)
            status = Status.FAILED if _failed_apart_from_gates(cell) else status_of(gates)
            cell = replace(cell, gates=gates, status=status, exit_code=None)
        cells.append(cell)
    return replace(results, cells=tuple(cells))


def recorded_plan(run_options) -> tuple[int, int]:
    """(max boots, retries) a run was given, read from the options it recorded (the run's defaults otherwise)."""
    found = {"--max-boots": RUN_MAX_BOOTS, "--retries": RUN_RETRIES}
    options = list(run_options)
    for index, option in enumerate(options):
        name, _, inline = option.partition("=")
        if name in found:
            text = inline or (options[index + 1] if index + 1 < len(options) else "")
            if text.isdigit():
                found[name] = int(text)
    return found["--max-boots"], found["--retries"]


def suites_ran(cell: CellResult) -> set[str] | None:
    """The suites a cell ran, from its recorded suite tests (suites/test_NAME.py::...) and gates; None when the
    file kept no tests (all gates apply)."""
    if cell.tests is None:
        return None
    ran = {test.suite for test in cell.tests}
    return ran | {suite for g in cell.gates if (suite := suite_of(g.metric)) is not None}


def status_of(gates) -> Status:
    """A measured cell's status from its gates: failed when one regressed (or was not measured), inconclusive when
    none did but one could not decide, passed when every gate passed."""
    verdicts = {gate.verdict for gate in gates}
    if stats.REGRESSED in verdicts:
        return Status.FAILED
    return Status.INCONCLUSIVE if stats.INCONCLUSIVE in verdicts else Status.PASSED


def _failed_apart_from_gates(cell: CellResult) -> bool:
    if cell.status is not Status.FAILED:
        return False
    if cell.expect.rejects:
        return True  # it served when it should have been rejected (or the other way round)
    if cell.tests is not None:  # the suites' own test outcomes, as the run records them
        return bool(cell.failed_tests)
    return bool(cell.error)


def describe_gate(gate: GateResult) -> str:
    """"accept_length = 1.00, needs >= 1.20" / "ttft_ms_median not measured (gate <= 51.2)" / a statistical
    gate: "tpot_ms_median = 7.16: +5.0% [+3.9%, +6.3%] vs tolerance +2.5%: regressed (t on log values, ...)"."""
    threshold = format_value(gate.metric, gate.threshold)
    if gate.value is None:
        return f"{gate.metric} not measured (gate {gate.op} {threshold})"
    value = format_value(gate.metric, gate.value)
    if gate.statistic is not None:
        return f"{gate.metric} = {value}: {gate.statistic.describe()}"
    return f"{gate.metric} = {value}, needs {gate.op} {threshold}"


def levels_line(results: RunResults) -> str | None:
    """The run's family-wise levels as the gates used them, for the report ("" when no gate was statistical)."""
    statistical = [gate.statistic for cell in results.cells for gate in cell.gates if gate.statistic is not None]
    if not statistical:
        return None
    alpha, beta = max(s.alpha for s in statistical), max(s.beta for s in statistical)
    return (f"Statistical gates: a run is red by luck at most {stats.RUN_FALSE_RED:.0%} of the time (family-wise, "
            f"split over its statistical gates and planned looks: α = {alpha:.2g} per gate and look at most); red "
            f"needs a real change (the interval past no change) beyond the tolerance, green the detection line ruled "
            f"out (a regression that large passes at most β = {beta:.2g} per look). Inconclusive is neither green "
            "nor red.")
