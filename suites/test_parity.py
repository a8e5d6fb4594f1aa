"""Greedy parity: parity_mismatches, parity_tie_flips; records "parity" (one per prompt: match, tie flip or mismatch,
with the first differing position, both tokens and the reference's logprobs of each).

Options (suite "parity"): num_prompts, max_tokens, concurrency, max_mismatches, top_logprobs, tie_ulps,
drift_factor, max_drift, reference
(what `dspark-ci run` boots as --reference-url: dspark_ci/reference_boot.py). Needs
--reference-url (the same deployment without speculation) or --reference-file (recorded outputs);
--save-reference FILE writes this server's outputs in the reference format.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from dspark_ci.suites.config import SuiteInputError
from dspark_ci.suites.parity import (
    Reference,
    compare_all,
    default_prompts,
    describe,
    generate,
    load_reference,
    save_reference,
    tally,
)
from dspark_ci.suites.parity_ties import MISMATCH, TIE_FLIP, Resolution
from dspark_ci.suites.server import NotTheServer, Server, connect


@pytest.fixture(scope="module")
def reference(suite_config) -> Reference | None:
    options = suite_config.suite("parity")
    if suite_config.reference_file is not None:
        try:
            return load_reference(suite_config.reference_file, options["num_prompts"])
        except SuiteInputError as err:
            pytest.fail(str(err), pytrace=False)
    if suite_config.reference_url is not None or suite_config.save_reference is not None:
        return Reference(prompts=default_prompts(options["num_prompts"]), max_tokens=options["max_tokens"],
                         outputs=None)
    return None


@pytest.fixture(scope="module")
def parity_records(server, reference, suite_config, suite_output):
    if reference is None:
        pytest.skip("parity needs --reference-url URL (the deployment without speculation) or --reference-file FILE")
    options = suite_config.suite("parity")
    tested = generate(server, reference.prompts, reference.max_tokens, options["concurrency"], options["top_logprobs"])
    if suite_config.save_reference is not None:
        save_reference(suite_config.save_reference, server.model, reference.max_tokens, reference.prompts, tested)
    expected = reference.outputs
    if expected is None and suite_config.reference_url is not None:
        reference_server = _reference_server(suite_config)
        expected = generate(reference_server, reference.prompts, reference.max_tokens, options["concurrency"],
                            options["top_logprobs"])
    if expected is None:
        pytest.skip(f"outputs saved to {suite_config.save_reference}; nothing to compare against")

    resolution = Resolution(options["tie_ulps"], drift_factor=options["drift_factor"], max_drift=options["max_drift"])
    records = compare_all(reference.prompts, tested, expected, resolution)
    suite_output.add_metrics(tally(records))
    suite_output.add_records("parity", [record.to_dict() for record in records])
    return records


def _reference_server(suite_config) -> Server:
    try:
        return connect(replace(suite_config, base_url=suite_config.reference_url, model=None))
    except NotTheServer as err:
        problem = str(err)
    pytest.fail(f"the reference server (--reference-url): {problem}", pytrace=False)


def test_parity(parity_records, suite_config):
    errors = [r for r in parity_records if r.error or r.reference_error]
    assert not errors, (f"{len(errors)} prompts failed to generate; first: "
                        f"{errors[0].error or errors[0].reference_error}")
    allowed = suite_config.suite("parity")["max_mismatches"]
    mismatched = [r for r in parity_records if r.verdict == MISMATCH]
    ties = sum(r.verdict == TIE_FLIP for r in parity_records)
    assert len(mismatched) <= allowed, (
        f"{len(mismatched)} of {len(parity_records)} greedy outputs differ from the reference beyond a tie "
        f"(allowed {allowed}; {ties} tie flips not counted); first: {describe(mismatched[0])}")
