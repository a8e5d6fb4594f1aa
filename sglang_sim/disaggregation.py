"""Prefill/decode disaggregation as the pinned SGLang release plays it behind sglang-router, on loopback.

The router sends each request to one prefill and one decode server at once, with ``bootstrap_host``,
``bootstrap_port`` and ``bootstrap_room`` added to the body (ground/sglang/router.py). Here:
- the prefill server runs the prompt's prefill, then offers that room's transfer (the KV, and for a speculative
  server DSpark's aux hidden state) on its bootstrap server (``--disaggregation-bootstrap-port``), and answers;
- the decode server fetches the room's transfer from ``bootstrap_host:bootstrap_port`` before it decodes; a
  transfer that cannot be had fails the request as SGLang's decode does (HTTP 500), and one whose hidden state is
  not the prompt's (sglang#7242: random decode-side hidden states) leaves the server healthy but drafting blind,
  so its acceptance drops (``HIDDEN_OK``, read by the engine).
Each role times its part of the request under SGLang's stage names (python/sglang/srt/observability/
req_time_stats.py, ``RequestStage`` and ``SchedulerReqTimeStats``), in ``sglang:per_stage_req_latency_seconds``:
- prefill: ``prefill_bootstrap`` (until the decode side asked for the room: SGLang's bootstrap queue), its wait for
  the forward (``sglang:queue_time_seconds``: SGLang observes ``prefill_waiting`` there, not per stage),
  ``prefill_forward`` (one at a time), ``prefill_transfer_kv_cache`` (until the decode side has the room's
  transfer); where it holds each request shows in SGLang's prefill queue gauges (``PREFILL_QUEUES``), and a request
  it finished in ``sglang:num_requests_total``;
- decode (``dspark_ci.sglang_sim.prometheus``, once the request is done): ``decode_prepare``, ``decode_bootstrap``,
  ``decode_transferred`` (waiting for the transfer), ``decode_waiting`` (for a running slot), ``fake_output`` (the
  prebuilt batch that emits the prefill's token: one scheduler iteration).
Faults (``DSPARK_SIM_PREFILL_FAULTS`` / ``DSPARK_SIM_DECODE_FAULTS`` add to ``DSPARK_SIM_FAULTS`` on that role):
``pd_transfer_fail``, ``pd_random_hidden``, ``pd_prefill_stall`` (the prefill's forward never ends: that request
stays running, every later one queued, and none finishes; /health still answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
from aiohttp import web

logger = logging.getLogger("sglang_sim")

HIDDEN_OK: contextvars.ContextVar[bool] = contextvars.ContextVar("dspark_hidden_ok", default=True)
# With the wrong hidden state the draft guesses: its acceptance falls to this share of the normal one.
BLIND_DRAFT_SHARE = 0.5
TRANSFER_WAIT_S = 60.0  # how long decode waits for a room's transfer (SGLang: its bootstrap/transfer timeouts)
GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions", "/generate")
ROLE_FAULTS_ENV = {"prefill": "DSPARK_SIM_PREFILL_FAULTS", "decode": "DSPARK_SIM_DECODE_FAULTS"}
PD_FAULTS = ("pd_transfer_fail", "pd_random_hidden", "pd_prefill_stall")


def role_environ(environ: Mapping[str, str], mode: str) -> dict[str, str]:
    """The environment with the role's own faults joined to DSPARK_SIM_FAULTS."""
    own = environ.get(ROLE_FAULTS_ENV.get(mode, ""), "").strip()
    shared = environ.get("DSPARK_SIM_FAULTS", "").strip()
    return {**environ, "DSPARK_SIM_FAULTS": ",".join(f for f in (shared, own) if f)}


def prompt_digest(body: Mapping[str, Any]) -> str:
    """What the prompt's hidden state stands for: both roles get the same body from the router."""
    prompt = body.get("messages") or body.get("prompt") or body.get("text") or body.get("input_ids")
    return hashlib.sha256(json.dumps(prompt, sort_keys=True, default=str).encode()).hexdigest()


def prompt_tokens_of(body: Mapping[str, Any]) -> int:
    return max(1, len(json.dumps(body.get("messages") or body.get("prompt") or body.get("text") or "")) // 4)


@dataclass(frozen=True)
class Transferred:
    """What the decode side knows of a routed request's transfer (``TRANSFERRED``, read by the engine): when the
    request reached this server and when its room's transfer arrived (time.monotonic(); the wall clock beside)."""

    received_monotonic: float
    received_wall: float
    arrived: float


TRANSFERRED: contextvars.ContextVar[Transferred | None] = contextvars.ContextVar("dspark_transferred", default=None)


@dataclass
class Room:
    """One bootstrap room on the prefill side: the decode side asked for it, the prefill put it, decode took it."""

    asked: asyncio.Event = field(default_factory=asyncio.Event)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    taken: asyncio.Event = field(default_factory=asyncio.Event)
    payload: dict | None = None
    sent: bool = False  # taken with its payload (not refused by a fault)


@dataclass
class Transfers:
    """The prefill side's rooms, until the prefill that filled one has seen it taken."""

    rooms: dict[int, Room] = field(default_factory=dict)

    def room(self, number: int) -> Room:
        return self.rooms.setdefault(number, Room())


class StageObserver(Protocol):
    """Where a prefill's request times and queues go (dspark_ci.sglang_sim.prometheus.ServerMetrics)."""

    def prefilled(self, queue_seconds: float, stages: Mapping[str, float], streaming: bool) -> None: ...

    def prefill_queues(self, held: Mapping[str, int]) -> None: ...


# Where a PD prefill server holds a request, by the gauge SGLang's prefill scheduler reports it in.
PREFILL_QUEUES = ("num_prefill_bootstrap_queue_reqs", "num_queue_reqs", "num_running_reqs",
                  "num_prefill_inflight_queue_reqs")


@dataclass
class PrefillQueues:
    """How many routed requests the prefill holds in each queue, sent to /metrics as they move."""

    metrics: StageObserver | None
    held: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PREFILL_QUEUES, 0))

    @contextlib.contextmanager
    def holding(self, queue: str) -> Iterator[None]:
        self._move(queue, 1)
        try:
            yield
        finally:
            self._move(queue, -1)

    def _move(self, queue: str, by: int) -> None:
        self.held[queue] += by
        if self.metrics is not None:
            self.metrics.prefill_queues(self.held)


def _faults(names: list[str]) -> set[str]:
    return {n for n in names if n in PD_FAULTS}


@dataclass
class Disaggregation:
    mode: str  # "prefill" | "decode"
    faults: set[str]
    prefill_ms_per_token: float
    metrics: StageObserver | None = None  # None: the server was started without --enable-metrics
    transfers: Transfers = field(default_factory=Transfers)
    # a prefill server runs one forward at a time: a request that arrives during another's waits (its queue time)
    forward: asyncio.Lock = field(default_factory=asyncio.Lock)
    queues: PrefillQueues = field(init=False)

    def __post_init__(self):
        self.queues = PrefillQueues(self.metrics)

    @classmethod
    def of(cls, mode: str, fault_names: list[str], prefill_ms_per_token: float,
           metrics: StageObserver | None = None) -> Disaggregation | None:
        if mode not in ("prefill", "decode"):
            return None
        return cls(mode, _faults(fault_names), prefill_ms_per_token, metrics)

    def middleware(self):
        @web.middleware
        async def disaggregate(request: web.Request, handler):
            if request.method != "POST" or request.path not in GENERATION_PATHS:
                return await handler(request)
            body = await request.json()
            if body.get("bootstrap_room") is None:
                return await handler(request)  # not routed (a direct request): serve it colocated
            if self.mode == "prefill":
                return await self._prefill(body)
            return await self._decode(request, handler, body)
        return disaggregate

    async def _prefill(self, body: dict) -> web.Response:
        received = time.monotonic()
        number = int(body["bootstrap_room"])
        room = self.transfers.room(number)
        try:
            with self.queues.holding("num_prefill_bootstrap_queue_reqs"):  # until the decode side bootstrapped
                await asyncio.wait_for(room.asked.wait(), TRANSFER_WAIT_S)
            queued = time.monotonic()
            started, done = await self._forward(body)
            room.payload = {"hidden": os.urandom(32).hex() if "pd_random_hidden" in self.faults
                            else prompt_digest(body)}
            room.ready.set()
            with self.queues.holding("num_prefill_inflight_queue_reqs"):  # SGLang's prefill answers once its
                await asyncio.wait_for(room.taken.wait(), TRANSFER_WAIT_S)  # transfer is done (or failed)
        except asyncio.TimeoutError:
            logger.error(f"bootstrap_room {number}: the decode side never asked for its transfer or never took it")
        else:
            if self.metrics is not None and room.sent:
                self.metrics.prefilled(started - queued, {"prefill_bootstrap": queued - received,
                                                          "prefill_forward": done - started,
                                                          "prefill_transfer_kv_cache": time.monotonic() - done},
                                       bool(body.get("stream")))
        finally:
            self.transfers.rooms.pop(number, None)
        return web.json_response({"object": "prefill", "bootstrap_room": body["bootstrap_room"],
                                  "meta_info": {"finish_reason": {"type": "length", "length": 1}}})

    async def _forward(self, body: dict) -> tuple[float, float]:
        """The prompt's forward, one at a time: (started, done) on time.monotonic()."""
        with self.queues.holding("num_queue_reqs"):
            await self.forward.acquire()
        try:
            with self.queues.holding("num_running_reqs"):
                started = time.monotonic()
                if "pd_prefill_stall" in self.faults:  # the forward never ends; every later request queues
                    logger.warning("[sglang_sim fault pd_prefill_stall] prefill stalls")
                    await asyncio.Event().wait()
                await asyncio.sleep(prompt_tokens_of(body) * self.prefill_ms_per_token / 1000)
                return started, time.monotonic()
        finally:
            self.forward.release()

    async def _decode(self, request: web.Request, handler, body: dict) -> web.StreamResponse:
        received_monotonic, received_wall = time.monotonic(), time.time()
        room, url = body["bootstrap_room"], f"http://{body.get('bootstrap_host')}:{body.get('bootstrap_port')}"
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TRANSFER_WAIT_S)) as session:
                async with session.get(f"{url}/transfer/{room}") as answer:
                    if answer.status != 200:
                        raise RuntimeError(f"bootstrap server answered HTTP {answer.status}: {await answer.text()}")
                    payload = await answer.json()
        except (aiohttp.ClientError, asyncio.TimeoutError, RuntimeError) as err:
            logger.error(f"KV transfer of bootstrap_room {room} from {url} failed: {err}")
            return web.json_response({"object": "error", "message": f"KVTransferError(bootstrap_room={room}): "
                                      f"transfer from {url} failed: {err}", "type": "InternalServerError",
                                      "code": 500}, status=500)
        HIDDEN_OK.set(payload.get("hidden") == prompt_digest(body))
        TRANSFERRED.set(Transferred(received_monotonic, received_wall, time.monotonic()))
        return await handler(request)

    async def bootstrap_handler(self, request: web.Request) -> web.Response:
        number = int(request.match_info["room"])
        room = self.transfers.room(number)
        room.asked.set()
        try:
            if "pd_transfer_fail" in self.faults:
                return web.json_response({"error": "[sglang_sim fault pd_transfer_fail] transfer failed"},
                                         status=500)
            try:
                await asyncio.wait_for(room.ready.wait(), TRANSFER_WAIT_S)
            except asyncio.TimeoutError:
                self.transfers.rooms.pop(number, None)
                return web.json_response({"error": f"room {number} never prefilled"}, status=504)
            room.sent = True
            return web.json_response(room.payload)
        finally:
            room.taken.set()

    def bootstrap_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/transfer/{room}", self.bootstrap_handler)
        return app


def alpha_now(alphas: float | tuple[float, ...]) -> float | tuple[float, ...]:
    """The draft's acceptance (per position) for the request being decoded: blind when the transferred hidden state
    was wrong."""
    if HIDDEN_OK.get():
        return alphas
    return tuple(a * BLIND_DRAFT_SHARE for a in alphas) if isinstance(alphas, tuple) else alphas * BLIND_DRAFT_SHARE
