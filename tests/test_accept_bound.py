"""The accept suite's figures held to what a verify step can emit, and /server_info compared after the sanity check:
a server whose cumulative accept counter counts twice reports 4.31 with 4 draft tokens, which is an error."""

from __future__ import annotations

from dspark_ci.suites.accept import (
    GENERATION_TOKENS,
    VERIFY_CALLS,
    RequestSpec,
    ServerSnapshot,
    beyond_draft_bound,
    disagreements,
    server_side_figures,
)


def request(order: int, tokens: int, verify: int) -> RequestSpec:
    return RequestSpec(prompt_index=order, completion_tokens=tokens, spec_verify_ct=verify,
                       spec_num_correct_drafts=tokens - 1 - verify, spec_num_proposed_drafts=3 * verify,
                       spec_accept_length=tokens / verify, dp_rank=0, source="sglext", order=order)


def snapshot(accept_length: float | None, verify_calls: float, draft_tokens: int | None = 4) -> ServerSnapshot:
    return ServerSnapshot(has_server_info=True, speculative_algorithm="NGRAM",
                          rank_accept_lengths=(accept_length,), metrics_served=True,
                          counters={GENERATION_TOKENS: 0.0, VERIFY_CALLS: verify_calls},
                          num_draft_tokens=draft_tokens)


# 8 requests of 64 tokens in 29 verify steps each: 63 / 29 = 2.17 tokens per verify step, as the server counts.
REQUESTS = [request(i, 64, 29) for i in range(8)]
SANITY_STEPS = 40.0  # the sanity check's verify steps before the window


def test_a_server_accept_length_beyond_the_draft_tokens_is_named():
    doubled = snapshot(2 * 63 / 29, SANITY_STEPS + 8 * 29)
    [problem] = beyond_draft_bound(REQUESTS, doubled)
    assert "/server_info avg_spec_accept_length of rank 0 4.345 exceeds speculative_num_draft_tokens 4" in problem


def test_figures_within_the_bound_pass_and_an_unknown_bound_checks_nothing():
    assert beyond_draft_bound(REQUESTS, snapshot(63 / 29, SANITY_STEPS + 8 * 29)) == []
    assert beyond_draft_bound(REQUESTS, snapshot(9.0, 1.0, draft_tokens=None)) == []


def test_server_info_is_compared_after_the_sanity_check_moved_it():
    # The rank had verify steps before the window: its cumulative ratio times /metrics' verify calls gives the window.
    before, truth = snapshot(2.0, SANITY_STEPS), 63 / 29
    after = snapshot((2.0 * SANITY_STEPS + truth * 8 * 29) / (SANITY_STEPS + 8 * 29), SANITY_STEPS + 8 * 29)
    [metrics, info] = server_side_figures(before, after, REQUESTS).figures
    assert info["exact_window"] and abs(info["accept_length"] - truth) < 1e-9
    assert disagreements(REQUESTS, [info], 0.05) == []
    doubled = server_side_figures(snapshot(4.0, SANITY_STEPS), snapshot(2 * after.rank_accept_lengths[0],
                                                                        SANITY_STEPS + 8 * 29), REQUESTS)
    [message] = disagreements(REQUESTS, doubled.figures[1:], 0.05)
    assert "disagrees with /server_info internal_states 4.345" in message


def test_a_window_with_a_failed_request_is_not_compared_and_says_why():
    # A request that timed out was still decoded by the server: its counters hold steps no response reports, so the
    # per-request figure and the server's differ for a reason that is not a counting bug (the failed request is
    # already red by itself in test_accept_statistics_reported).
    timed_out = [*REQUESTS[:7], RequestSpec(prompt_index=7, completion_tokens=0, spec_verify_ct=None,
                                            spec_num_correct_drafts=None, spec_num_proposed_drafts=None,
                                            spec_accept_length=None, dp_rank=None, source=None,
                                            error="Request timed out.", order=7)]
    after = snapshot(2 * 63 / 29, 8 * 29 + 40)  # the abandoned request's 40 steps counted too
    figures = server_side_figures(snapshot(None, 0.0), after, timed_out).figures
    assert figures and all(not figure["exact_window"] for figure in figures)
    assert all("1 of 8 requests failed" in figure["not_compared_because"] for figure in figures)
    assert disagreements(timed_out, figures, 0.05) == []
    assert disagreements(REQUESTS, server_side_figures(snapshot(None, 0.0), after, REQUESTS).figures, 0.05)
