"""The pinned SGLang release's own bench_serving beside the speed suite (bench/sglang_bench_serving.py).

Runs in the SGLang venv that ``bash .ci/sglang-bench-serving.sh`` makes (``.ci/run`` installs it;
$DSPARK_SGLANG_PYTHON, else the repo's .cache/sglang-venv). Skipped, with the reason, only where no such
interpreter exists: a venv that lacks bench_serving's packages fails with the command that installs them.
"""

from __future__ import annotations

import json
import random
import re
import statistics

import pytest
from dspark_ci.ground.sglang.release import DEFAULT_VERSION
from dspark_ci.sglang_sim.openai_api import render_chat
from dspark_ci.sglang_sim.tokenizer import count_tokens, tokenize
from dspark_ci.suites.speed import random_text

from bench.sglang_bench_serving import build_tokenizer, count_with_tokenizer, find_python, run_bench_serving
from tests.simulator_process import SPECULATIVE_ARGS, running_simulator

STEP_MS = 20.0
OUTPUT_LEN = 16
REQUESTS, CONCURRENCY = 8, 4

# Texts where a tokenizer could split differently from sglang_sim/tokenizer.py: words over six characters,
# runs and kinds of whitespace (Python's \s includes U+001C..U+001F, the tokenizers library's does not),
# non-ASCII letters, astral characters, combining marks, special-token look-alikes, the chat markers.
EDGE_TEXTS = ["", " ", "   ", "\n", "Hello, understanding", "a  b   c", " leading", "trailing  ", "\t\ttabbed\n",
              "\x1c\x1d\x1e\x1fx y\x1f", "\x85next\u2028line\u2029para", "\u00a0nbsp\u2003em\u3000ideographic",
              "日本語のテキストです、とても長い文章", "emoji 😀😀😀😀😀😀😀 x", "e\u0301\u0301\u0301\u0301\u0301\u0301x",
              "[UNK] a[UNK]b <s></s> <|endoftext|>", "<|user|>\nhi\n<|assistant|>\n", "supercalifragilistic",
              "x" * 40, "mixed\r\nline\rends\v\f"]
ALPHABET = "abcXYZ0,.;-_'\"[]<>|日本😀é\u0301 \t\n\r\x0b\x0c\x1c\x1f\x85\xa0\u2003\u3000"


def random_texts(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 60))) for _ in range(count)]


@pytest.fixture(scope="module")
def python() -> str:
    found = find_python()
    if found is None:
        pytest.skip("no SGLang venv: set DSPARK_SGLANG_PYTHON or run `bash .ci/sglang-bench-serving.sh`")
    return found


@pytest.fixture(scope="module")
def tokenizer(python, tmp_path_factory):
    return build_tokenizer(python, tmp_path_factory.mktemp("bench-serving") / "tokenizer")


def test_the_tokenizer_counts_as_the_simulator(python, tokenizer):
    texts = EDGE_TEXTS + random_texts(300) + [random_text(random.Random(n), n) for n in (1, 7, 300)]
    chats = [[{"role": "user", "content": text}] for text in EDGE_TEXTS[:8]]
    chats.append([{"role": "system", "content": "be brief"}, {"role": "user", "content": "what  is\n2+2?"}])
    counted = count_with_tokenizer(python, tokenizer, texts, chats)
    assert counted.texts == [count_tokens(text) for text in texts]
    assert counted.rendered == [render_chat(chat)[0] for chat in chats]
    assert counted.chats == [count_tokens(render_chat(chat)[0]) for chat in chats]


def test_bench_serving_runs_our_traffic_and_counts_per_token(python, tmp_path):
    prompts = [random_text(random.Random(i), 30 + 5 * i) for i in range(REQUESTS)]
    prompt_lens = [count_tokens(render_chat([{"role": "user", "content": p}])[0]) for p in prompts]
    log = tmp_path / "emission.jsonl"
    env = {"DSPARK_SIM_EMISSION_LOG": str(log), "DSPARK_SIM_DECODE_STEP_MS": str(STEP_MS)}
    with running_simulator(env=env, args=SPECULATIVE_ARGS) as url:
        # prompt_lens: the run fails unless the server counted our prompts, in our order.
        run = run_bench_serving(python, url, "sim/model", prompts, OUTPUT_LEN, CONCURRENCY, 2, tmp_path / "bench",
                                prompt_lens=prompt_lens)
    metrics, requests = run.metrics, run.requests
    assert run.sglang_version == DEFAULT_VERSION
    assert metrics.completed == REQUESTS and re.search(rf"^Successful requests: +{REQUESTS} *$", run.summary, re.M)
    assert [r.output_len for r in requests] == [OUTPUT_LEN] * REQUESTS and not any(r.error for r in requests)

    # TPOT at the simulator's pace: one verify step per STEP_MS emits accept_length tokens on average.
    assert metrics.accept_length is not None and metrics.accept_length > 1.5
    pace_ms = STEP_MS / metrics.accept_length
    assert 0.6 * pace_ms < metrics.mean_tpot_ms < 1.6 * pace_ms, (metrics.mean_tpot_ms, pace_ms)

    # ITL per token: each chunk gap is spread over the chunk's tokens (counted by our tokenizer, as the
    # simulator counts them), so the mean ITL is the mean chunk gap over the accept length, not the gap.
    gaps = [gap for r in requests for gap in r.itl_s]
    assert statistics.fmean(gaps) * 1000 == pytest.approx(STEP_MS, rel=0.25)
    assert metrics.mean_itl_ms == pytest.approx(statistics.fmean(gaps) * 1000 / metrics.accept_length, rel=0.3)
    per_token = [gap / count_tokens(chunk) for r in requests for gap, chunk in zip(r.itl_s, r.text_chunks, strict=False)
                 for _ in range(count_tokens(chunk))]
    assert metrics.mean_itl_ms == pytest.approx(statistics.fmean(per_token) * 1000, rel=1e-9)

    # start_time is on the server's clock (CLOCK_MONOTONIC): each request reached the simulator after it was
    # sent, and got its first token before bench_serving saw it; the stream ends after the last gap.
    server = [json.loads(line) for line in log.read_text().splitlines()]
    for r in requests:
        assert r.latency_s >= r.ttft_s + sum(r.itl_s)
        assert any(r.start_time <= s["arrival_monotonic"] and s["first_token_monotonic"] <= r.start_time + r.ttft_s
                   for s in server), f"request {r.index}: no server arrival between its send and first chunk"


def test_the_simulators_prompt_count_is_its_tokenizers():
    """Every request's prompt_tokens (``count_tokens``, the fast count) are the pieces its tokenizer splits it into."""
    texts = EDGE_TEXTS + random_texts(3000, seed=1) + [random_text(random.Random(n), n) for n in (1, 7, 300)]
    assert [count_tokens(text) for text in texts] == [len(tokenize(text)) for text in texts]
