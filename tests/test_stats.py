"""dspark_ci.ground.stats: the three-way verdict keeps its stated error rates (checked by simulation, not by formula)."""

from __future__ import annotations

import math
import random

import pytest
from dspark_ci.ground.stats import (
    GATE_FALSE_PASS,
    HIGHER,
    INCONCLUSIVE,
    LOWER,
    PASSED,
    REGRESSED,
    BootReference,
    Levels,
    chance_floor,
    chance_pass_probability,
    compare_boots,
    compare_estimates,
    compare_paired,
    compare_samples,
    decide,
)

LEVELS = Levels(alpha=0.05, beta=0.05)


def test_red_needs_a_real_change_beyond_the_tolerance_and_green_needs_the_detection_line_ruled_out():
    # TPOT (lower is better), tolerance +2.5 %, detection line +5 %
    assert decide(0.04, 0.01, 0.06, 0.025, 0.05, LOWER) == REGRESSED  # really slower, and by more than 2.5 %
    assert decide(0.02, 0.01, 0.03, 0.025, 0.05, LOWER) == PASSED  # really slower, but within the tolerance
    assert decide(0.04, -0.01, 0.09, 0.025, 0.05, LOWER) == INCONCLUSIVE  # maybe unchanged, maybe 9 % slower
    assert decide(0.0, -0.02, 0.049, 0.025, 0.05, LOWER) == PASSED  # a 5 % regression is ruled out
    # throughput (higher is better), tolerance -3 %, detection line -6 %
    assert decide(-0.05, -0.08, -0.01, -0.03, -0.06, HIGHER) == REGRESSED
    assert decide(-0.01, -0.04, 0.02, -0.03, -0.06, HIGHER) == PASSED
    assert decide(-0.05, -0.09, 0.0, -0.03, -0.06, HIGHER) == INCONCLUSIVE
    # a bisect step (nearer which end of a 5 % regression?): the whole interval past half-way, on either side
    assert decide(0.04, 0.01, 0.06, 0.025, 0.025, LOWER, surely_past=0.025) == INCONCLUSIVE
    assert decide(0.045, 0.03, 0.06, 0.025, 0.025, LOWER, surely_past=0.025) == REGRESSED


def _boot_night(rng, effect, reference, boots, sigma, levels=LEVELS):
    values = [reference.value * (1 + effect) * math.exp(rng.gauss(0, sigma)) for _ in range(boots)]
    return compare_boots(values, reference, LOWER, 0.025, levels)


def test_an_unchanged_metric_turns_red_at_most_alpha_of_the_time():
    rng, sigma = random.Random(7), 0.02
    reference = BootReference(value=10.0, runs=10, noise=sigma)
    verdicts = [_boot_night(rng, 0.0, reference, 3, sigma).verdict for _ in range(2000)]
    assert verdicts.count(REGRESSED) / len(verdicts) <= LEVELS.alpha + 0.01


def test_a_regression_at_the_detection_line_passes_at_most_beta_of_the_time():
    rng, sigma = random.Random(11), 0.02
    reference = BootReference(value=10.0, runs=10, noise=sigma)
    verdicts = [_boot_night(rng, 0.05, reference, 3, sigma).verdict for _ in range(2000)]
    assert verdicts.count(PASSED) / len(verdicts) <= LEVELS.beta + 0.01
    assert verdicts.count(REGRESSED) / len(verdicts) > 0.5  # and most of them are red outright


def test_a_real_shift_within_the_tolerance_is_never_red_however_precise_the_measurement():
    """A gate tests a regression beyond its tolerance, not any shift at all: 1 % slower, measured very precisely,
    passes (Perfherder's magnitude threshold); 4 % slower, measured as precisely, is red."""
    rng, sigma = random.Random(13), 0.001
    reference = BootReference(value=10.0, runs=20, noise=sigma, drift=0.0)  # the rule, not the drift model
    small = [_boot_night(rng, 0.01, reference, 8, sigma, Levels.family(60, max_boots=8)) for _ in range(200)]
    assert {v.verdict for v in small} == {PASSED} and all(v.low > 0 for v in small)  # real, yet not material
    assert _boot_night(rng, 0.04, reference, 8, sigma, Levels.family(60, max_boots=8)).verdict == REGRESSED


def test_clear_regressions_turn_red_and_an_unchanged_metric_passes_when_the_noise_is_small():
    rng, sigma = random.Random(3), 0.003
    reference = BootReference(value=10.0, runs=10, noise=sigma)
    assert _boot_night(rng, 0.10, reference, 1, sigma).verdict == REGRESSED
    assert _boot_night(rng, 0.0, reference, 1, sigma).verdict == PASSED


def test_noise_the_data_cannot_resolve_is_inconclusive_not_a_coin_toss():
    reference = BootReference(value=10.0, runs=3, noise=0.05)
    verdict = compare_boots([10.6], reference, LOWER, 0.025, Levels.family(60))
    assert verdict.verdict == INCONCLUSIVE
    assert verdict.low < 0 and verdict.high > verdict.detection == pytest.approx(0.05)
    assert "1 boot(s) vs 3 baseline run(s)" in verdict.test


def test_boots_noisier_than_the_baseline_widen_the_interval_as_they_come_in():
    reference = BootReference(value=10.0, runs=20, noise=0.003)
    quiet = compare_boots([10.6, 10.62, 10.58], reference, LOWER, 0.025, LEVELS)
    noisy = compare_boots([8.5, 12.9, 10.5], reference, LOWER, 0.025, LEVELS)
    assert quiet.verdict == REGRESSED and noisy.verdict == INCONCLUSIVE
    assert noisy.high - noisy.low > 5 * (quiet.high - quiet.low)


def test_two_samples_welch():
    slower = compare_samples([11.0, 11.1, 10.9, 11.05], [10.0, 10.1, 9.9, 10.05], LOWER, 0.025, LEVELS)
    assert slower.verdict == REGRESSED and slower.effect == pytest.approx(0.10, abs=0.005)
    with pytest.raises(ValueError):
        compare_samples([1.0], [1.0, 2.0], LOWER, 0.025, LEVELS)


def test_paired_questions_see_a_drop_the_unpaired_comparison_cannot():
    rng = random.Random(5)
    difficulty = {f"q{i}": rng.betavariate(0.35, 0.15) for i in range(198)}  # most questions always or never right
    base = {q: sum(rng.random() < p for _ in range(24)) / 24 for q, p in difficulty.items()}
    new = {q: [float(rng.random() < p * 0.9) for _ in range(8)] for q, p in difficulty.items()}
    levels = Levels(alpha=0.001, beta=0.05)
    paired = compare_paired(new, base, HIGHER, -0.01, levels)
    drop = sum(sum(v) / len(v) for v in new.values()) / 198 - sum(base.values()) / 198
    se = math.sqrt(0.21 / 198)
    unpaired = compare_estimates(drop + 0.7, se, 0.7, se, HIGHER, -0.01, levels, 198)
    assert paired.verdict == REGRESSED and unpaired.verdict == INCONCLUSIVE
    assert paired.high < 0 and paired.effect < -0.01 and "paired t over 198 questions" in paired.test


def test_family_levels_split_the_run_false_red_rate_over_gates_and_looks():
    levels = Levels.family(gates=50, run_false_red=0.01, looks=4)
    assert levels.alpha == pytest.approx(0.01 / 200) and levels.beta == pytest.approx(GATE_FALSE_PASS / 4)
    assert "per look (4 planned)" in levels.describe()


@pytest.mark.parametrize("questions", [20, 198])
def test_the_chance_floor_is_the_exact_binomial_one(questions):
    floor = chance_floor(questions, false_pass=0.01)
    assert chance_pass_probability(floor, questions, 0.25) <= 0.01
    assert chance_pass_probability(floor - 1 / questions, questions, 0.25) > 0.01


def test_sequential_looks_spend_alpha_in_proportion_to_their_boots():
    levels = Levels.family(gates=60, run_false_red=0.01, max_boots=8)
    shares = [levels.at_boots(n).alpha for n in (1, 2, 4, 8)]
    assert sum(shares) == pytest.approx(0.01 / 60)  # the gate's share of the run's false red, no more
    assert shares == pytest.approx([s * 0.01 / 60 / 15 for s in (1, 2, 4, 8)])
    # a count the plan does not hold gets the smallest share: no decision spends more than one look's share
    assert levels.at_boots(3).alpha == shares[0] and levels.at_boots(12).alpha == shares[0]
    assert levels.at_boots(8).beta == pytest.approx(GATE_FALSE_PASS / 4)
    assert "at 8 boots" in levels.describe()


def test_retries_are_looks_of_their_own_and_no_share_is_spent_twice():
    """--retries 2 with --max-boots 4: judgements after 1, 2, 3 and 4 boots, each its own share, summing to the
    gate's share of the run's false red."""
    levels = Levels.family(gates=10, run_false_red=0.01, max_boots=4, retries=2)
    assert [n for n, _ in levels.plan] == [1, 2, 3, 4]
    shares = [levels.at_boots(n).alpha for n in (1, 2, 3, 4)]
    assert sum(shares) == pytest.approx(0.001) and len(set(shares)) == 4


def test_a_baseline_without_measured_noise_is_floored_not_certain():
    """Identical runs (noise 0) never give a zero-width interval: the per-request standard error is the floor,
    a live boot's own included, and the test says where its noise came from."""
    reference = BootReference(value=3.25, runs=8, noise=0.0, request_noise=0.0577)
    verdict = compare_boots([3.12], reference, HIGHER, -0.02, Levels(alpha=4e-5))  # -4 %
    assert verdict.verdict == INCONCLUSIVE and verdict.high - verdict.low > 0.1
    assert "per-request standard error" in verdict.test and "identical" in verdict.test
    live = compare_boots([3.12], BootReference(3.25, 8, 0.0, 0.0), HIGHER, -0.02, Levels(alpha=4e-5),
                         live_request_se=[0.03])
    assert "per-boot noise 3.00%" in live.test and live.low < live.effect < live.high


def test_the_drift_allowance_is_stated_and_does_not_average_away():
    reference = BootReference(value=10.0, runs=30, noise=0.002, drift=0.01)
    many = compare_boots([10.0] * 50, reference, LOWER, 0.025, Levels(alpha=1e-3))
    assert many.high > 0.01 * 2  # 50 identical boots cannot rule out what the drift allowance allows
    assert "drift allowance 1.00%" in many.test


def test_gpqa_on_fixed_answers_is_an_exact_test_over_discordant_questions():
    base = {f"q{i}": 1.0 for i in range(198)}
    lost_ten = {q: [0.0] if i < 10 else [1.0] for i, q in enumerate(base)}  # -5 points, nothing gained
    verdict = compare_paired(lost_ten, base, HIGHER, -0.02, Levels(alpha=1e-3))
    assert verdict.verdict == REGRESSED and verdict.test.startswith("McNemar exact test over 10 discordant")
    one_lost = {q: [0.0] if i == 0 else [1.0] for i, q in enumerate(list(base)[:20])}
    small = compare_paired(one_lost, base, HIGHER, -0.02, Levels(alpha=1e-3))
    assert small.verdict == INCONCLUSIVE  # one question of 20 is not a regression, nor ruled out
    repeated = {q: [v[0]] * 8 for q, v in lost_ten.items()}  # identical repeats: no new information
    assert compare_paired(repeated, base, HIGHER, -0.02, Levels(alpha=1e-3)).low == pytest.approx(verdict.low)


def test_a_zero_boot_stays_in_the_statistic():
    reference = BootReference(value=0.3, runs=8, noise=0.01)
    assert compare_boots([0.31, 0.0], reference, HIGHER, -0.02, Levels(alpha=1e-3)).verdict == REGRESSED


def test_a_pass_in_the_indifference_zone_says_so():
    reference = BootReference(value=10.0, runs=30, noise=0.01, drift=0.0)
    verdict = compare_boots([10.32] * 4, reference, LOWER, 0.025, Levels(alpha=1e-8, beta=0.02))
    assert verdict.verdict == PASSED
    assert "+3.2% [" in verdict.describe() and "passed: beyond the +2.5% tolerance, but +5.0% ruled out" in \
        verdict.describe()


def test_a_boot_noisier_within_than_the_baseline_widens_its_own_interval():
    """The baseline's runs saw 2 % per-request error; a boot with 6 % today (a busier machine, another client) varies
    more than those runs did, which one boot shows: its interval widens by the excess, and the test says so. A boot
    as quiet as the baseline's is judged exactly as before."""
    reference = BootReference(value=10.0, runs=16, noise=0.005, request_noise=0.02)
    quiet = compare_boots([10.6], reference, LOWER, 0.025, Levels(alpha=4e-5), live_request_se=[0.02])
    noisy = compare_boots([10.6], reference, LOWER, 0.025, Levels(alpha=4e-5), live_request_se=[0.06])
    assert quiet.verdict == REGRESSED and "widened" not in quiet.test
    assert noisy.verdict == INCONCLUSIVE and noisy.low < 0 < noisy.high
    assert "widened by today's per-request error 6.00% over theirs 2.00%" in noisy.test
