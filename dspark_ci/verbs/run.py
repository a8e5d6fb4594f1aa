"""dspark-ci run: launch each selected cell, run the suites against it, gate, write the run directory."""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path
from typing import Callable

from dspark_ci.errors import BadInput
from dspark_ci import run as pipeline
from dspark_ci.run_id import new_run_id
from dspark_ci.sglang.flags import DEFAULT_VERSION
from dspark_ci.suite_runner import KNOWN_SUITES, SYNTHETIC_GPQA


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled exactly like Ctrl-C: tear everything down, keep what was measured."""


EXIT_CODES = """exit codes: 0 every cell passed (or was rejected as expected, or skipped); 1 a gate failed, a cell
crashed, or a rejection was not the expected one; 2 bad input (matrix, flag, baseline: the message names
file:line and the fix; nothing is launched); 3 infrastructure trouble (launch timeout, Docker engine, disk).
Ctrl-C or SIGTERM: everything started is torn down, results.json keeps what was measured, exit 130."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXIT_CODES
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("matrices", nargs="+", metavar="MATRIX", help="matrix YAML files")
    parser.add_argument("--cell", action="append", default=[], metavar="ID", help="run only this cell (repeatable)")
    parser.add_argument("--launcher", choices=("local", "docker"), default="local",
                        help="local processes (default) or Docker containers")
    parser.add_argument("--suites", metavar="LIST", help=f"comma-separated, from {', '.join(KNOWN_SUITES)} "
                        "(default: each cell's own suites)")
    parser.add_argument("--out", type=Path, metavar="DIR", help="run directory (default runs/<run-id>/)")
    parser.add_argument("--baseline", metavar="FILE", help="baseline file for every cell (default: each cell's own)")
    parser.add_argument("--server", choices=("sim", "sglang"), default=os.environ.get("DSPARK_SERVER", "sim"),
                        help="server under test: the embedded simulated SGLang server (default) or real SGLang")
    parser.add_argument("--sglang-version", default=DEFAULT_VERSION,
                        help="SGLang version under test, matched against each expectation's version spec")
    parser.add_argument("--boot-timeout", type=float, default=None, metavar="SECONDS",
                        help="how long rank 0 may take to become healthy (default 60 for the simulator, 1800 for SGLang)")
    parser.add_argument("--hosts", metavar="FILE", help="Docker hosts inventory (docker launcher)")
    parser.add_argument("--pull", choices=("never", "missing", "always"), default="missing",
                        help="image pull policy (docker launcher)")
    parser.add_argument("--image", metavar="IMAGE", help="container image for every cell (docker launcher; "
                        "default: the cell's image, or the simulator image with --server sim)")


def _suites(text: str | None) -> tuple[str, ...] | None:
    if not text:
        return None
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in KNOWN_SUITES]
    if unknown or not names:
        raise BadInput(f"--suites {text}", f"unknown suite {unknown[0] if unknown else '(none)'}",
                       f"choose from {', '.join(KNOWN_SUITES)}")
    return names


def _caller_env(server: str) -> dict:
    env = dict(os.environ)
    if server == "sim":
        env.setdefault("DSPARK_SIM_GPQA_PATH", str(SYNTHETIC_GPQA))
    return env


def _gpqa_dataset(dataset: str) -> Callable[[dict], dict]:
    """Suite defaults under the simulator, which answers GPQA from the dataset it is given: the same file."""
    def defaults(options: dict) -> dict:
        if "gpqa" in options and not options["gpqa"].get("dataset"):
            options["gpqa"]["dataset"] = dataset
        return options
    return defaults


def _local_launcher(args, boot_timeout: float, caller_env: dict, run_id: str):
    from launchers.local import LocalLauncher, LocalSettings

    return LocalLauncher(LocalSettings(server=args.server, boot_timeout_s=boot_timeout, caller_env=caller_env))


def _docker_launcher(args, boot_timeout: float, caller_env: dict, run_id: str):
    from launchers.docker import docker_launcher_from_args

    return docker_launcher_from_args(args, boot_timeout, caller_env, run_id)


LAUNCHERS = {"local": _local_launcher, "docker": _docker_launcher}


def run_verb(args: argparse.Namespace) -> int:
    boot_timeout = args.boot_timeout or (60.0 if args.server == "sim" else 1800.0)
    # One id names the run directory and labels every container, so `dspark-ci cleanup --run ID` finds them.
    run_id = new_run_id()
    options = pipeline.RunOptions(matrices=tuple(args.matrices), run_id=run_id, cell_ids=tuple(args.cell),
                                  launcher=args.launcher, suites=_suites(args.suites), out=args.out,
                                  baseline=args.baseline, sglang_version=args.sglang_version)
    caller_env = _caller_env(args.server)
    launcher = LAUNCHERS[args.launcher](args, boot_timeout, caller_env, run_id)
    defaults = _gpqa_dataset(caller_env["DSPARK_SIM_GPQA_PATH"]) if args.server == "sim" else (lambda o: o)
    return pipeline.run(options, launcher, suite_defaults=defaults)


def _raise_terminated(signum, frame):
    raise Terminated()


def run(args: argparse.Namespace) -> int:
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        return run_verb(args)
    finally:
        signal.signal(signal.SIGTERM, previous)
