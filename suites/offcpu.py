"""Where the server's scheduler spent the speed window: on a CPU, waiting for one, or stalled (Linux /proc).

A server slowed by a loaded machine keeps its scheduler runnable: the time it loses is run-queue wait. A server
slowed by its own code sleeping, waiting on a lock, a sync or a peer is not runnable meanwhile. Two readings:
- ``/proc/PID/task/PID/schedstat`` of each scheduler's main thread (the one that runs SGLang's event loop,
  ``Scheduler.event_loop_*``): its time on a CPU and its run-queue wait (ns), per output token;
- blocked time: the share of the window in which NO thread of the scheduler process was runnable (every
  ``/proc/PID/task/*/stat`` state other than R), sampled every SAMPLE_S in a thread of the client, times the
  window, per output token. The main thread alone is not enough: under load it waits on its own OpenMP helpers
  when they are descheduled, and sleeps on a futex meanwhile (measured on the CPU engine at load 8-13: a healthy
  scheduler's main thread blocked 7-30 ms per token, more than a planted 20 ms sleep per decode step added).
  While a helper it waits on is in the run queue, the process is not stalled; during a sleep in the decode step
  every thread is.
- idle time, set apart from blocked: stalled samples in which the main thread waits on its sockets for work (a
  poll-family system call on at least one descriptor, ``/proc/PID/task/PID/syscall``): with --sleep-on-idle
  SGLang's scheduler polls its sockets when it has no batch (scheduler_components/idle_sleeper.py), and under load
  the window's requests reach it late through a descheduled front end. While idle counted as blocked, CI read 2.48
  ms blocked a token (over its 2 ms ceiling) on a healthy one-rank engine beside a cold Go build and three other
  servers; under that load again, split, every stall was in the poll (0.55 ms a token idle, none blocked). A sleep
  (clock_nanosleep, or a select on no descriptor), a lock (futex) or a page wait (D) in the decode step stays
  blocked. A syscall file we may not read counts as blocked.

Which processes: the deployment's processes named ``sglang::scheduler*`` (SGLang's process titles, one per
rank), or, when none is (the simulator serves from the rank's own process), the ranks' root processes. Several
schedulers (tp > 1): the least-blocked one stands for the deployment, since a sleep in the decode step blocks
every rank while a rank waiting on a descheduled peer (an all-reduce under load) is one rank at a time.

Only the launcher knows these processes (``--server-pid``, given by ``dspark-ci run`` for the local launcher): a
standalone run against a URL, or a deployment on another machine, has no such figures ("not measured").
"""

from __future__ import annotations

import os
import platform
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

SCHEDULER_TITLE = "sglang::scheduler"  # setproctitle in sglang/srt/managers/scheduler.py, one per rank
NS_PER_MS = 1e6
SAMPLE_S = 0.005  # 200 samples a second: a 20 ms stall per decode step is 4 samples each time
# The poll family per architecture (the kernel's syscall tables): syscall number -> which argument counts the
# descriptors waited on (None for epoll: its instance holds them). A main thread blocked in one with descriptors
# waits on its sockets; with none it sleeps: Python 3.10's time.sleep is pselect6 with nfds 0 (3.11's is
# clock_nanosleep). arm64 has no poll, select or epoll_wait, only their p-variants.
SOCKET_WAITS: dict[int, int | None] = {
    # poll, select, epoll_wait, pselect6, ppoll, epoll_pwait, epoll_pwait2
    "x86_64": {7: 1, 23: 0, 232: None, 270: 0, 271: 1, 281: None, 441: None},
    # epoll_pwait, pselect6, ppoll, epoll_pwait2
    "aarch64": {22: None, 72: 0, 73: 1, 441: None},
}.get(platform.machine(), {})


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
    idle_ms_per_token: float

    def metrics(self) -> dict[str, float]:
        return {"scheduler_blocked_ms_per_token": self.blocked_ms_per_token,
                "scheduler_idle_ms_per_token": self.idle_ms_per_token,
                "scheduler_cpu_ms_per_token": self.cpu_ms_per_token,
                "scheduler_runqueue_ms_per_token": self.runqueue_ms_per_token}


def scheduler_pids(roots: Sequence[int]) -> tuple[int, ...]:
    """The scheduler processes of the deployment whose ranks are ``roots`` (see the module's docstring)."""
    found: list[int] = []
    alive: list[int] = []
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


def window_share(before: Sequence[ThreadTimes], after: Sequence[ThreadTimes], stalls: Sequence[StallCount],
                 tokens: int) -> WindowShare | None:
    """The least-stalled scheduler's share of the window between the two readings, per output token; None when no
    process was read at both ends and sampled, or no token was generated."""
    if tokens <= 0:
        return None
    start, sampled = {t.pid: t for t in before}, {c.pid: c for c in stalls if c.samples}
    shares = [_share(start[t.pid], t, sampled[t.pid], tokens) for t in after if t.pid in start and t.pid in sampled]
    return min(shares, key=lambda share: share.blocked_ms_per_token, default=None)


def _share(start: ThreadTimes, end: ThreadTimes, stalls: StallCount, tokens: int) -> WindowShare:
    wall = end.at_ns - start.at_ns
    on_cpu, runqueue = end.on_cpu_ns - start.on_cpu_ns, end.runqueue_ns - start.runqueue_ns
    per_token = lambda ns: ns / NS_PER_MS / tokens  # noqa: E731
    share = lambda count: per_token(wall * count / stalls.samples)  # noqa: E731
    return WindowShare(end.pid, wall / NS_PER_MS, per_token(on_cpu), per_token(runqueue), share(stalls.stalled),
                       share(stalls.idle))


@dataclass(frozen=True)
class StallCount:
    """How often one process was sampled, how often none of its threads was runnable (stalled), and how often that
    was its main thread waiting on its sockets for work (idle, not counted as stalled)."""

    pid: int
    samples: int
    stalled: int
    idle: int


class StallSampler:
    """Samples the thread states of ``pids`` every SAMPLE_S in a thread of its own, between ``start`` and ``stop``."""

    def __init__(self, pids: Sequence[int]):
        self._pids = tuple(pids)
        self._counts = {pid: [0, 0, 0] for pid in self._pids}  # samples, stalled, idle
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall sampler", daemon=True)

    def start(self) -> StallSampler:
        if self._pids:
            self._thread.start()
        return self

    def stop(self) -> tuple[StallCount, ...]:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        return tuple(StallCount(pid, *counts) for pid, counts in self._counts.items())

    def _run(self) -> None:
        tasks = {pid: _tasks(pid) for pid in self._pids}  # a scheduler's threads are all started by the window
        while not self._done.wait(SAMPLE_S):
            for pid, paths in tasks.items():
                states = [_state(path) for path in paths]
                if any(states):
                    self._counts[pid][0] += 1
                    if "R" not in states:
                        self._counts[pid][2 if waits_on_sockets(pid) else 1] += 1


def _tasks(pid: int) -> list[str]:
    try:
        return [f"/proc/{pid}/task/{tid}/stat" for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def _state(path: str) -> str:
    """A thread's state letter (R: running or runnable), "" when it is gone."""
    try:
        with open(path) as stat:
            return stat.read().rpartition(")")[2].split(maxsplit=1)[0]
    except (OSError, IndexError):
        return ""


def waits_on_sockets(pid: int) -> bool:
    """Whether the main thread of ``pid`` is blocked in a poll-family system call on at least one descriptor (False
    when unreadable: a process we may not trace, or a thread that runs again by now)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/syscall") as syscall:
            number, *args = syscall.read().split()
        count_at = SOCKET_WAITS[int(number)]
        return count_at is None or int(args[count_at], 16) > 0
    except (OSError, ValueError, KeyError, IndexError):  # "running", another syscall, or gone
        return False
