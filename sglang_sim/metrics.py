"""``/metrics`` in Prometheus text, with SGLang's metric names and labels (observability/metrics_collector.py).

One registry per server (no process-global state). Counters move when a request finishes, by
the tokens it really produced; the spec gauges hold the last logging window, as in SGLang.
prometheus_client drops a counter name's ``_total`` and adds it back on exposition, so
``sglang:prompt_tokens`` here is ``sglang:prompt_tokens_total`` on the wire, as SGLang's.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sglang_sim.args import ServerArgs

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                15.0, 20.0, 25.0, 30.0, 60.0, 120.0)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 150.0,
               200.0, 300.0, 400.0, 600.0, 1200.0, 1800.0, 2400.0)


class ServerMetrics:
    def __init__(self, args: ServerArgs, num_dp_ranks: int):
        self.registry = CollectorRegistry()
        engine_type = {"prefill": "prefill", "decode": "decode"}.get(args.disaggregation_mode, "unified")
        self._labels = {"model_name": args.model_name, "engine_type": engine_type}
        self._with_dp_rank = num_dp_ranks > 1
        scheduler_labels = [*self._labels, "tp_rank", "pp_rank", "moe_ep_rank"] + (["dp_rank"] if self._with_dp_rank
                                                                                    else [])
        request_labels = [*self._labels, "is_streaming"]
        registry = self.registry
        self.num_running_reqs = Gauge("sglang:num_running_reqs", "The number of running requests.",
                                      scheduler_labels, registry=registry, multiprocess_mode="mostrecent")
        self.spec_accept_length = Gauge(
            "sglang:spec_accept_length",
            "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).",
            scheduler_labels, registry=registry, multiprocess_mode="mostrecent")
        self.spec_accept_rate = Gauge(
            "sglang:spec_accept_rate",
            "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).",
            scheduler_labels, registry=registry, multiprocess_mode="mostrecent")
        self.prompt_tokens = Counter("sglang:prompt_tokens", "Number of prefill tokens processed.",
                                     request_labels, registry=registry)
        self.generation_tokens = Counter("sglang:generation_tokens", "Number of generation tokens processed.",
                                         request_labels, registry=registry)
        # SGLang 0.5.23: TokenizerMetricsCollector.__init__ (observability/metrics_collector.py); no
        # is_streaming label, and observe_one_finished_request adds each finished request's spec_verify_ct.
        self.spec_verify_calls = Counter("sglang:spec_verify_calls",
                                         "Number of speculative decoding verification calls.",
                                         list(self._labels), registry=registry)
        self.num_requests = Counter("sglang:num_requests", "Number of requests processed.",
                                    request_labels, registry=registry)
        self.time_to_first_token = Histogram("sglang:time_to_first_token_seconds",
                                             "Histogram of time to first token in seconds.", request_labels,
                                             buckets=TTFT_BUCKETS, registry=registry)
        self.e2e_request_latency = Histogram("sglang:e2e_request_latency_seconds",
                                             "Histogram of End-to-end request latency in seconds",
                                             request_labels, buckets=E2E_BUCKETS, registry=registry)
        for rank in range(num_dp_ranks):
            self.num_running_reqs.labels(**self._scheduler(rank)).set(0)

    def _scheduler(self, dp_rank: int) -> dict:
        labels = {**self._labels, "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
        if self._with_dp_rank:
            labels["dp_rank"] = str(dp_rank)
        return labels

    def _request(self, streaming: bool) -> dict:
        return {**self._labels, "is_streaming": "true" if streaming else "false"}

    def running_changed(self, dp_rank: int, running: int) -> None:
        self.num_running_reqs.labels(**self._scheduler(dp_rank)).set(running)

    def spec_window(self, dp_rank: int, accept_length: float, accept_rate: float) -> None:
        self.spec_accept_length.labels(**self._scheduler(dp_rank)).set(accept_length)
        self.spec_accept_rate.labels(**self._scheduler(dp_rank)).set(accept_rate)

    def request_finished(self, gen, streaming: bool) -> None:
        labels = self._request(streaming)
        self.num_requests.labels(**labels).inc()
        self.prompt_tokens.labels(**labels).inc(gen.prompt_tokens)
        self.generation_tokens.labels(**labels).inc(gen.completion_tokens)
        if gen.spec is not None and gen.spec.verify_ct > 0:  # as SGLang: only when the request verified
            self.spec_verify_calls.labels(**self._labels).inc(gen.spec.verify_ct)
        started = gen.arrived.monotonic
        if gen.first_token is not None:
            self.time_to_first_token.labels(**labels).observe(gen.first_token.monotonic - started)
        self.e2e_request_latency.labels(**labels).observe((gen.finished_at or started) - started)

    def render(self) -> bytes:
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
