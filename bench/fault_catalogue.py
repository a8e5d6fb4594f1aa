"""Every simulator fault against every cell of a matrix: how many cells come out green under each.

    python bench/fault_catalogue.py [--matrix matrices/smoke.yaml] [--boot-timeout 8] [--jobs 1]

For each fault of the catalogue (``dspark_ci.sglang_sim.sim_config.FAULT_PARSERS``, with a value where it takes one) it runs
``dspark-ci run MATRIX`` as a user does, with ``DSPARK_SIM_FAULTS`` set and a temporary state directory and
history, and prints one row per fault: the run's exit code and every cell's status. "green" is a cell whose status
is ``passed``. A fault that acts only on serving (garbage text, a broken stream, a slow decode) leaves an expected
rejection ``rejected_as_expected``: SGLang refuses that launch before anything is served, which is the right
verdict for it; such cells are counted apart. ``rank_exit=R:S`` cannot act on a cell with R nodes or fewer (it has no
rank R): such a cell is shown "n/a" and not counted. ``crash_once`` runs once per cell, each with its own marker. Exits
1 when any cell under any fault was green.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dspark_ci.matrices import load_cells  # noqa: E402
from dspark_ci.sglang_sim.sim_config import FAULT_PARSERS  # noqa: E402

# The value each fault that takes one is run with (slow_decode at the size the issue reported green, and at the
# 10 % the smoke baseline's tolerances are sized for).
FAULT_VALUES: dict[str, tuple[str, ...]] = {
    "boot_reject": ("boot_reject=injected by bench/fault_catalogue.py",),
    "slow_decode": ("slow_decode=1.5", "slow_decode=1.1"),
    "rank_exit": ("rank_exit=0:4", "rank_exit=1:4"),
    "position_regression": ("position_regression=3",),  # the per-position gates' planted regression
    "accept_drift": ("accept_drift=20",),  # mid-run: after the sanity suite's requests and half the accept suite's
    "envelope_shift": ("envelope_shift=4",),  # speculation stops paying at a quarter of the concurrency
    "category_regression": ("category_regression=code",),  # the code category's drafts accept 0.6 times as often
}


# crash_once=PATH crashes the first boot that finds no PATH, creates it, and serves from then on (a flaky server): a
# retry must not turn it green. One marker serves one run, so each cell gets a run (--cell) with its own marker.
PER_CELL = ("crash_once",)


def catalogue(work: Path) -> list[str]:
    values = {**FAULT_VALUES, "crash_once": (f"crash_once={work / 'crash-once-marker'}",)}
    return [value for name in FAULT_PARSERS for value in values.get(name, (name,))]


def applies(fault: str, cell: dict) -> bool:
    """False for a fault that has nothing to act on in this cell (a node rank it does not have)."""
    name, _, value = fault.partition("=")
    return name != "rank_exit" or int(value.split(":")[0]) < int(cell["config"].get("nnodes", 1))


def run_under(fault: str, matrix: str, boot_timeout: str, work: Path) -> tuple[int, dict[str, str]]:
    if fault.partition("=")[0] not in PER_CELL:
        return run_cells(fault, matrix, boot_timeout, work, ())
    code, statuses = 0, {}
    for cell in load_cells([matrix]):
        marked = f"{fault}-{cell.id}"  # a marker of its own: this cell's first boot crashes
        cell_code, cell_statuses = run_cells(marked, matrix, boot_timeout, work, ("--cell", cell.id))
        code, statuses = max(code, cell_code), {**statuses, **cell_statuses}
    return code, statuses


def run_cells(fault: str, matrix: str, boot_timeout: str, work: Path, selection: tuple[str, ...]
              ) -> tuple[int, dict[str, str]]:
    out = work / fault.replace("=", "-").replace(":", "-").replace(" ", "_").replace("/", "_")[-60:]
    env = {**os.environ, "DSPARK_SIM_FAULTS": fault, "DSPARK_STATE_DIR": str(work / "state"),
           "DSPARK_HISTORY": str(work / "state" / "history.sqlite"), "CI": "true"}
    done = subprocess.run([sys.executable, "-m", "dspark_ci", "run", matrix, *selection, "--out", str(out), "--quiet",
                           "--boot-timeout", boot_timeout], env=env, cwd=REPO, capture_output=True, text=True)
    if not (out / "results.json").exists():  # refused before any launch: every cell unrun, none green
        return done.returncode, {"(refused)": done.stderr.strip().splitlines()[-1][:80]}
    results = json.loads((out / "results.json").read_text())
    return done.returncode, {cell["id"]: cell["status"] if applies(fault, cell) else f"n/a ({cell['status']})"
                             for cell in results["cells"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--matrix", default=str(REPO / "matrices" / "smoke.yaml"))
    parser.add_argument("--boot-timeout", default="8", help="seconds (hang_boot waits this long per cell)")
    parser.add_argument("--fault", action="append", help="only this fault (its name; repeatable)")
    parser.add_argument("--smoke", action="store_true",
                        help="CI's check that the bench still runs: one fault (boot_reject, quick), its run must not be green")
    args = parser.parse_args()
    if args.smoke:
        args.fault = ["boot_reject"]
    green = 0
    with tempfile.TemporaryDirectory(prefix="fault-catalogue-") as tmp:
        rows = [(fault, *run_under(fault, args.matrix, args.boot_timeout, Path(tmp))) for fault in catalogue(Path(tmp))
                if not args.fault or fault.partition("=")[0] in args.fault]
    cells = list(dict.fromkeys(cell for row in rows for cell in row[2]))
    print(f"| fault | exit | {' | '.join(cells)} |")
    print("|---|---|" + "---|" * len(cells))
    for fault, code, statuses in rows:
        green += sum(status == "passed" for status in statuses.values())
        print(f"| `{fault.split('=')[0] + '=PATH' if fault.startswith('crash_once') else fault}` | {code} | {' | '.join(statuses.get(c, '-') for c in cells)} |")
    print(f"\ngreen (passed) cells under a fault: {green}; runs that exited 0: {sum(r[1] == 0 for r in rows)}")
    return 1 if green else 0


if __name__ == "__main__":
    sys.exit(main())
