"""Speculative acceptance: accept_length, accept_rate; records "accept" (per request), "accept_server"
(server-side figures), "accept_summary" (whether the exact /metrics cross-check ran, and if not why).

Options (suite "accept"): num_requests, max_tokens, concurrency, min_accept_length (the collapse
floor, checked even without a baseline), disagreement_tolerance (per-request vs server-side figure,
relative; a disagreement is a warning, not a failure). Skipped on a server without speculation.
"""

from __future__ import annotations

import pytest

from suites.accept import (
    disagreements, measure_requests, per_request_metrics, request_record, server_side_figures, take_snapshot,
    with_spec,
)


@pytest.fixture(scope="module")
def accept_run(server, suite_config, suite_output):
    options = suite_config.suite("accept")
    before = take_snapshot(server)
    if before.has_server_info and before.speculative_algorithm is None:
        pytest.skip("the server runs without speculative decoding (/server_info speculative_algorithm is null)")
    requests = measure_requests(server, options["num_requests"], options["max_tokens"], options["concurrency"],
                                options.get("api", "chat"))
    after = take_snapshot(server)
    if not with_spec(requests) and not before.has_server_info:
        pytest.skip("the server reports no speculative statistics (not a speculative deployment)")

    metrics = per_request_metrics(requests)
    server_side = server_side_figures(before, after, requests)
    messages = disagreements(requests, server_side.figures, options["disagreement_tolerance"])
    suite_output.add_metrics(metrics)
    suite_output.add_records("accept", [request_record(r) for r in requests])
    suite_output.add_records("accept_server", [{**figure, "speculative_algorithm": after.speculative_algorithm}
                                               for figure in server_side.figures])
    suite_output.add_records("accept_summary", [{
        "requests": len(requests), "requests_with_spec": len(with_spec(requests)),
        "metrics_cross_check": server_side.no_metrics_figure_because is None,
        "no_metrics_cross_check_because": server_side.no_metrics_figure_because, "disagreements": messages}])
    for message in messages:
        suite_output.warn(message)
    return requests, metrics


def test_accept_statistics_reported(accept_run):
    requests, _ = accept_run
    failed = [r for r in requests if r.error]
    assert not failed, f"{len(failed)} of {len(requests)} requests failed; first: {failed[0].error}"
    missing = [r for r in requests if not r.spec_verify_ct and r.completion_tokens > 1]
    assert not missing, (f"{len(missing)} of {len(requests)} responses carry no spec_tokens_details "
                         f"although the server runs speculative decoding")


def test_accept_length_above_collapse_floor(accept_run, suite_config):
    _, metrics = accept_run
    floor = suite_config.suite("accept")["min_accept_length"]
    assert metrics["accept_length"] is not None, "no request ran a speculative step"
    assert metrics["accept_length"] >= floor, (
        f"accept_length {metrics['accept_length']:.3f} is below the collapse floor {floor}: "
        f"draft tokens are (almost) never accepted")
