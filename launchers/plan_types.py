"""What a launcher is asked to start: plain records produced by ``dspark_ci.launchers.launch_plan`` from a cell."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from dspark_ci.ground.sglang.release import SGLANG_ENTRYPOINT, accelerator, release_image

__all__ = ["SGLANG_ENTRYPOINT", "LaunchPlan", "Placement", "RankCommand"]


@dataclass(frozen=True)
class Placement:
    """Where a cell's nodes live. Real clusters give node addresses; on one machine each node
    gets its own loopback address (127.0.0.1, 127.0.0.2, ...) so every rank can bind the same port."""

    bind_hosts: tuple[str, ...]  # --host for each node rank
    leader_addr: str  # address of node rank 0, for --dist-init-addr
    port: int = 30000
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
class RankCommand:
    node_rank: int
    argv: tuple[str, ...]  # starts with SGLANG_ENTRYPOINT
    env: Mapping[str, str] = field(default_factory=dict)  # secrets as "${NAME}" references

    def __post_init__(self):
        object.__setattr__(self, "argv", tuple(self.argv))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))

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

    @property
    def device(self) -> str:
        """The device the plan runs on (rank 0's ``--device``)."""
        return device_of(self.ranks[0].argv) if self.ranks else "cuda"

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


def device_of(argv: Sequence[str]) -> str:
    """The device from SGLang's own ``--device`` flag (SGLang's default: cuda)."""
    for index, arg in enumerate(argv):
        if arg == "--device" and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("--device="):
            return arg.split("=", 1)[1]
    return "cuda"
