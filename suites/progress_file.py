"""How far a running suite is, for whoever runs it: ``--dspark-progress FILE`` holds one line, ``LABEL DONE TOTAL
[NOTE]`` (e.g. ``gpqa 37 198 accuracy 62.2%``: a suite may add a running figure), rewritten atomically at most every
``EVERY_S`` and at the last request. ``dspark_ci.suite_runner`` reads it while it watches the deployment and shows it as
the run's progress."""

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
        self._note = ""
        self._written_at = float("-inf")
        self._lock = threading.Lock()
        self._write()

    def advance(self, note: str | None = None) -> None:
        """One more request done; ``note`` (one line) replaces the running figure shown after the count."""
        with self._lock:
            self._done += 1
            if note is not None:
                self._note = " ".join(note.split())
            if self._done == self.total or time.monotonic() - self._written_at >= EVERY_S:
                self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        self._written_at = time.monotonic()
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        try:
            note = f" {self._note}" if self._note else ""
            temporary.write_text(f"{self.label} {self._done} {self.total}{note}\n")
            os.replace(temporary, self.path)
        except OSError:
            pass  # progress is a courtesy: never a reason for a measurement to fail


def read_progress(path: Path) -> str | None:
    """``"gpqa 37/198 requests"`` (``", accuracy 62.2%"`` after it when the suite adds a note), or None when nothing
    was reported (yet)."""
    try:
        label, done, total, *note = path.read_text().split(maxsplit=3)
    except (OSError, ValueError):
        return None
    return f"{label} {done}/{total} requests" + (f", {note[0].strip()}" if note else "")
