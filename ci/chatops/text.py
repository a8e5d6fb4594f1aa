"""Echoing untrusted text (comment words, file names from a PR) into a reply, harmlessly.

GitHub turns ``@login`` and ``@org/team`` into notifications and ``#123`` into links wherever they
appear in a comment; a bot that echoes what anyone wrote would notify whomever they name. ``shown``
breaks mentions with a zero-width space (the text still reads the same), writes control characters
as escapes (a newline cannot start a new line of the reply) and bounds the length.
"""

from __future__ import annotations

import re

ZERO_WIDTH_SPACE = "\u200b"
MAX_SHOWN = 120
_MENTION = re.compile(r"@(?=[A-Za-z0-9_-])")


def shown(text: str, limit: int = MAX_SHOWN) -> str:
    clipped = text if len(text) <= limit else text[:limit - 3] + "..."
    escaped = "".join(c if c.isprintable() else repr(c)[1:-1] for c in clipped)
    return _MENTION.sub("@" + ZERO_WIDTH_SPACE, escaped)
