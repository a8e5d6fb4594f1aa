"""`gpqa.scorer: sgl-eval` follows `sgl-eval run gpqa`'s defaults (thinking on, 8 repeats, no max_tokens, temperature
0, 64 at a time) for every option the cell leaves unset, and records every option it sets otherwise,
so a figure compared with the CLI's is the same measurement or says why not."""

from __future__ import annotations

from pathlib import Path

from dspark_ci.ground.measurements import GpqaSummary
from dspark_ci.ground.records import CellResult
from dspark_ci.ground.suites import scorer_cli_differences
from dspark_ci.reports.markdown import _scored_by
from dspark_ci.suites.config import merge_options
from dspark_ci.suites.gpqa import GpqaSettings

from dspark_ci.suite_runner import UNCAPPED_TOKENS, SuiteRequest


def test_unset_options_take_the_sgl_eval_clis_defaults():
    options = merge_options({"gpqa": {"scorer": "sgl-eval"}}, [], "options.json")["gpqa"]
    assert (options["repeats"], options["max_tokens"], options["temperature"],
            options["concurrency"]) == (8, None, 0.0, 64)
    settings = GpqaSettings.from_options(options)
    assert dict(settings.chat_template_kwargs) == {"thinking": True}  # what the CLI sends, no more
    assert settings.max_tokens is None
    assert scorer_cli_differences(options) == {}


def test_thinking_off_is_sent_off_and_recorded_as_a_difference():
    options = merge_options({"gpqa": {"scorer": "sgl-eval", "thinking": False}}, [], "options.json")["gpqa"]
    assert GpqaSettings.from_options(options).chat_template_kwargs is None
    assert scorer_cli_differences(options) == {"thinking": {"ours": False, "sgl_eval": True}}


def test_other_scorers_keep_their_own_defaults():
    options = merge_options({"gpqa": {"scorer": "simple-evals"}}, [], "options.json")["gpqa"]
    assert (options["repeats"], options["max_tokens"], options["thinking"]) == (1, 2048, False)
    assert scorer_cli_differences(options) == {}


def test_every_option_set_unlike_the_cli_is_recorded_and_shown():
    options = merge_options({"gpqa": {"scorer": "sgl-eval", "repeats": 1}}, ["gpqa.max_tokens=4096"], "o.json")["gpqa"]
    differences = scorer_cli_differences(options)
    assert differences == {"repeats": {"ours": 1, "sgl_eval": 8}, "max_tokens": {"ours": 4096, "sgl_eval": None}}
    cell = CellResult(id="c", config=None, expect={}, gpqa=GpqaSummary("sgl-eval", cli_differences=tuple(sorted(differences))))
    assert _scored_by(cell, "gpqa_accuracy", "Accuracy") == \
        "Accuracy (scorer sgl-eval; sent unlike its CLI: max_tokens, repeats)"


def test_a_request_without_max_tokens_may_take_as_long_as_a_long_thinking_trace():
    request = SuiteRequest(base_url="http://127.0.0.1:1", names=("sanity", "gpqa"), work_dir=Path("."),
                           options={"gpqa": {"scorer": "sgl-eval"}})
    assert request.request_timeout_s >= 0.25 * UNCAPPED_TOKENS

