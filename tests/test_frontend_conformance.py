"""The simulator's HTTP layer held to the pinned SGLang release's own, on the same requests.

Two servers with the same argv and the same simulated engine: the embedded simulator
(``python -m dspark_ci.sglang_sim``) and SGLang's own front end in front of it (``--server sglang-frontend``: SGLang's
FastAPI app, TokenizerManager, OpenAI serving layer and DetokenizerManager). The same requests go to both; what comes
back is compared by shape: keys and value types (recursively), the sequence of streamed chunk kinds, finish reasons,
usage arithmetic and token counts, ``/server_info`` keys (and ``internal_states[0]``'s), ``/metrics`` families with
their types and label sets. Every remaining difference is listed in ``KNOWN_DIFFERENCES`` with why
(sglang_sim/README.md has the same list); a listed one that no longer shows up fails too, so the list only shrinks
as the simulator catches up.
Skipped, with the command, where the front-end venv is not installed (``bash .ci/sglang-frontend.sh``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from dspark_ci.ground.sglang.release import DEFAULT_VERSION
from prometheus_client.parser import text_string_to_metric_families

from dspark_ci.suite_runner import SYNTHETIC_GPQA
from tests.simulator_process import FRONTEND_MISSING, frontend_venv, running_simulator

MODEL = "deepseek-ai/DeepSeek-V4-Flash"
ARGS = ("--device", "cuda", "--tp-size", "8", "--speculative-algorithm", "DSPARK",
        "--speculative-dspark-block-size", "3",
        "--enable-metrics", "--reasoning-parser", "deepseek-v4")
ENV = {"DSPARK_SIM_DECODE_STEP_MS": "2", "DSPARK_SIM_PREFILL_MS_PER_TOKEN": "0", "DSPARK_SIM_SEED": "0",
       "DSPARK_SIM_GPQA_PATH": str(SYNTHETIC_GPQA)}
# Words the simulator's own prose uses: in the front end's vocabulary, so both engines read the same prompt.
PROMPT = "Consider the energy of the system and compute the rate"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "temperature": 0,
        "return_spec_tokens_details": True}
# deepseek-v4's parser: the model reasons when the request says thinking=True (its reasoning_default).
THINKING = {**CHAT, "chat_template_kwargs": {"thinking": True}, "max_tokens": 4000}

# Why each remaining difference stays, -> (where, what) as ``differences`` reports them (where: a request, or
# "server_info", "internal_states", "metrics"). sglang_sim/README.md "Differences from SGLang's own front end".
KNOWN_GROUPS: dict[str, tuple[tuple[str, str], ...]] = {}
KNOWN_DIFFERENCES: dict[tuple[str, str], str] = {key: why for why, keys in KNOWN_GROUPS.items() for key in keys}


def shape(value: Any) -> Any:
    """Keys and leaf types, recursively (a list by its first element)."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__ if value is not None else "null"


def diff_shapes(ours: Any, theirs: Any, path: str = "") -> Iterator[str]:
    """``path: simulator X, SGLang Y`` for each place the two shapes part (a null on either side matches any type:
    SGLang reports null for what it has not measured yet)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in sorted(set(ours) | set(theirs)):
            where = f"{path}.{key}" if path else key
            if key not in ours:
                yield f"{where}: missing in the simulator"
            elif key not in theirs:
                yield f"{where}: only in the simulator"
            else:
                yield from diff_shapes(ours[key], theirs[key], where)
    elif isinstance(ours, list) and isinstance(theirs, list):
        if ours and theirs:
            yield from diff_shapes(ours[0], theirs[0], path + "[]")
    elif ours != theirs and "null" not in (ours, theirs) and {ours, theirs} != {"int", "float"}:
        yield f"{path}: simulator {ours}, SGLang {theirs}"


def stream_events(base_url: str, path: str, body: dict) -> list[dict]:
    with requests.post(base_url + path, json={**body, "stream": True}, stream=True, timeout=60) as response:
        response.raise_for_status()
        lines = [line[len(b"data: "):] for line in response.iter_lines() if line.startswith(b"data: ")]
    return [json.loads(line) for line in lines if line != b"[DONE]"]


def chunk_kind(chunk: dict) -> str:
    """What a streamed chat chunk carries: role / content / finish / sglext / usage (several joined by +)."""
    choice = (chunk.get("choices") or [{}])[0]
    delta = choice.get("delta") or {}
    kinds = [name for name, present in (("role", delta.get("role")), ("content", delta.get("content")),
                                        ("reasoning", delta.get("reasoning_content")),
                                        ("finish", choice.get("finish_reason")), ("sglext", chunk.get("sglext")),
                                        ("usage", chunk.get("usage"))) if present]
    return "+".join(kinds) or "empty"


def collapsed(kinds: list[str]) -> list[str]:
    """Runs of the same kind as one (how many content chunks there are is the engine's, not the layout's)."""
    return [kind for i, kind in enumerate(kinds) if i == 0 or kinds[i - 1] != kind]


def exchange(base_url: str) -> dict[str, Any]:
    """The same requests, in the same order, against one server."""
    post = lambda path, body: requests.post(base_url + path, json=body, timeout=60).json()  # noqa: E731
    streamed = stream_events(base_url, "/v1/chat/completions", {
        **CHAT, "max_tokens": 12, "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    thinking_stream = stream_events(base_url, "/v1/chat/completions", {
        **THINKING, "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    return {
        "chat": post("/v1/chat/completions", {**CHAT, "max_tokens": 12}),
        "chat_thinking": post("/v1/chat/completions", THINKING),
        "chat_thinking_stream": thinking_stream,
        "chat_natural_stop": post("/v1/chat/completions", {**CHAT, "max_tokens": 4000}),
        "chat_stream": streamed,
        "generate": post("/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 12, "temperature": 0}}),
        "completions": post("/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 8,
                                                "temperature": 0}),
        "server_info": requests.get(base_url + "/server_info", timeout=60).json(),
        "metrics": requests.get(base_url + "/metrics", timeout=60).text,
    }


def metric_labels(text: str) -> dict[str, tuple[str, set[str]]]:
    """Family -> its type and label names (over every sample)."""
    families: dict[str, tuple[str, set[str]]] = {}
    for family in text_string_to_metric_families(text):
        _, labels = families.setdefault(family.name, (family.type, set()))
        for sample in family.samples:
            labels.update(name for name in sample.labels if name not in ("le", "quantile"))
    return families


def differences(ours: dict, theirs: dict) -> dict[tuple[str, str], str]:
    """(where, what) -> the difference, over everything ``exchange`` brought back."""
    found: dict[tuple[str, str], str] = {}
    for name in ("chat", "chat_natural_stop", "chat_thinking", "generate", "completions"):
        for line in diff_shapes(shape(ours[name]), shape(theirs[name])):
            found[(name, line.split(":")[0])] = line
    for line in diff_shapes(shape(ours["chat_stream"][1]), shape(theirs["chat_stream"][1])):
        found[("chat_stream content chunk", line.split(":")[0])] = line
    for name in ("chat_stream", "chat_thinking_stream"):
        kinds = [collapsed([chunk_kind(c) for c in side[name]]) for side in (ours, theirs)]
        if kinds[0] != kinds[1]:
            found[(name, "chunk sequence")] = f"simulator {kinds[0]}, SGLang {kinds[1]}"
    info = [side["server_info"] for side in (ours, theirs)]
    for key in sorted(set(info[0]) ^ set(info[1])):
        found[("server_info", key)] = "missing in the simulator" if key in info[1] else "only in the simulator"
    states = [set(side["internal_states"][0]) for side in info]
    for key in sorted(states[0] ^ states[1]):
        found[("internal_states", key)] = "missing in the simulator" if key in states[1] else "only in the simulator"
    metrics = [metric_labels(side["metrics"]) for side in (ours, theirs)]
    for family in sorted(set(metrics[0]) | set(metrics[1])):
        if family not in metrics[0] or family not in metrics[1]:
            found[("metrics", family)] = "missing in the simulator" if family in metrics[1] else "only in the simulator"
        elif metrics[0][family] != metrics[1][family]:
            (ours_type, ours_labels), (their_type, their_labels) = metrics[0][family], metrics[1][family]
            found[("metrics", family)] = f"{ours_type} labelled {sorted(ours_labels)} in the simulator, " \
                                         f"{their_type} labelled {sorted(their_labels)} by SGLang"
    return found


@pytest.fixture(scope="module")
def both(tmp_path_factory) -> dict[str, dict]:
    python = frontend_venv()
    if python is None:
        pytest.skip(FRONTEND_MISSING)
    logs = tmp_path_factory.mktemp("conformance")
    with contextlib.ExitStack() as stack:
        simulator = stack.enter_context(running_simulator(ENV, ARGS, model=MODEL, log_path=logs / "sim.log"))
        frontend = stack.enter_context(running_simulator(ENV, ARGS, model=MODEL, log_path=logs / "frontend.log",
                                                         boot_timeout=600, frontend_python=python))
        exchanged = {"simulator": exchange(simulator), "sglang": exchange(frontend)}
    (logs / "exchanged.json").write_text(json.dumps(exchanged, indent=1))  # for a person reading a failure
    return exchanged


def test_finish_reasons_and_token_counts_agree(both):
    ours, theirs = both["simulator"], both["sglang"]
    for name in ("chat", "chat_natural_stop"):
        assert [c["finish_reason"] for c in ours[name]["choices"]] == \
               [c["finish_reason"] for c in theirs[name]["choices"]], name
        assert ours[name]["usage"]["prompt_tokens"] == theirs[name]["usage"]["prompt_tokens"], \
            f"{name}: the chat template's prompt token count differs"
        assert ours[name]["usage"]["completion_tokens"] == theirs[name]["usage"]["completion_tokens"], name
        for side in (ours, theirs):
            usage = side[name]["usage"]
            assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert ours["chat_natural_stop"]["choices"][0]["finish_reason"] == "stop"
    assert ours["generate"]["meta_info"]["finish_reason"] == theirs["generate"]["meta_info"]["finish_reason"]


def test_continuous_usage_grows_by_each_chunk_on_both(both):
    for side in both.values():
        chunks = side["chat_stream"]
        counts = [c["usage"]["completion_tokens"] for c in chunks if c.get("usage") and c.get("choices")]
        assert counts == sorted(counts) and counts, "continuous usage must grow chunk by chunk"
        final = [c["usage"] for c in chunks if c.get("usage") and not c.get("choices")]
        assert final and final[-1]["completion_tokens"] == 12


def streamed_text(chunks: list[dict], field: str) -> str:
    return "".join((c["choices"][0]["delta"].get(field) or "") for c in chunks if c.get("choices"))


def test_reasoning_content_and_reasoning_tokens_agree_streamed_and_not(both):
    ours, theirs = both["simulator"], both["sglang"]
    message = [side["chat_thinking"]["choices"][0]["message"] for side in (ours, theirs)]
    assert message[0]["reasoning_content"] and "<think>" not in message[0]["content"], \
        "the simulated model thinks, and the parser takes its thinking out of the content"
    assert message[0]["reasoning_content"] == message[1]["reasoning_content"]
    assert message[0]["content"] == message[1]["content"]
    usage = [side["chat_thinking"]["usage"] for side in (ours, theirs)]
    assert usage[0] == usage[1] and usage[0]["reasoning_tokens"] > 0, "reasoning tokens counted up to </think>"
    assert usage[0]["completion_tokens_details"] == {"reasoning_tokens": usage[0]["reasoning_tokens"]}
    for side, reply in ((ours, message[0]), (theirs, message[1])):
        chunks = side["chat_thinking_stream"]
        assert streamed_text(chunks, "reasoning_content") == reply["reasoning_content"]
        assert streamed_text(chunks, "content") == reply["content"]
        assert chunks[-1]["usage"]["reasoning_tokens"] == usage[0]["reasoning_tokens"]


def test_every_difference_from_sglang_is_known_and_explained(both):
    found = differences(both["simulator"], both["sglang"])
    unexplained = {key: line for key, line in found.items() if key not in KNOWN_DIFFERENCES}
    gone = [key for key in KNOWN_DIFFERENCES if key not in found]
    assert not unexplained, f"the simulator differs from SGLang {DEFAULT_VERSION}'s own front end:\n" + "\n".join(
        f"  {where}: {what}: {line}" if not line.startswith(what) else f"  {where}: {line}"
        for (where, what), line in sorted(unexplained.items()))
    assert not gone, f"listed differences no longer seen (remove them from KNOWN_DIFFERENCES): {gone}"


DP_ARGS = ("--device", "cuda", "--tp-size", "4", "--dp-size", "2", "--enable-dp-attention", "--enable-dp-lm-head",
           "--speculative-algorithm", "DSPARK", "--speculative-dspark-block-size", "3")


def dp_internal_states(base_url: str) -> list[dict]:
    """/server_info's internal_states after four requests (spread over the DP ranks round-robin)."""
    for index in range(4):
        requests.post(base_url + "/generate", timeout=60, json={
            "text": f"{PROMPT} {index}", "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}}
        ).raise_for_status()
    return requests.get(base_url + "/server_info", timeout=60).json()["internal_states"]


def test_an_attention_dp_cell_reports_one_internal_state_per_dp_rank_on_both(tmp_path):
    python = frontend_venv()
    if python is None:
        pytest.skip(FRONTEND_MISSING)
    with running_simulator(ENV, DP_ARGS, model=MODEL, log_path=tmp_path / "sim.log") as simulator:
        ours = dp_internal_states(simulator)
    with running_simulator(ENV, DP_ARGS, model=MODEL, log_path=tmp_path / "frontend.log", boot_timeout=600,
                           frontend_python=python) as frontend:
        theirs = dp_internal_states(frontend)
    assert len(ours) == len(theirs) == 2, "one entry per DP rank"
    # The same seed, prompts and round-robin: each rank's accept length is the same figure on both.
    assert [state["avg_spec_accept_length"] for state in ours] == \
           [state["avg_spec_accept_length"] for state in theirs]
    assert len({state["avg_spec_accept_length"] for state in theirs}) == 2, "each rank reports its own figures"
