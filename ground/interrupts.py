"""Ctrl-C for a cell's own thread: when cells run side by side, each in a thread, the run's Ctrl-C or SIGTERM
(delivered to the main thread only) must reach every cell in flight and unwind it through the same ``finally``
blocks as a one-at-a-time run, so every launcher tears its group down exactly as it does on Ctrl-C.

``interrupt(thread)`` raises KeyboardInterrupt in ``thread`` at its next Python instruction (CPython's
``PyThreadState_SetAsyncExc``; a blocking call such as a 0.5 s poll sleep finishes first, and every wait here
polls). A thread inside a teardown (``dspark_ci.ground.processes.signals_deferred``, which calls ``deferred`` off the
main thread) is not interrupted there: the interrupt is held and raised once the teardown is done, as a second
Ctrl-C is on the main thread.

The run's own Ctrl-C and SIGTERM (``on_signal``, installed by ``install``) only set a flag, ``requested()``: a
KeyboardInterrupt raised from a handler lands wherever the main thread happens to be, and Python drops it when that
is a garbage-collector or weakref callback ("Exception ignored in ... KeyboardInterrupt"), so the run would go on
and exit 0. Every wait of the pipeline (launch waits, suite watching, the scheduler's loop) calls ``check()``, which
raises KeyboardInterrupt there, in ordinary code; the final files and the exit code are decided from the flag.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

_lock = threading.Lock()


@dataclass
class _ThreadState:
    deferring: int = 0  # nested teardowns in progress
    pending: bool = False  # interrupted during one: raise when the outermost ends


_states: dict[int, _ThreadState] = {}


def interrupt(thread: threading.Thread) -> None:
    """KeyboardInterrupt in ``thread`` now, or when its teardown in progress is done."""
    ident = thread.ident
    if ident is None or not thread.is_alive():
        return
    with _lock:
        state = _states.setdefault(ident, _ThreadState())
        if state.deferring:
            state.pending = True
            return
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(KeyboardInterrupt))


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """This thread is tearing down: an interrupt waits until the block is done, then is raised."""
    ident = threading.get_ident()
    with _lock:
        _states.setdefault(ident, _ThreadState()).deferring += 1
    try:
        yield
    finally:
        with _lock:
            state = _states[ident]
            state.deferring -= 1
            fire = state.deferring == 0 and state.pending
            if state.deferring == 0:
                del _states[ident]
        if fire:
            raise KeyboardInterrupt("interrupted while tearing down")


_requested: list[int] = []  # the signals received, in order (append is atomic: safe from a handler)
_holding = threading.local()  # this thread's teardowns in progress: check() does not raise inside one


def on_signal(signum: int, frame: object) -> None:
    """SIGINT / SIGTERM handler: record it, nothing else (the next ``check()`` acts on it)."""
    _requested.append(signum)


def requested() -> int | None:
    """The first Ctrl-C or SIGTERM received since ``reset``, or None."""
    return _requested[0] if _requested else None


def reset() -> None:
    _requested.clear()
    _announced.clear()


_announced: list[int] = []  # the late signal already said (once is enough)
HELD_AT_EXIT = frozenset({signal.SIGINT, signal.SIGTERM})


def announce_late(say: Callable[[str], None]) -> None:
    """Once a run's final files are written: say, once, that a Ctrl-C or SIGTERM came since (the run had finished;
    there was nothing left to stop), so an exit 0 after a signal is never silent."""
    came = requested()
    if came is not None and not _announced:
        _announced.append(came)
        say(f"{signal.Signals(came).name} came as the final files were written: the run had finished, nothing to stop")


def hold_until_exit(say: Callable[[str], None]) -> None:
    """The last thing a finished run does: Ctrl-C and SIGTERM are blocked from here to the process's exit (held,
    never delivered), and one that came before the block, handled or still pending, is said. Between the run's own
    last look at the flag and its exit, a signal would otherwise be neither acted on nor said."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, HELD_AT_EXIT)
    pending = sorted(signal.sigpending() & HELD_AT_EXIT)
    if pending and not _requested:
        _requested.append(int(pending[0]))
    announce_late(say)


def check() -> None:
    """At every wait: raise KeyboardInterrupt when an interrupt was requested (once teardowns in progress end)."""
    if _requested and not getattr(_holding, "depth", 0):
        raise KeyboardInterrupt(signal.Signals(_requested[0]).name)


@contextlib.contextmanager
def holding() -> Iterator[None]:
    """A teardown: ``check()`` stays quiet in this thread until it is done."""
    _holding.depth = getattr(_holding, "depth", 0) + 1
    try:
        yield
    finally:
        _holding.depth -= 1


def install() -> None:
    """Ctrl-C and SIGTERM are ``on_signal`` from now on (main thread), starting with no request recorded. Never
    restored: the process exits with what its files say, and a signal meanwhile must not raise."""
    if threading.current_thread() is not threading.main_thread():
        return
    reset()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
