"""What the launcher asks of a Docker engine beyond the SDK: an image present by the pull policy, containers found
by label or name, files copied in."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Mapping
from pathlib import Path

import docker.errors
import requests
from docker.utils import parse_repository_tag
from dspark_ci.ground.errors import InfraError
from dspark_ci.launchers.docker.image_source import IMAGE_KIND_LABEL, SIM_IMAGE_KIND, SOURCE_LABEL, sim_source_digest
from dspark_ci.launchers.docker.tuning import SIM_IMAGE

import docker


def ensure_image(client: docker.DockerClient, url: str, image: str, policy: str) -> None:
    """The image on this engine, pulled by policy; InfraError with what to do when it cannot be had."""
    try:
        _check_sim_source(client.images.get(image), image, url)
        present = True
    except docker.errors.ImageNotFound:
        present = False
    if policy == "never" and not present:
        raise InfraError(f"image {image} is not on Docker engine {url} and the pull policy is `never`; "
                         f"{_image_hint(image, url)}")
    if policy == "always" or not present:
        repository, tag = parse_repository_tag(image)
        try:
            client.images.pull(repository, tag=tag or "latest")
        except (docker.errors.APIError, requests.RequestException) as err:
            raise InfraError(f"cannot pull {image} onto Docker engine {url} ({str(err).splitlines()[0][:160]}); "
                             f"{_image_hint(image, url)}") from None


def _check_sim_source(found, image: str, url: str) -> None:
    """The simulator's image (under any tag) must run the code this dspark-ci is: one left from another checkout
    is refused. Other images (SGLang's) are the user's to choose."""
    labels = found.labels or {}
    if labels.get(IMAGE_KIND_LABEL) != SIM_IMAGE_KIND:
        return
    built_from, here = labels.get(SOURCE_LABEL), sim_source_digest()
    if built_from != here:
        raise InfraError(f"image {image} on Docker engine {url} was built from other code (source "
                         f"{built_from or 'not labelled'}, this tree {here}): rebuild it: "
                         f"docker/build-sim-image.sh --docker-host {url} (seconds, from its cache)")


def _image_hint(image: str, url: str) -> str:
    if image == SIM_IMAGE:
        return f"build it without a registry: docker/build-sim-image.sh --docker-host {url}"
    return (f"no registry reachable? load it from a machine that has it: "
            f"`docker save {image} | docker -H {url} load`, or run with --pull never after loading")


def labelled(client: docker.DockerClient, labels: Mapping[str, str]) -> list:
    try:  # a container removed between the engine's listing and its inspection is skipped, not an error
        return client.containers.list(all=True, filters={"label": [f"{k}={v}" for k, v in labels.items()]},
                                      ignore_removed=True)
    except (docker.errors.APIError, requests.RequestException):
        return []


def named_container(client: docker.DockerClient, name: str) -> list:
    """The container of this exact name, if the engine has it (a create sent but never answered)."""
    try:
        return [client.containers.get(name)]
    except (docker.errors.APIError, requests.RequestException):
        return []


def copy_into(container, paths: list[Path]) -> None:
    if not paths:
        return
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path in paths:
            archive.add(str(path), arcname=str(path).lstrip("/"))
    container.put_archive("/", buffer.getvalue())
