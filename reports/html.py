"""report.html: one self-contained page (inline CSS, charts as base64 PNG, no external assets).

The text is report.md rendered with markdown-it (raw HTML disabled, so an error message can never
inject markup), so the page and the markdown always say the same thing; the charts go after the
summary.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator, Mapping
from importlib import resources
from string import Template

from dspark_ci.ground.records import RunResults
from dspark_ci.reports.baseline_file import Baseline
from dspark_ci.reports.compare import Comparison
from dspark_ci.reports.markdown import pr_tables, render_cells, step_summary
from dspark_ci.reports.plots import ratio_chart, run_charts, trend_charts
from markdown_it import MarkdownIt


def render_html(results: RunResults, baseline: Baseline | None = None, comparison: Comparison | None = None,
                comparison_md: str | None = None, trends: dict | None = None,
                regressions: Mapping | None = None) -> str:
    charts = run_charts(results)
    if comparison is not None:
        charts.extend(chart for chart in [ratio_chart(comparison)] if chart)
    charts.extend(trend_charts(trends or {}))
    page = Template(resources.files("dspark_ci.reports").joinpath("templates/report.html").read_text(encoding="utf-8"))
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
    markdown = MarkdownIt("commonmark", {"html": False}).enable("table")
    rendered = "".join(_piece_html(markdown, lines, part) for lines, part in _pieces(text.splitlines(keepends=True)))
    return _PICTOGRAPH.sub(lambda found: status_mark(found.group(1)), rendered)


# markdown-it holds ~100 times the text it renders as tokens until the page is done (1 GB for a 10 000-cell run):
# the text is rendered this many lines at a time. It is cut only where rendering apart changes nothing: before a
# heading outside a code fence, and between the rows of a table (each part keeps the header; the parts' HTML is
# joined back into one table).
PIECE_LINES = 400
_HEADING = re.compile(r"#{1,6}(?:[ \t]|$)")
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")
_TABLE_DELIMITER = re.compile(r"\|(?: *:?-+:? *\|)+ *$")
_TABLE_BODY = "<tbody>\n", "</tbody>\n</table>\n"


def _pieces(lines: list[str]) -> Iterator[tuple[list[str], str]]:
    """(lines, part) to render one after the other: part is "" (as they are), or "first", "middle", "last" of
    a table cut between its rows."""
    piece: list[str] = []
    for section in _sections(lines):
        if len(piece) + len(section) > PIECE_LINES and piece:
            yield piece, ""
            piece = []
        if len(section) <= PIECE_LINES:
            piece += section
            continue
        yield from _table_parts(section)
    if piece:
        yield piece, ""


def _sections(lines: list[str]) -> Iterator[list[str]]:
    """``lines`` cut before every heading that is not inside a code fence."""
    section: list[str] = []
    fence: str | None = None
    for line in lines:
        if fence is None and _HEADING.match(line) and section:
            yield section
            section = []
        fence = _fence_after(fence, line)
        section.append(line)
    if section:
        yield section


def _fence_after(fence: str | None, line: str) -> str | None:
    """The code fence open after ``line`` (CommonMark: closed by a line of the same character, at least as long)."""
    found = _FENCE.match(line)
    if fence is None:
        return found.group(1) if found else None
    closes = found and found.group(1)[0] == fence[0] and len(found.group(1)) >= len(fence) and \
        not line[found.end():].strip()
    return None if closes else fence


def _table_parts(section: list[str]) -> Iterator[tuple[list[str], str]]:
    """A long section: its long tables (rows all starting with "|", after a blank line) cut between their rows."""
    start = 0
    for head, end in _long_tables(section):
        if head > start:
            yield section[start:head], ""
        header, rows = section[head:head + 2], section[head + 2:end]
        chunks = [rows[i:i + PIECE_LINES] for i in range(0, len(rows), PIECE_LINES)]
        for index, chunk in enumerate(chunks):
            yield header + chunk, "first" if index == 0 else "last" if index == len(chunks) - 1 else "middle"
        start = end
    if start < len(section):
        yield section[start:], ""


def _long_tables(section: list[str]) -> Iterator[tuple[int, int]]:
    """(header line, end) of every table in ``section`` longer than PIECE_LINES that can be cut safely."""
    index = 0
    while index + 1 < len(section):
        after_blank = index == 0 or not section[index - 1].strip()
        if after_blank and section[index].startswith("|") and _TABLE_DELIMITER.match(section[index + 1]):
            end = index + 2
            while end < len(section) and section[end].startswith("|"):
                end += 1
            if end - index > PIECE_LINES and (end == len(section) or not section[end].strip()):
                yield index, end
            index = end
        else:
            index += 1


def _piece_html(markdown: MarkdownIt, lines: list[str], part: str) -> str:
    rendered = markdown.render("".join(lines))
    opening, closing = _TABLE_BODY
    if part in ("middle", "last"):
        rendered = rendered[rendered.index(opening) + len(opening):]
    if part in ("first", "middle"):
        rendered = rendered.removesuffix(closing)
    return rendered


def _figure(title: str, png_base64: str) -> str:
    alt = html.escape(title, quote=True)
    return (f'<figure><img alt="{alt}" src="data:image/png;base64,{png_base64}">'
            f"<figcaption>{html.escape(title)}</figcaption></figure>")
