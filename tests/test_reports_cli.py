"""`dspark-ci report` end to end on a fixed pair of runs (tests/golden/reports/run_new, run_old).

Golden files live in tests/golden/reports/. After an intended change to the reports, regenerate them with
    DSPARK_UPDATE_GOLDEN=1 python -m pytest tests/test_reports_cli.py
and review the diff before committing.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import xmlschema

from dspark_ci.cli import main
from tests.golden_files import GOLDEN_DIR, assert_golden

GOLDEN = GOLDEN_DIR / "reports"


@pytest.fixture
def runs(tmp_path, monkeypatch) -> Path:
    """tmp_path holding copies of run_new/, run_old/ and baseline.yaml; the working directory is tmp_path,
    so paths in the output are relative and the same on every machine."""
    for name in ("run_new", "run_old"):
        shutil.copytree(GOLDEN / name, tmp_path / name)
    shutil.copy(GOLDEN / "baseline.yaml", tmp_path / "baseline.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DSPARK_HISTORY", str(tmp_path / "history.sqlite"))  # none: the goldens have no trends
    return tmp_path


def report(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = main(["report", *args])
    except SystemExit as exit:  # argparse rejects arguments by exiting
        code = exit.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_report_md_matches_golden_and_is_written(runs, capsys):
    code, out, _ = report(capsys, "run_new")
    assert code == 1  # the fixture has a failed cell and an errored one
    assert_golden(GOLDEN / "report.md", out)
    assert (runs / "run_new" / "report.md").read_text(encoding="utf-8") == out


def test_report_with_baseline_regates_and_explains_thresholds(runs, capsys):
    code, out, err = report(capsys, "run_new", "--baseline", "baseline.yaml")
    assert code == 1
    assert_golden(GOLDEN / "report-baseline.md", out)
    assert "'smoke-qwen3-eagle3-*'" not in err  # the glob matched cells: no "matches no cell" warning


def test_compare_table_matches_golden(runs, capsys):
    code, out, _ = report(capsys, "run_new", "--compare", "run_old")
    assert code == 1
    assert_golden(GOLDEN / "compare.md", out)
    assert "## Compared with `20250531-120000-old`" in (runs / "run_new" / "report.md").read_text(encoding="utf-8")


def test_compare_json_gives_ratios_and_direction(runs, capsys):
    _, out, _ = report(capsys, "run_new", "--compare", "run_old", "--format", "json")
    comparison = json.loads(out)
    cell = next(c for c in comparison["cells"] if c["id"] == "smoke-qwen3-eagle3-tp1")
    rows = {row["metric"]: row for row in cell["metrics"]}
    assert rows["accept_length"] == {"metric": "accept_length", "old": 3.05, "new": 3.12, "ratio": 1.023,
                                     "better": "higher", "noise": 0.061, "change": "better"}  # +2.3%, band ±2%
    assert rows["output_throughput_tok_s"]["change"] == "worse"  # 812.53 vs 840 tok/s: -3.3%, band ±3%
    assert rows["ttft_ms_mean"]["change"] == "within_noise"  # 45.12 ms vs 43.0 ms: +4.9%, band ±5%
    assert comparison["only_new"] == ["smoke-2node-tp16"] and comparison["only_old"] == ["smoke-qwen3-dflash-tp1"]


def test_exit_0_when_every_cell_passed(runs, capsys):
    results = json.loads((runs / "run_new" / "results.json").read_text())
    results["cells"] = [c for c in results["cells"] if c["status"] in ("passed", "rejected_as_expected", "skipped")]
    (runs / "run_new" / "results.json").write_text(json.dumps(results))
    assert report(capsys, "run_new")[0] == 0


def junit_cases(run_dir: Path) -> dict[tuple[str, str], ET.Element]:
    """(cell id, testcase name) -> testcase, after checking the file against the JUnit schema."""
    xmlschema.XMLSchema(str(Path(__file__).parent / "schemas" / "junit.xsd")).validate(str(run_dir / "junit.xml"))
    root = ET.parse(run_dir / "junit.xml").getroot()
    return {(case.get("classname"), case.get("name")): case for case in root.iter("testcase")}


def test_junit_has_one_testcase_per_cell_and_suite_with_the_right_failures(runs, capsys):
    report(capsys, "run_new")
    root = ET.parse(runs / "run_new" / "junit.xml").getroot()
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("9", "2", "1")
    cases = junit_cases(runs / "run_new")
    assert sorted(cases) == [
        ("smoke-2node-tp16", "launch"), ("smoke-dsv4-tp8-dp4-dpattn-a2a-none-cuda", "expected rejection"),
        ("smoke-qwen3-base-tp1", "speed"), ("smoke-qwen3-eagle3-collapse", "accept"),
        ("smoke-qwen3-eagle3-collapse", "speed"), ("smoke-qwen3-eagle3-crash", "launch"),
        ("smoke-qwen3-eagle3-tp1", "accept"), ("smoke-qwen3-eagle3-tp1", "gpqa"), ("smoke-qwen3-eagle3-tp1", "speed")]
    assert cases["smoke-qwen3-eagle3-collapse", "accept"].find("failure").get("message") == (
        "accept_length = 1.00, needs >= 1.20")
    assert "ttft_ms_median not measured" in cases["smoke-qwen3-eagle3-collapse", "speed"].find("failure").get("message")
    error = cases["smoke-qwen3-eagle3-crash", "launch"].find("error")
    assert "AssertionError: prefill batch" in error.get("message")  # SGLang's own error line
    assert cases["smoke-2node-tp16", "launch"].find("skipped") is not None
    rejected = cases["smoke-dsv4-tp8-dp4-dpattn-a2a-none-cuda", "expected rejection"].find("system-out").text
    assert rejected.startswith("rejected as expected: ValueError: dp attention with speculative decoding requires")
    # Metrics ride on the cell's testsuite: the schema allows <properties> there, never inside a testcase.
    suite = next(s for s in root.iter("testsuite") if s.get("name") == "smoke-qwen3-eagle3-tp1")
    assert {p.get("name") for p in suite.iter("property")} >= {"accept_length", "gpqa_accuracy"}


def test_junit_parses_whatever_a_log_put_in_an_error(runs, capsys):
    results = json.loads((runs / "run_new" / "results.json").read_text())
    crash = next(c for c in results["cells"] if c["id"] == "smoke-qwen3-eagle3-crash")
    crash["error"] = "node rank 0 exited\n\x1b[31mRuntimeError: CUDA error\x1b[0m\x00\x07 <&> done"
    crash["sglang_error"] = "\x1b[31mRuntimeError: CUDA error\x1b[0m"
    (runs / "run_new" / "results.json").write_text(json.dumps(results))
    report(capsys, "run_new")
    error = junit_cases(runs / "run_new")["smoke-qwen3-eagle3-crash", "launch"].find("error")
    assert error.text == "node rank 0 exited\nRuntimeError: CUDA error\\x00\\x07 <&> done"
    assert error.get("message") == "node rank 0 exited: RuntimeError: CUDA error"


def test_html_is_self_contained_with_embedded_charts(runs, capsys):
    _, out, _ = report(capsys, "run_new", "--compare", "run_old", "--format", "html")
    assert (runs / "run_new" / "report.html").read_text(encoding="utf-8") == out
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([^"]+)"', out)
    assert {"Accept length", "Output throughput", "GPQA accuracy",
            "Compared with the old run"} <= {a for a, _ in images}
    assert all(base64.b64decode(data).startswith(b"\x89PNG") for _, data in images)
    assert not re.search(r'(src|href)="(https?:)?//', out)  # no external assets


def test_html_shows_error_text_as_text(runs, capsys):
    results = json.loads((runs / "run_new" / "results.json").read_text())
    results["cells"][4]["error"] = "ValueError: bad <script>alert(1)</script> value"
    (runs / "run_new" / "results.json").write_text(json.dumps(results))
    _, out, _ = report(capsys, "run_new", "--format", "html")
    assert "<script>" not in out and "&lt;script&gt;alert(1)&lt;/script&gt;" in out


@pytest.mark.parametrize("content, expected", [
    pytest.param('{"schema": 1, "cells": [', "results.json:1: not valid JSON", id="truncated-json"),
    pytest.param("", "results.json:1: not valid JSON", id="empty-file"),
    pytest.param('{"schema": 99, "cells": []}', "schema 99 is not supported", id="unknown-schema"),
    pytest.param('{"schema": 1, "cells": [{"id": "a", "status": "great"}]}', '"status" is \'great\'', id="bad-status"),
    pytest.param('[1, 2]', "the top level is not a JSON object", id="not-an-object"),
])
def test_corrupt_results_json_exits_2_with_one_message(tmp_path, content, expected):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "results.json").write_text(content)
    proc = subprocess.run([sys.executable, "-m", "dspark_ci", "report", str(run_dir)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert expected in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("args, expected", [
    pytest.param(["missing"], "RUN_DIR missing: no such directory", id="missing-run-dir"),
    pytest.param(["empty"], "results.json: no such file", id="dir-without-results"),
    pytest.param(["run_new", "--compare", "missing"], "--compare missing: no such directory", id="missing-compare-dir"),
    pytest.param(["run_new", "--baseline", "missing.yaml"], "missing.yaml: no such file", id="missing-baseline"),
    pytest.param(["run_new", "--format", "pdf"], "invalid choice: 'pdf'", id="unknown-format"),
])
def test_bad_arguments_exit_2(runs, capsys, args, expected):
    (runs / "empty").mkdir()
    code, _, err = report(capsys, *args)
    assert code == 2 and expected in err



@pytest.mark.parametrize("test_outcome, status_after", [
    pytest.param("passed", "passed", id="gate-only-failure-passes-under-looser-baseline"),
    pytest.param("failed", "failed", id="suite-test-failure-stays-failed"),
])
def test_regating_follows_the_new_gates(runs, capsys, test_outcome, status_after):
    results = json.loads((runs / "run_new" / "results.json").read_text())
    cell = results["cells"][0]  # smoke-qwen3-eagle3-tp1, 812.53 tok/s; failed against an older, stricter gate
    cell.update(status="failed", error="gate output_throughput_tok_s >= 900: measured 812.53",
                gates=[{"metric": "output_throughput_tok_s", "op": ">=", "threshold": 900, "value": 812.53,
                        "passed": False}],
                tests=[{"nodeid": "suites/test_speed.py::test_speed", "outcome": test_outcome, "duration": 1.0,
                        "message": None}])
    results["cells"] = [cell]
    (runs / "run_new" / "results.json").write_text(json.dumps(results))
    (runs / "loose.yaml").write_text("schema: 1\ncells:\n  smoke-qwen3-eagle3-tp1:\n"
                                     "    output_throughput_tok_s: {value: 820, min_ratio: 0.97}\n")
    code, out, _ = report(capsys, "run_new", "--baseline", "loose.yaml", "--format", "json")
    regated = json.loads(out)["cells"][0]
    # Only the speed suite ran (its one recorded test): the accept and GPQA floors are not applied, as in the run.
    assert [(g["metric"], g["threshold"], g["passed"]) for g in regated["gates"]] == [
        ("output_throughput_tok_s", 795.4, True)]
    assert regated["status"] == status_after
    assert code == (0 if status_after == "passed" else 1)


def test_compare_says_which_of_the_run_files_it_rewrote(runs, capsys):
    code, _, err = report(capsys, "run_new", "--compare", "run_old")
    assert "rewrote junit.xml, report.md, report.html in " in err and "(compared with " in err
    assert "results.json is unchanged" in err
    _, _, err = report(capsys, "run_new", "--compare", "run_old", "--format", "json")
    assert "rewrote" not in err
