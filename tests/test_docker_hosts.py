"""The Docker hosts inventory and container specs: what a user writes, and what engines are asked for.

No Docker engine needed: these run everywhere.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from dspark_ci.ground.errors import BadInput
from dspark_ci.ground.sglang.release import DEVICE_IMAGES, ROCM_IMAGES, accelerator
from dspark_ci.launchers.contract import LaunchContext
from dspark_ci.launchers.docker.hosts import HOSTS_ENV, load_inventory
from dspark_ci.launchers.docker.lifecycle import DockerLauncher
from dspark_ci.launchers.docker.options import DockerOptions
from dspark_ci.launchers.docker.spec import LABEL_CELL, LABEL_LAUNCH, LABEL_RUN, container_spec, device_environment
from dspark_ci.launchers.docker.tuning import DockerTuning
from dspark_ci.launchers.plan_types import SGLANG_ENTRYPOINT, LaunchPlan, RankCommand

from tests.cli_under_test import DSPARK_CI

REPO = Path(__file__).resolve().parent.parent


def run_docker(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`dspark-ci run` of the smoke matrix on the Docker launcher (inventories are read before anything starts)."""
    return subprocess.run([*DSPARK_CI, "run", "matrices/smoke.yaml", "--launcher", "docker", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"], **(env or {})})


def test_inventory_file_places_node_rank_r_on_host_r(tmp_path):
    path = tmp_path / "hosts.yaml"
    path.write_text("hosts:\n"
                    "  - url: ssh://ci@gpu-node-1\n"
                    "    gpus: [0, 1, 2, 3]\n"
                    "  - url: tcp://10.0.0.12:2375\n"
                    "    address: node-2.internal\n"
                    "    gpus: 8\n"
                    "    labels: {rack: b}\n")
    placement = load_inventory(str(path), {}).placement(2, port=30000, dist_port=20000)
    assert placement.bind_hosts == ("gpu-node-1", "node-2.internal")
    assert placement.leader_addr == "gpu-node-1"  # --dist-init-addr is rank 0's address


def test_environment_lists_engines_with_addresses():
    inventory = load_inventory(None, {"DSPARK_DOCKER_HOSTS": "unix:///var/run/docker.sock "
                                                             "unix:///run/dspark-docker2.sock=127.0.0.9"})
    assert [(h.url, h.address) for h in inventory.hosts] == [
        ("unix:///var/run/docker.sock", "127.0.0.1"), ("unix:///run/dspark-docker2.sock", "127.0.0.9")]


@pytest.mark.parametrize("environ, url", [
    ({}, "unix:///var/run/docker.sock"),
    ({"DOCKER_HOST": "tcp://127.0.0.1:2375"}, "tcp://127.0.0.1:2375"),
], ids=["default-socket", "docker-host"])
def test_default_is_the_local_engine(environ, url):
    assert [h.url for h in load_inventory(None, environ).hosts] == [url]


def launcher_of(tmp_path, server: str = "sim", run_id: str = "r1", env: dict | None = None,
                **options) -> DockerLauncher:
    """A Docker launcher that only places and chooses images here (no engine is dialled); ``env``: the caller's."""
    context = LaunchContext(run_id=run_id, run_dir=tmp_path / "run", server=server, caller_env=env or {})
    return DockerLauncher(DockerOptions(**options), context)


def test_too_few_hosts_for_a_multi_node_cell_is_bad_input(tmp_path):
    launcher = launcher_of(tmp_path, env={HOSTS_ENV: "unix:///var/run/docker.sock"})
    with pytest.raises(BadInput) as failure:
        launcher.placement(2)
    assert "a 2-node cell needs 2 Docker hosts, the inventory lists 1" in str(failure.value)
    assert failure.value.exit_code == 2


def test_without_an_inventory_the_local_engine_hosts_every_node_on_its_own_loopback_address():
    hosts = load_inventory(None, {}).hosts_for(3)
    assert [(h.url, h.address) for h in hosts] == [("unix:///var/run/docker.sock", f"127.0.0.{r}") for r in (1, 2, 3)]


@pytest.mark.parametrize("text, where, problem", [
    ("hosts:\n  - url: ftp://x\n", ":2", "'ftp://x' is not a Docker engine URL"),
    ("hosts:\n  - url: unix:///s\n    gpu: 2\n", ":3", "unknown host key 'gpu'"),
    ("hosts:\n  - url: unix:///s\n    gpus: two\n", ":2", "gpus must be a count or a list of device ids"),
    ("hosts:\n  - address: 1.2.3.4\n", ":2", "each host needs a `url`"),
    ("hosts: []\n", ":1", "needs a non-empty `hosts:` list"),
    ("hosts:\n  - url: [unclosed\n", ":3", "not valid YAML"),
], ids=["bad-scheme", "unknown-key", "bad-gpus", "no-url", "empty", "bad-yaml"])
def test_bad_inventory_is_one_message_with_file_and_line(tmp_path, text, where, problem):
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    result = run_docker("--hosts", str(path))
    assert result.returncode == 2
    assert f"{path}{where}: " in result.stderr and problem in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unreachable_engine_exits_3_naming_it_before_anything_starts():
    result = run_docker("--cell", "dsv4-flash-tp8-a2a-none-dspark-b7-cuda",
                        env={"DSPARK_DOCKER_HOSTS": "unix:///nonexistent/docker.sock"})
    assert result.returncode == 3
    assert "Docker engine unix:///nonexistent/docker.sock does not answer" in result.stderr
    assert "is dockerd running" in result.stderr


# --- what each rank's container is asked for ---------------------------------------------------------

LABELS = {LABEL_RUN: "r1", LABEL_CELL: "cell-a", LABEL_LAUNCH: "abcd1234"}


def spec_for(tmp_path, server: str, device: str, gpus_line: str = "", hardware: str | None = None) -> dict:
    path = tmp_path / "hosts.yaml"
    path.write_text(f"hosts:\n  - url: ssh://ci@node-1\n{gpus_line}")
    host = load_inventory(str(path), {}).hosts[0]
    command = RankCommand(0, [*SGLANG_ENTRYPOINT, "--model-path", "m", "--device", device])
    context = LaunchContext(run_id="r1", run_dir=tmp_path / "run", server=server, caller_env={})
    return container_spec(command, host, "img", LABELS, context, DockerTuning(), accelerator(device, hardware))


def test_simulator_containers_get_no_devices_and_run_the_simulator(tmp_path):
    spec = spec_for(tmp_path, "sim", "cuda")
    assert spec["command"][:3] == ["python3", "-m", "dspark_ci.sglang_sim"]
    assert "device_requests" not in spec and "devices" not in spec and spec["volumes"] == {}
    assert (spec["network_mode"], spec["ipc_mode"]) == ("host", "host")
    assert spec["labels"] == {**LABELS, "dspark-ci.rank": "0"}


@pytest.mark.parametrize("gpus_line, expected", [
    ("", {"Count": -1, "DeviceIDs": []}),  # docker run --gpus all
    ("    gpus: 4\n", {"Count": 4, "DeviceIDs": []}),
    ("    gpus: [2, 3]\n", {"Count": 0, "DeviceIDs": ["2", "3"]}),
], ids=["all-gpus", "gpu-count", "gpu-ids"])
def test_cuda_containers_request_the_inventorys_gpus(tmp_path, gpus_line, expected):
    spec = spec_for(tmp_path, "sglang", "cuda", gpus_line)
    (request,) = spec["device_requests"]
    assert {"Count": request["Count"], "DeviceIDs": request["DeviceIDs"]} == expected
    assert request["Capabilities"] == [["gpu"]]
    assert spec["command"][:3] == list(SGLANG_ENTRYPOINT)
    assert spec["volumes"]["/root/.cache/huggingface"]["bind"] == "/root/.cache/huggingface"


def test_npu_containers_mount_the_ascend_devices_and_driver(tmp_path):
    spec = spec_for(tmp_path, "sglang", "npu", "    gpus: [0, 1]\n")
    devices = [d.split(":")[0] for d in spec["devices"]]
    assert devices == ["/dev/davinci0", "/dev/davinci1", "/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"]
    assert spec["volumes"]["/usr/local/Ascend/driver"] == {"bind": "/usr/local/Ascend/driver", "mode": "ro"}
    assert "device_requests" not in spec


@pytest.mark.parametrize("gpus_line", ["", "    gpus: [2, 3]\n"], ids=["all-gpus", "gpu-ids"])
def test_amd_containers_get_kfd_dri_and_the_video_group_not_an_nvidia_request(tmp_path, gpus_line):
    # SGLang's AMD docs (docs/platforms/amd_gpu.md): --device=/dev/kfd --device=/dev/dri --group-add video ...
    spec = spec_for(tmp_path, "sglang", "cuda", gpus_line, hardware="mi355")
    assert [d.split(":")[0] for d in spec["devices"]] == ["/dev/kfd", "/dev/dri"]
    assert spec["group_add"] == ["video"] and "seccomp=unconfined" in spec["security_opt"]
    assert "device_requests" not in spec and "environment" not in spec
    host = load_inventory(None, {}).hosts[0]
    assert device_environment(host, "amd", "sglang") == {}  # every GPU of the node
    path = tmp_path / "hosts.yaml"
    if gpus_line:
        narrowed = load_inventory(str(path), {}).hosts[0]
        assert device_environment(narrowed, "amd", "sglang") == {"ROCR_VISIBLE_DEVICES": "2,3"}
        assert device_environment(narrowed, "amd", "sim") == {}


@pytest.mark.parametrize("server, image_setting, plan_image, expected", [
    ("sim", None, DEVICE_IMAGES["cuda"], "dspark-ci/sglang-sim:latest"),
    ("sglang", None, "my/sglang:dev", "my/sglang:dev"),
    ("sglang", None, None, DEVICE_IMAGES["cuda"]),
    ("sglang", "override:1", "my/sglang:dev", "override:1"),
], ids=["simulator-replaces-cell-image", "cell-image", "device-default", "override-wins"])
def test_image_choice(tmp_path, server, image_setting, plan_image, expected):
    launcher = launcher_of(tmp_path, server, image=image_setting)
    plan = LaunchPlan("c", (RankCommand(0, list(SGLANG_ENTRYPOINT)),), "http://h/health", "http://h", image=plan_image)
    assert launcher.image_for(plan) == expected


@pytest.mark.parametrize("hardware, expected, family", [
    ("h200", DEVICE_IMAGES["cuda"], ""),
    ("mi355", ROCM_IMAGES["mi355"], "-mi35x"),  # docker/rocm.Dockerfile: gfx950 -> -rocm700-mi35x
    ("mi300x", ROCM_IMAGES["mi300x"], "-mi30x"),  # gfx942 -> -rocm700-mi30x
])
def test_amd_hardware_runs_the_rocm_release_image(tmp_path, hardware, expected, family):
    launcher = launcher_of(tmp_path, "sglang")
    plan = LaunchPlan("c", (RankCommand(0, [*SGLANG_ENTRYPOINT, "--device", "cuda"]),), "http://h/health", "http://h",
                      hardware=hardware)
    assert launcher.image_for(plan) == expected and expected.endswith(family)  # the GPU family's image


def remote_launcher(tmp_path, run_id: str) -> DockerLauncher:
    """Two nodes on remote engines (ssh:// is never dialled for placement) whose addresses are loopback, so the
    free-port check really connects."""
    path = tmp_path / f"hosts-{run_id}.yaml"
    path.write_text("hosts:\n  - url: ssh://ci@node-1\n    address: 127.0.0.1\n"
                    "  - url: ssh://ci@node-2\n    address: 127.0.0.2\n")
    return launcher_of(tmp_path, run_id=run_id, hosts=str(path))


def test_two_runs_on_the_same_remote_engines_get_different_ports(tmp_path):
    first = remote_launcher(tmp_path, "run-a").placement(2)
    second = remote_launcher(tmp_path, "run-b").placement(2)
    assert first.port != second.port and first.dist_port != second.dist_port
    assert first.bind_hosts == ("127.0.0.1", "127.0.0.2") == second.bind_hosts


def test_cells_placed_at_the_same_moment_get_hosts_of_their_own(tmp_path):
    """Two cells side by side on a two-host inventory each get a host, even when both are placed before either
    launches (seen in CI: two cells placed at once both took the first host); a torn-down cell's host is free."""
    from dspark_ci.launchers.docker.lifecycle import HostLeases

    inventory = load_inventory(None, {"DSPARK_DOCKER_HOSTS": "ssh://a=127.0.0.1 ssh://b=127.0.0.2"})
    leases = HostLeases(inventory)
    first, second = leases.take(1), leases.take(1)  # neither placed yet
    assert {first[0].address, second[0].address} == {"127.0.0.1", "127.0.0.2"}
    placement = remote_launcher(tmp_path, "run-d").placement(1)
    leases.placed(placement, first)
    plan = LaunchPlan(cell_id="c", ranks=(), health_url="", base_url=f"http://{placement.leader_addr}:{placement.port}")
    leases.release(plan)
    assert leases.take(1) == first


def test_a_port_something_listens_on_is_skipped(tmp_path):
    import socket

    expected = remote_launcher(tmp_path, "run-c").placement(2)
    with socket.socket() as busy:
        busy.bind(("127.0.0.2", expected.port))  # node 2 already serves something there
        busy.listen()
        placed = remote_launcher(tmp_path, "run-c").placement(2)
    assert placed.port != expected.port


class StreamDroppingContainer:
    """Test stand-in for a docker-py Container whose log stream ends twice while it still runs (an idle
    connection dropped), then exits: the calls the log pump makes, nothing else."""

    def __init__(self):
        self.calls: list = []
        self.status = "running"
        self.streams = [[b"2026-11-30T10:00:00.100000000Z booting\n"],
                        [b"2026-11-30T10:00:40.000000000Z still loading\n2026-11-30T10:00:41.5Z ready\n"],
                        [b"2026-11-30T10:01:00.000000000Z ValueError: late\n"]]

    def logs(self, stream=False, follow=False, stdout=True, stderr=True, timestamps=False, since=None, tail=None):
        self.calls.append(since)
        chunks = self.streams.pop(0)
        if not self.streams:
            self.status = "exited"
        return iter(chunks)

    def reload(self):
        pass


def test_a_log_stream_that_ends_while_the_rank_runs_is_followed_again(tmp_path):
    from dspark_ci.launchers.docker.group import LogPump

    container = StreamDroppingContainer()
    pump = LogPump(container, tmp_path / "0.log", "# header\n", secrets=[])
    pump._pump()  # the thread's body, run here
    assert (tmp_path / "0.log").read_text() == "# header\nbooting\nstill loading\nready\nValueError: late\n"
    assert container.calls[0] is None  # from the start, then after each last line seen
    assert container.calls[2] == pytest.approx(_epoch("2026-11-30T10:00:41.5"), abs=1e-3)  # from the last line


def _epoch(text: str) -> float:
    from datetime import datetime, timezone

    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


def gpu_launcher(tmp_path, run_id: str, *gpus_lines: str) -> DockerLauncher:
    """Remote engines (never dialled for placement) on loopback addresses, each with its `gpus:` line."""
    path = tmp_path / f"hosts-{run_id}.yaml"
    path.write_text("hosts:\n" + "".join(f"  - url: ssh://ci@node-{i + 1}\n    address: 127.0.0.{i + 1}\n{line}"
                                         for i, line in enumerate(gpus_lines)))
    return launcher_of(tmp_path, run_id=run_id, hosts=str(path))


def leased_gpus(launcher: DockerLauncher, placement) -> list[tuple[str, tuple[int, ...]]]:
    plan = LaunchPlan(cell_id="c", ranks=(), health_url="", base_url=f"http://{placement.leader_addr}:{placement.port}")
    return [(host.address, host.gpus) for host in launcher._leases.hosts_of(plan)]


def test_an_8_gpu_host_holds_two_4_gpu_cells_side_by_side_each_with_gpus_of_its_own(tmp_path):
    from dspark_ci.launchers.contract import Need

    launcher = gpu_launcher(tmp_path, "run-g", "    gpus: 8\n", "    gpus: [4, 5, 6, 7]\n")
    capacity = launcher.capacity()
    assert capacity.host_gpus == (8, 4) and "12 GPUs on 2 Docker host(s)" in capacity.why
    four = Need(1, 4)
    assert capacity.fits(four, [four]) and capacity.fits(four, [four, four])  # 12 GPUs: three 4-GPU cells
    assert not capacity.fits(four, [four, four, four])
    assert capacity.fits(Need(1, 8), [four])  # packed: the first 4-GPU cell took the 4-GPU host whole
    assert not capacity.fits(Need(1, 8), [four, four])
    assert not capacity.fits(Need(2, 4), [Need(1, 8), four])  # a 2-node cell needs room on two hosts

    first, second, third = (launcher.placement(1, 4) for _ in range(3))
    leases = [leased_gpus(launcher, p) for p in (first, second, third)]
    assert leases[0] == [("127.0.0.2", (4, 5, 6, 7))]  # the fullest host with room first
    assert leases[1] == [("127.0.0.1", (0, 1, 2, 3))] and leases[2] == [("127.0.0.1", (4, 5, 6, 7))]
    spec = container_spec(RankCommand(0, [*SGLANG_ENTRYPOINT, "--device", "cuda"]), launcher._leases.hosts_of(
        LaunchPlan("c", (), "", f"http://{third.leader_addr}:{third.port}"))[0], "img", LABELS,
        LaunchContext("r1", tmp_path / "run", server="sglang", caller_env={}), DockerTuning(), "nvidia")
    assert spec["device_requests"][0]["DeviceIDs"] == ["4", "5", "6", "7"]  # the container sees its own GPUs only
    launcher._leases.release(LaunchPlan("c", (), "", f"http://{second.leader_addr}:{second.port}"))
    assert leased_gpus(launcher, launcher.placement(1, 4)) == [("127.0.0.1", (0, 1, 2, 3))]  # given back, reused


def test_an_inventory_without_gpu_counts_still_counts_hosts(tmp_path):
    launcher = gpu_launcher(tmp_path, "run-h", "    gpus: 8\n", "")  # one host does not say: hosts are the unit
    capacity = launcher.capacity()
    assert (capacity.max_parallel, capacity.nodes, capacity.host_gpus) == (2, 2, ())
    first, second = launcher.placement(1, 4), launcher.placement(1, 4)
    assert {first.leader_addr, second.leader_addr} == {"127.0.0.1", "127.0.0.2"}  # a host each, as before
    assert leased_gpus(launcher, first)[0][1] in (8, None)  # the host as listed: all its GPUs
