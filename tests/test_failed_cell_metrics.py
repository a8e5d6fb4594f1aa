"""A cell that fails after its suites finished keeps what they measured: results.json and results.jsonl hold the
metrics, labelled ``metrics_from_failed_cell`` and without gates (CONTRACT.md), and the cell is red."""

from __future__ import annotations

import sys

from tests.test_run_cli import ONE_NODE, SMOKE
from tests.test_verdicts import VerdictRun

# `dspark-ci run` as the CLI runs it, with rank 0 killed (SIGKILL) the moment the suites have finished: the run's
# own check after measuring finds it dead, as when a rank dies before the cell's teardown.
DRIVER = """
import json, os, signal, sys
from unittest import mock
import dspark_ci.cell_run as cell_run
from dspark_ci.launchers.contract import LaunchFailed
from dspark_ci.cli import main

argv = sys.argv[1:]
out = argv[argv.index("--out") + 1]
measure = cell_run.run_suites

def then_rank_0_dies(request, watched, watch):
    outcome = measure(request, watched, watch)
    ledger = [json.loads(line) for line in open(os.path.join(out, "launched.jsonl"))]
    os.kill(next(e["pid"] for e in ledger if e.get("rank") == 0 and e.get("what") != "suites"), signal.SIGKILL)
    while True:  # until the run itself sees the rank dead
        try:
            watched[0].check()
        except LaunchFailed:
            return outcome

with mock.patch.object(cell_run, "run_suites", then_rank_0_dies):
    sys.exit(main(argv))
"""


def test_a_cell_that_fails_after_measuring_keeps_its_metrics_marked_and_not_gated(tmp_path):
    run = VerdictRun(tmp_path, SMOKE, "--cell", ONE_NODE, "--suites", "gpqa")
    run.argv = [sys.executable, "-c", DRIVER, *run.argv[3:]]
    done = run()
    assert done.returncode == 1, done.stderr
    cell = run.cell(ONE_NODE)
    assert cell["status"] == "error" and "node rank 0" in cell["error"]
    assert isinstance(cell["metrics"].get("gpqa_accuracy"), float), cell
    assert "metrics_from_failed_cell" in cell["labels"] and not cell["gates"]
    line = run.lines()[0]
    assert line["metrics"]["gpqa_accuracy"] == cell["metrics"]["gpqa_accuracy"]
    assert "metrics_from_failed_cell" in line["labels"]
    run.assert_nothing_left()
