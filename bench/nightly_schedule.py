"""How well the nightly uses its GPU runners: makespan of the schedule vs. the lower bound.

    python bench/nightly_schedule.py [--matrix matrices/nightly.yaml] [--fleet ci/nightly/fleet.json] [--trials 200]
                                     [--job-overhead-minutes 4]

The shipped nightly matrix is planned as the nightly does (``dspark-ci plan --format github`` entries), on a
simulated fleet (runners per label from ``--fleet``). Each trial draws every cell's true duration around its
estimate (``dspark_ci.ci.nightly.shards.estimate_seconds``, ±``--noise``, default 20 %, seeded), and "history" is the
previous trial's draw, as the nightly's cache would hold it. Compared, per trial:
  per-cell   the old nightly: one job per cell in matrix order, each taking the first free runner of its label
  longest    one job per cell as well, but queued longest (by history) first: dynamic LPT
  shards     ``dspark_ci.ci.nightly.shards.schedule`` with the previous night's durations (LPT per label), run with
             today's
  bound      max over labels of (total GPU-time / runners, longest cell): no schedule ends earlier
Every job pays ``--job-overhead-minutes`` before its first cell (runner pickup, checkout, install): a
shard pays it once, a per-cell job once per cell. Prints median and worst makespan / bound (1.00 = optimal)
and the mean minutes each schedule ends after the shards.

Time to the first signal, beside the makespan: each cell has a true chance of being red (drawn once per cell,
Beta(0.5, 4): mean 0.11, a few cells red often), each night draws which cells are red, and the first red
verdict's minute is when the night's first signal comes (a night with none: its makespan). ``shards`` runs a
shard's cells longest first as placed; ``signal`` is ``dspark_ci.ci.nightly.shards.schedule`` as shipped: the same
shards, each run in ``signal_order`` with the red rates the previous nights taught it
(``updated_red_rates``).
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

from dspark_ci.ci.nightly.shards import DEFAULT_RUNNERS, estimate_seconds, lower_bound, schedule, updated_red_rates  # noqa: E402
from dspark_ci.matrices import load_cells  # noqa: E402

from dspark_ci.verbs.plan import github_matrix  # noqa: E402


def first_signal(shards: list[list[str]], actual: dict[str, float], red: set[str], overhead: float) -> float:
    """The minute-free seconds at which the first red cell is decided (each shard runs its cells in order);
    with no red cell, when the last shard ends (all green is the night's signal)."""
    ends, first_red = [], None
    for cells in shards:
        clock = overhead
        for cell in cells:
            clock += actual[cell]
            if cell in red:
                first_red = clock if first_red is None else min(first_red, clock)
        ends.append(clock)
    return first_red if first_red is not None else max(ends)


def per_cell_finishes(entries: list[dict], actual: dict[str, float], fleet: dict[str, int],
                      overhead: float) -> dict[str, float]:
    """One job per cell in the order given, each on the first free runner of its label: when each cell ends."""
    free: dict[str, list[float]] = {}
    finishes = {}
    for entry in entries:
        runners = free.setdefault(entry["runner"], [0.0] * fleet.get(entry["runner"], DEFAULT_RUNNERS))
        finish = heapq.heappop(runners) + overhead + actual[entry["cell"]]
        heapq.heappush(runners, finish)
        finishes[entry["cell"]] = finish
    return finishes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", default="matrices/nightly.yaml")
    parser.add_argument("--fleet", type=Path, default=Path("ci/nightly/fleet.json"))
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--job-overhead-minutes", type=float, default=4.0)
    parser.add_argument("--noise", type=float, default=0.2,
                        help="night-to-night spread of a cell's duration (0.2: ±20 %%)")
    parser.add_argument("--smoke", action="store_true", help="CI's check that the bench still runs: 5 trials")
    args = parser.parse_args()
    if args.smoke:
        args.trials = 5
    entries = github_matrix(load_cells([args.matrix]))[0]["include"]
    fleet = json.loads(args.fleet.read_text())
    rng = random.Random(args.seed)
    red_draws = random.Random(f"reds {args.seed}")  # its own stream: the durations drawn are those of the makespan rows
    red_chance = {e["cell"]: red_draws.betavariate(0.5, 4.0) for e in entries}

    def draw() -> dict[str, float]:
        return {e["cell"]: estimate_seconds(e) * rng.uniform(1 - args.noise, 1 + args.noise) for e in entries}

    overhead = args.job_overhead_minutes * 60
    history: dict[str, float] = {}  # the first night plans from estimates alone
    learned: dict[str, float] = {}  # red rates, as the nightly's cache would hold them
    names = ("per-cell", "longest", "shards", "signal")
    ratios: dict[str, list[float]] = {name: [] for name in names}
    later: dict[str, list[float]] = {name: [] for name in names}
    signal: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.trials):
        actual = draw()
        red = {cell for cell, chance in red_chance.items() if red_draws.random() < chance}
        bound = lower_bound(entries, actual, fleet)
        known = {e["cell"]: history.get(e["cell"]) or estimate_seconds(e) for e in entries}
        shipped = schedule(entries, history, fleet, learned)
        placed = [sorted(s.cells, key=lambda c: -known[c]) for s in shipped]  # the same shards, longest first
        finishes = {"per-cell": per_cell_finishes(entries, actual, fleet, overhead),
                    "longest": per_cell_finishes(sorted(entries, key=lambda e: -known[e["cell"]]), actual, fleet,
                                                 overhead)}
        for name, ends in finishes.items():
            reds = [end for cell, end in ends.items() if cell in red]
            ratios[name].append(max(ends.values()) / bound)
            signal[name].append(min(reds) if reds else max(ends.values()))
        for name, order in (("shards", placed), ("signal", [list(s.cells) for s in shipped])):
            ratios[name].append(max(overhead + sum(actual[c] for c in cells) for cells in order) / bound)
            signal[name].append(first_signal(order, actual, red, overhead))
        for name in names:
            later[name].append((ratios[name][-1] - ratios["signal"][-1]) * bound / 60)
        history = actual
        learned = updated_red_rates(learned, {cell: cell in red for cell in red_chance})
    labels = {e["runner"] for e in entries}
    print(f"nightly matrix {args.matrix}: {len(entries)} cells on {len(labels)} runner labels, fleet "
          + ", ".join(f"{label}×{fleet.get(label, DEFAULT_RUNNERS)}" for label in sorted(labels))
          + f"; {args.job_overhead_minutes:g} min per job before its first cell")
    print(f"{'schedule':<10} {'median ratio':>13} {'worst ratio':>12} {'min after signal':>17} "
          f"{'first signal, min (median / p90)':>33}   ({args.trials} nights; ratio: makespan / lower bound)")
    for name in names:
        ordered = sorted(signal[name])
        p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
        print(f"{name:<10} {statistics.median(ratios[name]):>13.3f} {max(ratios[name]):>12.3f} "
              f"{statistics.mean(later[name]):>17.1f} {statistics.median(ordered) / 60:>20.1f} / {p90 / 60:<10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
