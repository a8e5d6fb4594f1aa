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
import errno
import functools
import itertools
import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dspark_ci import run_flags
from dspark_ci.cell_queue import Interrupted, Scheduler, longest_first, need_of
from dspark_ci.cell_run import CellContext, pending_result, run_cell, suite_names
from dspark_ci.evidence import Sampling
from dspark_ci.ground import interrupts
from dspark_ci.ground.errors import BadInput, ExitCode
from dspark_ci.ground.errors import worst as worst_exit
from dspark_ci.ground.ledger import Ledger
from dspark_ci.ground.processes import signals_deferred
from dspark_ci.ground.records import CellResult, GateResult, RunResults, Status
from dspark_ci.ground.stats import Levels, scipy_stats
from dspark_ci.launchers.contract import Capacity, Launcher
from dspark_ci.launchers.leftovers import release
from dspark_ci.matrices import load_cells
from dspark_ci.matrices.cell import Cell
from dspark_ci.matrices.quarantine import Quarantine
from dspark_ci.progress import Progress, duration
from dspark_ci.reference_boot import launches_reference
from dspark_ci.rejections import decide_rejections
from dspark_ci.reports.baseline_file import load_baseline
from dspark_ci.reports.gates import evaluate, statistical_gates
from dspark_ci.reports.history_db import cell_seconds, history_path
from dspark_ci.reports.live_results import ResultsWriter, cannot_write, now
from dspark_ci.reports.markdown import rerun_command
from dspark_ci.reports.results import quarantine_line
from dspark_ci.run_preflight import preflight
from dspark_ci.suite_runner import gpqa_note, mc_note, written_outcome
from dspark_ci.suite_runner import prestart as prestart_suites
from dspark_ci.warm_worker import close_warm_workers


@dataclass(frozen=True)
class RunOptions:
    matrices: tuple[str, ...]
    run_id: str
    cell_ids: tuple[str, ...] = ()
    launcher: str = run_flags.default("launcher")  # the flags' defaults are declared once (dspark_ci/run_flags.py)
    suites: tuple[str, ...] | None = None
    out: Path | None = None
    baseline: str | None = None
    sglang_version: str = run_flags.default("sglang_version")
    rerun_options: tuple[str, ...] = ()  # the options this run was given, repeated by its rerun command
    force: bool = False  # write into an --out directory that already holds files
    accept_inconclusive: bool = False  # a run whose worst outcome is an inconclusive gate exits 0 (else 4)
    sampling: Sampling = Sampling()  # boots for inconclusive gates, retries for failed cells (dspark_ci/evidence.py)
    environment: Mapping[str, Any] = field(default_factory=dict)  # where it runs (results.json "environment")
    max_parallel: int | None = run_flags.default("max_parallel")  # None: what the launcher has room for
    rejections: str = run_flags.default("rejections")  # "resolver": SGLang's resolver decides, nothing launched
    quarantine: Quarantine = field(default_factory=Quarantine)  # cells that run and report but do not gate
    forwarded_env: Mapping[str, str] = field(default_factory=dict)  # caller variables every rank gets (DSPARK_SIM_*)

    @property
    def server(self) -> str:
        return str(self.environment.get("server") or "sim")

    @property
    def build(self) -> str:
        """The build under test, as cell identities name it: the simulator pretends the version it is told."""
        if self.server == "sim":
            return f"sim {self.forwarded_env.get('DSPARK_SIM_VERSION') or self.sglang_version}"
        return f"{self.server} {self.sglang_version}"

    @property
    def run_dir(self) -> Path:
        return self.out or Path("runs") / self.run_id


def run_capacity(launcher: Launcher, max_parallel: int | None) -> Capacity:
    """How many cells run side by side: --max-parallel when given (still within the launcher's nodes), else the
    launcher's own capacity (``Launcher.capacity``: local says one at a time)."""
    own = launcher.capacity()
    if max_parallel is None:
        return own
    within = (f", within {sum(own.host_gpus)} GPUs" if own.host_gpus else
              f", within {own.nodes} nodes" if own.nodes is not None else "")
    return Capacity(max_parallel, own.nodes, f"--max-parallel {max_parallel}{within}", own.host_gpus)


def _reporting_as(ctx: CellContext, cell: Cell, progress: Progress) -> CellContext:
    """``ctx`` with its progress reported as ``cell``'s (cells side by side each keep their own stage)."""
    return replace(ctx, stage=functools.partial(progress.stage, cell_id=cell.id),
                   detail=functools.partial(progress.detail, cell_id=cell.id))


def ids(cells: list[Cell]) -> list[str]:
    return [cell.id for cell in cells]


def select_cells(cells: list[Cell], wanted: tuple[str, ...]) -> list[Cell]:
    if not wanted:
        return cells
    twice = next((w for index, w in enumerate(wanted) if w in wanted[:index]), None)
    if twice is not None:
        raise BadInput(f"--cell {twice}", "given twice (a cell runs once per run)", "give each --cell once")
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
    def load(cls, cells: list[Cell], override: str | None, max_boots: int = 1, retries: int = 0) -> Baselines:
        paths = {override} if override else {c.baseline for c in cells if c.baseline}
        loaded = cls({path: load_baseline(path) for path in paths if path}, override)
        gates = sum(statistical_gates(pending_result(cell), loaded.of(cell.baseline)) for cell in cells)
        return replace(loaded, levels=Levels.family(gates, max_boots=max_boots, retries=retries))

    def of(self, cell_baseline: str | None):
        return self.by_path.get(self.override or cell_baseline)

    def gate(self, cell: CellResult, metrics: Mapping) -> tuple[GateResult, ...]:
        return evaluate(cell, metrics, self.of(cell.baseline), self.levels)

    def shared(self):
        """The one baseline every cell uses, if there is exactly one (reports name its lines)."""
        return next(iter(self.by_path.values())) if len(self.by_path) == 1 else None


def run(options: RunOptions, launcher: Launcher, suite_defaults: Callable[[dict], dict] = lambda o: o,
        progress: Progress | None = None, check_cells: Callable[[list[Cell]], None] = lambda cells: None) -> ExitCode:
    """``check_cells`` raises BadInput for what the selected cells need and cannot have (dspark_ci.input_checks)."""
    progress = progress or Progress()
    cells = select_cells(load_cells(list(options.matrices)), options.cell_ids)
    check_cells(cells)
    baselines = Baselines.load(cells, options.baseline, options.sampling.max_boots, options.sampling.retries)
    run_dir = options.run_dir
    progress.stage(f"preflight: {len(cells)} cell(s), {options.launcher} launcher")
    with claimed_run_dir(run_dir, options.force, f"--out {run_dir}" if options.out else f"run directory {run_dir}"):
        decided = decide_rejections(cells, options.sglang_version, options.rejections)
        preflight(decided.to_launch, launcher, run_dir)
    ledger = Ledger(options.run_id, run_dir)
    ledger.register(os.environ)
    if decided.to_launch:
        prestart_suites(ledger)  # the suites' interpreter warms up while the first cell boots
    writer = ResultsWriter(run_dir, RunResults(run_id=options.run_id, started_at=now(), finished_at=None,
                                               launcher=options.launcher, matrices=options.matrices,
                                               run_options=options.rerun_options, environment=options.environment),
                           baseline=baselines.shared(), selected=tuple(pending_result(cell) for cell in cells),
                           quarantine=options.quarantine)
    ctx = CellContext(launcher=launcher, run_dir=run_dir, sglang_version=options.sglang_version,
                      suites=options.suites, gate=baselines.gate, stage=progress.stage, detail=progress.detail,
                      suite_defaults=suite_defaults, server=options.server, build=options.build,
                      forwarded_env=options.forwarded_env, sampling=options.sampling, ledger=ledger,
                      measuring=_prewarm_gates)
    try:
        try:
            _record_decided(cells, decided.results, writer, progress)
            _run_cells(decided.to_launch, len(cells), run_capacity(launcher, options.max_parallel), ctx, writer,
                       progress)
        finally:
            close_warm_workers()  # the suites' warm pytest: it is the run's, and recorded in its ledger
            with signals_deferred():  # a teardown: an interrupt now is acted on once it is done
                _release(ledger)
    except KeyboardInterrupt:  # at any moment, even after the last cell: the run is an interrupted one
        writer.interrupted()
    finally:
        progress.close()
        reported = writer.finish()  # last: once the final set is on disk, the run has finished (reads the flag)
    if writer.results.interrupted:  # what the files say is what the exit code says: 130 (dspark_ci/cli.py)
        progress.done(f"interrupted; what was measured is in {run_dir}/")
        raise KeyboardInterrupt("interrupted")
    interrupts.announce_late(progress.done)
    progress.done(f"results in {run_dir}/ (results.json, junit.xml, report.md, report.html, logs/)")
    rerun = rerun_command(writer.results)
    if rerun:
        progress.done(f"run the cells that did not pass again: {rerun}")
    code, reason = verdict(writer.results, len(cells), options.accept_inconclusive)
    for cell in writer.results.cells:  # a failure the quarantine let through, or one it no longer covers
        if cell.status.failing and (cell.quarantined or cell.quarantine_expired):
            held = ", quarantined: not gating" if cell.quarantined else ""
            progress.done(f"{cell.id}: {cell.status.text}{held} ({quarantine_line(cell)})")
    if reason:
        progress.done(reason)
    return code if reported else max(code, ExitCode.FELL_SHORT)


@functools.cache
def _prewarm_gates() -> None:
    """scipy.stats, which the cells' gates need, imported in a thread once the first cell's suites run: its second
    of imports then falls in the run's idle minutes, never between a cell's last test and its verdict, nor in the
    first boot, where the suites' warm worker needs the CPU."""
    def load() -> None:
        with contextlib.suppress(ImportError):  # missing: the gate that needs it says so, as before
            scipy_stats()

    threading.Thread(target=load, name="import scipy.stats", daemon=True).start()


def _release(ledger: Ledger) -> None:
    """Everything the run started is torn down by now: make sure, and drop the run from the index when so."""
    removal = release(ledger, os.environ)
    for what in removal.removed:
        print(f"dspark-ci: warning: teardown had left {what}; removed now", file=sys.stderr)
    for problem in removal.problems:
        print(f"dspark-ci: warning: {problem} (`dspark-ci cleanup --run {ledger.run_id}` tries again)",
              file=sys.stderr)


def _record_decided(cells: list[Cell], decided: Mapping[str, CellResult], writer: ResultsWriter,
                    progress: Progress) -> None:
    """The expected rejections SGLang's resolver decided (nothing launched for them), recorded first."""
    for cell in cells:
        if cell.id in decided:
            result = writer.add(decided[cell.id])
            progress.result(_summary_line(len(writer.results.cells), len(cells), result, 0.0)
                            + " (decided by SGLang's resolver, not launched)",
                            passed=result.exit_code == ExitCode.OK, cell_id=cell.id)


def _run_cells(cells: list[Cell], total: int, capacity: Capacity, ctx: CellContext, writer: ResultsWriter,
               progress: Progress) -> None:
    """Launch and measure ``cells``, up to ``capacity`` side by side (longest first), each result recorded as it
    comes; on Ctrl-C / SIGTERM every cell in flight is torn down and where each got to is recorded."""
    order = cells if capacity.max_parallel <= 1 else longest_first(cells, cell_seconds(history_path(), ids(cells)))
    if capacity.max_parallel > 1:
        progress.done(f"up to {capacity.max_parallel} cells side by side ({capacity.why}), longest first")
    progress.start(len(cells), capacity.max_parallel)
    started = itertools.count(1)

    def on_result(cell: Cell, result: CellResult) -> None:
        result = writer.add(result)
        took = progress.cell_done(cell.id)
        progress.result(_summary_line(len(writer.results.cells), total, result, took),
                        passed=result.exit_code == ExitCode.OK, cell_id=cell.id)

    try:
        Scheduler(order, lambda cell: run_cell(cell, _reporting_as(ctx, cell, progress)), capacity,
                  on_start=lambda cell: progress.cell(next(started), cell.id), on_result=on_result,
                  need=lambda cell: need_of(cell, launches_reference(cell, suite_names(cell, ctx.suites)))).run()
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
            raise cannot_write(run_dir, err) from None
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
    worst = worst_exit(cell.run_exit_code for cell in cells if cell.run_exit_code != ExitCode.INCONCLUSIVE)
    if worst != ExitCode.OK:
        failing = sum(cell.status.failing for cell in cells)
        return worst, f"{failing} of {len(cells)} cells did not pass"
    if cells and all(cell.status is Status.SKIPPED for cell in cells):
        return ExitCode.FELL_SHORT, ("nothing was measured: every cell was skipped (their expectations were written "
                                     "for another SGLang release than --sglang-version)")
    if not cells:
        return ExitCode.FELL_SHORT, "nothing was measured: no cell was selected"
    undecided = sum(cell.run_exit_code == ExitCode.INCONCLUSIVE for cell in cells)  # not a quarantined one
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
    return replace(result, warnings=tuple(written.warnings), gpqa=gpqa_note(written.records),
                   mc=mc_note(written.records))


def not_run_result(cell: Cell, why: str) -> CellResult:
    return pending_result(cell).finished(Status.ERROR, why)


def _summary_line(index: int, total: int, result: CellResult, took: float) -> str:
    line = f"[{index}/{total}] {result.id}: {result.status.value.upper()} in {duration(took)}"
    if result.boot_seconds is not None:
        line += f" (boot {result.boot_seconds:.1f}s)"
    if result.error:
        line += "\n    " + result.error.replace("\n", "\n    ")
    return line
