"""``dspark-ci history``: the runs remembered, and how a cell's metrics moved across them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from dspark_ci.ground.errors import BadInput
from dspark_ci.reports import history_db, triage
from dspark_ci.reports.change_points import change_points
from dspark_ci.reports.metrics import format_value, label
from dspark_ci.reports.plots import TREND_METRICS
from dspark_ci.reports.results import load_results
from dspark_ci.tables import text_table

EPILOG = f"""\
Every `dspark-ci run` is recorded when it finishes in an SQLite database: ${history_db.HISTORY_ENV} if set,
else $DSPARK_STATE_DIR/history.sqlite (default ~/.local/state/dspark-ci/history.sqlite). Tables: runs
(run id, times, matrices, server, SGLang version and commit, image digests, hosts, run directory),
cells (status, runner, config), metrics (every number of results.json), gates.

  dspark-ci history                      the runs, newest first
  dspark-ci history --cell 'dsv4-*'      per matching cell, its metrics across runs (oldest first), for a
                                         gate failing in the latest run the last good run and the first bad one,
                                         and change points: where a metric's level moved (even by less than any
                                         gate's tolerance), from which run, by how much (step or drift); only runs
                                         measured like the latest (same identity setup) are compared
  dspark-ci history --triage [--cell G]  every cell whose latest run failed: regression (passed before with the
                                         same setup), flaky (the same identity passed and failed), infrastructure
                                         (the machine failed), broken (never passed); and node-level signals
  dspark-ci history --add RUN_DIR...     record runs made elsewhere (e.g. a nightly's downloaded artifacts)

exit codes: 0 shown or added; 2 bad input (no history yet, a run directory without results.json)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("--db", metavar="FILE", help=f"the history database (default: ${history_db.HISTORY_ENV} or "
                                                      "$DSPARK_STATE_DIR/history.sqlite)")
    parser.add_argument("--cell", metavar="GLOB", help="show the trend of the cells matching GLOB")
    parser.add_argument("--metric", action="append", metavar="NAME",
                        help=f"metric to show with --cell (repeatable; default: {', '.join(TREND_METRICS)})")
    parser.add_argument("--limit", type=int, default=20, metavar="N", help="at most N runs (default: 20)")
    parser.add_argument("--triage", action="store_true",
                        help="classify every cell (matching --cell) whose latest run failed: regression, flaky, "
                        "infrastructure or broken; and list node-level signals")
    parser.add_argument("--add", nargs="+", metavar="RUN_DIR", help="record these run directories")
    parser.add_argument("--format", choices=("table", "json"), default="table", help="what to print (default: table)")


def run(args: argparse.Namespace) -> int:
    path = Path(args.db) if args.db else history_db.history_path()
    if args.add:
        for run_dir in args.add:
            results = load_results(Path(run_dir) / "results.json")
            history_db.record(path, results, run_dir)
            print(f"dspark-ci history: recorded {results.run_id} ({len(results.cells)} cells) in {path}")
        return 0
    if args.triage:
        return _triage(path, args)
    if args.cell:
        return _trends(path, args)
    rows = history_db.runs(path, args.limit)
    if args.format == "json":
        print(json.dumps([row.__dict__ for row in rows], indent=2))
        return 0
    print(text_table(["run", "started", "server", "SGLang", "cells", "failed", "flaky", "matrices", "run dir"],
                 [[r.run_id, r.started_at or "?", r.server or "?", r.sglang_version or "?", str(r.cells), str(r.failed),
                   ", ".join(r.flaky) or "-", ", ".join(r.matrices), r.run_dir or "?"] for r in rows]))
    return 0


def _triage(path: Path, args: argparse.Namespace) -> int:
    found = triage.triage(path, args.cell or "*")
    signals = triage.node_signals(path, args.cell or "*")
    if args.format == "json":
        print(json.dumps({"failing": [t.to_dict() for t in found],
                          "node_signals": [s.__dict__ for s in signals]}, indent=2))
        return 0
    print(text_table(["cell", "latest run", "failure is", "why"], [[t.cell_id, t.run_id, t.kind, t.why] for t in found])
          if found else "No cell failed in its latest recorded run.")
    if signals:
        print("\nnode-level signals (infrastructure failures naming or run on each node):")
        for signal in signals:
            print(f"  {signal.describe()}")
    return 0


def _trends(path: Path, args: argparse.Namespace) -> int:
    cells = history_db.cells_of(path, args.cell)
    if not cells:
        raise BadInput(f"--cell {args.cell}", "no recorded cell matches", "list the runs with `dspark-ci history`")
    metrics = args.metric or list(TREND_METRICS)
    output: dict[str, dict[str, Any]] = {}
    for cell_id in cells:
        full = {metric: history_db.series(path, cell_id, metric) for metric in metrics}
        comparable = {metric: history_db.same_setup_tail(points) for metric, points in full.items()}
        output[cell_id] = {
            "series": {metric: points[-args.limit:] for metric, points in full.items()},
            "regressions": {metric: history_db.regression(path, cell_id, metric) for metric in metrics},
            "change_points": [c for metric, (points, _) in comparable.items() for c in change_points(metric, points)],
            "setup_changed_after": next((cut.run_id for _, cut in comparable.values() if cut), None)}
    if args.format == "json":
        print(json.dumps({cell: {"series": {m: [p.__dict__ for p in points] for m, points in data["series"].items()},
                                 "regressions": {m: {"last_good": good, "first_bad": bad}
                                                 for m, (good, bad) in data["regressions"].items() if bad},
                                 "change_points": [c.to_dict() for c in data["change_points"]],
                                 "setup_changed_after": data["setup_changed_after"]}
                          for cell, data in output.items()}, indent=2))
        return 0
    for cell_id, data in output.items():
        runs = list(dict.fromkeys(p.run_id for points in data["series"].values() for p in points))
        values = {(m, p.run_id): p.value for m, points in data["series"].items() for p in points}
        print(f"{cell_id}\n")
        print(text_table(["run", *(label(m) for m in metrics)],
                     [[run_id, *(format_value(m, values.get((m, run_id))) for m in metrics)] for run_id in runs]))
        for metric, (good, bad) in data["regressions"].items():
            if bad:
                print(f"  {metric} regressed: last good run {good or 'none recorded'}, first bad run {bad}")
        if data["setup_changed_after"]:
            print(f"  WARNING: the cell was measured differently up to run {data['setup_changed_after']} (its "
                  "identity's setup changed): change points look only at the runs since")
        for change in data["change_points"]:
            print(f"  change point: {change.describe()}")
        print()
    return 0
