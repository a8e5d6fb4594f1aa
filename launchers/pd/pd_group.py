"""A disaggregated cell's group: every role instance launched by the selected launcher's own ``launch()`` (its
ranks, health wait, logs, ledger and teardown stay the launcher's), SGLang's router started in front (on Kubernetes
the Deployment `dspark-ci plan --format k8s` prints, launchers/pd/k8s_router.py; else a process of the run), all watched
as one deployment and torn down together, each prefill also for a stall (launchers/pd/prefill_watch.py).
The culprit is named by role: "decode rank 1 exited", "prefill rank 0 stopped finishing requests"."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from dspark_ci.ground.ledger import Ledger
from dspark_ci.ground.processes import free_port
from dspark_ci.ground.sglang.release import is_peer_loss
from dspark_ci.launchers.contract import Deployment, Launcher, LaunchFailed
from dspark_ci.launchers.pd.k8s_router import k8s_router
from dspark_ci.launchers.pd.pd_plan import PDPlan, RoleInstance, plan_pd, router_command
from dspark_ci.launchers.pd.prefill_watch import PREFILL_STALL_S, PrefillWatch
from dspark_ci.launchers.pd.router_process import Router, local_router
from dspark_ci.matrices.cell import Cell

if TYPE_CHECKING:
    from dspark_ci.launchers.k8s.lifecycle import K8sLauncher


def as_role(err: LaunchFailed, instance: RoleInstance, cell_id: str) -> LaunchFailed:
    """A role instance's failure as the cell's: its ranks counted within the role (instance i, node rank r of an
    n-node role is role rank i·n + r), the instance's own error line kept."""
    nnodes = len(instance.plan.ranks)
    rank = instance.index * nnodes + (err.node_rank or 0)
    return dataclasses.replace(err, cell_id=cell_id, role=instance.role, node_rank=rank)


def blamed(failures: list[LaunchFailed]) -> LaunchFailed:
    """Among role failures seen together, one with its own SGLang error beats one that lost a peer; else the first."""
    own = [f for f in failures if f.sglang_error and not is_peer_loss(f.sglang_error)]
    return (own or failures)[0]


@dataclass(frozen=True)
class RoleEndpoint:
    """Where one role instance answers, beside the router (its own /metrics: the suites' TTFT split)."""

    role: str  # "prefill" | "decode"
    index: int
    base_url: str


class PDDeployment:
    def __init__(self, cell_id: str, base_url: str, members: list[tuple[RoleInstance, Deployment]],
                 router: Router):
        self.cell_id, self.base_url, self.members, self.router = cell_id, base_url, members, router
        self.boot_seconds = 0.0
        self.prefill_watches: list[tuple[RoleInstance, PrefillWatch]] = []  # once the group serves (watch_prefills)

    @property
    def endpoints(self) -> tuple[RoleEndpoint, ...]:
        """Every role instance where its deployment answers (a Slurm job's node, not the plan's placeholder)."""
        return tuple(RoleEndpoint(instance.role, instance.index, deployment.base_url)
                     for instance, deployment in self.members)

    @property
    def decode_urls(self) -> list[str]:
        return [instance.plan.base_url for instance, _ in self.members if instance.role == "decode"]

    def check(self) -> None:
        failures = []
        for instance, deployment in self.members:
            try:
                deployment.check()
            except LaunchFailed as err:
                failures.append(as_role(err, instance, self.cell_id))
        if failures:
            others = [f"{f.role} rank {f.node_rank} failed too" for f in failures[1:]]
            first = blamed(failures)
            raise dataclasses.replace(first, hint="; ".join(filter(None, [first.hint, *others])))
        self.router.check(self.cell_id)
        self._check_prefills()

    def watch_prefills(self, stack: contextlib.ExitStack) -> None:
        """Watch every prefill for a stall from now until ``stack`` closes."""
        for instance, deployment in self.members:
            if instance.role == "prefill":
                watch = PrefillWatch(deployment.base_url)
                stack.callback(watch.stop)
                self.prefill_watches.append((instance, watch))

    def _check_prefills(self) -> None:
        for instance, watch in self.prefill_watches:
            stalled = watch.stalled_for()
            if stalled > PREFILL_STALL_S:
                held = f"{watch.last.held:.0f} request(s)" if watch.last else "requests"
                raise LaunchFailed(cell_id=self.cell_id, reason="stalled", role="prefill",
                                   node_rank=instance.index * len(instance.plan.ranks),
                                   hint=f"{watch.base_url} has held {held} waiting or running and finished none "
                                        f"for {stalled:.0f} s (its /metrics: sglang:num_queue_reqs, "
                                        "sglang:num_running_reqs, sglang:num_requests_total); the decode side waits "
                                        "for transfers that do not come")


@contextlib.contextmanager
def launch_pd(launcher: Launcher, cell: Cell, logs_dir: Path, env: Mapping[str, str], ledger: Ledger | None,
              boot_timeout_s: float) -> Iterator[PDDeployment]:
    """Start every prefill and decode instance, then the router; yield the group; tear all of it down."""
    started = time.monotonic()
    plan = plan_pd(cell, lambda role, index, nnodes, gpus: launcher.placement(nnodes, gpus),
                   bootstrap_port_of=lambda index: free_port())
    with contextlib.ExitStack() as stack:
        members = [(instance, _launched(stack, launcher, instance, cell.id, logs_dir)) for instance in plan.instances]
        start = ROUTERS.get(launcher.name, _process_router)
        router = stack.enter_context(start(launcher, cell, members, logs_dir, env, ledger))
        deployment = PDDeployment(cell.id, router.base_url, members, router)
        router.wait_ready(cell.id, len(members), boot_timeout_s, deployment.check)
        deployment.boot_seconds = time.monotonic() - started
        deployment.watch_prefills(stack)
        yield deployment


def _process_router(launcher: Launcher, cell: Cell, members: list[tuple[RoleInstance, Deployment]], logs_dir: Path,
                    env: Mapping[str, str], ledger: Ledger | None) -> contextlib.AbstractContextManager[Router]:
    """The router as a process of the run, joining the deployments where they answer (a Slurm job's node is known
    once it runs)."""
    command = router_command(cell, [i for i, _ in members], {i.label: d.base_url for i, d in members}, "127.0.0.1",
                             free_port(), free_port())
    return local_router(command, cell.id, logs_dir, env, ledger)


def _k8s_router(launcher: Launcher, cell: Cell, members: list[tuple[RoleInstance, Deployment]], logs_dir: Path,
                env: Mapping[str, str], ledger: Ledger | None) -> contextlib.AbstractContextManager[Router]:
    """The router as the Deployment `dspark-ci plan --format k8s` prints, through the same API server."""
    return k8s_router(cast("K8sLauncher", launcher), cell, members, logs_dir)  # ROUTERS: by the launcher's name


# Where a launcher runs the router (by launcher name); any other: a process of the run.
ROUTERS = {"k8s": _k8s_router}


def _launched(stack: contextlib.ExitStack, launcher: Launcher, instance: RoleInstance, cell_id: str,
              logs_dir: Path) -> Deployment:
    try:
        return stack.enter_context(launcher.launch(instance.plan, logs_dir / f"{instance.role}-{instance.index}"))
    except LaunchFailed as err:
        raise as_role(err, instance, cell_id) from None


__all__ = ["PDDeployment", "PDPlan", "RoleEndpoint", "as_role", "blamed", "launch_pd"]
