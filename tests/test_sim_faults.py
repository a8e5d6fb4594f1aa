"""Every fault of DSPARK_SIM_FAULTS (CONTRACT.md), seen from outside: HTTP, exit codes, stderr."""

from __future__ import annotations

import re
import time

import openai
import pytest
import requests

from tests.sim_fixtures import run_sim_to_exit, sim  # noqa: F401 (sim is a fixture)

DSPARK = ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", "sim/draft",
          "--speculative-dspark-block-size", "4"]
HELLO = [{"role": "user", "content": "hello"}]
GPQA_PROMPT = ("Answer the following multiple choice question. The last line of your response should be of the "
               "following format: 'Answer: $LETTER' (without quotes) where LETTER is one of ABCD. Think step by "
               "step before answering.\n\nWhich gas is a noble gas?\n\nA) Argon\nB) Nitrogen\nC) Oxygen\nD) Chlorine")


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0)


def test_accept_collapse_accepts_no_draft(sim):
    server = sim(DSPARK, env={"DSPARK_SIM_FAULTS": "accept_collapse"})
    reply = client(server).chat.completions.create(
        model="m", messages=HELLO, max_tokens=50, extra_body={"ignore_eos": True, "return_spec_tokens_details": True})
    details = reply.model_extra["sglext"]["spec_tokens_details"]
    assert details["spec_num_correct_drafts"] == 0 and details["spec_accept_rate"] == 0.0
    assert details["spec_verify_ct"] == 49  # one token per verify step after the prefill token
    states = requests.get(server.url("/server_info"), timeout=5).json()["internal_states"]
    assert states[0]["avg_spec_accept_length"] == 1.0


def test_boot_reject_exits_with_the_given_message():
    result = run_sim_to_exit(DSPARK, env={"DSPARK_SIM_FAULTS": "boot_reject=DSpark says no, politely"})
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == "ValueError: DSpark says no, politely"


def test_crash_first_prefill_is_healthy_until_the_first_request(sim):
    server = sim([], env={"DSPARK_SIM_FAULTS": "crash_first_prefill"})
    assert server.health() == 200
    with pytest.raises(openai.APIConnectionError):
        client(server).chat.completions.create(model="m", messages=HELLO, max_tokens=5)
    assert server.wait_exit() != 0
    assert server.last_line().startswith("AssertionError: ")


def test_hang_boot_never_becomes_healthy(sim):
    server = sim([], env={"DSPARK_SIM_FAULTS": "hang_boot"}, wait=False)
    listening_by = time.monotonic() + 60  # its interpreter's start alone took over 1.5 s at load 7
    while server.health() is None and time.monotonic() < listening_by:
        time.sleep(0.1)
    deadline = time.monotonic() + 1.5  # then, answering, it must stay unready
    codes = set()
    while time.monotonic() < deadline:
        codes.add(server.health())
        time.sleep(0.1)
    assert 503 in codes and 200 not in codes
    assert server.process.poll() is None  # still running, just never ready


def test_garbage_output_has_no_parseable_answer(sim):
    server = sim([], env={"DSPARK_SIM_FAULTS": "garbage_output", "DSPARK_SIM_GPQA_ACCURACY": "1"})
    reply = client(server).chat.completions.create(
        model="m", messages=[{"role": "user", "content": GPQA_PROMPT}], temperature=0, max_tokens=4000)
    assert not re.search(r"(?i)Answer\s*:\s*([A-D])", reply.choices[0].message.content)


def test_slow_decode_multiplies_the_step_time(sim):
    server = sim([], env={"DSPARK_SIM_FAULTS": "slow_decode=40", "DSPARK_SIM_DECODE_STEP_MS": "5"})
    meta = requests.post(server.url("/generate"), timeout=30, json={
        "text": "hi", "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}).json()["meta_info"]
    # three decode steps of 5 ms x 40: a lower bound, which sleeping cannot undercut
    assert meta["e2e_latency"] >= 3 * 0.005 * 40


def test_rank_exit_ends_that_rank_with_an_error_line(sim):
    server = sim([], env={"DSPARK_SIM_FAULTS": "rank_exit=0:0.5"})
    assert server.wait_exit() != 0
    assert server.last_line().startswith("RuntimeError: ")
    assert "rank_exit" in server.last_line()


def test_malformed_stream_breaks_off_mid_event(sim):
    server = sim([], env={"DSPARK_SIM_FAULTS": "malformed_stream"})
    with pytest.raises(openai.APIConnectionError):
        list(client(server).chat.completions.create(model="m", messages=HELLO, max_tokens=20, stream=True,
                                                     extra_body={"ignore_eos": True}))
    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        with requests.post(server.url("/generate"), stream=True, timeout=10, json={
                "text": "hi", "stream": True, "sampling_params": {"max_new_tokens": 20, "ignore_eos": True}}) as r:
            b"".join(r.iter_content(None))
    whole = client(server).chat.completions.create(model="m", messages=HELLO, max_tokens=20,
                                                    extra_body={"ignore_eos": True})
    assert whole.usage.completion_tokens == 20  # only streams break


@pytest.mark.parametrize("env, message", [
    pytest.param({"DSPARK_SIM_FAULTS": "disk_full"}, "unknown fault 'disk_full'", id="unknown-fault"),
    pytest.param({"DSPARK_SIM_FAULTS": "rank_exit=soon"}, "fault 'rank_exit' needs RANK:SECONDS", id="bad-rank-exit"),
    pytest.param({"DSPARK_SIM_ACCEPT_PROB": "1.5"}, "DSPARK_SIM_ACCEPT_PROB='1.5'", id="probability-above-1"),
    pytest.param({"DSPARK_SIM_GPQA_PATH": "/nonexistent/gpqa.csv"}, "cannot read", id="missing-gpqa-csv"),
])
def test_unusable_simulator_settings_exit_2_with_one_line(env, message):
    result = run_sim_to_exit([], env=env)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert message in result.stderr
