"""The always-on sanity check (suites/sanity.py): a few streamed requests whose stream parses to the end, whose text
is text and whose usage adds up; records "sanity" (one per request). Every serving cell of a run gets it, whatever
suites it lists.

Options (suite "sanity"): num_requests, max_tokens, concurrency, min_accept_length (checked only on a server that
reports per-request speculative statistics).
"""

from __future__ import annotations

import pytest

from suites.sanity import accept_length, record, reply_problems, run_sanity


@pytest.fixture(scope="module")
def sanity_replies(server, suite_config, suite_output):
    options = suite_config.suite("sanity")
    replies = run_sanity(server, options)
    suite_output.add_records("sanity", [record(reply, options["max_tokens"]) for reply in replies])
    return replies


def test_streams_parse_text_is_text_usage_adds_up(sanity_replies, suite_config):
    max_tokens = suite_config.suite("sanity")["max_tokens"]
    failed = [(index, problems) for index, reply in enumerate(sanity_replies)
              if (problems := reply_problems(reply, max_tokens))]
    assert not failed, (f"sanity: {len(failed)} of {len(sanity_replies)} streamed requests are broken; request "
                        f"{failed[0][0]}: {'; '.join(failed[0][1])}")


def test_drafts_are_accepted(sanity_replies, suite_config):
    measured = accept_length(sanity_replies)
    if measured is None:
        pytest.skip("the server reports no per-request speculative statistics")
    floor = suite_config.suite("sanity")["min_accept_length"]
    assert measured >= floor, (f"sanity: accept length {measured:.2f} over {len(sanity_replies)} requests is below "
                               f"the collapse floor {floor}: draft tokens are (almost) never accepted")
