"""``DSPARK_SIM_EMISSION_LOG``: one JSON line per finished request, the server's side of a benchmark.

A line is written once per request (when it finishes, aborted ones included), kept and appended within
``FLUSH_SECONDS`` and at shutdown, whole lines in one write to a file opened O_APPEND, so the shards of one
server (dspark_ci.sglang_sim.engine_shards) can share the file without cutting each other's lines; a crash
(``os._exit``) loses at most that much.
Times are the engine's hand-over of tokens to the HTTP handler, which writes them in the same
event-loop turn. Every instant is on two clocks (``engine.Instant``); README.md says how to align.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from dspark_ci.sglang_sim.engine import Generation

logger = logging.getLogger("sglang_sim")
FLUSH_SECONDS = 0.5


def emission_record(gen: Generation, streaming: bool) -> dict:
    """What one line says about a finished request (None where it never got that far)."""
    first, last = gen.first_token, gen.last_token
    return {
        "rid": gen.rid,  # the response's "id" (n = 1), meta_info.id, /generate's meta_info.id
        "prompt_tokens": gen.prompt_tokens, "completion_tokens": gen.completion_tokens,
        "finish_reason": (gen.finish_reason or {}).get("type"), "streaming": streaming,
        # a step emits one chunk: the prefill token, then one per decode (verify) step
        "scheduler_dp_rank": gen.dp_rank, "emissions": len(gen.emission_tokens),
        "arrival_monotonic": gen.arrived.monotonic,
        "first_token_monotonic": first.monotonic if first else None,
        "last_token_monotonic": last.monotonic if last else None,
        "arrival_wall": gen.arrived.wall,
        "first_token_wall": first.wall if first else None,
        "last_token_wall": last.wall if last else None,
        # per emission: when it was handed over (the first is first_token_monotonic, the last
        # last_token_monotonic) and its tokens (they add up to completion_tokens)
        "emission_monotonic": gen.emission_monotonic, "emission_tokens": gen.emission_tokens,
    }


class EmissionLog:
    """Appends ``emission_record`` lines; owned by the server, closed at shutdown."""

    def __init__(self, file: BinaryIO):
        self._file = file
        self._lines: list[bytes] = []
        self._flush_pending = False
        self._broken = False

    @classmethod
    def open(cls, path: Path) -> EmissionLog:
        """Raises OSError when the path cannot be appended to (the caller's exit 2)."""
        return cls(path.open("ab", buffering=0))

    def record(self, gen: Generation, streaming: bool) -> None:
        if self._broken:
            return
        self._lines.append(json.dumps(emission_record(gen, streaming)).encode() + b"\n")
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_later(FLUSH_SECONDS, self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        if self._broken or self._file.closed:
            return
        pending, self._lines = b"".join(self._lines), []
        try:
            while pending:  # a regular file takes it whole; a short write's rest follows
                written = self._file.write(pending)
                if not written:
                    raise OSError("the file took nothing")
                pending = pending[written:]
        except OSError as err:  # e.g. the disk filled up: say so once, keep serving
            self._give_up(err)

    def _give_up(self, err: OSError) -> None:
        self._broken = True
        logger.warning(f"[sglang_sim] DSPARK_SIM_EMISSION_LOG: cannot write ({err}); no more lines will be logged")

    def close(self) -> None:
        if not self._file.closed:
            self._flush()
            self._file.close()
