"""The always-on sanity check: a few streamed chat completions that prove the server answers with text.

Every serving cell gets it, whatever suites it lists (``ground.suites.ALWAYS_SUITES``), so no suite selection can
leave a broken server green: a suite that neither streams nor reads the text (accept) would not notice garbage or
a stream that breaks off. Per request (``max_tokens`` tokens, greedy, ``stream_options.include_usage``):

- the stream parses to the end: every line is an SSE ``data:`` event holding a JSON object, and the last is
  ``[DONE]``; a connection that drops mid-event or a truncated event is a failure;
- the text is text: UTF-8 without replacement or control characters, Latin-script words mostly with vowels (a
  model emitting random tokens is not writing words), not one short pattern repeated (a collapsed decode);
- usage adds up: the final usage chunk is present, ``prompt_tokens`` and ``completion_tokens`` are positive and
  sum to ``total_tokens``, ``completion_tokens`` is at most ``max_tokens`` and equals it when the finish reason is
  ``length``;
- and on a speculative server that reports per-request statistics (``sglext.spec_tokens_details``), the accept
  length over the requests is at least ``min_accept_length`` (drafts that are never accepted).
"""

from __future__ import annotations

import json
import re
import unicodedata
import zlib
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import requests

from suites.prompts import PROMPTS
from suites.server import Server

# Below this many Latin words the vowel test says nothing (a short answer may be "Mr. X").
MIN_WORDS_FOR_VOWEL_TEST = 6
VOWELS = re.compile(r"[aeiouyAEIOUY]")
LATIN_WORD = re.compile(r"[A-Za-z]{2,}")
# zlib shrinks prose 1.5-3x; text that is one short pattern repeated shrinks far more.
MAX_COMPRESSION_RATIO = 6.0
MIN_BYTES_FOR_REPETITION_TEST = 96
ALLOWED_CONTROLS = "\n\t\r"


@dataclass(frozen=True)
class StreamReply:
    """One streamed request as the sanity check read it: what arrived, and the first problem found."""

    text: str = ""
    usage: Mapping[str, Any] | None = None
    finish_reason: str | None = None
    spec_verify_ct: int | None = None
    events: int = 0
    problems: tuple[str, ...] = ()


def parse_stream(lines: Iterable[bytes]) -> StreamReply:
    """The reply in an SSE byte stream (one item per line, newline stripped), checked as it is read."""
    text: list[str] = []
    usage, finish, verify, events, done = None, None, None, 0, False
    for number, raw in enumerate(lines, 1):
        if not raw.strip() or raw.startswith(b":"):
            continue
        if done:
            return StreamReply("".join(text), usage, finish, verify, events, (f"line {number}: data after [DONE]",))
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            return StreamReply("".join(text), usage, finish, verify, events,
                               (f"line {number}: not UTF-8 ({err.reason} at byte {err.start})",))
        if not line.startswith("data:"):
            return StreamReply("".join(text), usage, finish, verify, events,
                               (f"line {number}: not an SSE data event: {line[:80]!r}",))
        payload = line[len("data:"):].strip()
        if payload == "[DONE]":
            done = True
            continue
        try:
            chunk = json.loads(payload)
        except ValueError:
            return StreamReply("".join(text), usage, finish, verify, events,
                               (f"line {number}: the event is not JSON (cut off?): {payload[:80]!r}",))
        if not isinstance(chunk, dict):
            return StreamReply("".join(text), usage, finish, verify, events,
                               (f"line {number}: the event is not a JSON object",))
        events += 1
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            text += [part for part in (delta.get("reasoning_content"), delta.get("content")) if isinstance(part, str)]
            finish = choice.get("finish_reason") or finish
        usage = chunk.get("usage") or usage
        details = (chunk.get("sglext") or {}).get("spec_tokens_details")
        if isinstance(details, list):
            details = details[0] if details else None
        if isinstance(details, dict) and details.get("spec_verify_ct"):
            verify = int(details["spec_verify_ct"])
    problems = () if done else ("the stream ended without `data: [DONE]`",)
    return StreamReply("".join(text), usage, finish, verify, events, problems)


def text_problem(text: str) -> str | None:
    """Why ``text`` is not text a language model wrote, or None."""
    if not text.strip():
        return "the reply has no text"
    if "\ufffd" in text:
        return "the text holds U+FFFD replacement characters (bytes that were not valid UTF-8)"
    controls = sorted({c for c in text if unicodedata.category(c) == "Cc" and c not in ALLOWED_CONTROLS})
    if controls:
        return f"the text holds control characters {', '.join(f'U+{ord(c):04X}' for c in controls)}"
    words = LATIN_WORD.findall(text)
    if len(words) >= MIN_WORDS_FOR_VOWEL_TEST:
        without = [w for w in words if not VOWELS.search(w)]
        if len(without) * 2 > len(words):
            return (f"{len(without)} of {len(words)} words have no vowel (e.g. {' '.join(without[:4])!r}): "
                    f"random tokens, not words")
    data = text.encode("utf-8")
    if len(data) >= MIN_BYTES_FOR_REPETITION_TEST:
        ratio = len(data) / len(zlib.compress(data, 9))
        if ratio > MAX_COMPRESSION_RATIO:
            return f"the text is one short pattern repeated (compresses {ratio:.0f}x): {text[:60]!r}"
    return None


def usage_problems(reply: StreamReply, max_tokens: int) -> list[str]:
    """Where the reply's usage does not add up."""
    usage = reply.usage
    if not usage:
        return ["no usage chunk, although stream_options.include_usage was sent"]
    counts = [usage.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in counts):
        return [f"usage has non-integer token counts: {dict(usage)}"]
    prompt, completion, total = (int(v) for v in counts)  # type: ignore[arg-type]  # checked just above
    problems = []
    if prompt < 1 or completion < 1:
        problems.append(f"usage counts {prompt} prompt and {completion} completion tokens (expected at least 1 each)")
    if prompt + completion != total:
        problems.append(f"usage does not add up: {prompt} prompt + {completion} completion != {total} total tokens")
    if completion > max_tokens:
        problems.append(f"usage counts {completion} completion tokens, more than max_tokens={max_tokens}")
    if reply.finish_reason not in ("stop", "length"):
        problems.append(f"finish_reason is {reply.finish_reason!r} (expected stop or length)")
    elif reply.finish_reason == "length" and completion != max_tokens:
        problems.append(f"finish_reason is length but usage counts {completion} of max_tokens={max_tokens} tokens")
    return problems


def reply_problems(reply: StreamReply, max_tokens: int) -> list[str]:
    """Everything wrong with one reply (the stream, then its text, then its usage)."""
    if reply.problems:
        return list(reply.problems)
    problems = usage_problems(reply, max_tokens)
    if reply.usage and (reply.usage.get("completion_tokens") or 0) > 1:
        text = text_problem(reply.text)
        if text:
            problems.insert(0, text)
    return problems


def accept_length(replies: Sequence[StreamReply]) -> float | None:
    """Σ completion tokens / Σ verify steps over the replies that carry speculative statistics."""
    measured = [(r.spec_verify_ct, r.usage) for r in replies if r.spec_verify_ct and r.usage]
    verify = sum(steps for steps, _usage in measured)
    return sum(int(usage["completion_tokens"]) for _steps, usage in measured) / verify if verify else None


def stream_one(server: Server, prompt: str, max_tokens: int) -> StreamReply:
    """One streamed chat completion, read line by line (the raw bytes, so nothing is smoothed over)."""
    body = {"model": server.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
            "return_spec_tokens_details": True}
    try:
        with requests.post(f"{server.api_base}/chat/completions", json=body, stream=True,
                           timeout=server.request_timeout, headers={"Authorization": f"Bearer {server.api_key}"}) as r:
            if r.status_code != 200:
                return StreamReply(problems=(f"HTTP {r.status_code}: {r.text[:200]}",))
            return parse_stream(r.iter_lines(delimiter=b"\n"))
    except requests.RequestException as err:
        return StreamReply(problems=(f"the stream broke off: {type(err).__name__}: {str(err)[:200]}",))


def run_sanity(server: Server, options: Mapping[str, Any]) -> list[StreamReply]:
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(options["num_requests"])]
    return server.ask_each(lambda _client, prompt: stream_one(server, prompt, options["max_tokens"]), prompts,
                           options["concurrency"], label="sanity")


def record(reply: StreamReply, max_tokens: int) -> dict:
    return {"text": reply.text[:200], "usage": dict(reply.usage) if reply.usage else None,
            "finish_reason": reply.finish_reason, "spec_verify_ct": reply.spec_verify_ct, "events": reply.events,
            "problems": reply_problems(reply, max_tokens)}
