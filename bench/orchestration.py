"""What dspark-ci itself costs per cell, apart from the server and the suites: linear in cells, or not.

    python bench/orchestration.py [--cells 100 1000] [--repeats 3]

For each size N it writes a matrix of N cells (one axis of N block sizes), then runs the real pipeline
(`dspark_ci.pipeline.run`: load and validate the matrix, plan every cell's argv against SGLang's flag snapshot,
preflight, the run index and ledger, gate each cell against the baseline, append results, keep results.json,
junit.xml and report.md current, write every report at the end) with two stand-ins so that only our own work
is timed: a launcher whose deployment is ready at once (no process), and suites that return fixed metrics
at once. Prints min/median/max seconds over the repeats, milliseconds per cell, and the ratio of the largest
size's per-cell cost to the smallest's (1.0 = linear).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dspark_ci.ground.measurements import SuiteTestOutcome  # noqa: E402
from dspark_ci.launchers.contract import LaunchContext  # noqa: E402
from dspark_ci.launchers.local.lifecycle import LocalLauncher  # noqa: E402
from dspark_ci.launchers.local.options import LocalOptions  # noqa: E402
from dspark_ci.launchers.plan_types import Placement  # noqa: E402

from dspark_ci import cell_run, pipeline  # noqa: E402
from dspark_ci.progress import Progress  # noqa: E402
from dspark_ci.suite_runner import SuiteOutcome  # noqa: E402

MATRIX = """\
hardware: {cuda: h200}
defaults:
  model: deepseek-ai/DeepSeek-V4-Flash
  model_slug: dsv4-flash
  tp: 8
  speculative_algorithm: DSPARK
  baseline: baseline.yaml
  suites: {accept: {num_requests: 8}}
axes:
  speculative_block_size: [%s]
"""
BASELINE = "schema: 1\ncells:\n  '*':\n    accept_length: {value: 3.0, min_ratio: 0.95}\n"
METRICS = {"accept_length": 3.1, "accept_rate": 0.7}


class InstantDeployment:
    """Stand-in: a deployment that is up the moment it is asked for (no server behind it)."""

    def __init__(self, cell_id: str):
        self.cell_id, self.base_url, self.boot_seconds = cell_id, "http://127.0.0.1:9", 0.0

    def check(self) -> None:
        pass


class InstantLauncher(LocalLauncher):
    """Stand-in: the local launcher (so it keeps whatever the launcher contract asks), starting nothing."""

    def placement(self, nnodes: int, *args, **kwargs) -> Placement:
        return Placement.loopback(nnodes, port=30000, dist_port=20000)

    def preflight(self, plans) -> None:
        pass

    @contextlib.contextmanager
    def launch(self, plan, logs_dir):
        yield InstantDeployment(plan.cell_id)


def run_once(size: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "matrix.yaml").write_text(MATRIX % ", ".join(str(i) for i in range(1, size + 1)))
        (root / "baseline.yaml").write_text(BASELINE)
        options = pipeline.RunOptions(matrices=(str(root / "matrix.yaml"),), run_id=f"bench-{size}",
                                      out=root / "run")
        instant = SuiteOutcome(metrics=dict(METRICS), tests=(SuiteTestOutcome("accept", "passed"),))
        with mock.patch.object(cell_run, "run_suites", lambda request, watched=(), watch=None: instant), \
                mock.patch.dict("os.environ", {"DSPARK_STATE_DIR": str(root / "state")}):
            started = time.perf_counter()
            launcher = InstantLauncher(LocalOptions(), LaunchContext(options.run_id, options.out))
            code = pipeline.run(options, launcher, progress=Progress(open("/dev/null", "w"), live=False))
            elapsed = time.perf_counter() - started
        assert code == 0, code
        return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="CI's check that the bench runs: 10 and 20 cells, once")
    args = parser.parse_args()
    if args.smoke:
        args.cells, args.repeats = [10, 20], 1
    per_cell = {}
    print(f"{'cells':>6} {'min s':>7} {'median s':>9} {'max s':>7} {'ms/cell':>8}")
    for size in args.cells:
        times = [run_once(size) for _ in range(args.repeats)]
        median = statistics.median(times)
        per_cell[size] = median / size
        print(f"{size:>6} {min(times):>7.2f} {median:>9.2f} {max(times):>7.2f} {median / size * 1e3:>8.2f}")
    smallest, largest = min(args.cells), max(args.cells)
    print(f"per-cell cost at {largest} cells / at {smallest} cells = {per_cell[largest] / per_cell[smallest]:.2f} "
          "(1.0 = linear)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
