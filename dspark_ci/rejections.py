"""Expected rejections decided by SGLang's own resolver on a CPU instead of a launch (``run --rejections
resolver``): a GPU node is not needed to watch SGLang refuse its arguments when ``resolve_once()`` refuses them.

    expected-reject cells → SGLang's resolver on every rank (dspark-ci preflight's machinery) → per cell:
      rejected by its arguments → decided here: rejected as expected (message matches) or failed (it does not)
      admitted, or only the hardware can tell (megamoe's SM check, device memory) → launched as always

A decided cell is recorded with ``decided_by: "resolver"`` and SGLang's own line; every ``serve`` cell and every
rejection the resolver cannot decide still launches, and ``--rejections launch`` (the default, for release
qualification) launches every one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from dspark_ci.cell_run import CellClock, expectation_applies, pending_result
from dspark_ci.ground.errors import ExitCode, InfraError
from dspark_ci.ground.records import DECIDED_BY_RESOLVER, CellResult, Status
from dspark_ci.ground.sglang.release import SGLANG_ENTRYPOINT
from dspark_ci.ground.sglang.resolver import Resolution, Resolver, locate, resolve
from dspark_ci.launchers.pd.pd_plan import template_plans
from dspark_ci.matrices.cell import REJECT, Cell

MODES = ("launch", "resolver")


@dataclass(frozen=True)
class CellVerdict:
    cell: Cell
    ranks: list[Resolution]

    @property
    def deciding(self) -> tuple[int, Resolution]:
        """The rank whose verdict is the cell's: the first rejection, else the first hardware probe, else rank 0."""
        for kind in ("environment", "rejected", "hardware"):
            for rank, result in enumerate(self.ranks):
                if result.verdict == kind:
                    return rank, result
        return 0, self.ranks[0]

    @property
    def summary(self) -> str:
        rank, result = self.deciding
        if result.verdict == "admitted":
            return "admitted"
        what = "needs the hardware: " if result.verdict == "hardware" else ""
        return f"rank {rank} {what}{result.line}"


def judge(cells: list[Cell], resolver: Resolver) -> tuple[Resolver, list[CellVerdict]]:
    plans = {cell.id: template_plans(cell) for cell in cells}  # as `plan` prints (every role instance of a PD cell)
    launches, owners = [], []
    for cell in cells:
        for rank in (rank for plan in plans[cell.id] for rank in plan.ranks):
            launches.append((list(rank.argv[len(SGLANG_ENTRYPOINT):]), dict(rank.env)))
            owners.append(cell.id)
    described, results = resolve(resolver, launches)
    by_cell: dict[str, list[Resolution]] = {c.id: [] for c in cells}
    for owner, result in zip(owners, results, strict=False):
        by_cell[owner].append(result)
    verdicts = [CellVerdict(c, by_cell[c.id]) for c in cells]
    lacking = next((v for v in verdicts if v.deciding[1].verdict == "environment"), None)
    if lacking:
        raise InfraError(f"--sglang {described.label}: the resolver environment lacks a module SGLang imports "
                         f"({lacking.deciding[1].line}, at {lacking.deciding[1].where}): add it to "
                         ".ci/sglang-resolver.txt and run `bash .ci/sglang-resolver.sh` again")
    return described, verdicts


@dataclass(frozen=True)
class Decided:
    """What the resolver settled (results, by cell id) and the cells still to launch, in their order."""

    results: dict[str, CellResult]
    to_launch: list[Cell]


def decide_rejections(cells: list[Cell], sglang_version: str, mode: str = "resolver") -> Decided:
    """Every expected rejection the resolver of SGLang ``sglang_version`` decides from the arguments alone."""
    candidates = [c for c in cells if c.expect.outcome == REJECT and expectation_applies(c, sglang_version)]
    if mode != "resolver" or not candidates:
        return Decided({}, list(cells))
    clock = CellClock()
    resolver, verdicts = judge(candidates, locate("local"))
    if resolver.version != sglang_version:
        raise InfraError(f"--rejections resolver: the resolver environment ({resolver.python}) has SGLang "
                         f"{resolver.version}, this run tests {sglang_version}: point DSPARK_SGLANG_PYTHON at an "
                         f"environment with SGLang {sglang_version}, or pass --rejections launch")
    results = {v.cell.id: clock.timed(_judged(v, resolver.version)) for v in verdicts
               if v.deciding[1].verdict == "rejected"}
    return Decided(results, [c for c in cells if c.id not in results])


def _judged(verdict: CellVerdict, version: str | None) -> CellResult:
    cell = verdict.cell
    rank, said = verdict.deciding
    result = replace(pending_result(cell), decided_by=DECIDED_BY_RESOLVER)
    if cell.expect.message and re.search(cell.expect.message, said.line):
        return result.finished(Status.REJECTED_AS_EXPECTED, None, ExitCode.OK, sglang_error=said.line)
    return result.finished(Status.FAILED, f"expected a rejection matching /{cell.expect.message}/, but SGLang "
                           f"{version}'s resolver rejects node rank {rank} with: {said.line}", ExitCode.FELL_SHORT,
                           sglang_error=said.line)
