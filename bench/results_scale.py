"""What results and reports cost as a run grows: linear in cells, or not.

    python bench/results_scale.py [--cells 1000 10000] [--repeats 3]

For each size N, side by side in one process:
  write    the run's own writer (dspark_ci.reports.live_results.ResultsWriter) adding N finished cells one by one, as a
           run does after each cell (results.jsonl appended; results.json, junit.xml, report.md rewritten at most
           every few seconds; everything once at the end, report.html included)
  render   `dspark-ci report`'s work on the finished run: load results.json, render junit.xml, report.md and
           report.html (charts capped), write them
and prints min/median/max seconds over the repeats, microseconds per cell, each stage's peak RSS (the process's,
the N cells it holds included; Linux's VmHWM reset before the stage), the whole bench's peak RSS, and the ratio of the
largest size's per-cell cost to the smallest's (1.0 = linear). Cells carry realistic metrics and gates.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dspark_ci.ground.records import CellResult, GateResult, RunResults, Status  # noqa: E402
from dspark_ci.ground.sglang.settings import CellConfig  # noqa: E402
from dspark_ci.reports.history_db import HISTORY_ENV  # noqa: E402
from dspark_ci.reports.live_results import ResultsWriter  # noqa: E402
from dspark_ci.reports.results import load_results  # noqa: E402
from dspark_ci.reports.writers import render_reports, write_rendered  # noqa: E402

METRICS = {"accept_length": 3.1, "accept_rate": 0.7, "ttft_ms_mean": 41.2, "ttft_ms_median": 40.1,
           "ttft_ms_p99": 80.3, "tpot_ms_mean": 12.3, "tpot_ms_median": 12.0, "tpot_ms_p99": 20.1,
           "itl_ms_mean": 30.2, "e2e_latency_s_mean": 1.6, "output_throughput_tok_s": 812.4,
           "input_tokens_mean": 256.0, "output_tokens_mean": 128.0}


def cell(index: int) -> CellResult:
    status = (Status.PASSED, Status.FAILED, Status.ERROR, Status.REJECTED_AS_EXPECTED)[index % 4]
    gates = (GateResult("accept_length", ">=", 1.2, 3.1, True),
             GateResult("output_throughput_tok_s", ">=", 900.0, 812.4, False))
    return CellResult(
        id=f"dsv4-flash-tp8-dp4-dpattn-a2a-none-dspark-b7-cuda-{index:05d}",
        config=CellConfig(model="deepseek-ai/DeepSeek-V4-Flash", device="cuda", tp=8, dp=4, nnodes=1,
                          speculative_algorithm="DSPARK"),
        expect={"outcome": "serve", "message": None, "sglang": None}, runner="8-gpu-h200",
        suites={"accept": {"num_requests": 32}}, status=status, boot_seconds=93.2, metrics=METRICS, gates=gates,
        error="node rank 1 exited with code 1\n  SGLang said: RuntimeError: NCCL" if status is Status.ERROR else None,
        sglang_error="RuntimeError: NCCL" if status is Status.ERROR else None)


def timed(action, peaks: list[float]) -> float:
    """Seconds ``action`` took; its peak RSS (MB) appended to ``peaks`` where Linux can reset the peak."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := the RSS now (Linux >= 4.0)
    started = time.perf_counter()
    action()
    took = time.perf_counter() - started
    with contextlib.suppress(OSError, StopIteration):
        status = Path("/proc/self/status").read_text().splitlines()
        peaks.append(int(next(line for line in status if line.startswith("VmHWM:")).split()[1]) / 1024)
    return took


def write_run(run_dir: Path, cells: list[CellResult]) -> None:
    writer = ResultsWriter(run_dir, RunResults(run_id="bench", started_at="2026-11-30T00:00:00+00:00",
                                               finished_at=None, launcher="local", matrices=("bench.yaml",)))
    for result in cells:
        writer.add(result)
    assert writer.finish()


def render_run(run_dir: Path) -> None:
    write_rendered(run_dir, render_reports(load_results(run_dir / "results.json")))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true",
                        help="CI's check that the bench still runs: 100 and 200 cells, once")
    args = parser.parse_args()
    if args.smoke:
        args.cells, args.repeats = [100, 200], 1
    per_cell: dict[str, dict[int, float]] = {"write": {}, "render": {}}
    # The runs are recorded in a run history of the bench's own, never the user's (from the second run on, the final
    # report.html draws trend charts from it, as a real run's does).
    history = tempfile.TemporaryDirectory(prefix="results-scale-history-")
    os.environ[HISTORY_ENV] = str(Path(history.name) / "history.sqlite")
    print(f"{'cells':>7} {'stage':>7} {'min s':>8} {'median s':>9} {'max s':>8} {'µs/cell':>8} {'peak MB':>8}")
    for size in args.cells:
        cells = [cell(i) for i in range(size)]
        times: dict[str, list[float]] = {"write": [], "render": []}
        peaks: dict[str, list[float]] = {"write": [], "render": []}
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as tmp:
                run_dir = Path(tmp) / "run"
                # bound now: the lambdas run inside this iteration, but say so rather than rely on it
                times["write"].append(timed(lambda d=run_dir, c=cells: write_run(d, c), peaks["write"]))
                times["render"].append(timed(lambda d=run_dir: render_run(d), peaks["render"]))
        for stage, values in times.items():
            median = statistics.median(values)
            per_cell[stage][size] = median / size
            peak = f"{max(peaks[stage]):>8.0f}" if peaks[stage] else f"{'?':>8}"
            print(f"{size:>7} {stage:>7} {min(values):>8.2f} {median:>9.2f} {max(values):>8.2f} "
                  f"{median / size * 1e6:>8.0f} {peak}")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    smallest, largest = min(args.cells), max(args.cells)
    for stage, costs in per_cell.items():
        print(f"{stage}: per-cell cost at {largest} cells / at {smallest} cells = "
              f"{costs[largest] / costs[smallest]:.2f} (1.0 = linear)")
    print(f"peak RSS {peak_mb:.0f} MB; python {sys.version.split()[0]}")
    history.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
