"""A small deterministic tokenizer: words split into pieces of at most six characters.

Good enough for counting like a real tokenizer does (a few characters per token, leading
whitespace attached to the next piece) at almost no cost per token. Token ids are stable
across processes (CRC32, not Python's salted ``hash``).
"""

from __future__ import annotations

import re
import zlib

# Public for bench/sglang_bench_serving.py, whose Hugging Face tokenizer must split text exactly so.
PIECE_PATTERN = r"\s*\S{1,6}|\s+"
_PIECE = re.compile(PIECE_PATTERN)
VOCAB_SIZE = 128_000
EOS_TOKEN_ID = 1  # the stop token a natural end emits (its text is empty)
THINK_START, THINK_END = "<think>", "</think>"


def tokenize(text: str) -> list[str]:
    """``"Hello, understanding"`` -> ``["Hello,", " unders", "tandin", "g"]``; ``"".join`` gives the text back."""
    return _PIECE.findall(text)


def count_tokens(text: str) -> int:
    return len(_PIECE.findall(text))


def token_id(piece: str) -> int:
    if not piece:
        return EOS_TOKEN_ID
    return 2 + zlib.crc32(piece.encode()) % (VOCAB_SIZE - 2)


def encode(text: str) -> list[int]:
    return [token_id(piece) for piece in tokenize(text)]
