"""The errors every stage may raise, and the exit code each one maps to (CONTRACT.md).

Stages raise these; only ``dspark_ci.cli`` turns them into a message and an exit code,
so the mapping lives in one place.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    FELL_SHORT = 1  # something was measured and fell short
    BAD_INPUT = 2  # matrix, flag, comment or baseline file is wrong: fix the input
    INFRA = 3  # Docker engine unreachable, launch timeout, disk full: check the machine
    # Nothing fell short, but a statistical gate could not decide within its sampling budget: never
    # green unless asked for (`run --accept-inconclusive`), never red; below 1-3 in precedence.
    INCONCLUSIVE = 4


def worst(codes) -> ExitCode:
    """The exit code of several outcomes: the highest of 1-3, else INCONCLUSIVE if any, else OK (4 is numerically
    the largest, yet it must never hide a failure)."""
    codes = [ExitCode(code) for code in codes]
    failures = [code for code in codes if code not in (ExitCode.OK, ExitCode.INCONCLUSIVE)]
    if failures:
        return max(failures)
    return ExitCode.INCONCLUSIVE if ExitCode.INCONCLUSIVE in codes else ExitCode.OK


class DsparkError(Exception):
    """Base class: ``str(err)`` is the one message a user sees (no traceback)."""

    exit_code = ExitCode.FELL_SHORT


class BadInput(DsparkError):
    """Input a user must fix. ``where`` is ``file:line`` or ``--argument``; ``fix`` says what to do."""

    exit_code = ExitCode.BAD_INPUT

    def __init__(self, where: str, problem: str, fix: str = ""):
        self.where, self.problem, self.fix = where, problem, fix
        text = f"{where}: {problem}"
        if fix:
            text += f" ({fix})"
        super().__init__(text)


class InfraError(DsparkError):
    """The machine, not the product under test, is in the way. The message says what to check."""

    exit_code = ExitCode.INFRA
