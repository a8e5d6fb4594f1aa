"""Render and write every report file of a run directory (results.json itself is the run's)."""

from __future__ import annotations

import html
import xml.etree.ElementTree as ET
from pathlib import Path

from dspark_ci.ground.records import RunResults
from dspark_ci.reports import history_db
from dspark_ci.reports.baseline_file import Baseline
from dspark_ci.reports.compare import compare_markdown, compare_runs
from dspark_ci.reports.junit import render_junit
from dspark_ci.reports.markdown import render_markdown
from dspark_ci.reports.metrics import METRICS
from dspark_ci.reports.plots import MAX_TREND_CELLS, TREND_METRICS
from dspark_ci.reports.results import results_text, write_files_atomically, write_text_atomically


def render_reports(results: RunResults, baseline: Baseline | None = None,
                   compare_to: RunResults | None = None, history: Path | None = None) -> dict[str, str]:
    """File name -> contents for junit.xml, report.md and report.html. With ``compare_to`` (another
    run's results), report.md and report.html end with the comparison. With ``history`` (a run history
    database, ``dspark_ci.reports.history_db``), report.html gains trend plots per cell and failed gates name the
    last good and first bad run."""
    # On use: report.html's stack (markdown-it, the plots, numpy) is needed once, at the end of a run, and must
    # not delay its first launch.
    from dspark_ci.reports.html import render_html

    comparison = compare_runs(results, compare_to) if compare_to is not None else None
    comparison_md = compare_markdown(comparison) if comparison is not None else None
    trends, regressions = _from_history(history, results) if history is not None else ({}, {})
    return {
        "junit.xml": render_junit(results),
        "report.md": render_markdown(results, baseline, comparison_md, regressions),
        "report.html": render_html(results, baseline, comparison, comparison_md, trends, regressions),
    }


MAX_REGRESSION_LOOKUPS = 200  # failed gates whose last good / first bad run is looked up (a query each)


def _from_history(path: Path, results: RunResults) -> tuple[dict, dict]:
    """(cell -> metric -> points up to this run, (cell, metric) -> (last good, first bad)) for ``results``."""
    until = results.started_at
    stderr_metrics = [stderr for m in TREND_METRICS if (stderr := METRICS[m].stderr)]
    trends = {cell.id: {metric: history_db.series(path, cell.id, metric, until)
                        for metric in (*TREND_METRICS, *stderr_metrics)}
              for cell in results.cells[:MAX_TREND_CELLS] if cell.metrics}
    failed = [(cell.id, gate.metric) for cell in results.cells for gate in cell.gates if not gate.passed]
    regressions = {key: history_db.regression(path, *key, until) for key in failed[:MAX_REGRESSION_LOOKUPS]}
    return trends, regressions


def write_rendered(run_dir: Path | str, rendered: dict[str, str]) -> list[Path]:
    """Every file staged under a temp name first, then all renamed together (dspark_ci.reports.results)."""
    run_dir = Path(run_dir)
    files = {run_dir / name: text for name, text in rendered.items()}
    write_files_atomically(files)
    return list(files)


# The final set's renames, in this order: report.md and junit.xml, the files CI reads for a verdict, come last.
FINAL_SET = ("results.json", "report.html", "junit.xml", "report.md")


def render_final_set(results: RunResults, baseline: Baseline | None = None,
                     history: Path | None = None) -> dict[str, str]:
    """A run's final files, file name -> contents, in the order ``write_rendered`` renames them into place; until
    they are all renamed, the previous set (which never says PASSED: RunResults.complete) stays on disk."""
    rendered = {"results.json": results_text(results), **render_reports(results, baseline, history=history)}
    return {name: rendered[name] for name in FINAL_SET}


def write_reports(run_dir: Path | str, results: RunResults, baseline: Baseline | None = None,
                  compare_to: RunResults | None = None, history: Path | None = None) -> list[Path]:
    """Write junit.xml, report.md and report.html into ``run_dir``; returns the paths written."""
    return write_rendered(run_dir, render_reports(results, baseline, compare_to, history))


def write_failure_reports(run_dir: Path | str, results: RunResults, why: str) -> None:
    """When the reports cannot be rendered: replace them with plain ones that say so and are red, never leave
    stale ones that may be green (results.json, written first, keeps what was measured)."""
    run_dir = Path(run_dir)
    markdown = (f"# dspark-ci run `{results.run_id}`\n\n❌ **FAILED**: {why}. results.json and results.jsonl hold "
                f"what was measured ({len(results.cells)} cells); render them again with "
                f"`dspark-ci report {run_dir}`.\n")
    suite = ET.Element("testsuite", {"name": f"dspark-ci {results.run_id}", "tests": "1", "failures": "0",
                                     "errors": "1", "skipped": "0"})
    testcase = ET.SubElement(suite, "testcase", {"classname": "dspark-ci", "name": "reports"})
    ET.SubElement(testcase, "error", {"type": "error", "message": why}).text = why
    root = ET.Element("testsuites", {key: suite.get(key, "") for key in ("name", "tests", "failures", "errors")})
    root.append(suite)
    page = ("<!doctype html>\n<meta charset=\"utf-8\">\n"
            f"<p><b style=\"color:#cf222e\">FAILED</b>: {html.escape(why)}</p>\n")
    for name, text in (("report.md", markdown), ("junit.xml", ET.tostring(root, encoding="unicode",
                                                                           xml_declaration=True) + "\n"),
                       ("report.html", page)):
        try:
            write_text_atomically(run_dir / name, text)
        except OSError:
            (run_dir / name).unlink(missing_ok=True)
