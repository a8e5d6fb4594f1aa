"""Two runs side by side: per cell and metric, old and new value, new/old, and whether that is better.

``compare_runs`` gives plain data (also the ``--format json`` output); ``compare_markdown``
renders it as one table per cell.
"""

from __future__ import annotations

from reports.markdown import status_text, table
from reports.metrics import HIGHER, LOWER, METRICS, NEUTRAL, format_value, in_table_order, label

RATIO_DIGITS = 3


def compare_runs(new: dict, old: dict) -> dict:
    old_cells = {cell["id"]: cell for cell in old["cells"]}
    new_ids = [cell["id"] for cell in new["cells"]]
    return {
        "new_run": new.get("run_id"),
        "old_run": old.get("run_id"),
        "cells": [_compare_cell(cell, old_cells[cell["id"]]) for cell in new["cells"] if cell["id"] in old_cells],
        "only_new": [cell_id for cell_id in new_ids if cell_id not in old_cells],
        "only_old": [cell_id for cell_id in old_cells if cell_id not in new_ids],
    }


def _compare_cell(new_cell: dict, old_cell: dict) -> dict:
    new_metrics, old_metrics = new_cell.get("metrics") or {}, old_cell.get("metrics") or {}
    names = in_table_order(set(new_metrics) | set(old_metrics))
    return {"id": new_cell["id"], "new_status": new_cell["status"], "old_status": old_cell["status"],
            "metrics": [_compare_metric(name, new_metrics.get(name), old_metrics.get(name)) for name in names]}


def _compare_metric(name: str, new, old) -> dict:
    better = METRICS[name].better if name in METRICS else NEUTRAL
    ratio = round(new / old, RATIO_DIGITS) if new is not None and old not in (None, 0) else None
    return {"metric": name, "old": old, "new": new, "ratio": ratio, "better": better,
            "change": _change(better, new, old)}


def _change(better: str, new, old) -> str | None:
    """"better" | "worse" | "same", or None when either side is missing or no direction is better."""
    if new is None or old is None or better == NEUTRAL:
        return None
    if new == old:
        return "same"
    improved = new > old if better == HIGHER else new < old
    return "better" if improved else "worse"


CHANGE_TEXT = {"better": "🟢 better", "worse": "🔴 worse", "same": "same", None: ""}
BETTER_TEXT = {HIGHER: "higher", LOWER: "lower", NEUTRAL: ""}


def compare_markdown(comparison: dict) -> str:
    old_run, new_run = comparison["old_run"], comparison["new_run"]
    parts = [f"## Compared with `{old_run}`", f"new/old: `{new_run}` over `{old_run}`."]
    for cell in comparison["cells"]:
        parts.append(f"### `{cell['id']}`: {status_text(cell['old_status'])} → {status_text(cell['new_status'])}")
        rows = [[label(m["metric"]), format_value(m["metric"], m["old"]), format_value(m["metric"], m["new"]),
                 "—" if m["ratio"] is None else f"{m['ratio']:.{RATIO_DIGITS}f}", BETTER_TEXT[m["better"]],
                 CHANGE_TEXT[m["change"]]] for m in cell["metrics"]]
        parts.append(table(["Metric", "old", "new", "new/old", "Better", "Change"], rows) if rows else "No metrics.")
    for key, where in (("only_new", "only in the new run"), ("only_old", "only in the old run")):
        if comparison[key]:
            parts.append(f"Cells {where}: " + ", ".join(f"`{cell_id}`" for cell_id in comparison[key]))
    return "\n\n".join(parts) + "\n"
