"""dspark-ci run: launch each selected cell, run the suites against it, gate, write the run directory."""

from __future__ import annotations

import argparse
import os
import platform
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from packaging.version import InvalidVersion, Version

from dspark_ci import pipeline, progress
from dspark_ci.evidence import Sampling
from dspark_ci.ground import interrupts
from dspark_ci.ground.errors import BadInput
from dspark_ci.ground.run_id import new_run_id
from dspark_ci.ground.sglang.release import DEFAULT_VERSION
from dspark_ci.ground.suites import KNOWN_SUITES
from dspark_ci.input_checks import check_before_launch
from dspark_ci.launchers import catalog
from dspark_ci.launchers.contract import SIMULATED_SERVERS, LaunchContext
from dspark_ci.matrices.quarantine import Quarantine, default_path, load_quarantine
from dspark_ci.run_flags import RERUN_DEFAULTS, RERUN_FLAGS, add_run_flags, argparse_type
from dspark_ci.suite_runner import MC_ITEMS, SYNTHETIC_GPQA
from dspark_ci.suites.prompts import PROMPTS

EXIT_CODES = """exit codes: 0 every selected cell has an outcome and passed (or was rejected as expected; skipped cells
count only beside measured ones); 1 a gate failed, a cell crashed, errored, was never reached, a rejection was not
the expected one, or nothing was measured (every cell skipped); 2 bad input (matrix, flag, baseline: the message names
file:line and the fix; nothing is launched); 3 infrastructure trouble (launch timeout, Docker engine, disk);
4 nothing fell short but a statistical gate was inconclusive (no real regression beyond its tolerance shown, its
detection line not ruled out: neither green nor red; --accept-inconclusive makes that 0, which a release
qualification must not pass).
Ctrl-C or SIGTERM: everything started is torn down, results.json keeps what was measured, exit 130."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXIT_CODES
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_run_flags(parser)
    for kind in catalog.ALL_LAUNCHERS:
        # checked when the launcher is built (dspark_ci.launchers.optionset.from_values): exit 2
        for spec in kind.declared:
            option = spec.option
            default = "" if spec.default in (None, ()) else f"; default {spec.default}"
            checked: dict[str, Any] = {"type": argparse_type(option.parse)} if option.parse else {}
            parser.add_argument(option.flag, dest=spec.dest, metavar=option.metavar, choices=option.choices,
                                action="append" if option.repeatable else "store", **checked,
                                help=f"{option.help} ({kind.name} launcher{default})")


def _suites(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in KNOWN_SUITES]
    if not names:
        raise BadInput(f"--suites {text!r}", "names no suite",
                       f"give a comma-separated list from {', '.join(KNOWN_SUITES)}, or leave --suites out for each "
                       "cell's own")
    if unknown:
        raise BadInput(f"--suites {text}", f"unknown suite {unknown[0]}", f"choose from {', '.join(KNOWN_SUITES)}")
    twice = next((n for index, n in enumerate(names) if n in names[:index]), None)
    if twice:
        raise BadInput(f"--suites {text}", f"names {twice} twice", "name each suite once")
    return names


def _check_launcher_options(args: argparse.Namespace) -> None:
    """An option of another launcher than the one chosen would be ignored: refuse it instead (a --hosts file
    given to the local launcher is a run the user did not mean)."""
    for kind in catalog.ALL_LAUNCHERS:
        if kind.name == args.launcher:
            continue
        for spec in kind.declared:
            if getattr(args, spec.dest, None) not in (None, [], (), spec.default):
                flag = spec.option.flag
                raise BadInput(flag, f"is an option of the {kind.name} launcher, and this run uses "
                               f"--launcher {args.launcher}", f"add --launcher {kind.name}, or drop {flag}")


def _caller_env(server: str, sglang_version: str) -> dict:
    env = dict(os.environ)
    if server in SIMULATED_SERVERS:
        env.setdefault("DSPARK_SIM_GPQA_PATH", str(SYNTHETIC_GPQA))
        env.setdefault("DSPARK_SIM_MC_PATH", str(MC_ITEMS))  # the mc suite's items, whose answers the simulator knows
        env.setdefault("DSPARK_SIM_VERSION", sglang_version)  # the simulator is the version under test
    if server == "sglang-frontend":  # the suites' prompts reach the simulated engine as the simulator reads them
        from dspark_ci.sglang_sim.frontend.launch import VOCABULARY_ENV  # on use: the front end's stack (asyncio, ssl)
        from dspark_ci.suites.speed import WORDS as SPEED_WORDS  # on use: the speed suite's stack (aiohttp) costs 0.4 s

        env.setdefault(VOCABULARY_ENV, "\n".join((*PROMPTS, " ".join(SPEED_WORDS))))
    return env


def _gpqa_dataset(dataset: str) -> Callable[[dict], dict]:
    """Suite defaults under the simulator, which answers GPQA from the dataset it is given: the same file."""
    def defaults(options: dict) -> dict:
        if "gpqa" in options and not options["gpqa"].get("dataset"):
            options["gpqa"]["dataset"] = dataset
        return options
    return defaults


def _version(text: str) -> str:
    try:
        Version(text)
    except InvalidVersion:
        raise BadInput(f"--sglang-version {text}", "not a version number",
                       f"e.g. --sglang-version {DEFAULT_VERSION}") from None
    return text


def rerun_options(args: argparse.Namespace) -> tuple[str, ...]:
    """Every option given to this run that differs from its default, as command-line words."""
    flags = RERUN_FLAGS + tuple((s.option.flag, s.dest) for kind in catalog.ALL_LAUNCHERS for s in kind.declared)
    words: list[str] = []
    for flag, dest in flags:
        value = getattr(args, dest, None)
        if value is None or value == RERUN_DEFAULTS.get(dest):
            continue
        for item in value if isinstance(value, list) else [value]:
            words += [flag, f"{item:g}" if isinstance(item, float) else str(item)]
    return tuple(words)


# Default --boot-timeout per server: SGLang's front end on a busy 2-core CPU takes 60-100 s to start
# (each of its spawned processes imports sglang).
BOOT_TIMEOUT_S = {"sim": 60.0, "sglang": 1800.0, "sglang-frontend": 600.0, "sglang-engine": 600.0}


def run_verb(args: argparse.Namespace, stream: TextIO | None = None) -> int:
    """One run; its progress goes to ``stream`` (default stderr; bisect keeps each run's in a file)."""
    _check_launcher_options(args)
    if args.server == "sglang-frontend" and args.launcher != "local":
        raise BadInput(f"--server sglang-frontend --launcher {args.launcher}",
                       "SGLang's front end in front of the simulator runs as local processes only",
                       "use --launcher local, or --server sim / sglang with this launcher")
    boot_timeout = args.boot_timeout or BOOT_TIMEOUT_S[args.server]
    # One id names the run directory and labels every container, so `dspark-ci cleanup --run ID` finds them.
    run_id = new_run_id()
    options = pipeline.RunOptions(matrices=tuple(args.matrices), run_id=run_id, cell_ids=tuple(args.cell),
                                  launcher=args.launcher, suites=_suites(args.suites), out=args.out,
                                  baseline=args.baseline, sglang_version=_version(args.sglang_version),
                                  rerun_options=rerun_options(args), force=args.force,
                                  accept_inconclusive=args.accept_inconclusive,
                                  sampling=Sampling(max_boots=args.max_boots, retries=args.retries),
                                  environment=_environment(args), max_parallel=args.max_parallel,
                                  rejections=args.rejections, quarantine=_quarantine(args))
    caller_env = _caller_env(args.server, args.sglang_version)
    options = replace(options, forwarded_env={k: v for k, v in caller_env.items() if k.startswith("DSPARK_SIM_")})
    kind = catalog.get(args.launcher)
    context = LaunchContext(run_id=run_id, run_dir=options.run_dir, server=args.server, boot_timeout_s=boot_timeout,
                            caller_env=caller_env)
    launcher = kind.build(context, {spec.dest: getattr(args, spec.dest) for spec in kind.declared})
    simulated = args.server in SIMULATED_SERVERS
    defaults = _gpqa_dataset(caller_env["DSPARK_SIM_GPQA_PATH"]) if simulated else (
        # random weights answer any questions at chance: the synthetic set needs no download
        _gpqa_dataset(str(SYNTHETIC_GPQA)) if args.server == "sglang-engine" else (lambda o: o))
    verbosity = progress.QUIET if args.quiet else progress.VERBOSE if args.verbose else progress.NORMAL

    def check_cells(cells) -> None:
        check_before_launch(cells, options.suites, args.server, caller_env, defaults)

    return pipeline.run(options, launcher, suite_defaults=defaults,
                        progress=progress.Progress(stream=stream or sys.stderr, verbosity=verbosity),
                        check_cells=check_cells)


def _quarantine(args: argparse.Namespace) -> Quarantine:
    path = args.quarantine or default_path(args.matrices)
    return load_quarantine(path) if path else Quarantine()


def _environment(args: argparse.Namespace) -> dict:
    """What results.json records of where the run happened (history and release reports read it)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                                cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"server": args.server, "sglang_version": _version(args.sglang_version), "launcher": args.launcher,
            "hostname": socket.gethostname(), "python": platform.python_version(), "dspark_ci_commit": commit}


def run(args: argparse.Namespace) -> int:
    """Ctrl-C and SIGTERM are a flag the pipeline acts on (dspark_ci.ground.interrupts); its exit code is what its final
    files say: 130 exactly when results.json says ``interrupted``."""
    if signal.getsignal(signal.SIGINT) is not interrupts.on_signal:  # installed by the CLI at start, else now
        interrupts.install()
    try:
        code = run_verb(args)
    except KeyboardInterrupt:  # torn down, the final files written: the run exits 130 (dspark_ci/cli.py)
        _ignore_signals_until_exit()
        raise
    _ignore_signals_until_exit()
    return code


def _ignore_signals_until_exit() -> None:
    """The final files are on disk: the run has finished (or was interrupted and torn down) and the process only
    exits now. A Ctrl-C or SIGTERM from here on has nothing to stop, and must neither turn a finished run's exit code
    into 130 nor kill an interrupted one by the signal (exit -15 instead of 130, as a second SIGTERM did)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
