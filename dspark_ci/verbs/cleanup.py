"""dspark-ci cleanup: remove exactly what a run recorded it started, on every launcher and engine.

A run removes what it started on success, failure, Ctrl-C and SIGTERM; only a hard kill (SIGKILL, a lost
machine) leaves something. Every launcher writes each process, container or job to the run's ledger before
starting it (``ground/ledger.py``), and the run indexes itself with its owning process:

- ``cleanup --run ID``: removes what run ID recorded (refused while that run is still alive, unless --force).
- ``cleanup``: does so for every indexed run whose owning process is gone; live runs are never touched.
"""

from __future__ import annotations

import argparse
import os

from dspark_ci.ground.errors import BadInput, InfraError
from dspark_ci.ground.ledger import IndexedRun, find_run, forget, indexed_runs
from dspark_ci.launchers.leftovers import remove_recorded


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", metavar="RUN_ID", help="only this run (its id names runs/<run-id>/)")
    parser.add_argument("--dry-run", action="store_true",
                        help="list what cleanup would remove (the same checks, nothing removed)")
    parser.add_argument("--force", action="store_true", help="with --run: even if that run's process is still alive")


MAX_RUN_ID = 200  # ours are 22 characters


def run(args: argparse.Namespace) -> int:
    env = os.environ
    if args.run is not None and (not args.run.strip() or "\0" in args.run or len(args.run) > MAX_RUN_ID):
        raise BadInput(f"--run {args.run[:40]!r}", "is not a run id (empty, too long or not text)",
                       "give the id `dspark-ci run` printed (it names runs/<run-id>/)")
    if args.run is not None:
        found = find_run(args.run, env)
        if found is None:  # a run that tore down everything it started drops out of the index
            print(f"nothing left by run {args.run}: no run with this id has anything recorded on this machine "
                  "(a run that finished removed what it started)")
            return 0
        if found.owner_alive and not args.force:
            raise BadInput(f"--run {args.run}", f"that run is still going (process {found.pid})",
                           "stop it with Ctrl-C (it tears down what it started), or pass --force")
        runs = [found]
    else:
        runs = [r for r in indexed_runs(env) if not r.owner_alive]
    removed, problems = 0, []
    for dead_run in runs:
        count, trouble = _clean(dead_run, args.dry_run)
        removed += count
        problems += trouble
        if not trouble and not args.dry_run:
            forget(dead_run, env)
    verb = "to remove" if args.dry_run else "removed"
    print(f"{removed} leftover(s) {verb} from {len(runs)} finished run(s)")
    if problems:
        raise InfraError("; ".join(problems))
    return 0


def _clean(run: IndexedRun, dry_run: bool) -> tuple[int, list[str]]:
    """Remove (or, dry, find) what one run recorded; returns how many were found and what could not be done."""
    removal = remove_recorded(run.ledger, dry_run)
    verb = "would remove" if dry_run else "removed"
    for what in removal.removed:
        print(f"{verb} {what} (run {run.run_id})")
    return len(removal.removed), list(removal.problems)
