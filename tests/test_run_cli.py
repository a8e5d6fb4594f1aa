"""`dspark-ci run` end to end on the simulated server, as a user runs it: exit codes, results, logs, no orphans."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from dspark_ci.ground.suites import suite_of
from dspark_ci.matrices import load_cells

from tests.process_table import assert_no_process_with_env
from tests.suite_runs import outcomes
from tests.test_results_schema import assert_written_run_validates

REPO = Path(__file__).resolve().parent.parent
SMOKE = str(REPO / "matrices" / "smoke.yaml")
ONE_NODE = "dsv4-flash-tp8-a2a-none-dspark-b7-cuda"
TWO_NODES = "dsv4-flash-2node-tp16-a2a-none-dspark-b7-cuda"
REJECTED = "dsv4-flash-tp8-dp4-dpattn-a2a-none-dspark-b7-cuda"


class Run:
    """One `dspark-ci run` in a subprocess, tagged so its processes can be found in the process table."""

    def __init__(self, tmp_path: Path, *args: str, faults: str = ""):
        self.out = tmp_path / "run"
        self.tag = uuid.uuid4().hex
        self.env = {**os.environ, "CI": "true", "DSPARK_TEST_RUN": self.tag, "DSPARK_SIM_FAULTS": faults}
        self.argv = [sys.executable, "-m", "dspark_ci", "run", *args, "--out", str(self.out)]
        self.done: subprocess.CompletedProcess | None = None  # the last finished run

    def __call__(self, timeout: float = 240) -> subprocess.CompletedProcess:
        self.done = subprocess.run(self.argv, env=self.env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
        self.assert_nothing_left()
        return self.done

    def start(self) -> subprocess.Popen:
        return subprocess.Popen(self.argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, cwd=REPO)

    def results(self) -> dict:
        return json.loads((self.out / "results.json").read_text())

    def cell(self, cell_id: str) -> dict:
        return next(c for c in self.results()["cells"] if c["id"] == cell_id)

    def assert_nothing_left(self) -> None:
        assert_no_process_with_env("DSPARK_TEST_RUN", self.tag)


# baselines/smoke.yaml was recorded under the benchmark's noise (speed 3 %, acceptance 1.5-2.3 % run to run), and a
# statistical gate takes that noise for each live boot: an unfaulted run decides within several boots, and a test
# that caps its boots may honestly end "inconclusive" (exit 4) rather than guess. Whether a regression is caught is
# test_gates_cli's business; here only an undecided statistical verdict may stand between the run and green.
TIMING = {"tpot_ms_median", "output_throughput_tok_s"}
# Unfaulted runs whose verdict is not under test: a boot and its second look, no more
FEW_BOOTS = ("--max-boots", "2")


def test_smoke_matrix_runs_end_to_end(tmp_path):
    run = Run(tmp_path, SMOKE, *FEW_BOOTS)
    done = run()
    # The pipeline ran: every cell has its outcome, its files and logs, and measured what catches a broken server.
    statuses = {c["id"]: c["status"] for c in run.results()["cells"]}
    assert statuses.pop(ONE_NODE) in ("passed", "inconclusive"), done.stderr
    assert statuses.pop(TWO_NODES) in ("passed", "inconclusive"), done.stderr
    assert statuses == {REJECTED: "rejected_as_expected"}, done.stderr
    for name in ("results.json", "junit.xml", "report.md", "report.html"):
        assert (run.out / name).stat().st_size > 0
    assert (run.out / "logs" / TWO_NODES / "1.log").exists()
    assert "ready to roll" in (run.out / "logs" / ONE_NODE / "0.log").read_text()
    measured = run.cell(ONE_NODE)["metrics"]
    assert measured["accept_length"] > 2 and measured["output_throughput_tok_s"] > 0
    assert "accept_length" in {g["metric"] for g in run.cell(ONE_NODE)["gates"]}
    for cell_id in (ONE_NODE, TWO_NODES):  # a healthy server passes the sanity check beside its suites
        sanity = outcomes(run.cell(cell_id))
        assert sanity["test_streams_parse_text_is_text_usage_adds_up"] == "passed", cell_id
        assert sanity["test_drafts_are_accepted"] == "passed", cell_id
    undecided = assert_at_worst_undecided(run.cell(ONE_NODE), done, run.cell(TWO_NODES))
    assert f"{ONE_NODE}: {'INCONCLUSIVE' if undecided else 'PASSED'}" in done.stderr
    if done.returncode == 4:  # either cell undecided
        assert "a statistical gate could not decide (not a regression" in done.stderr
    assert_written_run_validates(run.out)  # against docs/results.schema.json


def assert_served_at_worst_undecided(cells: list[dict], serving: int = 2) -> None:
    """A smoke run's cells (results.json's) as a launcher test expects them: the rejected cell rejected as expected,
    each of the ``serving`` cells passed or undecided, and no gate of any regressed."""
    assert sorted(c["status"] for c in cells if c["expect"]["outcome"] == "reject") == ["rejected_as_expected"]
    served = [c for c in cells if c["expect"]["outcome"] == "serve"]
    assert len(served) == serving and all(c["status"] in ("passed", "inconclusive") for c in served), served
    assert [g for c in served for g in c["gates"] if g.get("verdict") == "regressed"
            or (not g["passed"] and "verdict" not in g)] == []  # a failed floor has no verdict


def assert_at_worst_undecided(cell: dict, done: subprocess.CompletedProcess, *others: dict) -> list[dict]:
    """No gate of an unfaulted cell (results.json's) regressed; one that did not pass is a statistical gate whose
    interval has not ruled out its detection line, and the run exits 4 for it (green, exit 0, only when every gate
    passed). ``others``: the run's other unfaulted cells, held to the same, whose undecided gates make the run exit 4
    as well. Returns ``cell``'s undecided gates."""
    assert {g["metric"] for g in cell["gates"]} >= TIMING
    undecided = _undecided_gates(cell)
    elsewhere = [gate for other in others for gate in _undecided_gates(other)]
    assert done.returncode == (4 if undecided or elsewhere else 0), done.stderr
    return undecided


def _undecided_gates(cell: dict) -> list[dict]:
    undecided = [g for g in cell["gates"] if not g["passed"]]
    assert all(g["verdict"] == "inconclusive" and g.get("interval") for g in undecided), undecided
    for gate in undecided:
        sign = 1 if gate["tolerance"] > 0 else -1  # worse-direction values positive
        assert max(sign * v for v in gate["interval"]) > sign * gate["detect"]
    return undecided


# Only the hung boot waits for its timeout, so only it gets a short one: a loaded machine (four test workers on two
# cores) boots the simulator's two nodes in more than 4 s, and the node loss must be what ends that cell.
@pytest.mark.parametrize(
    "faults, cell_id, boot, code, status, says",
    [
        ("accept_collapse", ONE_NODE, "60", 1, "failed", None),
        ("crash_first_prefill", ONE_NODE, "60", 1, "error", "AssertionError"),
        ("rank_exit=1:3", TWO_NODES, "60", 1, "error", "node rank 1 exited"),
        ("hang_boot", ONE_NODE, "4", 3, "error", "did not become healthy"),
    ],
    ids=["accept-collapse-fails-the-floor", "crash-on-first-prefill", "node-loss", "hung-boot-times-out"],
)
def test_faults_are_reported_for_what_they_are(tmp_path, faults, cell_id, boot, code, status, says):
    run = Run(tmp_path, SMOKE, "--cell", cell_id, "--boot-timeout", boot, faults=faults)
    done = run()
    assert done.returncode == code, done.stderr
    cell = run.cell(cell_id)
    assert cell["status"] == status
    if says:
        assert says in cell["error"]
    else:  # a collapse serves happily: the sanity check's floor says so, and the accept suite still measures it
        failed = [g["metric"] for g in cell["gates"] if not g["passed"]]
        # the prefill token is not verified: 1.0
        assert "accept_length" in failed and cell["metrics"]["accept_length"] == pytest.approx(1.0, abs=0.05)
        others = [t for t in cell["tests"] if "test_speed.py" in t["nodeid"] or "test_gpqa.py" in t["nodeid"]]
        assert others and all(t["outcome"] == "skipped" for t in others)  # the verdict does not wait for them
    assert cell["id"] in (run.out / "report.md").read_text()
    # One command to run exactly the failed cell again, on screen and in the report.
    rerun = f"dspark-ci run {SMOKE} --boot-timeout {boot} --cell {cell_id}"  # the options it was given, repeated
    assert rerun in done.stderr and rerun in (run.out / "report.md").read_text()


def test_expected_rejection_with_another_message_fails(tmp_path):
    run = Run(tmp_path, SMOKE, "--cell", REJECTED, faults="boot_reject=Some other reason.")
    done = run()
    assert done.returncode == 1
    cell = run.cell(REJECTED)
    assert cell["status"] == "failed"
    assert "Some other reason." in cell["error"]


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def wait_until(condition, what: str, process: subprocess.Popen, timeout: float = 300) -> None:
    """Poll an observable event (never a fixed sleep); the generous deadline only stops a hung test."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"no sign of {what} within {timeout:.0f} s"
        time.sleep(0.1)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 130)], ids=["ctrl-c", "sigterm"])
def test_interrupting_a_run_keeps_results_and_leaves_nothing(tmp_path, sig, code):
    run = Run(tmp_path, SMOKE, "--cell", ONE_NODE, "--cell", TWO_NODES, faults="slow_decode=20")
    served = tmp_path / "served.jsonl"  # the simulator writes a line per request it finished
    run.env["DSPARK_SIM_EMISSION_LOG"] = str(served)
    process = run.start()
    wait_until(lambda: (run.out / "logs" / ONE_NODE / "suites.log").exists(), "the suites to start", process)
    before = _lines(served)
    # In the middle of measuring: the suites have had a request answered since they started, and go on.
    wait_until(lambda: _lines(served) > before, "the suites' first answered request", process)
    process.send_signal(sig)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == code, output
    run.assert_nothing_left()
    results = run.results()
    assert results["interrupted"] is True and results["finished_at"] is None  # nothing claims it completed
    # Every selected cell has an outcome: the one interrupted, and the one never reached.
    assert [c["status"] for c in results["cells"]] == ["error", "error"]
    assert "interrupted" in results["cells"][0]["error"]
    assert "not run" in results["cells"][1]["error"] or "before this cell started" in results["cells"][1]["error"]
    report = (run.out / "report.md").read_text()
    assert "FAILED" in report and TWO_NODES in report
    # The rerun command covers both: the interrupted cell and the one never reached.
    assert f"--cell {ONE_NODE} --cell {TWO_NODES}" in report


@pytest.mark.parametrize(
    "args, says",
    [
        (["--cell", "no-such-cell"], "--cell no-such-cell: no such cell"),
        (["--suites", "gpqa,bogus"], "unknown suite bogus"),
        (["--baseline", "missing-baseline.yaml"], "missing-baseline.yaml"),
    ],
    ids=["unknown-cell", "unknown-suite", "missing-baseline"],
)
def test_bad_input_is_exit_2_with_one_message_and_launches_nothing(tmp_path, args, says):
    run = Run(tmp_path, SMOKE, *args)
    done = run()
    assert done.returncode == 2
    assert says in done.stderr and "Traceback" not in done.stderr
    assert not (run.out / "logs").exists()


def sglang_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("sglang") is not None


@pytest.mark.skipif(sglang_installed(), reason="SGLang is installed here: nothing to refuse")
def test_real_sglang_missing_fails_preflight_before_anything_starts(tmp_path):
    run = Run(tmp_path, SMOKE, "--server", "sglang")
    done = run()
    assert done.returncode == 3
    assert "SGLang is not installed" in done.stderr and "--server sim" in done.stderr
    assert not run.out.exists()


def test_parity_launches_a_reference_without_speculation(tmp_path):
    run = Run(tmp_path, SMOKE, "--cell", ONE_NODE, "--suites", "parity")
    done = run()
    assert done.returncode == 0, done.stderr
    cell = run.cell(ONE_NODE)
    assert cell["status"] == "passed" and cell["metrics"]["parity_mismatches"] == 0
    reference_argv = (run.out / "logs" / ONE_NODE / "reference" / "0.log").read_text().splitlines()[0]
    assert "--model-path" in reference_argv and "--speculative-algorithm" not in reference_argv
    # Gates on suites the user did not select (the baseline gates accept, speed and GPQA) are reported as not
    # applied, not failed.
    assert {suite_of(g["metric"]) for g in cell["gates"]} <= {"parity"}
    for suite, metric in (("gpqa", "gpqa_accuracy"), ("accept", "accept_length"), ("speed", "tpot_ms_median")):
        assert f"{suite} suite not run: gate on {metric} not applied" in cell["warnings"], cell["warnings"]


def test_expectations_written_for_another_release_are_skipped_not_failed(tmp_path):
    run = Run(tmp_path, SMOKE, "--cell", REJECTED, "--sglang-version", "0.1.0",
              faults="boot_reject=an older release's wording")
    done = run()
    # Skipped, not failed; but a run in which every cell was skipped measured nothing, and is never green.
    assert done.returncode == 1, done.stderr
    assert "nothing was measured: every cell was skipped" in done.stderr
    cell = run.cell(REJECTED)
    assert cell["status"] == "skipped"
    written_for = next(c.expect.sglang for c in load_cells([SMOKE]) if c.id == REJECTED)  # the matrix's spec
    assert f"written for SGLang {written_for}, testing 0.1.0" in cell["error"]
    assert not (run.out / "logs" / REJECTED).exists()  # nothing was launched for it


def test_a_relative_out_directory_is_where_the_suites_write(tmp_path):
    """`--out run` from the user's own directory: the suites (started from the repository) write there too."""
    # Where the files go is under test, not the gates: one boot, without the baseline's gates that may boot it again.
    (tmp_path / "no-gates.yaml").write_text("schema: 1\ncells: {}\n")
    run = Run(tmp_path, SMOKE, "--cell", ONE_NODE, "--suites", "accept", "--baseline", str(tmp_path / "no-gates.yaml"))
    run.argv[run.argv.index("--out") + 1] = "run"
    done = subprocess.run(run.argv, env=run.env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    run.assert_nothing_left()
    assert done.returncode == 0, done.stderr
    cell = run.cell(ONE_NODE)
    assert cell["status"] == "passed" and cell["metrics"]["accept_length"] > 1
    assert (run.out / "logs" / ONE_NODE / "suites.json").exists()
