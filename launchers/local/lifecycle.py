"""The local launcher: every rank of a cell as its own process group on this machine.

Rank r gets its own session (so its whole tree can be signalled at once), its own log file,
and is watched from launch to teardown. Teardown — on success, failure, Ctrl-C or SIGTERM —
sends SIGTERM to every group, waits a grace period, then SIGKILLs what is left. No orphans.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
from dspark_ci.ground.errors import InfraError
from dspark_ci.ground.ledger import Ledger, LedgerEntry
from dspark_ci.ground.processes import (
    descendants,
    die_with_parent,
    free_port,
    group_members,
    kill_group,
    run_env,
    signal_group,
    signals_deferred,
    started_at,
    stop_all,
)
from dspark_ci.ground.sglang.release import DEFAULT_VERSION, sglang_error_line
from dspark_ci.launchers.contract import (
    LOG_LINES_KEPT,
    LOG_LINES_SEARCHED,
    Capacity,
    LaunchContext,
    LaunchFailed,
    RankExit,
    culprit,
    group_failed,
)
from dspark_ci.launchers.local.options import LocalOptions
from dspark_ci.launchers.local.tuning import LocalTuning
from dspark_ci.launchers.logs import rank_log_path, tail
from dspark_ci.launchers.materialize import (
    SGLANG_VENV_SERVERS,
    redact,
    resolve_env,
    secret_values,
    server_argv,
    server_python,
)
from dspark_ci.launchers.plan_types import LaunchPlan, Placement, RankCommand
from dspark_ci.launchers.readiness import Deadline, OurServer, wait_until_ready

# server -> (modules its Python must import, how to get them)
PREFLIGHT_MODULES = {
    "sglang": (("sglang",), f"`pip install sglang=={DEFAULT_VERSION}`, or run the simulated server (--server sim) or "
                            "containers (--launcher docker)"),
    "sglang-frontend": (("sglang", "fastapi", "uvicorn"), "build its venv with `bash .ci/sglang-frontend.sh` "
                                                          "(prints the Python to set as DSPARK_SGLANG_PYTHON)"),
    "sglang-engine": (("sglang", "fastapi", "safetensors", "ninja"),
                      "build its venv with `bash .ci/sglang-engine.sh` (prints the Python to set as "
                      "DSPARK_SGLANG_ENGINE_PYTHON)"),
}
SETTLE_S = 0.3  # after seeing one rank exit, let the ranks that die of losing it be seen too
PEER_NOTICE_S = 10.0  # a rank that died silently: how long its peers get to say they lost it
PEER_LINES_SEARCHED = 200  # SGLang follows the error with crash diagnostics


def build(context: LaunchContext, options: LocalOptions) -> LocalLauncher:
    """The catalog's constructor (dspark_ci.launchers.catalog): the local launcher takes no options of its own."""
    return LocalLauncher(options, context)


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
        """Raise LaunchFailed naming the rank whose failure brought the group down
        (dspark_ci.launchers.contract.culprit), or a rank that is stopped (SIGSTOP, a debugger): it holds the group
        hostage without ever failing."""
        if any(r.exited_at is not None for r in self._ranks):
            time.sleep(SETTLE_S)  # the ranks that die of losing this one are a few milliseconds behind
            exits = [RankExit(r.command.node_rank, r.process.returncode, r.exited_at,
                              tail(r.log_path, LOG_LINES_SEARCHED)) for r in self._ranks if r.exited_at is not None]
            blamed = culprit(exits)
            noticed = [] if blamed.sglang_error else self._peers_noticed(blamed.node_rank)
            raise group_failed(self.cell_id, exits, [*noticed, f"full log: {self._ranks[blamed.node_rank].log_path}"])
        stopped = next((r for r in self._ranks if _is_stopped(r.process.pid)), None)
        if stopped:
            raise LaunchFailed(cell_id=self.cell_id, reason="unresponsive", node_rank=stopped.command.node_rank,
                               last_lines=tail(stopped.log_path, LOG_LINES_KEPT),
                               hint=f"process {stopped.process.pid} is stopped (SIGSTOP or a debugger); "
                                    f"full log: {stopped.log_path}")

    def _peers_noticed(self, lost: int) -> list[str]:
        """A rank killed outright (SIGKILL, the OOM killer) writes nothing: what its peers said of losing it (a
        gloo/NCCL read error a moment later), waited for up to PEER_NOTICE_S."""
        deadline = time.monotonic() + PEER_NOTICE_S
        while True:
            said = [f"node rank {r.command.node_rank} then said: {line}" for r in self._ranks
                    if r.command.node_rank != lost
                    for line in [sglang_error_line(tail(r.log_path, PEER_LINES_SEARCHED))] if line]
            if said or time.monotonic() >= deadline:
                return said
            time.sleep(SETTLE_S)

    @property
    def rank_pids(self) -> tuple[int, ...]:
        return tuple(rank.process.pid for rank in self._ranks)

    def rank0_log_tail(self) -> list[str]:
        return tail(self._ranks[0].log_path, LOG_LINES_KEPT) if self._ranks else []


class LocalLauncher:
    name = "local"

    def __init__(self, options: LocalOptions, context: LaunchContext, tuning: LocalTuning = LocalTuning()):
        """The user's options as declared (one record), the run's context, and what no user sets."""
        self.options, self.context, self.tuning = options, context, tuning
        self.ledger = Ledger(context.run_id, context.run_dir)  # every process is recorded here as it starts
        self.python = tuning.python or server_python(context.server, context.caller_env)

    def capacity(self) -> Capacity:
        """One cell at a time: cells side by side would share this CPU and disturb each other's timings."""
        return Capacity(1, None, f"the {self.name} launcher runs one cell at a time unless --max-parallel says "
                                 "otherwise")

    def preflight(self, plans: Sequence[LaunchPlan]) -> None:
        """What the server needs must be importable by the Python that runs it, before anything starts."""
        server = self.context.server
        if server not in PREFLIGHT_MODULES or not plans:
            return
        python = self.python if server in SGLANG_VENV_SERVERS else plans[0].ranks[0].argv[0]
        modules, fix = PREFLIGHT_MODULES[server]
        probe = [python, "-c", "import importlib.util as u, sys; "
                 f"sys.exit(any(u.find_spec(m) is None for m in {modules!r}))"]
        try:
            found = subprocess.run(probe, capture_output=True, timeout=60, env=dict(self.context.caller_env))
        except (OSError, subprocess.TimeoutExpired) as err:
            raise InfraError(f"cannot run {python} to look for {', '.join(modules)} ({err}): {fix}") from None
        if found.returncode != 0:
            raise InfraError(f"SGLang is not installed for {python} on this machine ({', '.join(modules)} must "
                             f"import): {fix}")

    def placement(self, nnodes: int, gpus_per_node: int | None = None) -> Placement:
        """Node rank r on 127.0.0.(r+1), all on one free port, like separate machines."""
        return Placement.loopback(nnodes, port=free_port(), dist_port=free_port())

    @contextlib.contextmanager
    def launch(self, plan: LaunchPlan, logs_dir: Path) -> Iterator[LocalDeployment]:
        logs_dir.mkdir(parents=True, exist_ok=True)
        ranks: list[_Rank] = []
        try:
            for command in plan.ranks:
                ranks.append(self._start(plan.cell_id, command, logs_dir))
            deployment = LocalDeployment(plan.cell_id, plan.base_url, ranks)
            deployment.boot_seconds = wait_until_ready(
                OurServer(plan),
                Deadline(self.context.boot_timeout_s, self.tuning.poll_s),
                deployment.check, cell_id=plan.cell_id, last_lines=deployment.rank0_log_tail,
            )
            yield deployment
        finally:
            with signals_deferred():  # a second Ctrl-C must not leave a rank behind
                for rank in ranks:  # a stopped rank (SIGSTOP) cannot act on SIGTERM: let it, not wait out the grace
                    signal_group(rank.process.pid, signal.SIGCONT)
                stop_all([rank.process for rank in ranks], self.tuning.stop_grace_s)

    def _start(self, cell_id: str, command: RankCommand, logs_dir: Path) -> _Rank:
        argv = server_argv(command, self.context.server, self.python)
        caller_env = self.context.caller_env
        env = run_env({**caller_env, **resolve_env(command.env, caller_env)}, self.context.run_id)
        secrets = secret_values(command.env, caller_env)
        log_path = rank_log_path(logs_dir, command.node_rank)
        with open(log_path, "w") as log:
            log.write(redact(f"# node rank {command.node_rank}: {' '.join(argv)}\n", secrets))
            log.flush()
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=env, start_new_session=True, preexec_fn=die_with_parent())
        # Recorded at once: a hard kill between start and record is covered by PDEATHSIG.
        self.ledger.record(self.name, cell_id, command.node_rank, pid=process.pid, pgid=process.pid,
                           pid_started=started_at(process.pid), log=str(log_path))
        rank = _Rank(command, process, log_path)
        rank.watch()
        return rank


def _is_stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False


def remove_started(entry: LedgerEntry, dry_run: bool = False) -> str | None:
    """Kill the process group a dead run left: its leader if the pid still belongs to the process it started, and
    every member carrying the run's mark, even once the leader is gone (a launcher that forked the real server and
    exited leaves the server in its group); with them, the shared memory they held. ``dry_run``: only say so."""
    pid, started, run_id = entry.pid, entry.pid_started, entry.run_id
    if pid is None:
        return None
    leader = _same_process(pid, started)
    if leader is None and _pid_reused(pid, started):
        return None  # the pid belongs to someone else now: its group cannot be ours any more
    also = [leader, *descendants(pid)] if leader else []
    pgid = pid if entry.pgid is None else entry.pgid
    killed = ([*group_members(pgid, run_id), *(p for p in also if p.is_running())] if dry_run
              else kill_group(pgid, run_id, also))
    if not killed:
        return None  # already dead (killed with the run, PDEATHSIG) and its group empty: nothing to remove
    what = "the suites' pytest" if entry.what == "suites" else f"node rank {entry.rank}"
    return f"process {pid} (cell {entry.cell}, {what}) and its group: {len(killed)} process(es)"


def _same_process(pid: int, started: float | None) -> psutil.Process | None:
    try:
        process = psutil.Process(pid)
        if started is None or abs(process.create_time() - started) > 1.0:
            return None
        return None if process.status() == psutil.STATUS_ZOMBIE else process
    except (psutil.Error, TypeError, ValueError):
        return None


def _pid_reused(pid: int, started: float | None) -> bool:
    try:
        return started is None or abs(psutil.Process(pid).create_time() - started) > 1.0
    except psutil.Error:
        return False  # gone: its group may live on
