"""What every launcher gives the run: a running deployment, or an error that says why not.

A launcher is used as a context manager::

    with launcher.launch(plan, logs_dir) as deployment:
        ...  # deployment.base_url serves the OpenAI API; deployment.check() raises if a rank died
    # every process / container of the group is gone here, whatever happened inside

Errors carry what a person needs to act: which rank, its exit code, its last log lines, and
SGLang's own error line (``ValueError: ...``) when there is one, e.g. for expected rejections.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from dspark_ci.errors import DsparkError, InfraError

# SGLang prints the exception that stopped it as "<Type>: <message>" on one line.
SGLANG_FATAL_ERRORS = ("ValueError", "AssertionError", "NotImplementedError", "RuntimeError", "TypeError", "KeyError",
                       "ModuleNotFoundError", "ImportError", "torch.OutOfMemoryError", "OutOfMemoryError")
_ERROR_LINE = re.compile(r"^\s*(?:[\w.]+\.)?(" + "|".join(map(re.escape, SGLANG_FATAL_ERRORS)) + r")\b:?\s*(.*)$")


def sglang_error_line(log_lines: list[str]) -> str | None:
    """The last ``SomeError: message`` line of a log, which is what SGLang died of."""
    for line in reversed(log_lines):
        if _ERROR_LINE.match(line):
            return line.strip()
    return None


@dataclass
class LaunchFailed(DsparkError):
    """A rank exited (at boot or later) or rank 0 never became healthy."""

    cell_id: str
    reason: str  # "exited" | "timeout"
    node_rank: int | None = None
    rank_exit_code: int | None = None  # the rank's own exit status (exit_code is dspark-ci's)
    last_lines: list[str] = field(default_factory=list)
    sglang_error: str | None = None
    hint: str = ""

    def __post_init__(self):
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.reason == "timeout":
            head = f"{self.cell_id}: rank 0 did not become healthy in time"
        else:
            head = f"{self.cell_id}: node rank {self.node_rank} exited with code {self.rank_exit_code}"
        parts = [head]
        if self.sglang_error:
            parts.append(f"SGLang said: {self.sglang_error}")
        if self.last_lines:
            parts.append("last log lines:\n    " + "\n    ".join(self.last_lines[-10:]))
        if self.hint:
            parts.append(f"hint: {self.hint}")
        return "\n  ".join(parts)


# How much of a rank's log is searched for SGLang's error line, and how much an error keeps (it prints 10).
LOG_LINES_SEARCHED = 40
LOG_LINES_KEPT = 15


def rank_exited(cell_id: str, node_rank: int, exit_code: int | None, log_lines: list[str],
                hints: list[str]) -> LaunchFailed:
    """The error for a rank that exited: its exit code, SGLang's error line and the end of its log."""
    return LaunchFailed(cell_id=cell_id, reason="exited", node_rank=node_rank, rank_exit_code=exit_code,
                        last_lines=log_lines[-LOG_LINES_KEPT:], sglang_error=sglang_error_line(log_lines),
                        hint="; ".join(hints))


class LaunchTimeout(LaunchFailed, InfraError):
    """Rank 0 never became healthy before the deadline (exit code 3 when it is not the product's fault)."""


class Deployment(Protocol):
    base_url: str  # rank 0's API root, e.g. http://127.0.0.1:30000
    boot_seconds: float  # from start until rank 0 was healthy

    def check(self) -> None:
        """Raise LaunchFailed if any rank of the group has exited since launch."""


class Launcher(Protocol):
    name: str  # "local" | "docker"

    def launch(self, plan, logs_dir: Path):  # -> ContextManager[Deployment]
        ...
