"""Where a smoke run's wall time goes, as a user waiting for it sees it: boot, the tests' own durations, and
everything else (interpreter and pytest start-up, reports, teardown), per serving cell; and the time from
starting ``dspark-ci run`` to its first launch. The suites' warm pytest worker (dspark_ci.warm_worker) and cold
interpreters per cell (DSPARK_SUITES_COLD=1) are measured side by side, alternating, in one run.

    python bench/cell_overhead.py [--repeats 3] [--matrix matrices/smoke.yaml] [--modes warm cold]
    python bench/cell_overhead.py --smoke      # CI: one warm run of one cell's sanity suite, the split printed

Every run is the real ``python -m dspark_ci run`` on the simulated server, with its own state directory.
Prints min/median/max over the repeats of: wall, start → first launch, and per serving cell boot, tests and
"everything else" (the cell's seconds minus its boot minus pytest's session time, as its summary line gives it).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Split:
    wall_s: float
    to_first_launch_s: float
    boot_s: float  # per serving cell, mean
    tests_s: float
    else_s: float


def measure(matrix: str, mode: str, cells: list[str], suites: list[str], tmp: Path) -> Split:
    out = tmp / f"run-{mode}-{time.monotonic_ns()}"
    env = {**os.environ, "DSPARK_STATE_DIR": str(tmp / "state"), "DSPARK_HISTORY": str(tmp / "history.sqlite"),
           "DSPARK_SUITES_COLD": "1" if mode == "cold" else "0"}
    argv = [sys.executable, "-m", "dspark_ci", "run", matrix, "--out", str(out), "--quiet",
            *(arg for cell in cells for arg in ("--cell", cell)), *(("--suites", ",".join(suites)) if suites else ())]
    started = dt.datetime.now(dt.timezone.utc)
    subprocess.run(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = (dt.datetime.now(dt.timezone.utc) - started).total_seconds()
    results = json.loads((out / "results.json").read_text())
    serving = [c for c in results["cells"] if c.get("ready_at") and c.get("tests")]
    if not serving:
        raise SystemExit(f"no serving cell measured in {out}: see its report.md")
    first = min(dt.datetime.fromisoformat(c["started_at"]) for c in results["cells"] if c.get("started_at"))
    boot = statistics.fmean(c["boot_seconds"] for c in serving)
    tests = [session_seconds(out / "logs" / c["id"] / "suites.log") for c in serving]
    other = statistics.fmean(c["seconds"] - c["boot_seconds"] - t for c, t in zip(serving, tests, strict=False))
    return Split(wall, (first - started).total_seconds(), boot, statistics.fmean(tests), other)


SESSION = re.compile(r" in ([0-9.]+)s(?: \(|\s*=*$)")


def session_seconds(log: Path) -> float:
    """pytest's own session time, from its summary line ("6 passed, 1 warning in 14.34s"): the tests and their
    fixtures, from collection to the last teardown; interpreter and plugin start-up are outside it."""
    found = [float(m.group(1)) for line in log.read_text().splitlines() if (m := SESSION.search(line))]
    if not found:
        raise SystemExit(f"no pytest summary line in {log}")
    return found[-1]


def summary(splits: list[Split], field: str) -> str:
    values = [getattr(s, field) for s in splits]
    return f"{min(values):6.2f} {statistics.median(values):6.2f} {max(values):6.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", default="matrices/smoke.yaml")
    parser.add_argument("--cell", action="append", default=[], help="only these cells (default: all)")
    parser.add_argument("--suites", nargs="+", default=[], help="only these suites (default: the matrix's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", nargs="+", choices=("warm", "cold"), default=["warm", "cold"])
    parser.add_argument("--smoke", action="store_true", help="one warm run of the first smoke cell's sanity suite")
    args = parser.parse_args()
    if args.smoke:
        args.repeats, args.modes = 1, ["warm"]
        args.cell = args.cell or ["dsv4-flash-tp8-a2a-none-dspark-b7-cuda"]
        args.suites = args.suites or ["sanity"]  # the split's code path, not the suites' minutes
    runs: dict[str, list[Split]] = {mode: [] for mode in args.modes}
    with tempfile.TemporaryDirectory(prefix="cell-overhead-") as tmp:
        for _ in range(args.repeats):
            for mode in args.modes:  # alternating: a change in the machine's load falls on both modes alike
                runs[mode].append(measure(args.matrix, mode, args.cell, args.suites, Path(tmp)))
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (2 cores: above 2 the figures are inflated)")
    print(f"{'mode':5} {'figure (s)':32} {'min':>6} {'median':>6} {'max':>6}")
    for mode, splits in runs.items():
        for field, label in (("wall_s", "run wall"), ("to_first_launch_s", "start -> first launch"),
                             ("boot_s", "boot, per serving cell"), ("tests_s", "tests' own, per serving cell"),
                             ("else_s", "everything else, per serving cell")):
            print(f"{mode:5} {label:32} {summary(splits, field)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
