"""Acceptance per category, gated: the accept suite against the simulator, judged by the shipped per-category gates
(baselines/smoke-categories.yaml), with a regression planted in one category (fault category_regression) and without."""

from __future__ import annotations

import pytest
from dspark_ci.ground import stats
from dspark_ci.ground.records import CellResult
from dspark_ci.ground.sglang.settings import CellConfig
from dspark_ci.ground.suites import ACCEPT_CATEGORIES, METRIC_SUITE, category_metric
from dspark_ci.reports.baseline_file import load_baseline
from dspark_ci.reports.gates import describe_gate, evaluate, family_levels

from tests.simulator_process import running_simulator
from tests.suite_runs import REPO, run_suite

CELL = "dsv4-flash-tp8-a2a-none-dspark-b7-cuda"  # the smoke matrix's cell, whose accept options are used here
DSPARK7 = ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", "sim/draft",
           "--speculative-dspark-block-size", "7"]
FAST = {"DSPARK_SIM_DECODE_STEP_MS": "1", "DSPARK_SIM_PREFILL_MS_PER_TOKEN": "0"}


def category_gates(tmp_path, faults: str) -> dict:
    flags = [arg for option in ("num_requests=40", "concurrency=20", "sampled_temperature=0")
             for arg in ("--suite-option", f"accept.{option}")]
    with running_simulator({**FAST, "DSPARK_SIM_FAULTS": faults}, DSPARK7, log_path=tmp_path / "sim.log") as url:
        code, output, log = run_suite(tmp_path, "accept", url, *flags)
    assert code == 0, log
    metrics = output["metrics"]
    cell = CellResult(id=CELL, config=CellConfig(speculative_algorithm="DSPARK"), expect={}, metrics=metrics)
    baseline = load_baseline(REPO / "baselines" / "smoke-categories.yaml")
    gates = evaluate(cell, metrics, baseline, family_levels([cell], baseline))
    return {g.metric: g for g in gates if g.metric.startswith("accept_length_")}


@pytest.mark.parametrize("faults, regressed", [("", None), ("category_regression=code", "accept_length_code")])
def test_a_regression_in_one_category_is_red_by_name_while_the_others_pass(tmp_path, faults, regressed):
    gates = category_gates(tmp_path, faults)
    assert {"accept_length_code", "accept_length_math", "accept_length_long_context"} <= set(gates)
    for metric, gate in gates.items():
        assert gate.statistic is not None and gate.statistic.alpha < stats.RUN_FALSE_RED  # family-wise, statistical
        expected = stats.REGRESSED if metric == regressed else stats.PASSED
        assert gate.verdict == expected, describe_gate(gate)
    if regressed:
        assert describe_gate(gates[regressed]).startswith("accept_length_code = ")


def test_category_figures_come_from_the_accept_workload_never_from_random_text():
    """The speed suite's requests are random text (suites/envelope.py, suites/speed.py): acceptance measured there
    is not draft quality, so no category (or other acceptance) metric is the speed suite's to report."""
    acceptance = [name for name in METRIC_SUITE if name.startswith(("accept_", "sampled_greedy"))]
    assert {category_metric(c) for c in ACCEPT_CATEGORIES} <= set(acceptance)
    assert {METRIC_SUITE[name] for name in acceptance} == {"accept"}
