"""Render and write every report file of a run directory (results.json itself is the run's)."""

from __future__ import annotations

from pathlib import Path

from ground.records import RunResults
from reports.baseline import Baseline
from reports.compare import compare_markdown, compare_runs
from reports.html import render_html
from reports.junit import render_junit
from reports.markdown import render_markdown
from reports.results import write_text_atomically


def render_reports(results: RunResults, baseline: Baseline | None = None,
                   compare_to: RunResults | None = None) -> dict[str, str]:
    """File name -> contents for junit.xml, report.md and report.html. With ``compare_to`` (another
    run's results), report.md and report.html end with the comparison."""
    comparison = compare_runs(results, compare_to) if compare_to is not None else None
    comparison_md = compare_markdown(comparison) if comparison is not None else None
    return {
        "junit.xml": render_junit(results),
        "report.md": render_markdown(results, baseline, comparison_md),
        "report.html": render_html(results, baseline, comparison, comparison_md),
    }


def write_rendered(run_dir: Path | str, rendered: dict[str, str]) -> list[Path]:
    run_dir = Path(run_dir)
    paths = [run_dir / name for name in rendered]
    for path, text in zip(paths, rendered.values()):
        write_text_atomically(path, text)
    return paths


def write_reports(run_dir: Path | str, results: RunResults, baseline: Baseline | None = None,
                  compare_to: RunResults | None = None) -> list[Path]:
    """Write junit.xml, report.md and report.html into ``run_dir``; returns the paths written."""
    return write_rendered(run_dir, render_reports(results, baseline, compare_to))
