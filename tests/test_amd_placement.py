"""AMD (ROCm) cells placed as SGLang's AMD docs and Dockerfiles say: SGLang takes `--device cuda`
on ROCm too, so the hardware decides. Docker gives /dev/kfd, /dev/dri and the video group, never an NVIDIA device
request, and runs the ROCm release image; Slurm's containers get apptainer's --rocm or pyxis device mounts; a cell
whose hardware has no image is refused when planned."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from dspark_ci.ground.errors import InfraError
from dspark_ci.ground.sglang.release import DEFAULT_VERSION, ROCM_IMAGES
from dspark_ci.launchers.contract import LaunchContext
from dspark_ci.launchers.docker.spec import container_spec
from dspark_ci.launchers.docker.tuning import SIM_IMAGE, DockerTuning
from dspark_ci.launchers.slurm.lifecycle import SlurmLauncher
from dspark_ci.launchers.slurm.options import SlurmOptions
from dspark_ci.launchers.slurm.script import render_job

from tests.cli_under_test import DSPARK_CI
from tests.docker_engines import ENGINE1, containers_of, inventory, launcher_on, new_run_id, require_engine
from tests.sim_plans import make_plan

REPO = Path(__file__).resolve().parent.parent
ROCM_MI35X = ROCM_IMAGES["mi355"]


def test_a_cell_whose_hardware_has_no_image_is_refused_at_plan_time(tmp_path):
    matrix = tmp_path / "amd.yaml"
    matrix.write_text("hardware: {cuda: mi450}\ndefaults: {model: m, tp: 8}\ninclude:\n  - {}\n  - {hardware: mi355}\n")
    done = subprocess.run([*DSPARK_CI, "plan", str(matrix)], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith(f"dspark-ci plan: {matrix}:4: hardware mi450 is AMD (ROCm) and "
                                  f"SGLang {DEFAULT_VERSION} publishes no ROCm image for it")
    matrix.write_text("hardware: {cuda: mi450}\ndefaults: {model: m, tp: 8, image: my/sglang:rocm-mi450}\n"
                      "include:\n  - {}\n  - {hardware: mi355, image: null, id_suffix: mi355}\n")
    assert subprocess.run([*DSPARK_CI, "plan", str(matrix)], capture_output=True, cwd=REPO, timeout=60).returncode == 0


def amd_plan(launcher, hardware: str = "mi355"):
    return replace(make_plan(launcher.placement(1), 1, "amd-cell"), hardware=hardware)


NO_HF_CACHE = DockerTuning(hf_cache=None, poll_s=0.2, stop_timeout_s=2)


def test_docker_asks_a_real_engine_for_kfd_dri_and_video_and_no_nvidia_request(tmp_path):
    client = require_engine(ENGINE1)
    launcher = launcher_on(new_run_id(), tmp_path / "run", ENGINE1, server="sglang", tuning=NO_HF_CACHE)
    plan = amd_plan(launcher)
    assert launcher.image_for(plan) == ROCM_MI35X
    spec = container_spec(plan.ranks[0], inventory(ENGINE1).hosts[0], SIM_IMAGE,
                          {"dspark-ci.run": new_run_id(), "dspark-ci.cell": "amd-cell", "dspark-ci.launch": "probe"},
                          launcher.context, launcher.tuning, plan.accelerator)
    container = client.containers.create(**spec)
    try:
        host_config = container.attrs["HostConfig"]
        assert [d["PathOnHost"] for d in host_config["Devices"]] == ["/dev/kfd", "/dev/dri"]
        assert host_config["GroupAdd"] == ["video"] and not host_config["DeviceRequests"]
    finally:
        container.remove(force=True)


@pytest.mark.parametrize("hardware, engine_says", [
    ("mi355", 'adding custom device "/dev/kfd"'),  # this machine has no AMD GPU: the engine looked for one
    ("h200", "capabilities: [[gpu]]"),  # nor an NVIDIA one
])
def test_each_accelerator_reaches_the_engine_as_its_own_devices_and_nothing_is_left(hardware, engine_says, tmp_path):
    client = require_engine(ENGINE1)
    run_id = new_run_id()
    launcher = launcher_on(run_id, tmp_path / "run", ENGINE1, server="sglang", image=SIM_IMAGE, boot_timeout_s=20,
                           tuning=NO_HF_CACHE)
    with pytest.raises(InfraError, match="could not start node rank 0") as raised:
        with launcher.launch(amd_plan(launcher, hardware), tmp_path / "logs"):
            pass
    assert engine_says in str(raised.value)
    assert containers_of(run_id, [client]) == []


@pytest.mark.parametrize("container, hardware, says", [
    ("apptainer", "mi355", f"apptainer exec --rocm --bind {{logs}},/root/.cache/huggingface:/root/.cache/huggingface "
                           f"docker://{ROCM_MI35X}"),
    ("apptainer", "h200", "apptainer exec --nv --bind"),
    ("apptainer:/images/rocm.sif", "mi355", "apptainer exec --rocm --bind"),
    ("pyxis", "mi355", f"--container-image={ROCM_MI35X} --container-mounts={{logs}}:{{logs}},"
                       "/root/.cache/huggingface:/root/.cache/huggingface,/dev/kfd:/dev/kfd,/dev/dri:/dev/dri"),
], ids=["apptainer-amd", "apptainer-nvidia", "apptainer-amd-own-image", "pyxis-amd"])
def test_slurm_gives_amd_containers_rocm_devices_and_the_rocm_image(tmp_path, container, hardware, says):
    options, context = SlurmOptions(container=container), LaunchContext(run_id="r1", run_dir=tmp_path / "run")
    launcher = SlurmLauncher(options, context)
    plan = replace(amd_plan(launcher, hardware), gpus_per_node=8)
    script = render_job(plan, tmp_path, options, context, launcher.tuning, "tok").script
    assert says.format(logs=tmp_path) in script
    assert "#SBATCH --gpus-per-node=8" in script  # AMD GPUs are Slurm's `gpu` GRES too
    if hardware.startswith("mi"):
        assert "--nv" not in script
