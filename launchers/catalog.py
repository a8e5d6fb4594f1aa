"""Every launcher, in one table (like nox's ``ALL_VENVS``): the CLI's ``--launcher`` choices, each launcher's
own options, and ``dspark-ci cleanup`` all derive from it.

A row names the module implementing the launcher; the module is imported only when that launcher is used
(so the Docker SDK is not needed to run local processes) and provides:

- ``build(context: LaunchContext, options: Mapping[str, Any]) -> Launcher`` (``launchers.contract.Launcher``);
  ``options`` holds the values of the row's ``options`` by ``dest``;
- ``remove_started(entry: dict) -> str | None``: remove one ledger entry of a dead run (``launchers.ledger``),
  saying what was removed, or None if it was already gone.

Adding a launcher: one module, one row here; ``tests/test_launcher_compliance.py`` then holds it to the contract.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Mapping

from launchers.contract import LaunchContext, Launcher


@dataclass(frozen=True)
class LauncherOption:
    """One command-line option a launcher adds to `dspark-ci run` (plain data: the CLI builds the flag)."""

    flag: str  # e.g. "--hosts"
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    default: Any = None
    repeatable: bool = False  # may be given several times (a list of values)
    seconds: bool = False  # a positive number of seconds, checked when the command line is parsed

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class LauncherKind:
    name: str
    help: str
    module: str
    options: tuple[LauncherOption, ...] = ()

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)

    def build(self, context: LaunchContext, options: Mapping[str, Any]) -> Launcher:
        values = {option.dest: options.get(option.dest, option.default) for option in self.options}
        return self.load().build(context, values)

    def remove_started(self, entry: dict) -> str | None:
        return self.load().remove_started(entry)


ALL_LAUNCHERS: tuple[LauncherKind, ...] = (
    LauncherKind("local", "every rank as a process on this machine, node rank r on 127.0.0.(r+1)", "launchers.local.lifecycle"),
    LauncherKind("docker", "every rank as a container, node rank r on Docker host r of the inventory", "launchers.docker.lifecycle", (
        LauncherOption("--hosts", "Docker hosts inventory (YAML; default $DSPARK_DOCKER_HOSTS, else the local engine)",
                       metavar="FILE"),
        LauncherOption("--pull", "image pull policy", choices=("never", "missing", "always"), default="missing"),
        LauncherOption("--image", "container image for every cell (default: the cell's image, or the simulator "
                       "image with --server sim)", metavar="IMAGE"),
    )),
    LauncherKind("slurm", "every cell as one Slurm job, one task per node (docs/SLURM.md)", "launchers.slurm.lifecycle", (
        LauncherOption("--slurm-partition", "Slurm partition (default $DSPARK_SLURM_PARTITION, else the cluster's "
                       "default)", metavar="PARTITION"),
        LauncherOption("--slurm-account", "account charged for the jobs (sbatch --account)", metavar="ACCOUNT"),
        LauncherOption("--slurm-time", "time limit of each job (sbatch --time), e.g. 02:00:00", metavar="TIME"),
        LauncherOption("--slurm-extra", "one more sbatch option, e.g. --slurm-extra=--qos=high (repeatable)",
                       metavar="ARG", repeatable=True),
        LauncherOption("--slurm-gpus", "how GPUs per node are requested: --gpus-per-node=N or --gres=gpu:N",
                       choices=("gpus-per-node", "gres"), default="gpus-per-node"),
        LauncherOption("--slurm-container", "run each rank in a container: pyxis:IMAGE or apptainer:IMAGE "
                       "(default: plain processes)", metavar="KIND:IMAGE"),
        LauncherOption("--slurm-queue-timeout", "seconds a job may stay pending before the cell fails (default 600 "
                       "with --server sim, 3600 with sglang); the boot timeout starts when it runs", metavar="SECONDS",
                       seconds=True),
    )),
    LauncherKind("k8s", "every cell as one LeaderWorkerSet on Kubernetes, through its API (docs/K8S.md)",
                 "launchers.k8s.lifecycle", (
        LauncherOption("--kubeconfig", "kubeconfig file (default $KUBECONFIG, ~/.kube/config, else in-cluster)",
                       metavar="FILE"),
        LauncherOption("--namespace", "namespace of the LeaderWorkerSets (default $DSPARK_K8S_NAMESPACE, else the "
                       "kubeconfig context's)", metavar="NS"),
        LauncherOption("--k8s-extra", "YAML patch merged into every generated object: node selectors, "
                       "tolerations, host network, pull secrets, volumes (docs/K8S.md)", metavar="FILE"),
        LauncherOption("--k8s-reach", "how rank 0 is reached: pod-ip (the runner is in the cluster network) or "
                       "proxy (its /health through the API server)", choices=("pod-ip", "proxy"), default="pod-ip"),
    )),
)
BY_NAME: Mapping[str, LauncherKind] = {kind.name: kind for kind in ALL_LAUNCHERS}
NAMES: tuple[str, ...] = tuple(BY_NAME)


def get(name: str) -> LauncherKind:
    return BY_NAME[name]
