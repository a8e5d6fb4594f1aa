"""How far a running suite is, for whoever runs it: ``--dspark-progress FILE`` holds one line, ``LABEL DONE TOTAL``
(e.g. ``gpqa 37 198``), rewritten atomically at most every ``EVERY_S`` and at the last request. ``suites.runner``
reads it while it watches the deployment and shows it as the run's progress."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

EVERY_S = 0.5


class ProgressFile:
    def __init__(self, path: Path | None, label: str, total: int):
        self.path, self.label, self.total = path, label, total
        self._done = 0
        self._written_at = float("-inf")
        self._lock = threading.Lock()
        self._write()

    def advance(self) -> None:
        with self._lock:
            self._done += 1
            if self._done == self.total or time.monotonic() - self._written_at >= EVERY_S:
                self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        self._written_at = time.monotonic()
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        try:
            temporary.write_text(f"{self.label} {self._done} {self.total}\n")
            os.replace(temporary, self.path)
        except OSError:
            pass  # progress is a courtesy: never a reason for a measurement to fail


def read_progress(path: Path) -> str | None:
    """``"gpqa 37/198 requests"``, or None when nothing was reported (yet)."""
    try:
        label, done, total = path.read_text().split()
    except (OSError, ValueError):
        return None
    return f"{label} {done}/{total} requests"
