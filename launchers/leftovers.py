"""Removing what a run recorded in its ledger (``dspark_ci.ground.ledger``), by the launcher kind that started it.

Used by ``dspark-ci cleanup`` for dead runs, and by a run that ends: it checks its own ledger once more (anything
its teardown missed is removed then) and, when nothing is left, drops its entry from the run index, so the index
holds only runs that may still have something to remove.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from dspark_ci.ground.errors import DsparkError
from dspark_ci.ground.ledger import Ledger, find_run, forget
from dspark_ci.ground.processes import remove_run_temp_dir, run_temp_dir
from dspark_ci.launchers import catalog


@dataclass(frozen=True)
class Removal:
    removed: tuple[str, ...] = ()  # what was found and removed, as sentences
    problems: tuple[str, ...] = field(default=())  # what could not be done (the run keeps its index entry)


def remove_recorded(ledger: Ledger, dry_run: bool = False) -> Removal:
    """Remove every thing ``ledger`` recorded that is still there, and the run's temp directory (where its
    processes' multiprocessing directories are). ``dry_run``: remove nothing, but find the same things (each
    launcher's own checks), so what a dry run lists is what a real one removes."""
    removed, problems = [], []
    for entry in ledger.entries():
        kind = catalog.BY_NAME.get(entry.launcher)
        if kind is None:
            problems.append(f"run {ledger.run_id}: unknown launcher {entry.launcher!r} in {ledger.path}")
            continue
        try:
            what = kind.remove_started(entry, dry_run)
        except DsparkError as err:
            problems.append(f"run {ledger.run_id}: {err}")
            continue
        if what:
            removed.append(what)
    if remove_run_temp_dir(ledger.run_id, dry_run):
        removed.append(f"temp directory {run_temp_dir(ledger.run_id)}")
    return Removal(tuple(removed), tuple(problems))


def release(ledger: Ledger, env: Mapping[str, str]) -> Removal:
    """At the end of a run: remove what its teardown left (normally nothing) and, if that leaves nothing, forget
    the run in the index (a finished, cleaned run needs no `cleanup`)."""
    temp_dir = run_temp_dir(ledger.run_id)
    removal = remove_recorded(ledger)
    removal = replace(removal, removed=tuple(r for r in removal.removed if r != f"temp directory {temp_dir}"))
    indexed = find_run(ledger.run_id, env)
    if indexed is not None and not removal.problems:
        forget(indexed, env)
    return removal
