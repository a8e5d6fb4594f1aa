"""Greedy parity: parity_mismatches; records "parity" (one per prompt, with the first differing position).

Options (suite "parity"): num_prompts, max_tokens, concurrency, max_mismatches. Needs
--reference-url (the same deployment without speculation) or --reference-file (recorded outputs);
--save-reference FILE writes this server's outputs in the reference format.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from suites.config import SuiteInputError
from suites.parity import Reference, compare, default_prompts, generate, load_reference, save_reference
from suites.server import NotTheServer, Server, connect


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
    tested = generate(server, reference.prompts, reference.max_tokens, options["concurrency"])
    if suite_config.save_reference is not None:
        save_reference(suite_config.save_reference, server.model, reference.max_tokens, reference.prompts, tested)
    expected = reference.outputs
    if expected is None and suite_config.reference_url is not None:
        reference_server = _reference_server(suite_config)
        expected = generate(reference_server, reference.prompts, reference.max_tokens, options["concurrency"])
    if expected is None:
        pytest.skip(f"outputs saved to {suite_config.save_reference}; nothing to compare against")

    records = [compare(i, prompt, ours, theirs)
               for i, (prompt, ours, theirs) in enumerate(zip(reference.prompts, tested, expected, strict=False))]
    suite_output.add_metrics({"parity_mismatches": sum(not r["match"] for r in records)})
    suite_output.add_records("parity", records)
    return records


def _reference_server(suite_config) -> Server:
    try:
        return connect(replace(suite_config, base_url=suite_config.reference_url, model=None))
    except NotTheServer as err:
        problem = str(err)
    pytest.fail(f"the reference server (--reference-url): {problem}", pytrace=False)


def test_parity(parity_records, suite_config):
    errors = [r for r in parity_records if r["error"] or r["reference_error"]]
    assert not errors, (f"{len(errors)} prompts failed to generate; "
                        f"first: {errors[0]['error'] or errors[0]['reference_error']}")
    allowed = suite_config.suite("parity")["max_mismatches"]
    mismatched = [r for r in parity_records if not r["match"]]
    assert len(mismatched) <= allowed, (
        f"{len(mismatched)} of {len(parity_records)} greedy outputs differ from the reference (allowed {allowed}); "
        f"first: prompt {mismatched[0]['prompt_index']} at {mismatched[0]['unit']} {mismatched[0]['first_difference']}")
