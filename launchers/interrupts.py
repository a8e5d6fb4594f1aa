"""Ctrl-C for a cell's own thread: when cells run side by side, each in a thread, the run's Ctrl-C or SIGTERM
(delivered to the main thread only) must reach every cell in flight and unwind it through the same ``finally``
blocks as a one-at-a-time run, so every launcher tears its group down exactly as it does on Ctrl-C.

``interrupt(thread)`` raises KeyboardInterrupt in ``thread`` at its next Python instruction (CPython's
``PyThreadState_SetAsyncExc``; a blocking call such as a 0.5 s poll sleep finishes first, and every wait here
polls). A thread inside a teardown (``launchers.processes.signals_deferred``, which calls ``deferred`` off the
main thread) is not interrupted there: the interrupt is held and raised once the teardown is done, as a second
Ctrl-C is on the main thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from dataclasses import dataclass
from typing import Iterator

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
