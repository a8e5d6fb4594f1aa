"""Every launcher, in one table (like nox's ``ALL_VENVS``): the CLI's ``--launcher`` choices, each launcher's
own options, and ``dspark-ci cleanup`` all derive from it.

A row names the package's ``lifecycle`` module, imported only when that launcher is used (so the Docker SDK is not
needed to run local processes), which provides what ``dspark_ci.launchers.contract.LauncherModule`` says:
``build(context, options)`` with the launcher's options record (``launchers/<kind>/options.py``: each option declared
once with its flag, environment variable, default, help and check) and ``remove_started(entry)``.

Adding a launcher: one package (``lifecycle.py``, ``options.py``), one row here; ``tests/test_launcher_compliance.py``
then holds it to the contract.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from dspark_ci.ground.ledger import LedgerEntry
from dspark_ci.launchers.contract import LaunchContext, Launcher, LauncherModule
from dspark_ci.launchers.docker.options import DockerOptions
from dspark_ci.launchers.k8s.options import K8sOptions
from dspark_ci.launchers.local.options import LocalOptions
from dspark_ci.launchers.optionset import Declared, declared, from_values
from dspark_ci.launchers.slurm.options import SlurmOptions


@dataclass(frozen=True)
class LauncherKind:
    name: str
    help: str
    module: str  # its lifecycle module, imported only when the launcher is used
    options: type = LocalOptions  # its options record (launchers/<kind>/options.py): flags, env vars, defaults

    @property
    def declared(self) -> tuple[Declared, ...]:
        return declared(self.options)

    def load(self) -> LauncherModule:
        return cast(LauncherModule, importlib.import_module(self.module))

    def build(self, context: LaunchContext, given: Mapping[str, Any]) -> Launcher:
        """The launcher, from the command line's values (by argparse dest; missing or None: not given)."""
        return self.load().build(context, from_values(self.options, given, context.caller_env))

    def remove_started(self, entry: LedgerEntry, dry_run: bool = False) -> str | None:
        return self.load().remove_started(entry, dry_run)


ALL_LAUNCHERS: tuple[LauncherKind, ...] = (
    LauncherKind("local", "every rank as a process on this machine, node rank r on 127.0.0.(r+1)",
                 "dspark_ci.launchers.local.lifecycle", LocalOptions),
    LauncherKind("docker", "every rank as a container, node rank r on Docker host r of the inventory",
                 "dspark_ci.launchers.docker.lifecycle", DockerOptions),
    LauncherKind("slurm", "every cell as one Slurm job, one task per node (docs/SLURM.md)",
                 "dspark_ci.launchers.slurm.lifecycle", SlurmOptions),
    LauncherKind("k8s", "every cell as one LeaderWorkerSet on Kubernetes, through its API (docs/K8S.md)",
                 "dspark_ci.launchers.k8s.lifecycle", K8sOptions),
)
BY_NAME: Mapping[str, LauncherKind] = {kind.name: kind for kind in ALL_LAUNCHERS}
NAMES: tuple[str, ...] = tuple(BY_NAME)


def get(name: str) -> LauncherKind:
    return BY_NAME[name]
