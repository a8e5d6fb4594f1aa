"""What a run produces, as frozen records with a closed status (the shape of nox's ``Status``/``Result``).

The run builds one ``CellResult`` per selected cell, gates it into ``GateResult`` records, and hands the
``RunResults`` to the reports. ``to_dict``/``from_dict`` exist for one boundary only: results.json
(CONTRACT.md schema 1), written by ``reports.results.write_results`` and read by ``load_results``.
Everything else passes the records themselves.
"""

from __future__ import annotations

import datetime as dt
import enum
import fnmatch
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping

from ground.errors import ExitCode
from ground.identity import CellIdentity
from ground.sglang.settings import CellConfig
from ground.stats import INCONCLUSIVE, PASSED, REGRESSED, Verdict

SCHEMA = 1
QUARANTINED = "quarantined"  # a cell label: it ran and is reported, but its failure does not gate (matrices/quarantine)
QUARANTINE_EXPIRED = "quarantine_expired"  # a cell label: its quarantine entry has expired, so it gates again
DECIDED_BY_RESOLVER = "resolver"  # a cell's ``decided_by``: SGLang's resolver on a CPU decided it, nothing launched


class Status(str, enum.Enum):
    """How a cell ended. Closed: CONTRACT.md lists exactly these."""

    PASSED = "passed"
    FAILED = "failed"  # measured and fell short: a gate, a suite test, the wrong rejection
    REJECTED_AS_EXPECTED = "rejected_as_expected"
    ERROR = "error"  # no measurement to judge: a crash, an infrastructure failure, a cell never reached
    SKIPPED = "skipped"  # its expectation was written for another SGLang release
    # measured, nothing fell short, but a statistical gate could not decide: neither green nor red
    INCONCLUSIVE = "inconclusive"

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
          Status.SKIPPED: "⏭️", Status.INCONCLUSIVE: "❔"}


@dataclass(frozen=True)
class GateResult:
    """One gate. ``passed`` is what CONTRACT.md schema 1 always had; ``statistic`` is the statistical
    decision behind it when there is one (effect, interval, test), and ``verdict`` the three-way outcome:
    a gate that is ``inconclusive`` has ``passed`` False but is not a regression."""

    metric: str
    op: str  # ">=" | "<="
    threshold: float
    value: float | None  # None: the gated metric was not measured (that fails the gate)
    passed: bool
    statistic: Verdict | None = None  # None: a fixed limit (a floor, min/max, or a baseline without noise)

    @property
    def verdict(self) -> str:
        if self.statistic is not None:
            return self.statistic.verdict
        return PASSED if self.passed else REGRESSED

    @property
    def inconclusive(self) -> bool:
        return self.verdict == INCONCLUSIVE

    def to_dict(self) -> dict:
        data = {"metric": self.metric, "op": self.op, "threshold": self.threshold, "value": self.value,
                "passed": self.passed, "verdict": self.verdict}
        if self.statistic is not None:
            stat = self.statistic
            data.update(effect=stat.effect, interval=[stat.low, stat.high], tolerance=stat.tolerance,
                        scale=stat.scale, test=stat.test, alpha=stat.alpha, beta=stat.beta, samples=stat.samples,
                        detect=stat.detection)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "GateResult":
        statistic = None
        if data.get("test") is not None and data.get("interval") is not None:  # statistical gates only
            low, high = data["interval"]
            statistic = Verdict(data["verdict"], data["effect"], low, high, data["tolerance"], data["scale"],
                                data["test"], data["alpha"], data["beta"], data.get("samples") or 0, data.get("detect"))
        return cls(data["metric"], data["op"], data["threshold"], data.get("value"), data["passed"], statistic)


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
class CellTiming:
    """When one cell ran (UTC, ISO-8601) and where its time went. ``started_at``: the cell left the run's queue
    (its launch was asked for); ``ready_at``: rank 0 answered its health check; ``finished_at``: its result was
    decided. Queue seconds are the part of start→ready before the launcher's boot clock started (a scheduler's
    queue, image pulls, process start); boot seconds (``CellResult.boot_seconds``) the rest; measure seconds
    ready→finished (suites and gates). results.json carries these keys flat in the cell (CONTRACT extension)."""

    started_at: str | None = None
    ready_at: str | None = None
    finished_at: str | None = None
    queue_seconds: float | None = None
    measure_seconds: float | None = None
    seconds: float | None = None  # started→finished: what the cell cost its node(s)

    KEYS = ("started_at", "ready_at", "finished_at", "queue_seconds", "measure_seconds", "seconds")

    def to_dict(self) -> dict:
        return {key: getattr(self, key) for key in self.KEYS}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CellTiming | None":
        """The timing keys of a results.json cell; None for files written before cells were timed."""
        if not any(data.get(key) is not None for key in cls.KEYS):
            return None
        return cls(**{key: data.get(key) for key in cls.KEYS})


@dataclass(frozen=True)
class QuarantineEntry:
    """One entry of a quarantine file (matrices/quarantine.py): a cell glob, why, the ticket tracking it, and the last
    day it holds. A cell's result carries the entry that matched it (results.json key ``quarantine``), so every report
    names the ticket and the expiry; its label (``quarantined`` or ``quarantine_expired``) says whether it held."""

    cell: str  # glob over cell ids
    reason: str
    link: str  # the ticket
    expires: dt.date  # the last day it holds
    where: str  # file:line of the entry

    def active(self, today: dt.date) -> bool:
        return today <= self.expires

    def matches(self, cell_id: str) -> bool:
        return fnmatch.fnmatchcase(cell_id, self.cell)

    def to_dict(self) -> dict:
        return {"cell": self.cell, "reason": self.reason, "link": self.link, "expires": self.expires.isoformat(),
                "where": self.where}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "QuarantineEntry | None":
        if not data:
            return None
        return cls(data["cell"], data["reason"], data["link"], dt.date.fromisoformat(data["expires"]), data["where"])


@dataclass(frozen=True)
class CellResult:
    """One cell's outcome. ``exit_code`` is the cell's own (not serialized: read back from results.json it follows
    the status; results.json's ``infrastructure: true`` reads back as 3); ``run_exit_code`` is what it contributes to
    the run's (its own, unless a quarantine entry holds it)."""

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
    # What makes this measurement comparable with another of the same cell (results.json key "identity",
    # optional: files written before it still read).
    identity: CellIdentity | None = None
    # Each boot's metrics when the cell was measured on several (results.json key "boots"; `metrics`
    # then holds their pooled figures), and labels such as "flaky" (key "labels").
    boots: tuple[Mapping[str, float | None], ...] = ()
    labels: tuple[str, ...] = ()
    timing: CellTiming | None = None  # None: not run (or read from a file written before cells were timed)
    decided_by: str | None = None  # DECIDED_BY_RESOLVER: decided without a launch; None: launched (or not run)
    quarantine: QuarantineEntry | None = None  # the quarantine entry that matched it (held or expired: see labels)
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
        object.__setattr__(self, "boots", tuple(_frozen(boot) for boot in self.boots))
        object.__setattr__(self, "labels", tuple(self.labels))
        if self.exit_code is None:
            object.__setattr__(self, "exit_code", ExitCode.FELL_SHORT if self.status.failing else
                               ExitCode.INCONCLUSIVE if self.status is Status.INCONCLUSIVE else ExitCode.OK)

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
        if self.identity is not None:
            data["identity"] = self.identity.to_dict()
        if self.infrastructure:
            data["infrastructure"] = True
        if self.boots:
            data["boots"] = [dict(boot) for boot in self.boots]
        if self.labels:
            data["labels"] = list(self.labels)
        if self.timing is not None:
            data.update(self.timing.to_dict())
        if self.decided_by is not None:
            data["decided_by"] = self.decided_by
        if self.quarantine is not None:
            data["quarantine"] = self.quarantine.to_dict()
        return data

    @property
    def quarantined(self) -> bool:
        """Its quarantine entry held: it ran and is reported, but does not gate."""
        return QUARANTINED in self.labels

    @property
    def quarantine_expired(self) -> bool:
        """It matched a quarantine entry past its expiry: it gates again."""
        return QUARANTINE_EXPIRED in self.labels

    @property
    def gating(self) -> bool:
        """It makes the run red: a failing status, and not quarantined."""
        return self.status.failing and not self.quarantined

    @property
    def run_exit_code(self) -> ExitCode:
        """What it contributes to the run's exit code: its own, but nothing (0) while its quarantine holds, whether
        it failed (an infrastructure failure included: ``infrastructure`` still says so) or stayed inconclusive."""
        return ExitCode.OK if self.quarantined or self.exit_code is None else self.exit_code

    @property
    def infrastructure(self) -> bool:
        """It ended on the machine's trouble (launch timeout, engine unreachable, node lost), not the cell's."""
        return self.exit_code == ExitCode.INFRA

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CellResult":
        tests = data.get("tests")
        return cls(id=data["id"], config=data.get("config") or {}, expect=Expect.from_dict(data.get("expect") or {}),
                   runner=data.get("runner"), suites=data.get("suites") or {}, baseline=data.get("baseline"),
                   status=Status(data["status"]), error=data.get("error"), boot_seconds=data.get("boot_seconds"),
                   metrics=data.get("metrics") or {}, gates=tuple(GateResult.from_dict(g) for g in data.get("gates") or ()),
                   warnings=tuple(data.get("warnings") or ()), tests=None if tests is None else tuple(tests),
                   # "detail": what results.json called SGLang's rejection line before records existed
                   sglang_error=data.get("sglang_error") or data.get("detail"), gpqa=data.get("gpqa"),
                   boots=tuple(data.get("boots") or ()), labels=tuple(data.get("labels") or ()),
                   timing=CellTiming.from_dict(data), decided_by=data.get("decided_by"),
                   identity=CellIdentity.from_dict(data.get("identity")),
                   quarantine=QuarantineEntry.from_dict(data.get("quarantine")),
                   exit_code=ExitCode.INFRA if data.get("infrastructure") else None)


@dataclass(frozen=True)
class RunResults:
    run_id: str
    started_at: str | None
    finished_at: str | None
    launcher: str
    matrices: tuple[str, ...]
    cells: tuple[CellResult, ...] = ()
    interrupted: bool = False  # Ctrl-C / SIGTERM ended the run before it finished (finished_at stays None)
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
        return any(cell.gating for cell in self.cells)

    @property
    def complete(self) -> bool:
        """The run ended on its own and wrote its final files: not a snapshot taken while it went on (or left by a
        kill), not an interrupted run. Only a complete run can be green."""
        return self.finished_at is not None and not self.interrupted

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
