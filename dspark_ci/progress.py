"""Progress a person can follow: which cell of how many, its stage, how far a long suite is, the time the cell and
the run have taken, and an ETA once a cell has finished.

On a terminal: one live line, redrawn every second and cut to the terminal's width (a line that wrapped would leave
a stale copy of itself on every redraw); finished cells are kept as lines of their own. Elsewhere (``CI`` set, a
pipe, a file): plain lines, each with the wall-clock time and the run's elapsed time, and a long suite's progress at
most every ``PLAIN_DETAIL_EVERY_S`` and once more when its stage ends (so its last figure, e.g. GPQA's final
count and accuracy, is always in the log). ``verbosity`` 0 (``--quiet``) keeps only cells that did not pass and the
run's last lines; 2 (``--verbose``) prints every stage and every progress change as a plain line, even on a terminal.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

QUIET, NORMAL, VERBOSE = 0, 1, 2
PLAIN_DETAIL_EVERY_S = 30.0


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` columns, with an ellipsis where it was cut."""
    return text if len(text) <= width else text[:max(0, width - 1)] + "…"


def shorten_within(line: str, part: str, width: int) -> str:
    """``line`` made to fit ``width`` by eliding the middle of ``part`` (e.g. a long cell id), else cut at the end."""
    over = len(line) - width
    if over <= 0:
        return line
    if part in line and len(part) > 12:
        keep = max(12, len(part) - over - 1)  # enough of both ends to recognise it
        line = line.replace(part, f"{part[:keep - keep // 2]}…{part[len(part) - keep // 2:]}", 1)
    return fit(line, width)


def in_ci(environ=os.environ) -> bool:
    return environ.get("CI", "").lower() in ("1", "true", "yes")


class Progress:
    def __init__(self, stream: TextIO = sys.stderr, live: bool | None = None, verbosity: int = NORMAL,
                 clock: Callable[[], float] = time.monotonic):
        self._stream = stream
        if live is None:
            live = verbosity == NORMAL and _isatty(stream) and not in_ci()
        self._live = live
        self._verbosity = verbosity
        self._clock = clock
        self._lock = threading.Lock()
        self._label = ""
        self._detail = ""
        self._detail_printed_at = float("-inf")
        self._detail_shown = True  # (plain lines) the current detail has been printed
        self._since = self._run_started = clock()
        self._total = 0
        self._parallel = 1
        self._index = 0
        self._flights: dict[str, float] = {}  # cells in flight: id -> when it started
        self._stages: dict[str, str] = {}  # cells in flight: id -> its current stage
        self._cell_id = ""  # the cell whose stage the line shows (its id gives way first when the line is too long)
        self._cell_seconds: list[float] = []
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # ---------------------------------------------------------------- what the run says

    def start(self, total_cells: int, parallel: int = 1) -> None:
        """The run starts its cells now, up to ``parallel`` at a time (elapsed time and the ETA count from here)."""
        with self._lock:
            self._total, self._parallel, self._run_started = total_cells, max(1, parallel), self._clock()

    def cell(self, index: int, cell_id: str) -> None:
        """Cell ``index`` (1-based, in the order cells start) of the run starts."""
        with self._lock:
            self._index, self._cell_id = index, cell_id
            self._flights[cell_id] = self._clock()
            self._label, self._detail, self._since = cell_id, "", self._clock()
            if self._live:  # a plain line would only precede its first stage's
                self._draw()

    def stage(self, label: str, cell_id: str | None = None) -> None:
        """A new stage (of cell ``cell_id``, when cells run side by side) starts: a plain line, or the live line is
        rewritten."""
        with self._lock:
            self._print_last_detail()
            if cell_id is not None:
                self._stages[cell_id] = label
                self._cell_id = cell_id
            self._label, self._detail, self._since = label, "", self._clock()
            if self._live:
                self._draw()
            elif self._verbosity >= NORMAL:
                self._plain(self._status(plain=True))
        if self._live and self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()

    def detail(self, text: str, cell_id: str | None = None) -> None:
        """How far the current stage (of cell ``cell_id``) is (e.g. ``gpqa 37/198 requests``); the stage's clock
        keeps running."""
        with self._lock:
            stage = self._stages.get(cell_id or "")
            if stage is not None and stage != self._label:  # another cell's stage was shown: show this one's
                self._label, self._detail, self._cell_id = stage, "", cell_id or ""
            if text == self._detail:
                return
            self._detail, self._detail_shown = text, False
            now = self._clock()
            if self._live:
                self._draw()
            elif self._verbosity >= VERBOSE or (self._verbosity == NORMAL
                                                  and now - self._detail_printed_at >= PLAIN_DETAIL_EVERY_S):
                self._detail_printed_at, self._detail_shown = now, True
                self._plain(self._status(plain=True))

    def _print_last_detail(self) -> None:
        """(plain lines) The stage ends: its latest detail, unless printed already (a throttled one would be lost)."""
        if not self._live and self._verbosity >= NORMAL and self._label and self._detail and not self._detail_shown:
            self._detail_printed_at, self._detail_shown = self._clock(), True
            self._plain(self._status(plain=True))

    def cell_done(self, cell_id: str | None = None) -> float:
        """A cell finished (the only one in flight, unless named): how long it took (counted for the ETA)."""
        with self._lock:
            self._print_last_detail()
            cell_id = cell_id if cell_id is not None else next(iter(self._flights), "")
            started = self._flights.pop(cell_id, None)
            self._stages.pop(cell_id, None)
            took = self._clock() - started if started is not None else 0.0
            self._cell_seconds.append(took)
            self._label = self._detail = ""
            return took

    def result(self, line: str, passed: bool, cell_id: str = "") -> None:
        """A cell's result: kept on screen (in quiet mode only when it did not pass). On a terminal its first line
        fits the width (the middle of a long cell id gives way; results.json and the rerun line keep it whole)."""
        if passed and self._verbosity == QUIET:
            return
        if self._live:
            first, newline, rest = line.partition("\n")
            line = shorten_within(first, cell_id, _columns(self._stream) - 1) + newline + rest
        self.done(line)

    def done(self, line: str) -> None:
        """A result: always kept on screen as a line of its own."""
        with self._lock:
            if self._live:  # on a terminal the live line showed the times; the kept line stays short
                print(f"\r\033[K{line}", file=self._stream, flush=True)
            else:
                self._plain(line)
            self._label = ""

    def close(self) -> None:
        self._stop.set()
        if self._ticker:
            self._ticker.join(timeout=2)
        with self._lock:
            if self._live and self._label:
                self._stream.write("\r\033[K")
                self._stream.flush()
            self._label = ""

    # ---------------------------------------------------------------- how it is shown

    def eta(self) -> float | None:
        """Seconds left: the mean time of the finished cells times the cells left, less the time the cells in
        flight have had so far, shared by as many as run at once (never below zero); None until a cell finished."""
        if not self._cell_seconds or not self._total:
            return None
        mean = sum(self._cell_seconds) / len(self._cell_seconds)
        cells_left = self._total - len(self._cell_seconds)
        left = mean * cells_left - sum(min(mean, self._clock() - started) for started in self._flights.values())
        return max(0.0, left) / max(1, min(self._parallel, cells_left))

    def _where(self) -> str:
        """``[3/12] `` one at a time; ``[4 done, 3 in flight, 5 queued] `` side by side."""
        if self._parallel > 1 and self._total:
            done = len(self._cell_seconds)
            queued = self._total - done - len(self._flights)
            return f"[{done} done, {len(self._flights)} in flight, {queued} queued] "
        return f"[{self._index}/{self._total}] " if self._index and self._flights else ""

    def _status(self, plain: bool = False, width: int | None = None) -> str:
        """The stage, how far it is, and the times: the stage's and the run's (a plain line's stamp already says
        the run's), then the ETA once known. With ``width``, the text gives way (the middle of the cell id first)
        so that the times always show."""
        now = self._clock()
        text = f"{self._where()}{self._label}" + (f" · {self._detail}" if self._detail else "")
        times = [] if plain else [duration(now - self._since)]
        if self._total and not plain:
            times.append(f"run {duration(now - self._run_started)}")
        eta = self.eta()
        if eta is not None:
            times.append(f"ETA {duration(eta)}")
        suffix = f" ({', '.join(times)})" if times else ""
        if width is not None:
            text = shorten_within(text, self._cell_id, max(0, width - len(suffix)))
        return text + suffix

    def _plain(self, line: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        elapsed = duration(self._clock() - self._run_started)
        print(f"[dspark-ci {stamp} +{elapsed}] {line}", file=self._stream, flush=True)

    def _draw(self) -> None:
        if self._label:
            # one column short of the width: a terminal that wraps at the last column would leave a stale line
            width = _columns(self._stream) - 1
            line = fit(self._status(width=width), width)
            self._stream.write(f"\r\033[K{line}")
            self._stream.flush()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                self._draw()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _columns(stream: TextIO) -> int:
    """The terminal's width now (it may have been resized), else $COLUMNS, else 80."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (AttributeError, OSError, ValueError):
        try:
            return int(os.environ.get("COLUMNS", "80"))
        except ValueError:
            return 80
