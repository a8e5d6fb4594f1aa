"""A run's id: it names the run directory (``runs/<run-id>/``) and labels every container the run starts,
so ``dspark-ci cleanup --run ID`` finds them. Shared by the run pipeline and the Docker launcher."""

from __future__ import annotations

import datetime as dt
import secrets


def new_run_id() -> str:
    """Sortable by start time, and unique among runs started in the same second."""
    return dt.datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)
