"""The always-on sanity check (suites/sanity.py): a few streamed requests whose stream parses to the end, whose text
is text and whose usage adds up, then the same prompts not streamed through chat, completions and /generate (text,
usage, and measurements that agree with each other); records "sanity" (one per request). Every serving cell of a
run gets it, whatever suites it lists.

Options (suite "sanity"): num_requests, max_tokens, concurrency, min_accept_length (checked only on a server that
reports per-request speculative statistics).
"""

from __future__ import annotations

import pytest
from dspark_ci.suites.sanity import (
    accept_length,
    consistency_problems,
    non_streamed_problems,
    record,
    reply_problems,
    run_non_streamed,
    run_sanity,
    same_text_same_tokens,
)


@pytest.fixture(scope="module")
def sanity_replies(server, suite_config, suite_output):
    options = suite_config.suite("sanity")
    replies = run_sanity(server, options)
    suite_output.add_records("sanity", [record(reply, options["max_tokens"]) for reply in replies])
    return replies


@pytest.fixture(scope="module")
def non_streamed_replies(server, suite_config, suite_output, sanity_replies):
    options = suite_config.suite("sanity")
    replies = run_non_streamed(server, options)
    suite_output.add_records("sanity", [record(reply, options["max_tokens"]) for reply in replies])
    return replies


def test_streams_parse_text_is_text_usage_adds_up(sanity_replies, suite_config):
    max_tokens = suite_config.suite("sanity")["max_tokens"]
    failed = [(index, problems) for index, reply in enumerate(sanity_replies)
              if (problems := reply_problems(reply, max_tokens))]
    assert not failed, (f"sanity: {len(failed)} of {len(sanity_replies)} streamed requests are broken; request "
                        f"{failed[0][0]}: {'; '.join(failed[0][1])}")


def test_replies_not_streamed_have_text_and_usage_that_adds_up(non_streamed_replies, suite_config):
    max_tokens = suite_config.suite("sanity")["max_tokens"]
    failed = [problems for reply in non_streamed_replies if (problems := non_streamed_problems(reply, max_tokens))]
    assert not failed, (f"sanity: {len(failed)} of {len(non_streamed_replies)} requests not streamed are broken: "
                        f"{'; '.join(failed[0])}")


def test_measurements_agree_with_each_other(sanity_replies, non_streamed_replies):
    """An impossible set of measurements (accept length against accept rate and block size, usage against the same
    text streamed) is an error of measurement, never a figure to gate."""
    chats = [reply for reply in non_streamed_replies if reply.kind == "chat"]
    problems = [p for reply in sanity_replies for p in consistency_problems(reply)]
    problems += same_text_same_tokens(sanity_replies, chats)
    assert not problems, f"sanity: {len(problems)} impossible measurement(s): {problems[0]}"


def test_drafts_are_accepted(sanity_replies, suite_config):
    measured = accept_length(sanity_replies)
    if measured is None:
        pytest.skip("the server reports no per-request speculative statistics")
    floor = suite_config.suite("sanity")["min_accept_length"]
    assert measured >= floor, (f"sanity: accept length {measured:.2f} over {len(sanity_replies)} requests is below "
                               f"the collapse floor {floor}: draft tokens are (almost) never accepted")
