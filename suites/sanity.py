"""The always-on sanity check: a few streamed chat completions that prove the server answers with text.

Every serving cell gets it, whatever suites it lists (``dspark_ci.ground.suites.ALWAYS_SUITES``), so no suite selection
can leave a broken server green: a suite that neither streams nor reads the text (accept) would not notice garbage or
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

Then the same prompts without streaming, once each through chat completions, completions and ``/generate`` (a
server, or a proxy, may break only one path; the accept suite never reads the text): the reply's text is text and
not empty, its usage adds up, and the measurements agree with each other (``consistency_problems``): a
non-streamed reply with the same text as the streamed one counts the same completion tokens, and the speculative
statistics obey SGLang's own definitions (spec_accept_rate = correct drafts / proposed drafts, proposed = verify
steps × (num_draft_tokens − 1), spec_accept_length = completion tokens / verify steps, and every verify step emits
its accepted drafts plus one token). An impossible set is an error of measurement: the cell is red.
"""

from __future__ import annotations

import json
import re
import unicodedata
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import requests
from dspark_ci.suites.prompts import PROMPTS
from dspark_ci.suites.server import Server

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
    spec: Mapping[str, Any] | None = None  # the request's speculative statistics, as the server reported them
    kind: str = "streamed chat"


def parse_stream(lines: Iterable[bytes]) -> StreamReply:
    """The reply in an SSE byte stream (one item per line, newline stripped), checked as it is read."""
    text: list[str] = []
    usage, finish, verify, events, done, spec = None, None, None, 0, False, None
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
            verify, spec = int(details["spec_verify_ct"]), details
    problems = () if done else ("the stream ended without `data: [DONE]`",)
    return StreamReply("".join(text), usage, finish, verify, events, problems, spec)


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


# --- the same prompts without streaming ------------------------------------------------------------------------

def _post(server: Server, path: str, body: Mapping[str, Any], kind: str) -> dict | StreamReply:
    """The JSON reply of a non-streamed request, or a StreamReply naming what went wrong."""
    try:
        response = requests.post(f"{server.base_url}{path}", json=body, timeout=server.request_timeout,
                                 headers={"Authorization": f"Bearer {server.api_key}"})
    except requests.RequestException as err:
        return StreamReply(kind=kind, problems=(f"{kind}: the request failed: {type(err).__name__}",))
    try:
        reply = response.json()
    except ValueError:
        reply = None
    if response.status_code != 200 or not isinstance(reply, dict):
        return StreamReply(kind=kind, problems=(f"{kind}: HTTP {response.status_code}: {response.text[:200]!r}",))
    return reply


def _spec_of(reply: Mapping[str, Any]) -> Mapping[str, Any] | None:
    details = (reply.get("sglext") or {}).get("spec_tokens_details")
    details = details[0] if isinstance(details, list) and details else details
    return details if isinstance(details, dict) and details.get("spec_verify_ct") else None


def _openai_reply(reply: dict | StreamReply, kind: str, text_of: Callable[[Mapping], Any]) -> StreamReply:
    if isinstance(reply, StreamReply):
        return reply
    choice = (reply.get("choices") or [{}])[0] if isinstance(reply.get("choices"), list) else {}
    text = text_of(choice) if isinstance(choice, dict) else None
    if not isinstance(text, str):
        return StreamReply(kind=kind, problems=(f"{kind}: the reply has no text field: {str(choice)[:120]}",))
    spec = _spec_of(reply)
    return StreamReply(text, reply.get("usage"), choice.get("finish_reason"),
                       int(spec["spec_verify_ct"]) if spec else None, 1, (), spec, kind)


def _chat_text(choice: Mapping) -> Any:
    message = choice.get("message") or {}
    parts = [message.get("reasoning_content"), message.get("content")]
    return "".join(p for p in parts if isinstance(p, str)) if any(isinstance(p, str) for p in parts) else None


def chat_once(server: Server, prompt: str, max_tokens: int) -> StreamReply:
    body = {"model": server.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0.0, "return_spec_tokens_details": True}
    return _openai_reply(_post(server, "/v1/chat/completions", body, "chat"), "chat", _chat_text)


def completion_once(server: Server, prompt: str, max_tokens: int) -> StreamReply:
    body = {"model": server.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "return_spec_tokens_details": True}
    return _openai_reply(_post(server, "/v1/completions", body, "completions"), "completions",
                         lambda choice: choice.get("text"))


def generate_once(server: Server, prompt: str, max_tokens: int) -> StreamReply:
    """SGLang's native /generate: usage is meta_info's prompt_tokens and completion_tokens."""
    body = {"text": prompt, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.0}}
    reply = _post(server, "/generate", body, "/generate")
    if isinstance(reply, StreamReply):
        return reply
    meta: dict = reply["meta_info"] if isinstance(reply.get("meta_info"), dict) else {}
    text = reply.get("text")
    if not isinstance(text, str):
        return StreamReply(kind="/generate", problems=(f"/generate: the reply has no text field: {str(reply)[:120]}",))
    prompt_tokens, completion = meta.get("prompt_tokens"), meta.get("completion_tokens")
    usage = ({"prompt_tokens": prompt_tokens, "completion_tokens": completion,
              "total_tokens": prompt_tokens + completion}
             if isinstance(prompt_tokens, int) and isinstance(completion, int) else {})
    finish = (meta.get("finish_reason") or {}).get("type") if isinstance(meta.get("finish_reason"), dict) else None
    spec = meta if meta.get("spec_verify_ct") else None
    return StreamReply(text, usage, finish, int(meta["spec_verify_ct"]) if spec else None, 1, (), spec, "/generate")


NON_STREAMED = (chat_once, completion_once, generate_once)


def run_non_streamed(server: Server, options: Mapping[str, Any]) -> list[StreamReply]:
    """Each prompt of ``run_sanity`` once through every non-streamed path (chat first, in the same order)."""
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(options["num_requests"])]
    jobs = [(ask, prompt) for ask in NON_STREAMED for prompt in prompts]
    return server.ask_each(lambda _client, job: job[0](server, job[1], options["max_tokens"]), jobs,
                           options["concurrency"], label="sanity (not streamed)")


def empty_text_problem(reply: StreamReply) -> str | None:
    """A non-streamed reply must have text, unless the model stopped at its first token: an instruct model given a
    chat prompt as raw text (completions, /generate) may answer with its end-of-turn token alone, text "", one
    completion token, finish_reason "stop". Empty text after more tokens than that is broken whatever usage says."""
    if reply.problems or reply.text.strip():
        return None
    stopped_at_once = reply.finish_reason == "stop" and (reply.usage or {}).get("completion_tokens") == 1
    return None if stopped_at_once else f"{reply.kind}: the reply has no text"


def usage_contradiction(completion: int, verify: int, correct: int, proposed: int) -> str | None:
    """Why ``completion`` tokens cannot come from ``verify`` steps (> 0) with ``correct`` of ``proposed`` drafts
    accepted, by SGLang's definitions (None: they can). Every verify step emits its accepted drafts + 1; the last
    may be cut by max_tokens, the first token may come from prefill: completion tokens = verify + correct within
    (-(block - 1), +1], block being the drafts proposed per step + the verified token (num_draft_tokens)."""
    block, emitted = proposed // verify + 1, verify + correct
    if emitted - (block - 1) <= completion <= emitted + 1:
        return None
    rate = correct / proposed if proposed else 0.0
    return (f"usage counts {completion} completion tokens, but {verify} verify steps with {correct} accepted drafts "
            f"emit {emitted} (accept length {completion / verify:.2f} against {1 + correct / verify:.2f} implied by "
            f"accept rate {rate:.3f} at num_draft_tokens {block})")


def consistency_problems(reply: StreamReply) -> list[str]:
    """Where the reply's speculative statistics contradict each other or its usage, by SGLang's definitions."""
    spec, usage = reply.spec, reply.usage or {}
    completion = usage.get("completion_tokens")
    if not spec or not isinstance(completion, int):
        return []
    verify, correct = int(spec.get("spec_verify_ct") or 0), spec.get("spec_num_correct_drafts")
    proposed, rate, length = (spec.get(k) for k in ("spec_num_proposed_drafts", "spec_accept_rate",
                                                    "spec_accept_length"))
    problems = []
    if isinstance(correct, int) and isinstance(proposed, int) and proposed:
        if proposed % verify:
            problems.append(f"{proposed} proposed drafts over {verify} verify steps is no whole draft block")
        if isinstance(rate, (int, float)) and abs(rate - correct / proposed) > 1e-3:
            problems.append(f"spec_accept_rate {rate:.3f} is not correct/proposed drafts {correct}/{proposed}")
        contradiction = usage_contradiction(completion, verify, correct, proposed)
        if contradiction:
            problems.append(f"impossible measurement: {contradiction}")
    if isinstance(length, (int, float)) and length and abs(length - completion / verify) > 0.01 * length + 1e-6:
        problems.append(f"impossible measurement: spec_accept_length {length:.2f} but usage says "
                        f"{completion}/{verify} = {completion / verify:.2f} tokens per verify step")
    return [f"{reply.kind}: {problem}" for problem in problems]


def same_text_same_tokens(streamed: Sequence[StreamReply], chats: Sequence[StreamReply]) -> list[str]:
    """A non-streamed chat reply with exactly the streamed reply's text (same prompt, greedy) has as many tokens."""
    problems = []
    for index, (one, other) in enumerate(zip(streamed, chats, strict=False)):
        counts = [(r.usage or {}).get("completion_tokens") for r in (one, other)]
        if one.text and one.text == other.text and all(isinstance(c, int) for c in counts) and counts[0] != counts[1]:
            problems.append(f"request {index}: impossible measurement: the same text counts {counts[0]} completion "
                            f"tokens streamed and {counts[1]} not streamed")
    return problems


def non_streamed_problems(reply: StreamReply, max_tokens: int) -> list[str]:
    if reply.problems:
        return list(reply.problems)
    empty = empty_text_problem(reply)
    problems = [empty] if empty else [f"{reply.kind}: {p}" for p in reply_problems(reply, max_tokens)]
    return problems + consistency_problems(reply)


def record(reply: StreamReply, max_tokens: int) -> dict:
    problems = reply_problems(reply, max_tokens) + consistency_problems(reply) if reply.kind == "streamed chat" \
        else non_streamed_problems(reply, max_tokens)
    return {"kind": reply.kind, "text": reply.text[:200], "usage": dict(reply.usage) if reply.usage else None,
            "finish_reason": reply.finish_reason, "spec_verify_ct": reply.spec_verify_ct, "events": reply.events,
            "problems": problems}
