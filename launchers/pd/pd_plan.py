"""A disaggregated cell -> ``PDPlan``: one ``LaunchPlan`` per role instance (prefill 0..n-1, decode 0..m-1), each
the exact launch_server argv of every node rank (``--disaggregation-mode``, the prefill's
``--disaggregation-bootstrap-port``, ...), plus sglang-router's command that joins them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from dspark_ci.ground.sglang.router import ROUTER_ENTRYPOINT, router_args
from dspark_ci.ground.sglang.settings import DEFAULT_BOOTSTRAP_PORT
from dspark_ci.launchers.launch_plan import plan_launch
from dspark_ci.launchers.plan_types import LaunchPlan, Placement
from dspark_ci.matrices.cell import Cell
from dspark_ci.matrices.roles import Role, RouterSpec

ROUTER_PORT = 30000  # what `dspark-ci plan` shows: the router takes the serving port, roles their own
TEMPLATE_ROLE_PORT = 30000


@dataclass(frozen=True)
class RoleInstance:
    role: str  # "prefill" | "decode"
    index: int  # instance of the role (0..count-1)
    plan: LaunchPlan
    bootstrap_port: int | None  # prefill: its bootstrap server; decode: None

    @property
    def label(self) -> str:
        return f"{self.role} {self.index}"

    def to_dict(self) -> dict:
        return {"role": self.role, "index": self.index, "base_url": self.plan.base_url,
                "bootstrap_port": self.bootstrap_port, "ranks": self.plan.to_dict()}


@dataclass(frozen=True)
class RouterCommand:
    argv: tuple[str, ...]  # starts with ROUTER_ENTRYPOINT
    base_url: str  # what the suites talk to

    def to_dict(self) -> dict:
        return {"argv": list(self.argv), "base_url": self.base_url}


@dataclass(frozen=True)
class PDPlan:
    cell_id: str
    instances: tuple[RoleInstance, ...]  # prefill instances first, then decode
    router: RouterCommand

    def of(self, role: str) -> tuple[RoleInstance, ...]:
        return tuple(i for i in self.instances if i.role == role)

    def to_dict(self) -> dict:
        return {"instances": [i.to_dict() for i in self.instances], "router": self.router.to_dict()}


# Where a role instance runs: (role, index, nnodes, gpus_per_node) -> Placement; and its bootstrap port.
PlacementOf = Callable[[str, int, int, int], Placement]


def template_placement(role: str, index: int, nnodes: int, gpus_per_node: int) -> Placement:
    """What `dspark-ci plan` prints: each instance on its own nodes, its rank 0 named ${PREFILL0_ADDR}, ..."""
    return Placement(bind_hosts=("0.0.0.0",) * nnodes, leader_addr=f"${{{role.upper()}{index}_ADDR}}",
                     port=TEMPLATE_ROLE_PORT)


def plan_pd(cell: Cell, placement_of: PlacementOf = template_placement,
            bootstrap_port_of: Callable[[int], int] | None = None,
            router_host: str = "0.0.0.0", router_port: int = ROUTER_PORT, router_url_host: str | None = None,
            prometheus_port: int | None = None) -> PDPlan:
    """The disaggregated cell's plan: every role instance's ranks, and the router over them."""
    instances = [_instance(cell, role, index, placement_of, bootstrap_port_of)
                 for role in cell.roles for index in range(role.count)]
    router = router_command(cell, instances, {i.label: i.plan.base_url for i in instances}, router_host,
                            router_port, prometheus_port, router_url_host)
    return PDPlan(cell.id, tuple(instances), router)


def router_command(cell: Cell, instances, urls: dict[str, str], host: str, port: int,
                   prometheus_port: int | None = None, url_host: str | None = None) -> RouterCommand:
    """The router over the instances, each at ``urls[instance.label]`` (the plan's, or where a launcher's
    deployment actually answers: a Slurm node is known once the job runs)."""
    prefills = [(urls[i.label], i.bootstrap_port or DEFAULT_BOOTSTRAP_PORT) for i in instances if i.role == "prefill"]
    decodes = [urls[i.label] for i in instances if i.role == "decode"]
    spec = cell.router or RouterSpec()
    argv = (*ROUTER_ENTRYPOINT, *router_args(host, port, prefills, decodes, spec.prefill_policy, spec.decode_policy,
                                             prometheus_port))
    shown = url_host or ("${ROUTER_ADDR}" if host == "0.0.0.0" else host)
    return RouterCommand(argv, f"http://{shown}:{port}")


def _instance(cell: Cell, role: Role, index: int, placement_of: PlacementOf,
              bootstrap_port_of: Callable[[int], int] | None) -> RoleInstance:
    """Prefill instance i serves the cell's bootstrap port + i (on a template; a launcher gives free ones)."""
    config = role.config
    base_port = config.disaggregation_bootstrap_port or DEFAULT_BOOTSTRAP_PORT
    bootstrap = None if role.name != "prefill" else (bootstrap_port_of or (lambda i: base_port + i))(index)
    if bootstrap is not None:
        config = dataclasses.replace(config, disaggregation_bootstrap_port=bootstrap)
    member = dataclasses.replace(cell, id=f"{cell.id}-{role.name}{index}", config=config, roles=(), router=None)
    plan = plan_launch(member, placement_of(role.name, index, config.nnodes, config.gpus_per_node))
    return RoleInstance(role.name, index, plan, bootstrap)


def template_plans(cell: Cell) -> list[LaunchPlan]:
    """Every launch of a cell as `dspark-ci plan` prints it: its own, or each role instance's (SGLang's resolver and
    the launchers' preflight check every one)."""
    if not cell.disaggregated:
        return [plan_launch(cell, Placement.template(cell.nnodes))]
    return [instance.plan for instance in plan_pd(cell).instances]
