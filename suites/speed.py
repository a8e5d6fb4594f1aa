"""Streaming latency and throughput, by sglang.bench_serving's definitions (CONTRACT.md).

Per request (chat completions, streamed with ``stream_options={"include_usage": True}``):
- TTFT: from sending to the first chunk with non-empty content or reasoning content;
- ITL: the gaps between later such chunks (a chunk may carry several tokens under speculation);
- E2E: from sending to the end of the stream;
- TPOT: (E2E − TTFT) / (completion_tokens − 1), completion_tokens from ``usage``, for requests with more
  than one output token.
Run level: output throughput = Σ completion_tokens / wall time of the measured phase (first send to last
end); warm-up requests are excluded; at most ``concurrency`` requests in flight (a semaphore).

Input length is set by prompt construction (random words, calibrated against ``usage.prompt_tokens``,
no tokenizer needed), output length by ``max_tokens`` with ``ignore_eos``. With ``workers`` > 1 the
requests and the concurrency are split over that many client processes, started together on a
barrier; they share CLOCK_MONOTONIC, so their timestamps compare (see BENCHMARKS.md for when it helps).

The streams are read with aiohttp by default (``client: aiohttp``): the same OpenAI chat request, the
event stream read line by line. ``client: openai`` streams through ``openai.AsyncOpenAI`` instead; it
costs far more CPU per request and per chunk, and at 64+ concurrent streams on a small machine it adds
hundreds of milliseconds to TTFT and inflates TPOT (bench/speed_fidelity.py, BENCHMARKS.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import multiprocessing
import random
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Sequence

import aiohttp
import openai

from suites.server import Server

# Common short English words: each is one token (with its leading space) in most BPE vocabularies.
WORDS = tuple(
    "the of and to in is you that it he was for on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up "
    "other about out many then them these so some her would make like him into time has look two more write "
    "go see number no way could people my than first water been call who oil its now find long down day did "
    "get come made may part".split()
)
CALIBRATION_WORDS = (32, 256)  # two prompt sizes: tokens = overhead + slope × words
LOOP_LAG_INTERVAL_S = 0.01


@dataclass(frozen=True)
class SpeedSettings:
    num_requests: int
    concurrency: int
    input_len: int
    output_len: int
    warmup_requests: int
    workers: int
    ignore_eos: bool
    client: str

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> "SpeedSettings":
        return cls(**{name: options[name] for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class RequestTiming:
    start: float  # time.monotonic() when sent (shared by all client processes)
    ttft: float | None  # seconds
    e2e: float | None
    itl: tuple[float, ...]  # seconds between content chunks after the first
    completion_tokens: int | None
    prompt_tokens: int | None
    chunks: int  # content chunks received
    error: str | None = None
    response_id: str | None = None  # the stream's "id": joins this request with server-side logs

    @property
    def ok(self) -> bool:
        return self.error is None and self.ttft is not None and self.completion_tokens is not None

    @property
    def tpot(self) -> float | None:
        if not self.ok or self.completion_tokens <= 1:
            return None
        return (self.e2e - self.ttft) / (self.completion_tokens - 1)


@dataclass(frozen=True)
class WorkerJob:
    api_base: str
    api_key: str
    model: str
    timeout: float
    prompts: tuple[str, ...]  # measured
    warmup_prompts: tuple[str, ...]
    concurrency: int
    max_tokens: int
    ignore_eos: bool
    client: str  # "aiohttp" | "openai"


@dataclass(frozen=True)
class WorkerResult:
    timings: tuple[RequestTiming, ...]
    loop_lag_ms: tuple[float, ...]  # how late the event loop woke a 10 ms sleeper: >> 0 means saturated


# ---------------------------------------------------------------- prompts


def calibrate(server: Server) -> tuple[float, float]:
    """(overhead tokens, tokens per word) of this server's chat template and tokenizer."""
    client = server.client()
    measured = []
    for words in CALIBRATION_WORDS:
        response = client.chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": random_text(random.Random(words), words)}],
            max_tokens=1, temperature=0.0)
        measured.append(response.usage.prompt_tokens)
    slope = (measured[1] - measured[0]) / (CALIBRATION_WORDS[1] - CALIBRATION_WORDS[0])
    return measured[0] - slope * CALIBRATION_WORDS[0], slope


def random_text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def build_prompts(count: int, input_len: int, overhead: float, tokens_per_word: float, seed: int) -> tuple[str, ...]:
    # Distinct random prompts so no request reuses another's prefix cache.
    words = max(1, round((input_len - overhead) / max(tokens_per_word, 1e-6)))
    return tuple(random_text(random.Random(seed * 1_000_003 + i), words) for i in range(count))


# ---------------------------------------------------------------- one process


def run_worker(job: WorkerJob, barrier=None) -> WorkerResult:
    """Warm up, wait for the other workers, then measure. Runs in the calling or a spawned process."""
    return asyncio.run(_run_worker(job, barrier))


async def _run_worker(job: WorkerJob, barrier) -> WorkerResult:
    async with _open_client(job) as stream_one:
        await _run_phase(stream_one, job, job.warmup_prompts)
        if barrier is not None:
            await asyncio.to_thread(barrier.wait)
        lag: list[float] = []
        probe = asyncio.create_task(_probe_loop_lag(lag))
        timings = await _run_phase(stream_one, job, job.prompts)
        probe.cancel()
    return WorkerResult(timings=tuple(timings), loop_lag_ms=tuple(lag))


@contextlib.asynccontextmanager
async def _open_client(job: WorkerJob) -> AsyncIterator[Callable[[WorkerJob, str], Awaitable[RequestTiming]]]:
    """A function that streams one request, bound to a client for the whole worker."""
    timeout = aiohttp.ClientTimeout(total=job.timeout)
    if job.client == "aiohttp":
        # limit=0: no connection cap of our own; the semaphore is the concurrency limit.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
            yield functools.partial(stream_with_aiohttp, session)
    else:
        async with openai.AsyncOpenAI(base_url=job.api_base, api_key=job.api_key, timeout=job.timeout,
                                      max_retries=0) as client:
            yield functools.partial(stream_with_openai, client)


async def _run_phase(stream_one, job: WorkerJob, prompts: Sequence[str]) -> list[RequestTiming]:
    semaphore = asyncio.Semaphore(job.concurrency)

    async def limited(prompt: str) -> RequestTiming:
        async with semaphore:
            return await stream_one(job, prompt)

    return list(await asyncio.gather(*(limited(p) for p in prompts)))


class _RequestClock:
    """One request's timestamps, as bench_serving takes them."""

    def __init__(self):
        self.start_wall, self.start = time.monotonic(), time.perf_counter()
        self.ttft = self.last = None
        self.itl: list[float] = []
        self.chunks = 0
        self.completion_tokens = self.prompt_tokens = None
        self.response_id = None

    def event_arrived(self, response_id: str | None) -> None:
        if self.response_id is None:
            self.response_id = response_id

    def text_arrived(self) -> None:
        now = time.perf_counter()
        self.chunks += 1
        if self.ttft is None:
            self.ttft = now - self.start
        else:
            self.itl.append(now - self.last)
        self.last = now

    def usage_arrived(self, prompt_tokens: int | None, completion_tokens: int | None) -> None:
        self.prompt_tokens, self.completion_tokens = prompt_tokens, completion_tokens

    def result(self, error: str | None = None) -> RequestTiming:
        e2e = None if error else time.perf_counter() - self.start
        if error is None and self.completion_tokens is None:
            error = "no usage in the stream"
        return RequestTiming(self.start_wall, self.ttft, e2e, tuple(self.itl), self.completion_tokens,
                             self.prompt_tokens, self.chunks, error=error, response_id=self.response_id)


def _payload(job: WorkerJob, prompt: str) -> dict:
    return {"model": job.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": job.max_tokens,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
            "ignore_eos": job.ignore_eos}


async def stream_with_aiohttp(session: aiohttp.ClientSession, job: WorkerJob, prompt: str) -> RequestTiming:
    clock = _RequestClock()
    try:
        async with session.post(f"{job.api_base}/chat/completions", json=_payload(job, prompt),
                                headers={"Authorization": f"Bearer {job.api_key}"}) as response:
            if response.status != 200:
                return clock.result(f"HTTP {response.status}: {(await response.text())[:300]}")
            async for data in sse_data(response.content):
                if data == "[DONE]":
                    break
                event = json.loads(data)
                clock.event_arrived(event.get("id"))
                if "error" in event:
                    return clock.result(f"error event: {event['error']}")
                if event.get("usage"):
                    clock.usage_arrived(event["usage"].get("prompt_tokens"), event["usage"].get("completion_tokens"))
                delta = (event.get("choices") or [{}])[0].get("delta") or {}
                if delta.get("content") or delta.get("reasoning_content"):
                    clock.text_arrived()
    except Exception as err:  # a broken stream is a measurement failure, whatever raised it
        return clock.result(f"{type(err).__name__}: {err}")
    return clock.result()


async def sse_data(content: aiohttp.StreamReader) -> AsyncIterator[str]:
    """The data of each server-sent event: its `data:` lines joined by newlines, dispatched at a
    blank line (the WHATWG event-stream rules; comments and other fields are ignored)."""
    lines: list[str] = []
    async for raw in content:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if lines:
                yield "\n".join(lines)
                lines = []
        elif line.startswith("data:"):
            lines.append(line[5:].removeprefix(" "))
    if lines:
        yield "\n".join(lines)


async def stream_with_openai(client: openai.AsyncOpenAI, job: WorkerJob, prompt: str) -> RequestTiming:
    clock = _RequestClock()
    payload = _payload(job, prompt)
    try:
        stream = await client.chat.completions.create(
            model=job.model, messages=payload["messages"], max_tokens=job.max_tokens, temperature=0.0,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": job.ignore_eos})
        async for chunk in stream:
            clock.event_arrived(chunk.id)
            if chunk.usage:
                clock.usage_arrived(chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
            if chunk.choices:
                delta = chunk.choices[0].delta
                if delta.content or getattr(delta, "reasoning_content", None):
                    clock.text_arrived()
    except Exception as err:
        return clock.result(f"{type(err).__name__}: {err}")
    return clock.result()


async def _probe_loop_lag(lag: list[float]) -> None:
    while True:
        before = time.perf_counter()
        await asyncio.sleep(LOOP_LAG_INTERVAL_S)
        lag.append((time.perf_counter() - before - LOOP_LAG_INTERVAL_S) * 1000)


# ---------------------------------------------------------------- several processes


def run_measurement(server: Server, settings: SpeedSettings, prompts: Sequence[str],
                    warmup_prompts: Sequence[str]) -> list[WorkerResult]:
    workers = min(settings.workers, settings.concurrency)  # each worker keeps at least one stream open
    jobs = [
        WorkerJob(api_base=server.api_base, api_key=server.api_key, model=server.model,
                  timeout=server.request_timeout, prompts=tuple(prompts[w::workers]),
                  warmup_prompts=tuple(warmup_prompts[w::workers]),
                  concurrency=settings.concurrency // workers + (1 if w < settings.concurrency % workers else 0),
                  max_tokens=settings.output_len, ignore_eos=settings.ignore_eos, client=settings.client)
        for w in range(workers)
    ]
    if workers == 1:
        return [run_worker(jobs[0])]
    context = multiprocessing.get_context("spawn")  # no fork of a process that holds threads and sockets
    with context.Manager() as manager, ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        barrier = manager.Barrier(workers)
        return list(pool.map(run_worker, jobs, [barrier] * workers))


# ---------------------------------------------------------------- numbers


def percentile(values: Sequence[float], q: float) -> float:
    """numpy.percentile's default (linear interpolation), as bench_serving reports p99."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def speed_metrics(timings: Sequence[RequestTiming]) -> dict[str, float | None]:
    done = [t for t in timings if t.ok]
    if not done:
        return {}
    ttft_ms = [t.ttft * 1000 for t in done]
    tpot_ms = [t.tpot * 1000 for t in done if t.tpot is not None]
    itl_ms = [gap * 1000 for t in done for gap in t.itl]
    wall = max(t.start + t.e2e for t in done) - min(t.start for t in done)
    metrics = {
        "ttft_ms_mean": statistics.fmean(ttft_ms), "ttft_ms_median": statistics.median(ttft_ms),
        "ttft_ms_p99": percentile(ttft_ms, 99),
        "itl_ms_mean": statistics.fmean(itl_ms) if itl_ms else None,
        "e2e_latency_s_mean": statistics.fmean(t.e2e for t in done),
        "output_throughput_tok_s": sum(t.completion_tokens for t in done) / wall if wall > 0 else None,
        "input_tokens_mean": statistics.fmean(t.prompt_tokens or 0 for t in done),
        "output_tokens_mean": statistics.fmean(t.completion_tokens for t in done),
    }
    if tpot_ms:
        metrics.update(tpot_ms_mean=statistics.fmean(tpot_ms), tpot_ms_median=statistics.median(tpot_ms),
                       tpot_ms_p99=percentile(tpot_ms, 99))
    return metrics


def timing_record(timing: RequestTiming) -> dict:
    record = asdict(timing)
    del record["itl"]  # thousands of numbers per request; the count and the mean are enough here
    record.update(itl_count=len(timing.itl), itl_ms_mean=statistics.fmean(timing.itl) * 1000 if timing.itl else None,
                  tpot=timing.tpot)
    return record
