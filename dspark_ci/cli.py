"""``dspark-ci``: one verb per module in ``dspark_ci/verbs``; exit codes decided here only.

Each verb module has ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
Errors raised anywhere below become one message and CONTRACT.md's exit code; Ctrl-C is let
through as 130 after the verb's own cleanup has run.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from dspark_ci.errors import DsparkError, ExitCode

# verb name -> module under dspark_ci.verbs
VERBS = {
    "plan": "plan",
    "run": "run",
    "report": "report",
    "chatops": "chatops",
    "sim": "sim",
    "cleanup": "cleanup",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's default exit code 2 is ours too; keep it short
        self.print_usage(sys.stderr)
        self.exit(ExitCode.BAD_INPUT, f"{self.prog}: error: {message}\n")


def _load(verb: str):
    return importlib.import_module(f"dspark_ci.verbs.{VERBS[verb]}")


def build_parser(verbs: dict) -> argparse.ArgumentParser:
    parser = _Parser(prog="dspark-ci", description="Regression suite and CI orchestrator for SGLang "
                     "speculative-decoding deployments.")
    sub = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    for name, module in verbs.items():
        verb_parser = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(verb_parser)
        verb_parser.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # The simulator takes SGLang's own argv untouched (its flags are not ours to parse).
    if argv[:1] == ["sim"]:
        return _load("sim").main(argv[1:])
    verbs = {}
    for name in VERBS:
        try:
            verbs[name] = _load(name)
        except ModuleNotFoundError as err:
            if err.name != f"dspark_ci.verbs.{VERBS[name]}":
                raise
    args = build_parser(verbs).parse_args(argv)
    try:
        return int(args._module.run(args))
    except DsparkError as err:
        print(f"dspark-ci {args.verb}: {err}", file=sys.stderr)
        return int(err.exit_code)
    except KeyboardInterrupt:
        print(f"dspark-ci {args.verb}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
