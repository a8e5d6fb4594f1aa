"""The run history through the CLI: runs recorded, listed, trended; a regression names its last good and first
bad run in report.md; report.html carries trend plots; `report --compare RUN_ID` finds a remembered run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cli_under_test import DSPARK_CI

REPO = Path(__file__).resolve().parent.parent
CELL = "dsv4-flash-tp8-a2a-none-dspark-b7-cuda"


def write_run(directory: Path, run_id: str, minute: int, tpot: float, passed: bool) -> Path:
    directory.mkdir(parents=True)
    gate = {"metric": "tpot_ms_median", "op": "<=", "threshold": 7.0, "value": tpot, "passed": passed}
    (directory / "results.json").write_text(json.dumps({
        "schema": 1, "run_id": run_id, "started_at": f"2026-11-30T10:{minute:02d}:00+00:00",
        "finished_at": f"2026-11-30T10:{minute:02d}:30+00:00", "launcher": "local", "matrices": ["matrices/smoke.yaml"],
        "environment": {"server": "sim", "sglang_version": "1.0.0", "hostname": "ci-1"},
        "cells": [{"id": CELL, "status": "passed" if passed else "failed", "config": {"model": "m"},
                   "expect": {"outcome": "serve"}, "error": None if passed else "gate failed",
                   "metrics": {"tpot_ms_median": tpot, "accept_length": 3.2, "output_throughput_tok_s": 530.0},
                   "gates": [gate]}]}))
    return directory


def cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*DSPARK_CI, *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)


@pytest.fixture
def remembered(tmp_path) -> tuple[dict, list[Path]]:
    env = {**os.environ, "DSPARK_HISTORY": str(tmp_path / "history.sqlite")}
    runs = [write_run(tmp_path / "a", "run-a", 1, 6.8, True), write_run(tmp_path / "b", "run-b", 2, 6.9, True),
            write_run(tmp_path / "c", "run-c", 3, 7.5, False), write_run(tmp_path / "d", "run-d", 4, 7.6, False)]
    done = cli(env, "history", "--add", *(str(r) for r in runs))
    assert done.returncode == 0, done.stderr
    return env, runs


def test_history_lists_runs_newest_first(remembered):
    env, runs = remembered
    done = cli(env, "history")
    assert done.returncode == 0, done.stderr
    listed = [line.split()[0] for line in done.stdout.splitlines()[2:]]
    assert listed == ["run-d", "run-c", "run-b", "run-a"]
    assert "sim" in done.stdout and "1.0.0" in done.stdout and str(runs[0]) in done.stdout


def test_history_trend_names_the_last_good_and_first_bad_run(remembered):
    env, _ = remembered
    done = cli(env, "history", "--cell", "dsv4-*", "--metric", "tpot_ms_median")
    assert done.returncode == 0, done.stderr
    assert re.search(r"run-a\s+6\.80\n.*run-b\s+6\.90\n.*run-c\s+7\.50\n.*run-d\s+7\.60", done.stdout, re.S)
    assert "tpot_ms_median regressed: last good run run-b, first bad run run-c" in done.stdout


def test_report_names_the_regression_and_plots_trends(remembered):
    env, runs = remembered
    done = cli(env, "report", str(runs[3]))
    assert done.returncode == 1
    assert "tpot_ms_median = 7.60, needs <= 7.00 (last good run `run-b`, first bad run `run-c`)" in done.stdout
    page = (runs[3] / "report.html").read_text()
    assert f'alt="Trend: {CELL}"' in page


def test_compare_finds_a_remembered_run_by_id(remembered):
    env, runs = remembered
    done = cli(env, "report", str(runs[3]), "--compare", "run-a", "--format", "json")
    assert json.loads(done.stdout)["old_run"] == "run-a"
    done = cli(env, "report", str(runs[3]), "--compare", "run-zzz")
    assert done.returncode == 2
    assert "--compare run-zzz: no such directory, and the run history does not know that run id" in done.stderr


def test_no_history_yet_is_one_message(tmp_path):
    done = cli({**os.environ, "DSPARK_HISTORY": str(tmp_path / "none.sqlite")}, "history")
    assert done.returncode == 2
    assert done.stderr.startswith(f"dspark-ci history: {tmp_path / 'none.sqlite'}: no run history here yet")


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)")
def test_report_html_opens_in_headless_chromium_without_console_errors(remembered, tmp_path):
    """The page as a browser shows it: no console message (the page has no script, so any is an error), and a
    screenshot kept (in $DSPARK_TEST_ARTIFACTS when set) showing the charts and the trend plots."""
    env, runs = remembered
    cli(env, "report", str(runs[3]))
    page = runs[3] / "report.html"
    shot = tmp_path / "report-html.png"
    done = subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--enable-logging=stderr", "--v=0", "--window-size=1200,3000", f"--screenshot={shot}",
                           page.as_uri()], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, console
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 50_000  # a page with charts, not blank
    if os.environ.get("DSPARK_TEST_ARTIFACTS"):
        kept = Path(os.environ["DSPARK_TEST_ARTIFACTS"])
        kept.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, kept / shot.name)
