"""dspark-ci cleanup: remove the containers an interrupted run left, on every Docker host of the inventory.

A run removes its own containers on success, failure, Ctrl-C and SIGTERM; only a hard kill (SIGKILL, a lost
machine) leaves some. They are found by the labels every launch puts on them (``dspark-ci.run`` ...).
Do not sweep all runs while another run is going on: pass ``--run`` to remove one run's containers only.
"""

from __future__ import annotations

import argparse
import os

from dspark_ci.errors import InfraError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hosts", metavar="FILE",
                        help="Docker hosts inventory (default: $DSPARK_DOCKER_HOSTS, else the local engine)")
    parser.add_argument("--run", metavar="RUN_ID", help="only this run's containers (label dspark-ci.run)")
    parser.add_argument("--dry-run", action="store_true", help="list what would be removed; remove nothing")


def run(args: argparse.Namespace) -> int:
    from launchers.docker import leftovers, remove_leftover
    from launchers.hosts import connect, load_inventory

    inventory = load_inventory(args.hosts, os.environ)
    unreachable: list[str] = []
    found = 0
    for url in inventory.urls:
        try:
            client = connect(url)
        except InfraError as err:
            unreachable.append(str(err))  # sweep the engines that do answer first
            continue
        try:
            for container in leftovers(client, args.run):
                found += 1
                print(f"{'would remove' if args.dry_run else 'removed'} {_describe(container)} on {url}")
                if not args.dry_run:
                    remove_leftover(container)
        finally:
            client.close()
    verb = "to remove" if args.dry_run else "removed"
    print(f"{found} container(s) {verb} on {len(inventory.urls) - len(unreachable)} engine(s)")
    if unreachable:
        raise InfraError("; ".join(unreachable))
    return 0


def _describe(container) -> str:
    from launchers.docker import LABEL_CELL, LABEL_RANK, LABEL_RUN

    labels = container.labels
    return (f"{container.name} ({container.status}; run {labels.get(LABEL_RUN)}, cell {labels.get(LABEL_CELL)}, "
            f"rank {labels.get(LABEL_RANK)})")
