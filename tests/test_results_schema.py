"""results.json against its JSON Schema (docs/results.schema.json, generated from ground/records.py): the checked-in
file is the generated one, what a real run writes validates, and every older version still reads."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import jsonschema
import pytest
from dspark_ci.ground import results_schema
from dspark_ci.ground.records import READERS, SCHEMA, SCHEMA_VERSIONS, RunResults
from dspark_ci.reports.results import load_results

from tests.cli_under_test import DSPARK_CI
from tests.test_run_cli import FEW_BOOTS

REPO = Path(__file__).resolve().parent.parent
GOLDEN_V1 = REPO / "tests" / "golden" / "reports" / "run_old" / "results.json"
SCHEMA_FILE = REPO / "docs" / "results.schema.json"


def validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def test_the_checked_in_schema_is_the_generated_one():
    assert SCHEMA_FILE.read_text() == results_schema.schema_text(), \
        "docs/results.schema.json is stale: run `python -m dspark_ci.ground.results_schema --write`"


def test_every_version_is_named_and_has_a_reader():
    assert set(READERS) == set(SCHEMA_VERSIONS) and SCHEMA == max(READERS)
    assert f"schema {SCHEMA}" in (REPO / "docs" / "CONTRACT.md").read_text()


def test_a_real_run_validates(tmp_path):
    """A serving cell measured with gates (statistical ones included) and an expected rejection, as a user runs it."""
    env = {**os.environ, "DSPARK_STATE_DIR": str(tmp_path / "state"), "DSPARK_HISTORY": str(tmp_path / "h.sqlite")}
    out = tmp_path / "run"
    done = subprocess.run([*DSPARK_CI, "run", "matrices/smoke.yaml", "--cell", "dsv4-flash-tp8-a2a-none-dspark-b7-cuda",
                           "--cell", "dsv4-flash-tp8-dp4-dpattn-a2a-none-dspark-b7-cuda", "--suites", "accept,speed", "--out", str(out), "--quiet",
                           *FEW_BOOTS],  # the shape is under test: a gate undecided at two boots is one more shape
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert (out / "results.json").exists(), done.stderr
    written = json.loads((out / "results.json").read_text())
    errors = [f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in validator().iter_errors(written)]
    assert errors == []
    assert written["schema"] == SCHEMA and len(written["cells"]) == 2
    gates = [gate for cell in written["cells"] for gate in cell["gates"]]
    assert gates and any("test" in gate for gate in gates), "no statistical gate: the statistic's keys went unchecked"
    assert load_results(out / "results.json").to_dict() == written  # what is written reads back the same


def test_a_version_1_file_reads_and_comes_out_as_the_current_version():
    old = json.loads(GOLDEN_V1.read_text())
    assert old["schema"] == 1
    old["cells"][0]["detail"] = "ValueError: the line SGLang printed"  # what version 1 called sglang_error
    upgraded = RunResults.from_dict(old).to_dict()
    assert upgraded["schema"] == SCHEMA and upgraded["cells"][0]["sglang_error"] == old["cells"][0]["detail"]
    assert list(validator().iter_errors(upgraded)) == []


def test_an_unknown_version_is_refused_by_name():
    with pytest.raises(ValueError, match=r"schema 99 is not one of \[1, 2\]"):
        RunResults.from_dict({"schema": 99, "cells": []})


def test_a_key_the_writer_does_not_declare_fails_validation():
    written = RunResults.from_dict(json.loads(GOLDEN_V1.read_text())).to_dict()
    written["cells"][0]["surprise"] = 1
    assert [error.message for error in validator().iter_errors(written)] == [
        "Additional properties are not allowed ('surprise' was unexpected)"]
