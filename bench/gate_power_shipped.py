"""Gate power on the data users have: the shipped baselines and their cells as they are (``gate_power.py --shipped``).

The synthetic model of ``gate_power.py`` draws its baselines from its own noise model. Here the baseline is the file
the project ships (``SHIPPED``), read with ``load_baseline`` as a run reads it: its recorded values, noise, runs,
request noise, GPQA question count and per-question record, and its cells (each exact cell id it gates). The live
boots are drawn under the benchmark's stated noise (``TRUE_NOISE``: 2 % run to run for speed, 1 % for acceptance), and
GPQA answers as the per-question record says (a question right in the record stays right unless a planted drop
flips it; the flips are the same every boot, as on a server whose answers are fixed per question). Each cell-night
goes through the real gates (``dspark_ci.reports.gates.evaluate``) and sequential looks at the run's levels
(``family_levels`` over the file's cells), as ``dspark-ci run --max-boots`` takes them.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace
from pathlib import Path

from dspark_ci.ground import stats
from dspark_ci.ground.measurements import BootMetrics, GpqaSummary
from dspark_ci.ground.records import CellResult, Status
from dspark_ci.ground.sglang.settings import CellConfig
from dspark_ci.reports.baseline_file import Baseline, load_baseline
from dspark_ci.reports.gates import evaluate, family_levels, status_of
from dspark_ci.reports.metrics import STDERR_OF

REPO = Path(__file__).resolve().parent.parent
SHIPPED = ("baselines/smoke.yaml", "baselines/nightly.yaml", "baselines/release.yaml")
TRUE_NOISE = {"tpot_ms_median": 0.02, "output_throughput_tok_s": 0.02, "accept_length": 0.01, "accept_rate": 0.01}
PLANTED = 0.05  # 5 % worse on each ratio metric in turn; GPQA 5 points lower
CELL = CellResult(id="cell", config=CellConfig(speculative_algorithm="DSPARK"), expect={"outcome": "serve"})


def _boot(rng: random.Random, specs, planted: tuple[str, float] | None, flips: set[str]) -> tuple[dict, dict]:
    """One boot's metrics (with per-request standard errors) and GPQA per-question [right, asked]."""
    metrics: dict = {}
    for name, noise in TRUE_NOISE.items():
        spec = specs.get(name)
        if spec is None or spec.value is None:
            continue
        worse = planted[1] if planted and planted[0] == name else 0.0
        factor = 1 + worse if name == "tpot_ms_median" else 1 - worse
        metrics[name] = spec.value * factor * math.exp(rng.gauss(0, noise))
        if name in STDERR_OF and spec.request_noise:
            metrics[STDERR_OF[name]] = metrics[name] * spec.request_noise
    questions: dict = {}
    gpqa = specs.get("gpqa_accuracy")
    if gpqa is not None and gpqa.per_question:
        questions = {q: [int(score >= 0.5 and q not in flips), 1] for q, score in gpqa.per_question.items()}
        metrics["gpqa_accuracy"] = sum(r for r, _ in questions.values()) / len(questions)
        metrics["gpqa_num_questions"] = len(questions)
    return metrics, questions


def _night(rng: random.Random, cell: CellResult, baseline: Baseline, levels, planted, max_boots: int):
    """(status, gate verdicts, boots) of one cell-night through the sequential looks."""
    specs = baseline.specs_for(cell.id)
    flips: set[str] = set()
    if planted and planted[0] == "gpqa_accuracy":  # d points lower: round(d · questions) right answers turn wrong
        record = specs["gpqa_accuracy"].per_question or {}
        right = [q for q, score in record.items() if score >= 0.5]
        flips = set(rng.sample(right, min(len(right), round(planted[1] * len(record)))))
    boots, gates = [], ()
    status = Status.INCONCLUSIVE
    for wanted in stats.look_boots(max_boots):
        while len(boots) < wanted:
            boots.append(_boot(rng, specs, planted, flips))
        pooled = {k: statistics.fmean(b[0][k] for b in boots if k in b[0]) for k in boots[0][0]}
        questions = {q: (sum(b[1][q][0] for b in boots), len(boots)) for q in boots[0][1]}
        measured = replace(cell, metrics=pooled,
                           boots=tuple(BootMetrics(b[0]) for b in boots) if len(boots) > 1 else (),
                           gpqa=GpqaSummary(per_question=questions) if questions else None)
        gates = tuple(g for g in evaluate(measured, pooled, baseline, levels) if g.statistic is not None)
        status = status_of(gates)
        undecided = [g for g in gates if g.inconclusive and not g.statistic.final]
        if status is not Status.INCONCLUSIVE or not undecided:
            break
    return status, {g.metric: g.verdict for g in gates}, len(boots)


def shipped_report(nights: int, seed: int, max_boots: int) -> str:
    rng = random.Random(seed)
    lines = [f"Shipped baselines, their cells as they are ({nights} nights per scenario, live boots under the "
             f"benchmark's noise {', '.join(f'{k} {v:.0%}' for k, v in TRUE_NOISE.items())}, --max-boots {max_boots}):"]
    for path in SHIPPED:
        baseline = load_baseline(REPO / path)
        ids = [e.pattern for e in baseline.entries if not e.is_glob]
        if not ids:
            lines.append(f"  {path}: no gated cell ({baseline.description or 'no reference run'}): only the floors")
            continue
        cells = [replace(CELL, id=cell_id) for cell_id in ids]
        levels = family_levels(cells, baseline, max_boots)
        gated = sorted({name for cell in cells for name in baseline.specs_for(cell.id) if name in TRUE_NOISE
                        or name == "gpqa_accuracy"})
        for planted in [None, *((name, PLANTED) for name in gated)]:
            red = runs_red = 0
            verdicts: dict[str, int] = {}
            spent = []
            for _ in range(nights):
                any_red = False
                for cell in cells:
                    if planted and planted[0] not in baseline.specs_for(cell.id):
                        continue
                    status, gates, boots = _night(rng, cell, baseline, levels, planted, max_boots)
                    spent.append(boots)
                    red += status is Status.FAILED
                    any_red |= status is Status.FAILED
                    if planted:
                        verdict = gates.get(planted[0], "none")
                        verdicts[verdict] = verdicts.get(verdict, 0) + 1
                runs_red += any_red
            what = "clean" if planted is None else f"{planted[0]} {PLANTED:.0%} worse" + (
                " (5 points)" if planted[0] == "gpqa_accuracy" else "")
            detail = (f"runs red {runs_red}/{nights}" if planted is None else
                      f"that gate: {dict(sorted(verdicts.items()))} of {sum(verdicts.values())} cell-nights")
            lines.append(f"  {path} {what}: {detail}; {statistics.fmean(spent):.2f} boots per cell")
    return "\n".join(lines)
