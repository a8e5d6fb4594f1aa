"""A warm pytest for the suites: one process per run that has imported pytest and the suites' stack once, and
forks a fresh child for each cell's suite run.

A cell's suites used to start a new interpreter (``python -m pytest``): 2-3 s of imports per serving cell, the
largest cost of a cell outside boot and measurement. The fork keeps what the subprocess gave: each suite run is
its own process, in a session (process group) of its own, with the run's environment, its own log file, SIGINT
for "stop and write what you measured", and nothing of an earlier cell's state (the worker itself never runs a
test: every child starts from the same freshly imported, untouched modules).

The worker speaks JSON lines on its standard input and output: ``{"argv", "cwd", "env", "log"}`` in, ``{"pid"}``
and, when a child ends, ``{"exit": pid, "code": code}`` out. ``python -m dspark_ci.warm_worker`` runs it; the
client side is ``dspark_ci.suite_runner``'s ``WarmPytest``. It forks only from its single thread.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import json
import os
import queue
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

from dspark_ci.ground import interrupts
from dspark_ci.ground.errors import InfraError
from dspark_ci.ground.processes import die_with_parent

# The third-party stack a suite run imports, loaded once here. Not the suites' own modules: pytest rewrites their
# asserts as it imports them (cheap), which it cannot do to a module already imported.
PRELOAD = ("pytest", "_pytest.python", "_pytest.terminal", "requests", "aiohttp", "openai", "prometheus_client",
           "numpy", "scipy.stats")
# Pytest plugins that a preloaded stack imported first (anyio, by openai): rewriting them was never asked for.
QUIET = ("-W", "ignore:Module already imported so cannot be rewritten:pytest.PytestAssertRewriteWarning")
REAP_EVERY_S = 0.05


def main() -> None:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional stack missing here fails in the child, where pytest reports it
            pass
    # What is imported now lives as long as the worker: kept out of the collector's sight, so that a child's full
    # collections (pytest runs several at its exit: half a second each over this heap) only walk what it made.
    gc.freeze()
    # The protocol keeps the pipes to itself; a child (and whatever else prints) gets /dev/null for 0 and 1.
    commands = os.fdopen(os.dup(0), "r")
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    selector = selectors.DefaultSelector()
    selector.register(commands, selectors.EVENT_READ)
    while True:
        if selector.select(timeout=REAP_EVERY_S):
            line = commands.readline()
            if not line:  # the run closed our input: it is done with us (its children are its to stop)
                return
            proto.write(json.dumps({"pid": _fork(json.loads(line), (commands, proto))}) + "\n")
        _reap(proto)


def _fork(command: dict, pipes: tuple) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    with_worker = die_with_parent()  # made here: it remembers the worker as the parent to die with
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: never returns into the worker's loop
        with_worker()
        code = _child(command, pipes)
    except BaseException:  # noqa: BLE001 - anything at all: the child must end here, with a code
        import traceback
        traceback.print_exc()
        code = 3
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _child(command: dict, pipes: tuple) -> int:
    os.setsid()  # a group of its own: the run signals and kills it as one, as it did the subprocess
    for pipe in pipes:
        pipe.close()
    log = os.open(command["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # pytest stops the session and writes its results
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(command["env"])
    tempfile.tempdir = None  # TMPDIR is the run's own: forget the worker's
    os.chdir(command["cwd"])
    sys.argv = ["pytest", *command["argv"]]
    import pytest

    try:
        code = int(pytest.main([*QUIET, *command["argv"]]))
    finally:
        atexit._run_exitfuncs()  # what a normal interpreter exit runs (multiprocessing's finalizers among them)
    return code


def _reap(proto) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        proto.write(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}) + "\n")



# ---------------------------------------------------------------- the run's side


class WarmChild:
    """A suite run forked by the worker: what ``dspark_ci.suite_runner`` needs of a ``subprocess.Popen``."""

    def __init__(self, pid: int, worker: WarmPytest, argv: list[str]):
        self.pid, self.args, self._worker = pid, argv, worker

    @property
    def returncode(self) -> int | None:
        return self._worker.exit_code(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        code = self._worker.wait_exit(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code


class WarmPytest:
    """The worker of one run (its mark and temp directory in ``env``): started once, from a thread that lives as
    long as this process, so that PDEATHSIG takes it along when the run dies (a cell's thread would end first)."""

    def __init__(self, python: str, cwd: str, env: dict[str, str]):
        self._lock, self._exits = threading.Lock(), threading.Condition()
        self._codes: dict[int, int] = {}
        self._worker_gone = False
        self.recorded_in: object = None  # the run directory whose ledger lists the worker
        self._pids: queue.Queue[int | None] = queue.Queue()
        self.process = _in_owner_thread(lambda: subprocess.Popen(
            [python, "-m", "dspark_ci.warm_worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, cwd=cwd, env=env, text=True, bufsize=1, start_new_session=True,
            preexec_fn=die_with_parent()))
        threading.Thread(target=self._read, name="warm-pytest", daemon=True).start()

    def spawn(self, argv: list[str], cwd: str, env: dict[str, str], log: str) -> WarmChild:
        """pytest ``argv`` in a forked child; InfraError when the worker is gone (the caller starts it cold)."""
        with self._lock:
            try:
                assert self.process.stdin is not None
                self.process.stdin.write(json.dumps({"argv": argv, "cwd": cwd, "env": env, "log": log}) + "\n")
                self.process.stdin.flush()
                pid = self._answer()
            except (OSError, ValueError):
                pid = None
        if pid is None:
            # A child it forks after this would run unwatched beside the cold start: the worker goes, and any
            # child of it with it (PDEATHSIG).
            with contextlib.suppress(OSError):
                self.process.kill()
            raise InfraError("the warm pytest worker did not answer")
        return WarmChild(pid, self, argv)

    def _answer(self) -> int | None:
        """The forked child's pid, or None when the worker died or is still busy after SPAWN_TIMEOUT_S; a Ctrl-C
        meanwhile is acted on here (dspark_ci.ground.interrupts), not after a minute."""
        deadline = time.monotonic() + SPAWN_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                return self._pids.get(timeout=ANSWER_POLL_S)
            interrupts.check()
        return None

    def exit_code(self, pid: int) -> int | None:
        with self._exits:
            return self._code(pid)

    def wait_exit(self, pid: int, timeout: float | None) -> int | None:
        with self._exits:
            self._exits.wait_for(lambda: self._code(pid) is not None, timeout)
            return self._code(pid)

    def _code(self, pid: int) -> int | None:
        # A worker that died took its children along (PDEATHSIG): one it can no longer report on has ended.
        return self._codes.get(pid, -signal.SIGKILL if self._worker_gone else None)

    def close(self) -> None:
        """No more suite runs: the worker exits when its input closes (its children are the run's to stop)."""
        with contextlib.suppress(OSError, ValueError):
            if self.process.stdin:
                self.process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=CLOSE_TIMEOUT_S)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            message = json.loads(line)
            if "pid" in message:
                self._pids.put(message["pid"])
            else:
                with self._exits:
                    self._codes[message["exit"]] = message["code"]
                    self._exits.notify_all()
        self._pids.put(None)  # the worker is gone: a spawn waiting on it fails at once
        with self._exits:  # and a child it can no longer report on is taken for ended
            self._worker_gone = True
            self._exits.notify_all()


_WORKERS: dict[str, WarmPytest] = {}
_WORKERS_LOCK = threading.Lock()
COLD_ENV = "DSPARK_SUITES_COLD"  # set (to anything but "" or "0"): every suite run starts its own interpreter


def warm_worker(key: str, python: str, cwd: str, env: dict[str, str]) -> WarmPytest | None:
    """The worker for ``key`` (a run id), started on first use; None when cold starts are asked for or the
    worker cannot start (the caller then starts pytest as its own interpreter, as before)."""
    if os.environ.get(COLD_ENV, "") not in ("", "0"):
        return None
    with _WORKERS_LOCK:
        worker = _WORKERS.get(key)
        if worker is None or worker.process.poll() is not None:
            try:
                worker = _WORKERS[key] = WarmPytest(python, cwd, env)
            except OSError:
                return None
        return worker


def close_warm_workers() -> None:
    """At the end of a run (and at exit): every worker leaves."""
    with _WORKERS_LOCK:
        workers = list(_WORKERS.values())
        _WORKERS.clear()
    for worker in workers:
        worker.close()


atexit.register(close_warm_workers)

SPAWN_TIMEOUT_S = 60.0  # the first answer waits for the worker's imports on a loaded machine
ANSWER_POLL_S = 0.2
CLOSE_TIMEOUT_S = 5.0


def _in_owner_thread(start: Callable[[], subprocess.Popen]) -> subprocess.Popen:
    """Run ``start`` in the one thread that lives as long as this process (created on first use)."""
    done: queue.Queue[subprocess.Popen | BaseException] = queue.Queue()

    def call() -> None:
        try:
            done.put(start())
        except BaseException as err:  # noqa: BLE001 - handed back to the caller as it is
            done.put(err)

    _owner().put(call)
    result = done.get()
    if isinstance(result, BaseException):
        raise result
    return result


_OWNER: queue.Queue[Callable[[], None]] | None = None
_OWNER_LOCK = threading.Lock()


def _owner() -> queue.Queue[Callable[[], None]]:
    global _OWNER
    with _OWNER_LOCK:
        if _OWNER is None:
            _OWNER = queue.Queue()
            owner_queue = _OWNER

            def serve() -> None:
                while True:
                    owner_queue.get()()

            threading.Thread(target=serve, name="process-owner", daemon=True).start()
        return _OWNER


if __name__ == "__main__":
    main()
