"""What a run produces, as frozen records with a closed status (the shape of nox's ``Status``/``Result``).

The run builds one ``CellResult`` per selected cell, gates it into ``GateResult`` records, and hands the
``RunResults`` to the reports. ``to_dict``/``from_dict`` exist for one boundary only: results.json
(CONTRACT.md schema 1), written by ``reports.results.write_results`` and read by ``load_results``.
Everything else passes the records themselves.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping

from ground.errors import ExitCode
from ground.sglang.settings import CellConfig

SCHEMA = 1


class Status(str, enum.Enum):
    """How a cell ended. Closed: CONTRACT.md lists exactly these."""

    PASSED = "passed"
    FAILED = "failed"  # measured and fell short: a gate, a suite test, the wrong rejection
    REJECTED_AS_EXPECTED = "rejected_as_expected"
    ERROR = "error"  # no measurement to judge: a crash, an infrastructure failure, a cell never reached
    SKIPPED = "skipped"  # its expectation was written for another SGLang release

    @property
    def failing(self) -> bool:
        """A status that makes the run red."""
        return self in (Status.FAILED, Status.ERROR)

    @property
    def icon(self) -> str:
        return _ICONS[self]

    @property
    def text(self) -> str:
        return self.value.replace("_", " ")


_ICONS = {Status.PASSED: "✅", Status.FAILED: "❌", Status.REJECTED_AS_EXPECTED: "✅", Status.ERROR: "💥",
          Status.SKIPPED: "⏭️"}


@dataclass(frozen=True)
class GateResult:
    metric: str
    op: str  # ">=" | "<="
    threshold: float
    value: float | None  # None: the gated metric was not measured (that fails the gate)
    passed: bool

    def to_dict(self) -> dict:
        return {"metric": self.metric, "op": self.op, "threshold": self.threshold, "value": self.value,
                "passed": self.passed}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "GateResult":
        return cls(data["metric"], data["op"], data["threshold"], data.get("value"), data["passed"])


SERVE, REJECT = "serve", "reject"  # a cell's expected outcome (CONTRACT.md `expect.outcome`)


@dataclass(frozen=True)
class Expect:
    """What a cell should do: serve, or be rejected by SGLang with a message (a regex searched in its error line);
    ``sglang`` is the version spec the expectation was written for, e.g. ">=0.5.23"."""

    outcome: str = SERVE
    message: str | None = None
    sglang: str | None = None

    @property
    def rejects(self) -> bool:
        return self.outcome == REJECT

    def to_dict(self) -> dict:
        return {"outcome": self.outcome, "message": self.message, "sglang": self.sglang}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Expect":
        return cls(data.get("outcome") or SERVE, data.get("message"), data.get("sglang"))


def _frozen(mapping: Mapping | None) -> Mapping:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class CellResult:
    """One cell's outcome. ``exit_code`` is what it contributes to the run's exit code (not serialized:
    read back from results.json it follows the status, infrastructure errors counting as 1)."""

    id: str
    config: Mapping[str, Any]
    expect: Expect  # a mapping given here (results.json's object) becomes an Expect
    runner: str | None = None
    suites: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    baseline: str | None = None
    status: Status = Status.ERROR
    error: str | None = None
    boot_seconds: float | None = None
    metrics: Mapping[str, float | None] = field(default_factory=dict)
    gates: tuple[GateResult, ...] = ()
    warnings: tuple[str, ...] = ()
    tests: tuple[Mapping[str, Any], ...] | None = None  # the suites' own test outcomes, when suites ran
    sglang_error: str | None = None  # SGLang's own "SomeError: message" line, from the rank that failed first
    # How the GPQA figure was produced: {"scorer", "partial", "samples", "planned_samples", "accuracy"}
    # (results.json key "gpqa", optional): the report names the scorer and marks a partial figure.
    gpqa: Mapping[str, Any] | None = None
    exit_code: ExitCode | None = field(default=None, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "status", Status(self.status))
        object.__setattr__(self, "config", _frozen(self.config))
        if not isinstance(self.expect, Expect):
            object.__setattr__(self, "expect", Expect.from_dict(self.expect or {}))
        object.__setattr__(self, "suites", MappingProxyType({k: _frozen(v) for k, v in self.suites.items()}))
        object.__setattr__(self, "metrics", _frozen(self.metrics))
        object.__setattr__(self, "gates", tuple(self.gates))
        object.__setattr__(self, "warnings", tuple(self.warnings))
        if self.tests is not None:
            object.__setattr__(self, "tests", tuple(_frozen(t) for t in self.tests))
        if self.gpqa is not None:
            object.__setattr__(self, "gpqa", _frozen(self.gpqa))
        if self.exit_code is None:
            object.__setattr__(self, "exit_code", ExitCode.FELL_SHORT if self.status.failing else ExitCode.OK)

    def finished(self, status: Status, error: str | None = None, exit_code: ExitCode | None = None,
                 **changes: Any) -> "CellResult":
        """This result with its final status (and whatever else ``changes`` sets)."""
        return replace(self, status=status, error=error, exit_code=exit_code, **changes)

    @property
    def speculative(self) -> bool:
        """The cell ran a speculative algorithm (as its config says: ``CellConfig.speculative``)."""
        return CellConfig.from_dict(self.config).speculative

    @property
    def failed_tests(self) -> list[str]:
        return [f"{t['nodeid']}: {t.get('message') or t['outcome']}"
                for t in self.tests or () if t.get("outcome") in ("failed", "error")]

    def to_dict(self) -> dict:
        data = {"id": self.id, "config": dict(self.config), "expect": self.expect.to_dict(), "runner": self.runner,
                "suites": {name: dict(options) for name, options in self.suites.items()}, "baseline": self.baseline,
                "status": self.status.value, "error": self.error, "boot_seconds": self.boot_seconds,
                "metrics": dict(self.metrics), "gates": [g.to_dict() for g in self.gates],
                "warnings": list(self.warnings)}
        if self.tests is not None:
            data["tests"] = [dict(t) for t in self.tests]
        if self.sglang_error is not None:
            data["sglang_error"] = self.sglang_error
        if self.gpqa is not None:
            data["gpqa"] = dict(self.gpqa)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CellResult":
        tests = data.get("tests")
        return cls(id=data["id"], config=data.get("config") or {}, expect=Expect.from_dict(data.get("expect") or {}),
                   runner=data.get("runner"), suites=data.get("suites") or {}, baseline=data.get("baseline"),
                   status=Status(data["status"]), error=data.get("error"), boot_seconds=data.get("boot_seconds"),
                   metrics=data.get("metrics") or {}, gates=tuple(GateResult.from_dict(g) for g in data.get("gates") or ()),
                   warnings=tuple(data.get("warnings") or ()), tests=None if tests is None else tuple(tests),
                   # "detail": what results.json called SGLang's rejection line before records existed
                   sglang_error=data.get("sglang_error") or data.get("detail"), gpqa=data.get("gpqa"))


@dataclass(frozen=True)
class RunResults:
    run_id: str
    started_at: str | None
    finished_at: str | None
    launcher: str
    matrices: tuple[str, ...]
    cells: tuple[CellResult, ...] = ()
    interrupted: bool = False  # Ctrl-C / SIGTERM ended the run before every cell finished
    run_options: tuple[str, ...] = ()  # the options `dspark-ci run` was given (its rerun command repeats them)
    # Where it ran (optional results.json key "environment"): server ("sim" | "sglang"), sglang_version,
    # hostname, python, dspark_ci_commit, ... as far as the run knew them.
    environment: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "environment", _frozen(self.environment))
        object.__setattr__(self, "matrices", tuple(self.matrices))
        object.__setattr__(self, "run_options", tuple(self.run_options))
        object.__setattr__(self, "cells", tuple(self.cells))

    def with_cell(self, cell: CellResult) -> "RunResults":
        return replace(self, cells=(*self.cells, cell))

    @property
    def failed(self) -> bool:
        """Some cell fell short (CONTRACT.md exit code 1)."""
        return any(cell.status.failing for cell in self.cells)

    def to_dict(self) -> dict:
        data = {"schema": SCHEMA, "run_id": self.run_id, "started_at": self.started_at,
                "finished_at": self.finished_at, "launcher": self.launcher, "matrices": list(self.matrices),
                "cells": [cell.to_dict() for cell in self.cells]}
        if self.interrupted:
            data["interrupted"] = True
        if self.run_options:
            data["run_options"] = list(self.run_options)
        if self.environment:
            data["environment"] = dict(self.environment)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunResults":
        return cls(run_id=data.get("run_id", ""), started_at=data.get("started_at"),
                   finished_at=data.get("finished_at"), launcher=data.get("launcher", ""),
                   matrices=tuple(data.get("matrices") or ()),
                   cells=tuple(CellResult.from_dict(c) for c in data["cells"]),
                   interrupted=bool(data.get("interrupted")), run_options=tuple(data.get("run_options") or ()),
                   environment=data.get("environment") or {})
