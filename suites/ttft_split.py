"""A disaggregated deployment's TTFT split by where the time went, as its prefill and decode servers report it.

SGLang's PD roles time each request's stages (python/sglang/srt/observability/req_time_stats.py: ``RequestStage``,
``SchedulerReqTimeStats``) and observe them in the histogram ``sglang:per_stage_req_latency_seconds{stage=...}``:
- a prefill server: ``prefill_bootstrap`` (its bootstrap queue: until the decode side has bootstrapped and
  preallocated the KV), ``prefill_forward``, ``prefill_transfer_kv_cache``; its wait for the forward between them
  (``prefill_waiting``) is not observed per stage but as ``sglang:queue_time_seconds`` ("equal to
  observe_queue_time");
- a decode server: ``decode_prepare``, ``decode_bootstrap``, ``decode_transferred`` (waiting for the transfer, which
  spans the prefill's whole part), ``decode_waiting`` (for a running slot), ``fake_output`` (the prebuilt batch that
  emits the prefill's token).

Each role's ``/metrics`` is read as the speed suite's window opens and once it closed; a stage's mean over the
window is Δsum / Δcount, over every instance of the role (as bench/speed_fidelity.py reads engine truth). The
figures, in ms:
- ``ttft_prefill_queue_ms`` = prefill_bootstrap + the prefill's queue time;
- ``ttft_transfer_ms`` = prefill_transfer_kv_cache;
- ``ttft_first_decode_ms`` = decode_waiting + fake_output.
They leave out the prefill's forward and what the router and the client add, so together they are at most the
measured TTFT. A figure whose role observed none of one of its stages in the window (a server without
``--enable-metrics``, or a release that does not time that stage) is absent: "not reported by the server".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import requests
from dspark_ci.suites.config import RoleURL
from prometheus_client.parser import text_string_to_metric_families

PER_STAGE = "sglang:per_stage_req_latency_seconds"
QUEUE_TIME = "sglang:queue_time_seconds"
NOT_REPORTED = "not reported by the server"


@dataclass(frozen=True)
class Source:
    """One histogram SGLang observes a stage in: a family, and its ``stage`` label's value when it has one."""

    family: str
    stage: str | None = None

    def __str__(self) -> str:
        return self.family if self.stage is None else f'{self.family}{{stage="{self.stage}"}}'


@dataclass(frozen=True)
class Figure:
    metric: str  # CONTRACT.md's name
    role: str  # whose /metrics report its stages
    sources: tuple[Source, ...]  # the stages it adds up


TTFT_SPLIT = (
    Figure("ttft_prefill_queue_ms", "prefill", (Source(PER_STAGE, "prefill_bootstrap"), Source(QUEUE_TIME))),
    Figure("ttft_transfer_ms", "prefill", (Source(PER_STAGE, "prefill_transfer_kv_cache"),)),
    Figure("ttft_first_decode_ms", "decode", (Source(PER_STAGE, "decode_waiting"), Source(PER_STAGE, "fake_output"))),
)
SOURCES = tuple(dict.fromkeys(source for figure in TTFT_SPLIT for source in figure.sources))


@dataclass(frozen=True)
class Observed:
    """A source's histogram totals at one read: Σ seconds and the number of observations."""

    source: Source
    seconds: float
    count: float


@dataclass(frozen=True)
class RoleReading:
    """One role instance's /metrics at one moment: every source's totals, or None when it served no metrics."""

    role: RoleURL
    observed: tuple[Observed, ...] | None

    def totals(self, source: Source) -> tuple[float, float]:
        found = [o for o in self.observed or () if o.source == source]
        return (found[0].seconds, found[0].count) if found else (0.0, 0.0)


@dataclass(frozen=True)
class Split:
    """The figures the servers reported (metric -> ms) and, for each one they did not, why."""

    metrics: dict[str, float]
    not_reported: tuple[str, ...]
    stage_means_ms: dict[str, float]  # "role source" -> mean ms over the window, for the speed_summary record


def parse_totals(text: str) -> tuple[Observed, ...]:
    """Each SOURCES histogram's Σ and count in a Prometheus text exposition, over its other labels (DP ranks)."""
    totals = {source: [0.0, 0.0] for source in SOURCES}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for source in SOURCES:
                if source.stage is not None and sample.labels.get("stage") != source.stage:
                    continue
                if sample.name == f"{source.family}_sum":
                    totals[source][0] += sample.value
                elif sample.name == f"{source.family}_count":
                    totals[source][1] += sample.value
    return tuple(Observed(source, seconds, count) for source, (seconds, count) in totals.items())


def read_roles(roles: Sequence[RoleURL], timeout_s: float = 30.0) -> tuple[RoleReading, ...]:
    """Every role instance's /metrics now; an instance that serves none (no --enable-metrics) or cannot be read
    reports nothing."""
    return tuple(RoleReading(role, _read(role.base_url, timeout_s)) for role in roles)


def _read(base_url: str, timeout_s: float) -> tuple[Observed, ...] | None:
    try:
        response = requests.get(f"{base_url}/metrics", timeout=timeout_s)
    except requests.RequestException:
        return None
    return parse_totals(response.text) if response.status_code == 200 else None


def ttft_split(before: Sequence[RoleReading], after: Sequence[RoleReading]) -> Split:
    """The figures over the window between two reads of the same role instances."""
    means = {(role, source): mean for role in {r.role.role for r in after} for source in SOURCES
             if (mean := _mean(role, source, before, after)) is not None}
    metrics, missing = {}, []
    for figure in TTFT_SPLIT:
        parts = [means.get((figure.role, source)) for source in figure.sources]
        if all(part is not None for part in parts):
            metrics[figure.metric] = sum(part for part in parts if part is not None) * 1000
        else:
            missing.append(_why(figure, [s for s, p in zip(figure.sources, parts, strict=False) if p is None], after))
    return Split(metrics, tuple(missing), {f"{role} {source}": mean * 1000 for (role, source), mean in means.items()})


def _mean(role: str, source: Source, before: Sequence[RoleReading], after: Sequence[RoleReading]) -> float | None:
    """Δsum / Δcount of ``source`` over the role's instances that reported both reads; None without observations."""
    start = {r.role: r for r in before if r.observed is not None}
    seconds = count = 0.0
    for reading in after:
        if reading.role.role == role and reading.observed is not None and reading.role in start:
            (s0, c0), (s1, c1) = start[reading.role].totals(source), reading.totals(source)
            seconds, count = seconds + s1 - s0, count + c1 - c0
    return seconds / count if count > 0 else None


def _why(figure: Figure, missing: list[Source], after: Sequence[RoleReading]) -> str:
    instances = [r for r in after if r.role.role == figure.role]
    if not instances:
        reason = f"no {figure.role} server given (--role-url {figure.role}=URL)"
    elif all(r.observed is None for r in instances):
        reason = f"the {figure.role} server serves no /metrics (SGLang: --enable-metrics)"
    else:
        reason = f"no {', '.join(map(str, missing))} observed on the {figure.role} server in the window"
    return f"{figure.metric} {NOT_REPORTED} ({reason})"
