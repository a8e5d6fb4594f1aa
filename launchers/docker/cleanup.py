"""Removing containers: one of ours at teardown (stopped with a short grace, its log kept first), and what a dead
run recorded in its ledger (``remove_started``, for ``dspark-ci cleanup``), only if it carries that run's label."""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING

import docker.errors
import requests
from dspark_ci.ground.ledger import LedgerEntry
from dspark_ci.launchers.docker.hosts import connect
from dspark_ci.launchers.docker.spec import LABEL_RUN

if TYPE_CHECKING:
    from dspark_ci.launchers.docker.group import LogPump


def dispose(container, stop_timeout_s: int, log: LogPump | None) -> None:
    """Stop (short grace), save the complete log, force-remove. Never raises: teardown must go on."""
    try:
        with contextlib.suppress(docker.errors.APIError, requests.RequestException):
            container.stop(timeout=stop_timeout_s)
        try:
            if log:
                log.finish()
        finally:  # whatever keeping the log met, the container goes
            container.remove(force=True, v=True)
    except docker.errors.NotFound:
        pass
    except (docker.errors.APIError, requests.RequestException) as err:
        print(f"dspark-ci: could not remove container {container.name}: {err} "
              "(`dspark-ci cleanup` removes it later)", file=sys.stderr)


def remove_leftover(container) -> None:
    """Remove a container at once (its run is gone: there is nobody to stop it gracefully for)."""
    with contextlib.suppress(docker.errors.NotFound):
        container.remove(force=True, v=True)


def remove_started(entry: LedgerEntry, dry_run: bool = False) -> str | None:
    """Remove the container a dead run recorded in its ledger, on the engine it recorded (catalog contract);
    ``dry_run``: only say so."""
    if not (entry.engine and entry.container):
        return None
    client = connect(entry.engine)
    try:
        container = client.containers.get(entry.container)
        if container.labels.get(LABEL_RUN) != entry.run_id:
            return None  # the name was reused by another run: not ours to touch
        if not dry_run:
            remove_leftover(container)
        return f"container {entry.container} on {entry.engine} (cell {entry.cell}, rank {entry.rank})"
    except docker.errors.NotFound:
        return None
    finally:
        client.close()
