"""Why a cell fails: the history classifies a cell whose latest recorded run failed, and lists node-level signals.

- ``infrastructure``: the failure was the machine's (launch timeout, engine unreachable, node lost: results.json
  ``infrastructure``), not the cell's; node-level signals say where.
- ``flaky``: the same identity (same setup, same build) both passed and failed in the history, or a retry
  passed after a failure (the ``flaky`` label); a retry buys a label, never a pass.
- ``regression``: it passed before with the same setup, and fails since a run of another build.
- ``broken``: it never passed with this setup in the recorded runs.

Node-level signals: the Docker engines, Slurm nodes and hosts named by infrastructure failures across every cell
of the history, with how many of those failures name each; one named by all of them is the suspect.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dspark_ci.reports import history_db

FAILING = ("failed", "error")
PASSING = ("passed", "rejected_as_expected")
INFRASTRUCTURE, FLAKY, REGRESSION, BROKEN = "infrastructure", "flaky", "regression", "broken"
# What names a node in an infrastructure failure's message (the launchers' own wording).
NODE_PATTERNS = (re.compile(r"Docker engine (\S+?)[\s;,)]"), re.compile(r"\bSlurm (?:does not know )?node ([\w.-]+)"),
                 re.compile(r"\bon node ([A-Za-z][\w.-]*)"), re.compile(r"\bnode ([A-Za-z][\w-]*\d[\w.-]*)"))


@dataclass(frozen=True)
class Triage:
    cell_id: str
    run_id: str
    kind: str  # INFRASTRUCTURE | FLAKY | REGRESSION | BROKEN
    why: str

    def to_dict(self) -> dict:
        return {"cell": self.cell_id, "run": self.run_id, "kind": self.kind, "why": self.why}


def classify(cell_id: str, runs: list[history_db.Outcome]) -> Triage | None:
    """The latest run's failure, classified; None when the latest run did not fail."""
    if not runs or runs[-1].status not in FAILING:
        return None
    latest = runs[-1]
    for rule in (_infrastructure, _flaky, _regression):
        why = rule(latest, runs[:-1])
        if why:
            return Triage(cell_id, latest.run_id, rule.__name__.strip("_"), why)
    setup = "this setup" if latest.setup else "any recorded setup"
    return Triage(cell_id, latest.run_id, BROKEN, f"never passed with {setup} in {len(runs)} recorded run(s)")


def _infrastructure(latest: history_db.Outcome, earlier: list[history_db.Outcome]) -> str | None:
    if not latest.infrastructure:
        return None
    nodes = nodes_named(latest.error or "")
    return f"the machine failed, not the cell{': ' + ', '.join(nodes) if nodes else ''} ({_first_line(latest.error)})"


def _flaky(latest: history_db.Outcome, earlier: list[history_db.Outcome]) -> str | None:
    if "flaky" in latest.labels:
        return "failed, then passed on a retry in the same run"
    same = [run for run in earlier if latest.identity and run.identity == latest.identity and run.status in PASSING]
    if same:
        return f"the same identity ({latest.build}) passed in {same[-1].run_id} and failed in {latest.run_id}"
    return None


def _regression(latest: history_db.Outcome, earlier: list[history_db.Outcome]) -> str | None:
    passed = [run for run in earlier
              if run.status in PASSING and (not latest.setup or run.setup in (latest.setup, None))]
    if not passed:
        return None
    last_good = passed[-1]
    first_bad = next(run for run in [*earlier, latest] if (run.started_at or "") > (last_good.started_at or "")
                     and run.status in FAILING)
    builds = f" (build {last_good.build} → {first_bad.build})" if last_good.build != first_bad.build else ""
    return f"passed in {last_good.run_id}, failing since {first_bad.run_id}{builds}"


def nodes_named(text: str) -> list[str]:
    return list(dict.fromkeys(m.group(1) for pattern in NODE_PATTERNS for m in pattern.finditer(text + " ")))


def triage(path: Path, pattern: str = "*") -> list[Triage]:
    """Every recorded cell matching ``pattern`` whose latest run failed, classified."""
    found = [classify(cell_id, history_db.outcomes(path, cell_id)) for cell_id in history_db.cells_of(path, pattern)]
    return [t for t in found if t is not None]


@dataclass(frozen=True)
class NodeSignal:
    node: str
    failures: int  # infrastructure failures naming it (or run on it)
    of: int  # infrastructure failures in all

    def describe(self) -> str:
        every = " (every one: suspect this node)" if self.failures == self.of and self.of > 1 else ""
        return f"{self.node}: {self.failures} of {self.of} infrastructure failures{every}"


def node_signals(path: Path, pattern: str = "*") -> list[NodeSignal]:
    """Nodes named by (or hosting) the infrastructure failures of the matching cells, most often named first."""
    failures = [run for cell_id in history_db.cells_of(path, pattern) for run in history_db.outcomes(path, cell_id)
                if run.infrastructure]
    counts: dict[str, int] = {}
    for run in failures:
        for node in dict.fromkeys([*nodes_named(run.error or ""), *run.hosts]):
            counts[node] = counts.get(node, 0) + 1
    return sorted((NodeSignal(node, n, len(failures)) for node, n in counts.items()),
                  key=lambda s: (-s.failures, s.node))


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0][:160] if (text or "").strip() else "no message"

