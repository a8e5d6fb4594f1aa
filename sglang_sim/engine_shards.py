"""``DSPARK_SIM_SHARDS=N``: one server, N engine processes behind one port, for more streams than one core paces.

The simulator's cost is per chunk (a step's wake-up, the SSE event, the socket write) and per request (~0.5-0.7 ms:
parsing, metrics, the closing chunks): one process paces about 6,000-8,000 chunks/s on one core (BENCHMARKS.md), and
past that its steps run late. SGLang with DP runs one scheduler process per DP rank behind one HTTP front; here each
shard is a whole server (HTTP and the schedulers of its share of the DP ranks: shard i runs ranks i, i + N, ...), every
shard listening on the same port with SO_REUSEPORT, so the kernel spreads connections over the shards' cores. What a
client sees of the one server stays one:

- ``/metrics`` and ``/server_info`` answer for the whole server: the shard asked gathers its siblings' figures over
  abstract unix sockets (counters, histograms and gauges summed series by series, ``internal_states`` in DP-rank
  order);
- ``/health`` says 200 only once every shard has booted;
- the counters that order requests server-wide (sample keys, fault accept_drift's served count, the per-request
  noise stream) live in shared memory, and one boot's noise is drawn once before the fork, so seeds and faults act
  as in one process; a shard that dies (crash_first_prefill) takes the server down with its exit code;
- every shard appends whole lines to the emission log (one write per flush, O_APPEND).

What differs from one process: a request goes to a shard by its connection (the kernel's choice), then round-robin
over that shard's ranks; SGLang's DP controller round-robins every request, so one keep-alive client of a 1-shard
server alternates DP ranks and of an N-shard server sees only its shard's. Hence the default of one shard.

Process tree: the server's own process supervises; shards are forked children in its process group (a launcher's
killpg reaches them) that die with it (PR_SET_PDEATHSIG), and the supervisor forwards SIGTERM/SIGINT to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import mmap
import multiprocessing
import os
import signal
import struct
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

logger = logging.getLogger("sglang_sim")
COUNTERS = ("sample", "served", "requests", "ready")  # the server-wide counters in shared memory
PR_SET_PDEATHSIG = 1
PEER_TIMEOUT_SECONDS = 30.0


class SharedCounter:
    """``itertools.count()`` across the shards: one int64 in memory shared since the fork, behind a lock."""

    def __init__(self, memory: mmap.mmap, offset: int, lock: Any):
        self._memory, self._offset, self._lock = memory, offset, lock

    def __iter__(self) -> SharedCounter:
        return self

    def __next__(self) -> int:
        with self._lock:
            value = struct.unpack_from("q", self._memory, self._offset)[0]
            struct.pack_into("q", self._memory, self._offset, value + 1)
        return value

    @property
    def value(self) -> int:
        with self._lock:
            return struct.unpack_from("q", self._memory, self._offset)[0]


@dataclass(frozen=True)
class Shard:
    """One shard's place in the server: its index among ``count``, and what it shares with its siblings."""

    index: int
    count: int
    server_pid: int  # the supervisor's: the one server's pid (its /metrics `pid` label, the peers' socket names)
    memory: mmap.mmap = field(repr=False)
    lock: Any = field(repr=False)

    def counter(self, name: str) -> SharedCounter:
        return SharedCounter(self.memory, 8 * COUNTERS.index(name), self.lock)

    def owned_ranks(self, num_dp_ranks: int) -> range:
        return range(self.index, num_dp_ranks, self.count)

    def socket(self, index: int) -> str:
        """Shard ``index``'s peer socket: abstract (a leading NUL), so nothing is left on disk by a killed server."""
        return f"\0sglang_sim.{self.server_pid}.shard{index}"

    @property
    def siblings(self) -> list[int]:
        return [index for index in range(self.count) if index != self.index]

    async def ask_siblings(self, path: str) -> list[bytes]:
        """Every sibling's answer to ``GET path`` on its peer socket, in shard order."""
        answers = []
        for index in self.siblings:
            connector = aiohttp.UnixConnector(path=self.socket(index))
            timeout = aiohttp.ClientTimeout(total=PEER_TIMEOUT_SECONDS)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                async with session.get(f"http://shard{index}{path}") as response:
                    response.raise_for_status()
                    answers.append(await response.read())
        return answers

    async def all_ready(self, poll_seconds: float = 0.01) -> None:
        """Say this shard booted, then wait until every shard has."""
        ready = self.counter("ready")
        next(ready)
        while ready.value < self.count:
            await asyncio.sleep(poll_seconds)


def usable_cores() -> int:
    return len(os.sched_getaffinity(0))


# ---------------------------------------------------------------- the supervisor


def serve_sharded(count: int, serve_shard: Callable[[Shard], int]) -> int:
    """Fork ``count`` shards running ``serve_shard``; return when they are all gone: 0 after a signal stopped them,
    else the exit code of the first shard that died (the others are killed: a crashed SGLang takes its peers)."""
    memory = mmap.mmap(-1, 8 * len(COUNTERS))  # anonymous, MAP_SHARED: the children see one copy
    lock = multiprocessing.get_context("fork").Lock()  # unlinked at once under fork: nothing left in /dev/shm
    server_pid = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    children: dict[int, int] = {}
    for index in range(count):
        pid = os.fork()
        if pid == 0:
            _run_child(Shard(index, count, server_pid, memory, lock), serve_shard)
        children[pid] = index
    logger.info(f"[sglang_sim] {count} shards (pids {', '.join(map(str, children))}) on one port")
    return _supervise(children)


def _run_child(shard: Shard, serve_shard: Callable[[Shard], int]) -> None:
    code = 1
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the supervisor SIGKILLed: no shard outlives it
        if os.getppid() != shard.server_pid:  # it died before prctl took effect
            os._exit(1)
        code = serve_shard(shard)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _supervise(children: dict[int, int]) -> int:
    stopping = False

    def forward(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
        _signal_all(children, signal.SIGTERM)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    code = 0
    while children:
        pid, status = os.waitpid(-1, 0)
        if pid not in children:
            continue
        del children[pid]
        exited = os.waitstatus_to_exitcode(status)
        if exited != 0 and not stopping and code == 0:
            code = exited if exited > 0 else 1
            _signal_all(children, signal.SIGKILL)  # as a crashed scheduler takes the server down
    return code


def _signal_all(children: dict[int, int], signum: int) -> None:
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


# ---------------------------------------------------------------- one answer from every shard


def merge_expositions(texts: Sequence[bytes]) -> bytes:
    """Several processes' /metrics as one: each series (name and labels) summed over the processes that send it;
    families and series in the order first seen. Shards send the same labels (the server's pid), so a counter or
    histogram is the server's total, and a per-rank gauge is its one owner's value (the others hold 0)."""
    families: dict[str, Metric] = {}
    sums: dict[str, dict[tuple, list]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text.decode()):
            merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            series = sums.setdefault(family.name, {})
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key in series:
                    series[key][2] += sample.value
                else:
                    series[key] = [sample.name, sample.labels, sample.value]
            merged.samples = []
    for name, family in families.items():
        for sample_name, labels, value in sums[name].values():
            family.add_sample(sample_name, labels, value)
    return generate_latest(_Families(list(families.values())))  # type: ignore[arg-type]


@dataclass(frozen=True)
class _Families:
    families: list[Metric]

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


async def gathered(own: bytes, shard: Shard | None, path: str) -> list[bytes]:
    """This shard's answer and its siblings' (just its own without shards)."""
    return [own] if shard is None else [own, *await shard.ask_siblings(path)]


async def gathered_json(own: Any, shard: Shard | None, path: str) -> list[Any]:
    answers = await gathered(json.dumps(own).encode(), shard, path)
    return [json.loads(answer) for answer in answers]

