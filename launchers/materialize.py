"""Turning a planned rank into what actually runs: the server under test and resolved environment."""

from __future__ import annotations

import re
import sys
from typing import Mapping

from launchers.plan_types import SGLANG_ENTRYPOINT, RankCommand

_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def server_argv(rank: RankCommand, server: str, python: str = sys.executable) -> list[str]:
    """SGLang's argv, or the same flags handed to the simulated server."""
    argv = list(rank.argv)
    if server == "sim" and tuple(argv[: len(SGLANG_ENTRYPOINT)]) == SGLANG_ENTRYPOINT:
        return [python, "-m", "sglang_sim", *argv[len(SGLANG_ENTRYPOINT):]]
    return argv


def resolve_env(planned: Mapping[str, str], caller_env: Mapping[str, str]) -> dict[str, str]:
    """Fill ``${NAME}`` references from the caller's environment (missing ones become empty)."""
    return {key: _REFERENCE.sub(lambda m: caller_env.get(m.group(1), ""), value)
            for key, value in planned.items()}


def secret_values(planned: Mapping[str, str], caller_env: Mapping[str, str]) -> list[str]:
    """The values that came from ``${NAME}`` references: never to be printed."""
    names = {m.group(1) for value in planned.values() for m in _REFERENCE.finditer(value)}
    return [caller_env[name] for name in names if caller_env.get(name)]


def redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text
