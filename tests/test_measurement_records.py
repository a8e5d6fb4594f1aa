"""What the suites measured beyond metrics travels as records (ground/measurements.py): results.json reads into them
and is written back byte for byte, so files written before they were records read, and a reader sees types."""

from __future__ import annotations

import json

import pytest
from dspark_ci.ground.measurements import GpqaSummary
from dspark_ci.ground.records import CellResult, Expect, RunResults
from dspark_ci.reports.markdown import _config_line
from dspark_ci.reports.results import results_text

from tests.test_results_schema import validator

# One cell as the suites' notes wrote it before they were records: every optional measurement present.
CELL = {
    "id": "c", "config": {"model": "m", "device": "cuda", "nnodes": 1, "gpus_per_node": 8, "tp": 8, "dp": 1,
                          "enable_dp_attention": False, "enable_dp_lm_head": False, "cp": 1, "pp": 1,
                          "moe_a2a_backend": "none", "speculative_algorithm": "DSPARK", "speculative_block_size": 7},
    "expect": {"outcome": "serve", "message": None, "sglang": None}, "runner": None, "suites": {}, "baseline": None,
    "status": "passed", "error": None, "boot_seconds": 2.0, "metrics": {"accept_length": 3.1},
    "gates": [], "warnings": [],
    "tests": [{"nodeid": "suites/test_accept.py::test_accept_statistics_reported", "outcome": "passed",
               "duration": 1.25, "message": None},
              {"nodeid": "suites/test_gpqa.py::test_gpqa", "outcome": "failed", "duration": 0.5,
               "message": "AssertionError: 3 requests failed"}],
    "gpqa": {"scorer": "sglang", "partial": False, "samples": 4, "planned_samples": 4, "accuracy": 0.75,
             "cli_differences": ["max_tokens"], "per_question": {"q1": [1, 2], "q2": [2, 2]}},
    "acceptance": {
        "workload": {"source": "builtin", "rows": 3, "long_context": "builtin document"}, "temperature": 0.0,
        "positions_source": "server: spec_correct_drafts_histogram per request (sglext)",
        "positions": [{"position": 1, "accepted": 8, "proposed": 10, "rate": 0.8, "stderr": 0.05},
                      {"position": 2, "accepted": 0, "proposed": 10, "rate": 0.0, "stderr": None}],
        "accept_length_histogram": {"1": 2, "2": 8},
        "categories": {"code": {"requests": 2, "accept_length": None, "positions": [{"position": 1, "rate": 0.8}],
                                "accept_length_histogram": {"2": 8}}},
        "drift": {"change_at_request": 12, "before": 3.2, "after": 2.1, "noise": 0.1, "requests": 40,
                  "method": "ruptures PELT", "series": [3.2, 2.1]},
        "sampled": {"temperature": 0.7, "top_p": 0.95, "accept_length": 2.9, "positions": [], "categories": {}},
        "lossless": {"prompts": 4, "tokens": 16, "temperature": 0.7, "top_p": 0.95,
                     "speculative": {"greedy_like": 3, "samples": 8, "failed": 0},
                     "reference": {"greedy_like": 4, "samples": 8, "failed": 1}, "greedy_equal": 4,
                     "samples": 8, "family_p": 0.5, "untested": 1,
                     "positions": [{"prompt": 0, "position": 2, "categories": 2, "samples": 8, "statistic": 0.5,
                                    "dof": 1, "p_value": 0.48, "adjusted_p": 0.5, "token": 1234,
                                    "speculative_share": 0.5, "reference_share": 0.4}]}},
    "envelope": {"points": [{"concurrency": 8, "input_len": 256, "requests": 8, "tpot_ms_speculative": 10.0,
                             "tpot_ms_reference": 20.0, "speedup": 2.0, "speedup_stderr": None}],
                 "boundaries": {"256": {"concurrency": 8.0, "censored": True}}, "dataset": "random text",
                 "method": "median TPOT"},
    "boots": [{"accept_length": 3.0, "tpot_ms_median": None}, {"accept_length": 3.2}],
}


def _file(*cells: dict) -> dict:
    return {"schema": 2, "run_id": "r", "started_at": None, "finished_at": None, "launcher": "local",
            "matrices": ["m.yaml"], "cells": list(cells)}


def test_every_measurement_reads_into_records_and_writes_back_byte_for_byte():
    written = _file(CELL)
    results = RunResults.from_dict(written)
    assert results_text(results) == json.dumps(written, indent=2) + "\n"
    assert list(validator().iter_errors(written)) == []
    cell = results.cells[0]
    assert cell.config is not None and cell.config.tp == 8 and cell.speculative
    assert cell.failed_tests == ["suites/test_gpqa.py::test_gpqa: AssertionError: 3 requests failed"]
    assert {test.suite for test in cell.tests or ()} == {"accept", "gpqa"}
    assert cell.gpqa is not None and cell.gpqa.per_question["q1"] == (1, 2)
    assert cell.gpqa.cli_differences == ("max_tokens",)
    assert [boot.value("accept_length") for boot in cell.boots] == [3.0, 3.2]
    assert cell.boots[1].value("tpot_ms_median") is None
    assert cell.acceptance is not None and cell.acceptance.lossless is not None
    assert cell.acceptance.lossless.reference is not None and cell.acceptance.lossless.reference.failed == 1
    assert cell.acceptance.drift is not None and cell.acceptance.drift.change_at_request == 12
    assert cell.envelope is not None and cell.envelope.boundaries["256"].censored


def test_a_lossless_check_that_was_skipped_and_a_greedy_only_cell_write_only_what_they_say():
    acceptance = {key: value for key, value in CELL["acceptance"].items() if key != "sampled"}
    acceptance["lossless"] = {"skipped": "no non-speculative reference (--reference-url)"}
    written = _file({**CELL, "acceptance": acceptance})
    assert results_text(RunResults.from_dict(written)) == json.dumps(written, indent=2) + "\n"
    assert list(validator().iter_errors(written)) == []


def test_a_cell_whose_config_is_unknown_reads_as_none_and_is_written_empty():
    """A nightly merge names a cell whose shard never reported: it knows no config, and says none."""
    missing = {key: CELL[key] for key in ("id", "expect", "runner", "suites", "baseline", "error", "boot_seconds",
                                          "metrics", "gates", "warnings")} | {"config": {}, "status": "error",
                                                                              "boot_seconds": None}
    cell = RunResults.from_dict(_file(missing)).cells[0]
    assert cell.config is None and not cell.speculative and cell.to_dict()["config"] == {}
    assert _config_line(cell) == ""


def test_results_json_objects_given_where_records_belong_are_refused_by_name():
    with pytest.raises(TypeError, match="gpqa is not a GpqaSummary.*boots holds a dict, not a BootMetrics"):
        CellResult("c", None, Expect(), gpqa={"scorer": "sglang"}, boots=({"accept_length": 3.0},))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="config is not a CellConfig"):
        CellResult("c", {"tp": 8}, Expect())  # type: ignore[arg-type]
    assert CellResult("c", None, Expect(), gpqa=GpqaSummary()).gpqa == GpqaSummary.from_dict({})


def test_a_file_that_breaks_a_record_shape_fails_validation():
    tally = _file({**CELL, "gpqa": {**CELL["gpqa"], "per_question": {"q1": [1, 2, 3]}}})
    test = _file({**CELL, "tests": [{"nodeid": "x"}]})
    assert ("$.cells[0].gpqa.per_question.q1", "[1, 2, 3] is too long") in _problems(tally)
    assert ("$.cells[0].tests[0]", "'outcome' is a required property") in _problems(test)


def _problems(written: dict) -> set[tuple[str, str]]:
    """(where, what) of every validation error, those under an anyOf's branches included."""
    found, errors = set(), list(validator().iter_errors(written))
    while errors:
        error = errors.pop()
        found.add((error.json_path, error.message))
        errors += error.context or []
    return found
