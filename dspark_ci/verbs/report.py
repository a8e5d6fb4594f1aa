"""``dspark-ci report``: render a run directory's reports again, optionally re-gated or compared."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import replace
from pathlib import Path

from dspark_ci.ground.errors import BadInput, ExitCode, worst
from dspark_ci.ground.records import CellResult, RunResults
from dspark_ci.reports.baseline_file import Baseline, load_baseline
from dspark_ci.reports.compare import compare_markdown, compare_runs, identity_warnings
from dspark_ci.reports.gates import regate
from dspark_ci.reports.history_db import history_path, run_dir_of
from dspark_ci.reports.live_results import RESULTS_LINES
from dspark_ci.reports.results import load_results

EPILOG = """\
With md or html, rewrites RUN_DIR/junit.xml, report.md and report.html (results.json is left as the run
wrote it); with json nothing in RUN_DIR is written. Prints one format to stdout:
  md     report.md (default); with --compare, the comparison tables only
  html   report.html (self-contained: charts are inline images)
  json   results.json as rendered (re-gated with --baseline); with --compare, the comparison:
         {"new_run", "old_run", "cells": [{"id", "new_status", "old_status",
          "metrics": [{"metric", "old", "new", "ratio", "better", "noise", "change"}]}], "only_new", "only_old"}
         noise: how far new may lie from old and still be noise (the metric's unit); change: better,
         worse, within_noise, same, or null (a side missing, or no direction is better)

When the run history (`dspark-ci history`) exists, report.html gains trend plots per cell and failed
gates name the last good and first bad run.

--baseline FILE evaluates every serving cell's gates again against FILE (format: baselines/README.md);
a cell's status follows its new gates unless it also failed for another reason (a suite's test
failed, an expected rejection did not happen).

exit codes: 0 every cell passed (or was rejected as expected, or skipped); 1 a cell failed or
errored, or the run did not finish (interrupted or killed; outcomes results.jsonl records are shown); 2 bad input (missing run directory, corrupt results.json, bad baseline file); 4 nothing failed but a
statistical gate is inconclusive
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by `dspark-ci run --out`")
    parser.add_argument("--compare", metavar="OTHER_RUN_DIR",
                        help="an older run to compare with, as a directory or a run id the run history knows "
                             "(ratios are RUN_DIR over OTHER_RUN_DIR)")
    parser.add_argument("--baseline", metavar="FILE", help="evaluate gates again against this baseline file")
    parser.add_argument("--format", choices=("md", "html", "json"), default="md", help="what to print (default: md)")


def run(args: argparse.Namespace) -> int:
    from dspark_ci.reports.writers import render_reports, write_rendered  # on use: matplotlib loads only when drawing

    run_dir = _run_dir(args.run_dir, "RUN_DIR")
    results = with_recorded_outcomes(load_results(run_dir / "results.json"), run_dir / RESULTS_LINES)
    history_file = history_path()
    other = load_results(_compared_dir(args.compare, history_file) / "results.json") if args.compare else None
    baseline = load_baseline(args.baseline) if args.baseline else None
    if baseline is not None:
        _warn_about(baseline, [cell.id for cell in results.cells])
        results = regate(results, baseline)
    if other is not None:
        for warning in identity_warnings(compare_runs(results, other)):
            print(f"dspark-ci report: WARNING: {warning}", file=sys.stderr)
    if args.format == "json":  # a query: the run directory is not touched
        comparison = compare_runs(results, other) if other is not None else None
        print(json.dumps(comparison.to_dict() if comparison is not None else results.to_dict(), indent=2))
        return run_status(results)
    rendered = render_reports(results, baseline, compare_to=other,
                              history=history_file if history_file.is_file() else None)
    try:
        written = write_rendered(run_dir, rendered)
    except OSError as err:  # e.g. a read-only artifact download: still print what was asked for
        print(f"dspark-ci report: warning: could not rewrite the reports in {run_dir} ({err})", file=sys.stderr)
    else:  # never silently: the run's own files now say something else than the run wrote
        why = [f"compared with {args.compare}"] * bool(other) + [f"gated against {args.baseline}"] * bool(baseline)
        print(f"dspark-ci report: rewrote {', '.join(path.name for path in written)} in {run_dir}"
              f"{' (' + ', '.join(why) + ')' if why else ''}; results.json is unchanged (--format json writes "
              "nothing)", file=sys.stderr)
    print(_stdout_text(args.format, results, other, rendered), end="")
    return run_status(results)


def run_status(results: RunResults) -> int:
    """The run's exit code as `run` gives it: 1 failed (or the run never finished), 4 inconclusive, 0."""
    code = worst(cell.run_exit_code for cell in results.cells)  # never above a failure: 4 only when nothing failed
    if results.finished_at is None:
        how = "was interrupted" if results.interrupted else "did not finish (killed, or still running)"
        print(f"dspark-ci report: the run {results.run_id} {how}: not a passing run", file=sys.stderr)
        return ExitCode.FELL_SHORT if code in (ExitCode.OK, ExitCode.INCONCLUSIVE) else code
    return code


def with_recorded_outcomes(results: RunResults, lines_path: Path) -> RunResults:
    """An unfinished run's results.json may be older than results.jsonl (rewritten every few seconds, the lines at
    once): a cell results.jsonl records is shown with that outcome, not as "no outcome yet"."""
    if results.finished_at is not None or not lines_path.is_file():
        return results
    recorded: dict[str, CellResult] = {}
    with contextlib.suppress(OSError):
        for line in lines_path.read_text(encoding="utf-8", errors="replace").splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError, RecursionError):
                cell = CellResult.from_dict(json.loads(line))
                recorded[cell.id] = cell
    return replace(results, cells=tuple(recorded.get(cell.id, cell) for cell in results.cells))


def _run_dir(path: str, argument: str) -> Path:
    run_dir = Path(path)
    if not run_dir.is_dir():
        raise BadInput(f"{argument} {path}", "no such directory",
                       "give a directory written by `dspark-ci run --out DIR`")
    return run_dir


def _compared_dir(given: str, history_file: Path) -> Path:
    """--compare: a run directory, or the id of a run the history remembers."""
    if Path(given).is_dir():
        return Path(given)
    remembered = run_dir_of(history_file, given)
    if remembered and Path(remembered).is_dir():
        return Path(remembered)
    raise BadInput(f"--compare {given}", "no such directory" + (", and the run history does not know that run id"
                   if not remembered else f"; the run history puts that run in {remembered}, which is gone"),
                   "give a run directory or a run id listed by `dspark-ci history`")


def _warn_about(baseline: Baseline, cell_ids: list[str]) -> None:
    for warning in list(baseline.warnings) + baseline.unmatched(cell_ids):
        print(f"dspark-ci report: warning: {warning}", file=sys.stderr)


def _stdout_text(fmt: str, results: RunResults, other: RunResults | None, rendered: dict[str, str]) -> str:
    comparison = compare_runs(results, other) if other is not None else None
    if fmt == "md":
        return compare_markdown(comparison) if comparison is not None else rendered["report.md"]
    return rendered["report.html"]
