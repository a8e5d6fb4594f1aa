"""`dspark-ci run`'s flags are declared once (dspark_ci/run_flags.py): argparse, the printed rerun command and
RunOptions' defaults all come from that table, so a flag cannot be parsed and then lost from the rerun command."""

from __future__ import annotations

import argparse
import shlex

import pytest
from dspark_ci.ground.records import CellResult, Expect, RunResults, Status
from dspark_ci.launchers import catalog
from dspark_ci.reports.markdown import rerun_command

from dspark_ci.pipeline import RunOptions
from dspark_ci.run_flags import RUN_FLAGS, default
from dspark_ci.verbs import run as run_verb

CARRIED = [flag for flag in RUN_FLAGS if flag.rerun]


def parser() -> argparse.ArgumentParser:
    built = argparse.ArgumentParser(prog="dspark-ci run")
    run_verb.add_arguments(built)
    return built


def printed_rerun(args: argparse.Namespace) -> list[str]:
    """The command the report prints for the failed cells, read back as argv (without `dspark-ci run`)."""
    failed = CellResult(id="c1", config=None, expect=Expect(), status=Status.FAILED)
    results = RunResults(run_id="r", started_at=None, finished_at=None, launcher=args.launcher,
                         matrices=tuple(args.matrices), cells=(failed,), run_options=run_verb.rerun_options(args))
    command = rerun_command(results)
    assert command is not None
    words = shlex.split(command)
    assert words[:2] == ["dspark-ci", "run"]
    return words[2:]


@pytest.mark.parametrize("flag", CARRIED, ids=lambda f: f.flag)
def test_a_declared_run_flag_round_trips_through_the_printed_rerun_command(flag, monkeypatch):
    monkeypatch.delenv("DSPARK_SERVER", raising=False)
    assert flag.example is not None, f"{flag.flag}: declare an example value other than its default"
    given = parser().parse_args(["m.yaml", flag.flag, flag.example])
    assert getattr(given, flag.dest) != flag.default
    again = parser().parse_args(printed_rerun(given))
    assert getattr(again, flag.dest) == getattr(given, flag.dest)
    assert again.cell == ["c1"] and again.matrices == ["m.yaml"]


def test_defaults_are_not_repeated_and_an_environment_default_is(monkeypatch):
    monkeypatch.delenv("DSPARK_SERVER", raising=False)
    assert run_verb.rerun_options(parser().parse_args(["m.yaml"])) == ()
    monkeypatch.setenv("DSPARK_SERVER", "sglang")  # the rerun must not depend on the caller's environment
    assert run_verb.rerun_options(parser().parse_args(["m.yaml"])) == ("--server", "sglang")


def test_every_flag_the_parser_knows_is_declared_once():
    launcher_flags = {spec.option.flag for kind in catalog.ALL_LAUNCHERS for spec in kind.declared}
    declared = {name for flag in RUN_FLAGS for name in (flag.flag, *flag.also)}
    parsed = {name for action in parser()._actions for name in action.option_strings} - {"-h", "--help"}
    assert parsed == (declared - {"matrices"}) | launcher_flags
    assert len(declared) == sum(1 + len(flag.also) for flag in RUN_FLAGS)


def test_run_options_take_the_declared_defaults():
    options = RunOptions(matrices=("m.yaml",), run_id="r")
    for dest in ("launcher", "sglang_version", "rejections", "max_parallel"):
        assert getattr(options, dest) == default(dest)
