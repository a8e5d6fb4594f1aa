"""A small deterministic tokenizer: words split into pieces of at most six characters.

Good enough for counting like a real tokenizer does (a few characters per token, leading
whitespace attached to the next piece) at almost no cost per token. Token ids are stable
across processes (CRC32, not Python's salted ``hash``).
"""

from __future__ import annotations

import re
import sys
import zlib

# Public for bench/sglang_bench_serving.py, whose Hugging Face tokenizer must split text exactly so.
PIECE_PATTERN = r"\s*\S{1,6}|\s+"
_PIECE = re.compile(PIECE_PATTERN)


def onig_pattern(pattern: str = PIECE_PATTERN) -> str:
    r"""``pattern`` with ``\s``/``\S`` spelled out as Python's ``re`` has them, for a Hugging Face tokenizer that
    must split exactly so: the tokenizers library's regex engine (Oniguruma) leaves out U+001C..U+001F, which
    Python counts as whitespace."""
    spaces = [code for code in range(sys.maxunicode + 1) if re.match(r"\s", chr(code))]
    ranges, start = [], spaces[0]
    for previous, code in zip(spaces, spaces[1:] + [-1], strict=False):
        if code != previous + 1:
            ranges.append(f"\\x{{{start:x}}}" + (f"-\\x{{{previous:x}}}" if previous != start else ""))
            start = code
    space_class = "".join(ranges)
    return pattern.replace(r"\s", f"[{space_class}]").replace(r"\S", f"[^{space_class}]")


VOCAB_SIZE = 128_000
EOS_TOKEN_ID = 1  # the stop token a natural end emits (its text is empty)
THINK_START, THINK_END = "<think>", "</think>"


def tokenize(text: str) -> list[str]:
    """``"Hello, understanding"`` -> ``["Hello,", " unders", "tandin", "g"]``; ``"".join`` gives the text back."""
    return _PIECE.findall(text)


def count_tokens(text: str) -> int:
    """``len(tokenize(text))`` at half the cost (every request counts its prompt): a word of n characters is
    ceil(n / 6) pieces, its leading whitespace going with its first, and whitespace at the very end one more
    (``str.split`` and ``re``'s ``\\s`` agree on what whitespace is)."""
    return sum((len(word) + 5) // 6 for word in text.split()) + text[-1:].isspace()


def token_id(piece: str) -> int:
    if not piece:
        return EOS_TOKEN_ID
    return 2 + zlib.crc32(piece.encode()) % (VOCAB_SIZE - 2)


def encode(text: str) -> list[int]:
    return [token_id(piece) for piece in tokenize(text)]
