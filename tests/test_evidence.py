"""More evidence for undecided or failed cells (dspark_ci/evidence.py) and the exit-code rule for inconclusive runs."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace

import pytest
from dspark_ci.ground.errors import ExitCode
from dspark_ci.ground.measurements import Envelope, EnvelopePoint
from dspark_ci.ground.records import CellResult, GateResult, RunResults, Status
from dspark_ci.ground.sglang.settings import CellConfig
from dspark_ci.ground.stats import INCONCLUSIVE, PASSED, Verdict

from dspark_ci.evidence import FLAKY, Sampling, more_evidence
from dspark_ci.pipeline import verdict

CELL = CellResult(id="c", config=CellConfig(speculative_algorithm="DSPARK"), expect={"outcome": "serve"})


def _gate(verdict: str) -> GateResult:
    statistic = Verdict(verdict, 0.0, -0.01, 0.03, 0.025, "relative", "t", 0.001, 0.05, 1)
    return GateResult("tpot_ms_median", "<=", 7.0, 6.8, verdict == PASSED, statistic)


def _measured(tpot: float, status: Status = Status.INCONCLUSIVE, verdict: str = INCONCLUSIVE) -> CellResult:
    return CellResult(id="c", config=CELL.config, expect=CELL.expect, status=status,
                      metrics={"tpot_ms_median": tpot}, gates=(_gate(verdict),))


def test_an_inconclusive_cell_boots_again_at_each_look_and_its_boots_are_gated_together():
    calls, judged = [], []

    def measure(attempt, suites):
        calls.append((attempt, suites))
        return _measured(6.8 + attempt / 100)

    def judge(pooled, suites):  # decides once four boots are in
        judged.append(len(pooled.boots))
        decided = len(pooled.boots) >= 4
        return replace(pooled, status=Status.PASSED if decided else Status.INCONCLUSIVE,
                       gates=(_gate(PASSED if decided else INCONCLUSIVE),))

    result = more_evidence(_measured(6.8), ("speed", "gpqa"), Sampling(max_boots=8), measure, judge)
    assert [attempt for attempt, _ in calls] == [2, 3, 4] and judged == [2, 4]  # looks after 1, 2, 4 boots
    assert all(suites == ("speed",) for _, suites in calls)  # only the suite whose gate is undecided
    assert result.status is Status.PASSED and len(result.boots) == 4
    assert result.metrics["tpot_ms_median"] == pytest.approx((6.8 + 6.82 + 6.83 + 6.84) / 4)


def test_the_budget_ends_the_looks_and_the_cell_stays_inconclusive():
    result = more_evidence(_measured(6.8), ("speed",), Sampling(max_boots=2), lambda a, s: _measured(6.9),
                           lambda pooled, s: pooled)
    assert result.status is Status.INCONCLUSIVE and len(result.boots) == 2


def test_a_cell_that_fails_then_passes_stays_failed_and_is_labelled_flaky():
    crashed = CELL.finished(Status.ERROR, "node rank 0 exited with code 1")
    passing = _measured(6.8, Status.PASSED, PASSED)
    result = more_evidence(crashed, ("speed",), Sampling(retries=1), lambda a, s: passing, lambda pooled, s: pooled)
    assert result.status is Status.FAILED and result.labels == (FLAKY,) and result.exit_code == ExitCode.FELL_SHORT
    assert "flaky: attempt 1 error (node rank 0 exited with code 1), attempt 2 passed" in result.error


def test_a_cell_that_fails_every_attempt_is_failed_without_the_label():
    crashed = CELL.finished(Status.ERROR, "node rank 0 exited with code 1")
    result = more_evidence(crashed, ("speed",), Sampling(retries=2), lambda a, s: crashed, lambda pooled, s: pooled)
    assert result.status is Status.ERROR and result.labels == ()


def _run(*statuses: Status) -> RunResults:
    return RunResults("r", None, None, "local", (), cells=tuple(replace(CELL, id=f"c{i}", status=s, exit_code=None)
                                                               for i, s in enumerate(statuses)))


def test_an_inconclusive_run_exits_4_unless_accepted_and_never_hides_a_failure():
    assert verdict(_run(Status.PASSED, Status.INCONCLUSIVE), 2)[0] == ExitCode.INCONCLUSIVE == 4
    assert verdict(_run(Status.PASSED, Status.INCONCLUSIVE), 2, accept_inconclusive=True) == (ExitCode.OK, None)
    assert verdict(_run(Status.FAILED, Status.INCONCLUSIVE), 2, accept_inconclusive=True)[0] == ExitCode.FELL_SHORT
    assert verdict(_run(Status.PASSED), 1) == (ExitCode.OK, None)


@pytest.mark.slow
def test_a_cell_made_to_fail_once_shows_as_flaky_in_the_report_and_the_history(tmp_path):
    from tests.test_run_cli import ONE_NODE, REPO, SMOKE, Run

    history = tmp_path / "history.sqlite"
    run = Run(tmp_path, SMOKE, "--cell", ONE_NODE, "--suites", "accept", "--retries", "1",
              faults=f"crash_once={tmp_path / 'crashed-once'}")
    run.env["DSPARK_HISTORY"] = str(history)
    done = run()
    assert done.returncode == 1, done.stderr  # failed, then passed: still red
    cell = run.cell(ONE_NODE)
    assert (cell["status"], cell["labels"]) == ("failed", ["flaky"])
    assert re.search(r"attempt 2 (passed|inconclusive, then passed with \d+ boots pooled)", cell["error"])
    assert "❌ failed · ⚠️ flaky" in (run.out / "report.md").read_text()
    listed = subprocess.run([sys.executable, "-m", "dspark_ci", "history"], env=run.env, capture_output=True,
                            text=True, cwd=REPO)
    assert ONE_NODE in listed.stdout.splitlines()[-1]  # the run's flaky column names the cell


def test_a_retry_that_passes_only_with_the_boots_pooled_is_flaky_and_no_look_is_judged_twice():
    """Failed, the retry failed too and the pooled boots were inconclusive; the looks then passed: still a
    retry's evidence turned it green, so it is failed and flaky. The retries took the looks at 2 and 3 boots:
    the sequential looks never judge those boot counts again (no share of alpha spent twice)."""
    failed = _measured(7.5, Status.FAILED, "regressed")
    judged = []

    def judge(pooled, suites):  # red at 2 boots, undecided at 3, green from 4
        judged.append(len(pooled.boots))
        status = {2: Status.FAILED, 3: Status.INCONCLUSIVE}.get(len(pooled.boots), Status.PASSED)
        verdict = {Status.FAILED: "regressed", Status.INCONCLUSIVE: INCONCLUSIVE}.get(status, PASSED)
        return replace(pooled, status=status, gates=(_gate(verdict),))

    result = more_evidence(failed, ("speed",), Sampling(max_boots=8, retries=2),
                           lambda a, s: _measured(6.8, Status.FAILED, "regressed"), judge)
    assert judged == [2, 3, 4] and len(judged) == len(set(judged))
    assert result.status is Status.FAILED and result.labels == (FLAKY,)
    assert "then passed with 4 boots pooled" in result.error


def test_a_gate_more_boots_cannot_inform_is_not_measured_again():
    """GPQA on fixed answers (``Verdict.final``) undecided alone: no further boot is spent on it."""
    final = Verdict(INCONCLUSIVE, -0.05, -0.1, 0.05, -0.02, "absolute", "McNemar", 0.001, 0.02, 20, final=True)
    gpqa = GateResult("gpqa_accuracy", ">=", 0.8, 0.9, False, final)
    cell = replace(_measured(6.8, Status.INCONCLUSIVE, PASSED), gates=(_gate(PASSED), gpqa))
    calls = []
    result = more_evidence(cell, ("speed", "gpqa"), Sampling(max_boots=8), lambda a, s: calls.append(a) or cell,
                           lambda pooled, s: pooled)
    assert calls == [] and result.status is Status.INCONCLUSIVE


def test_a_later_boot_that_reran_only_acceptance_keeps_the_first_boots_sweep():
    """The second boot re-runs only the undecided suites: the speed suite's sweep of the first boot is still what
    the boundary gate tests (lost, the gate turned inconclusive with nothing to test, and a clean cell with it)."""
    sweep = Envelope((EnvelopePoint(8, 256, 40, 6.0, 18.0, 3.0, 0.05),), {}, dataset="random", method="sweep")
    first = replace(_measured(6.8), envelope=sweep)
    judged = []

    def judge(pooled, suites):
        judged.append(pooled.envelope)
        return replace(pooled, status=Status.PASSED)

    result = more_evidence(first, ("accept", "speed"), Sampling(max_boots=2), lambda a, s: _measured(6.9), judge)
    assert judged == [sweep] and result.envelope == sweep and len(result.boots) == 2
