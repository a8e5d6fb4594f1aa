"""Write every report file of a run directory from its results (results.json itself is the run's)."""

from __future__ import annotations

from pathlib import Path

from reports.baseline import Baseline
from reports.compare import compare_markdown, compare_runs
from reports.html import render_html
from reports.junit import render_junit
from reports.markdown import render_markdown


def write_reports(run_dir: Path | str, results: dict, baseline: Baseline | None = None,
                  compare_to: dict | None = None) -> list[Path]:
    """junit.xml, report.md and report.html in ``run_dir``; with ``compare_to`` (another run's
    results), the comparison is added to report.md and report.html. Returns the paths written."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    comparison = compare_runs(results, compare_to) if compare_to is not None else None
    comparison_md = compare_markdown(comparison) if comparison is not None else None
    contents = {
        "junit.xml": render_junit(results),
        "report.md": render_markdown(results, baseline, comparison_md),
        "report.html": render_html(results, baseline, comparison, comparison_md),
    }
    paths = []
    for name, text in contents.items():
        path = run_dir / name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths
