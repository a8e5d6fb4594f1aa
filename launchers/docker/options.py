"""The Docker launcher's options (``--hosts``, ``--pull``, ``--image``), declared once
(``dspark_ci.launchers.optionset``)."""

from __future__ import annotations

from dataclasses import dataclass

from dspark_ci.launchers.optionset import option

PULL_POLICIES = ("never", "missing", "always")


@dataclass(frozen=True)
class DockerOptions:
    hosts: str | None = option(None, "--hosts", "Docker hosts inventory (YAML; default $DSPARK_DOCKER_HOSTS, else "
                               "the local engine)", metavar="FILE")
    pull: str = option("missing", "--pull", "image pull policy", choices=PULL_POLICIES)
    image: str | None = option(None, "--image", "container image for every cell (default: the cell's image, or the "
                               "simulator image with --server sim)", metavar="IMAGE")
