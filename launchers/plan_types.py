"""What a launcher is asked to start: plain records produced by ``dspark_ci.launchers.launch_plan`` from a cell."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from dspark_ci.ground.sglang.release import SGLANG_ENTRYPOINT, accelerator, release_image

DEFAULT_PORT = 30000  # SGLang's --port default

__all__ = ["SGLANG_ENTRYPOINT", "LaunchPlan", "NodeFlags", "Placement", "RankCommand"]


@dataclass(frozen=True)
class Placement:
    """Where a cell's nodes live. Real clusters give node addresses; on one machine each node
    gets its own loopback address (127.0.0.1, 127.0.0.2, ...) so every rank can bind the same port."""

    bind_hosts: tuple[str, ...]  # --host for each node rank
    leader_addr: str  # address of node rank 0, for --dist-init-addr
    port: int = DEFAULT_PORT
    dist_port: int = 20000

    @classmethod
    def template(cls, nnodes: int) -> Placement:
        """What `dspark-ci plan` prints: bind all interfaces; rank 0's address left as a reference."""
        return cls(bind_hosts=("0.0.0.0",) * nnodes, leader_addr="${NODE0_ADDR}")

    @classmethod
    def loopback(cls, nnodes: int, port: int, dist_port: int) -> Placement:
        hosts = tuple(f"127.0.0.{rank + 1}" for rank in range(nnodes))
        return cls(bind_hosts=hosts, leader_addr=hosts[0], port=port, dist_port=dist_port)


@dataclass(frozen=True)
class NodeFlags:
    """A rank's place in its group, as SGLang's flags. Rendered here only: a launcher that puts its own values in
    (Kubernetes' environment, a Slurm task's shell variables) passes them to ``words``, never parses an argv back."""

    host: str
    port: int
    nnodes: int = 1
    node_rank: int = 0
    leader_addr: str = ""
    dist_port: int = 0

    def words(self, host: str | None = None, node_rank: str | None = None, nnodes: str | None = None,
              leader_addr: str | None = None) -> list[str]:
        """``--host H --port P`` (and the multi-node flags), each value replaced where one is given."""
        flags = ["--host", self.host if host is None else host, "--port", str(self.port)]
        if self.nnodes > 1:
            leader = self.leader_addr if leader_addr is None else leader_addr
            flags += ["--nnodes", nnodes or str(self.nnodes), "--node-rank", node_rank or str(self.node_rank),
                      "--dist-init-addr", f"{leader}:{self.dist_port}"]
        return flags


@dataclass(frozen=True)
class RankCommand:
    """One rank's command: ``head`` (the entrypoint and the cell's settings), its placement, then ``tail`` (the
    matrix's extra_args, last as written). ``argv`` is the three rendered in that order."""

    node_rank: int
    head: tuple[str, ...]  # starts with SGLANG_ENTRYPOINT
    env: Mapping[str, str] = field(default_factory=dict)  # secrets as "${NAME}" references
    node: NodeFlags | None = None
    tail: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "head", tuple(self.head))
        object.__setattr__(self, "tail", tuple(self.tail))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))

    @property
    def argv(self) -> tuple[str, ...]:
        return (*self.head, *(self.node.words() if self.node else ()), *self.tail)

    def to_dict(self) -> dict:
        return {"node_rank": self.node_rank, "argv": list(self.argv), "env": dict(self.env)}


@dataclass(frozen=True)
class LaunchPlan:
    cell_id: str
    ranks: tuple[RankCommand, ...]
    health_url: str  # rank 0's /health, the only rank whose health means anything
    base_url: str  # rank 0's API root, e.g. http://127.0.0.1:30000
    image: str | None = None  # the cell's own `image:`; None: the release image for its device and hardware
    gpus_per_node: int | None = None  # what a scheduler must allocate per node (Slurm --gpus-per-node)
    hardware: str | None = None  # e.g. h200, mi355: decides the accelerator behind `--device cuda`
    device: str = "cuda"  # the cell's `device:` (SGLang's default: cuda)
    bootstrap_port: int | None = None  # a PD prefill's --disaggregation-bootstrap-port

    @property
    def port(self) -> int:
        """Rank 0's HTTP port."""
        node = self.ranks[0].node if self.ranks else None
        return node.port if node else DEFAULT_PORT

    @property
    def accelerator(self) -> str:
        """``nvidia``, ``amd`` (ROCm), ``ascend``, ...: which devices a container or job must be given."""
        return accelerator(self.device, self.hardware)

    @property
    def image_to_run(self) -> str | None:
        """The image to run in: the cell's own, else SGLang's release image for its device and hardware."""
        return self.image or release_image(self.device, self.hardware)

    def to_dict(self) -> list[dict]:
        return [r.to_dict() for r in self.ranks]
