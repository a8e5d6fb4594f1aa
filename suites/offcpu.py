"""Where the server's scheduler spent the speed window: on a CPU, waiting for one, or blocked (Linux schedstat).

A server slowed by a loaded machine keeps its scheduler runnable: the time it loses is run-queue wait. A server
slowed by its own code sleeping, waiting on a lock, a sync or a peer is not runnable meanwhile: that time is
"blocked". ``/proc/PID/task/TID/schedstat`` gives a thread's time on a CPU and its run-queue wait (ns); wall
time minus both is the time it was blocked. The thread read is each scheduler's main thread, the one that runs
SGLang's event loop (``Scheduler.event_loop_*``: receive, schedule, run the batch, process the result): a decode
step that sleeps 20 ms blocks it 20 ms per step, while the machine's load shows as run-queue wait instead. When
the loop waits for its own helper threads (OpenMP), it spins on a CPU first, so load seldom turns into blocked
time there.

Which processes: the deployment's processes named ``sglang::scheduler*`` (SGLang's process titles, one per
rank), or, when none is (the simulator serves from the rank's own process), the ranks' root processes. Several
schedulers (tp > 1): the least-blocked one stands for the deployment, since a sleep in the decode step blocks
every rank while a rank waiting on a descheduled peer (an all-reduce under load) is one rank at a time.

Only the launcher knows these processes (``--server-pid``, given by ``dspark-ci run`` for the local launcher): a
standalone run against a URL, or a deployment on another machine, has no such figures ("not measured").
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import psutil

SCHEDULER_TITLE = "sglang::scheduler"  # setproctitle in sglang/srt/managers/scheduler.py, one per rank
NS_PER_MS = 1e6


@dataclass(frozen=True)
class ThreadTimes:
    """One thread's cumulative schedstat figures and when they were read (ns)."""

    pid: int
    on_cpu_ns: int
    runqueue_ns: int
    at_ns: int


@dataclass(frozen=True)
class WindowShare:
    """Over a window: one scheduler's time on a CPU, in the run queue, and blocked, per output token (ms)."""

    pid: int
    wall_ms: float
    cpu_ms_per_token: float
    runqueue_ms_per_token: float
    blocked_ms_per_token: float

    def metrics(self) -> dict[str, float]:
        return {"scheduler_blocked_ms_per_token": self.blocked_ms_per_token,
                "scheduler_cpu_ms_per_token": self.cpu_ms_per_token,
                "scheduler_runqueue_ms_per_token": self.runqueue_ms_per_token}


def scheduler_pids(roots: Sequence[int]) -> tuple[int, ...]:
    """The scheduler processes of the deployment whose ranks are ``roots`` (see the module's docstring)."""
    found, alive = [], []
    for root in roots:
        try:
            process = psutil.Process(root)
            tree = [process, *process.children(recursive=True)]
        except psutil.Error:
            continue
        alive.append(root)
        found.extend(p.pid for p in tree if _title(p).startswith(SCHEDULER_TITLE))
    return tuple(found or alive)


def _title(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def read(pids: Sequence[int]) -> tuple[ThreadTimes, ...]:
    """Each process's main thread as it stands now (a process gone since is left out)."""
    times = []
    for pid in pids:
        try:
            on_cpu, runqueue, _slices = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()
        except (OSError, ValueError):
            continue
        times.append(ThreadTimes(pid, int(on_cpu), int(runqueue), time.monotonic_ns()))
    return tuple(times)


def window_share(before: Sequence[ThreadTimes], after: Sequence[ThreadTimes], tokens: int) -> WindowShare | None:
    """The least-blocked scheduler's share of the window between the two readings, per output token; None when no
    process was read at both ends or no token was generated."""
    if tokens <= 0:
        return None
    start = {t.pid: t for t in before}
    shares = [_share(start[t.pid], t, tokens) for t in after if t.pid in start]
    return min(shares, key=lambda share: share.blocked_ms_per_token, default=None)


def _share(start: ThreadTimes, end: ThreadTimes, tokens: int) -> WindowShare:
    wall = end.at_ns - start.at_ns
    on_cpu, runqueue = end.on_cpu_ns - start.on_cpu_ns, end.runqueue_ns - start.runqueue_ns
    blocked = max(0, wall - on_cpu - runqueue)  # both clocks tick apart: a busy thread may read a hair over
    per_token = lambda ns: ns / NS_PER_MS / tokens  # noqa: E731
    return WindowShare(end.pid, wall / NS_PER_MS, per_token(on_cpu), per_token(runqueue), per_token(blocked))
