"""A launcher's own options, declared once (like nox's ``_options.py``): each is a field of the launcher's frozen
options record (``launchers/<kind>/options.py``) whose metadata says its flag, environment variable, help and
check. ``dspark-ci run``'s argparse flags and the rerun command derive from it, and the launcher reads it as is::

    @dataclass(frozen=True)
    class SlurmOptions:
        partition: str | None = option(None, "--slurm-partition", "Slurm partition", env="DSPARK_SLURM_PARTITION")

A value comes from the command line, else the option's environment variable, else the field's default; text is
checked and converted by the option's ``parse`` (a ``ValueError`` is the reason it is refused: exit 2, the flag
named, before anything is launched).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from dspark_ci.ground.errors import BadInput

Record = TypeVar("Record")


@dataclass(frozen=True)
class Option:
    flag: str  # e.g. "--hosts"
    help: str
    env: str | None = None  # read when the flag is not given
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    repeatable: bool = False  # may be given several times (a tuple of values)
    parse: Callable[[str], Any] | None = None  # text -> value; ValueError(reason) refuses it
    example: str | None = None  # shown with a refused value


def option(default: Any, flag: str, help: str, **facts: Any) -> Any:
    """One field of an options record: its default, and the ``Option`` that says how it is given."""
    return dataclasses.field(default=default, metadata={"option": Option(flag, help, **facts)})


@dataclass(frozen=True)
class Declared:
    field: str  # the record's field
    option: Option
    default: Any

    @property
    def dest(self) -> str:
        """Where argparse keeps it: the flag's name (unique over every launcher's flags)."""
        return self.option.flag.lstrip("-").replace("-", "_")


def declared(record: type) -> tuple[Declared, ...]:
    return tuple(Declared(f.name, f.metadata["option"], f.default) for f in dataclasses.fields(record)
                 if "option" in f.metadata)


def _checked(spec: Declared, value: Any) -> Any:
    option = spec.option
    if option.repeatable:
        return tuple(_checked(dataclasses.replace(spec, option=dataclasses.replace(option, repeatable=False)), item)
                     for item in value)
    if option.choices and value not in option.choices:
        raise BadInput(option.flag, f"{value!r} is not one of {', '.join(option.choices)}")
    if option.parse is None or not isinstance(value, str):
        return value
    try:
        return option.parse(value)
    except ValueError as err:
        raise BadInput(f"{option.flag} {value}", str(err), f"e.g. {option.flag} {option.example}"
                       if option.example else "") from None


def from_values(record: type[Record], given: Mapping[str, Any], env: Mapping[str, str]) -> Record:
    """The options record from what the command line gave (by argparse dest, ``Declared.dest``; None or empty: not
    given), the environment, and the defaults; every value checked here, once."""
    values = {}
    for spec in declared(record):
        value = given.get(spec.dest)
        if value in (None, [], ()) and spec.option.env:
            value = env.get(spec.option.env) or None
        values[spec.field] = spec.default if value in (None, [], ()) else _checked(spec, value)
    return record(**values)


MAX_SECONDS = 7 * 24 * 3600.0


def seconds(text: str) -> float:
    """A positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{text} is not a positive number of seconds")
    if value > MAX_SECONDS:  # a typo that would wait for ever
        raise ValueError(f"{text} seconds is more than a week (at most {MAX_SECONDS:g})")
    return value
