"""Sampling parameters under speculation: the simulator's sampler honours top_p and the penalties as SGLang's does,
and the accept suite's tests see each one take effect, and catch a speculative path that ignores top_p."""

from __future__ import annotations

import itertools

import pytest
import requests
from dspark_ci.sglang_sim.gpqa_answers import GpqaAnswerKey
from dspark_ci.sglang_sim.textgen import ARGMAX_PROBABILITY, Ask, Penalties, Persona, reply_tokens
from dspark_ci.suites.accept_detail import repeated_words

from tests.sim_fixtures import FAST_SIM_ENV, sim  # noqa: F401 (``sim`` is a fixture)
from tests.test_accept_positions import accept

PERSONA = Persona(0, 0.7, GpqaAnswerKey({}))
SAMPLING_TESTS = ("test_top_p_near_zero_is_greedy", "test_top_k_one_is_greedy",
                  "test_penalty_cuts_repetition[frequency_penalty]", "test_penalty_cuts_repetition[presence_penalty]",
                  "test_penalty_cuts_repetition[repetition_penalty]")


def text(prompt: str, penalties: Penalties = Penalties(), key: str = "greedy", tokens: int = 64) -> str:
    ask = Ask(prompt, prompt, key, ignore_eos=True, penalties=penalties)
    return "".join(itertools.islice(reply_tokens(PERSONA, ask), tokens))


@pytest.mark.parametrize("penalties, fewer", [
    (Penalties(frequency=2.0), True), (Penalties(presence=2.0), True), (Penalties(repetition=2.0), True),
    (Penalties(presence=-2.0), False),  # a negative penalty makes repeats more likely, as in SGLang
])
def test_penalties_change_how_often_the_simulated_model_repeats_itself(penalties, fewer):
    prompts = [f"Tell me about topic {i}." for i in range(8)]
    plain = repeated_words([text(p) for p in prompts])
    penalised = repeated_words([text(p, penalties) for p in prompts])
    assert (penalised < plain) if fewer else (penalised > plain), (plain, penalised)
    assert text(prompts[0], penalties) == text(prompts[0], penalties)  # greedy stays deterministic


def test_no_penalty_leaves_the_text_as_it_was():
    assert text("Hello there.", Penalties(0.0, 0.0, 1.0)) == text("Hello there.")


def test_top_p_at_or_below_the_argmax_probability_samples_the_argmax_alone(sim):
    """SGLang's top-p keeps the argmax and drops whatever lies past top_p: at or below the argmax's probability only
    the argmax is left, the greedy text; above it the request samples."""
    server = sim(["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", "sim/draft",
                  "--speculative-dspark-block-size", "7"], env=FAST_SIM_ENV)

    def reply(**sampling) -> str:
        body = {"model": "sim/tiny", "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 12,
                **sampling}
        response = requests.post(server.url("/v1/chat/completions"), json=body, timeout=30)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["message"]["content"]

    greedy = reply(temperature=0)
    assert reply(temperature=0.7, top_p=ARGMAX_PROBABILITY) == reply(temperature=0.7, top_p=1e-6) == greedy
    assert reply(temperature=0.7, top_p=ARGMAX_PROBABILITY + 0.05) != greedy
    bad = requests.post(server.url("/v1/chat/completions"), timeout=30, json={
        "model": "sim/tiny", "messages": [{"role": "user", "content": "x"}], "presence_penalty": 3})
    assert bad.status_code == 400 and "presence_penalty must be in [-2, 2]" in bad.text


@pytest.mark.parametrize("fault, failed", [("", set()), ("spec_ignores_top_p", {"test_top_p_near_zero_is_greedy"})])
def test_accept_suite_sees_each_sampling_parameter_take_effect_under_speculation(tmp_path, fault, failed):
    code, output, _, log = accept(tmp_path, {"DSPARK_SIM_FAULTS": fault}, "num_requests=8")
    outcomes = {t["nodeid"].rsplit("::", 1)[-1]: t for t in output["tests"]}
    assert {name for name in SAMPLING_TESTS if outcomes[name]["outcome"] == "failed"} == failed, log
    assert all(outcomes[name]["outcome"] == "passed" for name in SAMPLING_TESTS if name not in failed), log
    if failed:
        assert "top_p is ignored under speculation" in outcomes["test_top_p_near_zero_is_greedy"]["message"]
        assert code != 0
