"""The quarantine file: a quarantined cell that fails leaves the run green and is shown as quarantined; once its
entry has expired, the same run is red and says why. Bad entries are exit 2 with file:line, nothing launched."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from dspark_ci.ground.errors import ExitCode

from tests.cli_under_test import DSPARK_CI

REPO = Path(__file__).resolve().parent.parent
CELL = "dsv4-flash-tp8-a2a-none-dspark-b7-cuda"


def run(tmp_path: Path, quarantine: str, out: str) -> subprocess.CompletedProcess:
    (tmp_path / "q.yaml").write_text(quarantine)
    env = {**os.environ, "DSPARK_STATE_DIR": str(tmp_path / "state"), "DSPARK_HISTORY": str(tmp_path / "h.sqlite"),
           "DSPARK_SIM_FAULTS": "accept_collapse",  # the accept-length floor fails this cell
           "GITHUB_STEP_SUMMARY": str(tmp_path / f"{out}-summary.md")}
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
    # junit.xml: the failure is still there to read, as a quarantined skip, not a failure; the ticket and expiry
    # are on the testsuite
    junit = ET.parse(tmp_path / "held" / "junit.xml").getroot()
    assert junit.get("failures") == "0" and junit.get("errors") == "0"
    (accept,) = [case for case in junit.iter("testcase") if case.get("name") == "accept"]
    skipped = accept.find("skipped")
    assert accept.find("failure") is None and skipped.get("type") == "quarantined"
    assert f"quarantined until {today}" in skipped.get("message") and "issues/1" in skipped.get("message")
    assert "accept_length = 1.0" in skipped.get("message") and "needs >= 1.20" in skipped.text
    properties = {p.get("name"): p.get("value") for p in junit.iter("property")}
    assert properties["quarantine.link"] == "https://github.com/sgl-project/sglang/issues/1"
    assert properties["quarantine.expires"] == today.isoformat()
    assert properties["quarantine.state"] == "held: not gating"
    # the step summary: green, the failure not among the failed gates but under Quarantined, with ticket and expiry
    summary = (tmp_path / "held-summary.md").read_text()
    assert "✅ **PASSED**" in summary and "(1 of them quarantined: not gating)" in summary
    assert "Failed gates" not in summary
    quarantined = summary.split("## 🔒 Quarantined (ran and reported, not gating)")[1]
    assert f"quarantined until {today}" in quarantined and "issues/1" in quarantined
    assert "accept_length = 1.0" in quarantined

    expired = run(tmp_path, entry(today - dt.timedelta(days=1)), "expired")
    assert expired.returncode == 1, expired.stdout + expired.stderr
    report = (tmp_path / "expired" / "report.md").read_text()
    assert "❌ **FAILED**" in report and "quarantine expired: gates again" in report
    assert f"quarantine expired on {today - dt.timedelta(days=1)}" in report
    junit = ET.parse(tmp_path / "expired" / "junit.xml").getroot()
    assert junit.get("failures") != "0"  # gates again: a plain failure, saying why the quarantine no longer holds
    failure = next(case.find("failure") for case in junit.iter("testcase") if case.get("name") == "accept")
    assert failure.get("message").startswith(f"quarantine expired on {today - dt.timedelta(days=1)}")
    assert "gates again" in failure.get("message")
    summary = (tmp_path / "expired-summary.md").read_text()
    assert "## ❌ Failed gates" in summary and "## ⏰ Quarantine expired (these cells gate again)" in summary
    assert "🔒 Quarantined" not in summary


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


def quarantined_run(tmp_path: Path, today: dt.date) -> Path:
    """A run directory as `run` leaves it: one quarantined cell that never came up (a launch timeout), one
    quarantined cell that passed, one that stayed inconclusive, one cell whose entry expired yesterday and that
    passed."""
    from dspark_ci.ground.records import CellResult, Expect, RunResults, Status
    from dspark_ci.matrices.quarantine import Quarantine, QuarantineEntry, apply
    from dspark_ci.reports.results import write_results

    quarantine = Quarantine((
        QuarantineEntry("boots-*", "NCCL hang on boot", "https://github.com/sgl-project/sglang/issues/7",
                        today, "q.yaml:2"),
        QuarantineEntry("old-*", "fixed since", "https://github.com/sgl-project/sglang/issues/8",
                        today - dt.timedelta(days=1), "q.yaml:6")))
    cells = [CellResult("boots-tp8", None, Expect(), status=Status.ERROR, exit_code=ExitCode.INFRA,
                        error="launch timeout: rank 0 not healthy after 600 s"),
             CellResult("boots-tp4", None, Expect(), status=Status.PASSED),
             CellResult("boots-tp2", None, Expect(), status=Status.INCONCLUSIVE),
             CellResult("old-tp2", None, Expect(), status=Status.PASSED)]
    results = RunResults("r1", "2026-01-01T00:00:00+00:00", "2026-01-01T00:01:00+00:00", "local", ("m.yaml",),
                         tuple(apply(quarantine, cell, today) for cell in cells))
    (tmp_path / "run").mkdir()
    write_results(tmp_path / "run" / "results.json", results)
    return tmp_path / "run"


def report(run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*DSPARK_CI, "report", str(run_dir)], capture_output=True, text=True, cwd=REPO,
                          timeout=120, env={**os.environ, "DSPARK_HISTORY": str(run_dir.parent / "h.sqlite"),
                                            "DSPARK_STATE_DIR": str(run_dir.parent / "state")})


def test_a_quarantined_error_is_shown_with_its_ticket_but_counts_as_no_error_and_reads_back(tmp_path):
    today = dt.date.today()
    run_dir = quarantined_run(tmp_path, today)
    from dspark_ci.reports.results import load_results

    from dspark_ci.pipeline import verdict

    results = load_results(run_dir / "results.json")
    assert verdict(results, 4) == (ExitCode.OK, None)  # neither its error nor its undecided gate holds the run
    assert json.loads((run_dir / "results.json").read_text())["cells"][0]["infrastructure"] is True  # still known
    rendered = report(run_dir)  # read back from results.json: the entry travelled with the cell
    assert rendered.returncode == 0, rendered.stderr
    assert "✅ **PASSED**" in rendered.stdout
    junit = ET.parse(run_dir / "junit.xml").getroot()
    assert junit.get("errors") == "0" and junit.get("failures") == "0"
    (launch,) = [case for case in junit.iter("testcase") if case.get("classname") == "boots-tp8"]
    skipped = launch.find("skipped")
    assert skipped.get("type") == "quarantined" and "error: launch timeout" in skipped.get("message")
    assert "issues/7" in skipped.get("message") and f"until {today}" in skipped.get("message")
    summary = rendered.stdout.split("## Accuracy Tests")[0].split("## Speed Tests")[0]
    quarantined = summary.split("## 🔒 Quarantined (ran and reported, not gating)")[1].split("\n## ")[0]
    assert "`boots-tp8`: 💥 error, quarantined until" in quarantined and "launch timeout" in quarantined
    assert "`boots-tp4`: ✅ passed, quarantined until" in quarantined  # passing: a candidate to lift
    assert "`boots-tp2`: ❔ inconclusive, quarantined until" in quarantined
    expired = summary.split("## ⏰ Quarantine expired (these cells gate again)")[1]
    assert f"`old-tp2`: ✅ passed. quarantine expired on {today - dt.timedelta(days=1)} (q.yaml:6)" in expired


def test_a_results_json_from_before_the_entry_travelled_still_renders_and_a_broken_one_is_exit_2(tmp_path):
    run_dir = quarantined_run(tmp_path, dt.date.today())
    data = json.loads((run_dir / "results.json").read_text())
    for cell in data["cells"]:
        cell.pop("quarantine", None)  # as a run of the first quarantine release wrote it: the label only
    (run_dir / "results.json").write_text(json.dumps(data))
    old = report(run_dir)
    assert old.returncode == 0, old.stderr
    assert "`boots-tp8`: 💥 error, quarantined, not gating" in old.stdout
    assert ET.parse(run_dir / "junit.xml").getroot().get("errors") == "0"

    data["cells"][0]["quarantine"] = {"cell": "boots-*", "reason": "r", "link": "https://x", "expires": "soon",
                                      "where": "q.yaml:2"}
    (run_dir / "results.json").write_text(json.dumps(data))
    broken = report(run_dir)
    assert broken.returncode == 2 and "Traceback" not in broken.stderr
    assert "results.json" in broken.stderr and '"quarantine" must be' in broken.stderr
