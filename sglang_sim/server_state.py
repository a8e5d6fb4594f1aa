"""What every HTTP handler shares: the resolved args, the engine, readiness, and SSE plumbing."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import ClassVar

from aiohttp import web
from dspark_ci.sglang_sim.args import ServerArgs
from dspark_ci.sglang_sim.engine import Engine
from dspark_ci.sglang_sim.engine_shards import Shard
from dspark_ci.sglang_sim.prometheus import ServerMetrics
from dspark_ci.sglang_sim.sim_config import SimConfig

logger = logging.getLogger("sglang_sim")
DEFAULT_CONTEXT_LENGTH = 32768
MALFORMED_STREAM_AFTER_EVENTS = 2  # fault malformed_stream: the third event is cut in half


def json_response(payload, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(payload).encode(), status=status, content_type="application/json")


def sse_event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


class _StreamBroken(Exception):
    """Raised after the malformed_stream fault has cut a response off."""


@dataclass
class ServerState:
    KEY: ClassVar[web.AppKey[ServerState]] = web.AppKey("sglang_sim_state")

    args: ServerArgs
    config: SimConfig
    engine: Engine
    metrics: ServerMetrics | None
    architecture: str
    startup_time: float = field(default_factory=time.time)
    ready: bool = False  # /health is 503 until the boot delay has passed and every node rank has joined
    shard: Shard | None = None  # this process's place among the server's shards (DSPARK_SIM_SHARDS > 1)

    @property
    def context_length(self) -> int:
        return self.args.context_length or DEFAULT_CONTEXT_LENGTH

    def max_new_tokens(self, prompt_tokens: int, asked: int | None) -> int:
        """The request's limit, or without one what the context has left after the prompt (at least 1)."""
        return asked if asked is not None else max(1, self.context_length - prompt_tokens)

    async def open_stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        return response

    @contextlib.asynccontextmanager
    async def streaming(self, request: web.Request,
                        response: web.StreamResponse) -> AsyncIterator[Callable[..., Awaitable[None]]]:
        """Yield ``send(*events, last=False)``: the events in one write (one system call: a step's role and content
        chunks, or the closing chunks, go out together), ``last`` ending the response with them; a client that goes
        away just ends the stream."""
        sent = 0

        async def send(*events: bytes, last: bool = False) -> None:
            nonlocal sent
            cut = MALFORMED_STREAM_AFTER_EVENTS - sent
            if self.config.faults.malformed_stream and 0 <= cut < len(events):
                await response.write(b"".join(events[:cut]) + events[cut][: len(events[cut]) // 2])
                if request.transport is not None:
                    request.transport.close()
                raise _StreamBroken()
            data = b"".join(events)
            await (response.write_eof(data) if last else response.write(data))
            sent += len(events)

        try:
            yield send
        except _StreamBroken:
            logger.info("malformed_stream fault: cut a streamed response off mid-event")
        except ConnectionResetError:
            logger.info("client disconnected from a streamed response")
