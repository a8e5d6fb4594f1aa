"""The Slurm launcher's options (``--slurm-*``), declared once (``dspark_ci.launchers.optionset``)."""

from __future__ import annotations

from dataclasses import dataclass

from dspark_ci.ground.errors import BadInput
from dspark_ci.ground.sglang.release import DEVICE_IMAGES
from dspark_ci.launchers.optionset import option, seconds
from dspark_ci.launchers.plan_types import LaunchPlan

GPU_MODES = ("gpus-per-node", "gres")
CONTAINER_KINDS = ("pyxis", "apptainer")
# How long a job may stay PENDING by default: a simulated cell on a test cluster, or a real one behind a busy queue.
DEFAULT_QUEUE_TIMEOUT_S = {"sim": 600.0, "sglang": 3600.0, "sglang-engine": 600.0}


def container(text: str) -> str:
    kind, sep, image = text.partition(":")
    if kind not in CONTAINER_KINDS or (sep and not image):
        raise ValueError(f"{text!r} is not KIND or KIND:IMAGE: write pyxis:IMAGE (srun --container-image) or "
                         "apptainer:IMAGE (apptainer exec), or pyxis / apptainer alone for each cell's own image")
    return text


def sbatch_option(text: str) -> str:
    if not text.startswith("-") or "\n" in text:
        raise ValueError(f"{text!r} is not an sbatch option: give one option per --slurm-extra, "
                         "e.g. --slurm-extra=--qos=high")
    return text


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = option(None, "--slurm-partition", "Slurm partition (default $DSPARK_SLURM_PARTITION, "
                                   "else the cluster's default)", env="DSPARK_SLURM_PARTITION", metavar="PARTITION")
    account: str | None = option(None, "--slurm-account", "account charged for the jobs (sbatch --account)",
                                 metavar="ACCOUNT")
    time: str | None = option(None, "--slurm-time", "time limit of each job (sbatch --time), e.g. 02:00:00",
                              metavar="TIME")
    extra: tuple[str, ...] = option((), "--slurm-extra", "one more sbatch option, e.g. --slurm-extra=--qos=high "
                                    "(repeatable)", metavar="ARG", repeatable=True, parse=sbatch_option)
    gpus: str = option("gpus-per-node", "--slurm-gpus", "how GPUs per node are requested: --gpus-per-node=N or "
                       "--gres=gpu:N", choices=GPU_MODES)
    container: str | None = option(None, "--slurm-container", "run each rank in a container: pyxis:IMAGE or "
                                   "apptainer:IMAGE, or pyxis / apptainer alone for each cell's own image (default: "
                                   "plain processes)", metavar="KIND[:IMAGE]",
                                   parse=container, example=f"pyxis:{DEVICE_IMAGES['cuda']}")
    queue_timeout_s: float | None = option(
        None, "--slurm-queue-timeout", "seconds a job may stay pending before the cell fails (default "
        + ", ".join(f"{s:g} with --server {server}" for server, s in DEFAULT_QUEUE_TIMEOUT_S.items())
        + "); the boot timeout starts when it runs", metavar="SECONDS", parse=seconds, example="600")

    def queue_timeout_for(self, server: str) -> float:
        return self.queue_timeout_s or DEFAULT_QUEUE_TIMEOUT_S[server]

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
