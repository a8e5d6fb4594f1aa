"""The ``main`` of the small ``python -m ci.<tool>`` helpers the workflows call: CONTRACT.md exit codes,
one message, no traceback (the same mapping ``dspark-ci`` applies to its verbs)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from dspark_ci.ground.errors import DsparkError


def run_tool(prog: str, body: Callable[[], int]) -> int:
    try:
        return int(body())
    except DsparkError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return int(err.exit_code)
