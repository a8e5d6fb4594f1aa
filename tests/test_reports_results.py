"""results.json: written whole or not at all, read back strictly."""

from __future__ import annotations

from dataclasses import replace

import pytest
from dspark_ci.ground.errors import BadInput
from dspark_ci.ground.records import RunResults
from dspark_ci.reports.results import load_results, write_results

RESULTS = RunResults.from_dict({"schema": 1, "run_id": "r1", "started_at": "2025-06-01T12:00:00+00:00",
                                "finished_at": None,
           "launcher": "local", "matrices": ["matrices/smoke.yaml"],
           "cells": [{"id": "a", "config": {}, "expect": {"outcome": "serve"}, "status": "passed", "error": None,
                      "boot_seconds": 1.5, "metrics": {"accept_length": 3.1},
                      "gates": [{"metric": "accept_length", "op": ">=", "threshold": 1.2, "value": 3.1,
                                 "passed": True}]}]})


def test_written_results_read_back_unchanged(tmp_path):
    path = tmp_path / "run" / "results.json"
    write_results(path, RESULTS)
    assert load_results(path) == RESULTS
    assert [p.name for p in path.parent.iterdir()] == ["results.json"]  # no temp file left behind


def test_a_failed_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / "results.json"
    write_results(path, RESULTS)
    with pytest.raises(TypeError):
        write_results(path, _unwritable(RESULTS))
    assert load_results(path) == RESULTS
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_non_finite_metrics_are_written_as_null(tmp_path):
    path = tmp_path / "results.json"
    write_results(path, replace(RESULTS, cells=(replace(RESULTS.cells[0], metrics={"ttft_ms_mean": float("nan")}),)))
    assert dict(load_results(path).cells[0].metrics) == {"ttft_ms_mean": None}


def _unwritable(results: RunResults) -> RunResults:
    """Results holding a value JSON cannot spell (a set), as a bug elsewhere might produce."""
    return replace(results, cells=(replace(results.cells[0], metrics={"bad": {"not", "json"}}),))


def test_missing_results_names_the_file(tmp_path):
    with pytest.raises(BadInput) as caught:
        load_results(tmp_path / "results.json")
    assert str(caught.value).startswith(f"{tmp_path / 'results.json'}: no such file")
