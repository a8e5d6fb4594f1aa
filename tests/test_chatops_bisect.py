"""ChatOps /bisect CELL METRIC GOOD..BAD and /rerun-test cell:ID --trials N: parsed strictly, gated and pinned
as /rerun-test is, dispatched to workflows whose inputs the act job's allow-list accepts."""

from __future__ import annotations

import pytest
from dspark_ci.ci.chatops import decision
from dspark_ci.ci.chatops.fleet import load_fleet
from dspark_ci.ci.workflows.definitions import render_all

from tests.test_chatops import chatops_json, fleet_of_the_fixture_tree, no_github, permissions_file, sglang_repo  # noqa: F401

CELL = "dsv4-flash-tp8-dp2-dpattn-lmhead-a2a-none-dspark-cuda"
SHA = "b" * 40


def test_bisect_dispatches_one_pinned_cell_to_the_bisect_workflow(capsys, sglang_repo, permissions_file):
    code, result, _ = chatops_json(capsys, sglang_repo, permissions_file, f"/bisect {CELL} tpot_ms_median 1.0.0..1.0.8",
                                   "maintainer", "MEMBER", "--head-sha", SHA)
    assert code == 0, result
    (action,) = result["plan"]["actions"]
    assert action["workflow"] == "bisect.yml" and action["inputs"]["runner"] == "8-gpu-h200"
    assert {k: action["inputs"][k] for k in ("cell", "metric", "good", "bad", "sha", "matrix")} == {
        "cell": CELL, "metric": "tpot_ms_median", "good": "1.0.0", "bad": "1.0.8", "sha": SHA,
        "matrix": "matrices/nightly.yaml"}
    assert f"bisect of `{CELL}` (tpot_ms_median) over `1.0.0`..`1.0.8`" in result["reply"]
    assert decision._allowed(action, result["reply"], load_fleet())  # the act job carries it out
    assert "bisect.yml" in render_all()  # and the workflow it dispatches exists


@pytest.mark.parametrize("comment, problem", [
    ("/bisect", "usage: /bisect CELL METRIC GOOD..BAD"),
    (f"/bisect {CELL} tpot_ms_median 1.0.0", "usage: /bisect"),
    (f"/bisect {CELL} tpot_ms_median 1.0.0..$(id)", "a build is a version, tag or commit"),
    (f"/bisect {CELL} TPOT;rm 1.0.0..1.0.8", "a metric name is lower-case"),
    (f"/bisect {CELL} gpqa_num_questions 1.0.0..1.0.8", "not a metric with a better direction"),
    ("/bisect dsv4-flash-* tpot_ms_median 1.0.0..1.0.8", "/bisect chases exactly one cell"),
])
def test_bad_bisect_comments_are_refused_without_dispatch(capsys, sglang_repo, permissions_file, comment, problem):
    code, result, _ = chatops_json(capsys, sglang_repo, permissions_file, comment)
    assert code == 2 and problem in result["reply"] and result["plan"]["actions"] == []


def test_bisect_needs_what_rerun_test_needs(capsys, sglang_repo, permissions_file):
    code, result, _ = chatops_json(capsys, sglang_repo, permissions_file, f"/bisect {CELL} failure 1.0.0..1.0.8",
                                   "someone", "NONE")
    assert code == 1 and "needs write access" in result["reply"] and result["plan"]["actions"] == []


def test_rerun_test_trials_asks_the_nightly_for_that_many_boots(capsys, sglang_repo, permissions_file):
    code, result, _ = chatops_json(capsys, sglang_repo, permissions_file, f"/rerun-test cell:{CELL} --trials 6")
    assert code == 0, result
    (action,) = result["plan"]["actions"]
    assert action["workflow"] == "nightly.yml" and action["inputs"]["trials"] == "6"
    assert f"--cell {CELL} --max-boots 6" in result["reply"] and "statistical verdict" in result["reply"]
    assert decision._allowed(action, result["reply"], load_fleet())
    assert '--max-boots "$TRIALS"' in render_all()["nightly.yml"]


@pytest.mark.parametrize("comment", ["/rerun-test cell:X --trials 1", "/rerun-test cell:X --trials 99",
                                     "/rerun-test cell:X --trials", "/rerun-test test_eagle_small.py --trials 3"])
def test_bad_trials_are_refused(capsys, sglang_repo, permissions_file, comment):
    code, result, _ = chatops_json(capsys, sglang_repo, permissions_file, comment)
    assert code == 2 and "--trials" in result["reply"] and result["plan"]["actions"] == []
