"""Greedy parity: the server under test produces the same temperature-0 output as a reference.

The reference is the same deployment without speculation (``--reference-url``) or outputs recorded
earlier (``--reference-file``, the format ``save_reference`` writes). Outputs are compared as token
ids when both sides have them (SGLang returns them with ``return_token_ids``), else as characters of
the generated text (reasoning content, then content); each record says which unit it used.

Every greedy request asks its top logprobs too (``parity.top_logprobs``), so the first difference is read on the spot:
the reference's logprobs there tell a tie flip from a mismatch (suites/parity_ties.py), without another request.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import openai
from dspark_ci.suites.config import SuiteInputError
from dspark_ci.suites.parity_ties import (
    MATCH,
    MISMATCH,
    TIE_FLIP,
    PositionLogprobs,
    Resolution,
    content_of,
    decide,
    position_logprobs,
    prefix_drift,
)
from dspark_ci.suites.prompts import PROMPTS
from dspark_ci.suites.server import Server

REFERENCE_FORMAT = "dspark-parity-reference"
# 2: each output carries its logprobs (chat's logprobs.content). A version-1 file still loads, without them: a
# difference then cannot be told a tie and counts a mismatch, as every difference did when the file was written.
REFERENCE_VERSION = 2
EXCERPT_CHARS = 40


@dataclass(frozen=True)
class Output:
    text: str
    token_ids: tuple[int, ...] | None
    finish_reason: str | None = None
    error: str | None = None
    logprobs: tuple[PositionLogprobs, ...] | None = None  # per generated token; None: the server gave none


@dataclass(frozen=True)
class Reference:
    prompts: tuple[str, ...]
    max_tokens: int
    outputs: tuple[Output, ...] | None  # None: generate them from a reference server


def default_prompts(count: int) -> tuple[str, ...]:
    return tuple(PROMPTS[i % len(PROMPTS)] for i in range(count))


def generate(server: Server, prompts: Sequence[str], max_tokens: int, concurrency: int,
             top_logprobs: int) -> list[Output]:
    return server.ask_each(lambda client, prompt: _greedy(client, server.model, prompt, max_tokens, top_logprobs),
                           prompts, concurrency, label="parity")


def _greedy(client: openai.OpenAI, model: str, prompt: str, max_tokens: int, top_logprobs: int) -> Output:
    try:
        response = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], temperature=0.0, max_tokens=max_tokens,
            logprobs=True, top_logprobs=top_logprobs, extra_body={"return_token_ids": True})
    except openai.OpenAIError as err:
        return Output(text="", token_ids=None, error=str(err))
    choice = response.model_dump()["choices"][0]
    message = choice["message"]
    ids = choice.get("response_token_ids")
    return Output(text=(message.get("reasoning_content") or "") + (message.get("content") or ""),
                  token_ids=tuple(ids) if ids is not None else None, finish_reason=choice.get("finish_reason"),
                  logprobs=position_logprobs((choice.get("logprobs") or {}).get("content")))


@dataclass(frozen=True)
class ParityRecord:
    """One prompt's comparison (records "parity"): a match, a tie flip, or a mismatch, and where and why.

    At the first difference (``first_difference``, in ``unit``s) the tokens each side took, the reference's logprob of
    each (``tested_logprob`` None: outside the reference's top logprobs), the tested server's own logprob of its token,
    and the epsilon the gap was held against. A tie flip ends the comparison of that prompt: past a different token
    the outputs continue from different prefixes and owe each other nothing."""

    prompt_index: int
    prompt: str
    verdict: str  # MATCH, TIE_FLIP or MISMATCH (suites/parity_ties.py)
    unit: str  # "token" or "char"
    first_difference: int | None
    length: int
    reference_length: int
    excerpt: str | None
    reference_excerpt: str | None
    tested_token_id: int | None = None
    tested_token: str | None = None
    reference_token_id: int | None = None
    reference_token: str | None = None
    tested_logprob: float | None = None
    reference_logprob: float | None = None
    tested_own_logprob: float | None = None
    epsilon: float | None = None
    drift: float | None = None  # largest |logprob difference| of a token both took, before any difference
    reason: str | None = None
    error: str | None = None
    reference_error: str | None = None

    @property
    def match(self) -> bool:
        return self.verdict == MATCH

    def to_dict(self) -> dict:
        return {**asdict(self), "match": self.match}


def compare(prompt_index: int, prompt: str, tested: Output, reference: Output, resolution: Resolution,
            pair_drift: float | None = None) -> ParityRecord:
    """One record: whether the outputs match and, if not, where they first differ and whether that is a tie. A first
    difference is read at the larger of this prompt's own prefix drift and ``pair_drift`` (``compare_all``)."""
    unit, ours, theirs = _units(tested, reference)
    first = first_difference(ours, theirs)
    char_at = first if unit == "char" else first_difference(tested.text, reference.text)
    record = ParityRecord(prompt_index, prompt[:80], MATCH, unit, first, len(ours), len(theirs),
                          _excerpt(tested.text, char_at), _excerpt(reference.text, char_at),
                          error=tested.error, reference_error=reference.error)
    if _errors(tested, reference):
        return replace(record, verdict=MISMATCH, reason="generation failed")
    drift = own_drift(tested, reference)
    record = replace(record, drift=drift)
    if first is None:
        return record
    if unit == "char":
        return replace(record, verdict=MISMATCH, reason="no token ids: a difference in the text is a mismatch")
    measured = [d for d in (drift, pair_drift) if d is not None]
    return _divergence(record, tested, reference, first, replace(resolution, drift=max(measured, default=None)))


def own_drift(tested: Output, reference: Output) -> float | None:
    """The prompt's prefix drift: over the tokens both outputs share before their first difference."""
    _, ours, theirs = _units(tested, reference)
    first = first_difference(ours, theirs)
    return prefix_drift(tested.logprobs, reference.logprobs, len(ours) if first is None else first)


def _units(tested: Output, reference: Output) -> tuple[str, Sequence[int] | str, Sequence[int] | str]:
    """What two outputs are compared in: token ids when both sides have them, else characters of the text."""
    if tested.token_ids is not None and reference.token_ids is not None:
        return "token", tested.token_ids, reference.token_ids
    return "char", tested.text, reference.text


def compare_all(prompts: Sequence[str], tested: Sequence[Output], reference: Sequence[Output],
                resolution: Resolution) -> list[ParityRecord]:
    """Every prompt's record, each first difference read at the pair's drift: the largest any prompt's shared
    prefix shows. How far two servers' numerics part is a property of the pair, not of one prompt, and a difference
    at an early token has almost no prefix of its own to measure it on (an NGRAM flip at token 17 whose own prefix
    drifted 0.07 had a gap of 0.125 while other prompts drifted more)."""
    pairs = list(zip(prompts, tested, reference, strict=False))
    drifts = [own_drift(ours, theirs) for _, ours, theirs in pairs if not _errors(ours, theirs)]
    pooled = max((d for d in drifts if d is not None), default=None)
    return [compare(i, prompt, ours, theirs, resolution, pooled) for i, (prompt, ours, theirs) in enumerate(pairs)]


def _divergence(record: ParityRecord, tested: Output, reference: Output, at: int,
                resolution: Resolution) -> ParityRecord:
    """The record of a token-level first difference at ``at``, read from the reference's logprobs there."""
    ours, theirs = _at(tested.logprobs, at), _at(reference.logprobs, at)
    decision = decide(theirs, ours.chosen if ours else None, resolution)
    if ours and theirs and ours.chosen.key == theirs.chosen.key:  # two ids, one text: logprobs cannot part them
        decision = replace(decision, verdict=MISMATCH, reason="different token ids of the same bytes: undecidable")
    return replace(record, verdict=decision.verdict, reason=decision.reason, epsilon=decision.epsilon,
                   tested_token_id=_at(tested.token_ids, at), reference_token_id=_at(reference.token_ids, at),
                   tested_token=ours.chosen.token if ours else None,
                   reference_token=theirs.chosen.token if theirs else None,
                   tested_logprob=decision.tested_logprob, reference_logprob=decision.reference_logprob,
                   tested_own_logprob=ours.chosen.logprob if ours else None)


def _at(items: Sequence | None, index: int):
    return items[index] if items is not None and index < len(items) else None


def describe(record: ParityRecord) -> str:
    """One line a person reads: the prompt, where it parted, each side's token and the reference's logprob of it."""
    where = f"prompt {record.prompt_index} ({record.prompt!r}) at {record.unit} {record.first_difference}"
    if record.unit != "token":
        return f"{where}: {record.excerpt!r} vs reference {record.reference_excerpt!r} ({record.reason})"
    return (f"{where}: tested {_token(record.tested_token, record.tested_token_id, record.tested_logprob)} vs "
            f"reference {_token(record.reference_token, record.reference_token_id, record.reference_logprob)} "
            f"({record.reason})")


def _token(text: str | None, token_id: int | None, logprob: float | None) -> str:
    shown = "?" if text is None else repr(text)
    said = "outside the reference's top logprobs" if logprob is None else f"logprob {logprob:.4f}"
    return f"{shown} (id {token_id}, {said})"


def tally(records: Sequence[ParityRecord]) -> dict[str, float]:
    """The suite's metrics: real mismatches, and tie flips (counted, never a failure)."""
    drifts = [r.drift for r in records if r.drift is not None]
    return {"parity_mismatches": sum(r.verdict == MISMATCH for r in records),
            "parity_tie_flips": sum(r.verdict == TIE_FLIP for r in records),
            **({"parity_logprob_drift": max(drifts)} if drifts else {})}


def first_difference(ours: Sequence, theirs: Sequence) -> int | None:
    """Index of the first differing element; the shorter length if one is a prefix; None if equal."""
    for index, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            return index
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


def _errors(*outputs: Output) -> bool:
    return any(output.error for output in outputs)


def _excerpt(text: str, at: int | None) -> str | None:
    return None if at is None else text[max(0, at - EXCERPT_CHARS // 2): at + EXCERPT_CHARS // 2]


def load_reference(path: Path, num_prompts: int) -> Reference:
    try:
        data = json.loads(path.read_text())
    except OSError as err:
        raise SuiteInputError(f"--reference-file {path}: cannot read it ({err.strerror})") from None
    except json.JSONDecodeError as err:
        raise SuiteInputError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(data, dict) or data.get("format") != REFERENCE_FORMAT:
        raise SuiteInputError(f"{path}: not a parity reference (expected \"format\": \"{REFERENCE_FORMAT}\"; "
                              f"write one with --save-reference)")
    if int(data.get("version") or 1) > REFERENCE_VERSION:
        raise SuiteInputError(f"{path}: parity reference version {data['version']} is newer than this dspark-ci reads "
                              f"({REFERENCE_VERSION}); upgrade dspark-ci or write it again with --save-reference")
    try:
        entries = data["outputs"][:num_prompts]
        outputs = tuple(Output(text=e["text"], token_ids=_ids(e.get("token_ids")),
                               logprobs=position_logprobs(e.get("logprobs"))) for e in entries)
        return Reference(prompts=tuple(e["prompt"] for e in entries), max_tokens=int(data["max_tokens"]),
                         outputs=outputs)
    except (KeyError, TypeError, ValueError) as err:
        raise SuiteInputError(f"{path}: malformed parity reference ({type(err).__name__}: {err})") from None


def save_reference(path: Path, model: str, max_tokens: int, prompts: Sequence[str], outputs: Sequence[Output]) -> None:
    data = {"format": REFERENCE_FORMAT, "version": REFERENCE_VERSION, "model": model, "max_tokens": max_tokens,
            "outputs": [{"prompt": p, "text": o.text, "token_ids": list(o.token_ids) if o.token_ids else None,
                         "logprobs": content_of(o.logprobs) if o.logprobs is not None else None}
                        for p, o in zip(prompts, outputs, strict=False)]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def _ids(value) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(v) for v in value)
