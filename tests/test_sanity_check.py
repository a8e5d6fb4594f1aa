"""The always-on sanity check: whatever suites a cell selects, a server that streams garbage, breaks its streams off
or decodes slowly is never green. End to end through `dspark-ci run`, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from dspark_ci.suites.sanity import parse_stream, reply_problems, text_problem

from tests.cli_under_test import DSPARK_CI

REPO = Path(__file__).resolve().parent.parent
SMOKE = str(REPO / "matrices" / "smoke.yaml")
TWO_NODES = "dsv4-flash-2node-tp16-a2a-none-dspark-b7-cuda"


def run_cell(tmp_path: Path, faults: str, *args: str) -> tuple[int, dict, str]:
    out = tmp_path / "run"
    env = {**os.environ, "CI": "true", "DSPARK_SIM_FAULTS": faults, "DSPARK_STATE_DIR": str(tmp_path / "state"),
           "DSPARK_HISTORY": str(tmp_path / "state" / "history.sqlite")}
    done = subprocess.run([*DSPARK_CI, "run", SMOKE, "--cell", TWO_NODES, "--out", str(out), *args], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=240)
    cell = json.loads((out / "results.json").read_text())["cells"][0]
    return done.returncode, cell, done.stderr


@pytest.mark.parametrize("faults, says", [
    ("malformed_stream", "the stream broke off"),
    ("accept_collapse", "below the collapse floor"),
], ids=["malformed-stream", "accept-collapse"])
def test_a_suite_that_reads_no_stream_still_catches_a_broken_server(tmp_path, faults, says):
    # gpqa alone neither streams nor measures speculation: only the sanity check can see these faults (garbage
    # text as well: test_a_failed_sanity_check_skips_the_cells_other_suites, whose run selects gpqa too).
    code, cell, stderr = run_cell(tmp_path, faults, "--suites", "gpqa")
    assert code == 1, stderr
    assert cell["status"] == "failed"
    assert "sanity" in cell["error"] and says in cell["error"], cell["error"]


@pytest.mark.parametrize("faults, suites, says", [
    ("nonstream_garbage", "accept", "have no vowel"),
    ("nonstream_empty", "speed", "the reply has no text"),
    ("nonstream_garbage", None, "have no vowel"),  # the cell's own suites
    ("usage_doubled", "accept", "impossible measurement"),
], ids=["garbage-accept", "empty-speed", "garbage-default-suites", "usage-doubled-accept"])
def test_a_server_whose_replies_not_streamed_are_broken_is_red(tmp_path, faults, suites, says):
    # Streams stay right: only the requests not streamed (chat, completions, /generate) can see these faults.
    code, cell, stderr = run_cell(tmp_path, faults, *(("--suites", suites) if suites else ()))
    assert code == 1, stderr
    assert cell["status"] == "failed"
    assert "sanity" in cell["error"] and says in cell["error"], cell["error"]


def test_impossible_speculative_statistics_are_named():
    from dspark_ci.suites.sanity import StreamReply, consistency_problems

    spec = {"spec_verify_ct": 10, "spec_num_correct_drafts": 19, "spec_num_proposed_drafts": 60,
            "spec_accept_rate": 19 / 60, "spec_accept_length": 2.9}
    honest = StreamReply("text", {"prompt_tokens": 5, "completion_tokens": 29, "total_tokens": 34}, "length", 10,
                         spec=spec, kind="chat")
    assert consistency_problems(honest) == []
    doubled = StreamReply("text", {"prompt_tokens": 5, "completion_tokens": 58, "total_tokens": 63}, "length", 10,
                          spec=spec, kind="chat")
    problems = consistency_problems(doubled)
    assert problems and "impossible measurement" in problems[0] and "num_draft_tokens 7" in problems[0]


def test_an_empty_reply_is_broken_unless_the_model_stopped_at_once():
    # SmolLM2-135M-Instruct on SGLang's engine answers a chat prompt sent as raw text with its end-of-turn token alone.
    from dspark_ci.suites.sanity import StreamReply, non_streamed_problems

    def reply(tokens: int, finish: str) -> StreamReply:
        return StreamReply("", {"prompt_tokens": 15, "completion_tokens": tokens, "total_tokens": 15 + tokens}, finish,
                           kind="completions")

    assert non_streamed_problems(reply(1, "stop"), 16) == []
    assert non_streamed_problems(reply(16, "length"), 16) == ["completions: the reply has no text"]
    assert non_streamed_problems(reply(5, "stop"), 16) == ["completions: the reply has no text"]


def test_the_two_node_cell_is_gated_on_speed(tmp_path):
    code, cell, stderr = run_cell(tmp_path, "slow_decode=1.5", "--suites", "speed")
    assert code == 1, stderr
    failed = {gate["metric"] for gate in cell["gates"] if not gate["passed"]}
    assert {"tpot_ms_median", "output_throughput_tok_s"} <= failed


# A healthy server passing the sanity check beside its suites: tests/test_run_cli.py's smoke run (both serving
# cells), which boots the same cells; a second healthy run here measured nothing that one does not.


def test_a_stream_cut_mid_event_or_without_done_is_broken():
    head = b'data: {"choices": [{"delta": {"content": "Hello there"}}]}'
    assert "not JSON (cut off?)" in parse_stream([head, b"", b'data: {"choices": [{"del']).problems[0]
    assert parse_stream([head, b""]).problems == ("the stream ended without `data: [DONE]`",)


@pytest.mark.parametrize("text, says", [
    ("The answer is\x07 four.", "control characters U+0007"),
    ("Caf\ufffd is open today", "replacement characters"),
    ("xkcd brr tsk pfft hmm grr shh zzz", "have no vowel"),
    ("ab" * 100, "one short pattern repeated"),
    ("   ", "no text"),
])
def test_text_that_is_not_text_is_named(text, says):
    assert says in text_problem(text)


def test_usage_that_does_not_add_up_is_named():
    lines = [b'data: {"choices": [{"delta": {"content": "Four, the sum of two and two."}, "finish_reason": "stop"}]}',
             b'data: {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 8, "total_tokens": 18}}',
             b"data: [DONE]"]
    assert reply_problems(parse_stream(lines), 32) == [
        "usage does not add up: 9 prompt + 8 completion != 18 total tokens"]


def test_a_failed_sanity_check_skips_the_cells_other_suites(tmp_path):
    # The server is known broken once the sanity check fails: the cell is red then, not after every other suite.
    # None of the suites selected asks for the sanity check, and gpqa reads no stream: the check runs all the same.
    code, cell, stderr = run_cell(tmp_path, "garbage_output", "--suites", "gpqa,accept,speed")
    assert code == 1, stderr
    assert cell["status"] == "failed" and "sanity" in cell["error"] and "have no vowel" in cell["error"], cell["error"]
    others = [t for t in cell["tests"] if "test_sanity.py" not in t["nodeid"]]
    assert {Path(t["nodeid"].split("::")[0]).name for t in others} >= {"test_gpqa.py", "test_accept.py",
                                                                         "test_speed.py"}, others
    assert all(t["outcome"] == "skipped" and "the sanity check failed" in t["message"] for t in others), (
        [(t["nodeid"], t["outcome"], t["message"]) for t in others])
