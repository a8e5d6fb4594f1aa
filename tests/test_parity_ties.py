"""Greedy parity tells a tie flip from a mismatch: the tie rule at its boundary, the simulator's logprobs in SGLang's
shapes, and the parity suite run against simulated servers with the parity faults."""

from __future__ import annotations

import json

import pytest
import requests
from dspark_ci.suites.parity import Output, compare, compare_all, load_reference, save_reference, tally
from dspark_ci.suites.parity_ties import (
    MISMATCH,
    TIE_FLIP,
    PositionLogprobs,
    Resolution,
    TopLogprob,
    bf16_step,
    decide,
    position_logprobs,
    tie_epsilon,
)

from tests.simulator_process import SPECULATIVE_ARGS, running_simulator
from tests.suite_runs import run_suite

FAST = {"DSPARK_SIM_DECODE_STEP_MS": "1", "DSPARK_SIM_PREFILL_MS_PER_TOKEN": "0"}
PROBE = -0.8713  # the SmolLM2 probe's tied logprob (" dipped" / " began")


def position(best: float, *others: tuple[str, float]) -> PositionLogprobs:
    chosen = TopLogprob(" dipped", best)
    return PositionLogprobs(chosen, (chosen, *(TopLogprob(token, logprob) for token, logprob in others)))


@pytest.mark.parametrize("magnitude, step", [(0.8713, 2.0 ** -8), (1.0, 2.0 ** -7), (3.5, 2.0 ** -6), (20.0, 0.125)])
def test_a_bf16_step_is_two_to_the_exponent_less_seven(magnitude, step):
    assert bf16_step(magnitude) == step and bf16_step(-magnitude) == step


def test_the_probe_tie_is_a_tie_flip():
    decision = decide(position(PROBE, (" began", PROBE)), TopLogprob(" began", PROBE), Resolution(2))
    assert decision.verdict == TIE_FLIP and decision.tested_logprob == PROBE == decision.reference_logprob


@pytest.mark.parametrize("ulps", [1, 2, 4])
def test_the_boundary_is_tie_ulps_bf16_steps_both_ways(ulps):
    epsilon = tie_epsilon(PROBE, ulps)
    assert epsilon == ulps * 2.0 ** -8
    just_within = PROBE - epsilon
    began, resolution = TopLogprob(" began", 0), Resolution(ulps)
    assert decide(position(PROBE, (" began", just_within)), began, resolution).verdict == TIE_FLIP
    just_beyond = PROBE - epsilon * 1.01
    assert decide(position(PROBE, (" began", just_beyond)), began, resolution).verdict == MISMATCH


def test_a_token_below_a_distant_top_k_floor_is_a_mismatch_without_asking_again():
    decision = decide(position(-0.1, (" a", -2.0), (" b", -3.0)), TopLogprob(" zebra", -9.0), Resolution(2))
    assert decision.verdict == MISMATCH and decision.tested_logprob is None
    assert "already beyond epsilon" in decision.reason


def test_a_token_below_a_top_k_that_is_all_tied_is_undecided_and_counted_a_mismatch():
    decision = decide(position(-1.5, (" a", -1.5), (" b", -1.5)), TopLogprob(" zebra", -9.0), Resolution(2))
    assert decision.verdict == MISMATCH and decision.reason.startswith("undecided")


def test_without_the_references_logprobs_a_difference_is_a_mismatch():
    assert decide(None, TopLogprob(" began", PROBE), Resolution(2)).verdict == MISMATCH


def _output(ids: tuple[int, ...], tokens: list[tuple[str, float]], top: list[list[tuple[str, float]]]) -> Output:
    content = [{"token": t, "bytes": list(t.encode()), "logprob": lp,
                "top_logprobs": [{"token": a, "bytes": list(a.encode()), "logprob": b} for a, b in row]}
               for (t, lp), row in zip(tokens, top, strict=False)]
    return Output(text="".join(t for t, _ in tokens), token_ids=ids, logprobs=position_logprobs(content))


REFERENCE = _output((5, 6, 7), [(" the", -0.2), (" cat", PROBE), (" sat", -0.3)],
                    [[(" the", -0.2)], [(" cat", PROBE), (" dog", PROBE), (" rat", -4.0)], [(" sat", -0.3)]])


@pytest.mark.parametrize("token, token_id, logprob, verdict", [
    (" dog", 8, PROBE, TIE_FLIP), (" rat", 9, -4.0, MISMATCH)])
def test_a_record_names_the_position_both_tokens_and_both_logprobs(token, token_id, logprob, verdict):
    tested = _output((5, token_id, 7), [(" the", -0.2), (token, logprob), (" sat", -0.3)],
                     [[(" the", -0.2)], [(token, logprob)], [(" sat", -0.3)]])
    record = compare(0, "Write a short story about a cat.", tested, REFERENCE, Resolution(2))
    assert (record.verdict, record.first_difference) == (verdict, 1)
    assert (record.tested_token, record.tested_token_id, record.tested_logprob) == (token, token_id, logprob)
    assert (record.reference_token, record.reference_token_id, record.reference_logprob) == (" cat", 6, PROBE)
    assert record.epsilon == tie_epsilon(logprob, 2)
    assert tally([record]) == {"parity_mismatches": int(verdict == MISMATCH),
                               "parity_tie_flips": int(verdict == TIE_FLIP), "parity_logprob_drift": 0.0}


def _drifted(first: float, gap: float) -> Output:
    """The reference's tokens up to a first difference at token 1, whose first logprob is ``first`` (the reference
    says -0.2), and then " dog" at ``gap`` below the reference's own token there."""
    return _output((5, 8, 7), [(" the", first), (" dog", PROBE - gap), (" sat", -0.3)],
                   [[(" the", first)], [(" dog", PROBE - gap)], [(" sat", -0.3)]])


def _reference_with_dog_at(gap: float) -> Output:
    return _output((5, 6, 7), [(" the", -0.2), (" cat", PROBE), (" sat", -0.3)],
                   [[(" the", -0.2)], [(" cat", PROBE), (" dog", PROBE - gap)], [(" sat", -0.3)]])


def test_a_difference_within_the_servers_own_drift_is_a_tie_flip_beyond_it_a_mismatch():
    # tp 2 against one rank: the logprob of the token both took differs by 0.08, so a gap of 0.125 at the first
    # difference is within 2 x 0.08 (their own resolution), while a gap of 0.3 is not
    layouts = Resolution(2, drift_factor=2, max_drift=0.5)
    within = compare(0, "p", _drifted(-0.28, 0.125), _reference_with_dog_at(0.125), layouts)
    assert within.verdict == TIE_FLIP and within.drift == pytest.approx(0.08)
    assert "the servers' drift 0.08" in (within.reason or "")
    beyond = compare(0, "p", _drifted(-0.28, 0.3), _reference_with_dog_at(0.3), layouts)
    assert beyond.verdict == MISMATCH and beyond.epsilon == pytest.approx(0.16)
    # without drift (the same token at the same logprob) the same 0.125 is a mismatch: only bf16 steps allowed
    assert compare(0, "p", _drifted(-0.2, 0.125), _reference_with_dog_at(0.125), layouts).verdict == MISMATCH


def _early_flip(gap: float) -> tuple[Output, Output]:
    """A first difference at token 0: no shared prefix to measure the drift on."""
    tested = _output((8, 6), [(" dog", PROBE - gap), (" sat", -0.3)], [[(" dog", PROBE - gap)], [(" sat", -0.3)]])
    reference = _output((6, 6), [(" cat", PROBE), (" sat", -0.3)],
                        [[(" cat", PROBE), (" dog", PROBE - gap)], [(" sat", -0.3)]])
    return tested, reference


def test_an_early_difference_is_read_at_the_drift_the_other_prompts_show():
    # the pair's drift (0.08, on prompt 1's shared prefix) is the resolution of every prompt of the run: prompt 0
    # parts at its first token, where its own prefix measures nothing
    layouts = Resolution(2, drift_factor=2, max_drift=0.5)
    early, early_reference = _early_flip(0.125)
    alone = compare(0, "p0", early, early_reference, layouts)
    assert alone.verdict == MISMATCH and alone.drift == 0.0
    drifted, drifted_reference = _drifted(-0.28, 0.0), _reference_with_dog_at(0.0)
    records = compare_all(["p0", "p1"], [early, drifted], [early_reference, drifted_reference], layouts)
    assert [r.verdict for r in records] == [TIE_FLIP, TIE_FLIP]
    assert records[0].drift == 0.0 and "the servers' drift 0.08" in (records[0].reason or "")  # its own, kept
    # a gap beyond twice the pair's drift stays a mismatch however many prompts drifted
    far, far_reference = _early_flip(0.3)
    assert compare_all(["p0", "p1"], [far, drifted], [far_reference, drifted_reference], layouts)[0].verdict == MISMATCH


def test_servers_drifting_beyond_max_drift_are_a_mismatch_whatever_the_gap():
    # an all-reduce skipped: plausible tokens, every logprob shifted; the first difference is then no tie at all
    layouts = Resolution(2, drift_factor=2, max_drift=0.5)
    record = compare(0, "p", _drifted(-1.4, 0.0), _reference_with_dog_at(0.0), layouts)
    assert record.verdict == MISMATCH and "beyond max_drift" in record.reason
    assert tally([record])["parity_logprob_drift"] == pytest.approx(1.2)


def test_a_saved_reference_keeps_its_logprobs_and_a_version_one_file_still_loads(tmp_path):
    path = tmp_path / "reference.json"
    save_reference(path, "m", 3, ["p"], [REFERENCE])
    assert json.loads(path.read_text())["version"] == 2
    assert load_reference(path, 1).outputs == (REFERENCE,)
    old = {"format": "dspark-parity-reference", "version": 1, "model": "m", "max_tokens": 3,
           "outputs": [{"prompt": "p", "text": REFERENCE.text, "token_ids": [5, 6, 7]}]}
    path.write_text(json.dumps(old))
    [loaded] = load_reference(path, 1).outputs or ()
    tested = _output((5, 8, 7), [(" the", -0.2), (" dog", PROBE), (" sat", -0.3)], [[], [], []])
    record = compare(0, "p", tested, loaded, Resolution(2))
    assert record.verdict == MISMATCH and "reference gave no logprobs" in (record.reason or "")


# --- the simulator's logprobs and the parity faults ------------------------------------------------------------------

@pytest.fixture(scope="module")
def plain_server(tmp_path_factory):
    with running_simulator({**FAST, "DSPARK_SIM_FAULTS": "parity_tie_flip"},
                           log_path=tmp_path_factory.mktemp("sim") / "plain.log") as url:
        yield url


def test_the_simulator_answers_logprobs_in_sglangs_shapes(plain_server):
    chat = requests.post(f"{plain_server}/v1/chat/completions", timeout=30, json={
        "model": "m", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 6,
        "logprobs": True, "top_logprobs": 3, "return_token_ids": True}).json()["choices"][0]
    content = chat["logprobs"]["content"]
    assert len(content) == len(chat["response_token_ids"]) == 6
    assert set(content[0]) == {"token", "bytes", "logprob", "top_logprobs"} and len(content[0]["top_logprobs"]) == 3
    assert content[0]["top_logprobs"][0]["logprob"] == content[0]["logprob"]  # greedy: the best
    assert content[3]["top_logprobs"][0]["logprob"] == content[3]["top_logprobs"][1]["logprob"]  # the planted tie
    native = requests.post(f"{plain_server}/generate", timeout=30, json={
        "text": "Hi", "sampling_params": {"temperature": 0, "max_new_tokens": 4}, "return_logprob": True,
        "top_logprobs_num": 2}).json()["meta_info"]
    assert native["output_token_logprobs_length"] == 4
    logprob, token_id, text = native["output_token_logprobs"][0]
    assert isinstance(logprob, float) and isinstance(token_id, int) and text is None
    assert [len(row) for row in native["output_top_logprobs"]] == [2, 2, 2, 2]


@pytest.mark.parametrize("fault, mismatches, ties, code", [
    ("parity_tie_flip", 0, 8, pytest.ExitCode.OK), ("parity_mismatch", 8, 0, pytest.ExitCode.TESTS_FAILED)])
def test_the_parity_suite_tells_a_tie_flip_from_a_mismatch(tmp_path, fault, mismatches, ties, code):
    env = {**FAST, "DSPARK_SIM_FAULTS": fault}
    with running_simulator(env, log_path=tmp_path / "plain.log") as plain, \
            running_simulator(env, SPECULATIVE_ARGS, log_path=tmp_path / "spec.log") as spec:
        done, output, log = run_suite(tmp_path, "parity", spec, "--reference-url", plain)
    assert done == code, log
    assert output["metrics"] == {"parity_mismatches": mismatches, "parity_tie_flips": ties, "parity_logprob_drift": 0.0}
    record = output["records"]["parity"][0]
    assert record["first_difference"] == 3 and record["verdict"] == ("tie_flip" if ties else "mismatch")
    assert record["tested_token"] != record["reference_token"] and record["tested_logprob"] is not None
    if mismatches:
        assert "at token 3: tested" in log and "logprob" in log
