"""Verdicts that cannot lie, through the command line as a user meets them: an unexpected exception at
any stage, a stopped or dying rank while measuring, a rank-0 crash in a two-node cell, a SIGKILLed run and
`cleanup`, concurrent runs. Each asserts what a user sees: exit code, results.json, report.md's verdict line,
junit.xml's counts, the error naming the right rank and SGLang line, and nothing left in the process table.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest

from tests.cli_under_test import DSPARK_CI
from tests.test_run_cli import ONE_NODE, REJECTED, REPO, SMOKE, TWO_NODES, Run

RED = "❌ **FAILED**"
GREEN = "✅ **PASSED**"
# Rank liveness is checked every second while the suites run (dspark_ci.suite_runner.Watch.poll_s); a stopped or dead
# rank must end the whole run (suites stopped, ranks torn down, reports written) at once, not when the suites
# would have ended. The timing is the behaviour here, so it has a bound; the bound leaves room for a loaded
# 2-core machine (start-up, teardown and reports then take seconds each) and stays far below SLOW's duration.
FAILS_WITHIN_S = 30.0
# slow_decode=1000 makes the smoke cells' accept suite take many minutes when nothing goes wrong; the hang and
# exit tests must end far sooner than that.
SLOW = "slow_decode=1000"
# A window to act in while a cell measures, short enough to let the cell finish: the smoke cell's accept suite
# (greedy, sampled and lossless passes) took 15 s without the fault, 48 s at slow_decode=5, 170 s at 20.
WINDOW = "slow_decode=5"


class VerdictRun(Run):
    """tests.test_run_cli.Run with its own run index (DSPARK_STATE_DIR), so `cleanup` sees only this test's runs."""

    def __init__(self, tmp_path: Path, *args: str, faults: str = "", state_dir: Path | None = None):
        super().__init__(tmp_path, *args, faults=faults)
        self.state_dir = state_dir or tmp_path / "state"
        self.env["DSPARK_STATE_DIR"] = str(self.state_dir)
        # What these tests assert is process control and the files a run leaves, not a baseline's gates: with the
        # floors alone a cell decides on its first boot instead of the four the smoke baseline's t-tests need.
        tmp_path.mkdir(parents=True, exist_ok=True)
        floors_only = tmp_path / "floors-only.yaml"
        floors_only.write_text("schema: 1\ncells: {}\n")
        self.argv[-2:-2] = ["--baseline", str(floors_only)]

    def ledger(self) -> list[dict]:
        path = self.out / "launched.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def rank(self, cell_id: str, node_rank: int) -> dict | None:
        return next((e for e in self.ledger() if e["cell"] == cell_id and e["rank"] == node_rank), None)

    def lines(self) -> list[dict]:
        path = self.out / "results.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def report(self) -> str:
        return (self.out / "report.md").read_text()

    def junit(self) -> dict:
        root = ET.parse(self.out / "junit.xml").getroot()
        return {key: int(root.get(key)) for key in ("tests", "failures", "errors")}

    def cleanup(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*DSPARK_CI, "cleanup", *args], env=self.env, capture_output=True, text=True,
                              timeout=60, cwd=REPO)


def wait_for(condition, what: str, timeout: float = 300.0):
    """Poll for an observable event. The deadline only stops a hung test: it is no bound on the product, so it
    leaves a loaded 2-core machine (launch and boot then take tens of seconds) ample room."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def process_of(entry: dict) -> psutil.Process:
    """The rank process a ledger line names (checked by start time, never a reused pid)."""
    process = psutil.Process(entry["pid"])
    assert abs(process.create_time() - entry["pid_started"]) < 1.0
    return process


def dead(process: psutil.Process) -> bool:
    """Gone, or a zombie its (stopped) parent has not reaped yet."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def assert_red(run: VerdictRun, errors: int, failures: int = 0) -> None:
    assert RED in run.report() and GREEN not in run.report()
    counts = run.junit()
    assert (counts["errors"], counts["failures"]) == (errors, failures), counts


def kill_quietly(process) -> None:
    for action in (lambda: process.send_signal(signal.SIGCONT), process.kill):
        try:
            action()
        except (psutil.Error, ProcessLookupError):
            pass


# ---------------------------------------------------------------------------------------------------------------
# 1. An unexpected exception at any stage: that cell is an error with its traceback kept, the run goes on.

# Run in a subprocess: patches one stage so that its first call raises, then runs `dspark-ci` as the CLI does.
INJECT = """
import pkgutil
import sys
from unittest import mock
from dspark_ci.cli import main

stage, argv = sys.argv[1], sys.argv[2:]
target = {"launch": "dspark_ci.launchers.local.lifecycle.LocalLauncher.launch", "wait": "dspark_ci.launchers.local.lifecycle.wait_until_ready",
          "suite": "dspark_ci.cell_run.run_suites", "gate": "dspark_ci.pipeline.evaluate",  # where each is looked up
          "report": "dspark_ci.reports.live_results.render_final_set"}[stage]
original, calls = pkgutil.resolve_name(target), []

def first_call_raises(*args, **kwargs):
    calls.append(1)
    if len(calls) == 1:
        raise RuntimeError(f"injected at the {stage} stage")
    return original(*args, **kwargs)

with mock.patch(target, first_call_raises):
    sys.exit(main(argv))
"""


def injected(tmp_path: Path, stage: str, *args: str) -> VerdictRun:
    run = VerdictRun(tmp_path, *args)
    run.argv = [sys.executable, "-c", INJECT, stage, *run.argv[3:]]  # `-m dspark_ci` → the driver + the same args
    return run


@pytest.mark.parametrize("stage", ["launch", "wait", "suite", "gate"])
def test_an_unexpected_exception_at_any_stage_is_that_cells_error_and_the_run_goes_on(tmp_path, stage):
    run = injected(tmp_path, stage, SMOKE, "--cell", ONE_NODE, "--cell", REJECTED, "--suites", "accept",
                   "--boot-timeout", "20")
    done = run()  # asserts nothing is left in the process table
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    first, second = run.results()["cells"]
    assert (first["id"], first["status"]) == (ONE_NODE, "error")
    assert f"unexpected RuntimeError: injected at the {stage} stage" in first["error"]
    traceback_file = run.out / "logs" / ONE_NODE / "dspark-ci-error.log"
    assert str(traceback_file) in first["error"]
    assert "Traceback" in traceback_file.read_text() and f"injected at the {stage} stage" in traceback_file.read_text()
    # The next cell still ran, to its own verdict.
    assert (second["id"], second["status"]) == (REJECTED, "rejected_as_expected")
    assert (run.out / "logs" / REJECTED / "0.log").exists()
    assert [line["id"] for line in run.lines()] == [ONE_NODE, REJECTED]
    assert_red(run, errors=1)
    assert f"unexpected RuntimeError: injected at the {stage} stage" in run.report()
    assert f"{ONE_NODE}: ERROR" in done.stderr


def test_a_failure_to_write_the_reports_is_red_and_keeps_results(tmp_path):
    run = injected(tmp_path, "report", SMOKE, "--cell", ONE_NODE, "--cell", REJECTED, "--suites", "accept")
    done = run()
    assert done.returncode == 1, done.stderr
    assert "writing the reports failed (RuntimeError: injected at the report stage)" in done.stderr
    assert "Traceback" not in done.stderr
    # What was measured is intact (both cells fine), yet no report on disk may call the run green.
    assert {c["id"]: c["status"] for c in run.results()["cells"]} == {ONE_NODE: "passed",
                                                                     REJECTED: "rejected_as_expected"}
    assert RED in run.report() and GREEN not in run.report()
    assert "injected at the report stage" in run.report()
    assert run.junit()["errors"] >= 1
    assert not (run.out / "report.html").exists() or GREEN not in (run.out / "report.html").read_text()


# ---------------------------------------------------------------------------------------------------------------
# 2. A rank that stops answering (SIGSTOP) while the suites run fails the cell within a stated bound.

def freeze_while_measuring(run: VerdictRun, process: subprocess.Popen, cell_id: str,
                           node_rank: int) -> tuple[dict, str, float]:
    """SIGSTOP one rank while the suites measure; its ledger entry, the run's output, and the seconds from the
    freeze to the run's end."""
    stopped = None
    try:
        entry = wait_for(lambda: run.rank(cell_id, node_rank), "the rank to be launched")
        wait_for(lambda: (run.out / "logs" / cell_id / "suites.progress_file").exists(), "the suites to measure")
        stopped = process_of(entry)
        stopped.suspend()
        at = time.monotonic()
        output, _ = process.communicate(timeout=60)
        return entry, output, time.monotonic() - at
    finally:
        if stopped is not None:
            kill_quietly(stopped)
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize("cell_id, node_rank", [(ONE_NODE, 0), (TWO_NODES, 0), (TWO_NODES, 1)],
                         ids=["one-node-rank-0", "two-node-rank-0", "two-node-rank-1"])
def test_a_stopped_rank_fails_the_cell_within_the_bound(tmp_path, cell_id, node_rank):
    run = VerdictRun(tmp_path, SMOKE, "--cell", cell_id, "--suites", "accept", faults=SLOW)
    process = run.start()
    entry, output, took = freeze_while_measuring(run, process, cell_id, node_rank)
    assert process.returncode == 1, output
    assert took < FAILS_WITHIN_S, f"the run took {took:.1f} s to fail after rank {node_rank} was stopped\n{output}"
    run.assert_nothing_left()
    cell = run.cell(cell_id)
    assert cell["status"] == "error"
    assert f"{cell_id}: node rank {node_rank} stopped answering" in cell["error"]
    assert f"process {entry['pid']} is stopped" in cell["error"]
    assert_red(run, errors=1)


# ---------------------------------------------------------------------------------------------------------------
# 3. A rank that exits while measuring fails the cell at once, not when the suites end.

def test_a_rank_exiting_while_measuring_fails_the_cell_at_once(tmp_path):
    run = VerdictRun(tmp_path, SMOKE, "--cell", TWO_NODES, "--suites", "accept", faults=f"{SLOW},rank_exit=1:4")
    done = run()
    finished = time.time()
    assert done.returncode == 1, done.stderr
    rank1 = run.rank(TWO_NODES, 1)
    exited_at = rank1["pid_started"] + 4  # rank_exit=1:4: four seconds after it started
    assert finished - exited_at < FAILS_WITHIN_S, f"the run ended {finished - exited_at:.1f} s after rank 1 exited"
    assert (run.out / "logs" / TWO_NODES / "suites.log").exists()  # it did exit while measuring
    cell = run.cell(TWO_NODES)
    assert cell["status"] == "error"
    assert cell["error"].startswith(f"{TWO_NODES}: node rank 1 exited with code 1")
    assert "[sglang_sim fault rank_exit] node rank 1 exits after 4 s" in cell["sglang_error"]
    assert "node rank 0 exited too" in cell["error"]
    assert_red(run, errors=1)


# ---------------------------------------------------------------------------------------------------------------
# 4. Rank 0's own SGLang error is the culprit of a two-node crash, every time.

def test_rank_0_crash_in_a_two_node_cell_names_rank_0_and_its_sglang_error(tmp_path):
    for attempt in range(3):  # the ranks die within milliseconds of each other: not luck, every time
        run = VerdictRun(tmp_path / f"attempt-{attempt}", SMOKE, "--cell", TWO_NODES, "--suites", "accept",
                         faults="crash_first_prefill")
        done = run()
        assert done.returncode == 1, done.stderr
        cell = run.cell(TWO_NODES)
        assert cell["status"] == "error"
        assert cell["error"].startswith(f"{TWO_NODES}: node rank 0 exited with code 1"), cell["error"]
        assert cell["sglang_error"].startswith("AssertionError"), cell["sglang_error"]
        assert f"SGLang said: {cell['sglang_error']}" in cell["error"]
        assert "node rank 1 exited too" in cell["error"]
        assert_red(run, errors=1)
        assert cell["sglang_error"] in run.report()


# ---------------------------------------------------------------------------------------------------------------
# 5 and 6. SIGKILL of the whole run at several moments; `cleanup --run ID`; results.jsonl keeps finished cells.

def _logs(run: VerdictRun, cell_id: str, name: str) -> bool:
    return (run.out / "logs" / cell_id / name).exists()


MOMENTS = {  # when to SIGKILL the run: (condition, cells finished by then)
    "first-cell-booting": (lambda run: run.rank(ONE_NODE, 0), []),
    "first-cell-measuring": (lambda run: _logs(run, ONE_NODE, "suites.log"), []),
    "between-cells": (lambda run: run.lines(), [ONE_NODE]),
    "two-node-cell-booting": (lambda run: run.rank(TWO_NODES, 1), [ONE_NODE]),
    "two-node-cell-measuring": (lambda run: _logs(run, TWO_NODES, "suites.log"), [ONE_NODE]),
}


def sigkill_when(run: VerdictRun, condition, what: str, settle_s: float = 0.0, before=lambda: None):
    """Start the run, SIGKILL it once ``condition()`` holds (and ``settle_s`` later); ``before()``'s value, taken
    just before the kill, is returned."""
    process = run.start()
    try:
        wait_for(condition, what)
        time.sleep(settle_s)
        seen = before()
        process.kill()
        process.wait(timeout=10)
        return seen
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_sigkill_then_cleanup_leaves_nothing_and_keeps_finished_cells(tmp_path, moment):
    condition, finished = MOMENTS[moment]
    # No slowed decode: the kill lands 0.5 s into a measurement that takes 15 s unslowed, and three of the five
    # moments wait for the first cell to finish (48 s slowed).
    run = VerdictRun(tmp_path, SMOKE, "--cell", ONE_NODE, "--cell", TWO_NODES, "--suites", "accept")
    sigkill_when(run, lambda: condition(run), moment, settle_s=0.5 if moment.endswith("measuring") else 0.0)
    # The run id is in results.json from the start, and the run is in the index of this test's state dir.
    results = run.results()
    run_id = results["run_id"]
    assert (run.state_dir / "runs" / f"{run_id}.json").exists()
    # 6: every cell finished before the kill is in results.jsonl (and, unless the kill came the instant after,
    # in results.json), with its outcome.
    assert [(line["id"], line["status"]) for line in run.lines()] == [(c, "passed") for c in finished]
    statuses = {c["id"]: c["status"] for c in results["cells"]}
    assert list(statuses) == [ONE_NODE, TWO_NODES]  # every selected cell, with an outcome or "no outcome yet"
    if moment != "between-cells":
        assert [c for c in statuses if statuses[c] == "passed"] == finished
    # What is on disk after a hard kill never calls the run green: the unfinished cells have no outcome yet.
    assert RED in run.report() and GREEN not in run.report()
    assert statuses.get(TWO_NODES, "error") == "error"
    assert run.junit()["errors"] >= 1
    listed = run.cleanup("--run", run_id, "--dry-run")
    assert listed.returncode == 0 and (run.state_dir / "runs" / f"{run_id}.json").exists(), listed.stderr
    cleaned = run.cleanup("--run", run_id)
    assert cleaned.returncode == 0, cleaned.stderr
    assert "leftover(s) removed from 1 finished run(s)" in cleaned.stdout
    # The dry run found what the real one removed (a process may die on its own in between, never the reverse).
    removed = {line.removeprefix("removed ") for line in cleaned.stdout.splitlines() if line.startswith("removed ")}
    assert removed and removed <= {line.removeprefix("would remove ") for line in listed.stdout.splitlines()}
    run.assert_nothing_left()
    assert not (run.state_dir / "runs" / f"{run_id}.json").exists()


def test_cleanup_force_removes_what_a_hung_run_started(tmp_path):
    run = VerdictRun(tmp_path, SMOKE, "--cell", TWO_NODES, "--suites", "accept", faults="slow_decode=60")
    process = run.start()
    try:
        wait_for(lambda: _logs(run, TWO_NODES, "suites.log"), "the suites to start")
        ranks = [process_of(run.rank(TWO_NODES, rank)) for rank in (0, 1)]
        process.send_signal(signal.SIGSTOP)  # the run hangs (as a stuck CI job does), its servers keep running
        run_id = run.results()["run_id"]
        refused = run.cleanup("--run", run_id)
        assert refused.returncode == 2 and "that run is still going" in refused.stderr
        assert all(rank.is_running() for rank in ranks)
        cleaned = run.cleanup("--run", run_id, "--force")
        assert cleaned.returncode == 0, cleaned.stderr
        # Rank 0 first (the ledger's order); rank 1 may already have died of losing it before its turn came.
        assert f"removed process {ranks[0].pid} (cell {TWO_NODES}, node rank 0)" in cleaned.stdout
        wait_for(lambda: all(dead(rank) for rank in ranks), "every rank to be dead", timeout=5)
    finally:
        process.kill()  # SIGKILL works on a stopped process too
        process.wait()
    run.assert_nothing_left()


def test_cleanup_removes_dead_runs_and_never_touches_a_live_one(tmp_path):
    state = tmp_path / "state"
    live = VerdictRun(tmp_path / "live", SMOKE, "--cell", ONE_NODE, "--suites", "accept", faults=WINDOW,
                      state_dir=state)
    dead = VerdictRun(tmp_path / "dead", SMOKE, "--cell", ONE_NODE, "--suites", "accept", faults=WINDOW,
                      state_dir=state)
    live_process = live.start()
    dead_process = dead.start()
    try:
        wait_for(lambda: _logs(dead, ONE_NODE, "suites.log"), "the run to be killed to measure")
        wait_for(lambda: _logs(live, ONE_NODE, "suites.log"), "the live run to measure")
        dead_process.kill()
        dead_process.wait(timeout=10)
        dead_id, live_id = dead.results()["run_id"], live.results()["run_id"]
        assert live_id != dead_id
        refused = live.cleanup("--run", live_id)  # a live run is never cleaned by id either (without --force)
        assert refused.returncode == 2 and "that run is still going" in refused.stderr
        cleaned = live.cleanup()
        assert cleaned.returncode == 0, cleaned.stderr
        assert "from 1 finished run(s)" in cleaned.stdout and live_id not in cleaned.stdout
        dead.assert_nothing_left()
        assert not (state / "runs" / f"{dead_id}.json").exists() and (state / "runs" / f"{live_id}.json").exists()
        output, _ = live_process.communicate(timeout=300)
    finally:
        for process in (live_process, dead_process):
            if process.poll() is None:
                process.kill()
                process.wait()
    assert live_process.returncode == 0, output
    assert live.cell(ONE_NODE)["status"] == "passed"
    live.assert_nothing_left()


# ---------------------------------------------------------------------------------------------------------------
# 7. Two runs of the same matrix at once: both pass, each measured its own servers only.

def _port(text: str, flag: str) -> str:
    words = text.split()
    value = words[words.index(flag) + 1]
    return value.rsplit(":", 1)[-1]


def test_two_concurrent_runs_of_the_same_matrix_both_pass_without_cross_talk(tmp_path):
    # The sanity suite: what is under test is whose servers each run's suites talk to, not what they measure
    runs = [VerdictRun(tmp_path / name, SMOKE, "--cell", ONE_NODE, "--cell", TWO_NODES, "--suites", "sanity",
                       state_dir=tmp_path / "state") for name in ("a", "b")]
    processes = [run.start() for run in runs]
    try:
        outputs = [process.communicate(timeout=180)[0] for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    ports = []
    for run, process, output in zip(runs, processes, outputs, strict=False):
        assert process.returncode == 0, output
        run.assert_nothing_left()
        results = run.results()
        assert [(c["id"], c["status"]) for c in results["cells"]] == [(ONE_NODE, "passed"), (TWO_NODES, "passed")]
        assert {line["run_id"] for line in run.ledger()} == {results["run_id"]}
        for cell_id in (ONE_NODE, TWO_NODES):
            logs = run.out / "logs" / cell_id
            served = _port((logs / "0.log").read_text().splitlines()[0], "--port")
            measured = _port((logs / "suites.log").read_text().splitlines()[0], "--base-url")
            assert measured == served  # its suites talked to its own rank 0
            ports.append(served)
    assert len(set(ports)) == len(ports)  # four servers, four ports
    assert runs[0].results()["run_id"] != runs[1].results()["run_id"]
    assert not {e["pid"] for e in runs[0].ledger()} & {e["pid"] for e in runs[1].ledger()}
