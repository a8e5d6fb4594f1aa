"""Where dspark-ci keeps its own state on this machine: the index of runs (``dspark_ci.ground.ledger``) and the run
history (``dspark_ci.reports.history_db``). ``$DSPARK_STATE_DIR``, else ``~/.local/state/dspark-ci`` (XDG's state
home)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

STATE_DIR_ENV = "DSPARK_STATE_DIR"


def state_dir(env: Mapping[str, str]) -> Path:
    return Path(env.get(STATE_DIR_ENV) or Path.home() / ".local" / "state" / "dspark-ci")
