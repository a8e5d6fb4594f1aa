"""The simulator's noise model: off by default, per-boot and per-request draws when asked, GPQA per question."""

from __future__ import annotations

import statistics

from dspark_ci.sglang_sim.gpqa_answers import GpqaAnswerKey
from dspark_ci.sglang_sim.noise import BootNoise
from dspark_ci.sglang_sim.sim_config import SimConfig
from dspark_ci.sglang_sim.textgen import Ask, Persona, _answers_right, _rng


def test_every_knob_defaults_to_no_noise():
    noise = BootNoise.of(SimConfig.from_env({}))
    assert (noise.step_factor, noise.alpha(0.7), noise.request_factor()) == (1.0, 0.7, 1.0)


def test_boots_differ_by_their_own_draws_and_repeat_with_a_boot_seed():
    env = {"DSPARK_SIM_STEP_JITTER_BOOT": "0.02", "DSPARK_SIM_ACCEPT_DRIFT_BOOT": "0.01"}
    factors = [BootNoise.of(SimConfig.from_env(env)).step_factor for _ in range(400)]
    assert 0.015 < statistics.stdev(factors) < 0.025 and len(set(factors)) == 400
    seeded = {**env, "DSPARK_SIM_BOOT_SEED": "7"}
    assert BootNoise.of(SimConfig.from_env(seeded)) .step_factor == BootNoise.of(SimConfig.from_env(seeded)).step_factor


def test_requests_of_one_boot_draw_their_own_step_factor():
    noise = BootNoise.of(SimConfig.from_env({"DSPARK_SIM_STEP_JITTER_REQUEST": "0.1", "DSPARK_SIM_BOOT_SEED": "1"}))
    factors = [noise.request_factor() for _ in range(500)]
    assert 0.08 < statistics.stdev(factors) < 0.12


def _share_right(persona: Persona, question: str, samples: int) -> float:
    fate = lambda: _rng("gpqa", persona.seed, question)  # noqa: E731 (as textgen seeds it)
    return statistics.fmean(_answers_right(persona, Ask(f"p{i}", question, "greedy"), fate()) for i in range(samples))


def test_gpqa_questions_have_their_own_probability_and_samples_are_drawn_from_it():
    fixed = Persona(0, 0.7, GpqaAnswerKey.empty())
    assert _share_right(fixed, "q1", 50) in (0.0, 1.0)  # today's: one fixed answer per question
    drawn = Persona(0, 0.7, GpqaAnswerKey.empty(), concentration=2.0, nonce="boot-a")
    shares = [_share_right(drawn, f"q{i}", 40) for i in range(60)]
    assert 0.55 < statistics.fmean(shares) < 0.85
    assert any(0.1 < share < 0.9 for share in shares)  # some questions are sometimes right, sometimes wrong
