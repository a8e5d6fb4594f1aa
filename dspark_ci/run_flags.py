"""``dspark-ci run``'s own flags, each declared once (like nox's ``OptionSet``): its flag, default, help, how argparse
reads it and whether the printed rerun command carries it. argparse (``add_run_flags``), the rerun command's flags
and their defaults (``RERUN_FLAGS``, ``RERUN_DEFAULTS``) and ``pipeline.RunOptions``' defaults derive from
``RUN_FLAGS``; the launchers' own options are declared in their records (``launchers/<kind>/options.py``).

A flag the rerun command carries is repeated when its value differs from its declared default (a default read from
the environment, like ``--server``'s ``DSPARK_SERVER``, is carried: the rerun must not depend on it).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dspark_ci.evidence import MAX_BOOTS
from dspark_ci.ground.sglang.release import DEFAULT_VERSION
from dspark_ci.ground.suites import KNOWN_SUITES
from dspark_ci.launchers import catalog
from dspark_ci.launchers.contract import SERVERS
from dspark_ci.launchers.optionset import seconds
from dspark_ci.matrices.shipped import matrix_path

# Upper bounds of the run's own numbers: past them a value is a typo that would wait for ever.
MAX_COUNT = 10_000  # cells in flight, boots: never more than a matrix's cells (matrices/README.md)


def argparse_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An option's check as argparse's ``type``: a refused value is exit 2, the flag named, before anything runs."""
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    convert.__name__ = parse.__name__  # argparse names the type in its message
    return convert


positive_seconds = argparse_type(seconds)


def non_negative_count(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if count < 0 or count > 64:
        raise argparse.ArgumentTypeError(f"{text} is out of range (0 to 64)")
    return count


def positive_count(text: str) -> int:
    """A whole number ≥ 1 (argparse turns the error into exit 2 before anything is launched)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (e.g. 4)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of cells (e.g. 4)")
    if value > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{text} is more than {MAX_COUNT:,} (a matrix's most cells)")
    return value


@dataclass(frozen=True)
class RunFlag:
    flag: str  # "--max-boots"; a positional's name ("matrices")
    help: str
    default: Any = None
    rerun: bool = True  # the printed rerun command repeats it (when it differs from ``default``)
    example: str | None = None  # a value other than the default (the rerun test gives it)
    env: str | None = None  # the default's environment variable (read when the parser is built)
    also: tuple[str, ...] = ()  # other spellings ("-q")
    exclusive: str | None = None  # flags sharing this name are mutually exclusive
    argparse: Mapping[str, Any] = field(default_factory=dict)  # type, choices, metavar, action, nargs

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


RUN_FLAGS: tuple[RunFlag, ...] = (
    RunFlag("matrices", "matrix YAML files, or a shipped matrix's name (dspark-ci matrices)", rerun=False,
            argparse={"nargs": "+", "metavar": "MATRIX", "type": matrix_path}),
    RunFlag("--cell", "run only this cell (repeatable)", default=[], rerun=False,  # the rerun sets its own
            argparse={"action": "append", "metavar": "ID"}),
    RunFlag("--launcher", "; ".join(f"{kind.name}: {kind.help}" for kind in catalog.ALL_LAUNCHERS), default="local",
            example="docker", argparse={"choices": catalog.NAMES}),
    RunFlag("--suites", f"comma-separated, from {', '.join(KNOWN_SUITES)} (default: each cell's own suites)",
            example="gpqa,speed", argparse={"metavar": "LIST"}),
    RunFlag("--out", "run directory (default runs/<run-id>/)", rerun=False,  # would overwrite this run
            argparse={"type": Path, "metavar": "DIR"}),
    RunFlag("--force", "write into an --out directory that already holds files (the run files in it are replaced, "
            "other files are left as they are)", default=False, rerun=False, argparse={"action": "store_true"}),
    RunFlag("--baseline", "baseline file for every cell (default: each cell's own)", example="b.yaml",
            argparse={"metavar": "FILE"}),
    RunFlag("--max-boots", "boots a cell may use when a statistical gate is inconclusive: looks after 1, 2, 4, ... "
            f"boots, only the undecided suites again (default {MAX_BOOTS}; 1: never boot again)", default=MAX_BOOTS,
            example="2", argparse={"type": positive_count, "metavar": "N"}),
    RunFlag("--retries", "run a failed cell again up to N times; a cell that fails then passes stays failed, "
            "labelled flaky (default 0)", default=0, example="2",
            argparse={"type": non_negative_count, "metavar": "N"}),
    RunFlag("--accept-inconclusive", "exit 0 when the worst outcome is an inconclusive statistical gate (default: "
            "exit 4); never for release qualification, which demands conclusive passes", default=False, rerun=False,
            argparse={"action": "store_true"}),
    RunFlag("--server", "server under test: the embedded simulated SGLang server (default), real SGLang, or SGLang "
            f"{DEFAULT_VERSION}'s own front end in front of the simulated engine (sglang-frontend: `bash "
            ".ci/sglang-frontend.sh`, --launcher local), or SGLang's real engine on this CPU serving a tiny Llama "
            "(sglang-engine: `bash .ci/sglang-engine.sh`)", default="sim", env="DSPARK_SERVER", example="sglang",
            argparse={"choices": SERVERS}),
    RunFlag("--sglang-version", "SGLang version under test, matched against each expectation's version spec",
            default=DEFAULT_VERSION, example="0.5.22"),
    RunFlag("--quiet", "print only cells that did not pass and the run's last lines", default=False, rerun=False,
            also=("-q",), exclusive="shown", argparse={"action": "store_true"}),
    RunFlag("--verbose", "every stage and every suite's progress as a plain line, even on a terminal", default=False,
            rerun=False, also=("-v",), exclusive="shown", argparse={"action": "store_true"}),
    RunFlag("--boot-timeout", "how long rank 0 may take to become healthy (default 60 for the simulator, 600 for "
            "sglang-frontend and sglang-engine, 1800 for SGLang)", example="90", argparse={"type": positive_seconds,
                                                                       "metavar": "SECONDS"}),
    RunFlag("--rejections", "how expected rejections are decided: launch each one (default: release qualification), "
            "or let SGLang's own resolver decide on this CPU those it can tell from the arguments alone (nothing "
            "launched for them; hardware-bound ones still launch; needs DSPARK_SGLANG_PYTHON or `bash "
            ".ci/sglang-resolver.sh`)", default="launch", example="resolver",
            argparse={"choices": ("launch", "resolver")}),
    RunFlag("--quarantine", "cells that run and are reported but do not gate until their expiry (default: "
            "../baselines/quarantine.yaml from the first matrix, as matrices name their baselines; "
            "matrices/quarantine.py)", example="q.yaml", argparse={"metavar": "FILE"}),
    RunFlag("--max-parallel", "cells in flight at once, longest first (default: what the launcher has room for: the "
            "Slurm partition's nodes, the Kubernetes namespace's pod quota; 1 for local and docker)", example="3",
            argparse={"type": positive_count, "metavar": "N"}),
)
BY_DEST: Mapping[str, RunFlag] = {flag.dest: flag for flag in RUN_FLAGS}
# The options a rerun repeats (not --cell, which it sets, nor --out, which would overwrite this run).
RERUN_FLAGS: tuple[tuple[str, str], ...] = tuple((f.flag, f.dest) for f in RUN_FLAGS if f.rerun)
RERUN_DEFAULTS: Mapping[str, Any] = {f.dest: f.default for f in RUN_FLAGS if f.rerun}


def default(dest: str) -> Any:
    """A run flag's declared default (``pipeline.RunOptions`` takes its defaults from here)."""
    return BY_DEST[dest].default


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    groups: dict[str, Any] = {}
    for flag in RUN_FLAGS:
        if flag.exclusive is not None and flag.exclusive not in groups:
            # one group per name: an extra empty group makes argparse's usage line (and so --help) raise
            groups[flag.exclusive] = parser.add_mutually_exclusive_group()
        target = parser if flag.exclusive is None else groups[flag.exclusive]
        kwargs = dict(flag.argparse)
        if flag.flag.startswith("-") and "store_true" != kwargs.get("action"):
            kwargs["default"] = os.environ.get(flag.env, flag.default) if flag.env else flag.default
        target.add_argument(flag.flag, *flag.also, help=flag.help, **kwargs)
