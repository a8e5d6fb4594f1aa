"""report.html of a large run is rendered a piece at a time (markdown-it holds ~100x the text as tokens): the page
must be exactly the one a single render gives, code fences, headings inside them and tables cut between rows
included."""

from __future__ import annotations

from dspark_ci.ground.records import CellResult, GateResult, RunResults, Status
from dspark_ci.ground.sglang.settings import CellConfig
from dspark_ci.reports import html
from dspark_ci.reports.markdown import pr_tables, render_cells, step_summary
from markdown_it import MarkdownIt


def large_run(cells: int) -> RunResults:
    statuses = (Status.PASSED, Status.FAILED, Status.ERROR)
    return RunResults(run_id="r", started_at=None, finished_at=None, launcher="local",
                      matrices=("m.yaml",), cells=tuple(
        CellResult(id=f"cell-{i:04d}", config=CellConfig(model="m", tp=8, speculative_algorithm="DSPARK"),
                   expect={"outcome": "serve"}, status=statuses[i % 3],
                   metrics={"accept_length": 3.1, "output_throughput_tok_s": 812.4, "ttft_ms_mean": 41.0},
                   gates=(GateResult("output_throughput_tok_s", ">=", 900.0, 812.4, False),),
                   error="rank 1 exited\n# not a heading | nor a row" if i % 3 == 2 else None)
        for i in range(cells)))


def whole(text: str) -> str:
    rendered = MarkdownIt("commonmark", {"html": False}).enable("table").render(text)
    return html._PICTOGRAPH.sub(lambda found: html.status_mark(found.group(1)), rendered)


def test_a_large_runs_page_is_the_one_a_single_render_gives():
    results = large_run(3 * html.PIECE_LINES)
    for text in (step_summary(results), pr_tables(results) + "\n" + render_cells(results)):
        assert len(list(html._pieces(text.splitlines(keepends=True)))) > 2  # it was cut
        assert html._markdown_to_html(text) == whole(text)


def test_fences_headings_in_them_and_long_tables_survive_the_cuts():
    rows = "".join(f"| {i} | `a|b` |\n" for i in range(2 * html.PIECE_LINES + 5))
    text = ("# one\n\n```\n# inside a fence\n```\n\n## two\n\n~~~~\n~~~\n# still inside\n~~~~\n\n"
            f"| n | v |\n|---|:-:|\n{rows}\nafter\n\n- a list\n\n- loose\n# three\n")
    parts = [part for _, part in html._pieces(text.splitlines(keepends=True))]
    assert parts.count("first") == 1 and parts.count("last") == 1  # the table was cut between its rows
    assert html._markdown_to_html(text) == whole(text)
    assert html._markdown_to_html(text).count("<table>") == 1
