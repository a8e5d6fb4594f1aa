"""Where "before the server saw the request" goes: the client's sending, or the server's reading.

The speed suite's aiohttp session cannot be traced from outside, so this sends requests the way the
bench's speed runs do (one session, no connection cap, a warm-up of min(concurrency, 16), then
max(8, 2 × concurrency) requests, at most ``concurrency`` at a time, each streamed to the end) with
aiohttp's request tracing, and cuts arrival − send where aiohttp has handed the request body to the
socket:
    client part = body written − send            (building the request, opening the connection, writing)
    server part = server arrival − body written   (loopback, then the server's loop accepting and parsing)
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass

import aiohttp

from bench.server_truth import wait_for_server_times
from suites.server import Server
from suites.speed import build_prompts, calibrate, sse_data

WARMUP_LIMIT = 16  # as the bench's speed runs warm up


@dataclass(frozen=True)
class SendTrace:
    """Means in ms; the first wave is the first ``concurrency`` requests, sent at once on mostly new
    connections; later requests are each sent, on a kept-alive connection, as an earlier one ends."""

    concurrency: int
    client_ms_first_wave: float  # send → body written
    client_ms_later: float
    server_ms_first_wave: float  # body written → the server parsed it
    server_ms_later: float
    arrival_spacing_ms: float  # (last − first arrival) / (n − 1) over the first wave: the server's pace

    @property
    def first_wave_ms(self) -> float:
        return self.client_ms_first_wave + self.server_ms_first_wave


class _TracedRequest:
    """Filled in while one request runs (by the request and by aiohttp's trace hook)."""

    def __init__(self):
        self.sent = time.monotonic()
        self.body_written: float | None = None
        self.response_id: str | None = None


def trace_sends(base_url: str, log_path, concurrency: int, input_len: int, output_len: int,
                repeats: int) -> SendTrace:
    """The repeat with the median first-wave time (the machine is shared)."""
    traces = sorted((trace_once(base_url, log_path, concurrency, input_len, output_len) for _ in range(repeats)),
                    key=lambda trace: trace.first_wave_ms)
    return traces[len(traces) // 2]


def trace_once(base_url: str, log_path, concurrency: int, input_len: int, output_len: int) -> SendTrace:
    server = Server(base_url=base_url, model="sim/model", api_key="EMPTY", request_timeout=600)
    overhead, per_word = calibrate(server)
    prompts = build_prompts(max(8, 2 * concurrency), input_len, overhead, per_word, seed=3)
    warmup = build_prompts(min(concurrency, WARMUP_LIMIT), input_len, overhead, per_word, seed=4)
    traced = asyncio.run(_traced_run(server, prompts, warmup, concurrency, output_len))
    arrivals = {rid: times.arrival for rid, times in
                wait_for_server_times({t.response_id for t in traced}, log_path).items()}
    in_send_order = sorted(traced, key=lambda t: t.sent)
    first_wave, later = in_send_order[:concurrency], in_send_order[concurrency:]
    first_arrivals = sorted(arrivals[t.response_id] for t in first_wave)
    return SendTrace(
        concurrency,
        client_ms_first_wave=_mean_ms(t.body_written - t.sent for t in first_wave),
        client_ms_later=_mean_ms(t.body_written - t.sent for t in later),
        server_ms_first_wave=_mean_ms(arrivals[t.response_id] - t.body_written for t in first_wave),
        server_ms_later=_mean_ms(arrivals[t.response_id] - t.body_written for t in later),
        arrival_spacing_ms=(first_arrivals[-1] - first_arrivals[0]) * 1000 / max(1, len(first_arrivals) - 1),
    )


def _mean_ms(seconds) -> float:
    return statistics.fmean(seconds) * 1000


async def _traced_run(server: Server, prompts, warmup, concurrency: int, output_len: int) -> list[_TracedRequest]:
    tracing = aiohttp.TraceConfig()
    tracing.on_request_chunk_sent.append(_body_written)
    connector = aiohttp.TCPConnector(limit=0)
    semaphore = asyncio.Semaphore(concurrency)

    async def limited(session: aiohttp.ClientSession, prompt: str) -> _TracedRequest:
        async with semaphore:
            return await _stream(session, server, prompt, output_len)

    async with aiohttp.ClientSession(connector=connector, trace_configs=[tracing]) as session:
        await asyncio.gather(*(limited(session, prompt) for prompt in warmup))
        return list(await asyncio.gather(*(limited(session, prompt) for prompt in prompts)))


async def _body_written(session, context, params) -> None:
    context.trace_request_ctx.body_written = time.monotonic()  # the last chunk of the body counts


async def _stream(session: aiohttp.ClientSession, server: Server, prompt: str, output_len: int) -> _TracedRequest:
    traced = _TracedRequest()
    payload = {"model": server.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": output_len,
               "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    async with session.post(f"{server.api_base}/chat/completions", json=payload, trace_request_ctx=traced,
                            headers={"Authorization": f"Bearer {server.api_key}"}) as response:
        response.raise_for_status()
        async for data in sse_data(response.content):
            if data == "[DONE]":
                break
            traced.response_id = traced.response_id or json.loads(data).get("id")
    return traced
