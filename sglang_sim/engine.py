"""The simulated engine: requests spread over DP ranks, prefill, then verify steps on a clock.

One asyncio task per request; per step only a few integer updates and a sleep, so hundreds
of concurrent streams fit on two cores. Every statistic the server reports (meta_info,
/server_info, /metrics) is updated from the tokens this module actually hands out.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import random
import time
import uuid
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from dspark_ci.sglang_sim import logprobs
from dspark_ci.sglang_sim.admission import SglangEnv
from dspark_ci.sglang_sim.args import ServerArgs
from dspark_ci.sglang_sim.disaggregation import TRANSFERRED, alpha_now
from dspark_ci.sglang_sim.emission_log import EmissionLog
from dspark_ci.sglang_sim.noise import BootNoise
from dspark_ci.sglang_sim.prometheus import ServerMetrics
from dspark_ci.sglang_sim.reasoning import ReasoningCount
from dspark_ci.sglang_sim.sim_config import SimConfig
from dspark_ci.sglang_sim.speculation import AcceptModel, SpecShape, SpecStats, draw_accepted, prompt_category
from dspark_ci.sglang_sim.textgen import ARGMAX_PROBABILITY, Ask, Persona, argmax_mixed, reply_tokens
from dspark_ci.sglang_sim.tokenizer import EOS_TOKEN_ID, token_id

logger = logging.getLogger("sglang_sim")
DSPARK_RECORDS_KEPT = 1000
SPEC_BATCH_KNEE = 8  # running requests per rank up to which a verify step costs what a decode step does
SPEC_CONTEXT_KNEE = 2048  # context tokens up to which the same holds


@dataclass
class RankState:
    """One DP rank's scheduler: its running requests and its speculative counters."""

    dp_rank: int
    slots: asyncio.Semaphore | None = None  # --max-running-requests; the rest wait in the queue
    running: int = 0
    queued: int = 0
    used_tokens: int = 0  # the KV its running requests hold: their prompts and the tokens generated so far
    total_accept_tokens: int = 0  # accepted + bonus, summed over verify steps (cumulative)
    total_forward_ct: int = 0  # verify steps, per request (SGLang adds the batch size)
    window_accept_tokens: int = 0  # the same since the last log window
    window_correct_drafts: int = 0
    window_forward_ct: int = 0
    window_generated: int = 0
    window_started: float = field(default_factory=time.perf_counter)
    last_gen_throughput: float = 0.0
    dspark_records: deque = field(default_factory=lambda: deque(maxlen=DSPARK_RECORDS_KEPT))

    @property
    def avg_spec_accept_length(self) -> float | None:
        if self.total_forward_ct == 0:
            return None
        return self.total_accept_tokens / self.total_forward_ct


class Instant(NamedTuple):
    """One moment on both clocks, read back to back: ``time.monotonic()`` (for intervals, and for clients
    on the same host) and ``time.time()`` (for clients elsewhere)."""

    monotonic: float
    wall: float

    @classmethod
    def now(cls) -> Instant:
        return cls(time.monotonic(), time.time())


@dataclass
class Generation:
    """One sample being generated; the HTTP layer reads it to build responses."""

    rid: str
    dp_rank: int  # the simulated scheduler that runs it
    # meta_info's dp_rank as SGLang fills it (tokenizer_manager._handle_batch_output from
    # BatchStrOutput.dp_ranks, set by output_streamer to get_parallel().dp_rank): a DP replica's index
    # under --dp-size N, None otherwise; attention-DP schedulers are launched without a DP rank
    # (data_parallel_controller.launch_dp_attention_schedulers passes None).
    reported_dp_rank: int | None
    prompt_tokens: int
    spec: SpecStats | None
    tokens: list[str] = field(default_factory=list)
    finish_reason: dict | None = None
    arrived: Instant = field(default_factory=Instant.now)
    admitted: float | None = None  # time.monotonic() when its rank took it from the queue
    # a PD decode server's routed request: time.monotonic() when its transfer arrived (``arrived`` is when the
    # request reached the server, before the transfer); None: the request prefills here
    transferred: float | None = None
    first_token: Instant | None = None  # when the engine handed the first token to the HTTP layer
    last_token: Instant | None = None  # ... and the last one (so far)
    # Each emission (the prefill token, then each decode or verify step's tokens): when it was handed
    # over (time.monotonic(), the same reading as first_token/last_token) and how many tokens it held.
    emission_monotonic: list[float] = field(default_factory=list, repr=False)
    emission_tokens: list[int] = field(default_factory=list, repr=False)
    finished_at: float | None = None  # time.monotonic()
    reasoning: ReasoningCount = field(default_factory=lambda: ReasoningCount(False))
    _output_ids: list[int] = field(default_factory=list, repr=False)

    def emitted(self, tokens: list[str]) -> None:
        """Note a step handed to the HTTP layer now (which writes it in the same event-loop turn)."""
        now = Instant.now()
        self.reasoning.add(tokens)
        if self.first_token is None:
            self.first_token = now
        self.last_token = now
        self.emission_monotonic.append(now.monotonic)
        self.emission_tokens.append(len(tokens))

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens)

    def output_ids(self) -> list[int]:
        """The ids of the tokens so far (EOS included, as SGLang's output_ids), each computed once and
        only when a response asks for ids. The live list: serialise it, do not keep it."""
        if len(self._output_ids) < len(self.tokens):
            self._output_ids.extend(token_id(piece) for piece in self.tokens[len(self._output_ids):])
        return self._output_ids

    @property
    def text(self) -> str:
        return "".join(self.tokens)

    def meta_info(self) -> dict:
        """SGLang's meta_info: latency and spec fields arrive with the finished state only."""
        info: dict[str, Any] = {"id": self.rid, "finish_reason": self.finish_reason,
                                "prompt_tokens": self.prompt_tokens,
                "weight_version": "default", "num_retractions": 0, "reasoning_tokens": self.reasoning.tokens,
                "completion_tokens": self.completion_tokens, "cached_tokens": 0, "dp_rank": self.reported_dp_rank}
        if self.finish_reason is not None:
            info["e2e_latency"] = (self.finished_at or time.monotonic()) - self.arrived.monotonic
            if self.spec is not None:
                info.update(self.spec.meta_info(self.completion_tokens))
            info.update(self.timestamps())
        return info

    def timestamps(self) -> dict:
        """The time fields SGLang adds to a finished request's meta_info (req_time_stats.py:
        SchedulerReqTimeStats and APIServerReqTimeStats.convert_to_output_meta_info), on the wall clock. Here
        the request is scheduled, and its response sent, the moment it arrives and its last token is out."""
        wall = lambda monotonic: self.arrived.wall + (monotonic - self.arrived.monotonic)  # noqa: E731
        first = self.first_token or self.arrived
        finished = self.finished_at or time.monotonic()
        stamps = {"storage_prefetch_wait": 0.0, "storage_staging_wait": 0.0, "forward_entry_time": self.arrived.wall,
                  "prefill_finished_time": first.wall, "queue_time": 0.0, "request_received_ts": self.arrived.wall}
        if self.first_token is not None:
            stamps["first_token_latency"] = self.first_token.monotonic - self.arrived.monotonic
        stamps.update(api_server_dispatch_finish_ts=self.arrived.wall, request_finished_ts=wall(finished))
        if self.completion_tokens > 1 and finished > first.monotonic:
            stamps["decode_throughput"] = (self.completion_tokens - 1) / (finished - first.monotonic)
        stamps["response_sent_to_client_ts"] = wall(finished)
        return stamps


@dataclass(frozen=True)
class Job:
    ask: Ask
    prompt_tokens: int
    max_new_tokens: int
    streaming: bool
    # SGLang's require_reasoning: its reasoning parser splits this request's thinking off, and the scheduler
    # counts its reasoning tokens (dspark_ci.sglang_sim.reasoning)
    require_reasoning: bool = False
    # The server's startup request (native_api.warm_up). /metrics counts it as SGLang's tokenizer does; it
    # is not a client's, so neither crash_first_prefill ("healthy until the first real request") nor the
    # emission log sees it, and its few steps never reach a published decode window (below).
    warmup: bool = False
    temperature: float = 0.0  # the acceptance model reads it: drafts match a sampled target less often


class Engine:
    def __init__(self, args: ServerArgs, config: SimConfig, env: SglangEnv, shape: SpecShape | None,
                 persona: Persona, on_prefill: Callable[[], None], metrics: ServerMetrics | None = None,
                 emission_log: EmissionLog | None = None, noise: BootNoise | None = None,
                 owned: Sequence[int] | None = None, counters: Callable[[str], Iterator[int]] | None = None):
        """``owned``: the DP ranks this process schedules (a shard's, dspark_ci.sglang_sim.engine_shards; default all of
        them); ``counters``: where the counters that order requests server-wide come from (a shard's are shared with
        its siblings; default this process's own)."""
        self.args, self.config, self.env, self.shape, self.persona = args, config, env, shape, persona
        cap = args.max_running_requests  # per DP rank's scheduler; None: as many as memory allows (unbounded here)
        self.ranks = [RankState(rank, asyncio.Semaphore(cap) if cap else None)
                      for rank in range(args.num_dp_ranks)]
        self.owned = [self.ranks[rank] for rank in (owned if owned is not None else range(args.num_dp_ranks))]
        self._next_rank = itertools.cycle(self.owned)
        self._on_prefill = on_prefill  # where the crash_first_prefill fault strikes
        counter = counters or (lambda name: itertools.count())
        self._sample_counter = counter("sample")
        self.metrics = metrics
        self.emission_log = emission_log
        self.noise = noise or BootNoise.of(config)
        self.step_seconds = config.decode_step_ms * config.faults.slow_decode * self.noise.step_factor / 1000
        self.alpha = 0.0 if config.faults.accept_collapse else self.noise.alpha(config.accept_prob)
        self.accept_model = AcceptModel(self.alpha, config.accept_decay, config.faults.position_regression,
                                        shape.max_accept if shape is not None else 0, config.category_accept)
        self._served = counter("served")  # client requests past prefill, in order (fault accept_drift counts them)

    @property
    def reports_dp_rank(self) -> bool:
        return len(self.ranks) > 1

    def sample_key(self, temperature: float, top_k: int | None = None, top_p: float | None = None,
                   seed: int | None = None) -> str:
        """Greedy samples share one key (same text every time), and so do top_k=1 and a top_p at or below the
        argmax's probability (only the argmax is left to sample: SGLang's top-p keeps the smallest set reaching
        top_p, and the argmax always); sampled ones get a fresh key. The simulated model's argmax holds
        ARGMAX_PROBABILITY at every step; how much a wider nucleus narrows the samples is not modelled. Fault
        lossy_sampling: a speculative server's draft sampler ignores the temperature, and every second sample comes
        out as the greedy text. Fault spec_ignores_top_p: a speculative server samples as if top_p were 1. A request's
        ``seed`` (OpenAI's, SGLang's sampling_seed) names its sample: the same seed gives the same sample, as SGLang
        gives with --enable-deterministic-inference (without it SGLang draws afresh whatever the seed)."""
        count = next(self._sample_counter)
        speculative_faults = self.config.faults if self.shape is not None else None
        if speculative_faults is not None and speculative_faults.spec_ignores_top_p:
            top_p = None
        if temperature == 0 or top_k == 1 or (top_p is not None and top_p <= ARGMAX_PROBABILITY):
            return "greedy"
        if speculative_faults is not None and speculative_faults.lossy_sampling and count % 2 == 0:
            return "greedy"
        return f"sample-{count}" if seed is None else f"seed-{seed}"

    def start(self, job: Job) -> Generation:
        rank = next(self._next_rank)
        spec = SpecStats(self.shape) if self.shape is not None else None
        reported_dp_rank = rank.dp_rank if self.args.dp_size > 1 else None
        # set by dspark_ci.sglang_sim.disaggregation on a PD decode server's routed request
        transfer = TRANSFERRED.get()
        arrived = Instant.now() if transfer is None else Instant(transfer.received_monotonic, transfer.received_wall)
        return Generation(uuid.uuid4().hex, rank.dp_rank, reported_dp_rank, job.prompt_tokens, spec,
                          arrived=arrived, transferred=transfer.arrived if transfer is not None else None,
                          reasoning=ReasoningCount(job.require_reasoning))

    async def run(self, gen: Generation, job: Job) -> AsyncGenerator[list[str], None]:
        """Yield the tokens of each step (prefill first); ``gen`` holds the totals."""
        rank = self.ranks[gen.dp_rank]
        admitted = False
        rank.queued += 1
        self._scheduler_changed(rank)
        try:
            async with rank.slots or contextlib.nullcontext():
                rank.queued -= 1
                admitted = True
                gen.admitted = time.monotonic()
                async with contextlib.aclosing(self._running(gen, job, rank)) as steps:
                    async for step in steps:
                        yield step
        finally:
            if not admitted:  # the client left while the request was still queued
                rank.queued -= 1
                self._scheduler_changed(rank)

    async def _running(self, gen: Generation, job: Job, rank: RankState) -> AsyncGenerator[list[str], None]:
        if rank.running == 0:  # an idle rank's log window starts with its next request
            rank.window_started = time.perf_counter()
        rank.running += 1
        held = gen.prompt_tokens
        rank.used_tokens += held
        self._scheduler_changed(rank)
        try:
            async for step in self._steps(gen, job, rank):
                rank.used_tokens += len(step)
                held += len(step)
                yield step
        finally:
            rank.running -= 1
            rank.used_tokens -= held
            gen.finished_at = time.monotonic()
            if gen.finish_reason is None:
                gen.finish_reason = {"type": "abort", "message": "client disconnected"}
            self._scheduler_changed(rank)
            if rank.running == 0:
                self._publish_window(rank)
            if self.metrics is not None:
                self.metrics.request_finished(gen, job.streaming)
            if self.emission_log is not None and not job.warmup:
                self.emission_log.record(gen, job.streaming)

    async def _steps(self, gen: Generation, job: Job, rank: RankState) -> AsyncIterator[list[str]]:
        source = reply_tokens(self.persona, job.ask)
        # the parity faults change what speculation, or tensor parallelism, emits (sglang_sim/logprobs.py)
        source = logprobs.served_source(source, self.persona, job.ask, self.config.faults, self.shape is not None,
                                        self.args.tp_size)
        share = self.config.faults.greedy_verify
        if self.shape is not None and share and job.ask.sample_key != "greedy":
            greedy = reply_tokens(self.persona, dataclasses.replace(job.ask, sample_key="greedy"))
            # fault greedy_verify: drafts accepted because they are the argmax (greedy verification at temperature
            # > 0) instead of by rejection sampling; the first token is the prefill's, sampled as it should be
            source = argmax_mixed(source, greedy, random.Random(f"verify\x1f{job.ask.sample_key}"), share, first=1)
        # Acceptance is random per request but repeatable: greedy requests for the same prompt
        # accept the same drafts, as with a real draft model.
        accept_rng = random.Random(f"accept\x1f{self.config.seed}\x1f{job.ask.prompt}\x1f{job.ask.sample_key}")
        # The warmup's time is part of DSPARK_SIM_BOOT_SECONDS (until /health says 200): it takes none of its own.
        prefill_ms, step_seconds = ((0.0, 0.0) if job.warmup else
                                    (self.config.prefill_ms_per_token, self.step_seconds * self.noise.request_factor()))
        # A PD decode server never runs the prompt's forward: it has the KV, and its first batch (the prebuilt one
        # that emits the prefill's token) takes one scheduler iteration.
        first_seconds = job.prompt_tokens * prefill_ms / 1000 if gen.transferred is None else step_seconds
        clock = time.perf_counter() + first_seconds
        await _sleep_until(clock)
        if not job.warmup:
            self._on_prefill()
        drift_from = self.config.faults.accept_drift
        drifted = not job.warmup and drift_from is not None and next(self._served) >= drift_from
        alphas = self.accept_model.alphas(prompt_category(job.ask.prompt, job.prompt_tokens), job.temperature > 0,
                                          drifted)
        # SGLang adds a window's steps to the scheduler's figures (/server_info, the spec gauges) only when
        # it logs the window, every decode_log_interval batches: the warmup's few steps never close one,
        # so they go to a window of their own that is never published.
        stats = RankState(rank.dp_rank) if job.warmup else rank
        first = self._take(gen, source, 1, job.max_new_tokens)
        gen.emitted(first)  # the handler writes what we yield at once
        yield first
        while gen.finish_reason is None:
            clock += step_seconds * self._verify_cost(rank, gen)
            await _sleep_until(clock)
            if not job.warmup and self.config.faults.decode_sleep:
                clock += self._block(self.config.faults.decode_sleep)
            tokens = self._verify_step(gen, job, stats, source, accept_rng, alphas)
            gen.emitted(tokens)
            yield tokens

    def _verify_cost(self, rank: RankState, gen: Generation) -> float:
        """A verify step's time over a plain decode step's: verifying a block of drafts is nearly free while decoding
        is memory-bound, and costs more once the batch (running requests past SPEC_BATCH_KNEE) or the context (past
        SPEC_CONTEXT_KNEE tokens) makes it compute-bound; so past some concurrency and input length speculation stops
        paying (vllm#47808, #47602). 1 without speculation."""
        if self.shape is None:
            return 1.0
        batch = max(0, rank.running - SPEC_BATCH_KNEE) * self.config.spec_batch_cost * self.config.faults.envelope_shift
        context = max(0, gen.prompt_tokens + len(gen.tokens) - SPEC_CONTEXT_KNEE) / 1024 * self.config.spec_context_cost
        return 1.0 + batch + context

    def _verify_step(self, gen: Generation, job: Job, rank: RankState, source, accept_rng,
                     alphas: tuple[float, ...]) -> list[str]:
        if self.shape is None:
            tokens = self._take(gen, source, 1, job.max_new_tokens)
            rank.window_generated += len(tokens)
            return tokens
        accepted = draw_accepted(accept_rng, alpha_now(alphas), self.shape.max_accept)
        tokens = self._take(gen, source, accepted + 1, job.max_new_tokens)
        correct = len(tokens) - 1  # drafts past a stop or max_tokens are never sent: not counted
        if gen.spec is not None:  # always, with a speculative shape
            gen.spec.record_step(correct)
        rank.total_accept_tokens += len(tokens)
        rank.total_forward_ct += 1
        rank.window_accept_tokens += len(tokens)
        rank.window_correct_drafts += correct
        rank.window_forward_ct += 1
        rank.window_generated += len(tokens)
        if rank.window_forward_ct >= self.args.decode_log_interval * max(1, rank.running):
            self._publish_window(rank)
        return tokens

    @staticmethod
    def _take(gen: Generation, source, count: int, max_new_tokens: int) -> list[str]:
        """Up to ``count`` next tokens, stopping at EOS (an empty token) or max_new_tokens."""
        taken: list[str] = []
        while len(taken) < count and gen.finish_reason is None:
            token = next(source, None)
            if token is None:
                taken.append("")
                gen.tokens.append("")
                gen.finish_reason = {"type": "stop", "matched": EOS_TOKEN_ID}
                break
            taken.append(token)
            gen.tokens.append(token)
            if len(gen.tokens) >= max_new_tokens:
                gen.finish_reason = {"type": "length", "length": max_new_tokens}
        return taken

    def _scheduler_changed(self, rank: RankState) -> None:
        if self.metrics is not None:
            self.metrics.scheduler_changed(rank)

    def _publish_window(self, rank: RankState) -> None:
        """What SGLang does every decode_log_interval batches: log a line, set the spec gauges."""
        now = time.perf_counter()
        elapsed = max(now - rank.window_started, 1e-9)
        rank.last_gen_throughput = rank.window_generated / elapsed
        message = f"Decode batch, #running-req: {rank.running}, "
        if self.shape is not None and rank.window_forward_ct > 0:
            accept_length = rank.window_accept_tokens / rank.window_forward_ct
            accept_rate = rank.window_correct_drafts / (rank.window_forward_ct * max(1, self.shape.drafts_per_step))
            message += f"accept len: {accept_length:.2f}, accept rate: {accept_rate:.2f}, "
            if self.metrics is not None:
                self.metrics.spec_window(rank.dp_rank, accept_length, accept_rate)
            if self.shape.algorithm == "DSPARK":
                rank.dspark_records.append({"forward_ct": rank.total_forward_ct, "bs": rank.running,
                                            "mode": self.env.ragged_verify_mode,
                                            "num_running_reqs": rank.running,
                                            "num_verify_tokens": rank.window_forward_ct * self.shape.num_draft_tokens})
        if rank.window_generated or rank.window_forward_ct:
            prefix = f"[DP{rank.dp_rank}] " if self.reports_dp_rank else ""
            logger.info(f"{prefix}{message}gen throughput (token/s): {rank.last_gen_throughput:.2f}, "
                        f"#queue-req: {rank.queued}")
        rank.window_accept_tokens = rank.window_correct_drafts = rank.window_forward_ct = rank.window_generated = 0
        rank.window_started = now
        self._scheduler_changed(rank)

    @staticmethod
    def _block(ms: float) -> float:
        """Fault decode_sleep: block the whole process (every stream with it), as a sleep in SGLang's decode step
        holds its scheduler; the seconds it took, which the request's clock then owes."""
        started = time.perf_counter()
        time.sleep(ms / 1000)
        return time.perf_counter() - started

    def internal_states(self, server_args: dict) -> list[dict]:
        """/server_info's internal_states: one entry per DP rank this process schedules, in rank order (SGLang's
        entries do not name their rank; ``owned`` says which they are)."""
        states = []
        for rank in self.owned:
            state = {**server_args, "world_size": self.args.tp_size * self.args.pp_size
                     * self.args.dp_size, "effective_max_running_requests_per_dp": self.args.max_running_requests,
                     "last_gen_throughput": rank.last_gen_throughput, "num_running_reqs": rank.running,
                     "num_queue_reqs": rank.queued}
            if self.shape is not None and rank.avg_spec_accept_length is not None:
                state["avg_spec_accept_length"] = rank.avg_spec_accept_length
            if self.shape is not None and self.shape.algorithm == "DSPARK":
                state["dspark_info_record"] = {
                    "mode": self.env.ragged_verify_mode, "gamma": self.shape.drafts_per_step,
                    "verify_num_draft_tokens": self.shape.num_draft_tokens, "components": ["core"],
                    "records": list(rank.dspark_records), "simulate_acc_len": None}
            states.append(state)
        return states


async def _sleep_until(deadline: float) -> None:
    """Sleep to an absolute time, so per-step overhead does not add up over a long reply."""
    await asyncio.sleep(max(0.0, deadline - time.perf_counter()))
