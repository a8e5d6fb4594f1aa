"""The launcher contract: what every launcher is, what it gives the run, and how it fails.

A launcher turns a ``LaunchPlan`` (exact argv per node) into a running group and gives it back as a
``Deployment``; ``dspark_ci.launchers.catalog`` lists every launcher, and ``tests/test_launcher_compliance.py`` runs
the same behaviour checks over each registered one::

    launcher = catalog.get("local").build(context, options)
    launcher.preflight(plans)                      # before anything starts: engines, images, partitions
    with launcher.launch(plan, logs_dir) as deployment:
        ...                                        # deployment.base_url serves the API; check() raises if a rank died
    # every process / container / job of the group is gone here, whatever happened inside

Errors carry what a person needs to act: which rank failed first, its exit code, its last log lines, and
SGLang's own error line (``ValueError: ...``) when there is one (expected rejections are judged on it).
Everything a launcher starts is written to the run's ledger (``dspark_ci.ground.ledger``) before it is started, so
``dspark-ci cleanup --run ID`` can find and remove exactly that after a hard kill.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from dspark_ci.ground.errors import DsparkError, InfraError
from dspark_ci.ground.ledger import LedgerEntry
from dspark_ci.ground.servers import SERVERS, SIMULATED_SERVERS  # noqa: F401  (the launchers' choices)
from dspark_ci.ground.sglang.release import is_peer_loss, sglang_error_line
from dspark_ci.launchers.plan_types import LaunchPlan, Placement

# The simulator's container image (docker/build-sim-image.sh builds it into each Docker engine; a cluster's
# registry holds it for Kubernetes): what a container launcher runs for --server sim.
SIM_IMAGE = "dspark-ci/sglang-sim:latest"


@dataclass(frozen=True)
class LaunchContext:
    """What the run tells every launcher (launcher-specific options come separately, as plain values)."""

    run_id: str
    run_dir: Path  # the ledger of what was started lives here
    server: str = "sim"
    boot_timeout_s: float = 600.0
    caller_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


@dataclass
class LaunchFailed(DsparkError):
    """A rank exited (at boot or later), stopped answering, or rank 0 never became healthy."""

    cell_id: str
    reason: str  # "exited" | "timeout" | "unresponsive" | "stalled" (holds requests, finishes none)
    node_rank: int | None = None
    rank_exit_code: int | None = None  # the rank's own exit status (exit_code is dspark-ci's)
    last_lines: list[str] = field(default_factory=list)
    sglang_error: str | None = None
    hint: str = ""
    role: str | None = None  # a disaggregated cell's role ("decode"): its ranks are counted within the role

    def __post_init__(self):
        super().__init__(str(self))

    def __str__(self) -> str:
        who = f"{self.role} rank" if self.role else "node rank"
        heads = {"timeout": f"{self.cell_id}: {self.role + ' ' if self.role else ''}rank 0 did not become healthy "
                            "in time",
                 "unresponsive": f"{self.cell_id}: {who} {self.node_rank} stopped answering",
                 "stalled": f"{self.cell_id}: {who} {self.node_rank} stopped finishing requests",
                 "exited": f"{self.cell_id}: {who} {self.node_rank} exited with code {self.rank_exit_code}"}
        parts = [heads.get(self.reason, heads["exited"])]
        if self.sglang_error:
            parts.append(f"SGLang said: {self.sglang_error}")
        if self.last_lines:
            parts.append("last log lines:\n    " + "\n    ".join(self.last_lines[-10:]))
        if self.hint:
            parts.append(f"hint: {self.hint}")
        return "\n  ".join(parts)


class LaunchTimeout(LaunchFailed, InfraError):
    """A wait ran out (rank 0 never healthy, a job never scheduled): exit code 3, it names what it awaited."""


# How much of a rank's log is searched for SGLang's error line, and how much an error keeps (it prints 10).
LOG_LINES_SEARCHED = 40
LOG_LINES_KEPT = 15


def rank_exited(cell_id: str, node_rank: int, exit_code: int | None, log_lines: list[str],
                hints: list[str]) -> LaunchFailed:
    """The error for a rank that exited: its exit code, SGLang's error line and the end of its log."""
    return LaunchFailed(cell_id=cell_id, reason="exited", node_rank=node_rank, rank_exit_code=exit_code,
                        last_lines=log_lines[-LOG_LINES_KEPT:], sglang_error=sglang_error_line(log_lines),
                        hint="; ".join(hints))


# Exits closer together than this are one event as far as process or engine clocks can order them.
SIMULTANEOUS_S = 1.0


@dataclass(frozen=True)
class RankExit:
    """One rank seen dead: when (seconds on the clock of whoever watched it), with what, and its log's end."""

    node_rank: int
    exit_code: int | None
    at: float
    log_lines: list[str]

    @property
    def sglang_error(self) -> str | None:
        return sglang_error_line(self.log_lines)


def culprit(exits: list[RankExit]) -> RankExit:
    """The rank whose failure brought the group down.

    Ranks die together (a leader aborts the moment a worker disconnects; workers die when the leader goes), so
    among the exits within SIMULTANEOUS_S of the first, a rank that died of its own SGLang error beats one that
    died of losing a peer (NCCL abort, lost node), rank 0 is preferred among those, then the earliest.
    """
    first = min(e.at for e in exits)
    together = [e for e in exits if e.at - first <= SIMULTANEOUS_S]
    own = [e for e in together if not is_peer_loss(e.sglang_error)] or together
    return min(own, key=lambda e: (e.sglang_error is None, e.node_rank != 0, e.at))


def group_failed(cell_id: str, exits: list[RankExit], hints: list[str]) -> LaunchFailed:
    """The error for a group in which ``exits`` ranks died: the culprit first, the others as consequences."""
    blamed = culprit(exits)
    others = [f"node rank {e.node_rank} exited too (code {e.exit_code})" for e in exits if e is not blamed]
    return rank_exited(cell_id, blamed.node_rank, blamed.exit_code, blamed.log_lines, [*others, *hints])


@runtime_checkable
class Deployment(Protocol):
    """A launched group whose rank 0 answered its health check."""

    cell_id: str
    base_url: str  # rank 0's API root, e.g. http://127.0.0.1:30000
    boot_seconds: float  # from start (or, on a scheduler, from the job RUNNING) until rank 0 was healthy

    def check(self) -> None:
        """Raise LaunchFailed if any rank of the group has exited since launch (the first to fail named)."""


@runtime_checkable
class LocalProcesses(Protocol):
    """A deployment whose ranks are processes of this machine (the local launcher's): the speed suite reads where
    their schedulers spent its window (suites/offcpu.py), which no HTTP API tells."""

    @property
    def rank_pids(self) -> tuple[int, ...]:
        """Each rank's root process (SGLang's launch_server, or the simulator's server)."""


@dataclass(frozen=True)
class Need:
    """What one cell in flight holds: its nodes, and the accelerators each node takes (None: not counted), for each
    of its deployments (2: the cell and its non-speculative reference, placed apart)."""

    nnodes: int
    gpus_per_node: int | None = None
    deployments: int = 1

    @property
    def total_nodes(self) -> int:
        return self.nnodes * self.deployments


@dataclass(frozen=True)
class Capacity:
    """How many cells may be in flight at once and how many nodes they may hold together (None: no node limit);
    ``why`` says where the numbers come from. Every launcher says its own (``Launcher.capacity``, called after its
    preflight); one that cannot know (local: cells would share this CPU) says one cell at a time.

    ``host_gpus``, when a launcher places by accelerators (a Docker inventory giving every host's ``gpus:``), is
    each host's count: a cell's nodes then need ``gpus_per_node`` free on distinct hosts, packed best fit (the
    fullest host that still has room first), as ``launchers/docker`` leases them; a host with 8 GPUs holds two
    4-GPU cells side by side."""

    max_parallel: int
    nodes: int | None = None
    why: str = ""
    host_gpus: tuple[int, ...] = ()

    def fits(self, need: Need | int, in_flight: Sequence[Need | int]) -> bool:
        """A cell needing ``need`` (or that many nodes) may start beside the cells ``in_flight``."""
        wanted, flying = _need(need), [_need(other) for other in in_flight]
        if len(flying) >= self.max_parallel:
            return False
        if not flying:  # a cell larger than the fleet still runs, alone
            return True
        if self.host_gpus:
            free = list(self.host_gpus)
            for other in flying:
                for _ in range(other.deployments):
                    take_gpus(free, self.host_gpus, other)
            return all(take_gpus(free, self.host_gpus, wanted) is not None for _ in range(wanted.deployments))
        return self.nodes is None or sum(other.total_nodes for other in flying) + wanted.total_nodes <= self.nodes


def _need(need: Need | int) -> Need:
    return need if isinstance(need, Need) else Need(need)


def gpus_wanted(need: Need, host_total: int) -> int:
    """What one node takes from a host of ``host_total`` accelerators: its count, at most the whole host (a node
    asking for more than a host has gets the whole host, as it did before hosts were counted)."""
    return min(need.gpus_per_node if need.gpus_per_node is not None else host_total, host_total)


def best_fit(free: Sequence[int], totals: Sequence[int], need: Need) -> list[int] | None:
    """The hosts (indices) that take ``need``'s nodes, one node each: among hosts with room, the fullest first
    (ties: inventory order), so big cells keep whole hosts; None when fewer than ``need.nnodes`` have room."""
    roomy = [i for i in range(len(free)) if free[i] >= gpus_wanted(need, totals[i])]
    chosen = sorted(roomy, key=lambda i: (free[i], i))[:need.nnodes]
    return chosen if len(chosen) == need.nnodes else None


def take_gpus(free: list[int], totals: Sequence[int], need: Need) -> list[int] | None:
    """Take ``need`` out of ``free`` (each host's free count, changed in place) as ``best_fit`` chooses."""
    chosen = best_fit(free, totals, need)
    for i in chosen or ():
        free[i] -= gpus_wanted(need, totals[i])
    return chosen


@runtime_checkable
class Launcher(Protocol):
    name: str  # its row in dspark_ci.launchers.catalog

    def placement(self, nnodes: int, gpus_per_node: int | None = None) -> Placement:
        """Where the nodes of a cell with ``nnodes`` nodes (``gpus_per_node`` accelerators each) will bind (ports
        free on the target)."""

    def preflight(self, plans: Sequence[LaunchPlan]) -> None:
        """Before any launch: raise InfraError (exit 3) or BadInput (exit 2) if the plans cannot run here."""

    def capacity(self) -> Capacity:
        """How many cells may run side by side, and on how many nodes (called after ``preflight``); --max-parallel
        overrides the count, never the nodes."""

    def launch(self, plan: LaunchPlan, logs_dir: Path) -> AbstractContextManager[Deployment]:
        """Start every rank (recording each in the ledger first), wait for rank 0's health against the
        deadline, yield the deployment; on leaving, for any reason, tear the whole group down."""



class LauncherModule(Protocol):
    """What a launcher package's ``lifecycle`` module provides to the catalog (``dspark_ci.launchers.catalog``)."""

    def build(self, context: LaunchContext, options: Any) -> Launcher:
        """The launcher for one run, from the run's context and the launcher's own options record
        (``launchers/<kind>/options.py``, already checked)."""

    def remove_started(self, entry: LedgerEntry, dry_run: bool = False) -> str | None:
        """Remove what one ledger entry of a dead run names (``dspark_ci.ground.ledger``), saying what was removed; None
        if it was already gone. Touches nothing that does not carry that run's id. ``dry_run``: remove nothing, but say
        exactly what would be removed (the same checks, so `cleanup --dry-run` and `cleanup` agree)."""
