"""One launch's containers: started one by one (each recorded in the ledger first), watched together (the rank
that exited first is the culprit), removed together; each rank's log copied as it comes."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import docker.errors
import requests
from dspark_ci.ground.errors import InfraError
from dspark_ci.ground.ledger import Ledger
from dspark_ci.ground.processes import signals_deferred
from dspark_ci.launchers.contract import LOG_LINES_KEPT, LOG_LINES_SEARCHED, RankExit, culprit, group_failed
from dspark_ci.launchers.docker.cleanup import dispose
from dspark_ci.launchers.docker.client import copy_into, labelled, named_container
from dspark_ci.launchers.docker.hosts import DockerHost
from dspark_ci.launchers.docker.spec import LABEL_CELL
from dspark_ci.launchers.materialize import redact
from dspark_ci.launchers.plan_types import RankCommand

import docker

EXITED = ("exited", "dead")
SETTLE_S = 0.5  # after seeing one rank exit, let every engine catch up before naming the culprit
LOG_RECONNECT_S = 1.0  # pause before following a container's log again after its stream ended


class DockerDeployment:
    def __init__(self, cell_id: str, base_url: str, group: Group):
        self.cell_id, self.base_url, self._group = cell_id, base_url, group
        self.boot_seconds = 0.0

    def check(self) -> None:
        """Raise LaunchFailed naming the rank whose container exited first."""
        self._group.check(self.cell_id)


@dataclass(frozen=True)
class RankContainer:
    """Everything needed to start one node rank's container."""

    command: RankCommand
    host: DockerHost
    spec: dict  # containers.create arguments, without the environment
    env: dict[str, str]  # resolved: holds secret values
    secrets: list[str]  # to mask wherever text could be printed
    files: list[Path]  # copied into the container before it starts
    log_path: Path


@dataclass
class Rank:
    command: RankCommand
    host: DockerHost
    container: Any  # docker.models.containers.Container (the SDK is untyped)
    log: LogPump


class Group:
    """The containers of one launch: started one by one, watched together, removed together."""

    def __init__(self, labels: Mapping[str, str], engines: Mapping[str, docker.DockerClient], stop_timeout_s: int,
                 ledger: Ledger | None = None):
        self.labels, self.engines, self.stop_timeout_s, self.ledger = dict(labels), engines, stop_timeout_s, ledger
        self.ranks: list[Rank] = []
        self.attempted: list[tuple[str, str]] = []  # (engine, container name) of every create sent, even unanswered

    def start(self, rank: RankContainer) -> None:
        command, host, spec = rank.command, rank.host, rank.spec
        if self.ledger:  # before it exists: a hard kill after create still leaves a record naming it
            self.ledger.record("docker", self.labels[LABEL_CELL], command.node_rank, engine=host.url,
                               container=spec["name"])
        self.attempted.append((host.url, spec["name"]))
        try:
            # A Ctrl-C or SIGTERM landing while the engine creates the container is held until the container is
            # ours to remove (the engine finishes the create whatever we do; the caller must know the container).
            with signals_deferred():
                container = self.engines[host.url].containers.create(environment=rank.env, **spec)
                header = (f"# node rank {command.node_rank} on {host.url} ({host.address}), image {spec['image']}, "
                          f"container {spec['name']}\n# {' '.join(spec['command'])}\n")
                log = LogPump(container, rank.log_path, redact(header, rank.secrets), rank.secrets)
                self.ranks.append(Rank(command, host, container, log))  # from here on, teardown removes it
            copy_into(container, rank.files)
            container.start()
        except docker.errors.APIError as err:
            raise InfraError(f"Docker engine {host.url} could not start node rank {command.node_rank} "
                             f"({spec['name']}, image {spec['image']}): "
                             f"{redact(err.explanation or str(err), rank.secrets)}") from None
        log.start()

    def check(self, cell_id: str) -> None:
        if not self._exited():
            return
        time.sleep(SETTLE_S)  # another engine may not have registered its rank's exit yet
        exited = self._exited()
        exits = [RankExit(e.rank.command.node_rank, e.code, e.finished_at, e.rank.log.last_lines(LOG_LINES_SEARCHED))
                 for e in exited]
        blamed = next(e for e in exited if e.rank.command.node_rank == culprit(exits).node_rank)
        raise group_failed(cell_id, exits,
                           [f"container on {blamed.rank.host.url}", f"full log: {blamed.rank.log.path}"])

    def _exited(self) -> list[Exit]:
        states = [(rank, self._state(rank)) for rank in self.ranks]
        return [Exit(rank, state.get("ExitCode"), seconds(state.get("FinishedAt", "")))
                for rank, state in states if state.get("Status") in EXITED]

    def _state(self, rank: Rank) -> dict:
        try:
            rank.container.reload()
            return rank.container.attrs.get("State", {})
        except docker.errors.NotFound:
            return {"Status": "dead", "ExitCode": None, "Error": "container removed behind our back"}
        except (docker.errors.APIError, requests.RequestException) as err:
            raise InfraError(f"lost Docker engine {rank.host.url} while watching node rank "
                             f"{rank.command.node_rank}: {str(err).splitlines()[0][:160]}") from None

    def rank0_tail(self) -> list[str]:
        return self.ranks[0].log.last_lines(LOG_LINES_KEPT) if self.ranks else []

    def teardown(self) -> None:
        """Stop, keep the log of, and remove every container of this launch, on every engine, in parallel."""
        known = {rank.container.id: rank for rank in self.ranks}
        stragglers = {c.id: c for client in self.engines.values() for c in labelled(client, self.labels)
                      if c.id not in known}  # e.g. created just as Ctrl-C arrived
        named = {rank.container.name for rank in self.ranks}
        stragglers.update({c.id: c for url, name in self.attempted if name not in named
                           for c in named_container(self.engines[url], name) if c.id not in known})
        jobs = [lambda r=rank: dispose(r.container, self.stop_timeout_s, r.log) for rank in self.ranks]
        jobs += [lambda c=container: dispose(c, 0, None) for container in stragglers.values()]
        if jobs:
            with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
                for future in [pool.submit(job) for job in jobs]:
                    future.result()


@dataclass(frozen=True)
class Exit:
    rank: Rank
    code: int | None
    finished_at: float  # engine's clock, seconds


def seconds(rfc3339: str) -> float:
    """Docker's FinishedAt (nanoseconds, trailing zeros trimmed) as a number that sorts right."""
    match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?", rfc3339 or "")
    if not match:
        return float("inf")
    whole = datetime.fromisoformat(match.group(1)).replace(tzinfo=timezone.utc).timestamp()
    return whole + float(match.group(2) or 0)


# --- logs ------------------------------------------------------------------------------------------

class LogPump:
    """Copies one container's output into its rank log as it comes, secrets redacted.

    A follow stream may never end after the container exits, so the pump is a daemon thread whose stream
    teardown closes; ``finish`` then rewrites the file from the engine's complete, non-streamed log. A stream
    may also end while the container still runs (an idle HTTP connection dropped by the client or a proxy):
    the pump then reconnects from the last line's timestamp, so the rank log stays live.
    """

    def __init__(self, container, path: Path, header: str, secrets: list[str]):
        self.container, self.path, self.header, self.secrets = container, path, header, secrets
        self._stream: Any = None
        self._lock = threading.Lock()
        self._finished = False
        path.write_text(header)
        self._thread = threading.Thread(target=self._pump, name=f"log-{path.parent.name}-{path.stem}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _pump(self) -> None:
        since: float | None = None
        while not self._finished:
            pending = b""
            with contextlib.suppress(Exception):  # the stream ends by closing, with the engine, or idle
                self._stream = self.container.logs(stream=True, follow=True, stdout=True, stderr=True,
                                                   timestamps=True, since=since)
                for chunk in self._stream:
                    pending += chunk
                    complete, _, pending = pending.rpartition(b"\n")
                    if complete:
                        since = self._append(complete + b"\n") or since
            if pending:
                since = self._append(pending) or since
            if self._finished or not self._running():
                return
            time.sleep(LOG_RECONNECT_S)

    def _running(self) -> bool:
        try:
            self.container.reload()
            return self.container.status == "running"
        except (docker.errors.APIError, requests.RequestException):
            return False

    def _append(self, data: bytes) -> float | None:
        """Write timestamped lines without their stamps; return the last line's time (to reconnect after it)."""
        lines, last = [], None
        for line in data.decode("utf-8", "replace").splitlines(keepends=True):
            stamp, _, text = line.partition(" ")
            when = seconds(stamp)
            if when != float("inf"):
                last, line = when, text
            lines.append(line)
        with self._lock:
            if not self._finished:
                with open(self.path, "a") as handle:
                    handle.write(redact("".join(lines), self.secrets))
        return None if last is None else last + 1e-6

    def last_lines(self, count: int) -> list[str]:
        """The container's last lines, straight from the engine (the pump may lag behind)."""
        try:
            text = self.container.logs(stdout=True, stderr=True, tail=count).decode("utf-8", "replace")
        except (docker.errors.APIError, requests.RequestException):
            text = self.path.read_text(errors="replace")
        return redact(text, self.secrets).splitlines()[-count:]

    def finish(self) -> None:
        with contextlib.suppress(Exception):
            if self._stream is not None:
                self._stream.close()
        if self._thread.ident is not None:  # not started when the interrupt came before the container started
            self._thread.join(timeout=2)
        with contextlib.suppress(docker.errors.APIError, requests.RequestException):
            full = self.container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
            with self._lock:
                self._finished = True
                self.path.write_text(self.header + redact(full, self.secrets))
