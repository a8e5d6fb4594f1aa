"""`dspark-ci report NEW --compare OLD` knows the noise: a wobble reads "within noise", a real change does not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dspark_ci.cli import main


def write_run(run_dir: Path, run_id: str, metrics: dict) -> Path:
    """A run directory with one passed cell that measured ``metrics``."""
    cell = {"id": "cell-a", "config": {}, "expect": {"outcome": "serve", "message": None, "sglang": None},
            "status": "passed", "error": None, "boot_seconds": 1.0, "metrics": metrics, "gates": []}
    run_dir.mkdir()
    (run_dir / "results.json").write_text(json.dumps({
        "schema": 1, "run_id": run_id, "started_at": "2025-06-01T12:00:00+00:00", "finished_at": "2025-06-01T12:10:00+00:00",
        "launcher": "local", "matrices": [], "cells": [cell]}))
    return run_dir


def compare(tmp_path: Path, capsys, old: dict, new: dict) -> dict[str, str]:
    """metric -> change, from `dspark-ci report NEW --compare OLD --format json`."""
    old_dir, new_dir = write_run(tmp_path / "old", "old", old), write_run(tmp_path / "new", "new", new)
    assert main(["report", str(new_dir), "--compare", str(old_dir), "--format", "json"]) == 0
    (cell,) = json.loads(capsys.readouterr().out)["cells"]
    return {row["metric"]: row["change"] for row in cell["metrics"]}


@pytest.mark.parametrize("metric, old, new, change", [
    pytest.param("tpot_ms_median", 9.50, 9.51, "within_noise", id="tpot-wobble-0.1pct-is-noise"),
    pytest.param("output_throughput_tok_s", 840.0, 830.0, "within_noise", id="throughput-dip-1.2pct-is-noise"),
    pytest.param("accept_length", 3.10, 3.07, "within_noise", id="accept-length-dip-1pct-is-noise"),
    pytest.param("output_throughput_tok_s", 840.0, 756.0, "worse", id="throughput-drop-10pct-is-worse"),
    pytest.param("tpot_ms_median", 9.50, 11.0, "worse", id="tpot-up-16pct-is-worse"),
    pytest.param("ttft_ms_median", 41.0, 36.0, "better", id="ttft-down-12pct-is-better"),
    pytest.param("accept_length", 3.10, 1.00, "worse", id="accept-collapse-is-worse"),
    pytest.param("parity_mismatches", 0, 1, "worse", id="one-parity-mismatch-is-worse"),
    pytest.param("tpot_ms_median", 9.50, 9.50, "same", id="identical-is-same"),
])
def test_relative_noise_bands(tmp_path, capsys, metric, old, new, change):
    assert compare(tmp_path, capsys, {metric: old}, {metric: new})[metric] == change


# 2·√(se_old² + se_new²) with se 0.035 on both sides is 0.099: a drop of 7 points is luck, 12 is not.
@pytest.mark.parametrize("old, new, change", [
    pytest.param((0.62, 0.035), (0.55, 0.035), "within_noise", id="gpqa-drop-within-2se-is-noise"),
    pytest.param((0.62, 0.035), (0.50, 0.035), "worse", id="gpqa-drop-beyond-2se-is-worse"),
    pytest.param((0.50, 0.035), (0.62, 0.035), "better", id="gpqa-gain-beyond-2se-is-better"),
    pytest.param((0.62, 0.010), (0.58, 0.010), "worse", id="gpqa-4pt-drop-with-small-stderr-is-worse"),
    pytest.param((0.62, 0.035), (0.55, None), "within_noise", id="gpqa-missing-stderr-assumed-as-noisy"),
    pytest.param((0.62, None), (0.61, None), "worse", id="gpqa-without-any-stderr-every-change-counts"),
])
def test_gpqa_noise_is_sampling_error(tmp_path, capsys, old, new, change):
    def metrics(accuracy_and_stderr):
        accuracy, stderr = accuracy_and_stderr
        return {"gpqa_accuracy": accuracy, **({"gpqa_stderr": stderr} if stderr is not None else {})}
    assert compare(tmp_path, capsys, metrics(old), metrics(new))["gpqa_accuracy"] == change


def test_markdown_reads_within_noise_and_states_the_rule(tmp_path, capsys):
    old_dir = write_run(tmp_path / "old", "old", {"tpot_ms_median": 9.50})
    new_dir = write_run(tmp_path / "new", "new", {"tpot_ms_median": 9.51})
    assert main(["report", str(new_dir), "--compare", str(old_dir)]) == 0
    out = capsys.readouterr().out
    assert "| Median TPOT (ms) | 9.50 | 9.51 | 1.001 | lower | ≈ within noise |" in out
    assert "Changes smaller than noise read ≈ within noise" in out
