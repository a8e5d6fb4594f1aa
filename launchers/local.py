"""The local launcher: every rank of a cell as its own process group on this machine.

Rank r gets its own session (so its whole tree can be signalled at once), its own log file,
and is watched from launch to teardown. Teardown — on success, failure, Ctrl-C or SIGTERM —
sends SIGTERM to every group, waits a grace period, then SIGKILLs what is left. No orphans.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping

import psutil

from dspark_ci.errors import InfraError
from launchers.base import LOG_LINES_KEPT, LOG_LINES_SEARCHED, rank_exited
from launchers.logs import rank_log_path, tail
from launchers.plan_types import LaunchPlan, Placement, RankCommand
from launchers.resolve import redact, resolve_env, secret_values, server_argv
from launchers.wait import Deadline, HttpOk, wait_until_ready


@dataclass(frozen=True)
class LocalSettings:
    server: str = "sim"  # "sim" (the embedded simulated server) or "sglang" (python3 -m sglang.launch_server)
    boot_timeout_s: float = 600.0
    poll_s: float = 0.5
    stop_grace_s: float = 10.0
    python: str = sys.executable
    caller_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


@dataclass
class _Rank:
    command: RankCommand
    process: subprocess.Popen
    log_path: Path
    exited_at: float | None = None  # set by a watcher thread the moment the process exits

    def watch(self) -> None:
        def wait() -> None:
            self.process.wait()
            self.exited_at = time.monotonic()

        threading.Thread(target=wait, name=f"watch-rank-{self.command.node_rank}", daemon=True).start()


class LocalDeployment:
    def __init__(self, cell_id: str, base_url: str, ranks: list[_Rank]):
        self.cell_id, self.base_url, self._ranks = cell_id, base_url, ranks
        self.boot_seconds = 0.0

    def check(self) -> None:
        """Raise LaunchFailed naming the rank that exited first (the others often die of losing it)."""
        exited = sorted((r for r in self._ranks if r.exited_at is not None), key=lambda r: r.exited_at)
        if exited:
            rank = exited[0]
            others = [f"node rank {r.command.node_rank} exited too" for r in exited[1:]]
            raise rank_exited(self.cell_id, rank.command.node_rank, rank.process.returncode,
                              tail(rank.log_path, LOG_LINES_SEARCHED), [*others, f"full log: {rank.log_path}"])

    def rank0_log_tail(self) -> list[str]:
        return tail(self._ranks[0].log_path, LOG_LINES_KEPT) if self._ranks else []


class LocalLauncher:
    name = "local"

    def __init__(self, settings: LocalSettings = LocalSettings()):
        self.settings = settings

    def preflight(self, plans: list[LaunchPlan]) -> None:
        """Real SGLang must be importable by the `python3` the plans name, before anything starts."""
        if self.settings.server != "sglang" or not plans:
            return
        python = plans[0].ranks[0].argv[0]
        probe = [python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('sglang') is None)"]
        try:
            found = subprocess.run(probe, capture_output=True, timeout=60, env=dict(self.settings.caller_env))
        except (OSError, subprocess.TimeoutExpired) as err:
            raise InfraError(f"cannot run {python} to look for SGLang ({err})") from None
        if found.returncode != 0:
            raise InfraError(f"SGLang is not installed for {python} on this machine: `pip install sglang==0.5.23`, "
                             "or run the simulated server (--server sim) or containers (--launcher docker)")

    def placement(self, nnodes: int) -> Placement:
        """Node rank r on 127.0.0.(r+1), all on one free port, like separate machines."""
        return Placement.loopback(nnodes, port=free_port(), dist_port=free_port())

    @contextlib.contextmanager
    def launch(self, plan: LaunchPlan, logs_dir: Path) -> Iterator[LocalDeployment]:
        logs_dir.mkdir(parents=True, exist_ok=True)
        ranks: list[_Rank] = []
        try:
            for command in plan.ranks:
                ranks.append(self._start(command, logs_dir))
            deployment = LocalDeployment(plan.cell_id, plan.base_url, ranks)
            deployment.boot_seconds = wait_until_ready(
                HttpOk(plan.health_url),
                Deadline(self.settings.boot_timeout_s, self.settings.poll_s),
                deployment.check, cell_id=plan.cell_id, last_lines=deployment.rank0_log_tail,
            )
            yield deployment
        finally:
            stop_all([rank.process for rank in ranks], self.settings.stop_grace_s)

    def _start(self, command: RankCommand, logs_dir: Path) -> _Rank:
        argv = server_argv(command, self.settings.server, self.settings.python)
        env = {**self.settings.caller_env, **resolve_env(command.env, self.settings.caller_env)}
        secrets = secret_values(command.env, self.settings.caller_env)
        log_path = rank_log_path(logs_dir, command.node_rank)
        with open(log_path, "w") as log:
            log.write(redact(f"# node rank {command.node_rank}: {' '.join(argv)}\n", secrets))
            log.flush()
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=env, start_new_session=True)
        rank = _Rank(command, process, log_path)
        rank.watch()
        return rank


def stop_all(processes: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM every process group, wait up to ``grace_s``, SIGKILL the rest (and strays that left the group)."""
    members = {p.pid: _descendants(p.pid) for p in processes}
    for process in processes:
        _signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
    for process in processes:
        _signal_group(process, signal.SIGKILL)
        for child in members[process.pid]:
            with contextlib.suppress(psutil.Error):
                child.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    # The group outlives its leader when children remain: signal it even after the leader exited.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it; a tiny race with other programs remains)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
