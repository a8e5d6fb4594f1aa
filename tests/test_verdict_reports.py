"""Verdicts as users read them: results.json (old files still read), report.md, junit.xml."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from dspark_ci.ground.records import CellResult, GateResult, RunResults, Status
from dspark_ci.ground.sglang.settings import CellConfig
from dspark_ci.ground.stats import Verdict
from dspark_ci.reports.junit import render_junit
from dspark_ci.reports.markdown import render_markdown

UNDECIDED = Verdict("inconclusive", 0.01, -0.004, 0.031, 0.025, "relative", "t on log values, 1 boot(s) vs 8 "
                    "baseline run(s)", 0.0014, 0.05, 1, detect=0.05)
CELL = CellResult(id="cell-a", config=CellConfig(speculative_algorithm="DSPARK"), expect={"outcome": "serve"},
                  suites={"speed": {}}, status=Status.INCONCLUSIVE, metrics={"tpot_ms_median": 6.9},
                  gates=(GateResult("tpot_ms_median", "<=", 6.98, 6.9, False, UNDECIDED),))
RUN = RunResults("r1", "2026-12-01T00:00:00+00:00", "2026-12-01T00:01:00+00:00", "local", (), cells=(CELL,))


def test_results_json_carries_the_verdict_and_old_gate_dicts_still_read():
    gate = CELL.to_dict()["gates"][0]
    assert gate["verdict"] == "inconclusive" and gate["passed"] is False
    assert gate["interval"] == [-0.004, 0.031] and gate["tolerance"] == 0.025 and gate["test"].startswith("t on log")
    assert gate["detect"] == 0.05  # what a pass would have ruled out
    assert CellResult.from_dict(CELL.to_dict()) == CELL
    before_detect = GateResult.from_dict({k: v for k, v in gate.items() if k != "detect"})  # written before it
    assert before_detect.statistic.detection == 0.025
    old = GateResult.from_dict({"metric": "accept_length", "op": ">=", "threshold": 1.2, "value": 1.0, "passed": False})
    assert (old.verdict, old.statistic) == ("regressed", None)


def test_report_md_shows_inconclusive_apart_with_its_interval_and_the_levels():
    text = render_markdown(RUN)
    assert "❔ **INCONCLUSIVE**" in text and "## ❔ Inconclusive gates" in text and "## ❌ Failed gates" not in text
    assert "+1.0% [-0.4%, +3.1%] vs tolerance +2.5%, detect +5.0%: inconclusive" in text
    assert "α = 0.0014 per gate and look" in text


def test_junit_marks_an_inconclusive_suite_skipped_not_failed():
    case = ET.fromstring(render_junit(RUN)).find(".//testcase[@name='speed']")
    assert case.find("failure") is None and case.find("skipped").get("message").startswith("inconclusive: ")
