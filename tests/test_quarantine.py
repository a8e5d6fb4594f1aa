"""The quarantine file: a quarantined cell that fails leaves the run green and is shown as quarantined; once its
entry has expired, the same run is red and says why. Bad entries are exit 2 with file:line, nothing launched."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.cli import DSPARK_CI

REPO = Path(__file__).resolve().parent.parent
CELL = "dsv4-flash-tp8-a2a-none-dspark-b7-cuda"


def run(tmp_path: Path, quarantine: str, out: str) -> subprocess.CompletedProcess:
    (tmp_path / "q.yaml").write_text(quarantine)
    env = {**os.environ, "DSPARK_STATE_DIR": str(tmp_path / "state"), "DSPARK_HISTORY": str(tmp_path / "h.sqlite"),
           "DSPARK_SIM_FAULTS": "accept_collapse"}  # the accept-length floor fails this cell
    return subprocess.run([*DSPARK_CI, "run", "matrices/smoke.yaml", "--cell", CELL, "--suites", "accept",
                           "--quarantine", str(tmp_path / "q.yaml"), "--out", str(tmp_path / out)],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)


def entry(expires: dt.date) -> str:
    return (f'quarantine:\n  - cell: "dsv4-flash-tp8-*"\n    reason: accept collapse under investigation\n'
            f"    link: https://github.com/sgl-project/sglang/issues/1\n    expires: {expires.isoformat()}\n")


def test_a_quarantined_failing_cell_leaves_the_run_green_until_its_entry_expires(tmp_path):
    today = dt.date.today()
    held = run(tmp_path, entry(today), "held")
    assert held.returncode == 0, held.stdout + held.stderr
    (cell,) = json.loads((tmp_path / "held" / "results.json").read_text())["cells"]
    assert cell["status"] == "failed" and cell["labels"] == ["quarantined"]  # still measured and reported as it is
    assert any(gate["metric"] == "accept_length" and not gate["passed"] for gate in cell["gates"])
    report = (tmp_path / "held" / "report.md").read_text()
    assert "✅ **PASSED**" in report and "❌ failed · 🔒 quarantined (not gating)" in report
    assert f"quarantined until {today}" in report and "issues/1" in report
    assert "quarantined: not gating" in held.stderr

    expired = run(tmp_path, entry(today - dt.timedelta(days=1)), "expired")
    assert expired.returncode == 1, expired.stdout + expired.stderr
    report = (tmp_path / "expired" / "report.md").read_text()
    assert "❌ **FAILED**" in report and "quarantine expired: gates again" in report
    assert f"quarantine expired on {today - dt.timedelta(days=1)}" in report


@pytest.mark.parametrize("text, line, problem", [
    ("quarantine:\n  - cell: a\n    reason: r\n    expires: 2030-01-01\n", 2, "the entry has no link"),
    ("quarantine:\n  - cell: a\n    reason: r\n    link: https://x/1\n    expires: soon\n", 5, "is not a date"),
    ("quarantine:\n  - cell: a\n    reason: r\n    link: x\n    expires: 2030-01-01\n", 4, "is not a URL"),
    ("quarantine:\n  - cell: a\n    why: r\n    reason: r\n    link: https://x\n    expires: 2030-01-01\n", 3,
     "unknown key 'why'"),
    ("skip:\n  - a\n", 1, "expected one key"),
])
def test_a_bad_entry_is_exit_2_with_its_line_before_anything_is_launched(tmp_path, text, line, problem):
    done = run(tmp_path, text, "bad")
    assert done.returncode == 2, done.stderr
    assert f"{tmp_path / 'q.yaml'}:{line}: " in done.stderr and problem in done.stderr
    assert not (tmp_path / "bad").exists()
