"""Charts for report.html, as base64 PNG (the HTML carries them inline: no external files).

Horizontal bars, one group per cell (cell ids are long and read best on the y axis), value labels
on every bar, and each gate's threshold drawn as a red tick on the bar it applies to.
matplotlib's object API (``Figure``) is used directly, so no pyplot global state is touched.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dspark_ci.ground.records import CellResult, RunResults
from dspark_ci.reports.acceptance import acceptance_chart, envelope_chart
from dspark_ci.reports.history_db import same_setup_tail
from dspark_ci.reports.metrics import METRICS, format_value, label

if TYPE_CHECKING:
    from dspark_ci.reports.compare import Comparison

BAR_HEIGHT_IN = 0.28  # inches per bar
MAX_BARS = 100  # beyond this a chart is taller than anyone reads (and drawing it costs seconds: bench/results_scale.py)
WIDTH_IN = 9.0
DPI = 100
BETTER_COLOR, WORSE_COLOR, GATE_COLOR = "#2e7d32", "#c62828", "#d50000"


@dataclass(frozen=True)
class Chart:
    title: str
    xlabel: str
    metrics: tuple[str, ...]  # one bar per metric per cell
    error_bars: bool = False  # ±2 standard errors, for metrics that have one (dspark_ci.reports.metrics: Metric.stderr)

    def stderr_metric(self, metric: str) -> str | None:
        return METRICS[metric].stderr if self.error_bars else None


CHARTS = (
    Chart("Accept length", "accepted tokens per verify step (incl. bonus token)", ("accept_length",)),
    Chart("Output throughput", "tok/s", ("output_throughput_tok_s",)),
    Chart("Time to first token", "ms", ("ttft_ms_mean", "ttft_ms_median", "ttft_ms_p99")),
    Chart("Time per output token", "ms", ("tpot_ms_mean", "tpot_ms_median", "tpot_ms_p99")),
    Chart("GPQA accuracy", "accuracy (error bars: ±2 standard errors)", ("gpqa_accuracy",),
          error_bars=True),
)
RATIO_METRICS = ("accept_length", "output_throughput_tok_s", "ttft_ms_median", "tpot_ms_median", "gpqa_accuracy")


def run_charts(results: RunResults) -> list[tuple[str, str]]:
    """(title, base64 PNG) for each chart that has at least one measured value."""
    charts = []
    for chart in CHARTS:
        cells = [c for c in results.cells if any(c.metrics.get(m) is not None for m in chart.metrics)]
        shown = cells[:MAX_BARS // len(chart.metrics)]
        if shown:
            title = (chart.title if len(shown) == len(cells)
                     else f"{chart.title} (first {len(shown)} of {len(cells)} cells)")
            charts.append((title, _png(_metric_figure(chart, shown, title))))
    for cell in results.cells[:MAX_TREND_CELLS]:
        for title, draw in (("Acceptance by draft position", acceptance_chart),
                            ("Where speculation pays", envelope_chart)):
            figure = draw(cell)
            if figure is not None:
                charts.append((f"{title}: {cell.id}", _png(figure)))
    return charts


def ratio_chart(comparison: Comparison) -> tuple[str, str] | None:
    """new/old of the headline metrics per cell; green where the new run is better, red where worse,
    grey where the change is within noise (or there is none)."""
    bars = [(cell.id, m) for cell in comparison.cells for m in cell.metrics
            if m.metric in RATIO_METRICS and m.ratio is not None]
    bars = bars[:MAX_BARS]
    if not bars:
        return None
    from matplotlib.figure import Figure  # imported on use: the CLI stays quick for other verbs

    figure = Figure(figsize=(WIDTH_IN, 1.2 + BAR_HEIGHT_IN * len(bars)), dpi=DPI, layout="constrained")
    axes = figure.add_subplot()
    ys = list(range(len(bars)))[::-1]
    colors = [{"better": BETTER_COLOR, "worse": WORSE_COLOR}.get(m.change or "", "#9e9e9e") for _, m in bars]
    # Bars grow from 1.0 (no change), so a 3 % regression is as visible as a 3 % gain.
    container = axes.barh(ys, [(m.ratio if m.ratio is not None else 1.0) - 1.0 for _, m in bars], left=1.0,
                          color=colors)
    axes.bar_label(container, labels=[f"{m.ratio:.3f}" for _, m in bars], padding=3, fontsize=8)
    axes.set_yticks(ys, [f"{cell_id} · {label(m.metric)}" for cell_id, m in bars], fontsize=8)
    axes.axvline(1.0, color="black", linewidth=1)
    axes.set_title(f"new/old: {comparison.new_run} over {comparison.old_run}")
    axes.set_xlabel("ratio (green: better, red: worse, grey: within noise)")
    axes.margins(x=0.15)
    return "Compared with the old run", _png(figure)


def _metric_figure(chart: Chart, cells: list[CellResult], title: str):
    from matplotlib.figure import Figure  # imported on use: the CLI stays quick for other verbs

    per_cell = len(chart.metrics)
    group = per_cell + 1  # one empty slot between cells
    figure = Figure(figsize=(WIDTH_IN, 1.2 + BAR_HEIGHT_IN * group * len(cells)), dpi=DPI, layout="constrained")
    axes = figure.add_subplot()
    top = group * len(cells)
    for slot, metric in enumerate(chart.metrics):
        ys = [top - (i * group + slot) for i in range(len(cells))]
        values = [_number(c.metrics.get(metric)) for c in cells]
        xerr = _error_bars(chart, metric, cells)
        container = axes.barh(ys, values, height=0.85, xerr=xerr, label=label(metric) if per_cell > 1 else None,
                              capsize=3 if xerr else 0)
        axes.bar_label(container, labels=[_bar_text(metric, c) for c in cells], padding=3, fontsize=8)
        for y, value in zip(ys, values, strict=False):
            if math.isnan(value):  # no bar to label: say so where the bar would start
                axes.text(0, y, " not measured", va="center", fontsize=8, color="#616161")
        _gate_ticks(axes, metric, cells, ys)
    _keep_values_readable(axes, chart, cells)
    centers = [top - (i * group + (per_cell - 1) / 2) for i in range(len(cells))]
    axes.set_yticks(centers, [c.id for c in cells], fontsize=8)
    axes.set_title(title)
    axes.set_xlabel(chart.xlabel)
    axes.margins(x=0.15)
    if METRICS[chart.metrics[0]].fraction:  # an accuracy or a rate: the axis ends where the quantity does
        axes.set_xlim(0, 1)
        axes.xaxis.set_major_formatter(lambda x, _: f"{x:.0%}")
    handles, _ = axes.get_legend_handles_labels()
    if handles:
        axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return figure


OFF_SCALE = 3.0  # a gate beyond this many times the largest measured value is written at the edge, not drawn


def _keep_values_readable(axes, chart: Chart, cells: list[CellResult]) -> None:
    """A generous absolute limit (TTFT <= 2000 ms for a 10 ms TTFT) drawn to scale would flatten every bar to a
    sliver: the axis then ends a little past the measured values and the far gate is named at the right edge."""
    if METRICS[chart.metrics[0]].fraction:  # drawn on [0, 100 %] whatever the gates
        return
    measured = [value + 2 * float(c.metrics.get(chart.stderr_metric(m) or "") or 0.0)
                for c in cells for m in chart.metrics if (value := c.metrics.get(m)) is not None]
    if not measured or max(measured) <= 0:
        return
    limit = max(measured) * 1.3
    far = sorted({g.threshold for c in cells for g in c.gates if g.metric in chart.metrics
                  and g.threshold > OFF_SCALE * max(measured)})
    if not far:
        return
    axes.set_xlim(0, limit)
    names = ", ".join(format_value(chart.metrics[0], t) for t in far)
    axes.text(1.0, 1.01, f"gate at {names} (off scale) ▸", transform=axes.transAxes, ha="right", va="bottom",
              fontsize=8, color=GATE_COLOR)


def _gate_ticks(axes, metric: str, cells: list[CellResult], ys: Sequence[float]) -> None:
    for y, cell in zip(ys, cells, strict=False):
        for gate in cell.gates:
            if gate.metric == metric:
                axes.plot([gate.threshold] * 2, [y - 0.5, y + 0.5], color=GATE_COLOR, linewidth=2,
                          label="gate" if not _has_label(axes, "gate") else None)


def _has_label(axes, text: str) -> bool:
    return text in axes.get_legend_handles_labels()[1]


def _error_bars(chart: Chart, metric: str, cells: list[CellResult]) -> list[list[float]] | None:
    """±2 SE as (below, above) per bar; a fraction's bars stop at 0 and 100 % (what an accuracy can be)."""
    stderr_metric = chart.stderr_metric(metric)
    if not stderr_metric:
        return None
    spans = [2 * (c.metrics.get(stderr_metric) or 0.0) for c in cells]
    if not METRICS[metric].fraction:
        return [spans, spans]
    values = [_number(c.metrics.get(metric)) for c in cells]
    return [[0.0 if math.isnan(v) else min(s, v) for s, v in zip(spans, values, strict=False)],
            [0.0 if math.isnan(v) else min(s, 1.0 - v) for s, v in zip(spans, values, strict=False)]]


def _bar_text(metric: str, cell: CellResult) -> str:
    value = cell.metrics.get(metric)
    return "" if value is None else format_value(metric, value)


def _number(value) -> float:
    return math.nan if value is None else float(value)


def _png(figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return base64.b64encode(buffer.getvalue()).decode("ascii")


TREND_METRICS = ("accept_length", "output_throughput_tok_s", "tpot_ms_median", "gpqa_accuracy")
MAX_TREND_CELLS = 20  # trend figures are one per cell: past this, a page of them is read by nobody


def _mark_change_points(axes, metric: str, points: list) -> None:
    """A dashed line where the level changed (over the runs of the newest setup), labelled with the run and the
    shift; a drift shades the runs it took."""
    from dspark_ci.reports.change_points import change_points  # on use, with numpy: only report.html's trends draw them

    comparable, _ = same_setup_tail(points)
    offset = len(points) - len(comparable)
    where = {p.run_id: offset + i for i, p in enumerate(comparable)}
    for change in change_points(metric, comparable):
        x, settled = where[change.run_id], where[change.last_run_id]
        color = WORSE_COLOR if change.worse else BETTER_COLOR if change.worse is False else "#616161"
        axes.axvline(x - 0.5, color=color, linestyle="--", linewidth=1)
        if settled > x:
            axes.axvspan(x - 0.5, settled + 0.5, color=color, alpha=0.08)
        shift = f"{change.relative:+.1%}" if change.relative is not None else ""
        axes.annotate(f"change from {change.run_id} {shift}", (x - 0.5, 1.0), xycoords=("data", "axes fraction"),
                      xytext=(3, -10), textcoords="offset points", fontsize=7, color=color)


def trend_charts(trends: dict[str, dict[str, list]]) -> list[tuple[str, str]]:
    """(title, base64 PNG) per cell with at least two recorded runs of a trend metric: one panel per metric,
    one point per run (oldest left), GPQA with ±2 SE error bars clipped to [0, 100 %].
    ``trends``: cell id -> metric -> points with ``run_id`` and ``value`` (``dspark_ci.reports.history_db.series``)."""
    charts = []
    for cell_id, by_metric in list(trends.items())[:MAX_TREND_CELLS]:
        shown = [m for m in TREND_METRICS if len(by_metric.get(m) or ()) >= 2]
        if shown:
            charts.append((f"Trend: {cell_id}", _png(_trend_figure(cell_id, shown, by_metric))))
    return charts


def _trend_figure(cell_id: str, metrics: list[str], by_metric: dict[str, list]):
    from matplotlib.figure import Figure  # imported on use: the CLI stays quick for other verbs

    figure = Figure(figsize=(WIDTH_IN, 2.2 * len(metrics) + 0.6), dpi=DPI, layout="constrained")
    panels = figure.subplots(len(metrics), 1, squeeze=False)[:, 0]
    for axes, metric in zip(panels, metrics, strict=False):
        points = by_metric[metric]
        xs = list(range(len(points)))
        values = [p.value for p in points]
        errors = by_metric.get(METRICS[metric].stderr or "", [])
        if METRICS[metric].fraction and len(errors) == len(points):
            # ±2 SE, clipped to what an accuracy can be: [0, 1].
            low = [min(2 * e.value, v) for v, e in zip(values, errors, strict=False)]
            high = [min(2 * e.value, 1 - v) for v, e in zip(values, errors, strict=False)]
            axes.errorbar(xs, values, yerr=[low, high], marker="o", capsize=3)
        else:
            axes.plot(xs, values, marker="o")
        for x, value in zip(xs, values, strict=False):
            axes.annotate(format_value(metric, value), (x, value), textcoords="offset points", xytext=(0, 6),
                          ha="center", fontsize=7)
        _mark_change_points(axes, metric, points)
        axes.set_ylabel(label(metric), fontsize=8)
        axes.set_xticks(xs, [p.run_id for p in points], rotation=30, ha="right", fontsize=7)
        axes.margins(y=0.25)
        if METRICS[metric].fraction:
            axes.yaxis.set_major_formatter(lambda y, _: f"{y:.0%}")
    panels[0].set_title(f"{cell_id}: across recorded runs (oldest left)")
    return figure
