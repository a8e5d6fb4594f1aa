"""A speculative cell's acceptance as the report shows it: per draft position, per category, the accept-length
histogram, drift within the run and sampled losslessness (results.json ``acceptance``, suites/accept_detail.py).

Markdown here; the per-position chart is ``acceptance_chart`` (matplotlib, imported only when a page is drawn).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from dspark_ci.ground.measurements import AcceptCategory, AcceptDrift, EnvelopePoint, Lossless, SampledAcceptance
from dspark_ci.ground.position_homogeneity import ENDED, POOLED, PositionTest
from dspark_ci.ground.records import CellResult
from dspark_ci.reports.metrics import format_value

SHOWN_POSITIONS = 8


def _plotted(value: float | None) -> float:
    return math.nan if value is None else value  # a gap in the line


def _rate(value) -> str:
    return "—" if value is None else f"{value:.1%}"


def acceptance_section(cell: CellResult) -> str:
    detail = cell.acceptance
    if detail is None:
        return ""
    parts = [f"**Acceptance** on workload `{detail.workload.get('source', '?')}` at temperature "
             f"{detail.temperature:g}; per-position figures from {detail.positions_source}."]
    positions = detail.positions[:SHOWN_POSITIONS]
    if positions:
        parts.append(_table(["Draft position", *[str(row.position) for row in positions]],
                            [["Accepted / proposed", *[_rate(row.rate) for row in positions]],
                             ["Accepted of proposed", *[f"{row.accepted}/{row.proposed}" for row in positions]]]))
    parts.append(_categories(detail.categories, len(positions)))
    histogram = detail.accept_length_histogram
    if histogram:
        total = sum(histogram.values())
        parts.append("Accept-length histogram (verify steps by tokens per step): " + ", ".join(
            f"{length}: {count} ({count / total:.0%})"
            for length, count in sorted(histogram.items(), key=lambda i: int(i[0]))))
    parts += [_drift_line(detail.drift), _sampled_line(detail.sampled), _lossless_line(detail.lossless)]
    return "\n\n".join(part for part in parts if part)


def _categories(categories: Mapping[str, AcceptCategory], depth: int) -> str:
    if not categories:
        return ""
    shown = min(depth, 4)
    rows = [[name, str(info.requests), format_value("accept_length", info.accept_length),
             *[_rate(row.rate) for row in info.positions[:shown]]]
            for name, info in categories.items()]
    return _table(["Category", "Requests", "Accept length", *[f"pos {k}" for k in range(1, shown + 1)]], rows)


def _drift_line(drift: AcceptDrift | None) -> str:
    if drift is None:
        return ""
    if drift.change_at_request is None:
        return f"Drift within the run: none found over {drift.requests} requests ({drift.method})."
    return (f"⚠️ Drift within the run: accept length moved from {drift.before:.2f} to {drift.after:.2f} at "
            f"request {drift.change_at_request} of {drift.requests} (in sent order; {drift.method}).")


def _sampled_line(sampled: SampledAcceptance | None) -> str:
    if sampled is None:
        return ""
    return (f"At temperature {sampled.temperature:g}, top_p {sampled.top_p}: accept length "
            f"{format_value('accept_length', sampled.accept_length)}; per position "
            + ", ".join(_rate(row.rate) for row in sampled.positions[:SHOWN_POSITIONS]) + ".")


def _lossless_line(lossless: Lossless | None) -> str:
    if lossless is None:
        return ""
    if lossless.skipped:
        return f"Sampled losslessness: not measured ({lossless.skipped})."
    lines = [f"Sampled losslessness ({lossless.prompts} prompts × {lossless.samples} draws per side, temperature "
             f"{lossless.temperature:g}, top_p {lossless.top_p}, positions 2..{lossless.tokens}): "
             f"{len(lossless.positions)} per-position chi-square tests, {lossless.untested} positions untested "
             f"(one token, or too thin for 5 expected draws), family p {_p(lossless.family_p)} (Holm; the gate "
             "reads it at its α)."]
    shown = sorted(lossless.positions, key=lambda t: t.p_value)[:SHOWN_TESTS]
    if shown:
        lines.append(_table(["Prompt", "Position", "Token", "With speculation", "Without", "χ² (df)", "p", "Holm p"],
                            [[str(t.prompt), str(t.position), _token(t),
                              f"{t.speculative_share:.0%}", f"{t.reference_share:.0%}", f"{t.statistic:.1f} ({t.dof})",
                              _p(t.p_value), _p(t.adjusted_p)] for t in shown]))
    spec, ref = lossless.speculative, lossless.reference
    if spec is not None and ref is not None:
        lines.append(f"Draws equal to the greedy text (a figure, not the test): {spec.greedy_like}/{spec.samples} "
                     f"with speculation, {ref.greedy_like}/{ref.samples} without; greedy output equal on "
                     f"{lossless.greedy_equal}/{lossless.prompts} prompts.")
    return "\n\n".join(lines)


SHOWN_TESTS = 3  # the most significant per-position tests the report lists


def _p(value: float | None) -> str:
    return "—" if value is None else f"{value:.2g}"


def _token(test: PositionTest) -> str:
    return {ENDED: "(end)", POOLED: "(rare, pooled)"}.get(test.token, test.token_shown)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def acceptance_chart(cell: CellResult):
    """A figure: accepted / proposed by draft position, one line per category and the whole workload; None
    without per-position figures."""
    detail = cell.acceptance
    if detail is None or not detail.positions:
        return None
    from matplotlib.figure import Figure  # only when a page is drawn

    figure = Figure(figsize=(7, 3.5), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    axes.plot([row.position for row in detail.positions], [_plotted(row.rate) for row in detail.positions], "k-o",
              label="all")
    for name, info in detail.categories.items():
        axes.plot([row.position for row in info.positions], [_plotted(row.rate) for row in info.positions], "--",
                  marker=".", label=name)
    axes.set_xlabel("draft position")
    axes.set_ylabel("accepted / proposed")
    axes.set_ylim(0, 1)
    axes.legend(fontsize="small")
    return figure


def envelope_section(cell: CellResult) -> str:
    """Where speculation pays: the speedup at each (input length, concurrency) and the boundary per input length."""
    envelope = cell.envelope
    if envelope is None:
        return ""
    points = envelope.points
    concurrencies = sorted({p.concurrency for p in points})
    rows = []
    for length, found in sorted(envelope.boundaries.items(), key=lambda item: int(item[0])):
        by_c = {p.concurrency: p for p in points if p.input_len == int(length)}
        value = found.concurrency
        edge = "—" if value is None else f"≥ {value:.0f} (every point pays)" if found.censored else f"{value:.0f}"
        rows.append([length, *[_speedup(by_c.get(c)) for c in concurrencies], edge])
    return (f"**Where speculation pays** (speedup = median TPOT without speculation / with it, on "
            f"{envelope.dataset}; accept figures on random text are not draft quality):\n\n"
            + _table(["Input tokens", *[f"c={c}" for c in concurrencies], "Pays up to concurrency"], rows))


def _speedup(point: EnvelopePoint | None) -> str:
    if point is None or point.speedup is None:
        return "—"
    stderr = point.speedup_stderr
    return f"{point.speedup:.2f}" + (f" ± {stderr:.2f}" if stderr is not None else "")


def envelope_chart(cell: CellResult):
    """A figure: speedup against concurrency (log), one line per input length, the line where it falls to 1."""
    points = [p for p in (cell.envelope.points if cell.envelope else ()) if p.speedup is not None]
    if not points:
        return None
    from matplotlib.figure import Figure  # only when a page is drawn

    figure = Figure(figsize=(7, 3.5), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    for length in sorted({p.input_len for p in points}):
        row = sorted((p for p in points if p.input_len == length), key=lambda p: p.concurrency)
        axes.errorbar([p.concurrency for p in row], [_plotted(p.speedup) for p in row],
                      yerr=[2 * (p.speedup_stderr or 0) for p in row], marker="o", capsize=3,
                      label=f"{length} input tokens")
    axes.axhline(1.0, color="#d50000", linestyle="--", label="speculation stops paying")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("concurrency")
    axes.set_ylabel("speedup over no speculation")
    axes.legend(fontsize="small")
    return figure
