"""The suites' warm pytest worker (dspark_ci.warm_worker): each suite run is still a process of its own, in a group of
its own, with the environment and log it was given; it stops on SIGINT having written what it had; nothing of it
outlives the process that started it, even when that process is SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from dspark_ci.warm_worker import WarmPytest

REPO = Path(__file__).resolve().parent.parent
TEST_FILE = """
import os, pathlib, time

def test_reports_where_it_runs():
    pathlib.Path(os.environ["OUT"]).write_text(
        f"{os.getpid()} {os.getpgid(0)} {os.environ.get('MARK')} {os.getcwd()}")

def test_waits_when_asked():
    if os.environ.get("WAIT"):
        pathlib.Path(os.environ["OUT"] + ".started").write_text("")
        time.sleep(120)
"""
PATIENCE_S = 60.0  # a loaded 2-core machine: every bound here is about an event, not a speed


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {PATIENCE_S:g} s")
        time.sleep(0.1)


@pytest.fixture
def worker():
    started = WarmPytest(sys.executable, str(REPO), dict(os.environ))
    yield started
    started.close()


def test_each_run_is_its_own_process_group_with_its_env_cwd_and_log(tmp_path, worker):
    (tmp_path / "test_probe.py").write_text(TEST_FILE)
    seen = []
    for mark in ("first", "second"):
        out, log = tmp_path / f"{mark}.out", tmp_path / f"{mark}.log"
        child = worker.spawn([str(tmp_path / "test_probe.py"), "-q", "-p", "no:cacheprovider"], str(tmp_path),
                             {**os.environ, "OUT": str(out), "MARK": mark}, str(log))
        assert child.wait(PATIENCE_S) == 0, log.read_text()
        pid, pgid, got_mark, cwd = out.read_text().split()
        assert int(pid) == child.pid and int(pgid) == child.pid  # its own group: the run signals it as one
        assert (got_mark, cwd) == (mark, str(tmp_path))
        assert "2 passed" in log.read_text()
        seen.append(child.pid)
    assert seen[0] != seen[1]  # a fresh process each time, never the worker itself
    assert worker.process.pid not in seen


def test_sigint_stops_a_run_as_pytest_stops(tmp_path, worker):
    (tmp_path / "test_probe.py").write_text(TEST_FILE)
    out, log = tmp_path / "run.out", tmp_path / "run.log"
    child = worker.spawn([str(tmp_path / "test_probe.py"), "-q", "-p", "no:cacheprovider"], str(tmp_path),
                         {**os.environ, "OUT": str(out), "WAIT": "1"}, str(log))
    wait_for(lambda: Path(str(out) + ".started").exists(), "the waiting test's start")
    os.killpg(child.pid, signal.SIGINT)
    assert child.wait(PATIENCE_S) == pytest.ExitCode.INTERRUPTED  # pytest's own answer to a Ctrl-C
    assert "KeyboardInterrupt" in log.read_text()


OWNER = textwrap.dedent("""
    import json, os, sys, time
    sys.path.insert(0, {repo!r})
    from dspark_ci.warm_worker import WarmPytest
    worker = WarmPytest(sys.executable, {repo!r}, dict(os.environ))
    child = worker.spawn([{test!r}, "-q", "-p", "no:cacheprovider"], {tmp!r},
                         {{**os.environ, "OUT": {out!r}, "WAIT": "1"}}, {log!r})
    print(json.dumps({{"worker": worker.process.pid, "child": child.pid}}), flush=True)
    time.sleep(600)
""")


def test_nothing_outlives_a_sigkilled_owner(tmp_path):
    (tmp_path / "test_probe.py").write_text(TEST_FILE)
    out = tmp_path / "run.out"
    script = OWNER.format(repo=str(REPO), test=str(tmp_path / "test_probe.py"), tmp=str(tmp_path), out=str(out),
                          log=str(tmp_path / "run.log"))
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(owner.stdout.readline())
        wait_for(lambda: Path(str(out) + ".started").exists(), "the child's test start")
    finally:
        owner.kill()
        owner.wait()
    wait_for(lambda: not any(_alive(pid) for pid in pids.values()), "the worker's and its child's end")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
