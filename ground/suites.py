"""The suites and their metrics: which suites exist, what options each reads, which metrics each measures.

One registry that the matrix loader (checking a cell's ``suites:``), the suites themselves (``suites/config.py``,
``suites/output.py``), the run's suite runner and the reports (``reports/metrics.py``) all derive from, so a
new metric or option is written once. Metric names are CONTRACT.md's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

KNOWN_SUITES = ("sanity", "gpqa", "mc", "accept", "speed", "parity")
DEFAULT_SUITES = ("accept", "speed")
# Run on every serving cell whatever suites it selects (suites/sanity.py): no selection leaves a broken server green.
ALWAYS_SUITES = ("sanity",)
# Speculation-only measurements: they mean nothing on a deployment without a draft model.
SPECULATIVE_SUITES = ("accept", "parity")
# A client event loop that wakes a 10 ms sleeper this late (p99, ``client_loop_lag_ms_p99``) was starved of CPU: the
# machine, not the server, set its timings (bench/speed_fidelity.py: TPOT errors above 1 % came with p99 lags of 15 ms
# and more; on a saturated 2-core runner SGLang's front end read throughput 17 % low with TPOT unchanged). The speed
# suite warns, and the statistical gates set such a boot's timings aside.
SATURATED_LOOP_LAG_MS = 10.0

# The accept workload's categories with a metric of their own, accept_length_CATEGORY (suites/prompts.py files each
# prompt under one): those that matter for speculation (drafts accept more on code and math, less on long inputs),
# then MT-Bench's others. A question file's other categories are in the records only.
SPECULATION_CATEGORIES = ("code", "math", "long_context")
ACCEPT_CATEGORIES = SPECULATION_CATEGORIES + ("writing", "roleplay", "reasoning", "extraction", "stem", "humanities")


# Draft positions with a metric of their own, accept_rate_pos1..N (CONTRACT.md); deeper positions are in the
# records only (suites/accept_detail.py).
MAX_POSITIONS = 8


def category_metric(category: str) -> str:
    """The metric of one category's accept length: ``accept_length_code``."""
    return f"accept_length_{category}"


# Every metric a suite may report, and the suite that measures it (CONTRACT.md names).
METRIC_SUITE: Mapping[str, str] = MappingProxyType({
    "gpqa_accuracy": "gpqa", "gpqa_stderr": "gpqa", "gpqa_num_questions": "gpqa", "gpqa_repeats": "gpqa",
    "gpqa_no_answer": "gpqa",
    # multiple choice by log-likelihood (suites/mc.py): the share of items whose right option the model finds most
    # likely, its binomial standard error, and how many items
    "mc_accuracy": "mc", "mc_stderr": "mc", "mc_num_items": "mc",
    "accept_length": "accept", "accept_rate": "accept",
    # per draft position k: accepted / proposed over verify steps, and its per-request stderr (suites/accept_detail.py)
    **{f"accept_rate_pos{k}{suffix}": "accept" for k in range(1, MAX_POSITIONS + 1)
       for suffix in ("", "_stderr")},
    # per category of the accept workload: its accept length and per-request stderr (never the speed suite's random
    # text, whose acceptance is not draft quality)
    **{f"{category_metric(c)}{suffix}": "accept" for c in ACCEPT_CATEGORIES for suffix in ("", "_stderr")},
    # at the sampled setting (accept.sampled_temperature); losslessness: the per-position test's family p, its tests
    # and draws per prompt and side (ground/position_homogeneity.py), and the share of draws equal to the greedy
    # text on this server and on the non-speculative reference (a figure)
    "accept_length_sampled": "accept",
    "sampled_lossless_p": "accept", "sampled_lossless_tests": "accept", "sampled_lossless_samples": "accept",
    "sampled_greedy_share": "accept", "sampled_greedy_share_reference": "accept",
    # mean / median / p90 / p99 of TTFT, TPOT and ITL, as bench_serving prints them; ITL three ways (suites/speed.py)
    **{f"{quantity}_ms_{stat}": "speed" for quantity in ("ttft", "tpot", "itl", "itl_chunk", "itl_token")
       for stat in ("mean", "median", "p90", "p99")},
    "e2e_latency_s_mean": "speed", "output_throughput_tok_s": "speed",
    "input_tokens_mean": "speed", "output_tokens_mean": "speed",
    # a disaggregated cell's mean TTFT split as its prefill and decode servers report their stages
    # (suites/ttft_split.py)
    "ttft_prefill_queue_ms": "speed", "ttft_transfer_ms": "speed", "ttft_first_decode_ms": "speed",
    # the client's own overhead, beside TTFT
    "client_loop_lag_ms_p99": "speed", "client_ttfb_ms_median": "speed", "client_ttfb_ms_p99": "speed",
    "parity_mismatches": "parity",
    # greedy outputs that first differ where the reference's logprobs tie (within parity.tie_ulps): counted, not red
    "parity_tie_flips": "parity",
    # the largest logprob difference of a token both servers took (suites/parity_ties.py prefix_drift)
    "parity_logprob_drift": "parity",
    # one boot's per-request standard errors (bootstrap over requests), for the statistical gates
    "accept_length_stderr": "accept", "accept_rate_stderr": "accept",
    "tpot_ms_median_stderr": "speed", "output_throughput_tok_s_stderr": "speed",
    # median TPOT without speculation / with it, on the same requests in alternating rounds ("speculation must pay"),
    # and its per-request standard error (bootstrap over the requests of both sides)
    "speculative_speedup": "speed", "speculative_speedup_stderr": "speed",
    # where the server's scheduler spent the speed window per output token: blocked (a sleep, a lock, a sync), idle
    # (waiting on its sockets for work), on a CPU, waiting for one (the machine's load); only through the launcher
    # (suites/offcpu.py)
    "scheduler_blocked_ms_per_token": "speed", "scheduler_idle_ms_per_token": "speed",
    "scheduler_cpu_ms_per_token": "speed", "scheduler_runqueue_ms_per_token": "speed",
    # the concurrency where that speedup falls to 1, at the sweep's shortest input length (suites/envelope.py)
    "speculation_boundary_concurrency": "speed",
})
METRIC_NAMES = frozenset(METRIC_SUITE)


def suite_of(metric: str) -> str | None:
    """The suite that measures ``metric`` (None for a name no suite reports)."""
    return METRIC_SUITE.get(metric)


# Every option a suite reads, with its default. A value's type is the default's type
# (None-valued defaults list their accepted types in OPTION_TYPES).
SUITE_DEFAULTS: dict[str, dict[str, Any]] = {
    "sanity": {
        "num_requests": 4,
        "max_tokens": 48,
        "concurrency": 4,
        "min_accept_length": 1.2,  # the collapse floor, as accept's; only where the server reports spec statistics
    },
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
        # A model that answers at chance (random weights, e.g. the CPU engine's): every reply is held to
        # "Answer: X" by SGLang's `regex` sampling parameter, and the gate is that accuracy stays inside a guesser's
        # band with every answer extracted (the path from prompt to score works), not that it beats chance.
        "answers_at_chance": False,
    },
    "mc": {
        "num_items": None,  # a seeded subsample of the kept items; None = every one
        # which kinds of item (the data file's categories, comma-separated): the ones SmolLM2-135M answers well above
        # chance (suites/data/README.md); "" = every kind in the file
        "categories": "capital,continent",
        "concurrency": 4,  # items in flight (each one /generate of its context and its four continuations)
        "dataset": None,  # a file in mc_countries.json's format; None = suites/data/mc_countries.json
    },
    "accept": {
        "num_requests": 32,
        "max_tokens": 256,
        "concurrency": 8,
        "min_accept_length": 1.2,  # the collapse floor: below this, drafts are (nearly) never accepted
        "disagreement_tolerance": 0.05,  # relative gap between per-request and server-side figures
        "workload": "builtin",  # "builtin" | "mtbench" (the 80 questions, fetched once) | a question.jsonl path
        "sampled_temperature": 0.7,  # the sampled setting the suite also measures (0: greedy only)
        "sampled_top_p": 0.95,
        # Losslessness (needs a reference): prompts drawn on both servers, draws per prompt and server, tokens per
        # draw (positions 2..lossless_tokens are tested; bench/sampled_lossless.py: false alarms and power)
        "lossless_prompts": 4,
        "lossless_samples": 64,
        "lossless_tokens": 6,
        # "chat" | "completions": sglang-router 0.3.2 drops return_spec_tokens_details from chat requests (kept
        # for completions), so a disaggregated cell, measured through the router, asks completions
        "api": "chat",
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
        # Where speculation pays (needs the non-speculative reference): empty = no sweep
        "sweep_concurrency": [],
        "sweep_input_len": [256],
        "sweep_min_requests": 4,  # requests per point at least (a point at concurrency c sends max(c, this))
        "sweep_output_len": 32,
        # With the reference: the speedup's requests go to it and to this server in this many rounds, alternating
        # which goes first, so the machine's load falls on both alike
        "speedup_rounds": 4,
    },
    "parity": {
        "num_prompts": 8,
        "max_tokens": 64,
        "concurrency": 1,  # batching can change greedy numerics on real GPUs: one at a time by default
        "max_mismatches": 0,  # the parity test fails above this many differing prompts (tie flips not counted)
        "top_logprobs": 5,  # the reference's top logprobs per position: what tells a tie flip from a mismatch
        # a first difference within this many bf16 steps of the logprob is a tie (suites/parity_ties.py)
        "tie_ulps": 2.0,
        # ... or within drift_factor times the two servers' own drift (the largest logprob difference of a token both
        # took before a first difference, over the run's prompts), while that drift stays within max_drift nats
        # (beyond it: not the same numerics)
        "drift_factor": 2.0,
        "max_drift": 0.5,
        # what the outputs are compared with: "without_speculation" (the same deployment without speculation) or
        # "one_rank" (the same model without speculation on one node at tp 1: a multi-rank cell's numerics)
        "reference": "without_speculation",
    },
}

# What `sgl-eval run gpqa` does when not told otherwise (sgl-eval 0.1.x: sgl_eval/evals/_registry.py gpqa row
# `thinking: True` -> chat_template_kwargs {"thinking": True}, `default_n_repeats: 8`; GenConfig temperature 0.0,
# max_tokens None (none sent); cli.py --num-threads 64). With `scorer: sgl-eval`, every gpqa option the cell leaves
# unset takes these, so our figure and the CLI's are the same measurement; one it sets is recorded as a difference.
SGL_EVAL_CLI_DEFAULTS: Mapping[str, Any] = MappingProxyType({
    "thinking": True, "chat_template_kwargs": MappingProxyType({"thinking": True}), "repeats": 8,
    "max_tokens": None, "temperature": 0.0, "concurrency": 64,
})

OPTION_TYPES: dict[tuple[str, str], tuple[type, ...]] = {
    ("speed", "sweep_concurrency"): (list,),
    ("speed", "sweep_input_len"): (list,),
    ("gpqa", "num_questions"): (int, type(None)),
    ("gpqa", "max_tokens"): (int, type(None)),  # None: no max_tokens sent (the server's context decides)
    ("gpqa", "dataset"): (str, type(None)),
    ("gpqa", "chat_template_kwargs"): (dict, type(None)),
    ("mc", "num_items"): (int, type(None)),
    ("mc", "dataset"): (str, type(None)),
}

ALLOWED_VALUES: dict[tuple[str, str], tuple[str, ...]] = {
    ("gpqa", "scorer"): ("simple-evals", "sglang", "sgl-eval"),
    ("gpqa", "extractor"): ("sglang", "openai"),
    ("speed", "client"): ("aiohttp", "openai"),
    ("accept", "api"): ("chat", "completions"),
    ("parity", "reference"): ("without_speculation", "one_rank"),
}

# Counts and sizes, by option name: (least, most). Zero or less is a mistake, not a request for nothing; past the
# upper bound a value is a typo (1e9 requests, a million streams) that would run for days or exhaust the machine.
# Token bounds: 1 Mi tokens is past any served context; concurrency: past SGLang's default --max-running-requests.
MAX_TOKENS_BOUND = 1 << 20
OPTION_RANGES: dict[str, tuple[float, float]] = {
    "num_questions": (1, 100_000), "num_items": (1, 100_000), "repeats": (1, 64), "concurrency": (1, 4096),
    "max_tokens": (1, MAX_TOKENS_BOUND),
    "num_requests": (1, 100_000), "input_len": (1, MAX_TOKENS_BOUND), "output_len": (1, MAX_TOKENS_BOUND),
    "warmup_requests": (0, 10_000), "workers": (1, 64), "num_prompts": (1, 10_000), "max_mismatches": (0, 10_000),
    "temperature": (0.0, 2.0), "sampled_temperature": (0.0, 2.0), "sampled_top_p": (0.0, 1.0),
    "speedup_rounds": (1, 1000), "sweep_min_requests": (1, 10_000), "sweep_output_len": (2, MAX_TOKENS_BOUND),
    "lossless_prompts": (1, 10_000), "lossless_samples": (1, 10_000), "lossless_tokens": (1, 4096),
    "min_accept_length": (0.0, 1024.0), "disagreement_tolerance": (0.0, 1.0),
    "top_logprobs": (1, 20), "tie_ulps": (0.0, 64.0), "drift_factor": (0.0, 100.0),
    "max_drift": (0.0, 100.0),
}


def effective_options(suite: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """A suite's full option set: its defaults, the scorer's CLI defaults for what ``given`` leaves unset
    (``scorer: sgl-eval``), then ``given``."""
    options = dict(SUITE_DEFAULTS[suite])
    if suite == "gpqa" and given.get("scorer") == "sgl-eval":
        # the CLI's chat_template_kwargs is its `thinking`: a cell that sets thinking decides both
        unset = {key for key in SGL_EVAL_CLI_DEFAULTS if key not in given}
        if "thinking" in given:
            unset.discard("chat_template_kwargs")
        options.update({key: SGL_EVAL_CLI_DEFAULTS[key] for key in unset})
    options.update(given)
    return options


def scorer_cli_differences(options: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """For ``scorer: sgl-eval``: each gpqa option whose value differs from what `sgl-eval run gpqa` sends
    (option -> {"ours", "sgl_eval"}), so a figure that differs from the CLI's says why. Empty otherwise."""
    if options.get("scorer") != "sgl-eval":
        return {}
    differences = {}
    for key, cli in SGL_EVAL_CLI_DEFAULTS.items():
        ours = options.get(key)
        if key == "chat_template_kwargs" and ours is None:
            continue  # follows `thinking`, compared there
        if _plain(ours) != _plain(cli):
            differences[key] = {"ours": _plain(ours), "sgl_eval": _plain(cli)}
    return differences


def _plain(value: Any) -> Any:
    return dict(value) if isinstance(value, Mapping) else value


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
    if isinstance(value, list) and not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_TOKENS_BOUND
                                           for v in value):
        return f"{suite}.{key} must be a list of whole numbers from 1 to {MAX_TOKENS_BOUND:,}, got {json.dumps(value)}"
    bounds = OPTION_RANGES.get(key)
    if bounds is not None and isinstance(value, (int, float)) and not bounds[0] <= value <= bounds[1]:
        least, most = bounds
        if value != value:
            return f"{suite}.{key} must be a number, got nan"
        if value >= least:  # too large
            return f"{suite}.{key} must be at most {most:,}, got {value:,}"
        return f"{suite}.{key} must be at least {least:g}, got {value:g}"
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
