"""``python -m dspark_ci.ci.nightly.shard_run --out runs/SHARD MATRIX CELL... -- RUN_ARGS...``: one nightly shard, \
cell by cell.

Each cell is its own ``dspark-ci run MATRIX --cell ID --out OUT/ID RUN_ARGS...``: one boot per cell with
all its suites, and one cell's trouble never takes its neighbours' results with it. A cell whose run
ends in exit 3 (infrastructure: engine unreachable, runner lost its GPU, launch timeout) is run once
more; the retry's result is kept, marked flaky in the report (a warning naming the first failure), and
the first attempt is kept under ``OUT/attempts/``. A retried cell that fails again is reported as it
failed; a gate failure (exit 1) is never retried. Exit: the worst of the kept attempts' codes.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

from dspark_ci.ci.tool import run_tool
from dspark_ci.ground.errors import DsparkError, ExitCode
from dspark_ci.ground.errors import worst as worst_exit
from dspark_ci.reports.results import load_results, write_results

FLAKY = "flaky: the first attempt failed on infrastructure (exit 3{detail}); retried once"


def run_cell(command: list[str], matrix: str, cell: str, out: Path, run_args: list[str]) -> int:
    return subprocess.run([*command, "run", matrix, "--cell", cell, "--out", str(out), *run_args]).returncode


def run_shard(command: list[str], matrix: str, cells: list[str], out: Path, run_args: list[str]) -> int:
    worst = 0
    for cell in cells:
        cell_dir = out / cell
        code = run_cell(command, matrix, cell, cell_dir, run_args)
        if code == ExitCode.INFRA:
            first = out / "attempts" / f"{cell}-1"
            detail = _first_error(cell_dir)
            first.parent.mkdir(parents=True, exist_ok=True)
            if cell_dir.exists():
                shutil.move(str(cell_dir), str(first))
            print(f"dspark_ci.ci.nightly.shard_run: {cell}: infrastructure failure (exit 3); retrying once",
                  file=sys.stderr)
            code = run_cell(command, matrix, cell, cell_dir, run_args)
            _mark_flaky(cell_dir, FLAKY.format(detail=f": {detail}" if detail else ""))
        if code not in (ExitCode.OK, ExitCode.INCONCLUSIVE):
            _announce_red(cell, code, cell_dir)
        worst = worst_exit((worst, code))  # an inconclusive cell (4) never hides a failed one
    return worst


def _announce_red(cell: str, code: int, cell_dir: Path) -> None:
    """The first signal of the night is a red cell: say so the moment it is decided, as an annotation GitHub
    shows on the run's page while the shard goes on, not when the shard's last cell ends."""
    why = (_first_error(cell_dir) or f"exit {code}; see its report.md")[:300]
    title = f"dspark-ci: {cell} is red"
    print(f"::error title={_escape(title, property=True)}::{_escape(why)}", flush=True)


def _escape(text: str, property: bool = False) -> str:
    """GitHub's workflow-command escaping (a property also escapes its separators)."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if property else text


def _first_error(cell_dir: Path) -> str | None:
    try:
        cells = load_results(cell_dir / "results.json").cells
    except DsparkError:  # a run that died before writing results: nothing to quote
        return None
    return next((c.error for c in cells if c.error), None)


def _mark_flaky(cell_dir: Path, note: str) -> None:
    path = cell_dir / "results.json"
    if not path.is_file():
        return
    results = load_results(path)
    cells = tuple(dataclasses.replace(c, warnings=(*c.warnings, note),
                                      labels=tuple(dict.fromkeys((*c.labels, "flaky"))))
                  for c in results.cells)
    write_results(path, dataclasses.replace(results, cells=cells))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, run_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="python -m dspark_ci.ci.nightly.shard_run",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the shard's run directory (one folder per cell)")
    parser.add_argument("--dspark-ci", default="dspark-ci", help="the command to run (default dspark-ci)")
    parser.add_argument("matrix")
    parser.add_argument("cells", nargs="+", metavar="CELL")
    args = parser.parse_args(own)
    return run_tool("dspark_ci.ci.nightly.shard_run",
                    lambda: run_shard(args.dspark_ci.split(), args.matrix, args.cells, args.out, run_args))


if __name__ == "__main__":
    sys.exit(main())
