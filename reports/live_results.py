"""The run's results on disk while it runs (``ResultsWriter``): one JSON line per cell in ``results.jsonl`` at once
(linear in cells, survives SIGKILL), and results.json, junit.xml and report.md rewritten after every cell while a
rewrite is cheap, at most every ``REWRITE_EVERY_S`` once it is not (always at the end), so a report on disk is never
older than a few seconds and a 10k-cell run stays linear. Until the run finishes, what is on disk lists every
selected cell without an outcome as an error ("no outcome yet") and the run as not finished: a run killed with
SIGKILL, even after its last cell, leaves reports that say FAILED, never a green one. The final set (results.json,
report.html, junit.xml, report.md) is rendered, staged and renamed together last, so no half-written set says
PASSED."""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from dspark_ci.ground import interrupts
from dspark_ci.ground.errors import BadInput, InfraError
from dspark_ci.ground.processes import signals_deferred
from dspark_ci.ground.records import CellResult, RunResults, Status
from dspark_ci.matrices.quarantine import Quarantine
from dspark_ci.matrices.quarantine import apply as apply_quarantine
from dspark_ci.reports.baseline_file import Baseline
from dspark_ci.reports.history_db import history_path
from dspark_ci.reports.history_db import record as record_history
from dspark_ci.reports.junit import render_junit
from dspark_ci.reports.markdown import render_markdown, step_summary
from dspark_ci.reports.results import write_results, write_text_atomically
from dspark_ci.reports.writers import render_final_set, write_failure_reports, write_rendered

RESULTS_LINES = "results.jsonl"
REWRITE_EVERY_S = 5.0
# Rewrite after every cell as long as rewriting took at most 1/REWRITE_COST_FACTOR of the time since the last one.
REWRITE_COST_FACTOR = 20.0


@dataclass
class ResultsWriter:
    """Keeps the run's results on disk as they grow: one JSON line per cell at once, the whole files after every
    cell while that is cheap (at most every REWRITE_EVERY_S seconds once it is not) and at the end. Until the end,
    the files on disk list the selected cells without an outcome yet as errors, so no snapshot is ever green."""

    run_dir: Path
    results: RunResults
    baseline: Baseline | None = None
    selected: tuple[CellResult, ...] = ()  # every cell the run will try, in order, before it ran
    quarantine: Quarantine = field(default_factory=Quarantine)  # cells that run and report but do not gate
    today: dt.date = field(default_factory=dt.date.today)
    _written_at: float = field(default=0.0)
    _rewrite_cost_s: float = field(default=0.0)
    _warned: bool = field(default=False)

    def __post_init__(self):
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / RESULTS_LINES).unlink(missing_ok=True)
        except OSError as err:
            raise cannot_write(self.run_dir, err) from None
        self._rewrite()

    def add(self, cell: CellResult) -> CellResult:
        """Record ``cell`` as the quarantine file has it (the result returned: a quarantined one does not gate)."""
        cell = apply_quarantine(self.quarantine, cell, self.today)
        self._append(cell)
        if time.monotonic() - self._written_at >= min(REWRITE_EVERY_S, REWRITE_COST_FACTOR * self._rewrite_cost_s):
            try:
                self._rewrite()
            except (KeyboardInterrupt, InfraError):
                raise
            except Exception as err:  # a reporting bug must not stop the run: the cells go on, the report says so
                if not self._warned:
                    print(f"dspark-ci: warning: rewriting the reports failed ({type(err).__name__}: {err}); the run "
                          f"goes on, {RESULTS_LINES} keeps every cell", file=sys.stderr)
                    self._warned = True
                self._write_fallback_reports(err)
        return cell

    def interrupted(self) -> None:
        self.results = replace(self.results, interrupted=True)

    def finish(self) -> bool:
        """Write the final set (results.json, report.html, junit.xml, report.md: rendered, staged, then renamed
        together); False when it could not be written (the run is then red). A selected cell still without an
        outcome (the run ended on an error of its own) is recorded as not run. Ctrl-C or SIGTERM while the set is
        being rendered makes it an interrupted run's set (never green), and is let through."""
        for cell in self._waiting():
            self._append(cell.finished(
                Status.ERROR, "not run: the run stopped before this cell started (see the error it printed)"))
        self.results = replace(self.results, cells=self._in_matrix_order(self.results.cells))
        try:
            return self._write_final_set()
        except KeyboardInterrupt:  # raised by Python's own handler (the pipeline in-process, without ours)
            self.interrupted()
            with signals_deferred():
                return self._write_final_set()

    def _write_final_set(self) -> bool:
        if interrupts.requested() is not None:  # also one Python dropped in a GC callback: the flag counts
            self.interrupted()
        final = replace(self.results, finished_at=None if self.results.interrupted else now())
        history = self._remember(final)
        try:
            rendered = render_final_set(final, baseline=self.baseline, history=history)
            if interrupts.requested() is not None and not final.interrupted:  # came while they were rendered
                raise KeyboardInterrupt("interrupted while the reports were rendered")
            with _interrupts_held_while(final.complete):
                write_rendered(self.run_dir, rendered)
        except KeyboardInterrupt:
            raise
        except Exception as err:  # never lose the verdict to a reporting bug (or an interrupt) : say so, go red
            self.results = replace(final, finished_at=None)
            self._write_fallback_reports(err, with_results=True)
            print(f"dspark-ci: error: writing the reports failed ({type(err).__name__}: {err}); "
                  f"{self._what_was_kept()}", file=sys.stderr)
            return False
        self.results = final
        with contextlib.suppress(OSError):
            append_step_summary(final)
        return True

    def _append(self, cell: CellResult) -> None:
        self.results = self.results.with_cell(cell)
        try:
            with open(self.run_dir / RESULTS_LINES, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(cell.to_dict(), allow_nan=False, default=str) + "\n")
        except (OSError, ValueError) as err:
            print(f"dspark-ci: warning: could not append to {RESULTS_LINES}: {err}", file=sys.stderr)

    def snapshot(self) -> RunResults:
        """What goes on disk now: the results, and until the run finished every selected cell without an outcome
        as an error saying why (if the run was killed, that is what its reports keep saying)."""
        if self.results.finished_at is not None:
            return self.results
        waiting = self._waiting()
        why = (f"no outcome yet: the run was still going when this was written; if it is not running any more it was "
               f"killed before this cell finished (finished cells are in {RESULTS_LINES}; "
               f"`dspark-ci cleanup --run {self.results.run_id}` removes what it left running)")
        return replace(self.results, cells=self._in_matrix_order(
            (*self.results.cells, *(cell.finished(Status.ERROR, why) for cell in waiting))))

    def _waiting(self) -> list[CellResult]:
        """Selected cells without an outcome yet (cells side by side finish in any order)."""
        done = {cell.id for cell in self.results.cells}
        return [cell for cell in self.selected if cell.id not in done]

    def _in_matrix_order(self, cells: tuple[CellResult, ...]) -> tuple[CellResult, ...]:
        """The results in the order the cells were selected, whatever order they finished in."""
        position = {cell.id: index for index, cell in enumerate(self.selected)}
        return tuple(sorted(cells, key=lambda c: position.get(c.id, len(position))))

    def _remember(self, results: RunResults) -> Path | None:
        """Record the run in the run history (dspark_ci.reports.history_db); a history that cannot be written costs the
        trends, never the run."""
        path = history_path()
        try:
            record_history(path, results, self.run_dir)
        except (BadInput, OSError) as err:
            print(f"dspark-ci: warning: the run was not added to the run history ({err})", file=sys.stderr)
            return None
        return path

    def _rewrite(self) -> None:
        """The quick files while the run goes on (report.html, which draws charts, comes with the final set)."""
        started = time.monotonic()
        results = self.snapshot()
        try:
            write_results(self.run_dir / "results.json", results)
        except OSError as err:
            raise cannot_write(self.run_dir, err) from None
        write_text_atomically(self.run_dir / "junit.xml", render_junit(results))
        write_text_atomically(self.run_dir / "report.md", render_markdown(results, self.baseline))
        self._written_at = time.monotonic()
        self._rewrite_cost_s = self._written_at - started

    def _write_fallback_reports(self, err: Exception, with_results: bool = False) -> None:
        """Plain red reports saying why; with ``with_results``, results.json too (it needs no rendering, and is
        what says ``interrupted``)."""
        if with_results:
            with contextlib.suppress(OSError, ValueError):
                write_results(self.run_dir / "results.json", self.results)
        interrupted = "the run was interrupted (Ctrl-C or SIGTERM), and " if self.results.interrupted else ""
        with contextlib.suppress(OSError):
            write_failure_reports(self.run_dir, self.results, f"{interrupted}the reports could not be written "
                                                              f"({type(err).__name__}: {err})")

    def _what_was_kept(self) -> str:
        """Truthfully what is on disk: results.jsonl may be short (or empty) when the disk is full."""
        lines = _lines_in(self.run_dir / RESULTS_LINES)
        cells = len(self.results.cells)
        if lines >= cells:
            return f"{RESULTS_LINES} in {self.run_dir} holds every cell measured ({cells})"
        return (f"{RESULTS_LINES} in {self.run_dir} holds {lines} of the {cells} cells measured; the others are "
                "lost (see the warnings above)")


@contextlib.contextmanager
def _interrupts_held_while(complete: bool) -> Iterator[None]:
    """While a complete run's final set is renamed into place, Ctrl-C and SIGTERM are held; once it is, the run has
    finished, and one that came meanwhile has nothing left to stop (it is dropped, saying so). If the set could not
    be written, the interrupt is delivered."""
    if not complete or threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: received.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    written = False
    try:
        yield
        written = True
    finally:
        for sig, handler in previous.items():
            # the run has finished: a later signal has nothing to stop, and must not turn its exit code into 130
            signal.signal(sig, signal.SIG_IGN if written and handler is interrupts.on_signal else handler)
        if received and written:
            print(f"dspark-ci: {signal.Signals(received[0]).name} came as the run's final files were written: the "
                  "run had finished, nothing to stop", file=sys.stderr)
        elif received:
            signal.raise_signal(received[0])


def _lines_in(path: Path) -> int:
    try:
        with open(path, "rb") as handle:
            return sum(1 for line in handle if line.endswith(b"\n"))
    except OSError:
        return 0


def cannot_write(run_dir: Path, err: OSError) -> InfraError:
    check = ("the disk is full: free some space or pass --out on another disk" if err.errno in (errno.ENOSPC,
             errno.EDQUOT) else "check that the directory still exists and is writable")
    return InfraError(f"cannot write {run_dir}/results.json: {err.strerror or err} ({check})")


def append_step_summary(results: RunResults) -> None:
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if path:
        with open(path, "a") as handle:
            handle.write(step_summary(results) + "\n")


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
