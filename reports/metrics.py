"""The metric names of CONTRACT.md, and everything reports need to know about each one.

One table: which direction is better (decides which ratio gates make sense and how a comparison
reads), how much change is noise, how to label and format a value. Anything else in reports looks
metrics up here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from dspark_ci.ground.suites import ACCEPT_CATEGORIES, MAX_POSITIONS, category_metric

HIGHER, LOWER, NEUTRAL = "higher", "lower", "neutral"  # which direction is better
NOISE_STDERRS = 2.0  # a change (or a gate) within this many combined standard errors is sampling noise

# Relative noise bands (fraction of the old value), from what CI gates in the wild tolerate
# (vLLM's benchmark gates: throughput -3 %, median TTFT/ITL +2.5 %):
THROUGHPUT_NOISE = 0.03  # vLLM's throughput gate: -3%
MEDIAN_NOISE = 0.025  # vLLM's median TTFT/ITL gate: +2.5%; also means over every token (TPOT, ITL)
MEAN_TTFT_NOISE = 0.05  # a mean over a few dozen requests moves with one queued prefill: twice the median's
P90_NOISE = 0.05  # the p90 of tens of requests is a handful of them: between the median's band and the p99's
P99_NOISE = 0.10  # on tens of requests the p99 is one or two requests: the noisiest number in the table
ACCEPT_NOISE = 0.02  # acceptance gates sit at 95-98% of baseline; the tightest (2%) is what people trust
STDERR_NOISE = 0.10  # sqrt(p(1-p)/n) moves with the accuracy itself; only n (questions, repeats) moves it far


@dataclass(frozen=True)
class Metric:
    better: str  # HIGHER | LOWER | NEUTRAL (a count or a setting: no direction is better)
    label: str  # column / axis label
    fmt: str  # format spec for one value
    group: str  # "quality" (accuracy-style table) | "speed" (latency/throughput table) | "info"
    fraction: bool = False  # a share in [0, 1] (people tend to write 62 for 62%)
    noise: float = 0.0  # a change smaller than this fraction of the old value is noise (0: every change counts)
    stderr: str | None = None  # the metric holding this one's standard error: noise is then sampling error
    # the metric holding one boot's per-request standard error of this one (statistical gates)
    request_stderr: str | None = None


METRICS: dict[str, Metric] = {
    "gpqa_accuracy": Metric(HIGHER, "GPQA accuracy", ".1%", "quality", fraction=True, stderr="gpqa_stderr"),
    "gpqa_stderr": Metric(LOWER, "GPQA stderr", ".1%", "info", fraction=True, noise=STDERR_NOISE),
    "gpqa_num_questions": Metric(NEUTRAL, "GPQA questions", ".0f", "info"),
    "gpqa_repeats": Metric(NEUTRAL, "GPQA repeats", ".0f", "info"),
    "gpqa_no_answer": Metric(LOWER, "GPQA replies without an answer", ".1%", "info", fraction=True),
    "mc_accuracy": Metric(HIGHER, "MC accuracy (log-likelihood)", ".1%", "quality", fraction=True,
                          stderr="mc_stderr"),
    "mc_stderr": Metric(LOWER, "MC stderr", ".1%", "info", fraction=True, noise=STDERR_NOISE),
    "mc_num_items": Metric(NEUTRAL, "MC items", ".0f", "info"),
    "accept_length": Metric(HIGHER, "Accept length", ".2f", "quality", noise=ACCEPT_NOISE,
                            request_stderr="accept_length_stderr"),
    "accept_rate": Metric(HIGHER, "Accept rate", ".1%", "quality", fraction=True, noise=ACCEPT_NOISE,
                          request_stderr="accept_rate_stderr"),
    # Per draft position k: accepted / proposed (suites/accept_detail.py). Deep positions rest on few accepted
    # drafts: their band is the per-position tests' in vLLM (2 %) widened to P90's.
    **{f"accept_rate_pos{k}": Metric(HIGHER, f"Accept rate pos {k}", ".1%", "quality", fraction=True, noise=P90_NOISE,
                                     request_stderr=f"accept_rate_pos{k}_stderr")
       for k in range(1, MAX_POSITIONS + 1)},
    **{f"accept_rate_pos{k}_stderr": Metric(NEUTRAL, f"Accept rate pos {k} per-request stderr", ".4f", "info")
       for k in range(1, MAX_POSITIONS + 1)},
    # Per category of the accept workload (suites/accept_detail.py): fewer requests each, so the band is P90's.
    **{category_metric(c): Metric(HIGHER, f"Accept length ({c.replace('_', ' ')})", ".2f", "quality", noise=P90_NOISE,
                                  request_stderr=f"{category_metric(c)}_stderr") for c in ACCEPT_CATEGORIES},
    **{f"{category_metric(c)}_stderr": Metric(NEUTRAL, f"Accept length ({c.replace('_', ' ')}) per-request stderr",
                                              ".3f", "info") for c in ACCEPT_CATEGORIES},
    # At the sampled setting: shown, gated only through a baseline (acceptance is lower when sampling, by design).
    "accept_length_sampled": Metric(HIGHER, "Accept length (sampled)", ".2f", "info", noise=ACCEPT_NOISE),
    # Losslessness at temperature > 0 (ground/position_homogeneity.py): the family p of the per-position tests
    # (gated at the run's alpha: reports/gates.py), how many tests and draws it rests on; the share of draws equal to
    # the greedy text, with speculation and without, is a figure only (it does not test losslessness).
    "sampled_lossless_p": Metric(NEUTRAL, "Lossless sampling family p", ".2g", "quality"),
    "sampled_lossless_tests": Metric(NEUTRAL, "Lossless sampling tests (prompt × position)", ".0f", "info"),
    "sampled_lossless_samples": Metric(NEUTRAL, "Lossless sampling draws per prompt and side", ".0f", "info"),
    "sampled_greedy_share": Metric(NEUTRAL, "Sampled = greedy share", ".1%", "info", fraction=True),
    "sampled_greedy_share_reference": Metric(NEUTRAL, "Sampled = greedy share (reference)", ".1%", "info",
                                             fraction=True),
    "ttft_ms_mean": Metric(LOWER, "Avg TTFT (ms)", ".1f", "speed", noise=MEAN_TTFT_NOISE),
    "ttft_ms_median": Metric(LOWER, "Median TTFT (ms)", ".1f", "speed", noise=MEDIAN_NOISE),
    "ttft_ms_p90": Metric(LOWER, "P90 TTFT (ms)", ".1f", "speed", noise=P90_NOISE),
    "ttft_ms_p99": Metric(LOWER, "P99 TTFT (ms)", ".1f", "speed", noise=P99_NOISE),
    "tpot_ms_mean": Metric(LOWER, "Avg TPOT (ms)", ".2f", "speed", noise=MEDIAN_NOISE),
    "tpot_ms_median": Metric(LOWER, "Median TPOT (ms)", ".2f", "speed", noise=MEDIAN_NOISE,
                             request_stderr="tpot_ms_median_stderr"),
    "tpot_ms_p90": Metric(LOWER, "P90 TPOT (ms)", ".2f", "speed", noise=P90_NOISE),
    "tpot_ms_p99": Metric(LOWER, "P99 TPOT (ms)", ".2f", "speed", noise=P99_NOISE),
    # ITL as bench_serving prints it (per token under speculation, per chunk otherwise), then both
    # definitions by name (suites/speed.py): they differ by about the accept length.
    **{f"itl{kind}_ms_{stat}": Metric(LOWER, f"{label} ITL{suffix} (ms)", ".2f", "speed", noise=noise)
       for kind, suffix in (("", ""), ("_chunk", " per chunk"), ("_token", " per token"))
       for stat, label, noise in (("mean", "Avg", MEDIAN_NOISE), ("median", "Median", MEDIAN_NOISE),
                                  ("p90", "P90", P90_NOISE), ("p99", "P99", P99_NOISE))},
    # A disaggregated cell's mean TTFT split by its servers' stages (suites/ttft_split.py): means, banded as TTFT's.
    "ttft_prefill_queue_ms": Metric(LOWER, "Prefill queue (ms)", ".1f", "speed", noise=MEAN_TTFT_NOISE),
    "ttft_transfer_ms": Metric(LOWER, "KV transfer (ms)", ".1f", "speed", noise=MEAN_TTFT_NOISE),
    "ttft_first_decode_ms": Metric(LOWER, "First decode (ms)", ".1f", "speed", noise=MEAN_TTFT_NOISE),
    # End-to-end latency is mostly decode time, the reciprocal of throughput: the same band.
    "e2e_latency_s_mean": Metric(LOWER, "Avg Lat (s)", ".3f", "speed", noise=THROUGHPUT_NOISE),
    "output_throughput_tok_s": Metric(HIGHER, "Avg Thpt (tok/s)", ".2f", "speed", noise=THROUGHPUT_NOISE,
                                      request_stderr="output_throughput_tok_s_stderr"),
    # One boot's standard error of a figure from its own requests (bootstrap over requests): the per-request
    # part of the noise, apart from the per-boot part the baseline's runs measure.
    **{f"{name}_stderr": Metric(NEUTRAL, f"{label} per-request stderr", fmt, "info")
       for name, label, fmt in (("accept_length", "Accept length", ".3f"), ("accept_rate", "Accept rate", ".4f"),
                                ("tpot_ms_median", "Median TPOT", ".3f"),
                                ("output_throughput_tok_s", "Throughput", ".2f"))},
    "input_tokens_mean": Metric(NEUTRAL, "Avg In", ".0f", "speed"),
    "output_tokens_mean": Metric(NEUTRAL, "Avg Out", ".0f", "speed"),
    # The client's own overhead, beside TTFT: shown, never a verdict on the server.
    "client_loop_lag_ms_p99": Metric(NEUTRAL, "Client loop lag p99 (ms)", ".1f", "speed"),
    "client_ttfb_ms_median": Metric(NEUTRAL, "Median TTFB (ms)", ".1f", "speed"),
    "client_ttfb_ms_p99": Metric(NEUTRAL, "P99 TTFB (ms)", ".1f", "speed"),
    # Median TPOT of the same deployment without speculation / with it, same requests: speculation must pay.
    "speculative_speedup": Metric(HIGHER, "Speculative speedup", ".2f", "quality", noise=THROUGHPUT_NOISE,
                                  request_stderr="speculative_speedup_stderr"),
    "speculative_speedup_stderr": Metric(NEUTRAL, "Speculative speedup per-request stderr", ".3f", "info"),
    # Where the scheduler's main thread spent the speed window, per output token (suites/offcpu.py): blocked is time
    # neither on a CPU nor waiting for one (a sleep, a lock, a sync in the decode step), which the machine's load
    # does not make; idle is such time spent waiting on its sockets for work (a front end the load slowed); the run
    # queue's wait is the load. Read from /proc through the launcher only.
    "scheduler_blocked_ms_per_token": Metric(LOWER, "Scheduler blocked / token (ms)", ".3f", "speed"),
    "scheduler_idle_ms_per_token": Metric(NEUTRAL, "Scheduler idle / token (ms)", ".3f", "speed"),
    "scheduler_cpu_ms_per_token": Metric(NEUTRAL, "Scheduler CPU / token (ms)", ".3f", "speed"),
    "scheduler_runqueue_ms_per_token": Metric(NEUTRAL, "Scheduler run queue / token (ms)", ".3f", "speed"),
    # The concurrency where the speedup falls to 1 (suites/envelope.py): gated by a baseline, never inward.
    "speculation_boundary_concurrency": Metric(HIGHER, "Speculation pays up to concurrency", ".0f", "quality",
                                               noise=P90_NOISE),
    # Greedy outputs with and without speculation must match token for token: every mismatch counts.
    "parity_mismatches": Metric(LOWER, "Parity mismatches", ".0f", "quality"),
    # First differences where the reference's logprobs tie (suites/parity_ties.py): counted and shown, never a verdict.
    "parity_tie_flips": Metric(NEUTRAL, "Parity tie flips", ".0f", "quality"),
    # How far the two servers' logprobs of the same tokens part: a layout's rounding, or a numerics bug.
    "parity_logprob_drift": Metric(LOWER, "Parity logprob drift (nats)", ".3g", "quality"),
}

# A metric whose sampling error is measured alongside it (for gates that respect noise).
STDERR_OF: dict[str, str] = {name: metric.stderr for name, metric in METRICS.items() if metric.stderr}
# A metric whose per-request standard error within one boot the suites report.
REQUEST_STDERR_OF: dict[str, str] = {name: m.request_stderr for name, m in METRICS.items() if m.request_stderr}
# A metric a baseline may gate by `max_drop_stderr` (paired over its units when it keeps a `per_question` record),
# and the standard error the gate reads: an accuracy's own; accept length's per-request one (its units: requests).
PAIRED_STDERR_OF: dict[str, str] = {**STDERR_OF, "accept_length": REQUEST_STDERR_OF["accept_length"]}

# The SGLang-style speed line of a cell, in the order SGLang PRs print it.
SPEED_LINE = ("e2e_latency_s_mean", "ttft_ms_mean", "tpot_ms_mean", "output_throughput_tok_s",
              "input_tokens_mean", "output_tokens_mean")
# A cell's detail tables under the speed line: latency spread, the ITL definitions, what the client added.
SPEED_DETAIL = (
    ("ttft_ms_median", "ttft_ms_p90", "ttft_ms_p99", "tpot_ms_median", "tpot_ms_p90", "tpot_ms_p99"),
    ("itl_ms_mean", "itl_ms_median", "itl_ms_p90", "itl_ms_p99", "itl_chunk_ms_mean", "itl_token_ms_mean"),
    ("client_ttfb_ms_median", "client_ttfb_ms_p99", "client_loop_lag_ms_p99"),
    ("scheduler_blocked_ms_per_token", "scheduler_idle_ms_per_token", "scheduler_cpu_ms_per_token",
     "scheduler_runqueue_ms_per_token"),
)
# A disaggregated cell's mean TTFT beside its split (shown when the servers reported any part of it).
TTFT_SPLIT = ("ttft_ms_mean", "ttft_prefill_queue_ms", "ttft_transfer_ms", "ttft_first_decode_ms")


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


def noise_band(name: str, old_metrics: Mapping, new_metrics: Mapping) -> float:
    """How far (in the metric's own unit) the new value may lie from the old one and still be noise.

    A sampled metric: NOISE_STDERRS·√(se_old² + se_new²); a run without its stderr counts as noisy as
    the other (as the gates assume); neither run measured it: 0. Others: the table's band × |old|.
    """
    metric = METRICS.get(name)
    if metric is None or old_metrics.get(name) is None:
        return 0.0
    if metric.stderr:
        se_old, se_new = old_metrics.get(metric.stderr), new_metrics.get(metric.stderr)
        se_old, se_new = (se_new if se_old is None else se_old), (se_old if se_new is None else se_new)
        return 0.0 if se_old is None or se_new is None else NOISE_STDERRS * math.hypot(se_old, se_new)
    return metric.noise * abs(old_metrics[name])
