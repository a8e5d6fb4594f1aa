"""Bisect: the culprit named by re-running, each step decided by the statistical verdict; infrastructure failures
never counted as bad; the end-to-end run on the simulator with a regression planted at one version."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
from pathlib import Path

import pytest
from dspark_ci.ground import stats

from dspark_ci.bisection import (
    BAD,
    FOUND,
    GOOD,
    NO_REGRESSION,
    NOT_SHOWN,
    SKIPPED,
    Chase,
    Sample,
    UnlikeMeasurements,
    bisect,
)
from tests.cli_under_test import DSPARK_CI

REPO = Path(__file__).resolve().parent.parent
CELL = "dsv4-flash-tp8-a2a-none-dspark-b7-cuda"
BUILDS = [f"0.7.{i}" for i in range(16)]
TPOT = Chase("tpot_ms_median", stats.LOWER)


def noisy(planted: int | None, seed: int, regression: float = 0.05, noise: float = 0.02, infra: dict | None = None):
    """TPOT +regression from build ``planted`` on, lognormal run-to-run noise; ``infra``: build -> runs lost."""
    rng, lost = random.Random(seed), dict(infra or {})

    def measure(ref: str) -> Sample:
        if lost.get(ref, 0) > 0:
            lost[ref] -= 1
            return Sample(None, infrastructure=True)
        worse = planted is not None and BUILDS.index(ref) >= planted
        return Sample(20.0 * (1 + regression * worse) * math.exp(rng.gauss(0, noise)), setup="s")
    return measure


@pytest.mark.parametrize("planted", [1, 7, 8, 15])
def test_names_the_planted_build_under_noise_and_confirms_it(planted):
    outcome = bisect(BUILDS, TPOT, noisy(planted, seed=planted))
    assert (outcome.outcome, outcome.culprit, outcome.parent) == (FOUND, BUILDS[planted], BUILDS[planted - 1])
    assert outcome.confirmed and outcome.confirmation.verdict == stats.REGRESSED
    assert len(outcome.steps) <= math.ceil(math.log2(len(BUILDS))) + 1
    assert outcome.confidence >= 0.9
    for step in outcome.steps:  # every step was decided by a verdict on its own runs, against the good pool
        assert step.verdict is not None and len(step.values) >= 3
        assert step.judged == (BAD if BUILDS.index(step.ref) >= planted else GOOD)


def test_infrastructure_failures_are_retried_and_a_build_that_never_runs_is_skipped_not_bad():
    outcome = bisect(BUILDS, TPOT, noisy(12, seed=1, infra={"0.7.7": 99, "0.7.8": 1}))
    skipped = [step for step in outcome.steps if step.judged == SKIPPED]
    assert [s.ref for s in skipped] == ["0.7.7"] and skipped[0].infra_failures == 3 and not skipped[0].values
    assert outcome.culprit == "0.7.12" and outcome.confirmed
    retried = next(step for step in outcome.steps if step.ref == "0.7.8")
    assert retried.infra_failures == 1 and retried.judged == GOOD  # one lost run, then measured


def test_no_regression_between_the_ends_names_no_culprit():
    outcome = bisect(BUILDS, TPOT, noisy(None, seed=3))
    assert outcome.outcome in (NO_REGRESSION, NOT_SHOWN) and outcome.culprit is None and outcome.confidence == 0
    assert "the ends" in outcome.why and outcome.ends[1].verdict.verdict != stats.REGRESSED


def test_a_failure_that_also_happens_at_the_good_end_is_not_bisected():
    def flaky(ref: str) -> Sample:
        flaky.n += 1
        return Sample(None, failed=flaky.n % 2 == 0)
    flaky.n = 0
    outcome = bisect(BUILDS, Chase(None), flaky)
    assert outcome.culprit is None and "the good end 0.7.0 fails too" in outcome.why


def test_runs_measured_differently_stop_the_bisect():
    def drifting(ref: str) -> Sample:
        return Sample(20.0, setup="a" if ref == BUILDS[0] else "b", where=f"runs/{ref}")
    with pytest.raises(UnlikeMeasurements, match="measured the cell differently"):
        bisect(BUILDS, TPOT, drifting)


def cli(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "DSPARK_STATE_DIR": str(tmp_path / "state"), "DSPARK_HISTORY": str(tmp_path / "h.sqlite"),
            **env}
    return subprocess.run([*DSPARK_CI, "bisect", "matrices/smoke.yaml", *args], capture_output=True, text=True,
                          env=full, cwd=REPO, timeout=900)


@pytest.mark.parametrize("args, message", [
    (["--cell", CELL, "--metric", "tpot_ms_median", "--builds", "0.5.30"], "--builds: 1 build(s)"),
    (["--cell", "dsv4-*", "--metric", "tpot_ms_median", "--good", "0.5.30", "--bad", "0.5.33"], "matches 3 cells"),
    (["--cell", CELL, "--metric", "gpqa_num_questions", "--builds", "0.5.30,0.5.31"], "not a metric with a better"),
    (["--cell", CELL, "--metric", "failure", "--builds", "abc123,def456"], "the simulator pretends PEP 440"),
    (["--cell", CELL, "--metric", "failure", "--builds", "abc,def", "--server", "sglang"], "real SGLang builds are"),
    (["--cell", CELL, "--metric", "failure", "--good", "0.5.30", "--bad", "0.6.2"], "not two patch versions"),
])
def test_bad_input_is_refused_before_anything_runs(tmp_path, args, message):
    done = cli(tmp_path, *args, "--out", str(tmp_path / "b"))
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "b").exists()


def test_end_to_end_on_the_simulator_a_crash_planted_at_one_version(tmp_path):
    out = tmp_path / "bisect"
    # A baseline without gates: the crash is chased, not the shipped speed gates a loaded machine can trip (a good
    # build's TPOT 0.7 % past its limit made 0.5.30 "bad" once, and the bisect rightly refused its endpoints). The
    # sanity check meets the crash at the first prefill as the speed suite did, in 6 s a run rather than 39.
    (tmp_path / "no-gates.yaml").write_text("schema: 1\ncells: {}\n")
    done = cli(tmp_path, "--cell", "dsv4-flash-tp8-a2a-*", "--metric", "failure", "--good", "0.5.30", "--bad",
               "0.5.33", "--suites", "sanity", "--baseline", str(tmp_path / "no-gates.yaml"), "--out", str(out),
               DSPARK_SIM_REGRESSION="0.5.32:crash_first_prefill")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "bisect.json").read_text())
    assert (report["culprit"], report["parent"], report["confirmed"]) == ("0.5.32", "0.5.31", True)
    assert [step["ref"] for step in report["steps"]] == ["0.5.31", "0.5.32"]
    assert "**Culprit: `0.5.32`** (parent `0.5.31`), confirmed" in done.stdout
    assert report["reproduce"].startswith("DSPARK_SIM_REGRESSION=0.5.32:crash_first_prefill dspark-ci bisect "
                                          "matrices/smoke.yaml --cell " + CELL + " --metric failure --builds 0.5.31,0.5.32")
    assert (out / "bisect.md").read_text() in done.stdout
    runs = sorted(p.name for p in (out / "runs").iterdir() if p.is_dir())
    assert len(runs) == report["runs"] and all((out / "runs" / r / "results.json").is_file() for r in runs)
