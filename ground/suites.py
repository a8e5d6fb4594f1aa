"""The suites and their metrics: which suites exist, what options each reads, which metrics each measures.

One registry that the matrix loader (checking a cell's ``suites:``), the suites themselves (``suites/config.py``,
``suites/output.py``), the run's suite runner and the reports (``reports/metrics.py``) all derive from, so a
new metric or option is written once. Metric names are CONTRACT.md's.
"""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Any, Mapping

KNOWN_SUITES = ("gpqa", "accept", "speed", "parity")
DEFAULT_SUITES = ("accept", "speed")
# Speculation-only measurements: they mean nothing on a deployment without a draft model.
SPECULATIVE_SUITES = ("accept", "parity")

# Every metric a suite may report, and the suite that measures it (CONTRACT.md names).
METRIC_SUITE: Mapping[str, str] = MappingProxyType({
    "gpqa_accuracy": "gpqa", "gpqa_stderr": "gpqa", "gpqa_num_questions": "gpqa", "gpqa_repeats": "gpqa",
    "accept_length": "accept", "accept_rate": "accept",
    # mean / median / p90 / p99 of TTFT, TPOT and ITL, as bench_serving prints them; ITL three ways (suites/speed.py)
    **{f"{quantity}_ms_{stat}": "speed" for quantity in ("ttft", "tpot", "itl", "itl_chunk", "itl_token")
       for stat in ("mean", "median", "p90", "p99")},
    "e2e_latency_s_mean": "speed", "output_throughput_tok_s": "speed",
    "input_tokens_mean": "speed", "output_tokens_mean": "speed",
    # the client's own overhead, beside TTFT
    "client_loop_lag_ms_p99": "speed", "client_ttfb_ms_median": "speed", "client_ttfb_ms_p99": "speed",
    "parity_mismatches": "parity",
    # one boot's per-request standard errors (bootstrap over requests), for the statistical gates (issue 22)
    "accept_length_stderr": "accept", "accept_rate_stderr": "accept",
    "tpot_ms_median_stderr": "speed", "output_throughput_tok_s_stderr": "speed",
    # median TPOT without speculation / with it, on the same requests ("speculation must pay", issue 22)
    "speculative_speedup": "speed",
})
METRIC_NAMES = frozenset(METRIC_SUITE)


def suite_of(metric: str) -> str | None:
    """The suite that measures ``metric`` (None for a name no suite reports)."""
    return METRIC_SUITE.get(metric)


# Every option a suite reads, with its default. A value's type is the default's type
# (None-valued defaults list their accepted types in OPTION_TYPES).
SUITE_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpqa": {
        "num_questions": None,  # subsample (simple-evals `num_examples`); None = every question
        "repeats": 1,  # simple-evals `n_repeats`
        "concurrency": 32,
        "max_tokens": 2048,
        "temperature": 0.0,
        "scorer": "sglang",  # "simple-evals" | "sglang" | "sgl-eval": whose prompt, extraction and aggregation
        "extractor": "sglang",  # older spelling: "openai" (with scorer left default) means scorer simple-evals
        "dataset": None,  # path or URL; None = the published gpqa_diamond.csv
        "thinking": False,  # ask the chat template for thinking mode
        "chat_template_kwargs": None,  # explicit kwargs; overrides what `thinking` sets
    },
    "accept": {
        "num_requests": 32,
        "max_tokens": 256,
        "concurrency": 8,
        "min_accept_length": 1.2,  # the collapse floor: below this, drafts are (nearly) never accepted
        "disagreement_tolerance": 0.05,  # relative gap between per-request and server-side figures
    },
    "speed": {
        "num_requests": 64,
        "concurrency": 8,
        "input_len": 256,  # prompt tokens (approximate: built from words, calibrated with usage)
        "output_len": 128,  # max_tokens, with ignore_eos
        "warmup_requests": 4,
        "workers": 1,  # client processes sharing the concurrency (see BENCHMARKS.md)
        "ignore_eos": True,
        "client": "aiohttp",  # "aiohttp" | "openai": what reads the streams (BENCHMARKS.md: why aiohttp)
    },
    "parity": {
        "num_prompts": 8,
        "max_tokens": 64,
        "concurrency": 1,  # batching can change greedy numerics on real GPUs: one at a time by default
        "max_mismatches": 0,  # the parity test fails above this many differing prompts
    },
}

OPTION_TYPES: dict[tuple[str, str], tuple[type, ...]] = {
    ("gpqa", "num_questions"): (int, type(None)),
    ("gpqa", "dataset"): (str, type(None)),
    ("gpqa", "chat_template_kwargs"): (dict, type(None)),
}

ALLOWED_VALUES: dict[tuple[str, str], tuple[str, ...]] = {
    ("gpqa", "scorer"): ("simple-evals", "sglang", "sgl-eval"),
    ("gpqa", "extractor"): ("sglang", "openai"),
    ("speed", "client"): ("aiohttp", "openai"),
}

# Counts and sizes: zero or less is a mistake, not a request for nothing.
POSITIVE_OPTIONS = frozenset(
    {"num_questions", "repeats", "concurrency", "max_tokens", "num_requests", "input_len", "output_len",
     "workers", "num_prompts"}
)


def option_problem(suite: str, key: str, value: Any) -> str | None:
    """What is wrong with one option value, or None. Shared with the matrix loader, which checks
    a cell's `suites:` options where the YAML enters (with the option's own line)."""
    if suite not in SUITE_DEFAULTS:
        return f"unknown suite '{suite}' (known: {', '.join(SUITE_DEFAULTS)})"
    defaults = SUITE_DEFAULTS[suite]
    if key not in defaults:
        return f"suite '{suite}' has no option '{key}' (known: {', '.join(defaults)})"
    expected = OPTION_TYPES.get((suite, key)) or _types_like(defaults[key])
    if isinstance(value, bool) and bool not in expected or not isinstance(value, expected):
        names = " or ".join("null" if t is type(None) else t.__name__ for t in expected)
        return f"{suite}.{key} must be {names}, got {json.dumps(value)}"
    if key in POSITIVE_OPTIONS and isinstance(value, (int, float)) and value <= 0:
        return f"{suite}.{key} must be at least 1, got {value}"
    allowed = ALLOWED_VALUES.get((suite, key))
    if allowed and value not in allowed:
        return f"{suite}.{key} must be one of {', '.join(allowed)}, got {value!r}"
    return None


def _types_like(default: Any) -> tuple[type, ...]:
    if isinstance(default, bool):
        return (bool,)
    if isinstance(default, float):
        return (float, int)  # 1 is a fine temperature or floor
    return (type(default),)
