"""The Slurm launcher's settings (``SlurmSettings``): its options (``launchers/slurm/options.py``) and what the run
and the cluster decide."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Callable, Mapping


from ground.errors import BadInput
from ground.run_id import new_run_id
from launchers.ledger import Ledger
from launchers.plan_types import LaunchPlan
from launchers.slurm.options import DEFAULT_QUEUE_TIMEOUT_S



def _stderr_progress(message: str) -> None:
    print(f"dspark-ci: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class SlurmSettings:
    server: str = "sim"  # "sim": the simulated server from this checkout; "sglang": python3 -m sglang.launch_server
    partition: str | None = None  # None: the cluster's default partition
    account: str | None = None
    time: str | None = None  # job time limit, e.g. "02:00:00"
    extra: tuple[str, ...] = ()  # more sbatch options, written as #SBATCH lines
    gpus: str = "gpus-per-node"  # how GPUs are requested: --gpus-per-node=N, or "gres": --gres=gpu:N
    container: str | None = None  # None: plain processes; "pyxis:IMAGE" or "apptainer:IMAGE"
    container_mounts: tuple[str, ...] = ("/root/.cache/huggingface:/root/.cache/huggingface",)  # SRC:DST (+ logs)
    queue_timeout_s: float = 600.0  # PENDING until this: LaunchTimeout naming Slurm's reason
    boot_timeout_s: float = 600.0  # from RUNNING until rank 0's /health answers 200
    poll_s: float = 0.5
    cancel_wait_s: float = 30.0  # after scancel: until the job is over and its processes are gone
    command_timeout_s: float = 30.0  # every Slurm client command (sbatch, scontrol, sinfo, squeue, scancel)
    port_range: tuple[int, int] | None = None  # None: ports free on this machine (one-host clusters)
    python: str = sys.executable  # the simulator's interpreter (absolute: slurmd's PATH is not ours)
    caller_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    forward_env_prefixes: tuple[str, ...] = ("DSPARK_SIM_",)  # caller variables written into the script
    run_id: str = field(default_factory=new_run_id)
    ledger: Ledger | None = None  # where every job is recorded (None: not recorded)
    progress: Callable[[str], None] | None = _stderr_progress  # pending reasons while the job waits

    def __post_init__(self):
        # The --slurm-* values are checked once, as options (launchers/slurm/options.py); the server by the CLI.
        if self.server not in DEFAULT_QUEUE_TIMEOUT_S:
            raise BadInput("--server", f"unknown server {self.server!r}", f"choose from {', '.join(DEFAULT_QUEUE_TIMEOUT_S)}")

    @property
    def container_kind(self) -> str | None:
        return self.container.partition(":")[0] if self.container else None

    @property
    def container_image(self) -> str | None:
        """The one image every cell runs in (KIND:IMAGE); None: each cell's own (KIND alone)."""
        return (self.container.partition(":")[2] or None) if self.container else None

    def image_for(self, plan: LaunchPlan) -> str:
        """The image a cell's ranks run in: --slurm-container's, else the cell's, else SGLang's release image for its
        device and hardware (a ROCm image for AMD hardware)."""
        image = self.container_image or plan.image_to_run
        if not image:
            raise BadInput(plan.cell_id, f"no container image for device {plan.device!r} on "
                           f"{plan.hardware or 'its hardware'}", "set `image:` in the matrix, or --slurm-container "
                           "KIND:IMAGE")
        return image

