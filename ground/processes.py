"""Process, port and signal helpers every launcher shares, so each gets the same teardown guarantees.

- ``free_port``: a port nothing listens on now, outside the range the kernel gives outgoing connections.
- ``stop_all``: SIGTERM every process group, a grace period, SIGKILL what is left (strays included).
- ``die_with_parent``: a child that the kernel kills when the run dies, even by SIGKILL, with default signal
  dispositions and no blocked signal (whatever the run itself inherited: SIGINT ignored by a background shell).
- ``reset_inherited_signals``: the same for the run's own process, at start.
- ``run_env`` / ``group_members`` / ``kill_group``: every process a run starts carries its run id in its
  environment and a temp directory of the run's; a group is found, checked to be ours, killed whole, and the
  shared-memory files its members held (multiprocessing's ``/dev/shm/sem.mp-*``) are removed with it.
- ``sigterm_as_interrupt`` / ``signals_deferred``: SIGTERM behaves like Ctrl-C; neither may interrupt a teardown.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import psutil
from dspark_ci.ground import interrupts

_PR_SET_PDEATHSIG = 1


_handed_out: set[int] = set()  # ports this process gave a cell: never given again (cells run side by side)
_handed_out_lock = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on host now and not handed out before by this process (two cells booting side by side
    never get the same one). Drawn below the kernel's ephemeral range: a port bind(0) returns is one the kernel may
    hand the next outgoing connection of any program here (test workers, clients, SGLang's own processes), and the
    server we start then fails to bind it. A tiny race with other programs remains, which the health check's
    identity test catches: another server on the port is never taken for ours."""
    while True:
        port = _RANDOM.randrange(PORTS_FROM, _ephemeral_start())
        with _handed_out_lock:
            if port in _handed_out:
                continue
            _handed_out.add(port)
        if _bindable(host, port):
            return port


PORTS_FROM = 10000  # above the registered services a developer's machine tends to run (databases, dev servers)
_RANDOM = random.SystemRandom()  # two processes seeded alike must not walk the same ports


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (Linux's default when it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def port_is_free(host: str, port: int) -> bool:
    """Nothing accepts connections on host:port now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) != 0


# Dispositions a shell may hand us ignored (a background job of a non-interactive shell ignores SIGINT and SIGQUIT)
# and an ignored disposition survives exec: reset in every child, so it can be stopped as the run expects.
RESET_SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM)


def die_with_parent() -> Callable[[], None]:
    """A ``preexec_fn``: the child gets default signal dispositions and mask, and SIGKILL when the thread that
    started it dies (Linux prctl), so a run killed with SIGKILL takes its direct children with it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        prctl = None

    parent = os.getpid()

    def in_child() -> None:
        for sig in RESET_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:  # the run died between fork and prctl: nobody would ever record or stop us
                os.kill(os.getpid(), signal.SIGKILL)

    return in_child


def reset_inherited_signals() -> None:
    """At the start of dspark-ci: obey SIGINT (as KeyboardInterrupt) and SIGTERM even if started with them ignored
    or blocked (a background job of a non-interactive shell), and pass nothing ignored on to what it starts."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.pthread_sigmask(signal.SIG_UNBLOCK, RESET_SIGNALS)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGQUIT, signal.SIGTERM):
        if signal.getsignal(sig) is signal.SIG_IGN:
            signal.signal(sig, signal.SIG_DFL)


# --- what a run started: marked, found, killed whole -------------------------------------------------------

RUN_ENV = "DSPARK_CI_RUN"  # every process a run starts carries the run id: proof a group member is the run's
SHM_DIR = Path("/dev/shm")
SHM_PREFIXES = ("sem.mp-", "mp-", "psm_")  # multiprocessing's semaphores and shared memory blocks


def run_temp_dir(run_id: str) -> Path:
    """The run's own temp directory (TMPDIR of what it starts: multiprocessing's pymp-* directories land there)."""
    return Path(tempfile.gettempdir()) / f"dspark-ci-{run_id}"


def run_env(env: Mapping[str, str], run_id: str | None) -> dict[str, str]:
    """``env`` for a process of run ``run_id``: its mark and its temp directory (created, private)."""
    if not run_id:
        return dict(env)
    temp = run_temp_dir(run_id)
    temp.mkdir(mode=0o700, exist_ok=True)
    return {**env, RUN_ENV: run_id, "TMPDIR": str(temp)}


def remove_run_temp_dir(run_id: str, dry_run: bool = False) -> bool:
    """Remove the run's temp directory (``dry_run``: leave it); True if there was one."""
    temp = run_temp_dir(run_id)
    if not temp.is_dir() or temp.is_symlink():
        return False
    if not dry_run:
        shutil.rmtree(temp, ignore_errors=True)
    return True


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _carries(process: psutil.Process, run_id: str) -> bool:
    try:
        return process.environ().get(RUN_ENV) == run_id
    except psutil.Error:
        return False


def group_members(pgid: int, run_id: str | None) -> list[psutil.Process]:
    """The live processes of group ``pgid`` (with ``run_id``: only those carrying that run's mark, so a group id
    reused by someone else is never taken for ours)."""
    members = []
    for pid in psutil.pids():
        if _pgid(pid) != pgid:
            continue
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            if process.status() != psutil.STATUS_ZOMBIE and (run_id is None or _carries(process, run_id)):
                members.append(process)
    return members


def _shared_memory_of(processes: list[psutil.Process]) -> set[Path]:
    """The multiprocessing shared-memory files these processes map or hold open (killed, nobody unlinks them)."""
    found: set[Path] = set()
    for process in processes:
        with contextlib.suppress(psutil.Error, OSError):
            paths = [m.path for m in process.memory_maps(grouped=True)] + [f.path for f in process.open_files()]
            found.update(Path(p.removesuffix(" (deleted)")) for p in paths
                         if Path(p).parent == SHM_DIR and Path(p).name.startswith(SHM_PREFIXES))
    return found


# multiprocessing's resource tracker unlinks the semaphores its clients leaked once they are all gone: it is left
# this long to do so, after every other member of the group was killed, before it is killed too.
TRACKER_TIDY_S = 3.0


def _is_resource_tracker(process: psutil.Process) -> bool:
    try:
        return "multiprocessing.resource_tracker" in " ".join(process.cmdline())
    except psutil.Error:
        return False


def kill_group(pgid: int, run_id: str | None, also: Sequence[psutil.Process] = ()) -> list[psutil.Process]:
    """SIGKILL every member of group ``pgid`` (see ``group_members``) and ``also``, wait for them, then remove the
    shared-memory files they held: multiprocessing's resource trackers go last, after they had the chance to unlink
    what the others leaked. Returns the processes killed."""
    members = [*group_members(pgid, run_id), *(p for p in also if p.is_running())]
    shared = _shared_memory_of(members)
    trackers = [m for m in members if _is_resource_tracker(m)]
    others = [m for m in members if m not in trackers]
    for member in others:
        with contextlib.suppress(psutil.Error):
            member.kill()
    psutil.wait_procs(others, timeout=5)
    psutil.wait_procs(trackers, timeout=TRACKER_TIDY_S if trackers else 0)
    if run_id is None or members:
        signal_group(pgid, signal.SIGKILL)
    for member in trackers:
        with contextlib.suppress(psutil.Error):
            member.kill()
    psutil.wait_procs(trackers, timeout=5)
    for path in shared:
        with contextlib.suppress(OSError):
            path.unlink()
    return members


def started_at(pid: int) -> float | None:
    """The process's start time (with its pid, what identifies it: a pid alone may be reused)."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def signal_group(pgid: int, sig: int) -> None:
    # The group outlives its leader when children remain: signal it even after the leader exited.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_all(processes: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM every process group, wait up to ``grace_s``, SIGKILL the rest (and strays that left the group)."""
    members = {p.pid: descendants(p.pid) for p in processes}
    for process in processes:
        signal_group(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
    for process in processes:  # the leader is our child, not reaped yet: its group id cannot be anyone else's
        kill_group(process.pid, None, members[process.pid])
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM tears down like Ctrl-C does, unless the caller already handles SIGTERM."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def interrupt(signum, frame):
        # No run loop checks a flag out here (a launcher used on its own): raise, as Ctrl-C does, and record it
        # too, so that a raise swallowed where Python drops it (a GC callback) is raised again at the next check.
        interrupts.on_signal(signum, frame)
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """A second Ctrl-C or SIGTERM during teardown would leave things behind: hold it until teardown is done."""
    if threading.current_thread() is not threading.main_thread():  # a cell's thread (cells side by side)
        with interrupts.deferred(), interrupts.holding():
            yield
        return
    received: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: received.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with interrupts.holding():
            yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if received:  # deliver it now, to whoever handled it before
            signal.raise_signal(received[0])
