"""A regression planted at a version: the simulator behaves worse from that version on, and not before."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from dspark_ci.sglang_sim.sim_config import SimConfig, SimConfigError

from tests.cli_under_test import DSPARK_CI

REPO = Path(__file__).resolve().parent.parent
CELL = "dsv4-flash-tp8-a2a-none-dspark-b7-cuda"


@pytest.mark.parametrize("version, slow, accept", [("0.5.29", 1.0, 0.7), ("0.5.30", 1.05, 0.4), ("0.6.0", 1.05, 0.4),
                                                   ("", 1.0, 0.7)])
def test_effects_apply_at_and_after_the_version(version, slow, accept):
    config = SimConfig.from_env({"DSPARK_SIM_VERSION": version,
                                 "DSPARK_SIM_REGRESSION": "0.5.30:slow_decode=1.05,accept_prob=0.4"})
    assert (config.faults.slow_decode, config.accept_prob) == (slow, accept)


@pytest.mark.parametrize("text", ["0.5.30", "0.5.30:", "banana:slow_decode=2", "0.5.30:accept_prob=2", "0.5.30:melt"])
def test_a_bad_regression_is_refused(text):
    with pytest.raises(SimConfigError, match="DSPARK_SIM_REGRESSION"):
        SimConfig.from_env({"DSPARK_SIM_REGRESSION": text})


def test_the_version_under_test_crashes_from_the_planted_version_on(tmp_path):
    env = {**os.environ, "DSPARK_STATE_DIR": str(tmp_path / "state"), "DSPARK_HISTORY": str(tmp_path / "h.sqlite"),
           "DSPARK_SIM_REGRESSION": "0.5.30:crash_first_prefill"}

    def run(version: str) -> tuple[int, dict]:  # the sanity check's first request is the first prefill
        out = tmp_path / version
        done = subprocess.run([*DSPARK_CI, "run", "matrices/smoke.yaml", "--cell", CELL, "--suites", "sanity",
                               "--sglang-version", version, "--out", str(out), "-q"],
                              capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
        return done.returncode, json.loads((out / "results.json").read_text())["cells"][0]

    code, before = run("0.5.29")
    assert code == 0 and before["identity"]["build"] == "sim 0.5.29"
    code, after = run("0.5.30")
    assert code == 1 and after["status"] == "error" and "AssertionError" in (after.get("sglang_error") or "")
    assert after["identity"]["setup"] == before["identity"]["setup"]  # same setup, another build
