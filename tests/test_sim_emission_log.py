"""DSPARK_SIM_EMISSION_LOG: one JSON line per request, on clocks a client on the same host can compare with its own."""

from __future__ import annotations

import json
import time

import openai
import pytest
import requests

from tests.sim_fixtures import run_sim_to_exit, sim  # noqa: F401 (fixture)

SPEC_ARGS = ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", "sim/draft",
             "--speculative-dspark-block-size", "3"]
HELLO = [{"role": "user", "content": "Tell me about speculative decoding."}]
WAIT_FOR_LINES_S = 10.0


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0)


def read_lines(path) -> dict[str, dict]:
    if not path.exists():
        return {}
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return {record["rid"]: record for record in records}


def wait_for_lines(path, count: int) -> dict[str, dict]:
    """The log while the server runs: lines arrive within the flush interval."""
    deadline = time.monotonic() + WAIT_FOR_LINES_S
    while len(lines := read_lines(path)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return lines


def test_each_request_logged_on_the_clients_clock(sim, tmp_path):
    log = tmp_path / "emissions.jsonl"
    server = sim(SPEC_ARGS, env={"DSPARK_SIM_EMISSION_LOG": str(log), "DSPARK_SIM_DECODE_STEP_MS": "5"})
    sent = time.monotonic()
    received = []  # (client's time.monotonic() at receipt, chunk)
    for chunk in client(server).chat.completions.create(
            model="m", messages=HELLO, max_tokens=30, stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            extra_body={"ignore_eos": True, "return_spec_tokens_details": True}):
        received.append((time.monotonic(), chunk))
    whole = client(server).chat.completions.create(
        model="m", messages=HELLO, max_tokens=10, extra_body={"ignore_eos": True, "return_spec_tokens_details": True})
    generated = requests.post(server.url("/generate"), timeout=30, json={
        "text": "hello", "sampling_params": {"max_new_tokens": 7, "ignore_eos": True}}).json()
    lines = wait_for_lines(log, 3)
    assert len(lines) == 3  # clients' requests only: the startup warmup is not logged

    content = [(at, chunk) for at, chunk in received if chunk.choices and chunk.choices[0].delta.content]
    usage = received[-1][1].usage
    streamed = lines[received[0][1].id]
    assert (streamed["prompt_tokens"], streamed["completion_tokens"]) == (usage.prompt_tokens, 30)
    assert streamed["finish_reason"] == "length" and streamed["streaming"] is True
    assert streamed["emissions"] == len(content)  # one chunk per engine step
    assert sent <= streamed["arrival_monotonic"] <= streamed["first_token_monotonic"] <= streamed[
        "last_token_monotonic"]
    assert content[0][0] >= streamed["first_token_monotonic"]  # the client got it after the server sent it
    assert content[-1][0] >= streamed["last_token_monotonic"]
    client_offset = time.time() - time.monotonic()
    for instant in ("arrival", "first_token", "last_token"):
        assert streamed[f"{instant}_wall"] - streamed[f"{instant}_monotonic"] == pytest.approx(client_offset, abs=1.0)
    # per emission: the tokens of each chunk (as the chunk's usage counts them) and when it was handed over
    counts = [chunk.usage.completion_tokens for _, chunk in content]
    assert streamed["emission_tokens"] == [after - before for before, after in zip([0, *counts], counts, strict=False)]
    assert max(streamed["emission_tokens"]) > 1  # speculative steps send several tokens at once
    assert all(at >= handed for (at, _), handed in zip(content, streamed["emission_monotonic"], strict=False))
    assert_emissions_add_up(streamed)

    assert lines[whole.id]["streaming"] is False
    assert lines[whole.id]["completion_tokens"] == whole.usage.completion_tokens == 10
    assert lines[whole.id]["emissions"] == 1 + spec_details(whole)["spec_verify_ct"]  # prefill, then verify steps
    assert_emissions_add_up(lines[whole.id])
    native = lines[generated["meta_info"]["id"]]
    assert (native["prompt_tokens"], native["completion_tokens"]) == (generated["meta_info"]["prompt_tokens"], 7)
    assert_emissions_add_up(native)


def spec_details(reply) -> dict:
    return reply.model_extra["sglext"]["spec_tokens_details"]


def assert_emissions_add_up(line: dict) -> None:
    times, tokens = line["emission_monotonic"], line["emission_tokens"]
    assert len(times) == len(tokens) == line["emissions"] > 1
    assert sum(tokens) == line["completion_tokens"] and tokens[0] == 1  # the prefill makes one token
    assert (times[0], times[-1]) == (line["first_token_monotonic"], line["last_token_monotonic"])
    assert times == sorted(times)


def test_stopping_the_server_writes_every_line_including_aborts(sim, tmp_path):
    log = tmp_path / "emissions.jsonl"
    server = sim([], env={"DSPARK_SIM_EMISSION_LOG": str(log)})
    rids = [requests.post(server.url("/generate"), timeout=30, json={
        "text": f"p{index}", "sampling_params": {"max_new_tokens": 3}}).json()["meta_info"]["id"]
        for index in range(5)]
    with requests.post(server.url("/v1/chat/completions"), stream=True, timeout=30, json={
            "model": "m", "messages": HELLO, "max_tokens": 5000, "ignore_eos": True, "stream": True}) as response:
        first_event = next(line for line in response.iter_lines() if line.startswith(b"data: "))
    left = json.loads(first_event[len(b"data: "):])["id"]
    server.stop()
    lines = read_lines(log)
    assert set(rids) <= set(lines)
    assert lines[left]["finish_reason"] == "abort" and lines[left]["completion_tokens"] < 5000
    assert sum(lines[left]["emission_tokens"]) == lines[left]["completion_tokens"]  # what was handed over


def test_a_path_that_cannot_be_appended_to_is_exit_2(tmp_path):
    result = run_sim_to_exit([], env={"DSPARK_SIM_EMISSION_LOG": str(tmp_path)})  # a directory
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"sglang_sim: DSPARK_SIM_EMISSION_LOG={tmp_path}: ")
