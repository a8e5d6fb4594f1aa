"""Detection and false-alarm rates of the gates, measured: planted regressions through the real gate code.

    python bench/gate_power.py [--nights 200] [--seed 1] [--repeats 3] [--jobs 3] [--e2e N]

Each simulated night runs the 12 serving cells of the nightly (21 cells, 9 of them expected rejections, which are
never gated) against a baseline recorded from ``BASELINE_RUNS`` good boots, under the stated noise model:

- speed (median TPOT, output throughput): 2 % run-to-run noise, of which ``SPEED_BOOT`` per boot (the
  simulator's ``DSPARK_SIM_STEP_JITTER_BOOT``) and ``SPEED_REQUEST`` from one boot's own requests (each boot
  reports it as its per-request standard error, as the speed suite does);
- acceptance (accept length and rate): ``ACCEPT_BOOT`` per boot (``DSPARK_SIM_ACCEPT_DRIFT_BOOT``) and
  ``ACCEPT_REQUEST`` per request;
- GPQA: 198 questions, 8 repeats per boot (the release matrix), per-question probabilities from the simulator's
  own model (``dspark_ci.sglang_sim.noise.question_probability``, concentration ``GPQA_CONCENTRATION``, accuracy 70 %); a drop
  of d points lowers every question's probability through the same quantile (the same questions, harder).

Planted: 2, 3, 5, 10 % worse on TPOT, throughput, accept length or accept rate, and 3, 5, 10-point GPQA drops,
each in a cell-night of its own (one metric at a time, so a metric's detection rate is its own); 0 is the clean
nights, every serving cell clean, which also give the false-red rate per nightly. Every cell-night goes through
``dspark_ci.reports.gates.evaluate`` (the baseline written as a real baseline file and read with ``load_baseline``, GPQA paired
over questions) and ``status_of``; when a cell is inconclusive it takes another look with more boots (``LOOKS``: 1, 2,
4, 8 boots, each boot with its GPQA repeats), at levels that split the nightly's 1 % false-red rate over its 60
statistical gates and the 4 planned looks. Today's gates (the same baseline, one boot, value against the gate's
``threshold``: ratio widened to 3 × noise, GPQA value − 2·√(s² + s_now²)) are judged on the first boot of the same
nights.

Printed per metric and planted level: red (regressed), caught (not green: red or inconclusive), green, for the
statistical gates, and red for today's; per nightly: the share of clean nights that were red anywhere; the mean
boots (and GPQA repeats) spent per cell against today's one. ``--shipped`` also measures the shipped baselines and
their cells as they are (``bench/gate_power_shipped.py``). ``--e2e N`` also runs N nights end to end on the
simulator (``bench/gate_power_e2e.py``: ``dspark-ci run`` with the noise knobs set; the smoke matrix clean, accept
length −5 %, TPOT +5 %, and a 198-question GPQA cell clean and −5 points) and reports every gate. Separate modes,
each its own section of BENCHMARKS.md: ``--acceptance`` (per-position acceptance; sampled losslessness is
``bench/sampled_lossless.py``),
``--envelope`` (where speculation pays: the boundary does not move inward), ``--categories`` (acceptance per
category). ``--smoke``: seconds, for CI (every mode, a few nights each).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dspark_ci.ground import stats  # noqa: E402
from dspark_ci.ground.measurements import BootMetrics, GpqaSummary  # noqa: E402
from dspark_ci.ground.records import CellResult, Status  # noqa: E402
from dspark_ci.ground.sglang.settings import CellConfig  # noqa: E402
from dspark_ci.reports.baseline_file import load_baseline  # noqa: E402
from dspark_ci.reports.baseline_proposal import RECORDED_GATES  # noqa: E402
from dspark_ci.reports.gates import _OPS, evaluate, family_levels, status_of  # noqa: E402
from dspark_ci.sglang_sim.noise import question_probability  # noqa: E402

from dspark_ci import evidence  # noqa: E402

SERVING_CELLS = 12  # of the nightly's 21 (the others are expected rejections)
BASELINE_RUNS = 30  # `baseline record` from 30 good runs (e.g. a month of green nights); --baseline-runs
MAX_BOOTS = evidence.MAX_BOOTS  # `run --max-boots` by default (12: looks after 1, 2, 4, 8, 12 boots); --max-boots
SPEED_BOOT, SPEED_REQUEST = 0.018, 0.0087  # √(1.8² + 0.87²) = 2.0 % run-to-run
ACCEPT_BOOT, ACCEPT_REQUEST = 0.008, 0.006  # 1 % run-to-run
GPQA_QUESTIONS, GPQA_REPEATS, GPQA_ACCURACY, GPQA_CONCENTRATION = 198, 8, 0.70, 0.5
# metric: (baseline value, better, noise per boot, per request); gates as `baseline record` writes them
METRICS = {
    "tpot_ms_median": (6.8, stats.LOWER, SPEED_BOOT, SPEED_REQUEST),
    "output_throughput_tok_s": (530.0, stats.HIGHER, SPEED_BOOT, SPEED_REQUEST),
    "accept_length": (3.25, stats.HIGHER, ACCEPT_BOOT, ACCEPT_REQUEST),
    "accept_rate": (0.316, stats.HIGHER, ACCEPT_BOOT, ACCEPT_REQUEST),
}
STDERR_NAME = {"tpot_ms_median": "tpot_ms_median_stderr", "output_throughput_tok_s": "output_throughput_tok_s_stderr",
               "accept_length": "accept_length_stderr", "accept_rate": "accept_rate_stderr"}
PLANTED = (0.0, 0.02, 0.03, 0.05, 0.10)
SPEED_METRICS = ("tpot_ms_median", "output_throughput_tok_s")
E2E_DEFAULT = "clean,accept_length -5%,tpot +5%,gpqa198 clean,gpqa198 -5pt"  # bench/gate_power_e2e.py
# Design candidate (--node-share ρ): a control variate. The share ρ of the per-boot speed variance that is node-level
# (clocks, thermals, neighbours) is shared by the non-speculative reference's boot on the same node; the gate reads
# spec / reference × the reference's baseline, whose per-boot noise is σ_b·√(2(1 − ρ)) and per-request σ_r·√2. The
# reference boot is not counted in the boots per cell (one per node and night, shared by that node's cells).
NODE_SHARE = 0.0
# Design candidate (--accept-detect D): the acceptance gates' detection line at D instead of twice their 2 %
# tolerance. The benchmark's target is ≥ 95 % detection of a 5 % regression, which a 4 % line over-serves at the price
# of boots: with 1 % per-boot noise one boot rules out 4 % only when its effect is under about 1.7 %.
ACCEPT_DETECT: float | None = None
GPQA_DROPS = (0.0, 0.03, 0.05, 0.10)
CELL = CellResult(id="cell", config=CellConfig(speculative_algorithm="DSPARK"), expect={"outcome": "serve"})


@dataclass
class Tally:
    """Counts of one (metric, planted level)."""

    red: int = 0
    caught: int = 0
    green: int = 0
    today_red: int = 0
    cells: int = 0

    def add(self, verdict: str, today_failed: bool) -> None:
        self.cells += 1
        self.red += verdict == stats.REGRESSED
        self.caught += verdict != stats.PASSED
        self.green += verdict == stats.PASSED
        self.today_red += today_failed


@dataclass
class Totals:
    tallies: dict = field(default_factory=dict)
    clean_nights: int = 0
    clean_red_nights: int = 0
    clean_today_red_nights: int = 0
    boots: list = field(default_factory=list)


class Model:
    """The true state of one cell: per-question difficulty (fixed per cell) and the planted regressions."""

    def __init__(self, rng: random.Random):
        self.quantiles = [rng.random() for _ in range(GPQA_QUESTIONS)]
        self.draws = numpy.random.default_rng(rng.getrandbits(64))
        self._probabilities: dict[float, numpy.ndarray] = {}

    def probabilities(self, drop: float) -> numpy.ndarray:
        """Each question's probability of a right answer, by the simulator's own per-question model."""
        if drop not in self._probabilities:
            self._probabilities[drop] = numpy.array([question_probability(q, GPQA_ACCURACY - drop, GPQA_CONCENTRATION)
                                                     for q in self.quantiles])
        return self._probabilities[drop]

    def boot(self, rng: random.Random, planted: dict, gpqa: bool = True) -> dict:
        """One boot's metrics (with their per-request standard errors) and GPQA per-question [right, asked];
        ``planted``: metric -> how much worse (a fraction; GPQA: points)."""
        metrics: dict = {}
        drop = planted.get("gpqa_accuracy", 0.0)
        for name, (value, better, per_boot, per_request) in METRICS.items():
            if NODE_SHARE and name in SPEED_METRICS:  # the same-node reference boot's ratio: node noise cancels
                per_boot, per_request = per_boot * math.sqrt(2 * (1 - NODE_SHARE)), per_request * math.sqrt(2)
            worse = 1 + planted.get(name, 0.0) if better == stats.LOWER else 1 - planted.get(name, 0.0)
            metrics[name] = value * worse * math.exp(rng.gauss(0, per_boot) + rng.gauss(0, per_request))
            metrics[STDERR_NAME[name]] = metrics[name] * per_request
        if not gpqa:  # a later boot re-runs only the suites whose gates are undecided (dspark_ci/evidence.py)
            return {"metrics": metrics, "questions": None}
        rights = self.draws.binomial(GPQA_REPEATS, self.probabilities(drop))
        means = rights / GPQA_REPEATS
        metrics.update(gpqa_accuracy=float(means.mean()), gpqa_num_questions=GPQA_QUESTIONS, gpqa_repeats=GPQA_REPEATS,
                       gpqa_stderr=float(means.std(ddof=1) / math.sqrt(GPQA_QUESTIONS)))
        return {"metrics": metrics, "questions": rights}


def pooled(boots: list[dict]) -> CellResult:
    """The cell as the run records it after these boots: each boot's metrics, pooled figures, GPQA questions."""
    asked = [b["questions"] for b in boots if b["questions"] is not None]
    rights = numpy.sum(asked, axis=0)
    questions = {f"q{index}": (int(right), GPQA_REPEATS * len(asked)) for index, right in enumerate(rights)}
    metrics = {name: statistics.fmean(b["metrics"][name] for b in boots if name in b["metrics"])
               for name in boots[0]["metrics"]}
    metrics["gpqa_accuracy"] = float(rights.sum()) / (GPQA_QUESTIONS * GPQA_REPEATS * len(asked))
    return replace(CELL, metrics=metrics,
                   boots=tuple(BootMetrics(b["metrics"]) for b in boots) if len(boots) > 1 else (),
                   gpqa=GpqaSummary(per_question=questions))


def _gate(metric: str) -> str:
    gate = dict(RECORDED_GATES[metric])
    if ACCEPT_DETECT is not None and metric in ("accept_length", "accept_rate"):
        gate["detect"] = ACCEPT_DETECT
    return ", ".join(f"{key}: {value:g}" for key, value in gate.items())


def record_baseline(rng: random.Random, model: Model, directory: Path, runs: int):
    """A baseline file as `dspark-ci baseline record` writes it from ``runs`` good boots."""
    boots = [model.boot(rng, {}) for _ in range(runs)]
    lines = ["schema: 1", "cells:", "  cell:"]
    for name in METRICS:
        values = [b["metrics"][name] for b in boots]
        median = statistics.median(values)
        request = statistics.fmean(b["metrics"][STDERR_NAME[name]] / b["metrics"][name] for b in boots)
        lines.append(f"    {name}: {{value: {median:.6g}, {_gate(name)}, noise: {statistics.stdev(values) / median:.6g}, "
                     f"runs: {runs}, request_noise: {request:.6g}}}")
    questions = pooled(boots).gpqa.per_question
    (directory / "q.json").write_text(json.dumps({q: r / n for q, (r, n) in questions.items()}))
    accuracy = statistics.fmean(b["metrics"]["gpqa_accuracy"] for b in boots)
    stderr = statistics.fmean(b["metrics"]["gpqa_stderr"] for b in boots)
    lines.append(f"    gpqa_accuracy: {{value: {accuracy:.6g}, stderr: {stderr:.6g}, {_gate('gpqa_accuracy')}, "
                 "per_question: q.json}")
    path = directory / "baseline.yaml"
    path.write_text("\n".join(lines) + "\n")
    return load_baseline(path)


def today_failed(cell: CellResult, baseline) -> dict[str, bool]:
    """Today's gates on one boot: the value against the gate's threshold (today's line), per metric."""
    gates = evaluate(cell, cell.metrics, baseline, stats.Levels(alpha=0.01))
    failed: dict[str, bool] = {}
    for gate in gates:  # the baseline's gates (the statistical ones carry today's line as their threshold)
        if gate.statistic is not None:
            failed[gate.metric] = not _OPS[gate.op](gate.value, gate.threshold)
    return failed


def cell_night(rng: random.Random, model: Model, baseline, levels, planted: dict, max_boots: int):
    """(statistical verdict per metric, today's failure per metric, cell status, boots spent, GPQA boots spent):
    looks after 1, 2, 4, 8 boots while a gate is undecided, GPQA measured again only while its gate is."""
    boots = [model.boot(rng, planted)]
    today = today_failed(pooled(boots), baseline)
    verdicts: dict[str, str] = {}
    for wanted in stats.look_boots(max_boots):
        gpqa_undecided = verdicts.get("gpqa_accuracy", stats.INCONCLUSIVE) == stats.INCONCLUSIVE
        while len(boots) < wanted:
            boots.append(model.boot(rng, planted, gpqa=gpqa_undecided))
        cell = pooled(boots)
        gates = [g for g in evaluate(cell, cell.metrics, baseline, levels) if g.statistic is not None]
        verdicts = {g.metric: g.verdict for g in gates}
        status = status_of(gates)
        if status is not Status.INCONCLUSIVE:
            break
    return verdicts, today, status, len(boots), sum(b["questions"] is not None for b in boots)


def scenarios():
    """(metric regressed or None, planted fraction or GPQA points): one clean scenario, then one per metric and
    level."""
    yield None, 0.0
    for metric in METRICS:
        for planted in PLANTED[1:]:
            yield metric, planted
    for drop in GPQA_DROPS[1:]:
        yield "gpqa_accuracy", drop


def run(nights: int, seed: int, baseline_runs: int = BASELINE_RUNS, max_boots: int = MAX_BOOTS) -> Totals:
    """Clean nights: every serving cell clean (the nightly's false-red rate). Planted: one cell-night per night with
    one metric regressed (its detection rate), each through the sequential looks."""
    rng = random.Random(seed)
    totals = Totals()
    models = [Model(rng) for _ in range(SERVING_CELLS)]  # the same cells (and GPQA questions) every night
    with tempfile.TemporaryDirectory() as tmp:
        for regressed, level in scenarios():
            for _ in range(nights):
                cells = SERVING_CELLS if regressed is None else 1
                red_night = today_red_night = False
                for model in models[:cells]:
                    baseline = record_baseline(rng, model, Path(tmp), baseline_runs)
                    levels = family_levels([CELL] * SERVING_CELLS, baseline, max_boots=max_boots)
                    planted = {regressed: level} if regressed else {}
                    verdicts, today, status, boots, gpqa_boots = cell_night(rng, model, baseline, levels, planted,
                                                                            max_boots)
                    totals.boots.append((regressed, level, boots, gpqa_boots))
                    for metric, verdict in verdicts.items():
                        if regressed is None or metric == regressed:
                            tally = totals.tallies.setdefault((metric, level), Tally())
                            tally.add(verdict, today.get(metric, False))
                    red_night |= status is Status.FAILED
                    today_red_night |= any(today.values())
                if regressed is None:
                    totals.clean_nights += 1
                    totals.clean_red_nights += red_night
                    totals.clean_today_red_nights += today_red_night
    return totals


def figures(totals: Totals) -> dict[str, dict[str, float]]:
    """Every printed figure of one repeat: row -> column -> value."""
    rows: dict[str, dict[str, float]] = {}
    for (metric, level), tally in sorted(totals.tallies.items()):
        unit = f"-{level * 100:.0f} pt" if metric == "gpqa_accuracy" else f"{level:.0%} worse"
        rows[f"{metric} {unit}"] = {"red": tally.red / tally.cells, "caught": tally.caught / tally.cells,
                                    "green": tally.green / tally.cells, "today red": tally.today_red / tally.cells}
    nights = max(1, totals.clean_nights)
    rows["nightly (12 cells), clean: red anywhere"] = {"red": totals.clean_red_nights / nights,
                                                       "today red": totals.clean_today_red_nights / nights}
    for regressed, level in scenarios():
        spent = [(b, g) for r, lv, b, g in totals.boots if (r, lv) == (regressed, level)]
        what = ("clean" if regressed is None else f"{regressed} -{level * 100:.0f} pt" if regressed == "gpqa_accuracy"
                else f"{regressed} {level:.0%} worse")
        rows[f"samples, {what}"] = {"boots": statistics.fmean(b for b, _ in spent),
                                    "GPQA repeats": statistics.fmean(g * GPQA_REPEATS for _, g in spent)}
    return rows


def figures_of_seed(nights: int, seed: int, baseline_runs: int, max_boots: int) -> dict[str, dict[str, float]]:
    return figures(run(nights, seed, baseline_runs, max_boots))


def report(repeats: list[dict[str, dict[str, float]]], nights: int, baseline_runs: int, max_boots: int,
           seconds: float) -> str:
    """One line per figure: the value (one repeat) or min / median / max over the repeats."""
    lines = [f"{len(repeats)} repeat(s) of {nights} nights per scenario ({seconds:.0f} s): clean nights of "
             f"{SERVING_CELLS} serving cells, one cell-night per night for each planted regression, baselines from "
             f"{baseline_runs} boots; statistical gates "
             f"at {stats.Levels.family(SERVING_CELLS * 5, max_boots=max_boots).describe()}; today's gates (one boot) in "
             f"the last column. Rates: red = regressed, caught = not passed (regressed or inconclusive), green = "
             f"passed. Samples: per cell (today's: 1 boot, {GPQA_REPEATS} GPQA repeats).",
             "" if len(repeats) == 1 else "each figure: min / median / max over the repeats"]
    for row in repeats[0]:
        cells = []
        for column in repeats[0][row]:
            values = sorted(r[row][column] for r in repeats)
            shown = [f"{v:.2f}" if row.startswith("samples") else f"{v:.1%}" for v in values]
            text = shown[0] if len(shown) == 1 else f"{shown[0]} / {shown[len(shown) // 2]} / {shown[-1]}"
            cells.append(f"{column} {text}")
        lines.append(f"{row:48} " + " | ".join(cells))
    return "\n".join(line for line in lines if line)


# --- Acceptance gates (a separate mode: `--acceptance`): per-position acceptance ----------------------------------
# (Sampled losslessness, tested per generated position, has a bench of its own: bench/sampled_lossless.py.)
# Per position: the smoke accept suite (40 requests of ~85 verify steps, DSpark gamma 7, alpha 0.7), gated against a
# baseline of BASELINE_RUNS boots with min_ratio 0.9 per position (accept_length 0.98); planted position_regression=3.
POSITION_REQUESTS, POSITION_STEPS, POSITION_GAMMA, POSITION_ALPHA = 40, 85, 7, 0.7


def _position_boot(rng: random.Random, alphas: tuple[float, ...]) -> dict:
    """One boot's accept_length and accept_rate_pos{k} (with per-request stderrs), drawn as the simulator draws."""
    from dspark_ci.sglang_sim.speculation import draw_accepted

    requests = [[draw_accepted(rng, alphas, POSITION_GAMMA) for _ in range(POSITION_STEPS)]
                for _ in range(POSITION_REQUESTS)]
    steps = POSITION_REQUESTS * POSITION_STEPS
    metrics = {"accept_length": sum(sum(r) + len(r) for r in requests) / steps}
    for k in range(1, POSITION_GAMMA + 1):
        per_request = [sum(c >= k for c in r) / len(r) for r in requests]
        metrics[f"accept_rate_pos{k}"] = statistics.fmean(per_request)
        metrics[f"accept_rate_pos{k}_stderr"] = statistics.stdev(per_request) / math.sqrt(len(per_request))
    metrics["accept_length_stderr"] = statistics.stdev(
        [(sum(r) + len(r)) / len(r) for r in requests]) / math.sqrt(len(requests))
    return metrics


def position_baseline(rng: random.Random, directory: Path) -> Path:
    from dspark_ci.sglang_sim.speculation import AcceptModel

    boots = [_position_boot(rng, AcceptModel(POSITION_ALPHA, max_accept=POSITION_GAMMA).alphas())
             for _ in range(BASELINE_RUNS)]
    lines = ["schema: 1", "cells:", "  c:"]
    for name, ratio in [("accept_length", 0.98)] + [(f"accept_rate_pos{k}", 0.9) for k in range(1, POSITION_GAMMA + 1)]:
        values = [b[name] for b in boots]
        mean = statistics.fmean(values)
        lines.append(f"    {name}: {{value: {mean:.6g}, min_ratio: {ratio}, noise: {statistics.stdev(values) / mean:.6g},"
                     f" runs: {len(values)}, request_noise: {boots[0][name + '_stderr'] / mean:.6g}}}")
    path = directory / "positions.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def position_night(rng: random.Random, baseline, planted: bool) -> tuple[str, str]:
    """(the cell's status, the accept_length gate's verdict) for one boot, with or without position_regression=3."""
    from dspark_ci.sglang_sim.speculation import AcceptModel

    alphas = AcceptModel(POSITION_ALPHA, late_from=3 if planted else None, max_accept=POSITION_GAMMA).alphas()
    metrics = _position_boot(rng, alphas)
    cell = CellResult(id="c", config=CellConfig(speculative_algorithm="DSPARK"), expect={}, metrics=metrics)
    gates = evaluate(cell, metrics, baseline, family_levels([cell], baseline))
    mean_gate = next(g.verdict for g in gates if g.metric == "accept_length")
    return status_of(gates).value, mean_gate


def acceptance_power(nights: int, seed: int) -> str:
    rng = random.Random(seed)
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        baseline = load_baseline(position_baseline(rng, Path(tmp)))
        clean_nights = [position_night(rng, baseline, False) for _ in range(nights)]
        planted_nights = [position_night(rng, baseline, True) for _ in range(nights)]
    lines.append(f"Per-position gates ({POSITION_REQUESTS} requests × {POSITION_STEPS} steps, gamma {POSITION_GAMMA}, "
                 f"{nights} nights; baseline {BASELINE_RUNS} boots):")
    red = lambda nights_: sum(status == Status.FAILED.value for status, _ in nights_) / len(nights_)  # noqa: E731
    lines.append(f"  position_regression=3: cell red {red(planted_nights):.1%}; its accept_length gate regressed "
                 f"{sum(m == stats.REGRESSED for _, m in planted_nights) / nights:.1%}")
    lines.append(f"  clean: cell red {red(clean_nights):.1%}")
    return "\n".join(lines)


# --- Where speculation pays (a separate mode: `--envelope`): the boundary does not move inward ---------------------
# The smoke matrix's sweep at one input length: grid ENVELOPE_GRID, max(c, 4) requests per point on each server, each
# SWEEP_OUTPUT tokens. A request's TPOT is (verify steps × a step's cost) / (tokens − 1) with its steps drawn as the
# simulator draws acceptance (alpha 0.7, gamma 7) and the simulator's per-request step jitter; a verify step costs
# 1 + ENVELOPE_COST × shift per running request past 8 (dspark_ci.sglang_sim.engine._verify_cost, every stream open), the
# reference's step 1. Scenario -> (cost per stream past 8, where the true speedup falls to 1).
ENVELOPE_GRID, SWEEP_OUTPUT, SWEEP_MIN_REQUESTS, STEP_JITTER_REQUEST = (1, 8, 32, 128), 32, 4, 0.05
ENVELOPE_COST, ENVELOPE_BASELINE = 0.01, 128
ENVELOPE_GATES = 13  # the smoke cell's statistical gates with this one: the family its alpha is split over


def _break_even_cost(concurrency: float, speedup: float = 1.0) -> float:
    """The cost per stream past 8 at which the median speedup is ``speedup`` at ``concurrency``: the medians of both
    servers' per-request TPOTs per unit step cost, from a large draw (acceptance varies per request, so this is not
    the mean accept length's cost)."""
    rng = random.Random(0)
    unit = statistics.median(_sweep_tpots(rng, 40000, 0.0))
    reference = statistics.median(_sweep_tpots(rng, 40000, None))
    return (reference / (unit * speedup) - 1) / (concurrency - 8)


def _sweep_tpots(rng: random.Random, concurrency: int, cost: float | None) -> list[float]:
    """Per-request TPOTs at one point; ``cost`` None: the reference without speculation."""
    from dspark_ci.sglang_sim.speculation import AcceptModel, draw_accepted

    alphas = AcceptModel(POSITION_ALPHA, max_accept=POSITION_GAMMA).alphas()
    tpots = []
    for _ in range(max(concurrency, SWEEP_MIN_REQUESTS)):
        steps, tokens = 0, 1  # the prefill's token, then verify steps
        while tokens < SWEEP_OUTPUT:
            tokens += 1 if cost is None else draw_accepted(rng, alphas, POSITION_GAMMA) + 1
            steps += 1
        step = 1.0 if cost is None else 1 + max(0, concurrency - 8) * cost
        tpots.append(step * steps / (min(tokens, SWEEP_OUTPUT) - 1) * math.exp(rng.gauss(0, STEP_JITTER_REQUEST)))
    return tpots


ENVELOPE_SCENARIOS = {
    "clean (pays at 128: speedup 1.4)": ENVELOPE_COST,
    "clean at the edge (speedup 1.0 at 128)": _break_even_cost(128),
    "at the detection line (speedup 0.95 at 128)": _break_even_cost(128, 0.95),
    "shift: pays up to 120": _break_even_cost(120),
    "shift: pays up to 100": _break_even_cost(100),
    "shift: pays up to 64": _break_even_cost(64),
    "shift: pays up to 32 (envelope_shift=9)": ENVELOPE_COST * 9,
}


def envelope_night(rng: random.Random, cost: float, baseline) -> str:
    """One night's sweep through dspark_ci.reports.gates.evaluate: the never_inward gate's verdict."""
    from dspark_ci.ground.measurements import Envelope, EnvelopeBoundary, EnvelopePoint
    from dspark_ci.suites.envelope import boundary, speedup_stderr

    points = []
    for concurrency in ENVELOPE_GRID:
        ours, theirs = _sweep_tpots(rng, concurrency, cost), _sweep_tpots(rng, concurrency, None)
        points.append(EnvelopePoint(concurrency, 256, len(ours), statistics.median(ours), statistics.median(theirs),
                                    statistics.median(theirs) / statistics.median(ours),
                                    speedup_stderr(ours, theirs, seed=rng.getrandbits(32))))
    found = boundary(points, 256)
    envelope = Envelope(tuple(points), {"256": EnvelopeBoundary(*found)}, "random text", "")
    metrics = {"speculation_boundary_concurrency": found[0]}
    cell = CellResult(id="c", config=CellConfig(speculative_algorithm="DSPARK"), expect={}, metrics=metrics,
                      envelope=envelope)
    gates = evaluate(cell, metrics, baseline, stats.Levels.family(ENVELOPE_GATES))
    return next(g.verdict for g in gates if g.metric == "speculation_boundary_concurrency")


def envelope_power(nights: int, seed: int) -> str:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "envelope.yaml"
        path.write_text(f"schema: 1\ncells:\n  c:\n    speculation_boundary_concurrency: {{value: {ENVELOPE_BASELINE}, "
                        "never_inward: true}\n")
        baseline = load_baseline(path)
    lines = [f"Envelope gate ({nights} nights; grid {list(ENVELOPE_GRID)}, baseline boundary {ENVELOPE_BASELINE}, "
             f"alpha split over {ENVELOPE_GATES} gates):"]
    for name, cost in ENVELOPE_SCENARIOS.items():
        verdicts = [envelope_night(rng, cost, baseline) for _ in range(nights)]
        lines.append(f"  {name}: red {verdicts.count(stats.REGRESSED) / nights:.1%}, green "
                     f"{verdicts.count(stats.PASSED) / nights:.1%}, inconclusive "
                     f"{verdicts.count(stats.INCONCLUSIVE) / nights:.1%}")
    return "\n".join(lines)


# --- Per-category acceptance (a separate mode: `--categories`) --------------------------------------------------------
# The smoke accept suite's builtin workload: 40 requests over its categories (20 prompts, each asked twice), each
# request up to CATEGORY_TOKENS tokens drawn as the simulator draws them (alpha 0.7 times the simulator's default factor
# per category, gamma 7), a per-boot shift of alpha (ACCEPT_DRIFT_BOOT, as gate_power_e2e.E2E_NOISE); gated against a
# baseline of BASELINE_RUNS boots with min_ratio 0.9 per category, family-wise over the cell's gates (accept length, its
# 7 positions, the categories). Planted: the code category's alpha times a factor (fault category_regression=code: 0.6).
CATEGORY_REQUESTS = {"code": 6, "writing": 8, "stem": 12, "humanities": 4, "math": 6, "long_context": 4}
CATEGORY_TOKENS, ACCEPT_DRIFT_BOOT = 256, 0.003
CATEGORY_PLANTED = {"clean": 1.0, "code x0.95": 0.95, "code x0.9": 0.9, "code x0.8": 0.8,
                    "category_regression=code (x0.6)": 0.6}


def _category_boot(rng: random.Random, code_factor: float = 1.0) -> dict:
    """One boot's accept_length_CATEGORY (with per-request stderrs)."""
    from dspark_ci.sglang_sim.sim_config import SimConfig
    from dspark_ci.sglang_sim.speculation import AcceptModel, draw_accepted

    alpha = POSITION_ALPHA + rng.gauss(0, ACCEPT_DRIFT_BOOT)
    factors = {**SimConfig().category_accept}
    factors["code"] = factors.get("code", 1.0) * code_factor
    model = AcceptModel(alpha, max_accept=POSITION_GAMMA, category_factors=factors)
    metrics = {}
    for category, requests in CATEGORY_REQUESTS.items():
        alphas = model.alphas(category if category in factors else "other")
        lengths = []
        for _ in range(requests):
            steps, tokens = 0, 1
            while tokens < CATEGORY_TOKENS:
                tokens += draw_accepted(rng, alphas, POSITION_GAMMA) + 1
                steps += 1
            lengths.append(tokens / steps)
        metrics[f"accept_length_{category}"] = statistics.fmean(lengths)
        metrics[f"accept_length_{category}_stderr"] = statistics.stdev(lengths) / math.sqrt(requests)
    return metrics


def category_baseline(rng: random.Random, directory: Path) -> Path:
    boots = [_category_boot(rng) for _ in range(BASELINE_RUNS)]
    lines = ["schema: 1", "cells:", "  c:"]
    for category in CATEGORY_REQUESTS:
        name = f"accept_length_{category}"
        values = [b[name] for b in boots]
        mean = statistics.fmean(values)
        request = statistics.fmean(b[name + "_stderr"] for b in boots) / mean
        lines.append(f"    {name}: {{value: {mean:.6g}, min_ratio: 0.9, noise: {statistics.stdev(values) / mean:.6g}, "
                     f"runs: {len(values)}, request_noise: {request:.6g}}}")
    path = directory / "categories.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


CATEGORY_FAMILY = 15  # the smoke cell's acceptance gates: accept length, accept rate, 7 positions, 6 categories


def category_night(rng: random.Random, baseline, code_factor: float) -> tuple[str, bool]:
    """(the code category's verdict, whether any other category's gate was red) for one boot."""
    metrics = _category_boot(rng, code_factor)
    cell = CellResult(id="c", config=CellConfig(speculative_algorithm="DSPARK"), expect={}, metrics=metrics)
    gates = evaluate(cell, metrics, baseline, stats.Levels.family(CATEGORY_FAMILY))
    verdicts = {g.metric: g.verdict for g in gates if g.statistic is not None}
    others = any(v == stats.REGRESSED for m, v in verdicts.items() if m != "accept_length_code")
    return verdicts["accept_length_code"], others


def category_power(nights: int, seed: int) -> str:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        baseline = load_baseline(category_baseline(rng, Path(tmp)))
    lines = [f"Per-category gates ({nights} nights; {sum(CATEGORY_REQUESTS.values())} requests of {CATEGORY_TOKENS} "
             f"tokens over {len(CATEGORY_REQUESTS)} categories, baseline {BASELINE_RUNS} boots, alpha split over "
             f"{CATEGORY_FAMILY} gates):"]
    for name, factor in CATEGORY_PLANTED.items():
        results = [category_night(rng, baseline, factor) for _ in range(nights)]
        code = [verdict for verdict, _ in results]
        lines.append(f"  {name}: code red {code.count(stats.REGRESSED) / nights:.1%}, green "
                     f"{code.count(stats.PASSED) / nights:.1%}; another category red "
                     f"{sum(other for _, other in results) / nights:.1%}")
    return "\n".join(lines)


SMOKE_MODE_NIGHTS = 3  # nights of each separate mode under --smoke


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nights", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1, help="independent repeats (seeds SEED, SEED+1, ...)")
    parser.add_argument("--jobs", type=int, default=1, help="repeats run at once, one process each")
    parser.add_argument("--baseline-runs", type=int, default=BASELINE_RUNS,
                        help=f"good boots each baseline is recorded from (default {BASELINE_RUNS})")
    parser.add_argument("--max-boots", type=int, default=MAX_BOOTS,
                        help=f"the sequential budget per cell, as `run --max-boots` (default {MAX_BOOTS})")
    parser.add_argument("--e2e", type=int, default=0, metavar="N", help="also N end-to-end nights on the simulator")
    parser.add_argument("--acceptance", action="store_true",
                        help="only the per-position acceptance gates (sampled losslessness: bench/sampled_lossless.py)")
    parser.add_argument("--envelope", action="store_true",
                        help="only the gate on where speculation pays (the boundary does not move inward)")
    parser.add_argument("--categories", action="store_true",
                        help="only the per-category acceptance gates (a regression planted in one category)")
    parser.add_argument("--e2e-scenarios", default=E2E_DEFAULT,
                        help=f"which end-to-end scenarios, comma-separated (default {E2E_DEFAULT}; "
                             "bench/gate_power_e2e.py lists them)")
    parser.add_argument("--e2e-out", metavar="DIR", help="keep the end-to-end runs' directories here (default: a "
                        "temporary directory)")
    parser.add_argument("--e2e-baseline-runs", type=int, default=5, metavar="K",
                        help="clean runs the 198-question GPQA cell's baseline is recorded from (default 5)")
    parser.add_argument("--shipped", action="store_true",
                        help="also the shipped baselines and their cells as they are (bench/gate_power_shipped.py)")
    parser.add_argument("--smoke", action="store_true", help="a few seconds: 2 nights, 1 repeat (CI)")
    parser.add_argument("--node-share", type=float, default=0.0, metavar="RHO",
                        help="design candidate: a same-node reference boot as a control variate for this share of "
                             "the per-boot speed variance (0: none)")
    parser.add_argument("--accept-detect", type=float, metavar="D",
                        help="design candidate: the acceptance gates' detection line (default: twice the tolerance)")
    parser.add_argument("--beta-spending", choices=sorted(stats.BETA_SPENDING), default=stats.BETA_SCHEDULE,
                        help=f"how β is spread over the looks (dspark_ci.ground.stats.BETA_SPENDING; default {stats.BETA_SCHEDULE})")
    args = parser.parse_args()
    modes = {"acceptance": acceptance_power, "envelope": envelope_power, "categories": category_power}
    if any(getattr(args, mode) for mode in modes):
        for mode, power in modes.items():
            if getattr(args, mode):
                print(power(SMOKE_MODE_NIGHTS if args.smoke else args.nights, args.seed))
        return 0
    stats.BETA_SCHEDULE = args.beta_spending  # before the worker processes fork: they inherit it
    global NODE_SHARE, ACCEPT_DETECT
    NODE_SHARE, ACCEPT_DETECT = args.node_share, args.accept_detect
    if args.smoke:
        args.nights, args.repeats, args.jobs = 2, 1, 1
        for power in modes.values():  # the separate modes too, so CI's smoke run finds them broken
            print(power(SMOKE_MODE_NIGHTS, args.seed))
    started = time.monotonic()
    seeds = [args.seed + k for k in range(args.repeats)]
    if args.nights > 0:  # --nights 0: only --shipped / --e2e
        with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            repeats = list(pool.map(figures_of_seed, [args.nights] * len(seeds), seeds,
                                    [args.baseline_runs] * len(seeds), [args.max_boots] * len(seeds)))
        print(report(repeats, args.nights, args.baseline_runs, args.max_boots, time.monotonic() - started))
    if args.shipped or args.smoke:
        from bench.gate_power_shipped import shipped_report

        print(shipped_report(nights=5 if args.smoke else max(args.nights, 20), seed=args.seed,
                             max_boots=args.max_boots))
    if args.e2e:
        from bench.gate_power_e2e import e2e

        with tempfile.TemporaryDirectory() as tmp:
            out = Path(args.e2e_out or tmp)
            print(e2e(args.e2e, out, tuple(args.e2e_scenarios.split(",")), args.e2e_baseline_runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
