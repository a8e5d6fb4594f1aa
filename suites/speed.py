"""Streaming latency and throughput, by sglang.bench_serving's definitions (CONTRACT.md).

Per request (chat completions, streamed with ``stream_options={"include_usage": True,
"continuous_usage_stats": True}``):
- TTFT: from sending to the first chunk with non-empty content or reasoning content;
- E2E: from sending to the end of the stream;
- TPOT: (E2E − TTFT) / (completion_tokens − 1), completion_tokens from ``usage``, for requests with more
  than one output token (sglang/benchmark/serving.py ``calculate_metrics``: ``tpots.append(...)``);
- ITL per chunk (``itl_chunk_ms_*``): the gaps between later such chunks, one value per chunk; a chunk
  carries several tokens under speculation (``async_request_openai_chat_completions``: ``output.itl.append``);
- ITL per token (``itl_token_ms_*``): each gap divided by the tokens of its chunk and counted once per
  token (``calculate_metrics``: ``adjusted_itl = itl / num_tokens``, ``extend([adjusted_itl] *
  num_tokens)``). The tokens of a chunk come from the server's per-chunk ``usage`` (SGLang's
  ``continuous_usage_stats``: exact, where bench_serving re-tokenizes the chunk's text);
- ``itl_ms_*`` is what bench_serving prints as ITL: per token when ``/server_info`` reports a
  speculative accept length (``use_retokenized_itl``), per chunk otherwise. Without speculation every
  chunk is one token and the two definitions agree.
Percentiles are numpy's default (linear), as bench_serving's ``np.percentile``.
Run level: output throughput = Σ completion_tokens / wall time of the measured phase (first send to last
end); warm-up requests are excluded; at most ``concurrency`` requests in flight (a semaphore).

Before the timed window the client warms up (``warmup_requests`` generations) and then opens as many
connections as it will keep streams open (``concurrency`` concurrent ``GET /v1/models``), as a
long-running client holds its pool: at high concurrency, opening hundreds of connections inside the
window would otherwise be counted as TTFT. The client's own overhead is reported beside TTFT: its event
loop's lag and each request's time to the response headers (TTFB).

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
import json
import multiprocessing
import random
import statistics
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
from dspark_ci.ground.stats import bootstrap_stderr, ratio_stderr
from dspark_ci.suites import offcpu
from dspark_ci.suites.config import RoleURL
from dspark_ci.suites.offcpu import StallCount, ThreadTimes
from dspark_ci.suites.server import Server
from dspark_ci.suites.ttft_split import RoleReading, read_roles

if TYPE_CHECKING:
    import openai

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
    def from_options(cls, options: Mapping[str, Any]) -> SpeedSettings:
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
    # tokens in each chunk of ``itl`` (from the server's per-chunk usage); None: the server gave no per-chunk usage
    itl_tokens: tuple[int, ...] | None = None
    ttfb: float | None = None  # seconds from sending to the response headers: the client's send + server's read

    @property
    def ok(self) -> bool:
        return self.finished() is not None

    def finished(self) -> FinishedRequest | None:
        """This request as one that streamed to its end with its usage, or None if it did not."""
        if self.error is not None or self.ttft is None or self.e2e is None or self.completion_tokens is None:
            return None
        return FinishedRequest(self.start, self.ttft, self.e2e, self.itl, self.completion_tokens, self.prompt_tokens,
                               self.itl_tokens)

    @property
    def tpot(self) -> float | None:
        finished = self.finished()
        return None if finished is None else finished.tpot

    def token_itl(self) -> list[float] | None:
        return per_token_itl(self.itl, self.itl_tokens)


@dataclass(frozen=True)
class FinishedRequest:
    """A request that streamed to its end with its usage (``RequestTiming.finished``): every figure is known."""

    start: float
    ttft: float
    e2e: float
    itl: tuple[float, ...]
    completion_tokens: int
    prompt_tokens: int | None
    itl_tokens: tuple[int, ...] | None

    @property
    def tpot(self) -> float | None:
        """None for a single output token: there is no time per output token after the first."""
        if self.completion_tokens <= 1:
            return None
        return (self.e2e - self.ttft) / (self.completion_tokens - 1)

    def token_itl(self) -> list[float] | None:
        return per_token_itl(self.itl, self.itl_tokens)


def per_token_itl(itl: Sequence[float], itl_tokens: Sequence[int] | None) -> list[float] | None:
    """Per-token ITL as bench_serving computes it: each chunk gap / the chunk's tokens, once per token.
    A chunk without new tokens (a step split into reasoning and content) passes its gap on to the next.
    None when the server gave no per-chunk usage."""
    if itl_tokens is None:
        return None
    values: list[float] = []
    pending = 0.0
    for gap, tokens in zip(itl, itl_tokens, strict=False):
        pending += gap
        if tokens > 0:
            values.extend([pending / tokens] * tokens)
            pending = 0.0
    return values


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
    # A disaggregated deployment's servers: their /metrics are read as the window opens (dspark_ci.suites.ttft_split),
    # by the worker that ``reads_roles`` while the others wait
    roles: tuple[RoleURL, ...] = ()
    reads_roles: bool = False
    # The deployment's scheduler processes (dspark_ci.suites.offcpu): read right before and after the window by the
    # worker that ``reads_roles``
    scheduler_pids: tuple[int, ...] = ()


@dataclass(frozen=True)
class WorkerResult:
    timings: tuple[RequestTiming, ...]
    loop_lag_ms: tuple[float, ...]  # how late the event loop woke a 10 ms sleeper: >> 0 means saturated
    connections_warmed: int | None = None  # connections opened before the window (None: the client cannot tell)
    connections_opened_in_window: int | None = None  # 0 when the warmed pool sufficed
    roles_at_window: tuple[RoleReading, ...] | None = None  # the roles' /metrics as the window opened
    schedulers_at_window: tuple[ThreadTimes, ...] = ()  # the schedulers' schedstat as the window opened
    schedulers_after_window: tuple[ThreadTimes, ...] = ()  # and as this worker's last request ended
    scheduler_stalls: tuple[StallCount, ...] = ()  # how often none of a scheduler's threads was runnable


# ---------------------------------------------------------------- prompts


def calibrate(server: Server) -> tuple[float, float]:
    """(overhead tokens, tokens per word) of this server's chat template and tokenizer."""
    client = server.client()
    measured = []
    for words in CALIBRATION_WORDS:
        response = client.chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": random_text(random.Random(words), words)}],
            max_tokens=1, temperature=0.0)
        if response.usage is None:
            raise RuntimeError(f"{server.api_base}: the calibration response has no usage (prompt_tokens)")
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
    """Warm up, open the pool, wait for the other workers, then measure. Runs in the calling or a spawned process."""
    return asyncio.run(_run_worker(job, barrier))


async def _run_worker(job: WorkerJob, barrier) -> WorkerResult:
    client_classes: dict[str, type[AiohttpStreams] | type[OpenAIStreams]] = {"aiohttp": AiohttpStreams,
                                                                              "openai": OpenAIStreams}
    client_class = client_classes[job.client]
    async with client_class.open(job) as client:
        await _run_phase(client, job, job.warmup_prompts)
        if barrier is not None:
            await asyncio.to_thread(barrier.wait)
        # Right before the window: SGLang closes a connection idle for 5 s (SGLANG_TIMEOUT_KEEP_ALIVE).
        warmed = await client.open_connections(job.concurrency)
        roles_at_window = await _roles_at_window(job, barrier)
        opened_before = client.connections_opened
        lag: list[float] = []
        probe = asyncio.create_task(_probe_loop_lag(lag))
        sampler = offcpu.StallSampler(job.scheduler_pids if job.reads_roles else ()).start()
        schedulers_before = offcpu.read(job.scheduler_pids) if job.reads_roles else ()
        timings = await _run_phase(client, job, job.prompts)
        schedulers_after = offcpu.read(job.scheduler_pids) if job.reads_roles else ()
        stalls = sampler.stop()
        probe.cancel()
        opened_after = client.connections_opened  # None for both when the client cannot tell
        in_window = None if opened_before is None or opened_after is None else opened_after - opened_before
    return WorkerResult(timings=tuple(timings), loop_lag_ms=tuple(lag), connections_warmed=warmed,
                        connections_opened_in_window=in_window, roles_at_window=roles_at_window,
                        schedulers_at_window=schedulers_before, schedulers_after_window=schedulers_after,
                        scheduler_stalls=stalls)


async def _roles_at_window(job: WorkerJob, barrier) -> tuple[RoleReading, ...] | None:
    """The roles' /metrics right before the window: read by one worker, the others held until it has (no request of
    the window may finish a stage before the read, none of the warm-up after it)."""
    if not job.roles:
        return None
    reading = await asyncio.to_thread(read_roles, job.roles) if job.reads_roles else None
    if barrier is not None:
        await asyncio.to_thread(barrier.wait)
    return reading


async def _run_phase(client: AiohttpStreams | OpenAIStreams, job: WorkerJob,
                     prompts: Sequence[str]) -> list[RequestTiming]:
    semaphore = asyncio.Semaphore(job.concurrency)
    requests = [client.prepare(job, prompt) for prompt in prompts]  # built before the first send

    async def limited(request) -> RequestTiming:
        async with semaphore:
            return await client.stream(job, request)

    tasks = []
    for request in requests:
        tasks.append(asyncio.create_task(limited(request)))
        # One turn of the loop per request, so each reaches the socket as soon as its clock starts: before
        # Python 3.12 aiohttp writes a request from a task of its own, which would otherwise queue behind the
        # start of every other request of a burst, the clock running (at 256 streams, ~20 ms of client time
        # counted as TTFT).
        await asyncio.sleep(0)
    return list(await asyncio.gather(*tasks))


class _RequestClock:
    """One request's timestamps, as bench_serving takes them."""

    def __init__(self) -> None:
        self.start_wall, self.start = time.monotonic(), time.perf_counter()
        self.ttft: float | None = None  # seconds from the send
        self.ttfb: float | None = None
        self.last: float | None = None  # perf_counter() of the latest content chunk
        self.end: float | None = None
        self.itl: list[float] = []
        self.itl_tokens: list[int] | None = []
        self.tokens_seen = 0
        self.chunks = 0
        self.completion_tokens: int | None = None
        self.prompt_tokens: int | None = None
        self.response_id: str | None = None

    def headers_arrived(self) -> None:
        self.ttfb = time.perf_counter() - self.start

    def event_arrived(self, response_id: str | None) -> None:
        if self.response_id is None:
            self.response_id = response_id

    def text_arrived(self, tokens_so_far: int | None) -> None:
        """A chunk with content; ``tokens_so_far``: its usage.completion_tokens (continuous usage), if any."""
        now = time.perf_counter()
        self.chunks += 1
        tokens = None if tokens_so_far is None else tokens_so_far - self.tokens_seen
        if tokens_so_far is not None:
            self.tokens_seen = tokens_so_far
        if self.last is None:  # the first content chunk (both are set here only)
            self.ttft = now - self.start
        else:
            self.itl.append(now - self.last)
            if tokens is None:
                self.itl_tokens = None  # one chunk without usage: no per-token ITL for this request
            elif self.itl_tokens is not None:
                self.itl_tokens.append(tokens)
        self.last = now

    def usage_arrived(self, prompt_tokens: int | None, completion_tokens: int | None) -> None:
        self.prompt_tokens, self.completion_tokens = prompt_tokens, completion_tokens

    def done_arrived(self) -> None:
        """``[DONE]``: the end of the request, as bench_serving times its latency (the last line read)."""
        self.end = time.perf_counter()

    def result(self, error: str | None = None) -> RequestTiming:
        e2e = None if error else (self.end or time.perf_counter()) - self.start
        if error is None and self.completion_tokens is None:
            error = "no usage in the stream"
        itl_tokens = tuple(self.itl_tokens) if self.itl_tokens is not None else None
        return RequestTiming(self.start_wall, self.ttft, e2e, tuple(self.itl), self.completion_tokens,
                             self.prompt_tokens, self.chunks, error=error, response_id=self.response_id,
                             itl_tokens=itl_tokens, ttfb=self.ttfb)


def _payload(job: WorkerJob, prompt: str) -> dict:
    # continuous_usage_stats: SGLang puts the running usage in every content chunk, which gives each
    # chunk's token count exactly (per-token ITL) without a tokenizer.
    return {"model": job.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": job.max_tokens,
            "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "ignore_eos": job.ignore_eos}


class AiohttpStreams:
    """The default client: one aiohttp session for the whole worker, the event stream read line by line."""

    def __init__(self, job: WorkerJob):
        self._session: aiohttp.ClientSession | None = None
        self._url = f"{job.api_base}/chat/completions"
        self._headers = {"Authorization": f"Bearer {job.api_key}", "Content-Type": "application/json"}
        self._models_url = f"{job.api_base}/models"
        self.connections_opened = 0

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, job: WorkerJob) -> AsyncIterator[AiohttpStreams]:
        client = cls(job)
        trace = aiohttp.TraceConfig()  # its signals freeze with the session: connect them first
        trace.on_connection_create_end.append(client._count_connection)
        # limit=0: no connection cap of our own; the semaphore is the concurrency limit.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), trace_configs=[trace],
                                         timeout=aiohttp.ClientTimeout(total=job.timeout)) as session:
            client._session = session
            yield client

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("AiohttpStreams is used inside `AiohttpStreams.open(job)` only")
        return self._session

    async def _count_connection(self, session, context, params) -> None:
        self.connections_opened += 1

    async def open_connections(self, count: int) -> int:
        """Hold ``count`` requests open at once so the pool keeps that many connections; returns how many it opened."""
        before = self.connections_opened

        async def touch() -> None:
            async with self.session.get(self._models_url, headers=self._headers) as response:
                await response.read()

        await asyncio.gather(*(touch() for _ in range(count)), return_exceptions=True)
        return self.connections_opened - before

    def prepare(self, job: WorkerJob, prompt: str) -> bytes:
        return json.dumps(_payload(job, prompt)).encode()

    async def stream(self, job: WorkerJob, body: bytes) -> RequestTiming:
        clock = _RequestClock()
        try:
            async with self.session.post(self._url, data=body, headers=self._headers) as response:
                clock.headers_arrived()
                if response.status != 200:
                    return clock.result(f"HTTP {response.status}: {(await response.text())[:300]}")
                # Read to the end of the body, past [DONE]: a response left unread closes its connection, and
                # the next request would time opening a new one.
                async for data in sse_data(response.content):
                    if data == "[DONE]":
                        clock.done_arrived()
                        continue
                    error = _read_event(clock, json.loads(data))
                    if error:
                        return clock.result(error)
        except Exception as err:  # a broken stream is a measurement failure, whatever raised it
            return clock.result(f"{type(err).__name__}: {err}")
        return clock.result()


def _read_event(clock: _RequestClock, event: dict) -> str | None:
    """Timestamp one chat.completion.chunk; an error message if the event is an error."""
    clock.event_arrived(event.get("id"))
    if "error" in event:
        return f"error event: {event['error']}"
    usage = event.get("usage") or {}
    if usage:  # the running count (continuous usage), then the final figure: the last one read stands
        clock.usage_arrived(usage.get("prompt_tokens"), usage.get("completion_tokens"))
    choices = event.get("choices") or []
    if not choices:
        return None
    delta = choices[0].get("delta") or {}
    if delta.get("content") or delta.get("reasoning_content"):
        clock.text_arrived(usage.get("completion_tokens"))
    return None


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


class OpenAIStreams:
    """``client: openai``: the official client, for cross-checks (costly per chunk: BENCHMARKS.md)."""

    connections_opened = None  # httpx does not say when it opens a connection

    def __init__(self, client: openai.AsyncOpenAI):
        self._client = client

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, job: WorkerJob) -> AsyncIterator[OpenAIStreams]:
        import openai  # on use: 1.5 s of import that the default client (aiohttp) never needs

        async with openai.AsyncOpenAI(base_url=job.api_base, api_key=job.api_key, timeout=job.timeout,
                                      max_retries=0) as client:
            yield cls(client)

    async def open_connections(self, count: int) -> None:
        await asyncio.gather(*(self._client.models.list() for _ in range(count)), return_exceptions=True)

    def prepare(self, job: WorkerJob, prompt: str) -> str:
        return prompt

    async def stream(self, job: WorkerJob, prompt: str) -> RequestTiming:
        clock = _RequestClock()
        payload = _payload(job, prompt)
        try:
            stream = await self._client.chat.completions.create(
                model=job.model, messages=payload["messages"], max_tokens=job.max_tokens, temperature=0.0,
                stream=True, stream_options=payload["stream_options"], extra_body={"ignore_eos": job.ignore_eos})
            clock.headers_arrived()
            async for chunk in stream:
                error = _read_event(clock, chunk.model_dump())
                if error:
                    return clock.result(error)
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
                    warmup_prompts: Sequence[str], roles: Sequence[RoleURL] = (),
                    scheduler_pids: Sequence[int] = ()) -> list[WorkerResult]:
    """The workers' results; with ``roles``, the first one's ``roles_at_window`` holds their /metrics as the window
    opened; with ``scheduler_pids``, its ``schedulers_*`` their schedstat around the window
    (dspark_ci.suites.offcpu)."""
    workers = min(settings.workers, settings.concurrency)  # each worker keeps at least one stream open
    jobs = [
        WorkerJob(api_base=server.api_base, api_key=server.api_key, model=server.model,
                  timeout=server.request_timeout, prompts=tuple(prompts[w::workers]),
                  warmup_prompts=tuple(warmup_prompts[w::workers]),
                  concurrency=settings.concurrency // workers + (1 if w < settings.concurrency % workers else 0),
                  max_tokens=settings.output_len, ignore_eos=settings.ignore_eos, client=settings.client,
                  roles=tuple(roles), reads_roles=w == 0, scheduler_pids=tuple(scheduler_pids))
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


def distribution(name: str, values: Sequence[float]) -> dict[str, float | None]:
    """``name_mean``, ``_median``, ``_p90``, ``_p99`` of ``values``, as bench_serving prints them (None when empty)."""
    if not values:
        return dict.fromkeys((f"{name}_mean", f"{name}_median", f"{name}_p90", f"{name}_p99"))
    return {f"{name}_mean": statistics.fmean(values), f"{name}_median": statistics.median(values),
            f"{name}_p90": percentile(values, 90), f"{name}_p99": percentile(values, 99)}


def server_reports_accept_length(server: Server) -> bool:
    """bench_serving's test for per-token ITL: ``/server_info`` internal_states[0] has an accept length
    (``benchmark()``, after the run; a PD deployment answers for its decode side)."""
    info = server.get_json("/server_info") or {}
    if "decode" in info:
        info = (info.get("decode") or [{}])[0]
    states = info.get("internal_states") or [{}]
    return bool(states[0].get("avg_spec_accept_length"))


def speed_metrics(timings: Sequence[RequestTiming], per_token_itl: bool) -> dict[str, float | None]:
    """The speed metrics of the successful requests; ``per_token_itl``: bench_serving would print per-token
    ITL (``server_reports_accept_length``), so ``itl_ms_*`` is ``itl_token_ms_*`` when it can be computed."""
    done = [finished for finished in (t.finished() for t in timings) if finished is not None]
    if not done:
        return {}
    chunk_itl_ms = [gap * 1000 for t in done for gap in t.itl]
    token_itls = [values for values in (t.token_itl() for t in done) if values is not None]
    # Per-token ITL only when every request has it (one request without per-chunk usage: none).
    token_itl_ms = [gap * 1000 for values in token_itls for gap in values] if len(token_itls) == len(done) else None
    wall = max(t.start + t.e2e for t in done) - min(t.start for t in done)
    metrics = {
        **distribution("ttft_ms", [t.ttft * 1000 for t in done]),
        **distribution("tpot_ms", [t.tpot * 1000 for t in done if t.tpot is not None]),
        **distribution("itl_ms", token_itl_ms if per_token_itl and token_itl_ms is not None else chunk_itl_ms),
        **distribution("itl_chunk_ms", chunk_itl_ms),
        **distribution("itl_token_ms", token_itl_ms or []),
        "e2e_latency_s_mean": statistics.fmean(t.e2e for t in done),
        "output_throughput_tok_s": sum(t.completion_tokens for t in done) / wall if wall > 0 else None,
        "input_tokens_mean": statistics.fmean(t.prompt_tokens or 0 for t in done),
        "output_tokens_mean": statistics.fmean(t.completion_tokens for t in done),
        **request_stderrs(done),
    }
    return {name: value for name, value in metrics.items() if value is not None}


def request_stderrs(done: Sequence[FinishedRequest]) -> dict[str, float | None]:
    """This boot's per-request standard errors of median TPOT and of throughput (bootstrap over requests): the
    per-request part of their noise, which the statistical gates keep apart from the per-boot part. Throughput's
    relative error is taken as that of Σ tokens / Σ latency over the requests (the wall time is one number)."""
    tpots = [t.tpot * 1000 for t in done if t.tpot is not None]
    tokens, latency = [t.completion_tokens for t in done], [t.e2e for t in done]
    relative = ratio_stderr(tokens, latency)
    wall = max(t.start + t.e2e for t in done) - min(t.start for t in done)
    throughput = sum(tokens) / wall if wall > 0 else None
    return {"tpot_ms_median_stderr": bootstrap_stderr(tpots, "median"),
            "output_throughput_tok_s_stderr": (relative / (sum(tokens) / sum(latency)) * throughput
                                               if relative is not None and throughput else None)}


def client_overhead_metrics(results: Sequence[WorkerResult]) -> dict[str, float]:
    """What the client itself adds, beside TTFT: how late its event loop ran (p99) and the time to the response
    headers (send, then the server's read; TTFT − TTFB is the server's prefill and the client's reading)."""
    lag = [value for result in results for value in result.loop_lag_ms]
    ttfb_ms = [t.ttfb * 1000 for result in results for t in result.timings if t.ok and t.ttfb is not None]
    metrics = {"client_loop_lag_ms_p99": percentile(lag, 99) if lag else None,
               "client_ttfb_ms_median": statistics.median(ttfb_ms) if ttfb_ms else None,
               "client_ttfb_ms_p99": percentile(ttfb_ms, 99) if ttfb_ms else None}
    return {name: value for name, value in metrics.items() if value is not None}


def timing_record(timing: RequestTiming) -> dict:
    record = asdict(timing)
    del record["itl"], record["itl_tokens"]  # thousands of numbers per request; counts and means are enough here
    token_itl = timing.token_itl()
    record.update(itl_count=len(timing.itl),
                  itl_chunk_ms_mean=statistics.fmean(timing.itl) * 1000 if timing.itl else None,
                  itl_token_ms_mean=statistics.fmean(token_itl) * 1000 if token_itl else None, tpot=timing.tpot)
    return record
