"""`dspark-ci report` of a run that never finished (killed after its last cell) exits non-zero, as `run` would have,
and shows the outcomes results.jsonl records rather than "no outcome yet"."""

from __future__ import annotations

import json
import subprocess

from dspark_ci.ground.errors import ExitCode
from dspark_ci.ground.records import RunResults, Status
from dspark_ci.matrices import load_cells
from dspark_ci.reports.live_results import RESULTS_LINES, ResultsWriter

from dspark_ci.cell_run import pending_result
from tests.cli_under_test import DSPARK_CI
from tests.test_run_cli import REJECTED, REPO, SMOKE


def killed_after_its_last_cell(run_dir):
    """What a run killed (SIGKILL) right after recording its only cell leaves: the line, and a results.json
    written before it (the whole files are rewritten at most every few seconds)."""
    cell = pending_result(next(c for c in load_cells([SMOKE]) if c.id == REJECTED))
    writer = ResultsWriter(run_dir, RunResults(run_id="killed-run", started_at="2026-01-01T00:00:00+00:00",
                                               finished_at=None, launcher="local", matrices=(SMOKE,)),
                           selected=(cell,))
    with open(run_dir / RESULTS_LINES, "a") as lines:
        lines.write(json.dumps(cell.finished(Status.REJECTED_AS_EXPECTED, None, ExitCode.OK).to_dict()) + "\n")
    return writer


def test_report_of_a_run_that_never_finished_exits_1_and_reads_results_jsonl(tmp_path):
    run_dir = tmp_path / "run"
    killed_after_its_last_cell(run_dir)
    assert "no outcome yet" in (run_dir / "results.json").read_text()
    done = subprocess.run([*DSPARK_CI, "report", str(run_dir)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 1, done.stderr
    assert "did not finish" in done.stderr
    assert "no outcome yet" not in done.stdout and "rejected" in done.stdout.lower()
    shown = subprocess.run([*DSPARK_CI, "report", str(run_dir), "--format", "json"], capture_output=True, text=True,
                           timeout=120, cwd=REPO)
    assert shown.returncode == 1
    assert json.loads(shown.stdout)["cells"][0]["status"] == "rejected_as_expected"
