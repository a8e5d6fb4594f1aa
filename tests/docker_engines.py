"""What the Docker tests share: the engines under test, launcher settings, and leftover checks.

Engine 1 is ``DOCKER_HOST`` (or the default socket), engine 2 is ``DSPARK_DOCKER_HOST2``; `.ci/docker-up.sh`
starts both and builds the simulator image into each. Without them the tests skip, saying so, unless
``DSPARK_REQUIRE_DOCKER=1`` (CI), where a missing engine is a failure.
"""

from __future__ import annotations

import os
import uuid

import docker
import pytest

from ground.errors import InfraError
from launchers.docker.spec import LABEL_RUN, SIM_IMAGE, DockerSettings
from launchers.docker.hosts import DockerHost, Inventory, connect
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


def inventory(*urls: str) -> Inventory:
    """Engine i is node i, at 127.0.0.(i+1) (they share this machine's network)."""
    hosts = tuple(DockerHost(url=url, address=f"127.0.0.{i + 1}", where="test") for i, url in enumerate(urls))
    return Inventory(hosts, source="test inventory")


def settings(run_id: str, hosts: Inventory, faults: str = "", boot_timeout_s: float = 60.0, **env) -> DockerSettings:
    caller_env = {**FAST_SIM, "DSPARK_SIM_FAULTS": faults, "HF_TOKEN": SECRET, **env}
    return DockerSettings(server="sim", inventory=hosts, caller_env=caller_env, boot_timeout_s=boot_timeout_s,
                          poll_s=0.2, stop_timeout_s=2, pull="never", run_id=run_id)


def new_run_id() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


def containers_of(run_id: str, clients: list[docker.DockerClient]) -> list[str]:
    """Names of this run's containers on any of the engines, running or stopped."""
    return [c.name for client in clients
            for c in client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"}, ignore_removed=True)]
