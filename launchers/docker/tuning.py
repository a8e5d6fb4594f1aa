"""What no user sets on the Docker launcher, and tests and sites may tune: the simulator's image, how often it polls,
how long a container gets to stop, what every container is given (shared memory, the HF cache, simulator knobs),
and where ports on remote engines start.

The user's options are ``launchers/docker/options.py`` (``--hosts``, ``--pull``, ``--image``: one record, read as
is); what the run decides (its id, run dir, server, boot timeout, the caller's environment) is the
``LaunchContext``."""

from __future__ import annotations

from dataclasses import dataclass

from dspark_ci.launchers.contract import SIM_IMAGE


@dataclass(frozen=True)
class DockerTuning:
    sim_image: str = SIM_IMAGE  # what --server sim and sglang-engine run in (--image overrides it)
    poll_s: float = 0.5
    stop_timeout_s: int = 5  # SIGTERM grace before the engine kills a container
    shm_size: str = "32g"
    hf_cache: str | None = "/root/.cache/huggingface"  # host path on each engine's machine (real SGLang only)
    forward_env_prefixes: tuple[str, ...] = ("DSPARK_SIM_",)  # caller variables every container gets
    port: int = 30000  # the first on remote engines (local ones get free ports, like the local launcher)
    dist_port: int = 20000
