"""Two runs side by side: per cell and metric, old and new value, new/old, and whether that is better.

A change smaller than the metric's noise band (``dspark_ci.reports.metrics.noise_band``) reads "within noise",
so two runs of the same build do not come out as a list of gains and regressions.

``compare_runs`` gives a ``Comparison`` record (``to_dict`` is the ``--format json`` output, the only place it
becomes JSON); ``compare_markdown`` renders it as one table per cell.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dspark_ci.ground.identity import unlike
from dspark_ci.ground.records import CellResult, RunResults, Status
from dspark_ci.reports.markdown import status_text, table
from dspark_ci.reports.metrics import (
    HIGHER,
    LOWER,
    METRICS,
    NEUTRAL,
    NOISE_STDERRS,
    format_value,
    in_table_order,
    label,
    noise_band,
)

RATIO_DIGITS = 3


@dataclass(frozen=True)
class IdentityNote:
    """Whether the two measurements of a cell were taken the same way: ``comparable`` None when either run predates
    cell identities (nothing can be said); ``differs`` what changed ("argv, dataset"), or None."""

    comparable: bool | None
    differs: str | None
    old_build: str | None
    new_build: str | None


@dataclass(frozen=True)
class MetricChange:
    metric: str
    old: float | None
    new: float | None
    ratio: float | None  # new/old
    better: str  # HIGHER | LOWER | NEUTRAL
    noise: float | None  # the band in the metric's unit; None for a metric with no better direction
    change: str | None  # "better" | "worse" | "within_noise" | "same", or None (a side missing, or NEUTRAL)


@dataclass(frozen=True)
class CellComparison:
    id: str
    new_status: str
    old_status: str
    identity: IdentityNote
    metrics: tuple[MetricChange, ...]


@dataclass(frozen=True)
class Comparison:
    new_run: str
    old_run: str
    cells: tuple[CellComparison, ...]
    only_new: tuple[str, ...]
    only_old: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """The ``--format json`` object (lists where the record holds tuples)."""
        data = asdict(self)
        for cell in data["cells"]:
            cell["metrics"] = list(cell["metrics"])
        return {**data, "cells": list(data["cells"]), "only_new": list(self.only_new),
                "only_old": list(self.only_old)}


def compare_runs(new: RunResults, old: RunResults) -> Comparison:
    old_cells = {cell.id: cell for cell in old.cells}
    new_ids = [cell.id for cell in new.cells]
    return Comparison(
        new_run=new.run_id,
        old_run=old.run_id,
        cells=tuple(_compare_cell(cell, old_cells[cell.id]) for cell in new.cells if cell.id in old_cells),
        only_new=tuple(cell_id for cell_id in new_ids if cell_id not in old_cells),
        only_old=tuple(cell_id for cell_id in old_cells if cell_id not in new_ids),
    )


def _compare_cell(new_cell: CellResult, old_cell: CellResult) -> CellComparison:
    new_metrics, old_metrics = new_cell.metrics, old_cell.metrics
    names = in_table_order(set(new_metrics) | set(old_metrics))
    return CellComparison(new_cell.id, new_cell.status.value, old_cell.status.value,
                          _identity_note(new_cell, old_cell),
                          tuple(_compare_metric(name, new_metrics, old_metrics) for name in names))


def _identity_note(new_cell: CellResult, old_cell: CellResult) -> IdentityNote:
    new, old = new_cell.identity, old_cell.identity
    differs = unlike(new, old)
    return IdentityNote(None if new is None or old is None else differs is None, differs,
                        old.build if old else None, new.build if new else None)


def identity_warnings(comparison: Comparison) -> list[str]:
    """One line per cell whose two measurements were not taken the same way."""
    return [f"{cell.id}: not comparable, {cell.identity.differs} (setup changed between the runs)"
            for cell in comparison.cells if cell.identity.comparable is False]


def _compare_metric(name: str, new_metrics: Mapping, old_metrics: Mapping) -> MetricChange:
    new, old = new_metrics.get(name), old_metrics.get(name)
    better = METRICS[name].better if name in METRICS else NEUTRAL
    ratio = round(new / old, RATIO_DIGITS) if new is not None and old not in (None, 0) else None
    noise = round(noise_band(name, old_metrics, new_metrics), NOISE_DIGITS) if better != NEUTRAL else None
    return MetricChange(name, old, new, ratio, better, noise, _change(better, new, old, noise))


def _change(better: str, new, old, noise: float | None) -> str | None:
    """"better" | "worse" | "within_noise" | "same", or None when either side is missing or no direction
    is better."""
    if new is None or old is None or better == NEUTRAL:
        return None
    if new == old:
        return "same"
    if abs(new - old) < noise:
        return "within_noise"
    improved = new > old if better == HIGHER else new < old
    return "better" if improved else "worse"


NOISE_DIGITS = 6  # the band in the metric's unit; products such as 0.025 x 41.3 make long floats
CHANGE_TEXT = {"better": "🟢 better", "worse": "🔴 worse", "within_noise": "≈ within noise", "same": "same", None: ""}
BETTER_TEXT = {HIGHER: "higher", LOWER: "lower", NEUTRAL: ""}


def compare_markdown(comparison: Comparison) -> str:
    old_run, new_run = comparison.old_run, comparison.new_run
    parts = [f"## Compared with `{old_run}`", f"new/old: `{new_run}` over `{old_run}`. {_noise_rule()}"]
    for cell in comparison.cells:
        parts.append(f"### `{cell.id}`: {status_text(Status(cell.old_status))} → "
                     f"{status_text(Status(cell.new_status))}")
        parts.append(_identity_text(cell.identity))
        rows = [[label(m.metric), format_value(m.metric, m.old), format_value(m.metric, m.new),
                 "—" if m.ratio is None else f"{m.ratio:.{RATIO_DIGITS}f}", BETTER_TEXT[m.better],
                 CHANGE_TEXT[m.change]] for m in cell.metrics]
        parts.append(table(["Metric", "old", "new", "new/old", "Better", "Change"], rows) if rows else "No metrics.")
    for cell_ids, where in ((comparison.only_new, "only in the new run"), (comparison.only_old, "only in the old run")):
        if cell_ids:
            parts.append(f"Cells {where}: " + ", ".join(f"`{cell_id}`" for cell_id in cell_ids))
    return "\n\n".join(parts) + "\n"


def _identity_text(note: IdentityNote) -> str:
    if note.comparable is None:
        return "Identity: unknown (a run predates cell identities): the two may not have been measured the same way."
    if not note.comparable:
        return (f"**⚠️ NOT COMPARABLE: {note.differs}** between the runs; the ratios below compare unlike "
                "measurements.")
    builds = (f"build {note.old_build} → {note.new_build}" if note.old_build != note.new_build
              else f"same build ({note.new_build})")
    return f"Identity: same setup, {builds}."


def _noise_rule() -> str:
    """The noise rule in one sentence, with the headline bands read from the metric table."""
    band = {name: f"±{METRICS[name].noise * 100:g}%" for name in
            ("output_throughput_tok_s", "ttft_ms_median", "accept_length")}
    return (f"Changes smaller than noise read ≈ within noise: {band['output_throughput_tok_s']} throughput, "
            f"{band['ttft_ms_median']} median TTFT/TPOT, {band['accept_length']} accept length, "
            f"{NOISE_STDERRS:g}·√(se_old² + se_new²) GPQA accuracy (every band: reports/metrics.py).")
