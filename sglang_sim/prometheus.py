"""``/metrics`` in Prometheus text: every family SGLang's own front end sends, with its names, types,
labels and buckets (``dspark_ci.sglang_sim.metric_families``, taken from the real front end).

One registry per server (no process-global state). What the simulator knows is measured: requests running and
queued, tokens held (KV use), generation throughput and the spec gauges per logging window, each finished
request's tokens, verify calls, TTFT, inter-token latency, time per output token, queue time and the request's
stages (a PD role's by their PD names, and a PD prefill's queue gauges: dspark_ci.sglang_sim.disaggregation), the HTTP
requests by endpoint, this process's CPU time, the boot time. What it does not model (SWA and Mamba pools, a PD
decode's queue gauges, DP-attention balance, CUDA graphs, prefix cache, grammar, routing keys) is sent as an idle
SGLang sends it: zero.
prometheus_client drops a counter name's ``_total`` and adds it back on exposition, so ``sglang:prompt_tokens``
here is ``sglang:prompt_tokens_total`` on the wire, as SGLang's.
"""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Mapping
from typing import Any

from dspark_ci.sglang_sim.args import ServerArgs
from dspark_ci.sglang_sim.metric_families import Family, load
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

METRIC_KINDS = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}
MAX_TOTAL_NUM_TOKENS = 1 << 24  # the KV pool the simulated scheduler reports (it never runs out)
# one process plays tokenizer and scheduler: its CPU time is counted once, as the tokenizer's
CPU_COMPONENT = "tokenizer"


def kv_gauges(used: int) -> dict[str, float]:
    """SchedulerStats' KV figures for ``used`` tokens held by running requests (one full-attention pool, no
    prefix cache: nothing evictable)."""
    return {"num_used_tokens": used, "kv_used_tokens": used, "decode_sum_seq_lens": used,
            "kv_available_tokens": MAX_TOTAL_NUM_TOKENS - used, "token_usage": used / MAX_TOTAL_NUM_TOKENS,
            "full_token_usage": used / MAX_TOTAL_NUM_TOKENS}


class ServerMetrics:
    def __init__(self, args: ServerArgs, num_dp_ranks: int, startup_time: Mapping[str, Any] | None = None,
                 pid: int | None = None):
        """``pid``: the server's, when this process is one shard of it (dspark_ci.sglang_sim.engine_shards: its series
        then carry the same labels in every shard, and add up)."""
        self.registry = CollectorRegistry()
        engine_type = {"prefill": "prefill", "decode": "decode"}.get(args.disaggregation_mode, "unified")
        self._identity = {"model_name": args.model_name, "engine_type": engine_type, "tp_rank": "0", "pp_rank": "0",
                          "moe_ep_rank": "0", "pid": str(pid or os.getpid())}
        self._with_dp_rank = num_dp_ranks > 1
        self._children: dict[tuple, Any] = {}  # (family, DP rank, labels) -> its series: labels() costs ~5 us a call
        self._families = {family.name: family for family in load()}
        self._metrics = {family.name: self._declare(family) for family in self._families.values()}
        self._cpu_seconds = time.process_time()
        for family in self._families.values():  # the series SGLang sends from the start: the schedulers' and
            if family.per_scheduler or family.series or not family.labels:  # the fixed ones; others once moved
                for rank in range(num_dp_ranks) if family.per_scheduler else (0,):
                    for series in family.series or ((),):
                        self._series(family.name, rank, **dict(series))
        if startup_time is not None:
            self._startup(startup_time)

    def _declare(self, family: Family) -> Any:
        labels = list(family.labels) + (["dp_rank"] if family.per_scheduler and self._with_dp_rank else [])
        extra = {"buckets": family.buckets} if family.kind == "histogram" else {}
        return METRIC_KINDS[family.kind](family.name, family.help, labels, registry=self.registry, **extra)

    def _series(self, name: str, dp_rank: int = 0, /, **labels: str) -> Any:
        """One series of a family: its identity labels filled in (the DP rank's for a scheduler's family). Looked up
        once and kept: a request moves ~20 series, and a wave of a thousand arrivals must not cost a step."""
        key = (name, dp_rank, *labels.items())
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._child(name, dp_rank, **labels)
        return child

    def _child(self, name: str, dp_rank: int, /, **labels: str) -> Any:
        metric = self._metrics[name]
        names = metric._labelnames
        if not names:
            return metric
        identity = {**self._identity, "dp_rank": str(dp_rank)}
        return metric.labels(**{key: identity[key] for key in names if key not in labels}, **labels)

    def _startup(self, startup_time: Mapping[str, Any]) -> None:
        """TokenizerMetricsCollector.emit_startup_time."""
        for phase in ("load_weight", "kv_cache_allocation", "scheduler_e2e", "tokenizer_e2e"):
            self._series("sglang:startup_time_seconds", phase=phase).set(float(startup_time[phase]))
        for phase, seconds in startup_time["cuda_graph"].items():
            self._series("sglang:startup_cuda_graph_time_seconds", phase=phase).set(float(seconds))

    # --- the scheduler's, per DP rank (SchedulerMetricsCollector.log_stats) ---------------------------

    def scheduler_changed(self, rank) -> None:
        """A rank's requests or tokens changed, or its log window closed: the gauges SGLang logs per batch. Set now,
        not when /metrics is read: a PD prefill sets num_queue_reqs/num_running_reqs of its own (prefill_queues)."""
        values = {"num_running_reqs": rank.running, "num_queue_reqs": rank.queued,
                  "gen_throughput": rank.last_gen_throughput, **kv_gauges(rank.used_tokens)}
        for name, value in values.items():
            self._series(f"sglang:{name}", rank.dp_rank).set(value)

    def spec_window(self, dp_rank: int, accept_length: float, accept_rate: float) -> None:
        self._series("sglang:spec_accept_length", dp_rank).set(accept_length)
        self._series("sglang:spec_accept_rate", dp_rank).set(accept_rate)

    def _scheduled(self, gen) -> None:
        """SchedulerReqTimeStats' observations of one request: its queue wait (from when it could be scheduled: on a
        PD decode server, once its transfer arrived) and its stages, by SGLang's names for the server's role."""
        admitted = gen.admitted if gen.admitted is not None else gen.arrived.monotonic
        first = gen.first_token.monotonic if gen.first_token is not None else admitted
        schedulable = gen.transferred if gen.transferred is not None else gen.arrived.monotonic
        self._series("sglang:queue_time_seconds", gen.dp_rank).observe(max(admitted - schedulable, 0.0))
        if gen.transferred is None:
            stages = {"request_process": 0.0, "prefill_forward": first - admitted}
            self._series("sglang:prefill_effective_tokens", gen.dp_rank, mode="input").inc(gen.prompt_tokens)
        else:  # set_decode_prealloc/transfer_queue_entry_time, set_wait_queue_entry_time, set_forward_entry_time,
            # set_decode_prebuilt_finish_time: here the request is preallocated and bootstrapped as it arrives
            stages = {"decode_prepare": 0.0, "decode_bootstrap": 0.0,
                      "decode_transferred": gen.transferred - gen.arrived.monotonic,
                      "decode_waiting": admitted - gen.transferred, "fake_output": first - admitted}
        self._stages(gen.dp_rank, stages)

    def prefilled(self, queue_seconds: float, stages: Mapping[str, float], streaming: bool) -> None:
        """A PD prefill server's request (dspark_ci.sglang_sim.disaggregation), once its transfer is done: its queue
        wait, its stages, and the request counted as its tokenizer counts one it finished."""
        self._series("sglang:queue_time_seconds").observe(max(queue_seconds, 0.0))
        self._stages(0, stages)
        self._series("sglang:num_requests", is_streaming="true" if streaming else "false").inc()

    def prefill_queues(self, held: Mapping[str, int]) -> None:
        """A PD prefill scheduler's queue gauges (bootstrap, waiting, running, transfer in flight)."""
        for name, count in held.items():
            self._series(f"sglang:{name}").set(count)

    def _stages(self, dp_rank: int, stages: Mapping[str, float]) -> None:
        for stage, seconds in stages.items():
            self._series("sglang:per_stage_req_latency_seconds", dp_rank, stage=stage).observe(max(seconds, 0.0))

    # --- the tokenizer's (TokenizerMetricsCollector) -------------------------------------------------

    def request_finished(self, gen, streaming: bool) -> None:
        if gen.first_token is not None:
            self._scheduled(gen)
        labels = {"is_streaming": "true" if streaming else "false"}
        self._series("sglang:num_requests", **labels).inc()
        self._series("sglang:prompt_tokens", **labels).inc(gen.prompt_tokens)
        self._series("sglang:generation_tokens", **labels).inc(gen.completion_tokens)
        if gen.spec is not None and gen.spec.verify_ct > 0:  # as SGLang: only when the request verified
            self._series("sglang:spec_verify_calls").inc(gen.spec.verify_ct)
        started = gen.arrived.monotonic
        finished = gen.finished_at or started
        self._series("sglang:e2e_request_latency_seconds", **labels).observe(finished - started)
        for name, tokens in (("prompt_tokens_histogram", gen.prompt_tokens),
                             ("uncached_prompt_tokens_histogram", gen.prompt_tokens),  # no prefix cache here
                             ("generation_tokens_histogram", gen.completion_tokens)):
            self._series(f"sglang:{name}").observe(tokens)
        if gen.first_token is None:
            return
        self._series("sglang:time_to_first_token_seconds", **labels).observe(gen.first_token.monotonic - started)
        self._inter_token_latencies(gen)
        if gen.completion_tokens > 1 and finished > gen.first_token.monotonic:  # get_time_per_output_token
            self._series("sglang:request_time_per_output_token_seconds", **labels).observe(
                (finished - gen.first_token.monotonic) / (gen.completion_tokens - 1))

    def _inter_token_latencies(self, gen) -> None:
        """observe_inter_token_latency per step after the first: the step's interval spread over its tokens, one
        observation per token, added at once as SGLang does (the sum by the interval, one bucket by the count)."""
        latency = self._series("sglang:inter_token_latency_seconds")
        times, counts = gen.emission_monotonic, gen.emission_tokens
        total, buckets = 0.0, dict.fromkeys(range(len(latency._upper_bounds)), 0)  # added up here: one locked inc each
        for step in range(1, len(times)):
            if counts[step] > 0:
                interval = times[step] - times[step - 1]
                total += interval
                buckets[bisect.bisect_left(latency._upper_bounds, interval / counts[step])] += counts[step]
        latency._sum.inc(total)
        for bucket, count in buckets.items():
            if count:
                latency._buckets[bucket].inc(count)

    # --- the HTTP server's (http_request_metrics.py: by the route's path) ---------------------------

    def http_started(self, endpoint: str, method: str) -> None:
        self._series("sglang:http_requests", endpoint=endpoint, method=method).inc()
        self._series("sglang:http_requests_active", endpoint=endpoint, method=method).inc()

    def http_finished(self, endpoint: str, method: str, status: int | None) -> None:
        if status is not None:
            self._series("sglang:http_responses", endpoint=endpoint, method=method, status_code=str(status)).inc()
        self._series("sglang:http_requests_active", endpoint=endpoint, method=method).dec()

    def render(self) -> bytes:
        now = time.process_time()
        self._series("sglang:process_cpu_seconds", component=CPU_COMPONENT).inc(max(now - self._cpu_seconds, 0.0))
        self._cpu_seconds = now
        return generate_latest(_AsMultiprocess(self.registry))


class _AsMultiprocess:
    """The registry as SGLang exposes its metrics: prometheus_client in multiprocess mode
    (utils/common.py add_prometheus_middleware, MultiProcessCollector), where a family appears only once it
    has a sample (a labelled counter after its first ``.labels()``, not even HELP/TYPE before) and counters
    carry no ``_created`` series."""

    def __init__(self, registry: CollectorRegistry):
        self._registry = registry

    def collect(self):
        for family in self._registry.collect():
            family.samples = [sample for sample in family.samples if not sample.name.endswith("_created")]
            if family.samples:
                yield family
