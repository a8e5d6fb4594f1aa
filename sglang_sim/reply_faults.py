"""Faults that alter only non-streamed replies, as a broken proxy or a broken non-streaming path of a server does:
the streamed replies stay right, so a check that only streams never sees them.

- ``nonstream_garbage``: the text of every non-streamed chat, completions and /generate reply is random letters
  without vowels (no words);
- ``nonstream_empty``: that text is empty;
- ``usage_doubled``: non-streamed usage counts twice the completion tokens (total adjusted, so it still adds up:
  only a comparison with another measurement shows it is impossible).
"""

from __future__ import annotations

import random
from typing import Any

from dspark_ci.sglang_sim.sim_config import Faults

CONSONANTS = "bcdfghjklmnpqrstvwxz"


def garbage(length: int, seed: int = 0) -> str:
    """``length``-ish characters of vowel-less 'words' (random, so it does not compress like a repeated pattern)."""
    rng = random.Random(seed + length)
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < max(length, 24):
        words.append("".join(rng.choice(CONSONANTS) for _ in range(rng.randint(2, 6))))
    return " ".join(words)


def text(faults: Faults, original: str) -> str:
    """The non-streamed reply's text as the faults have it."""
    if faults.nonstream_empty:
        return ""
    if faults.nonstream_garbage:
        return garbage(len(original))
    return original


def usage(faults: Faults, reported: dict[str, Any]) -> dict[str, Any]:
    """The non-streamed reply's usage as the faults have it."""
    if not faults.usage_doubled:
        return reported
    completion = int(reported.get("completion_tokens") or 0) * 2
    return {**reported, "completion_tokens": completion,
            "total_tokens": int(reported.get("prompt_tokens") or 0) + completion}
