"""What a rank's container looks like, for the Docker launcher: pure data, testable without an engine.

``container_spec`` gives the ``containers.create`` arguments SGLang's Docker docs call for (host network,
``ipc=host``, shm size, GPUs or Ascend devices, the HF cache) plus the labels every container carries (run, cell,
rank, launch) so teardown and ``dspark-ci cleanup`` find it. The engine lifecycle is ``launchers/docker/lifecycle.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from docker.types import DeviceRequest
from dspark_ci.ground.errors import BadInput
from dspark_ci.ground.install_root import TREE
from dspark_ci.ground.sglang.release import AMD, ASCEND, NVIDIA
from dspark_ci.launchers.contract import LaunchContext
from dspark_ci.launchers.docker.hosts import DockerHost
from dspark_ci.launchers.docker.options import DockerOptions
from dspark_ci.launchers.docker.tuning import DockerTuning
from dspark_ci.launchers.materialize import resolve_env, server_argv, server_python
from dspark_ci.launchers.plan_types import LaunchPlan, RankCommand
from dspark_ci.sglang_sim.cpu_engine import cache_root

# Labels on everything we create: how teardown and `dspark-ci cleanup` find it.
LABEL_RUN, LABEL_CELL, LABEL_RANK, LABEL_LAUNCH = ("dspark-ci.run", "dspark-ci.cell", "dspark-ci.rank",
                                                  "dspark-ci.launch")
HF_CACHE_IN_CONTAINER = "/root/.cache/huggingface"


def _cuda_access(host: DockerHost) -> dict:
    if isinstance(host.gpus, tuple):
        request = DeviceRequest(device_ids=[str(g) for g in host.gpus], capabilities=[["gpu"]])
    else:
        request = DeviceRequest(count=-1 if host.gpus is None else host.gpus, capabilities=[["gpu"]])
    return {"device_requests": [request]}


ASCEND_DRIVER_MOUNTS = ("/usr/local/Ascend/driver", "/usr/local/Ascend/firmware", "/usr/local/dcmi",
                        "/usr/local/bin/npu-smi", "/usr/local/sbin", "/etc/ascend_install.info")
ASCEND_CONTROL_DEVICES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")


def _npu_access(host: DockerHost) -> dict:
    # An Atlas A3 node has 16 davinci devices; the inventory narrows them with ids or a count.
    ids = host.gpus if isinstance(host.gpus, tuple) else range(16 if host.gpus is None else host.gpus)
    devices = [f"/dev/davinci{i}" for i in ids] + list(ASCEND_CONTROL_DEVICES)
    return {"devices": [f"{d}:{d}:rwm" for d in devices],
            "volumes": {path: {"bind": path, "mode": "ro"} for path in ASCEND_DRIVER_MOUNTS}}


ROCM_DEVICES = ("/dev/kfd", "/dev/dri")  # the compute interface, and every GPU's render node


def _rocm_access(host: DockerHost) -> dict:
    """What SGLang's AMD docs (docs/platforms/amd_gpu.md) give a ROCm container: /dev/kfd and /dev/dri, the video
    group that owns them, and the seccomp/ptrace options ROCm needs; no NVIDIA device request. An inventory's
    device ids narrow the visible GPUs the ROCm way (ROCR_VISIBLE_DEVICES)."""
    access: dict = {"devices": [f"{d}:{d}:rwm" for d in ROCM_DEVICES], "group_add": ["video"],
                    "cap_add": ["SYS_PTRACE"], "security_opt": ["seccomp=unconfined"]}
    if isinstance(host.gpus, tuple):
        access["environment"] = {"ROCR_VISIBLE_DEVICES": ",".join(str(g) for g in host.gpus)}
    elif isinstance(host.gpus, int):
        access["environment"] = {"ROCR_VISIBLE_DEVICES": ",".join(str(g) for g in range(host.gpus))}
    return access


# accelerator (dspark_ci.ground.sglang.release.accelerator) -> how a container gets its devices
DEVICE_ACCESS: dict[str, Callable[[DockerHost], dict]] = {NVIDIA: _cuda_access, AMD: _rocm_access,
                                                         ASCEND: _npu_access}


def container_spec(command: RankCommand, host: DockerHost, image: str, labels: Mapping[str, str],
                   context: LaunchContext, tuning: DockerTuning, accelerator: str) -> dict:
    """Keyword arguments for ``client.containers.create`` for one node rank (no secrets resolved here; the
    environment is the caller's, see ``container_env``, plus what ``device_environment`` adds)."""
    volumes: dict[str, dict[str, str]] = {}
    spec: dict[str, Any] = {
        "image": image,
        "command": server_argv(command, context.server, python=_container_python(context)),
        "name": container_name(labels, command.node_rank),
        "labels": {**labels, LABEL_RANK: str(command.node_rank)},
        "network_mode": "host",  # ranks reach each other and we reach rank 0 as on bare nodes
        "ipc_mode": "host",
        "shm_size": tuning.shm_size,
        "init": True,  # a real PID 1 forwards SIGTERM, so `stop` is quick
        "detach": True,
        "volumes": volumes,
    }
    if context.server == "sglang":  # the simulator needs no devices and downloads nothing
        access = DEVICE_ACCESS.get(accelerator, lambda _host: {})(host)
        volumes.update(access.pop("volumes", {}))
        access.pop("environment", None)
        spec.update(access)
        if tuning.hf_cache:
            volumes[tuning.hf_cache] = {"bind": HF_CACHE_IN_CONTAINER, "mode": "rw"}
    volumes.update(engine_volumes(context))
    return spec


def _container_python(context: LaunchContext) -> str:
    return server_python(context.server, context.caller_env) if context.server == "sglang-engine" else "python3"


def engine_volumes(context: LaunchContext) -> dict[str, dict[str, str]]:
    """SGLang's real engine on the CPU (--server sglang-engine) runs in the simulator's Debian image from this
    machine's SGLang venv, the Python installation it links to, this dspark-ci's files and the engine's cache (the
    converted model, the compiled attention), bind-mounted read-only at the same paths: no image to build or pull,
    no network, no compiler in the container."""
    if context.server != "sglang-engine":
        return {}
    venv = Path(server_python(context.server, context.caller_env)).parent.parent
    cache = cache_root(context.caller_env)
    paths = (venv, *_base_python(venv), TREE, *([cache] if cache.is_dir() else []))
    return {str(path): {"bind": str(path), "mode": "ro"} for path in paths}


def _base_python(venv: Path) -> list[Path]:
    """The installation the venv's interpreter links to (pyvenv.cfg ``home``), unless the image has it (/usr)."""
    try:
        lines = (venv / "pyvenv.cfg").read_text().splitlines()
    except OSError:
        return []
    home = next((line.split("=", 1)[1].strip() for line in lines if line.split("=", 1)[0].strip() == "home"), "")
    prefix = Path(home).parent if home else None
    return [prefix] if prefix and prefix != Path("/usr") and prefix.is_dir() else []


def container_name(labels: Mapping[str, str], node_rank: int) -> str:
    """Readable in `docker ps`, unique per engine: cell, rank, and this launch's token."""
    cell = re.sub(r"[^A-Za-z0-9_.-]", "-", labels[LABEL_CELL])[:120]
    return f"dspark-{cell}-r{node_rank}-{labels[LABEL_LAUNCH]}"


def device_environment(host: DockerHost, accelerator: str, server: str) -> dict[str, str]:
    """Variables that pick the visible devices (ROCm narrows GPUs by environment, not by device request)."""
    if server != "sglang":
        return {}
    return dict(DEVICE_ACCESS.get(accelerator, lambda _host: {})(host).get("environment", {}))


def container_env(command: RankCommand, caller_env: Mapping[str, str], prefixes: tuple[str, ...]) -> dict[str, str]:
    """The caller's simulator knobs, then the plan's own environment with ``${NAME}`` filled in."""
    forwarded = {k: v for k, v in caller_env.items() if k.startswith(prefixes)}
    return {**forwarded, **resolve_env(command.env, caller_env)}


def files_to_copy(env: Mapping[str, str], prefixes: tuple[str, ...]) -> list[Path]:
    """Files on this machine that simulator knobs point at (e.g. DSPARK_SIM_GPQA_PATH): copied in, same path."""
    paths = [Path(v) for k, v in env.items() if k.startswith(prefixes) and v.startswith("/")]
    return [p for p in paths if p.is_file()]



def image_for(options: DockerOptions, context: LaunchContext, tuning: DockerTuning, plan: LaunchPlan) -> str:
    """The image a plan runs in: --image, else the simulator's, else the cell's, else SGLang's release image for
    its device and hardware (ROCm images for AMD hardware)."""
    if options.image:
        return options.image
    if context.server in ("sim", "sglang-engine"):
        return tuning.sim_image
    image = plan.image_to_run
    if not image:
        raise BadInput(plan.cell_id,
                       f"no container image for device {plan.device!r} on {plan.hardware or 'its hardware'}",
                       "set `image:` in the matrix")
    return image
