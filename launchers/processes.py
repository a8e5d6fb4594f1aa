"""Process, port and signal helpers every launcher shares, so each gets the same teardown guarantees.

- ``free_port``: a port nothing listens on now, on the address it will be bound to.
- ``stop_all``: SIGTERM every process group, a grace period, SIGKILL what is left (strays included).
- ``die_with_parent``: a child that the kernel kills when the run dies, even by SIGKILL.
- ``sigterm_as_interrupt`` / ``signals_deferred``: SIGTERM behaves like Ctrl-C; neither may interrupt a teardown.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from typing import Callable, Iterator

import psutil

from launchers import interrupts

_PR_SET_PDEATHSIG = 1


_handed_out: set[int] = set()  # ports this process gave a cell: never given again (cells run side by side)
_handed_out_lock = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now and not handed out before by this process (two cells booting side by side
    never get the same one; a tiny race with other programs remains, which the health check's identity test
    catches: another server on the port is never taken for ours)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        with _handed_out_lock:
            if port not in _handed_out:
                _handed_out.add(port)
                return port


def port_is_free(host: str, port: int) -> bool:
    """Nothing accepts connections on host:port now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) != 0


def die_with_parent() -> Callable[[], None]:
    """A ``preexec_fn``: the child gets SIGKILL when the thread that started it dies (Linux prctl), so a run
    killed with SIGKILL takes its direct children with it. Elsewhere it does nothing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return lambda: None
    return lambda: prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


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
    for process in processes:
        signal_group(process.pid, signal.SIGKILL)
        for child in members[process.pid]:
            with contextlib.suppress(psutil.Error):
                child.kill()
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
        with interrupts.deferred():
            yield
        return
    received: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: received.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if received:  # deliver it now, to whoever handled it before
            signal.raise_signal(received[0])
