"""Greedy parity: the server under test produces the same temperature-0 output as a reference.

The reference is the same deployment without speculation (``--reference-url``) or outputs recorded
earlier (``--reference-file``, the format ``save_reference`` writes). Outputs are compared as token
ids when both sides have them (SGLang returns them with ``return_token_ids``), else as characters of
the generated text (reasoning content, then content); each record says which unit it used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import openai

from suites.config import SuiteInputError
from suites.prompts import PROMPTS
from suites.server import Server

REFERENCE_FORMAT = "dspark-parity-reference"
EXCERPT_CHARS = 40


@dataclass(frozen=True)
class Output:
    text: str
    token_ids: tuple[int, ...] | None
    finish_reason: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class Reference:
    prompts: tuple[str, ...]
    max_tokens: int
    outputs: tuple[Output, ...] | None  # None: generate them from a reference server


def default_prompts(count: int) -> tuple[str, ...]:
    return tuple(PROMPTS[i % len(PROMPTS)] for i in range(count))


def generate(server: Server, prompts: Sequence[str], max_tokens: int, concurrency: int) -> list[Output]:
    return server.ask_each(lambda client, prompt: _greedy(client, server.model, prompt, max_tokens), prompts,
                           concurrency, label="parity")


def _greedy(client: openai.OpenAI, model: str, prompt: str, max_tokens: int) -> Output:
    try:
        response = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], temperature=0.0, max_tokens=max_tokens,
            extra_body={"return_token_ids": True})
    except openai.OpenAIError as err:
        return Output(text="", token_ids=None, error=str(err))
    choice = response.model_dump()["choices"][0]
    message = choice["message"]
    ids = choice.get("response_token_ids")
    return Output(text=(message.get("reasoning_content") or "") + (message.get("content") or ""),
                  token_ids=tuple(ids) if ids is not None else None, finish_reason=choice.get("finish_reason"))


def compare(prompt_index: int, prompt: str, tested: Output, reference: Output) -> dict:
    """One record: whether the outputs match and, if not, where they first differ."""
    ours: Sequence[int] | str
    theirs: Sequence[int] | str
    if tested.token_ids is not None and reference.token_ids is not None:
        unit, ours, theirs = "token", tested.token_ids, reference.token_ids
    else:
        unit, ours, theirs = "char", tested.text, reference.text
    first = first_difference(ours, theirs)
    char_at = first if unit == "char" else first_difference(tested.text, reference.text)
    return {
        "prompt_index": prompt_index, "prompt": prompt[:80], "match": first is None and not _errors(tested, reference),
        "unit": unit, "first_difference": first, "length": len(ours), "reference_length": len(theirs),
        "excerpt": _excerpt(tested.text, char_at), "reference_excerpt": _excerpt(reference.text, char_at),
        "error": tested.error, "reference_error": reference.error,
    }


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
    try:
        entries = data["outputs"][:num_prompts]
        outputs = tuple(Output(text=e["text"], token_ids=_ids(e.get("token_ids"))) for e in entries)
        return Reference(prompts=tuple(e["prompt"] for e in entries), max_tokens=int(data["max_tokens"]),
                         outputs=outputs)
    except (KeyError, TypeError, ValueError) as err:
        raise SuiteInputError(f"{path}: malformed parity reference ({type(err).__name__}: {err})") from None


def save_reference(path: Path, model: str, max_tokens: int, prompts: Sequence[str], outputs: Sequence[Output]) -> None:
    data = {"format": REFERENCE_FORMAT, "version": 1, "model": model, "max_tokens": max_tokens,
            "outputs": [{"prompt": p, "text": o.text, "token_ids": list(o.token_ids) if o.token_ids else None}
                        for p, o in zip(prompts, outputs, strict=False)]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def _ids(value) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(v) for v in value)
