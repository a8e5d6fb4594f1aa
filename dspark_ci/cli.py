"""``dspark-ci``: one verb per module in ``dspark_ci/verbs``; exit codes decided here only.

Each verb has its one-line help in ``VERBS`` below, and a module with ``add_arguments(parser)`` and
``run(args) -> int``.
Errors raised anywhere below become one message and CONTRACT.md's exit code; Ctrl-C is let
through as 130 after the verb's own cleanup has run.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib import metadata

from dspark_ci.ground import interrupts
from dspark_ci.ground.errors import DsparkError, ExitCode
from dspark_ci.ground.processes import reset_inherited_signals

# verb name -> one-line help. The module dspark_ci.verbs.<verb> is imported only when that verb runs,
# so one verb's heavy or broken imports never stop another.
VERBS = {
    "plan": "Expand matrices into validated cells with their exact launch commands; launch nothing.",
    "run": "Launch each selected cell, run the suites against it, gate, and write results and reports.",
    "report": "Render the reports of a run directory again, optionally side by side with another run.",
    "rescore": "Score a run's recorded GPQA responses again with another scorer, offline; both figures per cell.",
    "chatops": "Parse a PR comment, check permission, resolve test paths, print the reply and dispatch plan.",
    "sim": "The simulated SGLang server: SGLang's launch_server flags; behaviour from DSPARK_SIM_* (sim --help).",
    "cleanup": "Remove exactly what a killed run recorded it started (processes, containers, jobs).",
    "history": "The runs remembered (SQLite) and each cell's metrics across them, "
               "with the last good and first bad run.",
    "baseline": "Propose a baseline file (values, measured noise, tolerances) from good runs: baseline record RUN...",
    "bisect": "Re-run one cell across an ordered range of builds (versions, images) and name the first bad one.",
    "preflight": "Run SGLang's own argument resolution on every rank of every cell and compare with its expectation.",
    "matrices": "List the shipped matrices (each runs by name: dspark-ci run smoke) and their files.",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's default exit code 2 is ours too; one line, not the whole usage
        self.exit(ExitCode.BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _load(verb: str):
    return importlib.import_module(f"dspark_ci.verbs.{verb}")


def version() -> str:
    """This tree's version and the SGLang release its flags and expectations are written for."""
    from dspark_ci.ground.sglang.release import DEFAULT_VERSION

    try:
        ours = metadata.version("dspark-ci")
    except metadata.PackageNotFoundError:  # run from a checkout that was never pip-installed
        ours = "(not installed)"
    return f"dspark-ci {ours} (SGLang {DEFAULT_VERSION} flags and expectations)"


def build_parser(chosen: str | None) -> argparse.ArgumentParser:
    """Every verb is listed; only the chosen one's module is imported to add its arguments."""
    parser = _Parser(prog="dspark-ci", description="Regression suite and CI orchestrator for SGLang "
                     "speculative-decoding deployments.")
    parser.add_argument("--version", action="version", version=version())
    sub = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    for name, help_text in VERBS.items():
        verb_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = _load(name)
            module.add_arguments(verb_parser)
            verb_parser.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # The simulator takes SGLang's own argv untouched (its flags are not ours to parse).
    if argv[:1] == ["sim"]:
        return _load("sim").main(argv[1:])
    reset_inherited_signals()  # started with SIGINT ignored (a background job): still stoppable, children too
    if argv[:1] == ["run"]:  # a run's Ctrl-C and SIGTERM are a flag from its first moment (dspark_ci.ground.interrupts)
        interrupts.install()
    chosen = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(chosen if chosen in VERBS else None).parse_args(argv)
    try:
        code = int(args._module.run(args))
        if args.verb == "run":  # its final files are written: a signal from here on is said, not lost
            interrupts.hold_until_exit(lambda line: print(f"dspark-ci run: {line}", file=sys.stderr, flush=True))
        return code
    except DsparkError as err:
        print(f"dspark-ci {args.verb}: {err}", file=sys.stderr)
        return int(err.exit_code)
    except KeyboardInterrupt:
        print(f"dspark-ci {args.verb}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
