"""The ledger: what a run started, written before it is started, so it can always be found and removed.

Each launcher appends one JSON line per process, container or job to ``<run_dir>/launched.jsonl``
(flushed and fsynced before the start call), and the run registers itself in a small index
(``$DSPARK_STATE_DIR``, default ``~/.local/state/dspark-ci/runs/<run-id>.json``: run directory, owning
process and its start time). ``dspark-ci cleanup --run ID`` reads the ledger and removes exactly those;
``dspark-ci cleanup`` does so for every indexed run whose owning process is gone. Nothing else is touched.

A line is a ``LedgerEntry``: JSON on disk, read into the record once, where the file is read (``Ledger.entries``),
so every launcher's ``remove_started`` gets typed facts. Lines written by earlier versions still read: a fact
they lack is None, a key no longer known is ignored.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, get_args, get_type_hints

import psutil
from dspark_ci.ground.state import state_dir

LEDGER_NAME = "launched.jsonl"


@dataclass(frozen=True)
class LedgerEntry:
    """One thing a run started, and what finds it again. Which facts are set depends on the launcher (the row of
    ``dspark_ci.launchers.catalog`` named by ``launcher``) that wrote it; the others are None."""

    run_id: str
    launcher: str
    cell: str
    rank: int | None = None  # the node rank; None: not a rank (a job, an object, the suites, the router)
    # a process group (local; the suites' pytest and the PD router are local too)
    pid: int | None = None
    pgid: int | None = None  # lines written before it was recorded: the pid's group
    pid_started: float | None = None  # the pid's start time: a reused pid is not ours
    log: str | None = None
    what: str | None = None  # not a rank: "suites", "suites worker", "router"
    # a container (docker)
    engine: str | None = None  # the engine's URL
    container: str | None = None  # its name
    # a job (slurm); recorded before sbatch without its id, then again with it
    job_id: str | None = None
    job_name: str | None = None
    comment: str | None = None
    cluster_conf: str | None = None  # SLURM_CONF of the cluster it went to
    script: str | None = None
    # an object (k8s)
    kind: str | None = None  # "LeaderWorkerSet", "Service", "Secret"
    name: str | None = None
    namespace: str | None = None
    kubeconfig: str | None = None
    server: str | None = None  # the API server, for messages

    def to_json(self) -> str:
        """One line: who, where, and the facts that are set."""
        line = {key: value for key, value in asdict(self).items() if value is not None or key in _ALWAYS}
        return json.dumps(line, sort_keys=True)

    @classmethod
    def from_json(cls, data: Any, run_id: str) -> LedgerEntry | None:
        """The entry a decoded line says (None: not an entry). A value of the wrong type is dropped, as if not
        written; a line without a run id is ``run_id``'s (the ledger's own: it lies in that run's directory)."""
        if not isinstance(data, dict):
            return None
        values = {name: _AS[kind](data.get(name)) for name, kind in _TYPES.items()}
        return cls(**{**values, "run_id": values["run_id"] or run_id, "launcher": values["launcher"] or "",
                      "cell": values["cell"] or ""})


_ALWAYS = ("run_id", "launcher", "cell", "rank")
# A decoded JSON value as each field's type (None: it is not one; true/false is no number). Job ids are text,
# as sbatch prints them, whichever way a line wrote them.
_AS: dict[type, Callable[[Any], Any]] = {
    int: lambda v: v if isinstance(v, int) and not isinstance(v, bool) else None,
    float: lambda v: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None,
    str: lambda v: str(v) if isinstance(v, (str, int)) and not isinstance(v, bool) else None,
}
_TYPES = {name: next(t for t in _AS if t == hint or t in get_args(hint))
          for name, hint in get_type_hints(LedgerEntry).items()}


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
        line = LedgerEntry(self.run_id, launcher, cell_id, node_rank, **what).to_json()  # an undeclared fact: TypeError
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def entries(self) -> list[LedgerEntry]:
        """Every line recorded (a line cut short by a hard kill is skipped: nothing was started for it)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        entries = []
        for line in text.splitlines():
            try:
                entry = LedgerEntry.from_json(json.loads(line), self.run_id)
            except json.JSONDecodeError:
                continue
            if entry is not None:
                entries.append(entry)
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
