"""report.html: one self-contained page (inline CSS, charts as base64 PNG, no external assets).

The text is report.md rendered with markdown-it (raw HTML disabled, so an error message can never
inject markup), so the page and the markdown always say the same thing; the charts go after the
summary.
"""

from __future__ import annotations

import html
import re
from importlib import resources
from string import Template
from typing import Mapping

from markdown_it import MarkdownIt

from ground.records import RunResults
from reports.baseline_file import Baseline
from reports.compare import Comparison
from reports.markdown import pr_tables, render_cells, step_summary
from reports.plots import ratio_chart, run_charts, trend_charts


def render_html(results: RunResults, baseline: Baseline | None = None, comparison: Comparison | None = None,
                comparison_md: str | None = None, trends: dict | None = None,
                regressions: Mapping | None = None) -> str:
    charts = run_charts(results)
    if comparison is not None:
        charts.extend(chart for chart in [ratio_chart(comparison)] if chart)
    charts.extend(trend_charts(trends or {}))
    page = Template(resources.files("reports").joinpath("templates/report.html").read_text(encoding="utf-8"))
    return page.substitute(
        title=html.escape(f"dspark-ci run {results.run_id}"),
        summary=_markdown_to_html(step_summary(results, regressions)),
        charts="<h2>Charts</h2>\n" + "\n".join(_figure(title, png) for title, png in charts) if charts else "",
        details=_markdown_to_html(pr_tables(results) + "\n" + render_cells(results, baseline, comparison_md)),
    )


# report.md marks statuses with emoji, which a browser without an emoji font (a bare CI runner, a headless
# browser, many Linux desktops) draws as empty boxes. The page draws each as a coloured badge of ASCII text instead:
# emoji -> (CSS class, badge text, what it means for a screen reader).
STATUS_MARKS: Mapping[str, tuple[str, str, str]] = {
    "✅": ("ok", "OK", "passed"), "❌": ("bad", "FAIL", "failed"), "💥": ("bad", "ERROR", "error"),
    "❔": ("unsure", "?", "inconclusive"), "⚠": ("warn", "!", "warning"), "⏭": ("skip", "SKIP", "skipped"),
    "🟢": ("ok", "+", "better"), "🔴": ("bad", "-", "worse"),
    "🔒": ("skip", "QUARANTINED", "quarantined"), "⏰": ("warn", "EXPIRED", "quarantine expired"),
}
# Any other pictograph (one added to report.md later): a neutral badge rather than a box.
_PICTOGRAPH = re.compile("([\u2600-\u27bf\u2b00-\u2bff\u23e9-\u23ff\U0001f000-\U0001faff])\ufe0f?")


def status_mark(emoji: str) -> str:
    css, text, meaning = STATUS_MARKS.get(emoji, ("other", "*", "note"))
    return f'<span class="mark {css}" role="img" aria-label="{meaning}">{text}</span>'


def _markdown_to_html(text: str) -> str:
    rendered = MarkdownIt("commonmark", {"html": False}).enable("table").render(text)
    return _PICTOGRAPH.sub(lambda found: status_mark(found.group(1)), rendered)


def _figure(title: str, png_base64: str) -> str:
    alt = html.escape(title, quote=True)
    return (f'<figure><img alt="{alt}" src="data:image/png;base64,{png_base64}">'
            f"<figcaption>{html.escape(title)}</figcaption></figure>")
