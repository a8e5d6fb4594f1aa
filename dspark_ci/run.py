"""``dspark-ci run``: a short sequence of steps passing records.

    options → cells → baselines → run dir → for each cell: run_cell → results → reports → verdict

Inputs are all validated before anything is launched. After every cell the result is appended to
``results.jsonl`` (linear in cells, survives SIGKILL), and results.json, junit.xml and report.md are rewritten
after every cell while a rewrite is cheap, at most every ``REWRITE_EVERY_S`` once it is not (always at the end),
so a report on disk is never older than a few seconds and a 10k-cell run stays linear. Until the run finishes,
what is on disk lists every selected cell without an outcome as an error ("no outcome yet"): a run killed with
SIGKILL leaves reports that say FAILED, never a green one. ``verdict`` is the one place that decides the exit
code: never 0 unless every selected cell has a recorded outcome and none failed, and something was measured.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import functools
import itertools
import json
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from dspark_ci.cell_run import CellContext, pending_result, run_cell
from dspark_ci.preflight import preflight
from dspark_ci.rejections import decide_rejections
from dspark_ci.progress import Progress, duration
from dspark_ci.scheduler import Interrupted, Scheduler, longest_first
from ground.errors import BadInput, ExitCode, InfraError
from ground.records import CellResult, GateResult, RunResults, Status
from ground.sglang.release import DEFAULT_VERSION
from launchers.contract import Capacity, Launcher
from launchers.ledger import Ledger
from launchers.leftovers import release
from matrices import load_cells
from matrices.cell import Cell
from reports import step_summary, write_reports
from reports.writers import write_failure_reports
from reports.baseline import load_baseline
from ground.stats import Levels
from reports.gates import evaluate, statistical_gates
from reports.history import cell_seconds, history_path, record as record_history
from reports.markdown import rerun_command
from suites.runner import gpqa_note, written_outcome
from reports.results import write_results, write_text_atomically

RESULTS_LINES = "results.jsonl"
REWRITE_EVERY_S = 5.0
# Rewrite after every cell as long as rewriting took at most 1/REWRITE_COST_FACTOR of the time since the last one.
REWRITE_COST_FACTOR = 20.0


@dataclass(frozen=True)
class RunOptions:
    matrices: tuple[str, ...]
    run_id: str
    cell_ids: tuple[str, ...] = ()
    launcher: str = "local"
    suites: tuple[str, ...] | None = None
    out: Path | None = None
    baseline: str | None = None
    sglang_version: str = DEFAULT_VERSION
    rerun_options: tuple[str, ...] = ()  # the options this run was given, repeated by its rerun command
    force: bool = False  # write into an --out directory that already holds files
    accept_inconclusive: bool = False  # a run whose worst outcome is an inconclusive gate exits 0 (else 4)
    environment: Mapping[str, Any] = field(default_factory=dict)  # where it runs (results.json "environment")
    max_parallel: int | None = None  # cells in flight at once; None: what the launcher has room for
    rejections: str = "launch"  # "resolver": expected rejections SGLang's resolver decides are not launched

    @property
    def run_dir(self) -> Path:
        return self.out or Path("runs") / self.run_id


def run_capacity(launcher: Launcher, max_parallel: int | None) -> Capacity:
    """How many cells run side by side: --max-parallel when given (still within the launcher's nodes), else the
    launcher's own capacity; a launcher that offers none (local: cells would share this CPU and disturb each
    other's timings) runs one at a time."""
    offered = getattr(launcher, "capacity", None)
    own = offered() if offered else Capacity(1, None, f"the {launcher.name} launcher runs one cell at a time "
                                                      "unless --max-parallel says otherwise")
    if max_parallel is None:
        return own
    return Capacity(max_parallel, own.nodes, f"--max-parallel {max_parallel}"
                    + (f", within {own.nodes} nodes" if own.nodes is not None else ""))


def _reporting_as(ctx: CellContext, cell: Cell, progress: Progress) -> CellContext:
    """``ctx`` with its progress reported as ``cell``'s (cells side by side each keep their own stage)."""
    return replace(ctx, stage=functools.partial(progress.stage, cell_id=cell.id),
                   detail=functools.partial(progress.detail, cell_id=cell.id))


def ids(cells: list[Cell]) -> list[str]:
    return [cell.id for cell in cells]


def select_cells(cells: list[Cell], wanted: tuple[str, ...]) -> list[Cell]:
    if not wanted:
        return cells
    by_id = {cell.id: cell for cell in cells}
    unknown = [w for w in wanted if w not in by_id]
    if unknown:
        raise BadInput(f"--cell {unknown[0]}", "no such cell in the given matrices",
                       "list them with: dspark-ci plan MATRIX --format table")
    return [by_id[w] for w in wanted]


@dataclass(frozen=True)
class Baselines:
    """Every baseline the run needs, loaded before anything is launched (a bad one is exit 2, nothing lost)."""

    by_path: Mapping
    override: str | None
    levels: Levels | None = None  # every statistical gate's levels: the run's false-red rate split over them all

    @classmethod
    def load(cls, cells: list[Cell], override: str | None) -> "Baselines":
        paths = {override} if override else {c.baseline for c in cells if c.baseline}
        loaded = cls({path: load_baseline(path) for path in paths if path}, override)
        gates = sum(statistical_gates(pending_result(cell), loaded.of(cell.baseline)) for cell in cells)
        return replace(loaded, levels=Levels.family(gates))

    def of(self, cell_baseline: str | None):
        return self.by_path.get(self.override or cell_baseline)

    def gate(self, cell: CellResult, metrics: Mapping) -> tuple[GateResult, ...]:
        return evaluate(cell, metrics, self.of(cell.baseline), self.levels)

    def shared(self):
        """The one baseline every cell uses, if there is exactly one (reports name its lines)."""
        return next(iter(self.by_path.values())) if len(self.by_path) == 1 else None


def run(options: RunOptions, launcher: Launcher, suite_defaults: Callable[[dict], dict] = lambda o: o,
        progress: Progress | None = None) -> ExitCode:
    progress = progress or Progress()
    cells = select_cells(load_cells(list(options.matrices)), options.cell_ids)
    baselines = Baselines.load(cells, options.baseline)
    run_dir = options.run_dir
    progress.stage(f"preflight: {len(cells)} cell(s), {options.launcher} launcher")
    with claimed_run_dir(run_dir, options.force, f"--out {run_dir}" if options.out else f"run directory {run_dir}"):
        decided = decide_rejections(cells, options.sglang_version, options.rejections)
        preflight(decided.to_launch, launcher, run_dir)
    ledger = Ledger(options.run_id, run_dir)
    ledger.register(os.environ)
    writer = ResultsWriter(run_dir, RunResults(run_id=options.run_id, started_at=_now(), finished_at=None,
                                               launcher=options.launcher, matrices=options.matrices,
                                               run_options=options.rerun_options, environment=options.environment),
                           baseline=baselines.shared(), selected=tuple(cells))
    ctx = CellContext(launcher=launcher, run_dir=run_dir, sglang_version=options.sglang_version,
                      suites=options.suites, gate=baselines.gate, stage=progress.stage, detail=progress.detail,
                      suite_defaults=suite_defaults)
    try:
        _record_decided(cells, decided.results, writer, progress)
        _run_cells(decided.to_launch, len(cells), run_capacity(launcher, options.max_parallel), ctx, writer, progress)
    finally:
        reported = writer.finish()
        _release(ledger)
        progress.close()
        progress.done(f"results in {run_dir}/ (results.json, junit.xml, report.md, report.html, logs/)")
        rerun = rerun_command(writer.results)
        if rerun:
            progress.done(f"run the cells that did not pass again: {rerun}")
    code, reason = verdict(writer.results, len(cells), options.accept_inconclusive)
    if reason:
        progress.done(reason)
    return code if reported else max(code, ExitCode.FELL_SHORT)


def _release(ledger: Ledger) -> None:
    """Everything the run started is torn down by now: make sure, and drop the run from the index when so."""
    removal = release(ledger, os.environ)
    for what in removal.removed:
        print(f"dspark-ci: warning: teardown had left {what}; removed now", file=sys.stderr)
    for problem in removal.problems:
        print(f"dspark-ci: warning: {problem} (`dspark-ci cleanup --run {ledger.run_id}` tries again)",
              file=sys.stderr)


def _record_decided(cells: list[Cell], decided: Mapping[str, CellResult], writer: "ResultsWriter",
                    progress: Progress) -> None:
    """The expected rejections SGLang's resolver decided (nothing launched for them), recorded first."""
    for cell in cells:
        if cell.id in decided:
            result = decided[cell.id]
            writer.add(result)
            progress.result(_summary_line(len(writer.results.cells), len(cells), result, 0.0)
                            + " (decided by SGLang's resolver, not launched)",
                            passed=result.exit_code == ExitCode.OK, cell_id=cell.id)


def _run_cells(cells: list[Cell], total: int, capacity: Capacity, ctx: CellContext, writer: "ResultsWriter",
               progress: Progress) -> None:
    """Launch and measure ``cells``, up to ``capacity`` side by side (longest first), each result recorded as it
    comes; on Ctrl-C / SIGTERM every cell in flight is torn down and where each got to is recorded."""
    order = cells if capacity.max_parallel <= 1 else longest_first(cells, cell_seconds(history_path(), ids(cells)))
    if capacity.max_parallel > 1:
        progress.done(f"up to {capacity.max_parallel} cells side by side ({capacity.why}), longest first")
    progress.start(len(cells), capacity.max_parallel)
    started = itertools.count(1)

    def on_result(cell: Cell, result: CellResult) -> None:
        writer.add(result)
        took = progress.cell_done(cell.id)
        progress.result(_summary_line(len(writer.results.cells), total, result, took),
                        passed=result.exit_code == ExitCode.OK, cell_id=cell.id)

    try:
        Scheduler(order, lambda cell: run_cell(cell, _reporting_as(ctx, cell, progress)), capacity,
                  on_start=lambda cell: progress.cell(next(started), cell.id), on_result=on_result).run()
    except Interrupted as stop:  # Ctrl-C / SIGTERM: every cell in flight torn down; record where each got to
        for _, result in stop.finished:
            writer.add(result)
        for cell in stop.cut_short:
            writer.add(interrupted_result(cell, ctx.run_dir))
        for cell in stop.not_started:
            writer.add(not_run_result(cell, "the run was interrupted before this cell started"))
        writer.interrupted()
        raise


@contextlib.contextmanager
def claimed_run_dir(run_dir: Path, force: bool, where: str):
    """Create the run directory and prove it writable, by its real cause when it is not; a directory that already
    holds files is refused unless ``force``. Whatever the checks inside the block raise, the directories created
    here are removed again (when still empty): a run refused before it started leaves nothing behind."""
    if run_dir.exists() and not run_dir.is_dir():
        raise BadInput(where, "is an existing file, not a directory", "pass --out a new directory")
    if run_dir.is_dir() and any(run_dir.iterdir()) and not force:
        holds = "a previous run's results" if (run_dir / "results.json").exists() else "files"
        raise BadInput(where, f"already holds {holds}, which this run would overwrite",
                       "pass --out a new or empty directory, or add --force to write over it")
    created = [p for p in (run_dir, *run_dir.parents) if not p.exists()]
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".dspark-ci-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        _remove_empty(created)
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _cannot_write(run_dir, err) from None
        raise BadInput(where, f"cannot be written: {err.strerror or err}",
                       "pass --out a directory you can create and write to") from None
    try:
        yield
    except BaseException:
        _remove_empty(created)
        raise


def _remove_empty(created: list[Path]) -> None:
    for path in created:  # deepest first
        with contextlib.suppress(OSError):
            path.rmdir()


def verdict(results: RunResults, selected: int, accept_inconclusive: bool = False) -> tuple[ExitCode, str | None]:
    """The run's exit code and, when it is not 0, why. Green only when every selected cell has an outcome,
    none failed, and at least one was measured or rejected as expected (skipping everything tests nothing).
    A run whose worst outcome is an inconclusive gate exits 4 (ExitCode.INCONCLUSIVE): never 0 unless
    ``accept_inconclusive`` (`run --accept-inconclusive`) asks for it, never above a real failure (1-3)."""
    cells = results.cells
    if len(cells) < selected:
        return ExitCode.FELL_SHORT, f"only {len(cells)} of {selected} selected cells have a recorded outcome"
    worst = max((cell.exit_code for cell in cells if cell.exit_code != ExitCode.INCONCLUSIVE), default=ExitCode.OK)
    if worst != ExitCode.OK:
        failing = sum(cell.status.failing for cell in cells)
        return worst, f"{failing} of {len(cells)} cells did not pass"
    if cells and all(cell.status is Status.SKIPPED for cell in cells):
        return ExitCode.FELL_SHORT, ("nothing was measured: every cell was skipped (their expectations were written "
                                     "for another SGLang release than --sglang-version)")
    if not cells:
        return ExitCode.FELL_SHORT, "nothing was measured: no cell was selected"
    undecided = sum(cell.status is Status.INCONCLUSIVE for cell in cells)
    if undecided and not accept_inconclusive:
        return ExitCode.INCONCLUSIVE, (f"{undecided} of {len(cells)} cells are inconclusive: a statistical gate could "
                                       "not decide (not a regression; --accept-inconclusive exits 0 for this)")
    return ExitCode.OK, None


def interrupted_result(cell: Cell, run_dir: Path) -> CellResult:
    """The interrupted cell, with what its suites wrote as they stopped (a partial GPQA figure, marked so;
    never its metrics, so nothing partial is gated)."""
    result = not_run_result(cell, "interrupted (Ctrl-C or SIGTERM) before the cell finished; everything it "
                                  "started was torn down")
    written = written_outcome(run_dir / "logs" / cell.id)
    return replace(result, warnings=tuple(written.warnings), gpqa=gpqa_note(written.records))


def not_run_result(cell: Cell, why: str) -> CellResult:
    return pending_result(cell).finished(Status.ERROR, why)


@dataclass
class ResultsWriter:
    """Keeps the run's results on disk as they grow: one JSON line per cell at once, the whole files after every
    cell while that is cheap (at most every REWRITE_EVERY_S seconds once it is not) and at the end. Until the end,
    the files on disk list the selected cells without an outcome yet as errors, so no snapshot is ever green."""

    run_dir: Path
    results: RunResults
    baseline: object = None
    selected: tuple[Cell, ...] = ()  # every cell the run will try, in order
    _written_at: float = field(default=0.0)
    _rewrite_cost_s: float = field(default=0.0)
    _warned: bool = field(default=False)

    def __post_init__(self):
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / RESULTS_LINES).unlink(missing_ok=True)
        except OSError as err:
            raise _cannot_write(self.run_dir, err) from None
        self._rewrite()

    def add(self, cell: CellResult) -> None:
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

    def interrupted(self) -> None:
        self.results = replace(self.results, interrupted=True)

    def finish(self) -> bool:
        """Write everything one last time; False when a report could not be written (the run is then red).
        A selected cell still without an outcome (the run ended on an error of its own) is recorded as not run."""
        for cell in self._waiting():
            self._append(pending_result(cell).finished(
                Status.ERROR, "not run: the run stopped before this cell started (see the error it printed)"))
        self.results = replace(self.results, cells=self._in_matrix_order(self.results.cells), finished_at=_now())
        history = self._remember()
        try:
            self._rewrite(html=True, history=history)
            _append_step_summary(self.results)
            return True
        except KeyboardInterrupt:
            raise
        except Exception as err:  # never lose the verdict to a reporting bug: say so, and go red
            print(f"dspark-ci: error: writing the reports failed ({type(err).__name__}: {err}); results.json and "
                  f"{RESULTS_LINES} in {self.run_dir} hold what was measured", file=sys.stderr)
            self._write_fallback_reports(err)
            return False

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
            (*self.results.cells, *(pending_result(cell).finished(Status.ERROR, why) for cell in waiting))))

    def _waiting(self) -> list[Cell]:
        """Selected cells without an outcome yet (cells side by side finish in any order)."""
        done = {cell.id for cell in self.results.cells}
        return [cell for cell in self.selected if cell.id not in done]

    def _in_matrix_order(self, cells: tuple[CellResult, ...]) -> tuple[CellResult, ...]:
        """The results in the order the cells were selected, whatever order they finished in."""
        position = {cell.id: index for index, cell in enumerate(self.selected)}
        return tuple(sorted(cells, key=lambda c: position.get(c.id, len(position))))

    def _remember(self) -> Path | None:
        """Record the finished run in the run history (reports.history); a history that cannot be written
        costs the trends, never the run."""
        path = history_path()
        try:
            record_history(path, self.results, self.run_dir)
        except (BadInput, OSError) as err:
            print(f"dspark-ci: warning: the run was not added to the run history ({err})", file=sys.stderr)
            return None
        return path

    def _rewrite(self, html: bool = False, history: Path | None = None) -> None:
        started = time.monotonic()
        results = self.snapshot()
        try:
            write_results(self.run_dir / "results.json", results)
        except OSError as err:
            raise _cannot_write(self.run_dir, err) from None
        if html:
            write_reports(self.run_dir, results, baseline=self.baseline, history=history)
        else:  # quick ones only while the run goes on (report.html draws charts)
            from reports.junit import render_junit
            from reports.markdown import render_markdown
            write_text_atomically(self.run_dir / "junit.xml", render_junit(results))
            write_text_atomically(self.run_dir / "report.md", render_markdown(results, self.baseline))
        self._written_at = time.monotonic()
        self._rewrite_cost_s = self._written_at - started

    def _write_fallback_reports(self, err: Exception) -> None:
        with contextlib.suppress(OSError):
            write_failure_reports(self.run_dir, self.results, f"the reports could not be written "
                                                              f"({type(err).__name__}: {err})")


def _cannot_write(run_dir: Path, err: OSError) -> InfraError:
    check = ("the disk is full: free some space or pass --out on another disk" if err.errno in (errno.ENOSPC,
             errno.EDQUOT) else "check that the directory still exists and is writable")
    return InfraError(f"cannot write {run_dir}/results.json: {err.strerror or err} ({check})")


def _summary_line(index: int, total: int, result: CellResult, took: float) -> str:
    line = f"[{index}/{total}] {result.id}: {result.status.value.upper()} in {duration(took)}"
    if result.boot_seconds is not None:
        line += f" (boot {result.boot_seconds:.1f}s)"
    if result.error:
        line += "\n    " + result.error.replace("\n", "\n    ")
    return line


def _append_step_summary(results: RunResults) -> None:
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if path:
        with open(path, "a") as handle:
            handle.write(step_summary(results) + "\n")


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
