"""``dspark-ci run``: a short sequence of steps passing plain values.

    options → cells → baselines → run dir → for each cell: run_cell → results.json → reports → exit code

Inputs are all validated before anything is launched; results.json is rewritten after every cell,
so a crash or Ctrl-C keeps what was measured; reports are written even when the run is interrupted.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from dspark_ci.cell_run import CellContext, new_record, run_cell
from dspark_ci.errors import BadInput, ExitCode, InfraError
from dspark_ci.preflight import preflight
from dspark_ci.progress import Progress
from dspark_ci.sglang.flags import DEFAULT_VERSION
from matrices import load_cells
from matrices.cell import Cell
from reports.baseline import load_baseline
from reports.gates import evaluate
from reports.results import write_results
from reports import write_reports, step_summary
from reports.markdown import rerun_command


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

    by_path: dict
    override: str | None

    @classmethod
    def load(cls, cells: list[Cell], override: str | None) -> "Baselines":
        paths = {override} if override else {c.baseline for c in cells if c.baseline}
        return cls({path: load_baseline(path) for path in paths if path}, override)

    def for_cell(self, cell: dict):
        return self.by_path.get(self.override or cell.get("baseline"))

    def gate(self, cell: dict, metrics: dict) -> list:
        return evaluate(cell, metrics, self.for_cell(cell))

    def shared(self):
        """The one baseline every cell uses, if there is exactly one (reports name its lines)."""
        return next(iter(self.by_path.values())) if len(self.by_path) == 1 else None


def run(options: RunOptions, launcher: Any, suite_defaults: Callable[[dict], dict] = lambda o: o,
        progress: Progress | None = None) -> ExitCode:
    progress = progress or Progress()
    cells = select_cells(load_cells(list(options.matrices)), options.cell_ids)
    baselines = Baselines.load(cells, options.baseline)
    run_dir = options.out or Path("runs") / options.run_id
    progress.stage(f"preflight: {len(cells)} cell(s), {options.launcher} launcher")
    preflight(cells, launcher, run_dir)
    results = {"schema": 1, "run_id": options.run_id, "started_at": _now(), "finished_at": None,
               "launcher": options.launcher, "matrices": list(options.matrices), "cells": []}
    _save(run_dir, results)
    ctx = CellContext(launcher=launcher, run_dir=run_dir, sglang_version=options.sglang_version,
                      suites=options.suites, gate=baselines.gate, stage=progress.stage, suite_defaults=suite_defaults)
    codes = []
    try:
        for index, cell in enumerate(cells, 1):
            progress.stage(f"[{index}/{len(cells)}] {cell.id}")
            try:
                outcome = run_cell(cell, ctx)
            except KeyboardInterrupt:  # Ctrl-C / SIGTERM: record it, keep what was measured, let it through
                results["cells"].append(interrupted_record(cell))
                results["interrupted"] = True
                raise
            results["cells"].append(outcome.record)
            codes.append(outcome.exit_code)
            _save(run_dir, results)
            progress.done(_summary_line(index, len(cells), outcome.record))
    finally:
        results["finished_at"] = _now()
        _save(run_dir, results)
        write_reports(run_dir, results, baseline=baselines.shared())
        _append_step_summary(results)
        progress.close()
        progress.done(f"results in {run_dir}/ (results.json, junit.xml, report.md, report.html, logs/)")
        rerun = rerun_command(results)
        if rerun:
            progress.done(f"run the cells that did not pass again: {rerun}")
    return max(codes, default=ExitCode.OK)


def interrupted_record(cell: Cell) -> dict:
    return {**new_record(cell), "error": "interrupted (Ctrl-C or SIGTERM) before the cell finished; "
            "everything it started was torn down"}


def _summary_line(index: int, total: int, record: dict) -> str:
    line = f"[{index}/{total}] {record['id']}: {record['status'].upper()}"
    if record.get("boot_seconds") is not None:
        line += f" (boot {record['boot_seconds']:.1f}s)"
    if record.get("error"):
        line += "\n    " + record["error"].replace("\n", "\n    ")
    return line


def _save(run_dir: Path, results: dict) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_results(run_dir / "results.json", results)
    except OSError as err:
        raise InfraError(f"cannot write {run_dir}/results.json: {err.strerror} (check free disk space and "
                         f"permissions, or pass --out DIR)") from None


def _append_step_summary(results: dict) -> None:
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if path:
        with open(path, "a") as handle:
            handle.write(step_summary(results) + "\n")


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
