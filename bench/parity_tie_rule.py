"""The parity tie rule's false alarms and detections, on parity records recorded from SGLang's real engine.

    python bench/parity_tie_rule.py [--smoke] [--data FILE]
    python bench/parity_tie_rule.py --extract RUN_DIR ... --label control|planted:NAME --data FILE

Every first difference a recorded parity run found is read again, under each rule of ``RULES``, by the suite's own
code (``suites/parity_ties.py`` ``decide_gap``): the reference's logprob of its own token and of the tested server's,
the prompt's own prefix drift, and the cell's pooled drift (the largest of its prompts'). A control cell is SGLang
unplanted (a speculative cell against plain decode, tp 2 or two nodes against one rank): red is a false alarm. A
planted cell ran a numerics bug (bench/planted_bugs.py): red is a detection. The rates come with exact (Clopper-Pearson)
95 % bounds, since the counts are small.

The data (``DEFAULT_DATA``) are the records of real runs, extracted with ``--extract`` and committed, so the figures in
BENCHMARKS.md are reproduced by the current code from the same records. ``--smoke`` reads them and judges one rule.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dspark_ci.suites.parity_ties import MISMATCH, Resolution, decide_gap  # noqa: E402
from scipy.stats import binomtest  # noqa: E402

DEFAULT_DATA = REPO / "bench" / "data" / "parity_records.json"
FORMAT = "dspark-parity-records"


@dataclass(frozen=True)
class Rule:
    name: str
    tie_ulps: float
    drift_factor: float
    max_drift: float
    pooled: bool  # the cell's largest drift (compare_all) rather than the prompt's own


RULES = (
    Rule("exact: any difference is red", 0.0, 0.0, math.inf, pooled=False),
    Rule("bf16 steps only (2)", 2.0, 0.0, math.inf, pooled=False),
    Rule("own prefix drift x2, max 0.5", 2.0, 2.0, 0.5, pooled=False),
    Rule("pooled drift x1, max 0.5", 2.0, 1.0, 0.5, pooled=True),
    Rule("pooled drift x2, max 0.5 (shipped)", 2.0, 2.0, 0.5, pooled=True),
    Rule("pooled drift x4, max 0.5", 2.0, 4.0, 0.5, pooled=True),
    Rule("pooled drift x2, max 0.25", 2.0, 2.0, 0.25, pooled=True),
)
SMOKE_RULES = (RULES[4],)


@dataclass(frozen=True)
class Difference:
    """One recorded first difference: the reference's logprobs of both tokens (``theirs`` None: outside its top)."""

    ours: float | None
    theirs: float | None
    drift: float | None


@dataclass(frozen=True)
class RecordedCell:
    run: str
    cell: str
    label: str  # "control" or "planted:NAME"
    differences: tuple[Difference, ...]
    drifts: tuple[float, ...]  # every prompt's own prefix drift

    @property
    def planted(self) -> bool:
        return self.label != "control"


def is_red(difference: Difference, pooled_drift: float | None, rule: Rule) -> bool:
    if rule.tie_ulps == 0 and rule.drift_factor == 0:
        return True  # the rule before ties: any first difference is a finding, an exact tie of the reference's too
    drift = pooled_drift if rule.pooled else difference.drift
    if drift is not None and drift > rule.max_drift:
        return True
    if difference.ours is None or difference.theirs is None:
        return True  # outside the reference's top logprobs: a mismatch under every rule (suites/parity_ties.py)
    resolution = Resolution(rule.tie_ulps, drift, rule.drift_factor, rule.max_drift)
    return decide_gap(difference.ours, difference.theirs, resolution).verdict == MISMATCH


def cell_red(cell: RecordedCell, rule: Rule) -> tuple[bool, int]:
    """(red, how many of its first differences the rule reads as mismatches)."""
    pooled = max(cell.drifts, default=None)
    reds = sum(is_red(d, pooled, rule) for d in cell.differences)
    return reds > 0 or any(d > rule.max_drift for d in cell.drifts), reds


def rate(k: int, n: int) -> str:
    if n == 0:
        return "n/a"
    interval = binomtest(k, n).proportion_ci(0.95, method="exact")  # Clopper-Pearson
    low, high = interval.low, interval.high
    return f"{k}/{n} ({low:.0%}-{high:.0%})"


def table(cells: list[RecordedCell], rules: tuple[Rule, ...]) -> str:
    controls, planted = [c for c in cells if not c.planted], [c for c in cells if c.planted]
    differences = sum(len(c.differences) for c in controls)
    lines = ["| rule | control cells red (false alarms) | control first differences red | planted cells red |",
             "|---|---|---|---|"]
    for rule in rules:
        judged = [cell_red(c, rule) for c in controls]
        caught = sum(cell_red(c, rule)[0] for c in planted)
        lines.append(f"| {rule.name} | {rate(sum(red for red, _ in judged), len(controls))} | "
                     f"{rate(sum(n for _, n in judged), differences)} | {rate(caught, len(planted))} |")
    return "\n".join(lines)


def extract(run_dirs: list[Path], label: str) -> list[dict]:
    """The parity records of every cell of these runs, reduced to what the rules read."""
    found = []
    for run_dir in run_dirs:
        results = json.loads((run_dir / "results.json").read_text())
        for cell in results["cells"]:
            suites = run_dir / "logs" / cell["id"] / "suites.json"  # the suites' records, as pytest wrote them
            records = (json.loads(suites.read_text())["records"].get("parity") or []) if suites.exists() else []
            if records and not any(r.get("error") or r.get("reference_error") for r in records):
                found.append({"run": results.get("run_id", run_dir.name), "cell": cell["id"], "label": label,
                              "records": [{key: r.get(key) for key in ("verdict", "first_difference", "drift",
                                                                        "reference_logprob", "tested_logprob")}
                                          for r in records]})
    return found


def load(path: Path) -> list[RecordedCell]:
    data = json.loads(path.read_text())
    if data.get("format") != FORMAT:
        sys.exit(f"{path}: not a {FORMAT} file (make one with --extract)")
    return [RecordedCell(c["run"], c["cell"], c["label"],
                         tuple(Difference(r["reference_logprob"], r["tested_logprob"], r["drift"])
                               for r in c["records"] if r["first_difference"] is not None),
                         tuple(r["drift"] for r in c["records"] if r["drift"] is not None))
            for c in data["cells"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="judge the recorded data under the shipped rule only")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the records file (default: %(default)s)")
    parser.add_argument("--extract", type=Path, nargs="+", metavar="RUN_DIR", help="add these runs' records to --data")
    parser.add_argument("--label", default="control", help="with --extract: control, or planted:NAME")
    args = parser.parse_args()
    if args.extract:
        existing = json.loads(args.data.read_text())["cells"] if args.data.exists() else []
        cells = existing + extract(args.extract, args.label)
        args.data.parent.mkdir(parents=True, exist_ok=True)
        args.data.write_text(json.dumps({"format": FORMAT, "cells": cells}, indent=1) + "\n")
        print(f"{args.data}: {len(cells)} cells")
        return 0
    cells = load(args.data)
    controls = [c for c in cells if not c.planted]
    print(f"{len(controls)} control cells ({len({c.run for c in controls})} runs), "
          f"{sum(len(c.differences) for c in controls)} first differences; {len(cells) - len(controls)} planted cells")
    print(table(cells, SMOKE_RULES if args.smoke else RULES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
