"""Gates: each direction, the GPQA noise rule, the collapse floor, unmeasured metrics, precedence."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from dspark_ci.ground.measurements import BootMetrics, GpqaSummary, SuiteTestOutcome
from dspark_ci.ground.records import CellResult
from dspark_ci.ground.sglang.settings import CellConfig
from dspark_ci.ground.stats import chance_pass_probability
from dspark_ci.reports.baseline_file import load_baseline
from dspark_ci.reports.gates import evaluate

SPECULATIVE = CellResult(id="cell-a", config=CellConfig(speculative_algorithm="DSPARK"), expect={"outcome": "serve"})
PLAIN = CellResult(id="cell-a", config=CellConfig(), expect={"outcome": "serve"})


def baseline_file(tmp_path, metrics_yaml: str, pattern: str = "cell-a"):
    path = tmp_path / "baseline.yaml"
    path.write_text(f"schema: 1\ncells:\n  {pattern}:\n" + "".join(f"    {line}\n" for line in metrics_yaml.splitlines()))
    return load_baseline(path)


def only_gate(gates) -> dict:
    assert len(gates) == 1, gates
    return gates[0].to_dict()


@pytest.mark.parametrize("spec, metric, value, op, threshold, passed", [
    pytest.param("{value: 3.0, min_ratio: 0.95}", "accept_length", 2.86, ">=", 2.85, True, id="higher-ratio-pass"),
    pytest.param("{value: 3.0, min_ratio: 0.95}", "accept_length", 2.84, ">=", 2.85, False, id="higher-ratio-fail"),
    pytest.param("{value: 800, min_ratio: 0.97}", "output_throughput_tok_s", 776, ">=", 776, True,
                 id="at-threshold-passes"),
    pytest.param("{value: 100, max_ratio: 1.025}", "ttft_ms_median", 102.4, "<=", 102.5, True, id="lower-ratio-pass"),
    pytest.param("{value: 100, max_ratio: 1.025}", "ttft_ms_median", 102.6, "<=", 102.5, False, id="lower-ratio-fail"),
    pytest.param("{min: 0.5}", "accept_rate", 0.49, ">=", 0.5, False, id="absolute-min"),
    pytest.param("{max: 0}", "parity_mismatches", 1, "<=", 0, False, id="absolute-max"),
    pytest.param("{max: 0}", "parity_mismatches", None, "<=", 0, False, id="not-measured-fails"),
])
def test_baseline_gate_directions(tmp_path, spec, metric, value, op, threshold, passed):
    baseline = baseline_file(tmp_path, f"{metric}: {spec}")
    metrics = {} if value is None else {metric: value}
    assert only_gate(evaluate(PLAIN, metrics, baseline)) == {
        "metric": metric, "op": op, "threshold": threshold, "value": value, "passed": passed,
        "verdict": "passed" if passed else "regressed"}


GPQA = "gpqa_accuracy: {value: 0.62, stderr: 0.034, max_drop_stderr: 2}"


@pytest.mark.parametrize("accuracy, stderr_now, verdict", [
    pytest.param(0.53, 0.035, "inconclusive", id="drop-within-noise-is-inconclusive-not-green"),
    pytest.param(0.30, 0.035, "regressed", id="drop-far-beyond-noise-regresses"),
    pytest.param(0.53, None, "inconclusive", id="no-stderr-measured-uses-baselines"),
])
def test_gpqa_gate_respects_sampling_error(tmp_path, accuracy, stderr_now, verdict):
    metrics = {"gpqa_accuracy": accuracy, **({} if stderr_now is None else {"gpqa_stderr": stderr_now})}
    gate = only_gate(evaluate(PLAIN, metrics, baseline_file(tmp_path, GPQA)))
    se_now = 0.034 if stderr_now is None else stderr_now
    assert gate["op"] == ">=" and gate["verdict"] == verdict and gate["passed"] is False
    assert gate["effect"] == pytest.approx(accuracy - 0.62) and "unpaired" in gate["test"]
    assert gate["threshold"] == pytest.approx(0.62 - 2 * math.sqrt(0.034 ** 2 + se_now ** 2), abs=1e-6)


def test_gpqa_paired_over_questions_when_the_baseline_kept_them(tmp_path):
    (tmp_path / "q.json").write_text(json.dumps({f"q{i}": float(i % 3 != 0) for i in range(60)}))
    baseline = baseline_file(tmp_path, GPQA.replace("}", ", max_drop: 0.02, per_question: q.json}"))
    same = {f"q{i}": (int(i % 3 != 0), 1) for i in range(60)}
    worse = {q: (0, 1) if i < 12 else outcome for i, (q, outcome) in enumerate(same.items())}
    for per_question, verdict in ((same, "passed"), (worse, "regressed")):
        cell = replace(PLAIN, gpqa=GpqaSummary(per_question=per_question))
        gate = only_gate(evaluate(cell, {"gpqa_accuracy": 0.6, "gpqa_stderr": 0.06}, baseline))
        # one answer per question: the exact test over the discordant questions, named in the gate
        assert gate["verdict"] == verdict and "McNemar exact test" in gate["test"] and "of 60 questions" in gate["test"]


@pytest.mark.parametrize("cell, metrics, expected", [
    pytest.param(SPECULATIVE, {"accept_length": 1.0}, [(">=", 1.2, False)], id="collapse-fails"),
    pytest.param(SPECULATIVE, {"accept_length": 2.5}, [(">=", 1.2, True)], id="healthy-passes"),
    pytest.param(replace(SPECULATIVE, suites={"accept": {"min_accept_length": 3.0}}), {"accept_length": 2.5},
                 [(">=", 3.0, False)], id="cell-overrides-floor"),
    pytest.param(SPECULATIVE, {"ttft_ms_mean": 10.0}, [], id="accept-not-measured-no-floor"),
    pytest.param(PLAIN, {"accept_length": 1.0}, [], id="not-speculative-no-floor"),
    pytest.param(replace(SPECULATIVE, expect={"outcome": "reject"}), {"accept_length": 1.0}, [],
                 id="rejection-never-gated"),
])
def test_collapse_floor_needs_no_baseline(cell, metrics, expected):
    gates = evaluate(cell, metrics, None)
    assert [(g.op, g.threshold, g.passed) for g in gates] == expected
    assert all(g.metric == "accept_length" for g in gates)


def test_exact_cell_id_beats_glob_per_metric(tmp_path):
    path = tmp_path / "baseline.yaml"
    path.write_text("schema: 1\ncells:\n"
                    "  'cell-*':\n    accept_length: {min: 2.0}\n    accept_rate: {min: 0.5}\n"
                    "  cell-a:\n    accept_length: {min: 3.0}\n")
    gates = evaluate(PLAIN, {"accept_length": 2.5, "accept_rate": 0.6}, load_baseline(path))
    assert {(g.metric, g.threshold, g.passed) for g in gates} == {
        ("accept_length", 3.0, False), ("accept_rate", 0.5, True)}
    other = evaluate(replace(PLAIN, id="cell-b"), {"accept_length": 2.5, "accept_rate": 0.6}, load_baseline(path))
    assert {(g.metric, g.threshold) for g in other} == {("accept_length", 2.0), ("accept_rate", 0.5)}


def test_floor_and_baseline_gates_both_apply(tmp_path):
    gates = evaluate(SPECULATIVE, {"accept_length": 2.0},
                     baseline_file(tmp_path, "accept_length: {value: 3.0, min_ratio: 0.95}"))
    assert [(g.threshold, g.passed) for g in gates] == [(1.2, True), (2.85, False)]


@pytest.mark.parametrize("spec, value, threshold, verdict", [
    pytest.param("{value: 10.0, max_ratio: 1.025, noise: 0.004, runs: 20}", 11.0, 10.25, "regressed",
                 id="quiet-slower"),
    pytest.param("{value: 10.0, max_ratio: 1.025, noise: 0.004, runs: 20}", 10.0, 10.25, "passed", id="quiet-same"),
    pytest.param("{value: 10.0, max_ratio: 1.025, noise: 0.05}", 10.3, 11.5, "inconclusive", id="noisy-undecided"),
])
def test_a_ratio_gate_with_recorded_noise_is_a_statistical_verdict(tmp_path, spec, value, threshold, verdict):
    gate = only_gate(evaluate(PLAIN, {"tpot_ms_median": value}, baseline_file(tmp_path, f"tpot_ms_median: {spec}")))
    assert (gate["threshold"], gate["verdict"], gate["passed"]) == (pytest.approx(threshold), verdict,
                                                                     verdict == "passed")
    low, high = gate["interval"]
    assert low <= gate["effect"] <= high and gate["tolerance"] == pytest.approx(0.025)


def test_throughput_noise_widens_downwards(tmp_path):
    baseline = baseline_file(tmp_path, "output_throughput_tok_s: {value: 500, min_ratio: 0.97, noise: 0.02}")
    assert only_gate(evaluate(PLAIN, {"output_throughput_tok_s": 471}, baseline))["threshold"] == pytest.approx(470)


@pytest.mark.parametrize("accuracy, questions, passed", [
    pytest.param(0.0, 20, False, id="zero-fails"),
    pytest.param(0.50, 20, False, id="guessing-luck-on-20-fails"),
    pytest.param(0.55, 20, True, id="clearly-above-chance-on-20"),
    pytest.param(0.32, 198, False, id="near-chance-on-198-fails"),
    pytest.param(0.33, 198, True, id="above-chance-on-198"),
])
def test_gpqa_must_beat_chance_without_any_baseline(accuracy, questions, passed):
    gates = evaluate(PLAIN, {"gpqa_accuracy": accuracy, "gpqa_num_questions": questions}, None)
    gate = only_gate(gates)
    assert gate["metric"] == "gpqa_accuracy" and gate["passed"] is passed
    # exact binomial: a guesser reaches the floor at most 1 % of the time, one question less more often
    assert chance_pass_probability(gate["threshold"], questions, 0.25) <= 0.01
    assert chance_pass_probability(gate["threshold"] - 1 / questions, questions, 0.25) > 0.01


@pytest.mark.parametrize("accuracy, no_answer, passed", [
    pytest.param(0.25, 0.0, True, id="at-chance-passes"),
    pytest.param(0.0, 0.0, False, id="never-right-fails"),  # e.g. the scorer compares the wrong letters
    pytest.param(0.60, 0.0, False, id="above-chance-fails"),  # a random model cannot: the answer leaked somewhere
    pytest.param(0.25, 0.1, False, id="a-reply-without-an-answer-fails"),
])
def test_a_model_that_answers_at_chance_is_held_to_the_guessers_band(accuracy, no_answer, passed):
    """Random weights (the CPU engine's tiny Llama): the GPQA gate is the path from prompt to score, not accuracy."""
    at_chance = replace(PLAIN, suites={"gpqa": {"answers_at_chance": True}})
    metrics = {"gpqa_accuracy": accuracy, "gpqa_num_questions": 75, "gpqa_no_answer": no_answer}
    gates = evaluate(at_chance, metrics, None)
    assert {g.metric for g in gates} == {"gpqa_accuracy", "gpqa_no_answer"}
    assert all(g.passed for g in gates) is passed
    low, high = sorted(g.threshold for g in gates if g.metric == "gpqa_accuracy")
    # exact binomial, two-sided: a guesser falls outside at most 1 % of the time, half in each tail
    assert sum(stats_binom().pmf(k, 75, 0.25) for k in range(76) if not low <= k / 75 <= high) <= 0.01


def stats_binom():
    from scipy.stats import binom

    return binom


@pytest.mark.parametrize("speedup, passed",
                         [pytest.param(2.9, True, id="pays"), pytest.param(0.97, False, id="slower")])
def test_speculation_must_pay_where_the_speedup_was_measured(speedup, passed):
    gates = [g for g in evaluate(SPECULATIVE, {"speculative_speedup": speedup}, None)]
    assert [(g.metric, g.op, g.threshold, g.passed) for g in gates] == [("speculative_speedup", ">=", 1.0, passed)]
    assert evaluate(SPECULATIVE, {"accept_length": 3.0}, None)[0].metric == "accept_length"  # not measured: no gate


SPEED = ("tpot_ms_median: {value: 6.8, noise: 0.004, runs: 8, max_ratio: 1.025}\n"
         "accept_length: {value: 3.25, noise: 0.008, runs: 8, min_ratio: 0.98}\n" + GPQA)


def _speed_boot(tpot: float) -> dict:
    return {"tpot_ms_median": tpot, "accept_length": 3.25}


def test_a_regate_of_an_unchanged_run_gives_the_runs_verdicts_and_only_on_the_suites_that_ran(tmp_path):
    """Two cells: one stopped at one boot, one took four; the run gated them at its plan (--max-boots 12) and
    looked only at the speed and accept suites. `report --baseline` with the same file gives the same gates: the
    same levels per look (not the unsplit alpha), and no GPQA gate judged "not measured"."""
    from dspark_ci.ground.records import RunResults, Status
    from dspark_ci.reports.gates import family_levels, regate, status_of

    baseline = baseline_file(tmp_path, SPEED, pattern="cell-*")
    tests = (SuiteTestOutcome("suites/test_speed.py::test_speed", "passed"),
             SuiteTestOutcome("suites/test_accept.py::test_accept", "passed"))
    one = replace(SPECULATIVE, id="cell-a", metrics=_speed_boot(6.83), tests=tests)
    boots = tuple(BootMetrics(_speed_boot(t)) for t in (6.9, 6.7, 6.95, 6.85))
    four = replace(SPECULATIVE, id="cell-b", boots=boots, tests=tests,
                   metrics={"tpot_ms_median": 6.85, "accept_length": 3.25})
    levels = family_levels([one, four], baseline, max_boots=12)
    cells = []
    for cell in (one, four):
        gates = tuple(g for g in evaluate(cell, cell.metrics, baseline, levels) if g.metric != "gpqa_accuracy")
        cells.append(replace(cell, gates=gates, status=status_of(gates)))
    run = RunResults("r", None, None, "local", ("m.yaml",), cells=tuple(cells),
                     run_options=("--suites", "speed,accept"))
    again = regate(run, baseline)
    assert [c.gates for c in again.cells] == [c.gates for c in run.cells]
    assert [c.status for c in again.cells] == [Status.PASSED, Status.PASSED]
    assert {g.statistic.alpha for g in again.cells[0].gates if g.statistic} == {levels.at_boots(1).alpha}
    assert not any(g.metric == "gpqa_accuracy" for c in again.cells for g in c.gates)
    fewer = regate(replace(run, run_options=("--max-boots", "1")), baseline)  # the run's own plan, as recorded
    assert {g.statistic.alpha for g in fewer.cells[0].gates if g.statistic} == {family_levels(cells, baseline).alpha}


def test_zero_noise_without_a_request_bound_is_refused_and_with_one_floored_saying_so(tmp_path):
    from dspark_ci.ground.errors import BadInput

    with pytest.raises(BadInput) as refused:
        baseline_file(tmp_path, "accept_length: {value: 3.25, noise: 0.0, runs: 8, min_ratio: 0.98}")
    assert "baseline.yaml:4" in str(refused.value) and "noise 0 is not a standard error" in str(refused.value)
    floored = baseline_file(tmp_path, "accept_length: {value: 3.25, noise: 0.0, runs: 8, request_noise: 0.0577, "
                                      "min_ratio: 0.98}")
    assert any("baseline.yaml:4" in w and "floored at its request_noise 5.77%" in w for w in floored.warnings)
    gate = only_gate([g for g in evaluate(SPECULATIVE, {"accept_length": 3.12}, floored) if g.statistic])
    assert gate["interval"][1] - gate["interval"][0] > 0.05 and gate["verdict"] == "inconclusive"  # never certain


def test_unpaired_gpqa_reads_every_boot_not_the_last_and_never_falls_back_to_a_fixed_line(tmp_path):
    """The last boot re-ran only speed (GPQA was decided... or not): the GPQA gate reads the pooled accuracy."""
    baseline = baseline_file(tmp_path, GPQA)
    boots = (BootMetrics({"gpqa_accuracy": 0.30, "gpqa_stderr": 0.035, "tpot_ms_median": 6.8}),
             BootMetrics({"tpot_ms_median": 6.8}))
    cell = replace(PLAIN, boots=boots)
    gate = only_gate(evaluate(cell, {"gpqa_accuracy": 0.30, "gpqa_stderr": 0.035, "tpot_ms_median": 6.8}, baseline))
    assert gate["verdict"] == "regressed" and "unpaired" in gate["test"]


def test_gpqa_on_fixed_answers_is_one_look_with_the_gates_whole_alpha_and_final(tmp_path):
    """A per-question record of 0s and 1s: the server answers each question the same way every time, so later boots
    cannot inform the GPQA gate: it is decided at once with its whole share of alpha, and marked final."""
    from dspark_ci.ground.stats import Levels

    (tmp_path / "q.json").write_text(json.dumps({f"q{i}": 1.0 for i in range(198)}))
    baseline = baseline_file(tmp_path, GPQA.replace("}", ", max_drop: 0.02, per_question: q.json}"))
    levels = Levels.family(gates=9, max_boots=12)
    lost_ten = {f"q{i}": (0 if i < 10 else 1, 1) for i in range(198)}  # -5 points on 198 questions
    cell = replace(PLAIN, gpqa=GpqaSummary(per_question=lost_ten))
    gate = evaluate(cell, {"gpqa_accuracy": 188 / 198, "gpqa_stderr": 0.015}, baseline, levels)[-1]
    assert gate.verdict == "regressed" and gate.statistic.final
    assert gate.statistic.alpha == pytest.approx(0.01 / 9)  # not the first look's 1/27 of it


THROUGHPUT = "output_throughput_tok_s: {value: 531.2, noise: 0.0048, runs: 8, request_noise: 0.04, min_ratio: 0.97, detect: 0.05}"


def _timed_boot(throughput: float, lag_p99: float) -> BootMetrics:
    return BootMetrics({"output_throughput_tok_s": throughput, "client_loop_lag_ms_p99": lag_p99})


@pytest.mark.parametrize("boots, verdict", [
    # SGLang's front end on a saturated 2-core runner: TPOT unchanged, throughput 17 % low, the client 13.7 ms late
    pytest.param([(440.3, 13.7)], "inconclusive", id="saturated-boot-alone-decides-nothing"),
    pytest.param([(440.3, 13.7), (530.0, 2.1)], "passed", id="the-boot-with-the-cpu-decides"),
    pytest.param([(531.0, 13.7)], "passed", id="a-starved-client-reads-worse-so-its-pass-stands"),
    pytest.param([(440.3, 2.1)], "regressed", id="a-quiet-client-still-sees-a-slow-server"),
    pytest.param([(505.0, 13.7), (530.0, 14.0)], "inconclusive", id="starved-boots-that-disagree-say-why"),
])
def test_timings_of_a_client_starved_of_cpu_are_the_machines_not_evidence(tmp_path, boots, verdict):
    cell = replace(SPECULATIVE, boots=tuple(_timed_boot(*boot) for boot in boots))
    gate = only_gate(evaluate(cell, {"output_throughput_tok_s": boots[-1][0]}, baseline_file(tmp_path, THROUGHPUT)))
    assert gate["verdict"] == verdict
    if verdict == "inconclusive" and len(boots) == 1:
        assert "-17.1%" in gate["test"] and "regressed" in gate["test"]  # what the numbers said, kept
        assert "starved of CPU (event-loop lag p99 13.7 ms" in gate["test"]
    elif verdict == "inconclusive":  # undecided over every boot, and every boot's client starved: said so
        assert "2 boot(s) vs" in gate["test"] and "every boot was timed by a client starved of CPU" in gate["test"]
    kept = [boot for boot in boots if boot[1] <= 10]
    if kept and len(kept) < len(boots):  # decided on the others: the verdict says how many it left out, and why
        assert f"{len(kept)} boot(s) vs" in gate["test"]
        assert f"{len(boots) - len(kept)} boot(s) set aside, timed by a client starved of CPU" in gate["test"]


# Accept length per request on SGLang's CPU engine (NGRAM, 4 draft tokens, 8 requests of 96 tokens): identical in
# every run, prompt by prompt (baselines/cpu-engine.yaml), so a degradation shows in each request against itself.
ENGINE_SERIES = (2.4, 2.9091, 1.7455, 1.2308, 2.087, 1.2308, 1.1707, 1.0549)
SIXTEEN = ENGINE_SERIES + tuple(round(1 + (v - 1) * 0.8, 4) for v in ENGINE_SERIES)
PAIRED_ACCEPT = ("accept_length: {value: 1.73, stderr: 0.19, max_drop_stderr: 2, max_drop: 0.11, detect: 0.22, "
                 "per_question: a.json}")


def _accept_gate(tmp_path, base: tuple[float, ...], now: tuple[float, ...]):
    """The paired accept-length gate of a speculative cell whose accept series is ``now``, against ``base``."""
    from dspark_ci.ground.measurements import Acceptance, AcceptDrift
    from dspark_ci.ground.stats import Levels

    (tmp_path / "a.json").write_text(json.dumps({str(i): v for i, v in enumerate(base, 1)}))
    drift = AcceptDrift(None, None, None, 0.0, len(now), "", now)
    cell = replace(SPECULATIVE, acceptance=Acceptance(workload={}, temperature=0.0, positions_source="", drift=drift))
    levels = Levels.family(gates=6, max_boots=8)  # the engine baseline's statistical gates, a run's boots
    gates = evaluate(cell, {"accept_length": sum(now) / len(now), "accept_length_stderr": 0.19},
                     baseline_file(tmp_path, PAIRED_ACCEPT), levels)
    return next(gate for gate in gates if gate.statistic is not None)


def _degraded(series: tuple[float, ...], seed: int) -> tuple[float, ...]:
    """A draft that loses about 30 % of what it had accepted, request by request, with the spread a random
    corruption of 30 % of the verify steps gives."""
    import random
    draw = random.Random(seed)
    return tuple(1 + (value - 1) * draw.uniform(0.45, 0.95) for value in series)


def test_accept_length_paired_over_requests_is_red_on_a_degraded_draft_and_green_when_unchanged(tmp_path):
    gate = _accept_gate(tmp_path, SIXTEEN, SIXTEEN)
    assert gate.verdict == "passed"  # the engine repeats itself
    # one look with the gate's whole alpha, and final: the pairs are the last boot's, so more boots add nothing
    assert gate.statistic.final and gate.statistic.alpha == pytest.approx(0.01 / 6)
    moved = list(SIXTEEN)
    moved[2], moved[5] = moved[2] - 0.12, moved[5] + 0.08  # another host's bf16 ties: a few requests move, both ways
    assert _accept_gate(tmp_path, SIXTEEN, tuple(moved)).verdict == "passed"
    for seed in range(5):
        gate = _accept_gate(tmp_path, SIXTEEN, _degraded(SIXTEEN, seed))
        assert gate.verdict == "regressed" and "of 16 requests" in gate.statistic.test, gate.to_dict()
    # Eight requests cannot exclude no change at the gate's alpha, whatever the drop (8 of 8 worse is p = 0.004 by
    # the sign test): halved, never red (the engine matrix asks 16)
    halved = tuple(1 + (v - 1) / 2 for v in ENGINE_SERIES)
    assert _accept_gate(tmp_path, ENGINE_SERIES, halved).verdict == "inconclusive"


def test_accept_length_is_not_paired_when_a_request_is_missing_from_the_series(tmp_path):
    """A request that verified nothing leaves the series, and every later request would be paired with another
    prompt's figure: the two means are compared instead."""
    gate = _accept_gate(tmp_path, SIXTEEN, SIXTEEN[:-1])
    assert "unpaired" in gate.statistic.test and "over 15 requests" in gate.statistic.test and not gate.statistic.final
