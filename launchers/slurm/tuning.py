"""What no user sets on the Slurm launcher, and tests and sites may tune: how often it polls, how long a Slurm
command or a cancel may take, which ports and interpreter a task uses, what a container mounts.

The user's options are ``launchers/slurm/options.py`` (one record, read as is); what the run decides (its id,
run dir, server, boot timeout, the caller's environment) is the ``LaunchContext``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from dspark_ci.launchers.logs import stderr_progress


@dataclass(frozen=True)
class SlurmTuning:
    container_mounts: tuple[str, ...] = ("/root/.cache/huggingface:/root/.cache/huggingface",)  # SRC:DST (+ logs)
    poll_s: float = 0.5
    cancel_wait_s: float = 30.0  # after scancel: until the job is over and its processes are gone
    command_timeout_s: float = 30.0  # every Slurm client command (sbatch, scontrol, sinfo, squeue, scancel)
    port_range: tuple[int, int] | None = None  # None: ports free on this machine (one-host clusters)
    python: str = sys.executable  # the simulator's interpreter (absolute: slurmd's PATH is not ours)
    forward_env_prefixes: tuple[str, ...] = ("DSPARK_SIM_",)  # caller variables written into the script
    progress: Callable[[str], None] | None = stderr_progress  # pending reasons while the job waits
