"""Sampled losslessness, tested per generated position (ground/position_homogeneity.py): the statistic on draws
whose answer is known, and `dspark-ci run` on the simulator as a user meets it: clean green, a lossy speculative
sampler red with the position and the test's numbers in report.md."""

from __future__ import annotations

import random

import pytest
from dspark_ci.ground.position_homogeneity import ENDED, GREEN, INCONCLUSIVE, POOLED, RED, compare, holm, pooled_counts

from tests.test_run_cli import ONE_NODE, SMOKE, Run


def _draws(rng: random.Random, samples: int, tokens: int, argmax_share: float) -> list[list[int]]:
    """Token 0 with probability 0.4 at every position (plus ``argmax_share`` of the rest after the first), else
    one of tokens 1..3 uniformly."""
    def token(position: int) -> int:
        if rng.random() < 0.4 or (position and rng.random() < argmax_share):
            return 0
        return rng.randint(1, 3)
    return [[token(k) for k in range(tokens)] for _ in range(samples)]


def test_equal_distributions_are_green_and_an_argmax_bias_is_red_at_the_positions_it_acts_on():
    rng = random.Random(7)
    clean = compare([_draws(rng, 64, 5, 0.0) for _ in range(3)], [_draws(rng, 64, 5, 0.0) for _ in range(3)], 5)
    assert clean.verdict(0.01)[0] == GREEN and len(clean.tests) == 12, clean
    biased = compare([_draws(rng, 64, 5, 0.6) for _ in range(3)], [_draws(rng, 64, 5, 0.0) for _ in range(3)], 5)
    verdict, why = biased.verdict(0.01)
    assert verdict == RED, why
    assert {t.position for t in biased.red(0.01)} <= {2, 3, 4, 5}  # the first token is the prefill's: not tested
    assert all(t.token == 0 and t.speculative_share > t.reference_share for t in biased.red(0.01))


def test_rare_tokens_are_pooled_so_that_every_category_expects_five_draws():
    here = [1] * 20 + [2] * 3 + [3] * 2 + [ENDED]
    there = [1] * 18 + [2] * 4 + [4] * 4
    labels, row_here, row_there = pooled_counts(here, there)
    assert labels == [1, POOLED], labels  # 2, 3, 4 and the end, 7 draws each side at most: pooled together
    assert sum(row_here) == len(here) and sum(row_there) == len(there)
    assert pooled_counts([5] * 10, [6] * 10)[0] == [5, 6]


def test_too_few_draws_are_inconclusive_saying_why():
    rng = random.Random(3)
    few = compare([_draws(rng, 4, 4, 0.0)], [_draws(rng, 4, 4, 0.0)], 4)
    verdict, why = few.verdict(0.01)
    assert verdict == INCONCLUSIVE and "lossless_samples" in why, why


def test_holm_adjusts_step_down_and_keeps_the_order():
    assert holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])


# the smoke baseline's other gates may stay undecided on one boot; a red gate makes the cell red regardless
@pytest.mark.parametrize("fault, statuses", [("", {"passed", "inconclusive"}), ("greedy_verify=0.5", {"failed"})])
def test_a_run_gates_sampled_losslessness_by_distribution(tmp_path, fault, statuses):
    run = Run(tmp_path, SMOKE, "--cell", ONE_NODE, "--suites", "accept", "--max-boots", "1", faults=fault)
    done = run(timeout=600)
    cell = run.cell(ONE_NODE)
    [gate] = [g for g in cell["gates"] if g["metric"] == "sampled_lossless_p"]
    assert gate["verdict"] == ("passed" if not fault else "regressed"), gate
    assert cell["status"] in statuses, done.stderr
    report = (run.out / "report.md").read_text()
    assert "Sampled losslessness (4 prompts × 64 draws per side" in report
    if fault:
        assert "red at prompt" in gate["test"] and "χ²" in gate["test"], gate["test"]
        assert "red at prompt" in report and "with speculation" in report
