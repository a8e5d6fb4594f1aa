"""The server's side of each request, from the simulator's emission log (``DSPARK_SIM_EMISSION_LOG``).

Every line is one finished request: its ``rid`` (the stream's ``id``, which the speed suite records as
``RequestTiming.response_id``), when the simulator parsed it, and when it handed out each emission (the
prefill token, then each decode or verify step's tokens) with that emission's token count, on
``time.monotonic()``. Client and simulator run on the same host, so the client's own
``time.monotonic()`` readings compare with those directly (sglang_sim/README.md, "Emission log").
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from dspark_ci.suites.speed import RequestTiming

T = TypeVar("T")
FLUSH_WAIT_SECONDS = 5.0  # the simulator flushes its log within 0.5 s; leave room for a busy machine


@dataclass(frozen=True)
class ServerTimes:
    """One request as the simulator emitted it (seconds on CLOCK_MONOTONIC)."""

    arrival: float  # the request parsed
    first_token: float  # the first token handed to the HTTP handler, which writes it in the same turn
    last_token: float
    completion_tokens: int
    emissions: tuple[float, ...] = ()  # each emission handed to the handler: a chunk on the wire
    emission_tokens: tuple[int, ...] = ()  # tokens in each emission

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def tpot(self) -> float:
        return (self.last_token - self.first_token) / (self.completion_tokens - 1)

    def chunk_itl(self) -> list[float]:
        """The gaps between emissions after the first: what a client's per-chunk ITL should read."""
        return [later - earlier for earlier, later in zip(self.emissions, self.emissions[1:], strict=False)]

    def token_itl(self) -> list[float]:
        """Each gap / its emission's tokens, once per token: bench_serving's per-token ITL, at the source."""
        return [gap / tokens for gap, tokens in zip(self.chunk_itl(), self.emission_tokens[1:], strict=False)
                for _ in range(tokens)]


@dataclass(frozen=True)
class PairedRequest:
    """The same request seen by the speed suite (client) and by the simulator (server)."""

    client: RequestTiming
    server: ServerTimes

    @property
    def before_server_s(self) -> float:
        """From the client's send to the simulator having parsed the request."""
        return self.server.arrival - self.client.start

    @property
    def after_first_token_s(self) -> float:
        """From the simulator handing out the first token to the client timestamping it."""
        return self.client.start + self.client.ttft - self.server.first_token

    @property
    def ttft_excess_s(self) -> float:
        """Client TTFT − server TTFT = before_server_s + after_first_token_s, exactly."""
        return self.client.ttft - self.server.ttft


def pair_with_server(timings: Sequence[RequestTiming], log_path: Path) -> list[PairedRequest]:
    """Match each measured request to its log line by response id."""
    found = wait_for_server_times({t.response_id for t in timings}, log_path)
    return [PairedRequest(t, found[t.response_id]) for t in timings]


def wait_for_server_times(response_ids: set[str | None], log_path: Path) -> dict[str, ServerTimes]:
    """rid → ServerTimes for every id asked for, waiting for the log's next flush if need be."""
    if None in response_ids:
        raise SystemExit("a measured request has no response id: the stream carried no \"id\"")
    found = _poll(lambda: read_server_times(log_path, response_ids), lambda got: len(got) == len(response_ids))
    missing = len(response_ids) - len(found)
    if missing:
        raise SystemExit(f"{missing} of {len(response_ids)} measured requests are not in the emission log {log_path}")
    return found


def read_server_times(log_path: Path, wanted: set[str]) -> dict[str, ServerTimes]:
    """rid → ServerTimes for the wanted, completely logged requests."""
    return {record["rid"]: server_times(record) for record in _records(log_path)
            if record.get("rid") in wanted and record.get("last_token_monotonic") is not None}


def server_times(record: dict) -> ServerTimes:
    return ServerTimes(record["arrival_monotonic"], record["first_token_monotonic"], record["last_token_monotonic"],
                       record["completion_tokens"], tuple(record.get("emission_monotonic") or ()),
                       tuple(record.get("emission_tokens") or ()))


def last_arrivals(log_path: Path, count: int, total: int) -> list[ServerTimes]:
    """The ``count`` requests the simulator parsed last, once ``total`` requests are logged: a tool's measured
    requests when its warm-up ended before they began (bench_serving awaits its warm-up) and nothing else ran."""
    records = _poll(lambda: [server_times(record) for record in _records(log_path)
                             if record.get("last_token_monotonic")], lambda got: len(got) >= total)
    if len(records) != total:
        raise SystemExit(f"the emission log {log_path} holds {len(records)} finished requests, expected {total}")
    return sorted(records, key=lambda times: times.arrival)[-count:]


def _poll(read: Callable[[], T], complete: Callable[[T], bool]) -> T:
    """``read()`` until ``complete`` says so or FLUSH_WAIT_SECONDS pass (the log flushes every 0.5 s)."""
    deadline = time.monotonic() + FLUSH_WAIT_SECONDS
    while True:
        got = read()
        if complete(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def _records(log_path: Path) -> list[dict]:
    records = []
    for line in log_path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # the last line may still be half written
            continue
    return records
