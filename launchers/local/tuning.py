"""What no user sets on the local launcher, and tests may tune: how often it polls, how long a rank gets to stop,
and which interpreter runs the server (a test's wrapper script).

The user's options are ``launchers/local/options.py`` (one record, read as is); what the run decides (its id, run
dir, server, boot timeout, the caller's environment) is the ``LaunchContext``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LocalTuning:
    poll_s: float = 0.1  # /health while booting: a refused connection on this machine costs next to nothing
    stop_grace_s: float = 10.0  # from SIGTERM to SIGKILL, for every rank's group
    python: str | None = None  # runs the server; None: the server's own (dspark_ci.launchers.materialize.server_python)
