"""Tests keep their own state (tests/conftest.py): a run started by a test is recorded in the session's run
history and index, never in the user's; and a run that finished and removed what it started leaves no index entry."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

from tests.conftest import USER_HISTORY, USER_STATE_DIR
from tests.test_run_cli import REJECTED, SMOKE, Run


def _history_runs(path: Path) -> set[str]:
    if not path.is_file():
        return set()
    with sqlite3.connect(path) as db:
        return {row[0] for row in db.execute("SELECT run_id FROM runs")}


def _indexed(state: Path) -> set[str]:
    return {path.stem for path in (state / "runs").glob("*.json")}


def test_a_run_started_by_a_test_leaves_the_users_history_and_index_alone(tmp_path):
    session_state = Path(os.environ["DSPARK_STATE_DIR"])
    assert session_state != USER_STATE_DIR and Path(os.environ["DSPARK_HISTORY"]) != USER_HISTORY
    run = Run(tmp_path, SMOKE, "--cell", REJECTED)  # the environment every test's subprocess inherits
    done = run()
    assert done.returncode == 0, done.stderr
    run_id = run.results()["run_id"]
    assert run_id in _history_runs(Path(os.environ["DSPARK_HISTORY"]))  # recorded: in the session's history
    assert run_id not in _history_runs(USER_HISTORY)
    assert run_id not in _indexed(USER_STATE_DIR)
    ledger = [json.loads(line) for line in (run.out / "launched.jsonl").read_text().splitlines()]
    assert ledger, "the run recorded what it started"
    # It finished and tore down all it started: its index entry is pruned, in the session's index too.
    assert run_id not in _indexed(session_state)
