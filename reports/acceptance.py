"""A speculative cell's acceptance as the report shows it: per draft position, per category, the accept-length
histogram, drift within the run and sampled losslessness (results.json ``acceptance``, suites/accept_detail.py).

Markdown here; the per-position chart is ``acceptance_chart`` (matplotlib, imported only when a page is drawn).
"""

from __future__ import annotations

from typing import Mapping

from ground.records import CellResult
from reports.metrics import format_value

SHOWN_POSITIONS = 8


def _rate(value) -> str:
    return "—" if value is None else f"{value:.1%}"


def acceptance_section(cell: CellResult) -> str:
    detail = cell.acceptance
    if not detail:
        return ""
    parts = [f"**Acceptance** on workload `{(detail.get('workload') or {}).get('source', '?')}` at temperature "
             f"{detail.get('temperature', 0):g}; per-position figures from {detail.get('positions_source')}."]
    positions = list(detail.get("positions") or [])[:SHOWN_POSITIONS]
    if positions:
        parts.append(_table(["Draft position", *[str(row["position"]) for row in positions]],
                            [["Accepted / proposed", *[_rate(row["rate"]) for row in positions]],
                             ["Accepted of proposed", *[f"{row['accepted']}/{row['proposed']}" for row in positions]]]))
    parts.append(_categories(detail.get("categories") or {}, len(positions)))
    histogram = detail.get("accept_length_histogram") or {}
    if histogram:
        total = sum(histogram.values())
        parts.append("Accept-length histogram (verify steps by tokens per step): " + ", ".join(
            f"{length}: {count} ({count / total:.0%})" for length, count in sorted(histogram.items(), key=lambda i: int(i[0]))))
    parts += [_drift_line(detail.get("drift") or {}), _sampled_line(detail), _lossless_line(detail.get("lossless"))]
    return "\n\n".join(part for part in parts if part)


def _categories(categories: Mapping, depth: int) -> str:
    if not categories:
        return ""
    shown = min(depth, 4)
    rows = [[name, str(info.get("requests")), format_value("accept_length", info.get("accept_length")),
             *[_rate(row["rate"]) for row in list(info.get("positions") or [])[:shown]]]
            for name, info in categories.items()]
    return _table(["Category", "Requests", "Accept length", *[f"pos {k}" for k in range(1, shown + 1)]], rows)


def _drift_line(drift: Mapping) -> str:
    if not drift:
        return ""
    if drift.get("change_at_request") is None:
        return f"Drift within the run: none found over {drift.get('requests')} requests ({drift.get('method')})."
    return (f"⚠️ Drift within the run: accept length moved from {drift['before']:.2f} to {drift['after']:.2f} at "
            f"request {drift['change_at_request']} of {drift.get('requests')} (in sent order; {drift.get('method')}).")


def _sampled_line(detail: Mapping) -> str:
    sampled = detail.get("sampled")
    if not sampled:
        return ""
    return (f"At temperature {sampled['temperature']:g}, top_p {sampled.get('top_p')}: accept length "
            f"{format_value('accept_length', sampled.get('accept_length'))}; per position "
            + ", ".join(_rate(row["rate"]) for row in list(sampled.get("positions") or [])[:SHOWN_POSITIONS]) + ".")


def _lossless_line(lossless: Mapping | None) -> str:
    if not lossless:
        return ""
    if lossless.get("skipped"):
        return f"Sampled losslessness: not measured ({lossless['skipped']})."
    spec, ref = lossless["speculative"], lossless["reference"]
    return (f"Sampled losslessness: {spec['greedy_like']}/{spec['samples']} samples equal the greedy text with "
            f"speculation, {ref['greedy_like']}/{ref['samples']} without (first {lossless['tokens']} tokens, "
            f"{lossless['prompts']} prompts, temperature {lossless['temperature']:g}); greedy output equal on "
            f"{lossless['greedy_equal']}/{lossless['prompts']} prompts.")


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def acceptance_chart(cell: CellResult):
    """A figure: accepted / proposed by draft position, one line per category and the whole workload; None
    without per-position figures."""
    detail = cell.acceptance or {}
    positions = detail.get("positions") or []
    if not positions:
        return None
    from matplotlib.figure import Figure  # only when a page is drawn

    figure = Figure(figsize=(7, 3.5), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    axes.plot([row["position"] for row in positions], [row["rate"] for row in positions], "k-o", label="all")
    for name, info in (detail.get("categories") or {}).items():
        rows = info.get("positions") or []
        axes.plot([row["position"] for row in rows], [row["rate"] for row in rows], "--", marker=".", label=name)
    axes.set_xlabel("draft position")
    axes.set_ylabel("accepted / proposed")
    axes.set_ylim(0, 1)
    axes.legend(fontsize="small")
    return figure


def envelope_section(cell: CellResult) -> str:
    """Where speculation pays: the speedup at each (input length, concurrency) and the boundary per input length."""
    envelope = cell.envelope
    if not envelope:
        return ""
    points = list(envelope.get("points") or [])
    concurrencies = sorted({p["concurrency"] for p in points})
    rows = []
    for length, found in sorted((envelope.get("boundaries") or {}).items(), key=lambda item: int(item[0])):
        by_c = {p["concurrency"]: p for p in points if p["input_len"] == int(length)}
        value = found.get("concurrency")
        edge = "—" if value is None else f"≥ {value:.0f} (every point pays)" if found.get("censored") else f"{value:.0f}"
        rows.append([length, *[_speedup(by_c.get(c)) for c in concurrencies], edge])
    return (f"**Where speculation pays** (speedup = median TPOT without speculation / with it, on "
            f"{envelope.get('dataset')}; accept figures on random text are not draft quality):\n\n"
            + _table(["Input tokens", *[f"c={c}" for c in concurrencies], "Pays up to concurrency"], rows))


def _speedup(point: Mapping | None) -> str:
    if not point or point.get("speedup") is None:
        return "—"
    stderr = point.get("speedup_stderr")
    return f"{point['speedup']:.2f}" + (f" ± {stderr:.2f}" if stderr is not None else "")


def envelope_chart(cell: CellResult):
    """A figure: speedup against concurrency (log), one line per input length, the line where it falls to 1."""
    envelope = cell.envelope or {}
    points = [p for p in envelope.get("points") or [] if p.get("speedup") is not None]
    if not points:
        return None
    from matplotlib.figure import Figure  # only when a page is drawn

    figure = Figure(figsize=(7, 3.5), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    for length in sorted({p["input_len"] for p in points}):
        row = sorted((p for p in points if p["input_len"] == length), key=lambda p: p["concurrency"])
        axes.errorbar([p["concurrency"] for p in row], [p["speedup"] for p in row],
                      yerr=[2 * (p.get("speedup_stderr") or 0) for p in row], marker="o", capsize=3,
                      label=f"{length} input tokens")
    axes.axhline(1.0, color="#d50000", linestyle="--", label="speculation stops paying")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("concurrency")
    axes.set_ylabel("speedup over no speculation")
    axes.legend(fontsize="small")
    return figure
