"""A cell: one deployment to test, and what it should do. The record every later stage reads.

Cells are plain, immutable data. ``to_dict()`` is the CONTRACT.md shape (without ``ranks``,
which the launch planner adds).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from dspark_ci.ground.records import REJECT, SERVE, Expect
from dspark_ci.ground.sglang.settings import CellConfig
from dspark_ci.matrices.roles import Role, RouterSpec

__all__ = ["REJECT", "SERVE", "Cell", "Expect"]

@dataclass(frozen=True)
class Cell:
    id: str
    matrix: str  # the file it came from (as given on the command line)
    config: CellConfig  # the SGLang settings, typed (ground/sglang/settings.py); a mapping given becomes one
    runner: str  # CI runner label, e.g. "8-gpu-h200"
    expect: Expect = Expect()
    env: Mapping[str, str] = field(default_factory=dict)  # launch env; secrets as "${NAME}"
    extra_args: tuple[str, ...] = ()  # extra launch_server flags the matrix set verbatim
    suites: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # suite name -> options
    baseline: str | None = None  # baseline file; the matrix gives it relative to itself
    image: str | None = None  # container image for the Docker launcher
    line: int | None = None  # line in `matrix` where the cell was declared (for messages)
    roles: tuple[Role, ...] = ()  # prefill and decode (matrices/roles.py): a disaggregated cell; () colocated
    router: RouterSpec | None = None  # sglang-router in front of the roles

    def __post_init__(self):
        # Freeze the mappings so a stage cannot change what the next one sees.
        if not isinstance(self.config, CellConfig):
            object.__setattr__(self, "config", CellConfig.from_dict(self.config))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "suites",
                           MappingProxyType({k: MappingProxyType(dict(v)) for k, v in self.suites.items()}))

    @property
    def nnodes(self) -> int:
        """Nodes the cell holds: a disaggregated cell's over every role instance."""
        return sum(r.count * r.config.nnodes for r in self.roles) if self.roles else self.config.nnodes

    @property
    def speculative(self) -> bool:
        return self.config.speculative or any(r.config.speculative for r in self.roles)

    @property
    def disaggregated(self) -> bool:
        return bool(self.roles)

    def role(self, name: str) -> Role:
        return next(r for r in self.roles if r.name == name)

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "matrix": self.matrix,
            "config": dict(self.config),
            "runner": self.runner,
            "expect": self.expect.to_dict(),
            "env": dict(self.env),
            "extra_args": list(self.extra_args),
            "suites": {k: dict(v) for k, v in self.suites.items()},
            "baseline": self.baseline,
            "image": self.image,
            **({"roles": {r.name: r.to_dict() for r in self.roles},
                "router": (self.router or RouterSpec()).to_dict()} if self.roles else {}),
        }
