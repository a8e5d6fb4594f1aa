"""Every run remembered: an embedded SQLite database of runs, cells, metrics and gates.

Where: ``$DSPARK_HISTORY`` if set, else ``$DSPARK_STATE_DIR/history.sqlite`` (default
``~/.local/state/dspark-ci/history.sqlite``), next to the runs' ledger index. Each cell's timing (``cell_times``) feeds
``cell_seconds``, which ``dspark-ci run`` uses to start the longest cells first. ``dspark-ci run`` records
each run when it finishes; ``dspark-ci history --add RUN_DIR`` records runs made elsewhere (a nightly's
downloaded artifacts). Format (``SCHEMA`` below, one row per run, per cell of a run, per metric of a
cell, per gate of a cell): plain tables any SQLite client reads; re-recording a run replaces its rows.

Reads: ``runs`` (newest first), ``series`` (one metric of one cell across runs, oldest first, for trend
plots and ``dspark-ci history --cell``), ``regression`` (for a gate that fails now: the last run in which
it passed and the first in which it failed), ``run_dir_of`` (``report --compare RUN_ID``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from dspark_ci.ground.errors import BadInput
from dspark_ci.ground.records import RunResults
from dspark_ci.ground.state import state_dir

HISTORY_ENV = "DSPARK_HISTORY"
SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, started_at TEXT, finished_at TEXT, launcher TEXT, matrices TEXT,
    server TEXT, sglang_version TEXT, sglang_commit TEXT, image_digests TEXT, hosts TEXT,
    environment TEXT, run_dir TEXT, cells INTEGER, failed INTEGER);
CREATE TABLE IF NOT EXISTS cells (
    run_id TEXT, cell_id TEXT, status TEXT, runner TEXT, config TEXT, PRIMARY KEY (run_id, cell_id));
CREATE TABLE IF NOT EXISTS cell_facts (
    run_id TEXT, cell_id TEXT, identity TEXT, setup TEXT, build TEXT, error TEXT, sglang_error TEXT,
    infrastructure INTEGER, PRIMARY KEY (run_id, cell_id));
CREATE TABLE IF NOT EXISTS metrics (
    run_id TEXT, cell_id TEXT, metric TEXT, value REAL, PRIMARY KEY (run_id, cell_id, metric));
CREATE TABLE IF NOT EXISTS gates (
    run_id TEXT, cell_id TEXT, metric TEXT, op TEXT, threshold REAL, value REAL, passed INTEGER);
CREATE TABLE IF NOT EXISTS cell_times (
    run_id TEXT, cell_id TEXT, started_at TEXT, ready_at TEXT, finished_at TEXT, queue_seconds REAL,
    boot_seconds REAL, measure_seconds REAL, seconds REAL, PRIMARY KEY (run_id, cell_id));
CREATE TABLE IF NOT EXISTS cell_labels (run_id TEXT, cell_id TEXT, label TEXT, PRIMARY KEY (run_id, cell_id, label));
CREATE INDEX IF NOT EXISTS metrics_by_cell ON metrics (cell_id, metric);
CREATE INDEX IF NOT EXISTS gates_by_cell ON gates (cell_id, metric);
"""


def history_path(env: Mapping[str, str] = os.environ) -> Path:
    return Path(env.get(HISTORY_ENV) or state_dir(env) / "history.sqlite")


@contextlib.contextmanager
def _connect(path: Path, create: bool) -> Iterator[sqlite3.Connection]:
    if not create and not path.is_file():
        raise BadInput(str(path), "no run history here yet",
                       "runs are recorded when `dspark-ci run` finishes; "
                       "add others with `dspark-ci history --add RUN_DIR`")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(path, timeout=30)  # concurrent runs take turns
    except (OSError, sqlite3.Error) as err:
        raise BadInput(str(path), f"cannot open the run history ({err})",
                       f"check the path, or set {HISTORY_ENV}") from None
    try:
        connection.row_factory = sqlite3.Row
        connection.executescript(SCHEMA)
        with connection:
            yield connection
    except sqlite3.DatabaseError as err:
        raise BadInput(str(path), f"not a dspark-ci run history ({err})",
                       f"move it away, or set {HISTORY_ENV}") from None
    finally:
        connection.close()


def record(path: Path, results: RunResults, run_dir: Path | str | None) -> None:
    """Remember ``results`` (replacing an earlier record of the same run id)."""
    env = results.environment
    with _connect(path, create=True) as db:
        for table in ("runs", "cells", "cell_facts", "metrics", "gates", "cell_times", "cell_labels"):
            db.execute(f"DELETE FROM {table} WHERE run_id = ?", (results.run_id,))
        db.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", (
            results.run_id, results.started_at, results.finished_at, results.launcher,
            json.dumps(list(results.matrices)),
            env.get("server"), env.get("sglang_version"), env.get("sglang_commit"),
            json.dumps(env.get("image_digests")) if env.get("image_digests") else None,
            json.dumps(env.get("hosts") or ([env["hostname"]] if env.get("hostname") else [])),
            json.dumps(dict(env), default=str), str(Path(run_dir).resolve()) if run_dir else None,
            len(results.cells), sum(cell.status.failing for cell in results.cells)))
        for cell in results.cells:
            config = json.dumps(cell.config.to_dict() if cell.config else {}, default=str)
            db.execute("INSERT INTO cells VALUES (?, ?, ?, ?, ?)",
                       (results.run_id, cell.id, cell.status.value, cell.runner, config))
            identity = cell.identity
            db.execute("INSERT INTO cell_facts VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (
                results.run_id, cell.id, identity.hash if identity else None, identity.setup if identity else None,
                identity.build if identity else None, cell.error, cell.sglang_error, int(cell.infrastructure)))
            db.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?)",
                           [(results.run_id, cell.id, name, value) for name, value in cell.metrics.items()
                            if value is not None])
            db.executemany("INSERT INTO gates VALUES (?, ?, ?, ?, ?, ?, ?)",
                           [(results.run_id, cell.id, g.metric, g.op, g.threshold, g.value, int(g.passed))
                            for g in cell.gates])
            db.executemany("INSERT INTO cell_labels VALUES (?, ?, ?)",
                           [(results.run_id, cell.id, label) for label in cell.labels])  # e.g. flaky: passed on retry
            if cell.timing is not None:
                t = cell.timing
                db.execute("INSERT INTO cell_times VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", (
                    results.run_id, cell.id, t.started_at, t.ready_at, t.finished_at, t.queue_seconds,
                    cell.boot_seconds, t.measure_seconds, t.seconds))


@dataclass(frozen=True)
class RunRow:
    run_id: str
    started_at: str | None
    server: str | None
    sglang_version: str | None
    matrices: tuple[str, ...]
    cells: int
    failed: int
    run_dir: str | None
    flaky: tuple[str, ...] = ()  # cells labelled flaky (failed, then passed on a retry)


def runs(path: Path, limit: int | None = None) -> list[RunRow]:
    """Recorded runs, newest first."""
    with _connect(path, create=False) as db:
        rows = db.execute("SELECT * FROM runs ORDER BY started_at DESC, run_id DESC LIMIT ?", (limit or -1,)).fetchall()
        flaky: dict[str, list[str]] = {}
        for label in db.execute("SELECT run_id, cell_id FROM cell_labels WHERE label = 'flaky' ORDER BY cell_id"):
            flaky.setdefault(label["run_id"], []).append(label["cell_id"])
    return [RunRow(r["run_id"], r["started_at"], r["server"], r["sglang_version"],
                   tuple(json.loads(r["matrices"] or "[]")),
                   r["cells"], r["failed"], r["run_dir"], tuple(flaky.get(r["run_id"], ()))) for r in rows]


@dataclass(frozen=True)
class Point:
    run_id: str
    started_at: str | None
    value: float
    setup: str | None = None  # the cell's identity setup in that run (None: recorded before identities)
    build: str | None = None


def series(path: Path, cell_id: str, metric: str, until: str | None = None) -> list[Point]:
    """One metric of one cell across recorded runs, oldest first (up to the run started at ``until``)."""
    with _connect(path, create=True) as db:
        rows = db.execute(
            "SELECT m.run_id, r.started_at, m.value, f.setup, f.build FROM metrics m JOIN runs r USING (run_id) "
            "LEFT JOIN cell_facts f ON f.run_id = m.run_id AND f.cell_id = m.cell_id "
            "WHERE m.cell_id = ? AND m.metric = ? AND (? IS NULL OR r.started_at <= ?) "
            "ORDER BY r.started_at, m.run_id", (cell_id, metric, until, until)).fetchall()
    return [Point(r["run_id"], r["started_at"], r["value"], r["setup"], r["build"]) for r in rows]


def same_setup_tail(points: list[Point]) -> tuple[list[Point], Point | None]:
    """The latest points measured like the newest one (runs recorded before identities count as alike), and the
    last point of another setup, where the comparable series starts (None when nothing was cut)."""
    latest = next((p.setup for p in reversed(points) if p.setup), None)
    for index in range(len(points) - 1, -1, -1):
        if points[index].setup and points[index].setup != latest:
            return points[index + 1:], points[index]
    return points, None


def cell_seconds(path: Path, cell_ids: Iterable[str]) -> dict[str, float]:
    """Each cell's wall time in the latest recorded run that timed it (for longest-first scheduling); cells
    never timed are left out. An absent or unreadable history knows none."""
    wanted = list(dict.fromkeys(cell_ids))
    if not wanted or not path.is_file():
        return {}
    try:
        with _connect(path, create=False) as db:
            rows = db.execute(
                "SELECT t.cell_id, t.seconds FROM cell_times t JOIN runs r USING (run_id) WHERE t.seconds IS NOT NULL "
                "ORDER BY r.started_at, t.run_id").fetchall()
    except BadInput:
        return {}
    known = {r["cell_id"]: float(r["seconds"]) for r in rows}  # the latest run's figure stands
    return {cell: known[cell] for cell in wanted if cell in known}


def cells_of(path: Path, pattern: str) -> list[str]:
    """Recorded cell ids matching a glob, sorted."""
    with _connect(path, create=False) as db:
        rows = db.execute("SELECT DISTINCT cell_id FROM cells WHERE cell_id GLOB ? ORDER BY cell_id", (pattern,))
        return [r["cell_id"] for r in rows]


def regression(path: Path, cell_id: str, metric: str, until: str | None = None) -> tuple[str | None, str | None]:
    """(last run whose gates on ``metric`` all passed, first run of the failing streak that follows it), for the
    cell's runs up to ``until``; (None, None) when the latest run's gates on it passed (or there are none)."""
    with _connect(path, create=True) as db:
        rows = db.execute(
            "SELECT g.run_id, MIN(g.passed) AS passed FROM gates g JOIN runs r USING (run_id) "
            "WHERE g.cell_id = ? AND g.metric = ? AND (? IS NULL OR r.started_at <= ?) "
            "GROUP BY g.run_id ORDER BY MAX(r.started_at) DESC, g.run_id DESC",
            (cell_id, metric, until, until)).fetchall()
    if not rows or rows[0]["passed"]:
        return None, None
    first_bad = rows[0]["run_id"]
    for row in rows[1:]:
        if row["passed"]:
            return row["run_id"], first_bad
        first_bad = row["run_id"]
    return None, first_bad


def run_dir_of(path: Path, run_id: str) -> str | None:
    if not path.is_file():
        return None
    with _connect(path, create=False) as db:
        row = db.execute("SELECT run_dir FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return row["run_dir"] if row else None


@dataclass(frozen=True)
class Outcome:
    """One recorded run of one cell, as triage reads it."""

    run_id: str
    started_at: str | None
    status: str
    identity: str | None  # the full identity hash (setup and build); None: recorded before identities
    setup: str | None
    build: str | None
    error: str | None
    infrastructure: bool
    labels: tuple[str, ...]
    hosts: tuple[str, ...]  # where the run ran (results.json environment: hosts, hostname)


def outcomes(path: Path, cell_id: str, until: str | None = None) -> list[Outcome]:
    """Every recorded run of one cell, oldest first (up to the run started at ``until``)."""
    with _connect(path, create=False) as db:
        rows = db.execute(
            "SELECT c.run_id, r.started_at, c.status, f.identity, f.setup, f.build, f.error, f.infrastructure, "
            "r.hosts, (SELECT group_concat(l.label) FROM cell_labels l WHERE l.run_id = c.run_id "
            "AND l.cell_id = c.cell_id) AS labels FROM cells c JOIN runs r USING (run_id) "
            "LEFT JOIN cell_facts f ON f.run_id = c.run_id AND f.cell_id = c.cell_id "
            "WHERE c.cell_id = ? AND (? IS NULL OR r.started_at <= ?) ORDER BY r.started_at, c.run_id",
            (cell_id, until, until)).fetchall()
    return [Outcome(r["run_id"], r["started_at"], r["status"], r["identity"], r["setup"], r["build"], r["error"],
                    bool(r["infrastructure"]), tuple((r["labels"] or "").split(",")) if r["labels"] else (),
                    tuple(json.loads(r["hosts"] or "[]"))) for r in rows]
