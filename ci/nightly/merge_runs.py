"""``python -m dspark_ci.ci.nightly.merge_runs --out DIR [--plan PLAN_JSON] RUN_DIR...``: one results.json from many \
run dirs.

The nightly workflow runs each cell in its own job, so each job's artifact holds a run directory
with one cell. The aggregate job merges them into one run directory that ``dspark-ci report``
renders as a single report. With ``--plan`` (the `dspark-ci plan --format github` output the
jobs were fanned out from), a cell whose job left no results.json (cancelled, runner lost, setup
failed before the run started) is reported as an error instead of silently missing.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path

from dspark_ci.ci.nightly.matrix_outputs import read_plan
from dspark_ci.ci.nightly.shards import read_json_numbers, updated_red_rates
from dspark_ci.ci.tool import run_tool
from dspark_ci.ground.errors import BadInput
from dspark_ci.ground.records import CellResult, Expect, RunResults, Status
from dspark_ci.reports.results import load_results, write_results

MISSING_ERROR = ("no results.json from this cell's run job: the job was cancelled, its runner was lost, or it "
                 "failed before `dspark-ci run` wrote anything; see that job's log")


def merge_results(runs: list[tuple[Path, RunResults]], run_id: str,
                  expected_cells: list[str] | None = None) -> RunResults:
    """One run's results from ``(run_dir, results)`` pairs; each cell id must appear once."""
    cells: list[CellResult] = []
    matrices: list[str] = []
    origin: dict[str, Path] = {}
    for run_dir, results in runs:
        for cell in results.cells:
            if cell.id in origin:
                raise BadInput(str(run_dir / "results.json"), f"cell {cell.id} is also in "
                               f"{origin[cell.id] / 'results.json'}", "merge each cell's run directory once")
            origin[cell.id] = run_dir
            cells.append(cell)
        matrices += [m for m in results.matrices if m not in matrices]
    cells += [_missing_cell(cell_id) for cell_id in expected_cells or [] if cell_id not in origin]
    started = [r.started_at for _, r in runs if r.started_at]
    finished = [r.finished_at for _, r in runs if r.finished_at]
    launchers = [r.launcher for _, r in runs if r.launcher]
    return RunResults(run_id=run_id, started_at=min(started) if started else None,
                      finished_at=max(finished) if finished else None,
                      launcher=launchers[0] if launchers else "", matrices=tuple(matrices), cells=tuple(cells),
                      interrupted=any(r.interrupted for _, r in runs))


def cell_durations(runs: list[tuple[Path, RunResults]]) -> dict[str, float]:
    """Each cell's own wall time (results.json's per-cell ``seconds``: start to result, boot and teardown
    included), what dspark_ci.ci.nightly.shards plans with; a run written before cells were timed counts when it ran one
    cell (its start to finish)."""
    durations = {}
    for _, results in runs:
        for cell in results.cells:
            if cell.timing is not None and cell.timing.seconds is not None:
                durations[cell.id] = round(cell.timing.seconds, 1)
        if len(results.cells) == 1 and results.cells[0].id not in durations and results.started_at \
                and results.finished_at:
            seconds = (datetime.fromisoformat(results.finished_at) - datetime.fromisoformat(results.started_at))
            durations[results.cells[0].id] = round(max(0.0, seconds.total_seconds()), 1)
    return durations


def _missing_cell(cell_id: str) -> CellResult:
    return CellResult(id=cell_id, config=None, expect=Expect(), status=Status.ERROR, error=MISSING_ERROR)


def planned_cells(path: Path) -> list[str]:
    """Cell ids of a `dspark-ci plan --format github` output (one object, or chunks)."""
    return [entry["cell"] for entry in read_plan(path)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dspark_ci.ci.nightly.merge_runs",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    parser.add_argument("--out", type=Path, required=True, help="directory for the merged results.json")
    parser.add_argument("--plan", type=Path, help="`dspark-ci plan --format github` output: cells to expect")
    parser.add_argument("--run-id", default="merged", help="run_id of the merged run (default: merged)")
    parser.add_argument("--durations", type=Path,
                        help="also write {cell_id: seconds}, each cell's own wall time (for "
                             "dspark_ci.ci.nightly.shards)")
    parser.add_argument("--red-rates", type=Path,
                        help="update {cell_id: recent red rate} in this file with tonight's verdicts (for "
                             "dspark_ci.ci.nightly.shards, which runs the cells most likely red per second first)")
    args = parser.parse_args(argv)

    def body() -> int:
        found = [d for d in args.run_dirs if (d / "results.json").is_file()]
        for skipped in sorted(set(args.run_dirs) - set(found)):
            print(f"dspark_ci.ci.nightly.merge_runs: warning: {skipped} has no results.json; skipped", file=sys.stderr)
        runs = [(d, load_results(d / "results.json")) for d in found]
        expected = planned_cells(args.plan) if args.plan else None
        if not runs and not expected:
            raise BadInput("RUN_DIR", "none of the directories has a results.json",
                           "give directories written by `dspark-ci run --out DIR`")
        write_results(args.out / "results.json", merge_results(runs, args.run_id, expected))
        if args.durations:
            args.durations.write_text(json.dumps(cell_durations(runs), indent=1, sort_keys=True) + "\n")
        if args.red_rates:
            red = {cell.id: cell.status.failing for _, results in runs for cell in results.cells}
            rates = updated_red_rates(read_json_numbers(args.red_rates, "red rates file"), red)
            args.red_rates.write_text(json.dumps(rates, indent=1, sort_keys=True) + "\n")
        return 0

    return run_tool("dspark_ci.ci.nightly.merge_runs", body)


if __name__ == "__main__":
    sys.exit(main())
