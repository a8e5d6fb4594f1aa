"""Multi-node start-up: node ranks >= 1 join rank 0 on ``--dist-init-addr``, as SGLang's ranks meet there.

A tiny line protocol over TCP: a joining rank sends ``JOIN <rank>``, rank 0 answers ``OK``, and the
connection stays open for the life of both processes. Either side seeing it close knows the other
rank is gone (what an NCCL failure looks like to SGLang).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

logger = logging.getLogger("sglang_sim")
RETRY_SECONDS = 0.5


def split_addr(dist_init_addr: str) -> tuple[str, int]:
    host, _, port = dist_init_addr.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


class Leader:
    """Rank 0's side: waits until every other rank has joined; reports a rank that goes away."""

    def __init__(self, nnodes: int, on_rank_lost: Callable[[int], None]):
        self.expected = set(range(1, nnodes))
        self.joined: set[int] = set()
        self.everyone_joined = asyncio.Event()
        self._on_rank_lost = on_rank_lost
        self._server: asyncio.AbstractServer | None = None
        if not self.expected:
            self.everyone_joined.set()

    async def listen(self, host: str, port: int) -> None:
        try:
            self._server = await asyncio.start_server(self._serve, host, port)
        except OSError:  # the address names this node from outside (e.g. a NAT'd IP): listen everywhere
            self._server = await asyncio.start_server(self._serve, "0.0.0.0", port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = (await reader.readline()).decode(errors="replace").split()
        if len(line) != 2 or line[0] != "JOIN" or not line[1].isdigit() or int(line[1]) not in self.expected:
            writer.close()
            return
        rank = int(line[1])
        writer.write(b"OK\n")
        await writer.drain()
        self.joined.add(rank)
        logger.info(f"Node rank {rank} joined ({len(self.joined)}/{len(self.expected)} other ranks).")
        if self.joined >= self.expected:
            self.everyone_joined.set()
        await reader.read()  # returns at EOF: the rank's process is gone
        self._on_rank_lost(rank)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()


async def join(host: str, port: int, rank: int,
               timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to rank 0, retrying until ``timeout``; the reader ends when rank 0 does (keep the writer)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(f"JOIN {rank}\n".encode())
            await writer.drain()
            if (await reader.readline()).strip() == b"OK":
                return reader, writer
            writer.close()
        except OSError:
            pass
        if asyncio.get_running_loop().time() >= deadline:
            raise TimeoutError(f"node rank {rank} could not join rank 0 at {host}:{port} within {timeout:g} s")
        await asyncio.sleep(RETRY_SECONDS)
