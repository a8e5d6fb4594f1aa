"""Echoing untrusted text (comment words, file names from a PR) into a reply, harmlessly.

A reply is GitHub Markdown, which also renders HTML: a PR file named ``<img src=x onerror=...>`` or
``[click](https://...)`` echoed as it is becomes markup in a comment signed by the bot. GitHub also
turns ``@login`` into a notification, ``#123`` into a cross-link (and a "mentioned" event on that
issue) and ``https://...`` or ``www...`` into a link wherever they appear. ``shown`` makes any such
text inert and still readable: ``< > &`` become HTML entities; ``\\ ` [ ]`` are backslash-escaped (no
link, image or code span can open); a zero-width space goes after ``@``, ``#``, ``://`` and ``www``;
control characters are written as escapes (a newline cannot start a new line of the reply); the
length is bounded. Everything a reply says that was not written by us goes through it.
"""

from __future__ import annotations

import re

ZERO_WIDTH_SPACE = "\u200b"
MAX_SHOWN = 120
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_ESCAPED = re.compile(r"([\\`\[\]])")
# Where GitHub would link or notify: a mention, an issue reference, a scheme or a www. autolink.
_LINKING = re.compile(r"(@(?=[A-Za-z0-9_-])|#(?=\d)|GH-(?=\d)|://|\bwww(?=\.))", re.IGNORECASE)


def clip(text: str, limit: int = MAX_SHOWN) -> str:
    """``text`` bounded in length, nothing else: for a piece of a message that is ``shown`` as a whole
    (escaping the piece too would escape it twice)."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def shown(text: str, limit: int = MAX_SHOWN) -> str:
    printable = "".join(c if c.isprintable() else repr(c)[1:-1] for c in clip(text, limit))
    escaped = _ESCAPED.sub(r"\\\1", printable)
    escaped = "".join(_ENTITIES.get(c, c) for c in escaped)
    return _LINKING.sub(lambda match: match.group(1)[:1] + ZERO_WIDTH_SPACE + match.group(1)[1:], escaped)
