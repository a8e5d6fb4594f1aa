"""The speculative model: each draft is accepted with probability alpha given the previous one was,
so a verify step sends accepted + 1 tokens and E[accept length] = (1 - alpha^(g+1)) / (1 - alpha),
g being the most drafts a step can accept. Measured the way users measure it: from sglext."""

from __future__ import annotations

import math

import openai
import pytest

from tests.sim_fixtures import sim  # noqa: F401 (sim is a fixture)

REQUESTS, TOKENS = 8, 400


def expected_accept_length(alpha: float, most: int) -> tuple[float, float]:
    """Mean and standard deviation of accepted + 1 per verify step."""
    probabilities = [alpha ** k * (1 - alpha) for k in range(most)] + [alpha ** most]
    mean = sum((k + 1) * p for k, p in enumerate(probabilities))
    variance = sum((k + 1) ** 2 * p for k, p in enumerate(probabilities)) - mean ** 2
    return mean, math.sqrt(variance)


def measure(server) -> tuple[int, int, int]:
    """(tokens sent by verify steps, verify steps, correct drafts) over REQUESTS distinct prompts."""
    client = openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0)
    tokens = steps = correct = 0
    for index in range(REQUESTS):
        reply = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"question number {index}"}], max_tokens=TOKENS,
            temperature=0,  # sampling lowers acceptance (sglang_sim/speculation.py)
            extra_body={"ignore_eos": True, "return_spec_tokens_details": True})
        details = reply.model_extra["sglext"]["spec_tokens_details"]
        assert details["spec_accept_length"] == pytest.approx(reply.usage.completion_tokens / details["spec_verify_ct"])
        tokens += reply.usage.completion_tokens - 1  # the first token comes from prefill
        steps += details["spec_verify_ct"]
        correct += details["spec_num_correct_drafts"]
    return tokens, steps, correct


@pytest.mark.parametrize("alpha, args, most", [
    pytest.param(0.7, ["--speculative-algorithm", "DSPARK", "--speculative-dspark-block-size", "3"], 3,
                 id="dspark-alpha0.7-gamma3"),
    pytest.param(0.5, ["--speculative-algorithm", "DSPARK"], 7, id="dspark-alpha0.5-default-gamma7"),
    pytest.param(0.9, ["--speculative-algorithm", "DFLASH", "--speculative-dflash-block-size", "6"], 5,
                 id="dflash-alpha0.9-block6"),
    pytest.param(0.6, ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "2",
                       "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"], 2,
                 id="eagle-alpha0.6-steps2"),
])
def test_accept_length_matches_alpha_and_block_size(sim, alpha, args, most):
    server = sim([*args, "--speculative-draft-model-path", "sim/draft"],
                 env={"DSPARK_SIM_ACCEPT_PROB": str(alpha), "DSPARK_SIM_DECODE_STEP_MS": "0"})
    tokens, steps, correct = measure(server)
    mean, sd = expected_accept_length(alpha, most)
    truncation = REQUESTS * most / steps  # the last step of each request may be cut by max_tokens
    assert abs(tokens / steps - mean) <= 4 * sd / math.sqrt(steps) + truncation
    assert correct == tokens - steps  # every step's tokens are its correct drafts plus the bonus token


def test_same_seed_same_everything_other_seed_other_text(sim):
    args = ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", "sim/draft"]
    replies = []
    for seed in ("7", "7", "8"):
        server = sim(args, env={"DSPARK_SIM_SEED": seed})
        client = openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0)
        reply = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "same question"}], max_tokens=100, temperature=0,
            extra_body={"return_spec_tokens_details": True})
        replies.append((reply.choices[0].message.content, reply.model_extra["sglext"]["spec_tokens_details"]))
    assert replies[0] == replies[1]
    assert replies[0][0] != replies[2][0]
