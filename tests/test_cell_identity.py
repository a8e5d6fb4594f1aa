"""Cell identity: every result says how it was measured, and comparing unlike measurements is loud.

Runs go to temporary directories with their own state and history (never the user's)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from dspark_ci.ground.sglang.release import DEFAULT_VERSION

from tests.cli_under_test import DSPARK_CI

REPO = Path(__file__).resolve().parent.parent
CELL = "dsv4-flash-tp8-a2a-none-dspark-b7-cuda"


def cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*DSPARK_CI, *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)


@pytest.fixture
def env(tmp_path) -> dict:
    return {**os.environ, "DSPARK_STATE_DIR": str(tmp_path / "state"), "DSPARK_HISTORY": str(tmp_path / "h.sqlite")}


def run_cell(env: dict, out: Path, **sim: str) -> dict:
    # identity, not the verdict, is under test: the sanity check alone (a cell's identity names its server, argv,
    # env, model, suites, dataset and hardware whatever it measures), 6 s a run where the speed suite took 39 s
    done = cli({**env, **sim}, "run", "matrices/smoke.yaml", "--cell", CELL, "--suites", "sanity", "--out", str(out),
               "--quiet")
    cell = json.loads((out / "results.json").read_text())["cells"][0]
    assert done.returncode == 0 and cell["status"] == "passed", done.stderr[-2000:]
    return cell["identity"]


def test_identity_is_stable_across_launches_and_names_what_changed(env, tmp_path):
    first, again = run_cell(env, tmp_path / "a"), run_cell(env, tmp_path / "b")
    # free ports differ, the identity not
    assert first["hash"] == again["hash"] and first["build"] == f"sim {DEFAULT_VERSION}"
    reseeded = run_cell(env, tmp_path / "c", DSPARK_SIM_SEED="5")
    assert reseeded["setup"] != first["setup"]
    assert [part for part in first["parts"] if first["parts"][part] != reseeded["parts"][part]] == ["env"]

    same = cli(env, "report", str(tmp_path / "b"), "--compare", str(tmp_path / "a"))
    assert "NOT COMPARABLE" not in same.stdout + same.stderr and "Identity: same setup, same build" in same.stdout
    unlike = cli(env, "report", str(tmp_path / "c"), "--compare", str(tmp_path / "a"))
    assert f"WARNING: {CELL}: not comparable, measured differently: env" in unlike.stderr
    assert "NOT COMPARABLE: measured differently: env" in unlike.stdout


def results_file(directory: Path, run_id: str, identity: dict | None) -> Path:
    directory.mkdir(parents=True)
    cell = {"id": CELL, "status": "passed", "config": {"model": "m"}, "expect": {"outcome": "serve"},
            "metrics": {"tpot_ms_median": 6.9, "accept_length": 3.2}, "gates": []}
    if identity:
        cell["identity"] = identity
    (directory / "results.json").write_text(json.dumps({
        "schema": 1, "run_id": run_id, "started_at": "2026-11-30T10:00:00+00:00", "finished_at": "2026-11-30T10:05:00+00:00",
        "launcher": "local", "matrices": ["matrices/smoke.yaml"], "cells": [cell]}))
    return directory


PARTS = {"server": "s", "argv": "a", "env": "e", "model": "m", "suites": "u", "dataset": "d", "hardware": "h"}


def test_a_file_from_before_identities_still_reads_and_the_comparison_says_it_cannot_tell(env, tmp_path):
    old = results_file(tmp_path / "old", "old", None)
    new = results_file(tmp_path / "new", "new", {"build": "sim 1.0.0", "parts": PARTS})
    done = cli(env, "report", str(new), "--compare", str(old))
    assert done.returncode == 0, done.stderr
    assert "Identity: unknown (a run predates cell identities)" in done.stdout


def test_baseline_record_refuses_runs_of_another_setup_or_build(env, tmp_path):
    a = results_file(tmp_path / "a", "a", {"build": "sim 1.0.0", "parts": PARTS})
    b = results_file(tmp_path / "b", "b", {"build": "sim 1.0.0", "parts": {**PARTS, "dataset": "other"}})
    c = results_file(tmp_path / "c", "c", {"build": "sim 1.0.1", "parts": PARTS})
    same = cli(env, "baseline", "record", str(a), str(a))
    assert same.returncode == 0, same.stderr
    for other, why in ((b, "measured differently: dataset"), (c, "build sim 1.0.0 vs sim 1.0.1")):
        done = cli(env, "baseline", "record", str(a), str(other))
        assert done.returncode == 2, done.stderr
        assert f"{other}: {CELL} was not measured as in the other runs ({why})" in done.stderr
