"""The simulator's HTTP API, driven with the official openai client and requests, as a user would.

Everything it reports (usage, sglext, meta_info, /server_info, /metrics) must agree with the
tokens it actually streamed.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import openai
import pytest
import requests
from dspark_ci.ground.sglang.release import DEFAULT_VERSION
from prometheus_client.parser import text_string_to_metric_families

from tests.sim_fixtures import module_sim, sim  # noqa: F401 (fixtures)

GAMMA = 3
SPEC_ARGS = ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", "sim/draft",
             "--speculative-dspark-block-size", str(GAMMA)]
HELLO = [{"role": "user", "content": "Tell me about speculative decoding."}]


@pytest.fixture(scope="module")
def spec_server(module_sim):
    return module_sim([*SPEC_ARGS, "--enable-metrics", "--reasoning-parser", "deepseek-v4"])


@pytest.fixture(scope="module")
def plain_server(module_sim):
    return module_sim([])


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0)


def spec_details(obj) -> dict:
    return (obj.model_extra or {})["sglext"]["spec_tokens_details"]


def data_events(response: requests.Response) -> list[str]:
    """The ``data:`` payloads of an SSE response (the wire format is what is under test here)."""
    return [line[len("data: "):] for line in response.iter_lines(decode_unicode=True) if line.startswith("data: ")]


# --- chat ------------------------------------------------------------------------------------

def test_chat_honours_max_tokens_exactly_with_ignore_eos(spec_server):
    reply = client(spec_server).chat.completions.create(
        model="m", messages=HELLO, max_tokens=57, temperature=0,
        extra_body={"ignore_eos": True, "return_spec_tokens_details": True})
    details = spec_details(reply)
    assert reply.object == "chat.completion"
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 57
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 57
    assert details["spec_accept_length"] == pytest.approx(57 / details["spec_verify_ct"])
    assert details["spec_num_proposed_drafts"] == details["spec_verify_ct"] * GAMMA
    assert details["spec_accept_rate"] == pytest.approx(details["spec_num_correct_drafts"]
                                                        / details["spec_num_proposed_drafts"])
    assert sum(details["spec_correct_drafts_histogram"]) == details["spec_verify_ct"]
    # the first token comes from prefill, each verify step sends correct drafts + 1
    assert 1 + details["spec_verify_ct"] + details["spec_num_correct_drafts"] == 57


def test_chat_natural_end_is_stop_on_eos(spec_server):
    reply = client(spec_server).chat.completions.create(model="m", messages=HELLO, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.model_extra["matched_stop"] == 1  # the EOS token, counted in completion_tokens as by SGLang
    assert 0 < reply.usage.completion_tokens < 500


def test_chat_stream_sends_role_content_finish_sglext_usage_in_sglangs_order(spec_server):
    stream = client(spec_server).chat.completions.create(
        model="m", messages=HELLO, max_tokens=40, temperature=0, stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, "return_spec_tokens_details": True})
    chunks = list(stream)
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert len({chunk.id for chunk in chunks}) == 1
    first, *middle, finish, sglext, usage = chunks
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
    assert all(chunk.choices[0].finish_reason is None and chunk.choices[0].delta.content for chunk in middle)
    assert finish.choices[0].finish_reason == "length"
    assert sglext.choices == [] and usage.choices == []
    details = spec_details(sglext)
    assert usage.usage.completion_tokens == 40
    # one chunk per step: the prefill token, then one chunk per verify step
    assert len(middle) == 1 + details["spec_verify_ct"]
    streamed = "".join(chunk.choices[0].delta.content for chunk in middle)
    again = client(spec_server).chat.completions.create(model="m", messages=HELLO, max_tokens=40, temperature=0,
                                                         extra_body={"ignore_eos": True})
    assert streamed == again.choices[0].message.content


def test_chat_stream_without_include_usage_has_no_usage_chunk(spec_server):
    with requests.post(spec_server.url("/v1/chat/completions"), stream=True, timeout=30,
                       json={"model": "m", "messages": HELLO, "max_tokens": 8, "stream": True}) as response:
        events = data_events(response)
    assert events[-1] == "[DONE]"
    payloads = [json.loads(event) for event in events[:-1]]
    assert all("usage" not in payload or payload["usage"] is None for payload in payloads)
    assert all(payload["choices"] for payload in payloads)  # no sglext chunk either: not asked for


def test_continuous_usage_stats_count_each_chat_chunks_tokens(spec_server):
    chunks = list(client(spec_server).chat.completions.create(
        model="m", messages=HELLO, max_tokens=40, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"ignore_eos": True, "return_spec_tokens_details": True}))
    role, *content, finish, sglext, final = chunks
    assert role.usage is None and finish.usage is None  # SGLang puts usage on content chunks only
    counts = [chunk.usage.completion_tokens for chunk in content]
    steps = [after - before for before, after in zip([0, *counts], counts, strict=False)]
    details = spec_details(sglext)
    # the prefill token, then each verify step's correct drafts + 1, as its own chunk
    assert steps[0] == 1 and len(steps) == 1 + details["spec_verify_ct"]
    assert all(1 <= step <= GAMMA + 1 for step in steps) and max(steps) > 1
    assert sum(step - 1 for step in steps) == details["spec_num_correct_drafts"]
    assert counts[-1] == final.usage.completion_tokens == 40
    assert all(chunk.usage.prompt_tokens == final.usage.prompt_tokens for chunk in content)
    assert all(chunk.usage.total_tokens == chunk.usage.prompt_tokens + chunk.usage.completion_tokens
               for chunk in content)


def reasoning_of(chunk) -> str | None:
    return chunk.choices[0].delta.model_extra["reasoning_content"]


def test_continuous_usage_stats_on_reasoning_chunks_too(spec_server):
    chunks = list(client(spec_server).chat.completions.create(
        model="m", messages=HELLO, max_tokens=300, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"ignore_eos": True, "chat_template_kwargs": {"thinking": True}}))
    deltas = [chunk for chunk in chunks if chunk.choices and (chunk.choices[0].delta.content or reasoning_of(chunk))]
    reasoning = [chunk for chunk in deltas if reasoning_of(chunk)]
    assert reasoning and all(chunk.usage is not None for chunk in deltas)
    counts = [chunk.usage.completion_tokens for chunk in deltas]
    # a step that closes the thinking gives a reasoning and a content chunk, with the same usage
    assert counts == sorted(counts) and counts[-1] == chunks[-1].usage.completion_tokens == 300


def test_continuous_usage_stats_count_each_completion_chunks_tokens_per_choice(spec_server):
    stream = client(spec_server).completions.create(
        model="m", prompt="Once upon a time", temperature=0.8, max_tokens=30, n=2, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"return_token_ids": True, "ignore_eos": True})
    seen: dict[int, list[tuple[int, int]]] = {}  # choice -> (token ids in the chunk, its usage.completion_tokens)
    chunks = list(stream)
    for chunk in chunks[:-1]:
        [choice] = chunk.choices
        ids = choice.model_extra["token_ids"]
        seen.setdefault(choice.index, []).append((len(ids), chunk.usage.completion_tokens))
    assert sorted(seen) == [0, 1]
    for per_chunk in seen.values():
        sent = [count for count, _ in per_chunk]
        assert [usage for _, usage in per_chunk] == [sum(sent[:i + 1]) for i in range(len(sent))]
        assert per_chunk[-1][1] == 30 and max(sent) > 1  # several tokens per chunk: speculative steps
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 60


def test_without_continuous_usage_stats_only_the_last_chunk_has_usage(spec_server):
    for create, ask in ((client(spec_server).chat.completions.create, {"messages": HELLO}),
                        (client(spec_server).completions.create, {"prompt": "Once upon a time"})):
        chunks = list(create(model="m", max_tokens=12, stream=True, stream_options={"include_usage": True},
                             extra_body={"ignore_eos": True}, **ask))
        assert all(chunk.usage is None for chunk in chunks[:-1])
        assert chunks[-1].usage.completion_tokens == 12


def test_n_choices_report_one_spec_detail_each(spec_server):
    reply = client(spec_server).chat.completions.create(
        model="m", messages=HELLO, max_tokens=30, n=2, temperature=0.8,
        extra_body={"ignore_eos": True, "return_spec_tokens_details": True})
    details = reply.model_extra["sglext"]["spec_tokens_details"]
    assert [choice.index for choice in reply.choices] == [0, 1]
    assert len(details) == 2
    assert reply.usage.completion_tokens == 60
    assert all(d["spec_accept_length"] == pytest.approx(30 / d["spec_verify_ct"]) for d in details)


def test_chat_meta_info_per_choice_is_the_samples_meta_info(spec_server):
    reply = client(spec_server).chat.completions.create(
        model="m", messages=HELLO, max_tokens=25, temperature=0,
        extra_body={"ignore_eos": True, "return_meta_info": True, "return_spec_tokens_details": True})
    meta = reply.choices[0].model_extra["meta_info"]
    assert meta["id"] == reply.id
    assert meta["finish_reason"] == {"type": "length", "length": 25}
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (reply.usage.prompt_tokens, 25)
    assert meta["e2e_latency"] > 0
    assert meta["dp_rank"] is None  # one DP rank
    details = spec_details(reply)
    assert details["spec_verify_ct"] > 0
    for key in ("spec_verify_ct", "spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_accept_length"):
        assert meta[key] == details[key]
    plain = client(spec_server).chat.completions.create(model="m", messages=HELLO, max_tokens=5, temperature=0)
    assert "meta_info" not in plain.choices[0].model_extra


def test_chat_meta_info_for_each_of_n_choices(spec_server):
    reply = client(spec_server).chat.completions.create(
        model="m", messages=HELLO, max_tokens=12, n=3, temperature=0.7,
        extra_body={"ignore_eos": True, "return_meta_info": True})
    metas = [choice.model_extra["meta_info"] for choice in reply.choices]
    assert len({meta["id"] for meta in metas}) == 3
    assert sum(meta["completion_tokens"] for meta in metas) == reply.usage.completion_tokens == 36


@pytest.mark.parametrize("flag", ["return_meta_info", "return_token_ids", "return_prompt_token_ids"])
def test_chat_stream_refuses_what_sglang_returns_only_whole(spec_server, flag):
    response = requests.post(spec_server.url("/v1/chat/completions"), timeout=10, json={
        "model": "m", "messages": HELLO, "max_tokens": 5, "stream": True, flag: True})
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "BadRequest" and "not supported with streaming" in body["message"]
    assert f"{flag}=true" in body["message"]
    with pytest.raises(openai.BadRequestError):
        client(spec_server).chat.completions.create(model="m", messages=HELLO, max_tokens=5, stream=True,
                                                     extra_body={flag: True})


@pytest.mark.parametrize("args, dp_ranks", [
    pytest.param([], {None}, id="one-rank"),
    pytest.param(["--tp-size", "2", "--dp-size", "2"], {0, 1}, id="dp-replicas"),
    pytest.param(["--tp-size", "2", "--attn-dp-size", "2"], {None}, id="attention-dp"),
])
def test_meta_info_dp_rank_as_sglang_fills_it(sim, args, dp_ranks):
    server = sim(args)
    seen = set()
    for index in range(4):
        reply = client(server).chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"q{index}"}], max_tokens=3,
            extra_body={"return_meta_info": True})
        seen.add(reply.choices[0].model_extra["meta_info"]["dp_rank"])
    assert seen == dp_ranks


def test_max_completion_tokens_wins_over_max_tokens(spec_server):
    reply = client(spec_server).chat.completions.create(
        model="m", messages=HELLO, max_completion_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    assert reply.usage.completion_tokens == 5


def test_bad_request_is_sglangs_error_response(spec_server):
    response = requests.post(spec_server.url("/v1/chat/completions"), json={"model": "m", "messages": []}, timeout=5)
    assert response.status_code == 400
    body = response.json()
    assert body["object"] == "error" and body["type"] == "BadRequestError" and body["code"] == 400


# --- token ids ---------------------------------------------------------------------------------

def test_chat_token_ids_match_usage_and_repeat(spec_server):
    def ask(**flags):
        return client(spec_server).chat.completions.create(model="m", messages=HELLO, temperature=0,
                                                           extra_body=flags)
    reply = ask(return_token_ids=True)
    choice = reply.choices[0].model_extra
    assert len(choice["prompt_token_ids"]) == reply.usage.prompt_tokens
    assert len(choice["response_token_ids"]) == reply.usage.completion_tokens
    assert choice["response_token_ids"][-1] == choice["matched_stop"]  # a natural end: the EOS id, counted
    assert ask(return_token_ids=True).choices[0].model_extra["response_token_ids"] == choice["response_token_ids"]
    only_prompt = ask(return_prompt_token_ids=True).choices[0].model_extra
    assert only_prompt["prompt_token_ids"] == choice["prompt_token_ids"] and "response_token_ids" not in only_prompt
    assert not {"prompt_token_ids", "response_token_ids"} & set(ask().choices[0].model_extra)


@pytest.mark.parametrize("how", [
    pytest.param({"extra_body": {"return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True}},
                 id="body"),
    pytest.param({"extra_headers": {"x-sglext-return-input-ids": "1", "x-sglext-return-output-ids": "1"}},
                 id="headers"),
])
def test_chat_sglext_ids_streaming_and_whole_agree(spec_server, how):
    messages = [{"role": "user", "content": "Name three prime numbers."}]
    whole = client(spec_server).chat.completions.create(
        model="m", messages=messages, temperature=0, n=2, extra_body={"return_token_ids": True})
    stream = client(spec_server).chat.completions.create(
        model="m", messages=messages, temperature=0, n=2, stream=True, stream_options={"include_usage": True},
        **how)
    chunks = list(stream)
    sglext = chunks[-2].model_extra["sglext"]
    assert sglext["input_ids"] == whole.choices[0].model_extra["prompt_token_ids"]
    assert sglext["output_ids"] == [choice.model_extra["response_token_ids"] for choice in whole.choices]
    assert sum(map(len, sglext["output_ids"])) == chunks[-1].usage.completion_tokens


def test_completions_token_ids_streamed_add_up_to_the_whole(spec_server):
    ask = {"model": "m", "prompt": ["Once upon a time", "In a galaxy"], "temperature": 0, "max_tokens": 20,
           "n": 2, "extra_body": {"return_token_ids": True, "ignore_eos": True}}
    whole = client(spec_server).completions.create(**ask)
    assert [len(choice.model_extra["token_ids"]) for choice in whole.choices] == [20] * 4
    assert len(whole.choices[0].model_extra["prompt_token_ids"]) + len(
        whole.choices[2].model_extra["prompt_token_ids"]) == whole.usage.prompt_tokens
    streamed: dict[int, dict] = {}
    for chunk in client(spec_server).completions.create(**ask, stream=True):
        for choice in chunk.choices:
            got = streamed.setdefault(choice.index, {"ids": [], "text": "", "prompt_ids": []})
            got["ids"] += choice.model_extra["token_ids"]
            got["text"] += choice.text
            got["prompt_ids"].append(choice.model_extra.get("prompt_token_ids"))
    for index, choice in enumerate(whole.choices):
        got = streamed[index]
        assert (got["text"], got["ids"]) == (choice.text, choice.model_extra["token_ids"])
        assert got["prompt_ids"][0] == choice.model_extra["prompt_token_ids"]
        assert all(ids is None for ids in got["prompt_ids"][1:])  # the prompt's ids with the first chunk only


# --- reasoning ---------------------------------------------------------------------------------

def test_thinking_goes_to_reasoning_content_with_a_reasoning_parser(spec_server):
    reply = client(spec_server).chat.completions.create(
        model="m", messages=HELLO, temperature=0, max_tokens=2000,
        extra_body={"chat_template_kwargs": {"thinking": True}})
    message = reply.choices[0].message
    assert message.model_extra["reasoning_content"]
    assert "<think>" not in message.content and "</think>" not in message.content
    stream = client(spec_server).chat.completions.create(
        model="m", messages=HELLO, temperature=0, max_tokens=2000, stream=True,
        extra_body={"chat_template_kwargs": {"thinking": True}})
    kinds = [("reasoning" if (chunk.choices[0].delta.model_extra or {}).get("reasoning_content") else "content")
             for chunk in stream if chunk.choices and chunk.choices[0].delta.content != "" and
             (chunk.choices[0].delta.content or (chunk.choices[0].delta.model_extra or {}).get("reasoning_content"))]
    assert kinds[0] == "reasoning" and kinds[-1] == "content"
    assert kinds == sorted(kinds, key=lambda kind: kind == "content")  # all reasoning before any content


@pytest.mark.parametrize("parser, kwargs, thinks", [
    ("deepseek-r1", None, True),  # reasoning_default "always"
    ("qwen3", None, True), ("qwen3", {"enable_thinking": False}, False),  # "enable_thinking": on unless turned off
    ("deepseek-v4", {"enable_thinking": True}, False), ("deepseek-v4", {"thinking": True}, True),  # explicit
])
def test_a_reasoning_parser_decides_when_the_model_thinks_as_sglangs_does(sim, parser, kwargs, thinks):
    server = sim(["--reasoning-parser", parser])
    reply = client(server).chat.completions.create(
        model="m", messages=HELLO, temperature=0, max_tokens=2000,
        extra_body={"chat_template_kwargs": kwargs} if kwargs else None)
    reasoning = reply.choices[0].message.model_extra["reasoning_content"]
    assert bool(reasoning) == thinks and "<think>" not in reply.choices[0].message.content
    # SGLang's scheduler counts a reasoning request's tokens up to and including </think>
    assert (reply.usage.model_extra["reasoning_tokens"] > 0) == thinks
    assert reply.usage.model_extra["reasoning_tokens"] < reply.usage.completion_tokens


def test_thinking_stays_inline_without_a_reasoning_parser(plain_server):
    reply = client(plain_server).chat.completions.create(
        model="m", messages=HELLO, temperature=0, max_tokens=2000,
        extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    assert reply.choices[0].message.content.startswith("<think>")


# --- completions and /generate -------------------------------------------------------------------

def test_completions_default_to_16_tokens_and_stream_the_same_text(spec_server):
    reply = client(spec_server).completions.create(model="m", prompt="Once upon a time", temperature=0,
                                                    extra_body={"ignore_eos": True})
    assert reply.object == "text_completion"
    assert reply.usage.completion_tokens == 16
    stream = client(spec_server).completions.create(model="m", prompt="Once upon a time", temperature=0, stream=True,
                                                     stream_options={"include_usage": True},
                                                     extra_body={"ignore_eos": True})
    chunks = list(stream)
    text = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
    assert text == reply.choices[0].text
    finishes = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert chunks[-1].usage.completion_tokens == 16


def test_generate_meta_info_matches_output(spec_server):
    body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 33, "temperature": 0,
                                                                     "ignore_eos": True}}
    out = requests.post(spec_server.url("/generate"), json=body, timeout=30).json()
    meta = out["meta_info"]
    assert meta["completion_tokens"] == len(out["output_ids"]) == 33
    assert meta["prompt_tokens"] > 0 and meta["e2e_latency"] > 0
    assert meta["finish_reason"] == {"type": "length", "length": 33}
    assert meta["spec_accept_length"] == pytest.approx(33 / meta["spec_verify_ct"])
    with requests.post(spec_server.url("/generate"), json={**body, "stream": True}, stream=True,
                       timeout=30) as response:
        events = data_events(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks[-1]["text"] == out["text"]  # SGLang streams the text so far
    assert all(chunks[i]["text"].startswith(chunks[i - 1]["text"]) for i in range(1, len(chunks)))
    assert "spec_verify_ct" in chunks[-1]["meta_info"] and "spec_verify_ct" not in chunks[0]["meta_info"]


def test_generate_batch_returns_a_list(plain_server):
    out = requests.post(plain_server.url("/generate"), timeout=30, json={
        "text": ["a b c", "d e f"], "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}).json()
    assert [o["meta_info"]["completion_tokens"] for o in out] == [4, 4]
    assert "spec_verify_ct" not in out[0]["meta_info"]  # no speculation, no spec fields


# --- greedy parity ---------------------------------------------------------------------------

@pytest.mark.parametrize("prompt", ["What is 2+2?", "Write a haiku about GPUs.", "x" * 300])
def test_greedy_output_is_identical_with_and_without_speculation(spec_server, plain_server, prompt):
    messages = [{"role": "user", "content": prompt}]
    outputs = []
    for server in (spec_server, plain_server):
        choice = client(server).chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=200,
                                                        extra_body={"return_token_ids": True}).choices[0]
        outputs.append((choice.message.content, choice.model_extra["response_token_ids"]))
    assert outputs[0] == outputs[1]


def test_sampled_output_varies(plain_server):
    texts = {client(plain_server).chat.completions.create(model="m", messages=HELLO, temperature=1.0,
                                                          max_tokens=30).choices[0].message.content
             for _ in range(3)}
    assert len(texts) > 1


# --- info endpoints --------------------------------------------------------------------------

def test_models_and_model_info(spec_server):
    listed = client(spec_server).models.list()
    assert [model.id for model in listed.data] == ["sim/tiny"]
    info = requests.get(spec_server.url("/model_info"), timeout=5).json()
    assert info["model_path"] == "sim/tiny" and info["is_generation"] is True
    assert requests.get(spec_server.url("/get_model_info"), timeout=5).json() == info
    for method in (requests.get, requests.post):
        assert method(spec_server.url("/flush_cache"), timeout=5).text.startswith("Cache flushed.")
    assert requests.get(spec_server.url("/ready"), timeout=5).status_code == 200


def test_server_info_accept_length_is_absent_until_the_first_step_then_cumulative_per_dp_rank(sim):
    # DP replicas: meta_info names the replica (under attention DP SGLang reports dp_rank None)
    server = sim([*SPEC_ARGS, "--tp-size", "2", "--dp-size", "2"])
    states = requests.get(server.url("/server_info"), timeout=5).json()["internal_states"]
    assert len(states) == 2
    assert all("avg_spec_accept_length" not in state for state in states)
    assert all(state["dspark_info_record"]["verify_num_draft_tokens"] == GAMMA + 1 for state in states)
    served = {0: [0, 0], 1: [0, 0]}  # dp rank -> [tokens after the first, verify steps]
    for index in range(6):
        meta = requests.post(server.url("/generate"), timeout=30, json={
            "text": f"prompt {index}", "sampling_params": {"max_new_tokens": 50, "ignore_eos": True}}
        ).json()["meta_info"]
        served[meta["dp_rank"]][0] += meta["completion_tokens"] - 1
        served[meta["dp_rank"]][1] += meta["spec_verify_ct"]
    info = requests.get(server.url("/get_server_info"), timeout=5).json()
    assert info["version"] == DEFAULT_VERSION and info["dp_size"] == 2
    for rank, state in enumerate(info["internal_states"]):  # in DP rank order, as SGLang's
        tokens, steps = served[rank]
        assert steps > 0  # requests are spread over the ranks
        assert state["avg_spec_accept_length"] == pytest.approx(tokens / steps)


def _metric_samples(server) -> dict:
    text = requests.get(server.url("/metrics"), timeout=5).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted((k, v) for k, v in sample.labels.items() if k != "model_name")))
            samples[key] = sample.value
    return samples


def test_metrics_counters_exist_from_the_startup_warmup_unless_skipped(sim):
    # The pinned SGLang release (http_server._execute_server_warmup) sends itself one greedy /generate of 8 tokens
    # before /health says 200, and its tokenizer counts it; its labelled counters appear only once moved.
    counters = ("sglang:generation_tokens_total", "sglang:spec_verify_calls_total", "sglang:num_requests_total")
    warm = sim([*SPEC_ARGS, "--enable-metrics"])
    samples = _metric_samples(warm)
    unified_false = (("engine_type", "unified"), ("is_streaming", "false"))
    assert samples[("sglang:num_requests_total", unified_false)] == 1
    assert 1 <= samples[("sglang:generation_tokens_total", unified_false)] <= 8
    assert samples[("sglang:spec_verify_calls_total", (("engine_type", "unified"),))] >= 1
    info = requests.get(warm.url("/server_info"), timeout=5).json()
    assert "avg_spec_accept_length" not in info["internal_states"][0]  # its steps close no decode log window

    cold = sim([*SPEC_ARGS, "--enable-metrics", "--skip-server-warmup"])
    text = requests.get(cold.url("/metrics"), timeout=5).text
    assert not [name for name in counters if name in text]  # not even "# TYPE" lines, as in multiprocess mode
    client(cold).chat.completions.create(model="m", messages=HELLO, max_tokens=5, extra_body={"ignore_eos": True})
    assert {name for name, _ in _metric_samples(cold)} >= set(counters)


def test_metrics_count_what_was_served(sim):
    server = sim([*SPEC_ARGS, "--enable-metrics", "--skip-server-warmup"])  # counts from zero
    usage = client(server).chat.completions.create(
        model="m", messages=HELLO, max_tokens=30, extra_body={"ignore_eos": True, "return_spec_tokens_details": True})
    details = spec_details(usage)
    streamed = list(client(server).chat.completions.create(model="m", messages=HELLO, max_tokens=20, stream=True,
                                                            extra_body={"ignore_eos": True}))
    assert streamed
    samples = _metric_samples(server)
    unified = (("engine_type", "unified"),)
    assert samples[("sglang:generation_tokens_total", unified + (("is_streaming", "false"),))] == 30
    assert samples[("sglang:generation_tokens_total", unified + (("is_streaming", "true"),))] == 20
    assert samples[("sglang:prompt_tokens_total", unified + (("is_streaming", "false"),))] == usage.usage.prompt_tokens
    assert samples[("sglang:num_requests_total", unified + (("is_streaming", "true"),))] == 1
    gauge_labels = unified + (("moe_ep_rank", "0"), ("pp_rank", "0"), ("tp_rank", "0"))
    assert 1.0 <= samples[("sglang:spec_accept_length", gauge_labels)] <= GAMMA + 1
    assert 0.0 <= samples[("sglang:spec_accept_rate", gauge_labels)] <= 1.0
    assert details["spec_verify_ct"] > 0


def test_metrics_verify_calls_agree_with_the_steps_streamed(sim):
    server = sim([*SPEC_ARGS, "--enable-metrics", "--skip-server-warmup"])  # counts from zero
    whole = client(server).chat.completions.create(
        model="m", messages=HELLO, max_tokens=30, extra_body={"ignore_eos": True, "return_spec_tokens_details": True})
    chunks = list(client(server).chat.completions.create(
        model="m", messages=HELLO, max_tokens=20, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, "return_spec_tokens_details": True}))
    content_chunks = [chunk for chunk in chunks if chunk.choices and chunk.choices[0].delta.content]
    streamed_verify_ct = spec_details(chunks[-2])["spec_verify_ct"]
    assert len(content_chunks) == 1 + streamed_verify_ct  # the prefill token, then one chunk per verify step
    samples = _metric_samples(server)
    verify_calls = samples[("sglang:spec_verify_calls_total", (("engine_type", "unified"),))]  # no is_streaming
    assert verify_calls == spec_details(whole)["spec_verify_ct"] + streamed_verify_ct
    generated = sum(value for (name, _), value in samples.items() if name == "sglang:generation_tokens_total")
    assert generated == 30 + 20  # so generated / verify_calls is the per-request accept length definition


def test_metrics_show_a_request_in_flight_then_what_it_cost(sim):
    # SGLang's scheduler gauges (running requests, KV tokens held), its HTTP middleware's counters by route and
    # its tokenizer's latency histograms, as the pinned SGLang release's front end sends them.
    server = sim([*SPEC_ARGS, "--enable-metrics", "--skip-server-warmup"], env={"DSPARK_SIM_DECODE_STEP_MS": "40"})
    gauge = (("engine_type", "unified"), ("moe_ep_rank", "0"), ("pp_rank", "0"), ("tp_rank", "0"))
    route = (("endpoint", "/v1/chat/completions"), ("method", "POST"))
    stream = client(server).chat.completions.create(model="m", messages=HELLO, max_tokens=20, stream=True,
                                                    stream_options={"include_usage": True},
                                                    extra_body={"ignore_eos": True})
    chunks = [next(stream)]
    during = _metric_samples(server)
    chunks += list(stream)
    prompt_tokens = chunks[-1].usage.prompt_tokens
    assert during[("sglang:num_running_reqs", gauge)] == 1
    assert during[("sglang:num_used_tokens", gauge)] >= prompt_tokens
    assert during[("sglang:token_usage", gauge)] == during[("sglang:num_used_tokens", gauge)] / (1 << 24)
    assert during[("sglang:http_requests_active", route)] == 1
    after = _metric_samples(server)
    assert after[("sglang:num_running_reqs", gauge)] == 0 and after[("sglang:num_used_tokens", gauge)] == 0
    assert after[("sglang:http_responses_total", route + (("status_code", "200"),))] == 1
    assert after[("sglang:http_requests_active", route)] == 0
    unified = (("engine_type", "unified"),)
    assert after[("sglang:inter_token_latency_seconds_count", unified)] == 20 - 1  # each token after the first
    assert after[("sglang:generation_tokens_histogram_sum", unified)] == 20
    assert after[("sglang:prompt_tokens_histogram_sum", unified)] == prompt_tokens
    per_token = ("sglang:request_time_per_output_token_seconds_sum", unified + (("is_streaming", "true"),))
    assert 0.04 / 3 < after[per_token] < 0.04 * 2  # a 40 ms step yields one to three tokens
    assert after[("sglang:queue_time_seconds_count", gauge)] == 1


def test_metrics_have_no_verify_calls_without_speculation(sim):
    server = sim(["--enable-metrics"])
    client(server).chat.completions.create(model="m", messages=HELLO, max_tokens=5, extra_body={"ignore_eos": True})
    names = {name for name, _ in _metric_samples(server)}
    assert "sglang:generation_tokens_total" in names
    assert "sglang:spec_verify_calls_total" not in names


def test_metrics_only_with_enable_metrics(plain_server):
    assert requests.get(plain_server.url("/metrics"), timeout=5).status_code == 404


def test_health_is_503_while_booting(sim):
    server = sim([], env={"DSPARK_SIM_BOOT_SECONDS": "1.5"}, wait=False)
    codes = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and 200 not in codes:
        codes.append(server.health())
        time.sleep(0.05)
    answered = [code for code in codes if code is not None]
    assert answered[0] == 503 and answered[-1] == 200
    assert "The server is fired up and ready to roll!" in server.log()


def test_api_key_guards_everything_but_probes(sim):
    server = sim(["--api-key", "sekret"])
    assert requests.get(server.url("/v1/models"), timeout=5).status_code == 401
    assert requests.get(server.url("/v1/models"), headers={"Authorization": "Bearer sekret"},
                        timeout=5).status_code == 200
    assert requests.get(server.url("/health"), timeout=5).status_code == 200


# --- many streams at once --------------------------------------------------------------------

async def _stream_many(url: str, count: int) -> list[int]:
    async def one(session: aiohttp.ClientSession, index: int) -> int:
        body = {"model": "m", "messages": [{"role": "user", "content": f"question {index}"}], "max_tokens": 24,
                "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
        async with session.post(url, json=body) as response:
            usage = None
            async for line in response.content:
                if line.startswith(b"data: {") and b'"usage": {' in line:
                    usage = json.loads(line[len(b"data: "):])["usage"]["completion_tokens"]
            return usage

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        return await asyncio.gather(*(one(session, index) for index in range(count)))


def test_carries_hundreds_of_concurrent_streams(spec_server):
    completions = asyncio.run(_stream_many(spec_server.url("/v1/chat/completions"), 300))
    assert completions == [24] * 300


def test_requests_beyond_max_running_requests_wait_in_the_queue(sim):
    server = sim(["--max-running-requests", "2"], env={"DSPARK_SIM_DECODE_STEP_MS": "20"})

    async def four_requests():
        async with aiohttp.ClientSession() as session:
            async def one(index):
                async with session.post(server.url("/generate"), json={
                        "text": f"p{index}", "sampling_params": {"max_new_tokens": 30, "ignore_eos": True}}) as r:
                    return (await r.json())["meta_info"]["completion_tokens"]

            async def watch():
                seen = set()
                for _ in range(100):
                    async with session.get(server.url("/server_info")) as r:
                        state = (await r.json())["internal_states"][0]
                    seen.add((state["num_running_reqs"], state["num_queue_reqs"]))
                    if (2, 2) in seen:
                        break
                    await asyncio.sleep(0.02)
                return seen

            watcher = asyncio.create_task(watch())
            done = await asyncio.gather(*(one(index) for index in range(4)))
            return done, await watcher

    completions, seen = asyncio.run(four_requests())
    assert completions == [30] * 4
    assert (2, 2) in seen  # two running, two waiting
    assert all(running <= 2 for running, _ in seen)
