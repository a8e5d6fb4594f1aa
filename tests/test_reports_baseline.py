"""Baseline files: every mistake is one message with file:line through `dspark-ci report --baseline`
(exit 2, no traceback); gates too tight for GPQA's sampling error are warned about."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dspark_ci.cli import main

RUN_FIXTURE = Path(__file__).parent / "golden" / "reports" / "run_new"
HEAD = "schema: 1\ncells:\n  smoke-qwen3-eagle3-tp1:\n"  # the cell's metrics start on line 4


@pytest.fixture
def run_dir(tmp_path) -> Path:
    shutil.copytree(RUN_FIXTURE, tmp_path / "run")
    return tmp_path / "run"


def report_with_baseline(tmp_path, run_dir, text: str, capsys) -> tuple[int, str]:
    baseline = tmp_path / "baseline.yaml"
    baseline.write_text(text)
    code = main(["report", str(run_dir), "--baseline", str(baseline)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("text, line, expected", [
    pytest.param("", 1, "the file is empty", id="empty-file"),
    pytest.param("cells: {}\n", 1, "no `schema:` key", id="missing-schema"),
    pytest.param("schema: 2\ncells: {}\n", 1, "schema 2 is not supported", id="unknown-schema"),
    pytest.param("schema: 1\n", 1, "no `cells:` mapping", id="missing-cells"),
    pytest.param("schema: 1\ncells: {}\nthresholds: {}\n", 3, "unknown key 'thresholds'", id="unknown-top-level-key"),
    pytest.param("schema: 1\ncells: [a, b]\n", 2, "`cells` must be a mapping, not a list", id="cells-not-mapping"),
    pytest.param("schema: 1\ncells: {a: [}\n", 2, "not valid YAML", id="yaml-syntax"),
    pytest.param(HEAD + "    accept_len: {min: 1}\n", 4, "unknown metric 'accept_len' (did you mean 'accept_length'?)",
                 id="unknown-metric"),
    pytest.param(HEAD + "    accept_length: 3.1\n", 4, "accept_length must be a mapping, not a number",
                 id="metric-not-mapping"),
    pytest.param(HEAD + "    accept_length: {value: 3, ratio: 0.9}\n", 4, "unknown key 'ratio' for accept_length",
                 id="unknown-gate-key"),
    pytest.param(HEAD + "    accept_length: {value: high, min: 1}\n", 4,
                 "accept_length.value must be a number, not a string",
                 id="value-not-number"),
    pytest.param(HEAD + "    accept_length: {value: 3, min_ratio: 0}\n", 4,
                 "accept_length.min_ratio is 0, it must be more than 0",
                 id="ratio-zero"),
    pytest.param(HEAD + "    accept_length: {value: 3}\n", 4, "accept_length: no gate", id="no-gate"),
    pytest.param(HEAD + "    ttft_ms_median: {value: 50, min_ratio: 0.9}\n", 4,
                 "ttft_ms_median: lower is better, so min_ratio would fail on improvements", id="ratio-wrong-direction"),
    pytest.param(HEAD + "    output_throughput_tok_s: {value: 800, max_ratio: 1.1}\n", 4,
                 "higher is better, so max_ratio would fail on improvements", id="ratio-wrong-direction-higher"),
    pytest.param(HEAD + "    input_tokens_mean: {value: 512, max_ratio: 1.1}\n", 4,
                 "max_ratio on a metric where neither direction is better", id="ratio-on-neutral-metric"),
    pytest.param(HEAD + "    accept_length: {min_ratio: 0.95}\n", 4, "min_ratio needs the reference `value`",
                 id="ratio-without-value"),
    pytest.param(HEAD + "    gpqa_accuracy: {value: 0.6, max_drop_stderr: 2}\n", 4,
                 "max_drop_stderr needs the baseline's `stderr`", id="drop-without-stderr"),
    pytest.param(HEAD + "    accept_rate: {value: 0.3, stderr: 0.1, min: 0.1}\n", 4,
                 "stderr is only known for gpqa_accuracy",
                 id="stderr-on-unsampled-metric"),
    pytest.param(HEAD + "    gpqa_accuracy: {value: 62, min: 55}\n", 4, "write 0.62 for 62%",
                 id="percent-for-fraction"),
    pytest.param(HEAD + "    accept_length: {min: 3, max: 2}\n", 4, "min 3 is above max 2", id="min-above-max"),
    pytest.param(HEAD + "    accept_length: {min: 1}\n    accept_length: {min: 2}\n", 5,
                 "'accept_length' appears twice", id="duplicate-metric"),
    pytest.param(HEAD + "    output_throughput_tok_s: {value: 500, min_ratio: 0.97, noise: 0.01, detect: 0.02}\n", 4,
                 "detect 0.02 is below the tolerance 0.03", id="detect-below-tolerance"),
    pytest.param(HEAD + "    output_throughput_tok_s: {value: 500, min_ratio: 0.97, detect: 0.05}\n", 4,
                 "detect is what a statistical gate's pass rules out, and this gate is a fixed limit",
                 id="detect-on-a-fixed-limit"),
    pytest.param(HEAD + "    accept_length:\n      value: 3\n      min_ratio: true\n", 6,
                 "accept_length.min_ratio must be a number, not true/false", id="bool-not-number"),
])
def test_bad_baseline_exits_2_naming_file_and_line(tmp_path, run_dir, capsys, text, line, expected):
    code, err = report_with_baseline(tmp_path, run_dir, text, capsys)
    assert code == 2
    assert f"baseline.yaml:{line}: " in err and expected in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("gate, warned", [
    pytest.param("{value: 0.62, stderr: 0.034, max_drop_stderr: 2}", None, id="two-stderr-drop-is-fine"),
    pytest.param("{value: 0.62, stderr: 0.034, max_drop_stderr: 1}", "tighter than 2 standard errors",
                 id="one-stderr-drop"),
    pytest.param("{value: 0.62, stderr: 0.034, min_ratio: 0.95}", "less than 2 standard errors",
                 id="ratio-within-noise"),
    pytest.param("{value: 0.62, stderr: 0.034, min: 0.5}", None, id="floor-far-below-noise"),
    pytest.param("{min: 0.55}", "cannot be checked against sampling error", id="floor-without-stderr"),
])
def test_gpqa_gates_tighter_than_noise_are_warned_about(tmp_path, run_dir, capsys, gate, warned):
    code, err = report_with_baseline(tmp_path, run_dir, HEAD + f"    gpqa_accuracy: {gate}\n", capsys)
    assert code == 1  # the fixture run has failed cells either way; the file itself is accepted
    warnings = [line for line in err.splitlines() if "gpqa_accuracy" in line]
    if warned:
        assert len(warnings) == 1 and "baseline.yaml:4:" in warnings[0] and warned in warnings[0]
    else:
        assert warnings == []


def test_baseline_entry_matching_no_cell_is_warned_about(tmp_path, run_dir, capsys):
    text = "schema: 1\ncells:\n  smoke-qwen3-eagle-tp1:\n    accept_length: {min: 1}\n"
    _, err = report_with_baseline(tmp_path, run_dir, text, capsys)
    assert "baseline.yaml:3: 'smoke-qwen3-eagle-tp1' matches no cell" in err


def test_shipped_smoke_baseline_is_valid_and_quiet():
    from dspark_ci.reports.baseline_file import load_baseline

    baseline = load_baseline(Path(__file__).parents[1] / "baselines" / "smoke.yaml")
    assert baseline.warnings == ()
    assert "gpqa_accuracy" in baseline.specs_for("dsv4-flash-tp8-a2a-none-dspark-b7-cuda")


def test_a_metric_too_noisy_to_gate_is_left_out_of_the_proposal_and_the_file_reads_back(tmp_path):
    """On a loaded machine TTFT can vary by half between runs: the proposal must not write a gate its own loader
    refuses (exit 2 on the next run); it leaves that metric ungated and says so in the file's header."""
    import dataclasses

    from dspark_ci.reports.baseline_file import load_baseline
    from dspark_ci.reports.baseline_proposal import propose
    from dspark_ci.reports.results import load_results

    fixture = load_results(RUN_FIXTURE / "results.json")
    first = dataclasses.replace(fixture, cells=fixture.cells[:1])  # its one passed cell: a good run
    cell = first.cells[0]
    slower = dataclasses.replace(cell, metrics={**cell.metrics, "ttft_ms_median": cell.metrics["ttft_ms_median"] * 2})
    second = dataclasses.replace(first, cells=(slower,))
    proposal = propose([("a", first), ("b", second)])
    path = tmp_path / "baseline.yaml"
    path.write_text(proposal.text)
    gates = load_baseline(path).specs_for(cell.id)  # raises BadInput (exit 2) if a gate is written that cannot be read
    assert "ttft_ms_median" not in gates
    assert "tpot_ms_median" in gates  # the steady metrics are still gated
    assert f"{cell.id}: ttft_ms_median (noise 47% run to run)" in proposal.text


def test_identical_runs_never_record_a_zero_noise(tmp_path):
    """Two identical runs (a deterministic server) measure no run-to-run noise: the proposal writes the per-request
    standard error as its lower bound where one was measured, says so in the header, and the file reads back."""
    import dataclasses

    from dspark_ci.reports.baseline_file import load_baseline
    from dspark_ci.reports.baseline_proposal import propose
    from dspark_ci.reports.results import load_results

    fixture = load_results(RUN_FIXTURE / "results.json")
    first = dataclasses.replace(fixture, cells=fixture.cells[:1])
    cell = first.cells[0]
    with_error = dataclasses.replace(cell, metrics={**cell.metrics, "tpot_ms_median_stderr":
                                                     cell.metrics["tpot_ms_median"] * 0.03})
    run = dataclasses.replace(first, cells=(with_error,))
    proposal = propose([("a", run), ("b", run)])
    path = tmp_path / "baseline.yaml"
    path.write_text(proposal.text)
    spec = load_baseline(path).specs_for(cell.id)["tpot_ms_median"]
    assert spec.noise == pytest.approx(0.03) and spec.request_noise == pytest.approx(0.03)
    assert "tpot_ms_median: the 2 runs were identical, which measures no noise; written as its lower bound" in \
        proposal.text
    throughput = load_baseline(path).specs_for(cell.id).get("output_throughput_tok_s")
    assert throughput is None or not throughput.noise  # nothing to bound it with: no noise written, never 0


def test_baseline_record_writes_per_position_and_per_category_gates(tmp_path):
    """Acceptance by draft position and by category is recorded as accept length is: value, noise over the runs,
    per-request noise, and a 10 % ratio gate that reads back as a statistical gate."""
    import dataclasses

    from dspark_ci.reports.baseline_file import load_baseline
    from dspark_ci.reports.baseline_proposal import propose
    from dspark_ci.reports.gates import statistical_gates
    from dspark_ci.reports.results import load_results

    fixture = load_results(RUN_FIXTURE / "results.json")
    cell = fixture.cells[0]
    runs = []
    for shift in (1.0, 1.01, 0.99):
        acceptance = {"accept_length_code": 3.6 * shift, "accept_length_code_stderr": 0.12,
                      "accept_length_long_context": 2.0 * shift, "accept_length_long_context_stderr": 0.06,
                      "accept_rate_pos1": 0.66 * shift, "accept_rate_pos1_stderr": 0.02}
        measured = dataclasses.replace(cell, metrics={**cell.metrics, **acceptance})
        runs.append((f"run{shift}", dataclasses.replace(fixture, cells=(measured,))))
    path = tmp_path / "baseline.yaml"
    path.write_text(propose(runs).text)
    baseline = load_baseline(path)
    specs = baseline.specs_for(cell.id)
    for metric, value in (("accept_length_code", 3.6), ("accept_length_long_context", 2.0), ("accept_rate_pos1", 0.66)):
        spec = specs[metric]
        assert spec.value == pytest.approx(value) and spec.min_ratio == 0.9 and spec.runs == 3
        assert spec.noise == pytest.approx(0.01, rel=0.01) and spec.request_noise
    assert statistical_gates(cell, baseline) >= 3


def test_baseline_record_writes_the_boundary_every_run_reached_as_an_envelope_gate(tmp_path):
    """Where speculation pays is recorded as the envelope gate: the smallest boundary the good runs read (a busy
    run reads it lower, and each recorded run must pass its own baseline), never moving inward."""
    import dataclasses

    from dspark_ci.reports.baseline_file import load_baseline
    from dspark_ci.reports.baseline_proposal import propose
    from dspark_ci.reports.results import load_results

    fixture = load_results(RUN_FIXTURE / "results.json")
    cell = fixture.cells[0]
    runs = [(f"run{b}", dataclasses.replace(fixture, cells=(dataclasses.replace(
        cell, metrics={**cell.metrics, "speculation_boundary_concurrency": b}),)))
        for b in (128.0, 61.4, 97.0)]
    path = tmp_path / "baseline.yaml"
    path.write_text(propose(runs).text)
    spec = load_baseline(path).specs_for(cell.id)["speculation_boundary_concurrency"]
    assert spec.value == 61 and spec.never_inward


def test_baseline_record_writes_a_ceiling_on_blocked_time_and_the_speedup_with_its_request_noise(tmp_path):
    """The scheduler's blocked time per token is recorded as a ceiling over the runs (it sits near zero and a planted
    sleep adds to it, not a ratio of it); the speedup over the reference as a statistical ratio gate whose per-request
    part is the suite's bootstrap error."""
    import dataclasses

    from dspark_ci.reports.baseline_file import load_baseline
    from dspark_ci.reports.baseline_proposal import RECORDED_CEILINGS, propose
    from dspark_ci.reports.gates import evaluate
    from dspark_ci.reports.results import load_results

    fixture = load_results(RUN_FIXTURE / "results.json")
    cell = fixture.cells[0]
    readings = ((0.4, 1.9), (2.3, 2.0), (1.1, 1.8))
    runs = [(f"run{blocked}", dataclasses.replace(fixture, cells=(dataclasses.replace(cell, metrics={
        **cell.metrics, "scheduler_blocked_ms_per_token": blocked, "speculative_speedup": speedup,
        "speculative_speedup_stderr": 0.05}),))) for blocked, speedup in readings]
    path = tmp_path / "baseline.yaml"
    path.write_text(propose(runs).text)
    specs = load_baseline(path).specs_for(cell.id)
    ceiling = specs["scheduler_blocked_ms_per_token"]
    assert ceiling.value == pytest.approx(1.1)
    factor, least = RECORDED_CEILINGS["scheduler_blocked_ms_per_token"]
    assert ceiling.max == pytest.approx(max(factor * 2.3, least))
    speedup = specs["speculative_speedup"]
    assert speedup.min_ratio == 0.95 and speedup.runs == 3 and speedup.request_noise == pytest.approx(0.05 / 1.9,
                                                                                                      rel=0.05)
    slept = {**cell.metrics, "scheduler_blocked_ms_per_token": 10.0}
    [gate] = [g for g in evaluate(dataclasses.replace(cell, metrics=slept), slept, load_baseline(path))
              if g.metric == "scheduler_blocked_ms_per_token"]
    assert not gate.passed  # a 20 ms sleep per decode step at two streams: 10 ms a token


def test_a_ceiling_from_quiet_runs_keeps_room_for_a_page_fault(tmp_path):
    # SGLang's engine read 0.1 ms of blocked time a token in quiet runs: twice that would fail a healthy run that met
    # one page fault, while a 20 ms sleep per decode step adds 10 ms at two streams either way.
    import dataclasses

    from dspark_ci.reports.baseline_file import load_baseline
    from dspark_ci.reports.baseline_proposal import RECORDED_CEILINGS, propose
    from dspark_ci.reports.results import load_results

    fixture = load_results(RUN_FIXTURE / "results.json")
    cell = fixture.cells[0]
    runs = [(f"run{blocked}", dataclasses.replace(fixture, cells=(dataclasses.replace(cell, metrics={
        **cell.metrics, "scheduler_blocked_ms_per_token": blocked}),))) for blocked in (0.10, 0.12, 0.11)]
    path = tmp_path / "baseline.yaml"
    path.write_text(propose(runs).text)
    ceiling = load_baseline(path).specs_for(cell.id)["scheduler_blocked_ms_per_token"]
    _, least = RECORDED_CEILINGS["scheduler_blocked_ms_per_token"]
    assert ceiling.value == pytest.approx(0.11) and ceiling.max == pytest.approx(least) and 0.24 < least < 10


def test_a_cpu_cell_records_no_absolute_speed_and_a_model_at_chance_no_gpqa_accuracy(tmp_path):
    # Two quiet runs of SGLang's engine on the 2-core CPU read TTFT 30 % apart: gating it would gate the machine.
    import dataclasses

    import yaml
    from dspark_ci.reports.baseline_proposal import propose
    from dspark_ci.reports.results import load_results

    fixture = load_results(RUN_FIXTURE / "results.json")
    cell = fixture.cells[0]
    metrics = {**cell.metrics, "tpot_ms_median": 110.0, "ttft_ms_median": 3200.0, "output_throughput_tok_s": 9.0,
               "gpqa_accuracy": 0.25}

    def recorded(device: str, suites: dict) -> dict:
        moved = dataclasses.replace(cell, config=dataclasses.replace(cell.config, device=device), suites=suites,
                                    metrics=metrics)
        proposal = propose([(f"run{i}", dataclasses.replace(fixture, cells=(moved,))) for i in range(3)]).text
        return yaml.safe_load(proposal)["cells"][cell.id] | {"#": proposal}

    on_cpu = recorded("cpu", {"gpqa": {"answers_at_chance": True}})
    assert not {"tpot_ms_median", "ttft_ms_median", "output_throughput_tok_s", "gpqa_accuracy"} & set(on_cpu)
    assert "Not recorded: " in on_cpu["#"] and "absolute speed on a CPU" in on_cpu["#"]
    on_gpu = recorded("cuda", {})
    assert {"tpot_ms_median", "ttft_ms_median", "gpqa_accuracy"} <= set(on_gpu) and "Not recorded" not in on_gpu["#"]
