"""Rank logs: one file per rank under ``logs/<cell-id>/<rank>.log``, and reading their tails."""

from __future__ import annotations

import sys
from collections import deque
from pathlib import Path


def rank_log_path(logs_dir: Path, node_rank: int) -> Path:
    return logs_dir / f"{node_rank}.log"


def tail(path: Path, lines: int = 20) -> list[str]:
    """The last ``lines`` lines of a log (an empty list if it does not exist yet)."""
    try:
        with open(path, errors="replace") as handle:
            return [line.rstrip("\n") for line in deque(handle, maxlen=lines)]
    except FileNotFoundError:
        return []


def stderr_progress(message: str) -> None:
    """How a launcher says what it waits for (a pending job's or pod's reason) while a cell waits: on stderr."""
    print(f"dspark-ci: {message}", file=sys.stderr, flush=True)
