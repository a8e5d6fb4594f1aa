"""Change points over the run history: a shift no nightly gate fails is named at the run where it started.

Every history here is a temporary file (DSPARK_HISTORY), never the user's."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
from dspark_ci.reports.change_points import change_points
from dspark_ci.reports.history_db import Point
from dspark_ci.reports.plots import _trend_figure

from tests.cli_under_test import DSPARK_CI

REPO = Path(__file__).resolve().parent.parent
CELL = "dsv4-flash-tp8-a2a-none-dspark-b7-cuda"
BASE_TPOT, NOISE = 20.0, 0.005  # ms; run-to-run noise as a fraction (the simulator's median TPOT over 64 requests)


def nightly(levels, seed: int) -> list[float]:
    noise = np.random.default_rng(seed).standard_normal(len(levels))
    return [float(v) for v in BASE_TPOT * (1 + np.asarray(levels)) * (1 + NOISE * noise)]


def step_at_night_11(seed: int) -> list[float]:
    return nightly(np.r_[np.zeros(10), np.full(10, 0.03)], seed)  # +3 % from night 11 on, for 10 nights


def points(values, setups=None) -> list[Point]:
    return [Point(f"night-{i + 1}", f"2026-11-{i + 1:02d}T03:00:00+00:00", v, (setups or {}).get(i))
            for i, v in enumerate(values)]


def test_a_three_percent_shift_is_found_at_its_night_and_noise_alone_rarely_is():
    found = [change_points("tpot_ms_median", points(step_at_night_11(seed))) for seed in range(50)]
    right = sum(len(c) == 1 and c[0].run_id == "night-11" and c[0].worse for c in found)
    assert right >= 45, right
    quiet = sum(bool(change_points("tpot_ms_median", points(nightly(np.zeros(20), 1000 + s)))) for s in range(50))
    assert quiet <= 3, quiet


def test_a_gradual_drift_is_one_change_from_near_its_first_night_to_its_last():
    ramp = np.r_[np.zeros(10), np.linspace(0.003, 0.03, 10), np.full(10, 0.03)]  # nights 11..20 drift up 3 %
    starts = []
    for seed in range(20):
        (change,) = change_points("tpot_ms_median", points(nightly(ramp, seed)))
        start, end = (int(run.split("-")[1]) for run in (change.run_id, change.last_run_id))
        assert change.worse and abs(change.relative - 0.03) < 0.01 and start <= 20 and end >= 11
        starts.append(start)
    # a 0.3 %-a-night ramp under 0.5 % noise: its first night is known to a few nights either way, centred right
    assert sorted(starts)[10] in (10, 11, 12) and sum(abs(start - 11) <= 2 for start in starts) >= 10, starts


def write_night(directory: Path, night: int, tpot: float, setup: str = "s1") -> Path:
    directory.mkdir(parents=True)
    gate = {"metric": "tpot_ms_median", "op": "<=", "threshold": BASE_TPOT * 1.05, "value": tpot,
            "passed": tpot <= BASE_TPOT * 1.05}
    identity = {"build": f"sim 0.5.{23 + night}", "parts": {"argv": setup}}
    (directory / "results.json").write_text(json.dumps({
        "schema": 1, "run_id": f"night-{night}", "started_at": f"2026-11-{night:02d}T03:00:00+00:00",
        "finished_at": f"2026-11-{night:02d}T03:30:00+00:00", "launcher": "local", "matrices": ["m.yaml"],
        "cells": [{"id": CELL, "status": "passed" if gate["passed"] else "failed", "config": {"model": "m"},
                   "expect": {"outcome": "serve"}, "metrics": {"tpot_ms_median": tpot}, "gates": [gate],
                   "identity": identity}]}))
    return directory


def history(tmp_path, values, setups=None) -> tuple[dict, list[subprocess.CompletedProcess]]:
    env = {**os.environ, "DSPARK_HISTORY": str(tmp_path / "history.sqlite"), "DSPARK_STATE_DIR": str(tmp_path)}
    dirs = [write_night(tmp_path / f"n{i + 1}", i + 1, v, (setups or {}).get(i, "s1")) for i, v in enumerate(values)]
    added = subprocess.run([*DSPARK_CI, "history", "--add", *map(str, dirs)], capture_output=True, text=True, env=env,
                           cwd=REPO, timeout=120)
    assert added.returncode == 0, added.stderr
    shown = [subprocess.run([*DSPARK_CI, "history", "--cell", CELL, "--metric", "tpot_ms_median", *fmt],
                            capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
             for fmt in ([], ["--format", "json"])]
    return env, shown


def test_history_names_the_night_a_shift_no_gate_failed_started(tmp_path):
    values = step_at_night_11(seed=0)
    assert max(values) < BASE_TPOT * 1.05  # every nightly gate passed
    _, (table, as_json) = history(tmp_path, values)
    assert table.returncode == 0, table.stderr
    assert re.search(r"change point: tpot_ms_median: \+(2\.[5-9]|3\.[0-5])% \(worse\) from run night-11 \(step\)",
                     table.stdout), table.stdout
    assert "regressed" not in table.stdout  # no gate ever failed
    (change,) = json.loads(as_json.stdout)[CELL]["change_points"]
    assert (change["run_id"], change["kind"], change["worse"]) == ("night-11", "step", True)


def test_history_compares_only_runs_measured_the_same_way(tmp_path):
    values = [v * (1.10 if i < 8 else 1.0) for i, v in enumerate(nightly(np.zeros(20), seed=3))]
    _, (table, as_json) = history(tmp_path, values, setups={i: "old-argv" for i in range(8)})
    assert "measured differently up to run night-8" in table.stdout
    assert json.loads(as_json.stdout)[CELL]["change_points"] == []  # the setup change is not a level change


def test_the_trend_plot_marks_where_the_change_started():
    figure = _trend_figure(CELL, ["tpot_ms_median"], {"tpot_ms_median": points(step_at_night_11(seed=0))})
    texts = [text.get_text() for text in figure.axes[0].texts]
    assert any(re.fullmatch(r"change from night-11 \+(2\.[5-9]|3\.[0-5])%", text) for text in texts), texts
