"""The gate on where speculation pays: the boundary must not move inward of the baseline's, shown statistically at
every sweep point up to it (dspark_ci.reports.gates.envelope_statistic), on the simulator with and without the planted
shift and on hand-made envelopes at the edges of the rule."""

from __future__ import annotations

import pytest
from dspark_ci.ground import stats
from dspark_ci.ground.measurements import Envelope, EnvelopeBoundary, EnvelopePoint
from dspark_ci.ground.records import CellResult
from dspark_ci.ground.sglang.settings import CellConfig
from dspark_ci.reports.baseline_file import load_baseline
from dspark_ci.reports.gates import evaluate, status_of

from tests.simulator_process import running_simulator
from tests.suite_runs import run_suite

DSPARK7 = ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", "sim/draft",
           "--speculative-dspark-block-size", "7"]
GRID = "[1, 8, 32, 128]"
# Long steps and short replies, so every stream of a point is open at once; a verify step's cost grows 0.01 of a
# decode step per running request past 8, so a clean server still pays at 128 streams (cost 2.2 against an accept
# length near 3.1). envelope_shift=9 makes that 0.09: break-even near 32 streams, far below it at 128.
SIM = {"DSPARK_SIM_DECODE_STEP_MS": "100", "DSPARK_SIM_PREFILL_MS_PER_TOKEN": "0", "DSPARK_SIM_SPEC_BATCH_COST": "0.01"}
SHIFT_TO_32 = "envelope_shift=9"


def baseline(tmp_path, value: float = 128):
    path = tmp_path / "baseline.yaml"
    path.write_text(f"schema: 1\ncells:\n  c:\n    speculation_boundary_concurrency: {{value: {value:g}, "
                    "never_inward: true}\n")
    return load_baseline(path)


def gate_of(envelope: Envelope, tmp_path, value: float = 128):
    boundary = envelope.boundaries[str(envelope.shortest_input_len)].concurrency
    metrics = {"speculation_boundary_concurrency": boundary}
    cell = CellResult(id="c", config=CellConfig(speculative_algorithm="DSPARK"), expect={}, metrics=metrics,
                      envelope=envelope)
    gates = evaluate(cell, metrics, baseline(tmp_path, value))
    [gate] = [g for g in gates if g.metric == "speculation_boundary_concurrency"]
    return gate, status_of(gates)


def measured(tmp_path, faults: str) -> Envelope:
    tmp_path.mkdir()
    options = ["speed.num_requests=4", "speed.concurrency=2", "speed.output_len=16", "speed.warmup_requests=0",
               f"speed.sweep_concurrency={GRID}", "speed.sweep_input_len=[256]", "speed.sweep_output_len=16"]
    flags = [arg for option in options for arg in ("--suite-option", option)]
    env = {**SIM, "DSPARK_SIM_FAULTS": faults}
    with running_simulator(env, DSPARK7, log_path=tmp_path / "sim.log") as url, \
            running_simulator(env, [], log_path=tmp_path / "reference.log") as reference:
        code, output, log = run_suite(tmp_path, "speed", url, "--reference-url", reference, *flags)
    assert code == 0, log
    [record] = output["records"]["speed_envelope"]
    return Envelope.from_dict(record)


@pytest.mark.parametrize("faults, verdict", [("", stats.PASSED), (SHIFT_TO_32, stats.REGRESSED)])
def test_a_boundary_moved_inward_to_32_streams_is_red_and_a_clean_one_green(tmp_path, faults, verdict):
    envelope = measured(tmp_path / "sweep", faults)
    gate, _ = gate_of(envelope, tmp_path)
    assert gate.verdict == verdict, (gate, envelope.points)
    statistic = gate.statistic
    assert statistic is not None and "Bonferroni" in statistic.test and "vs the baseline's 128" in statistic.test
    if verdict == stats.REGRESSED:  # shown below break-even, with its interval wholly below 1
        assert statistic.high < 0 and gate.value is not None and gate.value < 64, gate


def point(concurrency: int, speedup: float, stderr: float | None, requests: int = 32) -> EnvelopePoint:
    return EnvelopePoint(concurrency, 256, requests, 10.0, 10.0 * speedup, speedup, stderr)


def envelope_of(*points: EnvelopePoint) -> Envelope:
    return Envelope(points, {"256": EnvelopeBoundary(float(points[-1].concurrency), True)}, "random text", "")


@pytest.mark.parametrize("speedups, verdict", [
    ((3.0, 2.0, 1.4, 1.3), stats.PASSED),  # pays everywhere, clearly
    ((3.0, 2.0, 1.4, 1.02), stats.INCONCLUSIVE),  # the last point straddles break-even: neither green nor red
    ((3.0, 2.0, 1.4, 0.7), stats.REGRESSED),  # the last point is shown below 1
])
def test_each_point_up_to_the_boundary_is_judged_against_break_even(tmp_path, speedups, verdict):
    envelope = envelope_of(*(point(c, s, 0.06 * s) for c, s in zip((1, 8, 32, 128), speedups, strict=False)))
    gate, status = gate_of(envelope, tmp_path)
    assert gate.verdict == verdict, gate.statistic
    assert status.value == {stats.PASSED: "passed", stats.INCONCLUSIVE: "inconclusive",
                            stats.REGRESSED: "failed"}[verdict]


def test_points_beyond_the_baseline_boundary_are_not_held_to_it(tmp_path):
    envelope = envelope_of(point(1, 3.0, 0.1), point(8, 2.0, 0.1), point(32, 1.5, 0.05), point(128, 0.5, 0.02))
    gate, _ = gate_of(envelope, tmp_path, value=40)  # 128 lies outward of the baseline's boundary
    assert gate.verdict == stats.PASSED, gate.statistic


def test_a_boundary_wholly_inward_between_grid_points_is_red(tmp_path):
    """No grid point at or below 100 fails, but the speedup falls to 1 well inside it: the boundary's interval
    (from the points' upper ends) lies wholly below the baseline's 100."""
    envelope = envelope_of(point(1, 3.0, 0.05), point(32, 1.05, 0.01), point(128, 0.5, 0.01))
    gate, _ = gate_of(envelope, tmp_path, value=100)
    assert gate.verdict == stats.REGRESSED and "boundary" in gate.statistic.test, gate.statistic


def test_a_point_of_one_request_cannot_decide(tmp_path):
    envelope = envelope_of(point(1, 3.0, None, requests=1), point(8, 2.0, 0.1))
    gate, _ = gate_of(envelope, tmp_path, value=8)
    assert gate.verdict == stats.INCONCLUSIVE


def test_no_sweep_is_not_measured_and_fails(tmp_path):
    cell = CellResult(id="c", config=CellConfig(speculative_algorithm="DSPARK"), expect={}, metrics={})
    [gate] = [g for g in evaluate(cell, {}, baseline(tmp_path)) if g.metric == "speculation_boundary_concurrency"]
    assert gate.value is None and not gate.passed


@pytest.mark.parametrize("text, message", [
    ("{never_inward: true}", "never_inward needs the baseline's boundary `value`"),
    ("{value: 128, never_inward: 1}", "must be true or false"),
])
def test_a_never_inward_spec_without_its_boundary_is_refused(tmp_path, text, message):
    from dspark_ci.ground.errors import BadInput

    path = tmp_path / "b.yaml"
    path.write_text(f"schema: 1\ncells:\n  c:\n    speculation_boundary_concurrency: {text}\n")
    with pytest.raises(BadInput, match=message):
        load_baseline(path)
