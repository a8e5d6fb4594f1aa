"""results.json against its JSON Schema (docs/results.schema.json, generated from ground/records.py): the checked-in
file is the generated one, what a real run writes validates, and every older version still reads."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from dspark_ci.ground import results_schema
from dspark_ci.ground.records import READERS, SCHEMA, SCHEMA_VERSIONS, RunResults
from dspark_ci.reports.results import load_results

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


def assert_written_run_validates(out: Path) -> None:
    """What a real run wrote validates and reads back the same. tests/test_run_cli.py's smoke run calls it: a serving
    cell measured with gates (statistical ones included) and an expected rejection, as a user runs it."""
    written = json.loads((out / "results.json").read_text())
    errors = [f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in validator().iter_errors(written)]
    assert errors == []
    assert written["schema"] == SCHEMA
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
