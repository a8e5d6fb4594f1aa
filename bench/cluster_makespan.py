"""Cells side by side on a cluster: makespan against the lower bound and against one cell at a time.

    python bench/cluster_makespan.py slurm [--repeats 3] [--one-at-a-time-repeats 3]   # SLURM_CONF: 8 nodes
    python bench/cluster_makespan.py fleet [--nodes 64]      # the nightly on a simulated fleet; GPU-runner minutes

``slurm``: a synthetic 12-cell matrix (one- and two-node cells whose simulator boots take known times,
``DSPARK_SIM_BOOT_SECONDS``, then a short accept suite) runs through ``dspark-ci run --launcher slurm`` one cell at
a time (``--max-parallel 1``, what every run did before) and side by side (the default: as many cells as the
partition has nodes in service), ``--repeats`` times each. Per run: the cells' makespan (first cell started to
last finished, from results.json), the lower bound max(Σ node-seconds / nodes, longest cell) from that run's own
cell times, the verdict of every cell (must equal the one-at-a-time run's), and squeue afterwards (must be empty).
The runs share one history, so the side-by-side runs start the longest cells first as a user's second run does.

``fleet``: the nightly matrix on ``--nodes`` simulated GPU nodes, cell times from ``dspark_ci.ci.nightly.shards``'s estimates,
scheduled by the run's own policy (``dspark_ci.cell_queue.longest_first`` and ``Capacity.fits``), with and without
the expected rejections SGLang's resolver decides on a CPU (``dspark-ci plan --rejections resolver``); and the
GPU-runner minutes per nightly (each GPU job pays ``--job-overhead-minutes`` for pickup, checkout and image
start) with every rejection launched vs. resolver-decided ones in one CPU job.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dspark_ci.ci.nightly.shards import RESOLVER_SECONDS  # noqa: E402
from dspark_ci.ground.sglang.release import DEFAULT_VERSION  # noqa: E402
from dspark_ci.launchers.contract import Capacity  # noqa: E402
from dspark_ci.matrices import load_cells  # noqa: E402
from dspark_ci.matrices.cell import Cell  # noqa: E402

from dspark_ci.cell_queue import expected_seconds, longest_first  # noqa: E402
from dspark_ci.rejections import decide_rejections  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
# (node count, simulator boot seconds) of the 12 synthetic cells: known durations, longest ~ a third of the total.
SYNTHETIC = [(1, 60), (2, 40), (1, 32), (2, 28), (1, 24), (1, 20), (2, 16), (1, 12), (1, 12), (1, 8), (1, 6), (1, 6)]
HEADER = """\
description: bench/cluster_makespan.py's synthetic matrix (known boot times, a short accept suite)
sglang: ">=@VERSION@"
hardware: {cuda: h200}
defaults:
  model: deepseek-ai/DeepSeek-V4-Flash
  model_slug: dsv4-flash
  device: cuda
  gpus_per_node: 8
  moe_a2a_backend: none
  speculative_algorithm: DSPARK
  suites:
    accept: {num_requests: 2, max_tokens: 32, concurrency: 1}
include:
"""


def synthetic_matrix(path: Path) -> None:
    lines = [f"  - {{id_suffix: c{i + 1:02d}, nnodes: {n}, tp: {8 * n}, env: "
             f"{{DSPARK_SIM_BOOT_SECONDS: \"{boot}\", DSPARK_SIM_DECODE_STEP_MS: \"20\", "
             f"DSPARK_SIM_ACCEPT_PROB: \"0.{5 + i % 4}\"}}}}" for i, (n, boot) in enumerate(SYNTHETIC)]
    path.write_text(HEADER.replace("@VERSION@", DEFAULT_VERSION) + "\n".join(lines) + "\n")


def _at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def run_once(matrix: Path, work: Path, name: str, env: dict, extra: list[str]) -> dict:
    out = work / name
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "dspark_ci", "run", str(matrix), "--launcher", "slurm", "--out",
                           str(out), "--quiet", "--boot-timeout", "300", *extra], env=env, capture_output=True, text=True, cwd=REPO)
    wall = time.monotonic() - started
    results = json.loads((out / "results.json").read_text())
    cells = results["cells"]
    makespan = max(_at(c["finished_at"]) for c in cells) - min(_at(c["started_at"]) for c in cells)
    node_seconds = sum(c["seconds"] * c["config"]["nnodes"] for c in cells)
    queue = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True).stdout.split()
    return {"exit": done.returncode, "wall": wall, "makespan": makespan, "node_seconds": node_seconds,
            "longest": max(c["seconds"] for c in cells), "verdicts": {c["id"]: c["status"] for c in cells},
            "squeue_after": queue, "stderr": done.stderr[-2000:]}


def _spread(values: list[float]) -> str:
    return f"{min(values):.1f} / {statistics.median(values):.1f} / {max(values):.1f}"


def _ratios(values: list[float]) -> str:
    return f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}"


def slurm(args: argparse.Namespace) -> int:
    env = {**os.environ, "CI": "true"}
    nodes = len(subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], env=env, capture_output=True, text=True,
                               check=True).stdout.split())
    with tempfile.TemporaryDirectory(prefix="cluster-makespan-") as tmp:
        work = Path(tmp)
        env |= {"DSPARK_STATE_DIR": str(work / "state"), "DSPARK_HISTORY": str(work / "history.sqlite")}
        matrix = work / "synthetic.yaml"
        synthetic_matrix(matrix)
        runs: dict[str, list[dict]] = {"one at a time": [], "side by side": []}
        for repeat in range(args.repeats):
            modes = (("one at a time", ["--max-parallel", "1"]), ("side by side", []))
            for label, extra in modes[0 if repeat < args.one_at_a_time_repeats else 1:]:
                result = run_once(matrix, work, f"{label.replace(' ', '-')}-{repeat}", env, extra)
                runs[label].append(result)
                bound = max(result["node_seconds"] / nodes, result["longest"])
                print(f"{label} #{repeat + 1}: exit {result['exit']}, cells' makespan {result['makespan']:.1f} s, "
                      f"bound {bound:.1f} s, ratio {result['makespan'] / bound:.3f}, wall {result['wall']:.1f} s, "
                      f"squeue after: {result['squeue_after'] or 'empty'}", flush=True)
    reference = runs["one at a time"][0]["verdicts"]
    print(f"\n{len(SYNTHETIC)} cells ({sum(n for n, _ in SYNTHETIC)} node slots) on {nodes} Slurm nodes, "
          f"{args.repeats} side-by-side and {args.one_at_a_time_repeats} one-at-a-time runs (min / median / max):")
    for label, results in runs.items():
        bounds = [max(r["node_seconds"] / nodes, r["longest"]) for r in results]
        ratios = [r["makespan"] / bound for r, bound in zip(results, bounds, strict=False)]
        same = all(r["verdicts"] == reference for r in results)
        print(f"  {label:14} makespan {_spread([r['makespan'] for r in results])} s; lower bound "
              f"{_spread(bounds)} s; makespan / bound {_ratios(ratios)}; verdicts identical to one at a time: "
              f"{same}; squeue empty after every run: {all(not r['squeue_after'] for r in results)}")
    for results in runs.values():
        bad = [r for r in results if r["exit"] != 0]
        for r in bad:
            print(f"  a run exited {r['exit']}: {r['stderr']}")
    return 0


def simulate(cells: list[Cell], seconds: dict[str, float], capacity: Capacity) -> float:
    """The makespan of the run's policy on a fleet: longest first, a cell starts when it fits beside those running."""
    waiting, now = longest_first(cells, seconds), 0.0
    running: list[tuple[float, str, int]] = []  # (finish, id, nnodes)
    while waiting or running:
        for cell in list(waiting):
            if capacity.fits(cell.nnodes, [n for _, _, n in running]):
                waiting.remove(cell)
                heapq.heappush(running, (now + seconds[cell.id], cell.id, cell.nnodes))
        now = heapq.heappop(running)[0]
    return now


def fleet(args: argparse.Namespace) -> int:
    cells = load_cells([args.matrix])
    seconds = {c.id: expected_seconds(c, {}) for c in cells}
    decided = set(decide_rejections(cells, DEFAULT_VERSION).results)
    launched = [c for c in cells if c.id not in decided]
    capacity = Capacity(args.nodes, args.nodes, f"{args.nodes} simulated nodes")
    print(f"{args.matrix}: {len(cells)} cells, {sum(c.expect.outcome == 'reject' for c in cells)} expected "
          f"rejections, {len(decided)} of them decided by SGLang {DEFAULT_VERSION}'s resolver on a CPU; cell times "
          f"from dspark_ci.ci.nightly.shards.estimate_seconds (computed, deterministic: no repeats needed)")
    for label, chosen in (("every cell launched", cells), ("resolver-decided rejections not launched", launched)):
        bound = max(sum(seconds[c.id] * c.nnodes for c in chosen) / args.nodes, max(seconds[c.id] for c in chosen))
        makespan = simulate(chosen, seconds, capacity)
        sequential = sum(seconds[c.id] for c in chosen)
        print(f"  {label}: side by side on {args.nodes} nodes {makespan / 60:.0f} min (bound {bound / 60:.0f} min, "
              f"x{makespan / bound:.2f}); one at a time {sequential / 60:.0f} min")
    overhead = args.job_overhead_minutes * 60
    before, after = (sum((overhead + seconds[c.id]) * c.nnodes for c in chosen) for chosen in (cells, launched))
    print(f"  GPU-runner minutes per nightly (each node of a cell: {args.job_overhead_minutes:g} min pickup "
          f"and the cell's time): every rejection launched {before / 60:.0f}; resolver-decided "
          f"rejections in one CPU job {after / 60:.0f} (saves {(before - after) / 60:.0f}, "
          f"{len(decided)} GPU jobs; the CPU job takes ~{(RESOLVER_SECONDS + overhead) / 60:.0f} min)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="CI's check that the bench still runs: the fleet simulation of the nightly, 8 nodes")
    sub = parser.add_subparsers(dest="what")
    on_slurm = sub.add_parser("slurm", help="the synthetic matrix on the Slurm cluster SLURM_CONF names")
    on_slurm.add_argument("--repeats", type=int, default=3)
    on_slurm.add_argument("--one-at-a-time-repeats", type=int, default=3,
                          help="one-at-a-time runs (the first is the verdict reference and seeds the history)")
    on_fleet = sub.add_parser("fleet", help="the nightly on a simulated fleet; GPU-runner minutes")
    on_fleet.add_argument("--matrix", default="matrices/nightly.yaml")
    on_fleet.add_argument("--nodes", type=int, default=64)
    on_fleet.add_argument("--job-overhead-minutes", type=float, default=4.0)
    args = parser.parse_args()
    if args.smoke:
        return fleet(argparse.Namespace(matrix="matrices/nightly.yaml", nodes=8, job_overhead_minutes=4.0))
    if args.what is None:
        parser.error("say what to measure: slurm or fleet (or --smoke)")
    return slurm(args) if args.what == "slurm" else fleet(args)


if __name__ == "__main__":
    sys.exit(main())
