"""Turning a planned rank into what actually runs: the server under test and resolved environment."""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from dspark_ci.ground.sglang.resolver import DEFAULT_VENV_PYTHON
from dspark_ci.launchers.plan_types import SGLANG_ENTRYPOINT, RankCommand

from dspark_ci import sglang_sim

# Run as a script by the SGLang venv's Python, which does not have this tree installed (it puts it on its path).
FRONTEND_ENTRY = Path(sglang_sim.__file__).resolve().parent / "frontend" / "__main__.py"
ENGINE_ENTRY = Path(sglang_sim.__file__).resolve().parent / "cpu_engine" / "__main__.py"
SGLANG_VENV_SERVERS = ("sglang-frontend", "sglang-engine")  # run by the SGLang venv's Python (server_python)

_ENTRIES: Mapping[str, Callable[[str], tuple[str, ...]]] = {
    "sim": lambda python: (python, "-m", "dspark_ci.sglang_sim"),
    "sglang-frontend": lambda python: (python, str(FRONTEND_ENTRY)),
    "sglang-engine": lambda python: (python, str(ENGINE_ENTRY)),
}
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def server_command(rank: RankCommand, server: str, python: str = sys.executable) -> RankCommand:
    """The rank with SGLang's entrypoint replaced by what runs ``server`` (``python`` runs it: for sglang-frontend
    and sglang-engine, the SGLang venv's, ``server_python``); SGLang itself keeps its own."""
    head = rank.head
    if head[: len(SGLANG_ENTRYPOINT)] != SGLANG_ENTRYPOINT or server not in _ENTRIES:
        return rank
    return dataclasses.replace(rank, head=(*_ENTRIES[server](python), *head[len(SGLANG_ENTRYPOINT):]))


def server_argv(rank: RankCommand, server: str, python: str = sys.executable) -> list[str]:
    """SGLang's argv, or the same flags handed to the simulated server."""
    return list(server_command(rank, server, python).argv)


def frontend_python(caller_env: Mapping[str, str]) -> str:
    """The Python of the venv `.ci/sglang-frontend.sh` builds: $DSPARK_SGLANG_PYTHON, else the repo's."""
    return caller_env.get("DSPARK_SGLANG_PYTHON") or str(DEFAULT_VENV_PYTHON)


def server_python(server: str, caller_env: Mapping[str, str]) -> str:
    """The Python that runs ``server``: the engine's venv (`.ci/sglang-engine.sh`, $DSPARK_SGLANG_ENGINE_PYTHON,
    else the front end's), the front end's, or this one."""
    if server == "sglang-engine" and caller_env.get("DSPARK_SGLANG_ENGINE_PYTHON"):
        return caller_env["DSPARK_SGLANG_ENGINE_PYTHON"]
    return frontend_python(caller_env) if server in SGLANG_VENV_SERVERS else sys.executable


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
