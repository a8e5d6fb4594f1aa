"""What a cell's suites measured beyond its pooled metrics, as frozen records that ``CellResult`` carries: each suite
test's outcome, each boot's figures, how the GPQA and multiple-choice figures were produced, acceptance in detail, and
where speculation pays.

The suites write these into their output file (suites/output.py) from a pytest process of their own;
``dspark_ci.suite_runner`` reads that file into these records, and results.json / results.jsonl carry them: ``to_dict``
and ``from_dict`` are called by ``dspark_ci.ground.records``' writer and reader (and the suites' runner) only. Each
``to_dict`` writes its keys in the order the suites write them, so a results.json reads back and writes out byte for
byte. ``from_dict`` is lenient with keys a file leaves out (older files), never with the shapes it does carry.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from dspark_ci.ground.position_homogeneity import PositionTest

TEST_OUTCOMES = ("passed", "failed", "skipped", "error")  # a suite test's outcome, as pytest's junitxml names them
FAILED_OUTCOMES = ("failed", "error")


def _freeze(value: Any) -> Any:
    """A JSON value made read-only all the way down: objects become read-only mappings, arrays tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({key: _freeze(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(item) for item in value)
    return value


def _thaw(value: Any) -> Any:
    """``_freeze`` undone: what ``json.dumps`` writes."""
    if isinstance(value, Mapping):
        return {key: _thaw(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [_thaw(item) for item in value]
    return value


def _plain(record: Any) -> dict:
    """A record of scalars as its JSON object, keys in field order."""
    return {f.name: getattr(record, f.name) for f in fields(record)}


@dataclass(frozen=True)
class SuiteTestOutcome:
    """One suite test as pytest ended it (suites/conftest.py), e.g. ``suites/test_speed.py::test_speed`` passed."""

    nodeid: str
    outcome: str  # one of TEST_OUTCOMES
    duration: float = 0.0  # seconds, setup to teardown
    message: str | None = None  # why it failed, errored or was skipped

    @property
    def failed(self) -> bool:
        return self.outcome in FAILED_OUTCOMES

    @property
    def suite(self) -> str:
        """The suite it belongs to: ``suites/test_gpqa.py::test_gpqa`` -> ``gpqa``."""
        return Path(self.nodeid.split("::")[0]).stem.removeprefix("test_")

    @property
    def line(self) -> str:
        """``nodeid: message`` (its outcome when it left no message), as reports list a failed test."""
        return f"{self.nodeid}: {self.message or self.outcome}"

    def to_dict(self) -> dict:
        return _plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SuiteTestOutcome:
        return cls(data["nodeid"], data["outcome"], data.get("duration") or 0.0, data.get("message"))


@dataclass(frozen=True)
class BootMetrics:
    """One boot's figures, when a cell was measured on several boots (``CellResult.metrics`` then pools them). In
    results.json each boot is its metrics object itself: metric name -> value (null: not measured)."""

    metrics: Mapping[str, float | None]

    def __post_init__(self):
        object.__setattr__(self, "metrics", MappingProxyType(dict(self.metrics)))

    def value(self, metric: str) -> float | None:
        return self.metrics.get(metric)

    def to_dict(self) -> dict:
        return dict(self.metrics)

    @classmethod
    def from_dict(cls, data: Mapping[str, float | None]) -> BootMetrics:
        return cls(data)


@dataclass(frozen=True)
class GpqaSummary:
    """How the GPQA figure was produced (the gpqa suite's summary record): the report names the scorer and marks a
    partial figure; a gate on GPQA pairs its questions (``per_question``) with the baseline's."""

    scorer: str = "sglang"
    partial: bool = False  # the suites were stopped before every sample was scored: shown, never gated
    samples: int | None = None  # samples scored (pooled over boots: all of them)
    planned_samples: int | None = None
    accuracy: float | None = None
    cli_differences: tuple[str, ...] = ()  # request settings the run sent unlike the scorer's own CLI
    # question id -> (right, asked); none for a partial figure (never gated, so neither are its questions)
    per_question: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "cli_differences", tuple(self.cli_differences))
        object.__setattr__(self, "per_question", MappingProxyType(
            {question: (int(right), int(asked)) for question, (right, asked) in self.per_question.items()}))

    def to_dict(self) -> dict:
        data = {"scorer": self.scorer, "partial": self.partial, "samples": self.samples,
                "planned_samples": self.planned_samples, "accuracy": self.accuracy,
                "cli_differences": list(self.cli_differences)}
        if self.per_question:
            data["per_question"] = {question: list(tally) for question, tally in self.per_question.items()}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpqaSummary:
        return cls(data.get("scorer") or "sglang", bool(data.get("partial")), data.get("samples"),
                   data.get("planned_samples"), data.get("accuracy"), tuple(data.get("cli_differences") or ()),
                   data.get("per_question") or {})


@dataclass(frozen=True)
class McSummary:
    """How the log-likelihood multiple-choice figure was produced (the mc suite's summary record): a partial figure is
    marked; a gate on MC pairs its items (``per_item``) with the baseline's; accuracy per kind of item."""

    partial: bool = False  # the suites were stopped before every item was scored: shown, never gated
    items: int | None = None  # items scored (pooled over boots: all of them)
    planned_items: int | None = None
    accuracy: float | None = None
    # category -> (right, items)
    per_category: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    # item id -> (right, asked); none for a partial figure (never gated, so neither are its items)
    per_item: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def __post_init__(self):
        for name in ("per_category", "per_item"):
            object.__setattr__(self, name, MappingProxyType(
                {key: (int(right), int(asked)) for key, (right, asked) in getattr(self, name).items()}))

    def to_dict(self) -> dict:
        data = {"partial": self.partial, "items": self.items, "planned_items": self.planned_items,
                "accuracy": self.accuracy,
                "per_category": {key: list(tally) for key, tally in self.per_category.items()}}
        if self.per_item:
            data["per_item"] = {key: list(tally) for key, tally in self.per_item.items()}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> McSummary:
        return cls(bool(data.get("partial")), data.get("items"), data.get("planned_items"), data.get("accuracy"),
                   data.get("per_category") or {}, data.get("per_item") or {})


# --- Acceptance in detail (the accept suite's accept_detail record; CONTRACT.md "acceptance") ---


@dataclass(frozen=True)
class AcceptPosition:
    """Draft position k over the workload: accepted of proposed verify steps (suites/accept_detail.py)."""

    position: int
    accepted: int
    proposed: int
    rate: float | None
    stderr: float | None  # per request; None with a single request

    def to_dict(self) -> dict:
        return _plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AcceptPosition:
        return cls(data["position"], data.get("accepted", 0), data.get("proposed", 0), data.get("rate"),
                   data.get("stderr"))


@dataclass(frozen=True)
class PositionRate:
    """Draft position k's acceptance within one category: the rate only."""

    position: int
    rate: float | None

    def to_dict(self) -> dict:
        return _plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PositionRate:
        return cls(data["position"], data.get("rate"))


@dataclass(frozen=True)
class AcceptCategory:
    """One prompt category's acceptance (code, math, long_context, ...)."""

    requests: int
    accept_length: float | None
    positions: tuple[PositionRate, ...] = ()
    accept_length_histogram: Mapping[str, int] = field(default_factory=dict)  # tokens per step -> verify steps

    def __post_init__(self):
        object.__setattr__(self, "positions", tuple(self.positions))
        object.__setattr__(self, "accept_length_histogram", MappingProxyType(dict(self.accept_length_histogram)))

    def to_dict(self) -> dict:
        return {"requests": self.requests, "accept_length": self.accept_length,
                "positions": [p.to_dict() for p in self.positions],
                "accept_length_histogram": dict(self.accept_length_histogram)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AcceptCategory:
        return cls(data.get("requests", 0), data.get("accept_length"),
                   tuple(PositionRate.from_dict(p) for p in data.get("positions") or ()),
                   data.get("accept_length_histogram") or {})


def _categories(data: Mapping[str, Any] | None) -> Mapping[str, AcceptCategory]:
    return {name: AcceptCategory.from_dict(info) for name, info in (data or {}).items()}


@dataclass(frozen=True)
class AcceptDrift:
    """Where per-request accept length changed level along the order the requests were sent (``change_at_request``
    None: no change found)."""

    change_at_request: int | None
    before: float | None
    after: float | None
    noise: float
    requests: int
    method: str
    series: tuple[float, ...] = ()  # accept length per request, in sent order

    def __post_init__(self):
        object.__setattr__(self, "series", tuple(self.series))

    def to_dict(self) -> dict:
        return {**_plain(self), "series": list(self.series)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AcceptDrift:
        return cls(data.get("change_at_request"), data.get("before"), data.get("after"), data.get("noise", 0.0),
                   data.get("requests", 0), data.get("method", ""), tuple(data.get("series") or ()))


@dataclass(frozen=True)
class SampledAcceptance:
    """The same workload at the sampled setting (temperature, top_p)."""

    temperature: float
    top_p: float | None
    accept_length: float | None
    positions: tuple[AcceptPosition, ...] = ()
    categories: Mapping[str, AcceptCategory] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "positions", tuple(self.positions))
        object.__setattr__(self, "categories", MappingProxyType(dict(self.categories)))

    def to_dict(self) -> dict:
        return {"temperature": self.temperature, "top_p": self.top_p, "accept_length": self.accept_length,
                "positions": [p.to_dict() for p in self.positions],
                "categories": {name: c.to_dict() for name, c in self.categories.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SampledAcceptance:
        return cls(data["temperature"], data.get("top_p"), data.get("accept_length"),
                   tuple(AcceptPosition.from_dict(p) for p in data.get("positions") or ()),
                   _categories(data.get("categories")))


@dataclass(frozen=True)
class GreedyShare:
    """Of ``samples`` samples on one server, how many began with the greedy text (``failed``: samples not answered)."""

    greedy_like: int
    samples: int
    failed: int

    def to_dict(self) -> dict:
        return _plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GreedyShare:
        return cls(data["greedy_like"], data["samples"], data.get("failed", 0))


@dataclass(frozen=True)
class Lossless:
    """Sampled losslessness: the same prompts sampled with speculation and on the reference without it. Either
    measured (every field but ``skipped``) or ``skipped`` with the reason (then nothing else is written)."""

    skipped: str | None = None
    prompts: int | None = None
    tokens: int | None = None  # the first tokens compared with the greedy text
    temperature: float | None = None
    top_p: float | None = None
    speculative: GreedyShare | None = None  # draws equal to the greedy text (a figure, not the test)
    reference: GreedyShare | None = None
    greedy_equal: int | None = None  # prompts whose greedy output is the same on both
    # The test of losslessness (ground/position_homogeneity.py): draws per prompt and side (the smaller side's
    # fewest), the tests per prompt and generated position with their p-values, the positions left untested, and the
    # family's p (min(1, m · min p)); the gate reads it at the run's alpha.
    samples: int | None = None
    family_p: float | None = None
    untested: int | None = None
    positions: tuple[PositionTest, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "positions", tuple(self.positions))

    def to_dict(self) -> dict:
        if self.skipped is not None:
            return {"skipped": self.skipped}
        return {"prompts": self.prompts, "tokens": self.tokens, "temperature": self.temperature, "top_p": self.top_p,
                "speculative": None if self.speculative is None else self.speculative.to_dict(),
                "reference": None if self.reference is None else self.reference.to_dict(),
                "greedy_equal": self.greedy_equal, **self._test_dict()}

    def _test_dict(self) -> dict:
        """The per-position test's keys, where it ran (files written before it have none)."""
        if self.samples is None:
            return {}
        return {"samples": self.samples, "family_p": self.family_p, "untested": self.untested,
                "positions": [test.to_dict() for test in self.positions]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Lossless:
        if data.get("skipped"):
            return cls(skipped=data["skipped"])
        shares = {side: GreedyShare.from_dict(data[side]) if data.get(side) else None
                  for side in ("speculative", "reference")}
        return cls(None, data.get("prompts"), data.get("tokens"), data.get("temperature"), data.get("top_p"),
                   greedy_equal=data.get("greedy_equal"), samples=data.get("samples"), family_p=data.get("family_p"),
                   untested=data.get("untested"),
                   positions=tuple(PositionTest(**test) for test in data.get("positions") or ()), **shares)


@dataclass(frozen=True)
class Acceptance:
    """A speculative cell's acceptance per draft position and category, its drift within the run and sampled
    losslessness (results.json key ``acceptance``; suites/accept_detail.py says how each is measured)."""

    # The workload as its dataset describes itself (source, sha256, rows, ...: its keys are the dataset's own).
    workload: Mapping[str, Any]
    temperature: float
    positions_source: str  # where per-position figures came from, or why there are none
    positions: tuple[AcceptPosition, ...] = ()
    accept_length_histogram: Mapping[str, int] = field(default_factory=dict)  # tokens per step -> verify steps
    categories: Mapping[str, AcceptCategory] = field(default_factory=dict)
    drift: AcceptDrift | None = None
    sampled: SampledAcceptance | None = None  # None: greedy only
    lossless: Lossless | None = None  # None: not asked for

    def __post_init__(self):
        object.__setattr__(self, "workload", _freeze(self.workload))
        object.__setattr__(self, "positions", tuple(self.positions))
        object.__setattr__(self, "accept_length_histogram", MappingProxyType(dict(self.accept_length_histogram)))
        object.__setattr__(self, "categories", MappingProxyType(dict(self.categories)))

    def to_dict(self) -> dict:
        data = {"workload": _thaw(self.workload), "temperature": self.temperature,
                "positions_source": self.positions_source, "positions": [p.to_dict() for p in self.positions],
                "accept_length_histogram": dict(self.accept_length_histogram),
                "categories": {name: c.to_dict() for name, c in self.categories.items()},
                "drift": None if self.drift is None else self.drift.to_dict()}
        if self.sampled is not None:
            data["sampled"] = self.sampled.to_dict()
        if self.lossless is not None:
            data["lossless"] = self.lossless.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Acceptance:
        drift, sampled, lossless = data.get("drift"), data.get("sampled"), data.get("lossless")
        return cls(data.get("workload") or {}, data.get("temperature", 0.0), data.get("positions_source") or "",
                   tuple(AcceptPosition.from_dict(p) for p in data.get("positions") or ()),
                   data.get("accept_length_histogram") or {}, _categories(data.get("categories")),
                   AcceptDrift.from_dict(drift) if drift else None,
                   SampledAcceptance.from_dict(sampled) if sampled else None,
                   Lossless.from_dict(lossless) if lossless else None)


# --- Where speculation pays (the speed suite's sweep; CONTRACT.md "envelope") ---


@dataclass(frozen=True)
class EnvelopePoint:
    """One point of the sweep: the same requests at ``concurrency`` and ``input_len`` tokens on both servers."""

    concurrency: int
    input_len: int
    requests: int
    tpot_ms_speculative: float | None
    tpot_ms_reference: float | None
    speedup: float | None  # median TPOT without speculation / with it
    speedup_stderr: float | None  # by bootstrap over requests

    def to_dict(self) -> dict:
        return _plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EnvelopePoint:
        return cls(data["concurrency"], data["input_len"], data.get("requests", 0),
                   data.get("tpot_ms_speculative"), data.get("tpot_ms_reference"), data.get("speedup"),
                   data.get("speedup_stderr"))


@dataclass(frozen=True)
class EnvelopeBoundary:
    """Where the speedup falls to 1 along concurrency, at one input length; ``censored``: every point pays, so it
    lies beyond the grid (``concurrency`` is then the grid's largest)."""

    concurrency: float | None  # None: no point at this length measured a speedup
    censored: bool = False

    def to_dict(self) -> dict:
        return _plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EnvelopeBoundary:
        return cls(data.get("concurrency"), bool(data.get("censored")))


def crossing(row: list[tuple[int, float]]) -> tuple[float | None, bool]:
    """Where a speedup along concurrency falls to 1: ``row`` is (concurrency, speedup) in increasing concurrency.
    Interpolated linearly in log concurrency between the last point that pays and the first that does not; 0 when
    the first point does not pay; (the largest concurrency, censored) when every point pays; None without points.
    One rule for the sweep's boundary (suites/envelope.py) and for its interval in the envelope gate."""
    if not row:
        return None, False
    if row[0][1] < 1:
        return 0.0, False
    for (c_pays, s_pays), (c_not, s_not) in zip(row, row[1:], strict=False):
        if s_pays >= 1 > s_not:
            a, b = math.log(c_pays), math.log(c_not)
            return math.exp(a + (s_pays - 1) / (s_pays - s_not) * (b - a)), False
    return float(row[-1][0]), True


@dataclass(frozen=True)
class Envelope:
    """Where speculation pays: the speedup per (concurrency, input length) and the boundary per input length
    (results.json key ``envelope``; suites/envelope.py measures it)."""

    points: tuple[EnvelopePoint, ...]
    boundaries: Mapping[str, EnvelopeBoundary]  # input length (written as text: a JSON object's key) -> boundary
    dataset: str
    method: str

    def __post_init__(self):
        object.__setattr__(self, "points", tuple(self.points))
        object.__setattr__(self, "boundaries", MappingProxyType(dict(self.boundaries)))

    def row(self, input_len: int) -> tuple[EnvelopePoint, ...]:
        """The points measured at ``input_len`` that have a speedup, in increasing concurrency."""
        return tuple(sorted((p for p in self.points if p.input_len == input_len and p.speedup is not None),
                            key=lambda p: p.concurrency))

    @property
    def shortest_input_len(self) -> int | None:
        """The input length speculation_boundary_concurrency is read at (None: no points)."""
        return min((p.input_len for p in self.points), default=None)

    def to_dict(self) -> dict:
        return {"points": [p.to_dict() for p in self.points],
                "boundaries": {length: b.to_dict() for length, b in self.boundaries.items()},
                "dataset": self.dataset, "method": self.method}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Envelope:
        return cls(tuple(EnvelopePoint.from_dict(p) for p in data.get("points") or ()),
                   {length: EnvelopeBoundary.from_dict(b) for length, b in (data.get("boundaries") or {}).items()},
                   data.get("dataset") or "", data.get("method") or "")
