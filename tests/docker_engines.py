"""What the Docker tests share: the engines under test, a launcher on them, and leftover checks.

Engine 1 is ``DOCKER_HOST`` (or the default socket), engine 2 is ``DSPARK_DOCKER_HOST2``; `.ci/docker-up.sh`
starts both and builds the simulator image into each. Without them the tests skip, saying so, unless
``DSPARK_REQUIRE_DOCKER=1`` (CI), where a missing engine is a failure.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from dspark_ci.ground.errors import InfraError
from dspark_ci.launchers.contract import LaunchContext
from dspark_ci.launchers.docker.hosts import HOSTS_ENV, Inventory, connect, load_inventory
from dspark_ci.launchers.docker.lifecycle import DockerLauncher
from dspark_ci.launchers.docker.options import DockerOptions
from dspark_ci.launchers.docker.spec import LABEL_RUN
from dspark_ci.launchers.docker.tuning import SIM_IMAGE, DockerTuning

import docker
from tests.sim_plans import FAST_SIM

ENGINE1 = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
ENGINE2 = os.environ.get("DSPARK_DOCKER_HOST2") or ""
SECRET = "hf_docker_secret_marker_9731"


def _unavailable(reason: str):
    if os.environ.get("DSPARK_REQUIRE_DOCKER") == "1":
        pytest.fail(f"{reason} (DSPARK_REQUIRE_DOCKER=1)")
    pytest.skip(reason)


def require_engine(url: str) -> docker.DockerClient:
    """A client for an engine that answers and has the simulator image; skip (or fail in CI) otherwise."""
    if not url:
        _unavailable("no second Docker engine: set DSPARK_DOCKER_HOST2 (.ci/docker-up.sh starts one)")
    try:
        client = connect(url, timeout_s=30)
    except InfraError:
        _unavailable(f"no Docker engine answers at {url}: run .ci/docker-up.sh")
    try:
        client.images.get(SIM_IMAGE)
    except docker.errors.ImageNotFound:
        client.close()
        _unavailable(f"{SIM_IMAGE} is not on {url}: run docker/build-sim-image.sh --docker-host {url}")
    return client


def engines(*urls: str) -> str:
    """The inventory as a user gives it in $DSPARK_DOCKER_HOSTS: engine i is node i, at 127.0.0.(i+1) (they share
    this machine's network)."""
    return " ".join(f"{url}=127.0.0.{i + 1}" for i, url in enumerate(urls))


def inventory(*urls: str) -> Inventory:
    return load_inventory(None, {HOSTS_ENV: engines(*urls)})


FAST_TEARDOWN = DockerTuning(poll_s=0.2, stop_timeout_s=2)


def launcher_on(run_id: str, run_dir: Path, *urls: str, faults: str = "", boot_timeout_s: float = 60.0,
                server: str = "sim", image: str | None = None, tuning: DockerTuning = FAST_TEARDOWN,
                **env: str) -> DockerLauncher:
    """A Docker launcher of run ``run_id`` (ledger in ``run_dir``) on the engines ``urls``, the simulator told
    ``faults``; its images are the engines' own (no pull)."""
    caller_env = {**FAST_SIM, "DSPARK_SIM_FAULTS": faults, "HF_TOKEN": SECRET, HOSTS_ENV: engines(*urls), **env}
    context = LaunchContext(run_id=run_id, run_dir=run_dir, server=server, boot_timeout_s=boot_timeout_s,
                            caller_env=caller_env)
    return DockerLauncher(DockerOptions(pull="never", image=image), context, tuning)


def new_run_id() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


def containers_of(run_id: str, clients: list[docker.DockerClient]) -> list[str]:
    """Names of this run's containers on any of the engines, running or stopped."""
    return [c.name for client in clients
            for c in client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"}, ignore_removed=True)]
