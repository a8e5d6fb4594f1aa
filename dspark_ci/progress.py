"""Progress a person can follow: cell, stage, elapsed. A live line on a terminal; plain lines in CI."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TextIO


DETAIL_EVERY_S = 30.0


class Progress:
    def __init__(self, stream: TextIO = sys.stderr, live: bool | None = None):
        self._stream = stream
        if live is None:
            live = stream.isatty() and os.environ.get("CI", "").lower() not in ("1", "true", "yes")
        self._live = live
        self._lock = threading.Lock()
        self._label = ""
        self._detail = ""
        self._detail_shown = False
        self._detail_printed = 0.0
        self._since = time.monotonic()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def stage(self, label: str) -> None:
        """A new stage starts: a plain line, or the live line is rewritten."""
        with self._lock:
            if not self._live:
                self._print_detail()
            self._label, self._since, self._detail = label, time.monotonic(), ""
            if self._live:
                self._draw()
            else:
                print(f"[dspark-ci] {label}", file=self._stream, flush=True)
        if self._live and self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()

    def detail(self, text: str) -> None:
        """How far the current stage got: shown after its label on the live line; in CI a plain line at
        most every DETAIL_EVERY_S seconds (a long accuracy suite stays visible without flooding the log)."""
        with self._lock:
            self._detail, self._detail_shown = text, False
            if self._live:
                self._draw()
            elif time.monotonic() - self._detail_printed >= DETAIL_EVERY_S:
                self._print_detail()

    def _print_detail(self) -> None:
        """(plain lines) The latest detail, unless shown already; the last one is shown when its stage ends."""
        if self._detail and not self._detail_shown:
            self._detail_printed, self._detail_shown = time.monotonic(), True
            print(f"[dspark-ci] {self._label}: {self._detail}", file=self._stream, flush=True)

    def done(self, line: str) -> None:
        """A finished result: always kept on screen as a line of its own."""
        with self._lock:
            if self._live:
                self._stream.write("\r\033[K")
            else:
                self._print_detail()
            self._detail = ""
            print(f"[dspark-ci] {line}", file=self._stream, flush=True)
            self._label = ""

    def close(self) -> None:
        self._stop.set()
        if self._ticker:
            self._ticker.join(timeout=2)
        with self._lock:
            if self._live and self._label:
                self._stream.write("\r\033[K")
                self._stream.flush()

    def _draw(self) -> None:
        if self._label:
            elapsed = time.monotonic() - self._since
            detail = f" · {self._detail}" if self._detail else ""
            self._stream.write(f"\r\033[K[dspark-ci] {self._label} ({elapsed:.0f}s){detail}")
            self._stream.flush()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                self._draw()
