"""The metric names of CONTRACT.md, and everything reports need to know about each one.

One table: which direction is better (decides which ratio gates make sense and how a comparison
reads), how to label and format a value. Anything else in reports looks metrics up here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HIGHER, LOWER, NEUTRAL = "higher", "lower", "neutral"  # which direction is better


@dataclass(frozen=True)
class Metric:
    better: str  # HIGHER | LOWER | NEUTRAL (a count or a setting: no direction is better)
    label: str  # column / axis label
    fmt: str  # format spec for one value
    group: str  # "quality" (accuracy-style table) | "speed" (latency/throughput table) | "info"
    fraction: bool = False  # a share in [0, 1] (people tend to write 62 for 62%)


METRICS: dict[str, Metric] = {
    "gpqa_accuracy": Metric(HIGHER, "GPQA accuracy", ".1%", "quality", fraction=True),
    "gpqa_stderr": Metric(LOWER, "GPQA stderr", ".1%", "info", fraction=True),
    "gpqa_num_questions": Metric(NEUTRAL, "GPQA questions", ".0f", "info"),
    "gpqa_repeats": Metric(NEUTRAL, "GPQA repeats", ".0f", "info"),
    "accept_length": Metric(HIGHER, "Accept length", ".2f", "quality"),
    "accept_rate": Metric(HIGHER, "Accept rate", ".1%", "quality", fraction=True),
    "ttft_ms_mean": Metric(LOWER, "Avg TTFT (ms)", ".1f", "speed"),
    "ttft_ms_median": Metric(LOWER, "Median TTFT (ms)", ".1f", "speed"),
    "ttft_ms_p99": Metric(LOWER, "P99 TTFT (ms)", ".1f", "speed"),
    "tpot_ms_mean": Metric(LOWER, "Avg TPOT (ms)", ".2f", "speed"),
    "tpot_ms_median": Metric(LOWER, "Median TPOT (ms)", ".2f", "speed"),
    "tpot_ms_p99": Metric(LOWER, "P99 TPOT (ms)", ".2f", "speed"),
    "itl_ms_mean": Metric(LOWER, "Avg ITL (ms)", ".2f", "speed"),
    "e2e_latency_s_mean": Metric(LOWER, "Avg Lat (s)", ".3f", "speed"),
    "output_throughput_tok_s": Metric(HIGHER, "Avg Thpt (tok/s)", ".2f", "speed"),
    "input_tokens_mean": Metric(NEUTRAL, "Avg In", ".0f", "speed"),
    "output_tokens_mean": Metric(NEUTRAL, "Avg Out", ".0f", "speed"),
    "parity_mismatches": Metric(LOWER, "Parity mismatches", ".0f", "quality"),
}

# A metric whose sampling error is measured alongside it (for gates that respect noise).
STDERR_OF: dict[str, str] = {"gpqa_accuracy": "gpqa_stderr"}

# The SGLang-style speed line of a cell, in the order SGLang PRs print it.
SPEED_LINE = ("e2e_latency_s_mean", "ttft_ms_mean", "tpot_ms_mean", "output_throughput_tok_s",
              "input_tokens_mean", "output_tokens_mean")
SPEED_DETAIL = ("ttft_ms_median", "ttft_ms_p99", "tpot_ms_median", "tpot_ms_p99", "itl_ms_mean")


def format_value(name: str, value) -> str:
    """One value as people read it ("—" when not measured; unknown metrics in plain %g)."""
    if value is None:
        return "—"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    metric = METRICS.get(name)
    return format(value, metric.fmt if metric else "g")


def label(name: str) -> str:
    metric = METRICS.get(name)
    return metric.label if metric else name


def in_table_order(names) -> list[str]:
    """Metric names in the table's order; names the table does not know come last, alphabetically."""
    order = list(METRICS)
    return sorted(names, key=lambda name: (order.index(name) if name in order else len(order), name))
