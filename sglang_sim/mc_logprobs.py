"""Prompt logprobs for /generate's ``return_logprob``: ``meta_info.input_token_logprobs`` in pinned SGLang's shape.

SGLang returns one ``[logprob, token id, text|None]`` triple per prompt token from ``logprob_start_len`` on (the text
only with ``return_text_in_logprobs``); the prompt's first token has no logprob (null), nothing preceding it. Here
every token of a text has a logprob drawn from the text itself, except where the text is a multiple-choice context
(an item of ``DSPARK_SIM_MC_PATH``) followed by a continuation: then the continuation's tokens share a total that
makes log-likelihood scoring (suites/mc.py) pick the right continuation on a fixed share of the items, as GPQA's
answers are decided (sglang_sim/textgen.py): ``DSPARK_SIM_MC_ACCURACY``, fixed per item and seed.

An item the model "knows" gives the right continuation RIGHT_TOTAL and every other one less than it; one it does not
know gives the right one UNKNOWN_RIGHT_TOTAL, below every other (so a wrong one wins, deterministically). Fault
``garbled_logprobs`` draws every total from the text alone: scoring is then at chance.
"""

from __future__ import annotations

import functools
import json
import random
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dspark_ci.sglang_sim.sim_config import SimConfig
from dspark_ci.sglang_sim.tokenizer import token_id, tokenize

RIGHT_TOTAL = -2.0
UNKNOWN_RIGHT_TOTAL = -6.0
WRONG_TOTALS = (-5.0, -3.0)  # a wrong continuation's total is drawn from this range, per item and continuation
CONTEXT_LOGPROBS = (-8.0, -0.5)  # any other token's logprob


class McKeyError(ValueError):
    """The file at DSPARK_SIM_MC_PATH cannot be used."""


@functools.lru_cache(maxsize=4)
def answer_key(path: Path | None) -> Mapping[str, str]:
    """Context -> its right continuation, from an mc_countries.json-style file (empty without one)."""
    if path is None:
        return {}
    try:
        items = json.loads(path.read_text(encoding="utf-8"))["items"]
        return {item["context"]: item["options"][item["answer"]] for item in items}
    except (OSError, ValueError, KeyError, IndexError, TypeError) as err:
        raise McKeyError(f"{path}: not an mc_countries.json-style file ({err!r})") from None


def _rng(*parts: object) -> random.Random:
    return random.Random("\x1f".join(map(str, parts)))


def _split(key: Mapping[str, str], text: str) -> tuple[str, str] | None:
    """(context, continuation) when ``text`` is a known context followed by a continuation starting with a space."""
    for at in range(len(text) - 1, 0, -1):
        if text[at] == " " and text[:at] in key:
            return text[:at], text[at:]
    return None


def continuation_total(config: SimConfig, context: str, continuation: str, right: str) -> float:
    """The summed logprob of ``continuation`` after ``context``."""
    draw = _rng("mc-option", config.seed, context, continuation).uniform(*WRONG_TOTALS)
    if config.faults.garbled_logprobs:
        return draw
    knows = _rng("mc", config.seed, context).random() < config.mc_accuracy
    if continuation != right:
        return draw
    return RIGHT_TOTAL if knows else UNKNOWN_RIGHT_TOTAL


def input_token_logprobs(config: SimConfig, text: str, start: int) -> list[list[Any]]:
    """SGLang's ``input_token_logprobs`` of ``text`` from token ``start`` on."""
    pieces = tokenize(text)
    logprobs: list[float | None] = [None, *_causal_logprobs(config.seed, pieces)[1:]]
    key = answer_key(config.mc_path)
    found = _split(key, text) if key else None
    if found is not None:
        context, continuation = found
        owned = len(pieces) - len(tokenize(context))  # the continuation's tokens (its leading space opens the first)
        total = continuation_total(config, context, continuation, key[context])
        logprobs[len(pieces) - owned:] = [total / owned] * owned
    return [[logprob, token_id(piece), None] for piece, logprob in zip(pieces, logprobs, strict=False)][max(start, 0):]


def _causal_logprobs(seed: int, pieces: list[str]) -> list[float | None]:
    """Each token's logprob from the text up to it (a running CRC), as a causal model's: a prefix scores the same
    whatever follows it."""
    low, high = CONTEXT_LOGPROBS
    running = zlib.crc32(str(seed).encode())
    logprobs: list[float | None] = []
    for piece in pieces:
        running = zlib.crc32(piece.encode(), running)
        logprobs.append(low + (high - low) * running / 0xFFFFFFFF)
    return logprobs


def attach(config: SimConfig, body: Mapping[str, Any], prompt: str, index: int, meta_info: dict) -> None:
    """Add ``input_token_logprobs`` to one reply's meta_info when the request asked for logprobs with a start
    (``logprob_start_len`` -1, SGLang's default, asks for output logprobs only)."""
    if not body.get("return_logprob"):
        return
    start = body.get("logprob_start_len", -1)
    start = start[index] if isinstance(start, list) else start
    meta_info["input_token_logprobs"] = input_token_logprobs(config, prompt, int(start)) if start >= 0 else []
