"""The ledger: what a run started, written before it is started, so it can always be found and removed.

Each launcher appends one JSON line per process, container or job to ``<run_dir>/launched.jsonl``
(flushed and fsynced before the start call), and the run registers itself in a small index
(``$DSPARK_STATE_DIR``, default ``~/.local/state/dspark-ci/runs/<run-id>.json``: run directory, owning
process and its start time). ``dspark-ci cleanup --run ID`` reads the ledger and removes exactly those;
``dspark-ci cleanup`` does so for every indexed run whose owning process is gone. Nothing else is touched.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import psutil

from ground.state import state_dir

LEDGER_NAME = "launched.jsonl"


@dataclass(frozen=True)
class Ledger:
    run_id: str
    run_dir: Path

    @property
    def path(self) -> Path:
        return self.run_dir / LEDGER_NAME

    def register(self, env: Mapping[str, str]) -> None:
        """Index this run (run dir, this process and its start time) so `cleanup` finds it by id."""
        me = psutil.Process()
        entry = {"run_id": self.run_id, "run_dir": str(self.run_dir.resolve()), "pid": me.pid,
                 "pid_started": me.create_time(), "registered_at": time.time()}
        index = state_dir(env) / "runs"
        index.mkdir(parents=True, exist_ok=True)
        (index / f"{self.run_id}.json").write_text(json.dumps(entry) + "\n")

    def record(self, launcher: str, cell_id: str, node_rank: int | None, **what: Any) -> None:
        """One thing about to be started; on disk (fsync) before the caller starts it."""
        line = {"run_id": self.run_id, "launcher": launcher, "cell": cell_id, "rank": node_rank, **what}
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def entries(self) -> list[dict]:
        """Every line recorded (a line cut short by a hard kill is skipped: nothing was started for it)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        entries = []
        for line in text.splitlines():
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return entries


@dataclass(frozen=True)
class IndexedRun:
    run_id: str
    run_dir: Path
    pid: int
    pid_started: float

    @property
    def owner_alive(self) -> bool:
        """The process that ran it still exists (same pid and start time: a reused pid is not it)."""
        try:
            owner = psutil.Process(self.pid)
            return abs(owner.create_time() - self.pid_started) < 1.0 and owner.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False  # gone (a killed run not yet reaped by its parent counts as gone too)

    @property
    def ledger(self) -> Ledger:
        return Ledger(self.run_id, self.run_dir)


def indexed_runs(env: Mapping[str, str]) -> Iterator[IndexedRun]:
    for path in sorted((state_dir(env) / "runs").glob("*.json")):
        try:
            data = json.loads(path.read_text())
            yield IndexedRun(data["run_id"], Path(data["run_dir"]), int(data["pid"]), float(data["pid_started"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue


def find_run(run_id: str, env: Mapping[str, str]) -> IndexedRun | None:
    return next((run for run in indexed_runs(env) if run.run_id == run_id), None)


def forget(run: IndexedRun, env: Mapping[str, str]) -> None:
    (state_dir(env) / "runs" / f"{run.run_id}.json").unlink(missing_ok=True)
