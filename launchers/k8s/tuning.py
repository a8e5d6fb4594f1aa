"""What no user sets on the Kubernetes launcher, and tests and sites may tune: the simulator's image, how long pods
may stay pending and objects take to go, how often it polls, which caller variables every pod gets.

The user's options are ``launchers/k8s/options.py`` (``--kubeconfig``, ``--namespace``, ``--k8s-*``: one record,
read as is); what the run decides (its id, run dir, server, boot timeout, the caller's environment) is the
``LaunchContext``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dspark_ci.launchers.contract import SIM_IMAGE
from dspark_ci.launchers.logs import stderr_progress

# How long a cell's pods may stay pending (scheduled, images pulled) by default: the simulator's small image on a
# test cluster, or a real SGLang image (tens of GB) on a GPU node pool that may scale up first.
PENDING_TIMEOUT_S = {"sim": 120.0, "sglang": 1800.0}
OTHER_PENDING_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class K8sTuning:
    sim_image: str = SIM_IMAGE  # what --server sim runs in (other servers: the cell's image)
    pending_timeout_s: float | None = None  # None: the server's (PENDING_TIMEOUT_S); the boot timeout starts after
    delete_wait_s: float = 60.0  # after deletion: until no pod of the group is left
    poll_s: float = 0.5
    forward_env_prefixes: tuple[str, ...] = ("DSPARK_SIM_",)  # caller variables every pod gets
    progress: Callable[[str], None] | None = stderr_progress  # pending reasons while the pods wait

    def pending_timeout_for(self, server: str) -> float:
        return self.pending_timeout_s or PENDING_TIMEOUT_S.get(server, OTHER_PENDING_TIMEOUT_S)
