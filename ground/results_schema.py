"""The JSON Schema of results.json, generated from the records that write it (``dspark_ci.ground.records``,
``dspark_ci.ground.measurements``).

    python -m dspark_ci.ground.results_schema            # print it
    python -m dspark_ci.ground.results_schema --write    # rewrite docs/results.schema.json (tests check it is current)

Each record's properties come from its dataclass fields and their types. ``SHAPE`` says where a record's JSON
differs from its fields (what ``to_dict`` leaves out, writes inline, adds, writes as another type's JSON or as
one field's alone); which keys are always written is read off ``to_dict`` of the smallest record (``SMALLEST``),
so the schema follows the writer rather than a copy of it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import enum
import json
import sys
import types
import typing
from collections import abc
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dspark_ci.ground.identity import CellIdentity
from dspark_ci.ground.measurements import (
    Acceptance,
    AcceptCategory,
    AcceptDrift,
    AcceptPosition,
    BootMetrics,
    Envelope,
    EnvelopeBoundary,
    EnvelopePoint,
    GpqaSummary,
    GreedyShare,
    McSummary,
    PositionRate,
    SampledAcceptance,
    SuiteTestOutcome,
)
from dspark_ci.ground.position_homogeneity import PositionTest
from dspark_ci.ground.records import (
    SCHEMA,
    SCHEMA_VERSIONS,
    CellResult,
    CellTiming,
    Expect,
    GateResult,
    QuarantineEntry,
    RunResults,
)
from dspark_ci.ground.sglang.settings import CellConfig
from dspark_ci.ground.stats import INCONCLUSIVE, PASSED, REGRESSED, Verdict

SCHEMA_FILE = Path(__file__).resolve().parents[1] / "docs" / "results.schema.json"
Json = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Shape:
    """Where a record's JSON differs from its fields."""

    left_out: tuple[str, ...] = ()  # fields to_dict does not write
    inline: Mapping[str, type] = dataclasses.field(default_factory=dict)  # field -> record whose keys sit flat here
    added: Mapping[str, Json] = dataclasses.field(default_factory=dict)  # keys to_dict writes that are not fields
    written_as: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # field -> the type its JSON follows
    unwrap: str | None = None  # the record is written as this one field's JSON


SHAPE: dict[type, Shape] = {
    RunResults: Shape(added={"schema": {"const": SCHEMA}}),
    CellResult: Shape(left_out=("exit_code",), inline={"timing": CellTiming},
                      added={"infrastructure": {"const": True, "description": "it ended on the machine's trouble"}},
                      written_as={"config": CellConfig}),  # an unknown config (None) is written {}
    BootMetrics: Shape(unwrap="metrics"),
    GateResult: Shape(inline={"statistic": Verdict},
                      added={"verdict": {"enum": [PASSED, REGRESSED, INCONCLUSIVE]}}),
    Verdict: Shape(left_out=("verdict", "low", "high"),
                   added={"interval": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}}),
    CellIdentity: Shape(added={"hash": {"type": "string"}, "setup": {"type": "string"}}),
}

SMALLEST: dict[type, Callable[[], Any]] = {  # the record with nothing optional set: its to_dict's keys are required
    RunResults: lambda: RunResults("r", None, None, "local", ()),
    CellResult: lambda: CellResult("c", None, Expect()),
    GateResult: lambda: GateResult("m", ">=", 0.0, None, False),
    Expect: Expect,
    QuarantineEntry: lambda: QuarantineEntry("c", "r", "l", dt.date(2000, 1, 1), "w"),
    CellIdentity: lambda: CellIdentity(build="b"),
    CellTiming: CellTiming,
    SuiteTestOutcome: lambda: SuiteTestOutcome("n", "passed"),
    GpqaSummary: GpqaSummary,
    McSummary: McSummary,
    Acceptance: lambda: Acceptance({}, 0.0, ""),
    AcceptPosition: lambda: AcceptPosition(1, 0, 0, None, None),
    PositionRate: lambda: PositionRate(1, None),
    AcceptCategory: lambda: AcceptCategory(0, None),
    AcceptDrift: lambda: AcceptDrift(None, None, None, 0.0, 0, ""),
    SampledAcceptance: lambda: SampledAcceptance(0.0, None, None),
    GreedyShare: lambda: GreedyShare(0, 0, 0),
    PositionTest: lambda: PositionTest(0, 2, 2, 0, 0.0, 1, 1.0, 1.0, 0, 0.0, 0.0),
    EnvelopePoint: lambda: EnvelopePoint(1, 1, 1, None, None, None, None),
    EnvelopeBoundary: lambda: EnvelopeBoundary(None),
    Envelope: lambda: Envelope((), {}, "", ""),
    # Not here: CellConfig (a cell whose shard never reported writes {}; otherwise its `always` settings) and
    # Lossless (either measured or skipped), whose keys are not all written every time.
}

_SCALARS: dict[Any, Json] = {str: {"type": "string"}, bool: {"type": "boolean"}, int: {"type": "integer"},
                             float: {"type": "number"}, type(None): {"type": "null"}, Any: {},
                             dt.date: {"type": "string", "format": "date"}}


def results_schema() -> Json:
    """The JSON Schema (draft 2020-12) of the results.json this version writes."""
    defs: Json = {}
    root = _record(RunResults, defs)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": f"dspark-ci results.json, schema {SCHEMA}",
            "description": f"Generated by `python -m dspark_ci.ground.results_schema` from ground/records.py. "
                           f"Version {SCHEMA}: {SCHEMA_VERSIONS[SCHEMA]}.",
            **root, "$defs": dict(sorted(defs.items()))}


def _record(cls: type, defs: Json) -> Json:
    shape = SHAPE.get(cls, Shape())
    hints = {**typing.get_type_hints(cls), **shape.written_as}
    if shape.unwrap is not None:
        return _type(hints[shape.unwrap], defs)
    properties: Json = {}
    for field in dataclasses.fields(cls):
        if field.name in shape.left_out:
            continue
        if field.name in shape.inline:
            properties.update(_record(shape.inline[field.name], defs)["properties"])
        else:
            properties[field.name] = _type(hints[field.name], defs)
    properties.update(shape.added)
    required = list(SMALLEST[cls]().to_dict()) if cls in SMALLEST else []
    schema: Json = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    if shape.inline.get("statistic") is Verdict:  # a statistic is written all or none
        statistic = list(_record(Verdict, defs)["properties"])
        schema["dependentRequired"] = {"test": [key for key in statistic if key != "test"]}
    return schema


def _ref(cls: type, defs: Json) -> Json:
    if cls.__name__ not in defs:
        defs[cls.__name__] = {}  # placeholder: a record may refer to itself
        defs[cls.__name__] = (_record(cls, defs) if dataclasses.is_dataclass(cls)
                              else {"enum": [member.value for member in cls]})  # type: ignore[attr-defined]
    return {"$ref": f"#/$defs/{cls.__name__}"}


def _type(hint: Any, defs: Json) -> Json:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in _SCALARS:
        return dict(_SCALARS[hint])
    if origin in (typing.Union, types.UnionType):
        options = [_type(arg, defs) for arg in args]
        if all(list(option) == ["type"] for option in options):  # plain types: one "type" list reads better
            return {"type": [option["type"] for option in options]}
        return {"anyOf": options}
    if origin is tuple and len(args) > 1 and len(set(args)) == 1:  # a pair of one type, say: that many items
        return {"type": "array", "items": _type(args[0], defs), "minItems": len(args), "maxItems": len(args)}
    if origin in (tuple, list):
        return {"type": "array", "items": _type(args[0], defs) if args else {}}
    if origin in (dict, abc.Mapping) or hint in (dict, abc.Mapping):
        return {"type": "object", "additionalProperties": _type(args[1], defs) if args else {}}
    if isinstance(hint, type) and (dataclasses.is_dataclass(hint) or issubclass(hint, enum.Enum)):
        return _ref(hint, defs)
    raise TypeError(f"results.json schema: no JSON type for {hint!r}; add it to ground/results_schema.py")


def schema_text() -> str:
    return json.dumps(results_schema(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dspark_ci.ground.results_schema",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {SCHEMA_FILE.name} in docs/")
    args = parser.parse_args(argv)
    if args.write:
        SCHEMA_FILE.write_text(schema_text(), encoding="utf-8")
    else:
        sys.stdout.write(schema_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
