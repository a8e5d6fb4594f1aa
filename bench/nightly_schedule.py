"""How well the nightly uses its GPU runners: makespan of the schedule vs. the lower bound.

    python bench/nightly_schedule.py [--matrix matrices/nightly.yaml] [--fleet ci/nightly/fleet.json] [--trials 200]
                                     [--job-overhead-minutes 4]

The shipped nightly matrix is planned as the nightly does (``dspark-ci plan --format github`` entries), on a
simulated fleet (runners per label from ``--fleet``). Each trial draws every cell's true duration around its
estimate (``ci.nightly.shards.estimate_seconds``, ±``--noise``, default 20 %, seeded), and "history" is the
previous trial's draw, as the nightly's cache would hold it. Compared, per trial:
  per-cell   the old nightly: one job per cell in matrix order, each taking the first free runner of its label
  longest    one job per cell as well, but queued longest (by history) first: dynamic LPT
  shards     ``ci.nightly.shards.schedule`` with the previous night's durations (LPT per label), run with today's
  bound      max over labels of (total GPU-time / runners, longest cell): no schedule ends earlier
Every job pays ``--job-overhead-minutes`` before its first cell (runner pickup, checkout, install): a
shard pays it once, a per-cell job once per cell. Prints median and worst makespan / bound (1.00 = optimal)
and the mean minutes each schedule ends after the shards.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ci.nightly.shards import DEFAULT_RUNNERS, estimate_seconds, lower_bound, schedule  # noqa: E402
from dspark_ci.verbs.plan import github_matrix  # noqa: E402
from matrices import load_cells  # noqa: E402


def per_cell_makespan(entries: list[dict], actual: dict[str, float], fleet: dict[str, int], overhead: float) -> float:
    free: dict[str, list[float]] = {}
    end = 0.0
    for entry in entries:  # in the order given, each job on the first free runner of its label
        runners = free.setdefault(entry["runner"], [0.0] * fleet.get(entry["runner"], DEFAULT_RUNNERS))
        finish = heapq.heappop(runners) + overhead + actual[entry["cell"]]
        heapq.heappush(runners, finish)
        end = max(end, finish)
    return end


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", default="matrices/nightly.yaml")
    parser.add_argument("--fleet", type=Path, default=Path("ci/nightly/fleet.json"))
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--job-overhead-minutes", type=float, default=4.0)
    parser.add_argument("--noise", type=float, default=0.2, help="night-to-night spread of a cell's duration (0.2: ±20 %%)")
    parser.add_argument("--smoke", action="store_true", help="CI's check that the bench still runs: 5 trials")
    args = parser.parse_args()
    if args.smoke:
        args.trials = 5
    entries = github_matrix(load_cells([args.matrix]))[0]["include"]
    fleet = json.loads(args.fleet.read_text())
    rng = random.Random(args.seed)

    def draw() -> dict[str, float]:
        return {e["cell"]: estimate_seconds(e) * rng.uniform(1 - args.noise, 1 + args.noise) for e in entries}

    overhead = args.job_overhead_minutes * 60
    history: dict[str, float] = {}  # the first night plans from estimates alone
    ratios: dict[str, list[float]] = {"per-cell": [], "longest": [], "shards": []}
    later: dict[str, list[float]] = {name: [] for name in ratios}
    for _ in range(args.trials):
        actual = draw()
        bound = lower_bound(entries, actual, fleet)
        known = {e["cell"]: history.get(e["cell"]) or estimate_seconds(e) for e in entries}
        ends = {
            "per-cell": per_cell_makespan(entries, actual, fleet, overhead),
            "longest": per_cell_makespan(sorted(entries, key=lambda e: -known[e["cell"]]), actual, fleet, overhead),
            "shards": max(overhead + sum(actual[c] for c in shard.cells) for shard in schedule(entries, history, fleet)),
        }
        for name, end in ends.items():
            ratios[name].append(end / bound)
            later[name].append((end - ends["shards"]) / 60)
        history = actual
    labels = {e["runner"] for e in entries}
    print(f"nightly matrix {args.matrix}: {len(entries)} cells on {len(labels)} runner labels, fleet "
          + ", ".join(f"{label}×{fleet.get(label, DEFAULT_RUNNERS)}" for label in sorted(labels))
          + f"; {args.job_overhead_minutes:g} min per job before its first cell")
    print(f"{'schedule':<10} {'median ratio':>13} {'worst ratio':>12} {'min after shards':>17}"
          f"   (makespan / lower bound, {args.trials} trials)")
    for name in ratios:
        print(f"{name:<10} {statistics.median(ratios[name]):>13.3f} {max(ratios[name]):>12.3f} "
              f"{statistics.mean(later[name]):>17.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
