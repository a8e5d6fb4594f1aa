"""Cells side by side (`run --max-parallel N`) and per-cell timing, end to end on the simulated server, as a user
runs it: cells overlap in time, a cell that crashes while others measure fails alone with its own culprit, each
cell's timing adds up, SIGTERM tears every cell in flight down, and the history orders the next run longest first.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import time
import uuid
from datetime import datetime
from pathlib import Path
from xml.etree import ElementTree

import pytest
from dspark_ci.ground.sglang.release import DEFAULT_VERSION
from dspark_ci.launchers.contract import Capacity
from dspark_ci.matrices import load_cells
from dspark_ci.reports.history_db import cell_seconds

from dspark_ci.cell_queue import longest_first
from tests.cli_under_test import DSPARK_CI
from tests.process_table import assert_no_process_with_env

REPO = Path(__file__).resolve().parent.parent
MATRIX = """\
description: three one-node cells side by side; the b5 cell crashes on its first prefill
sglang: ">={version}"
hardware: {{cuda: h200}}
defaults:
  model: deepseek-ai/DeepSeek-V4-Flash
  model_slug: dsv4-flash
  device: cuda
  gpus_per_node: 8
  tp: 8
  moe_a2a_backend: none
  speculative_algorithm: DSPARK
  env:
    DSPARK_SIM_BOOT_SECONDS: "1"
    DSPARK_SIM_DECODE_STEP_MS: "{decode_ms}"
  suites:
    # greedy acceptance only: no non-speculative reference beside each cell (scheduling is what is tested here)
    accept: {{num_requests: {requests}, sampled_temperature: 0}}
include:
  - {{speculative_block_size: 3}}
  - {{speculative_block_size: 5, env: {{DSPARK_SIM_BOOT_SECONDS: "1", DSPARK_SIM_DECODE_STEP_MS: "{decode_ms}",
                                      DSPARK_SIM_FAULTS: crash_first_prefill}}}}
  - {{speculative_block_size: 7}}
"""
CRASHING = "dsv4-flash-tp8-a2a-none-dspark-b5-cuda"
HEALTHY = ("dsv4-flash-tp8-a2a-none-dspark-b3-cuda", "dsv4-flash-tp8-a2a-none-dspark-b7-cuda")


class SideBySide:
    def __init__(self, tmp_path: Path, decode_ms: int = 5, requests: int = 8):
        self.matrix = tmp_path / "side_by_side.yaml"
        self.matrix.write_text(MATRIX.format(version=DEFAULT_VERSION, decode_ms=decode_ms, requests=requests))
        self.out = tmp_path / "run"
        self.tag = uuid.uuid4().hex
        self.env = {**os.environ, "CI": "true", "DSPARK_TEST_RUN": self.tag,
                    "DSPARK_STATE_DIR": str(tmp_path / "state"), "DSPARK_HISTORY": str(tmp_path / "history.sqlite")}
        self.argv = [*DSPARK_CI, "run", str(self.matrix), "--max-parallel", "3", "--out", str(self.out)]

    def results(self) -> dict:
        return json.loads((self.out / "results.json").read_text())

    def cells(self) -> dict[str, dict]:
        return {cell["id"]: cell for cell in self.results()["cells"]}


def _at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_a_cell_that_crashes_while_others_measure_fails_alone_and_every_cell_is_timed(tmp_path):
    run = SideBySide(tmp_path)
    done = subprocess.run(run.argv, env=run.env, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert_no_process_with_env("DSPARK_TEST_RUN", run.tag)
    assert done.returncode == 1, done.stderr[-3000:]
    cells = run.cells()
    assert {cell_id: cells[cell_id]["status"] for cell_id in (*HEALTHY, CRASHING)} == {
        HEALTHY[0]: "passed", HEALTHY[1]: "passed", CRASHING: "error"}
    assert "crash_first_prefill" in cells[CRASHING]["sglang_error"]  # its own culprit, SGLang's line
    assert all(cells[c]["error"] is None and cells[c]["metrics"]["accept_length"] > 1 for c in HEALTHY)
    # side by side: every cell started before any finished
    assert max(_at(c["started_at"]) for c in cells.values()) < min(_at(c["finished_at"]) for c in cells.values())
    for cell in cells.values():  # the timing adds up: queue + boot + measure = start to finish
        assert _at(cell["started_at"]) <= _at(cell["ready_at"]) <= _at(cell["finished_at"])
        parts = cell["queue_seconds"] + cell["boot_seconds"] + cell["measure_seconds"]
        # Exact but for rounding to the millisecond (three rounded parts), whatever the load: the queue is what the
        # launcher's boot clock did not cover, so only when that clock read later than the cell's (queue clamped
        # at 0) may the parts exceed the whole, never fall short of it.
        if cell["queue_seconds"] > 0:
            assert parts == pytest.approx(cell["seconds"], abs=0.002), cell
        else:
            assert parts >= cell["seconds"] - 0.002, cell
    suites = {s.get("name"): s for s in ElementTree.parse(run.out / "junit.xml").getroot().iter("testsuite")}
    assert {name: float(s.get("time")) for name, s in suites.items()} == pytest.approx(
        {cell_id: cell["seconds"] for cell_id, cell in cells.items()}, abs=0.002)
    assert "## Time" in (run.out / "report.md").read_text()
    remembered = cell_seconds(Path(run.env["DSPARK_HISTORY"]), list(cells))
    assert remembered == pytest.approx({cell_id: cell["seconds"] for cell_id, cell in cells.items()})


def test_sigterm_twice_tears_down_every_cell_in_flight_and_records_each(tmp_path):
    run = SideBySide(tmp_path, decode_ms=200, requests=400)  # measuring takes minutes: still in flight at SIGTERM
    process = subprocess.Popen(run.argv, env=run.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               cwd=REPO)
    measuring: set[str] = set()
    deadline = time.monotonic() + 120
    while len(measuring) < 2 and time.monotonic() < deadline:  # both healthy cells measure (the third has crashed)
        line = process.stderr.readline()
        measuring |= {cell for cell in HEALTHY if f"{cell}: measuring" in line}
    assert len(measuring) == 2, "the cells never got to measuring"
    process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    process.send_signal(signal.SIGTERM)  # a second one while the cells tear down changes nothing
    _, rest = process.communicate(timeout=120)
    assert process.returncode == 130, rest[-3000:]
    assert_no_process_with_env("DSPARK_TEST_RUN", run.tag)
    results = run.results()
    assert results["interrupted"] is True and results["finished_at"] is None  # nothing claims it completed
    cells = run.cells()
    assert all(cells[c]["status"] == "error" and "interrupted" in cells[c]["error"] for c in HEALTHY)


def test_two_4_gpu_docker_cells_share_an_8_gpu_host_and_the_third_waits_for_its_gpus(tmp_path):
    """An inventory of one engine that says it has 8 GPUs: two cells of 4 GPUs each run on it side by side, the
    third starts when one of them has given its GPUs back."""
    from tests.docker_engines import ENGINE1, require_engine

    require_engine(ENGINE1)
    run = SideBySide(tmp_path)
    run.matrix.write_text(run.matrix.read_text().replace("gpus_per_node: 8\n  tp: 8", "gpus_per_node: 4\n  tp: 4"))
    (tmp_path / "hosts.yaml").write_text(f"hosts:\n  - url: {ENGINE1}\n    address: 127.0.0.1\n    gpus: 8\n")
    argv = [arg for arg in run.argv if arg not in ("--max-parallel", "3")]  # the inventory decides
    done = subprocess.run([*argv, "--launcher", "docker", "--hosts", str(tmp_path / "hosts.yaml")], env=run.env,
                          capture_output=True, text=True, timeout=400, cwd=REPO)
    assert done.returncode == 1, done.stderr[-3000:]  # the b5 cell crashes, alone
    assert "(8 GPUs on 1 Docker host(s)" in done.stderr
    cells = run.cells()
    assert sorted(cell["status"] for cell in cells.values()) == ["error", "passed", "passed"]
    first, second, third = sorted(cells.values(), key=lambda c: _at(c["started_at"]))
    assert _at(second["started_at"]) < _at(first["finished_at"])  # side by side on the one host
    assert _at(third["started_at"]) >= min(_at(first["finished_at"]), _at(second["finished_at"])) - 0.5


def test_cells_start_longest_first_within_the_nodes_there_are():
    cells = load_cells([str(REPO / "matrices" / "smoke.yaml")])
    by_id = {cell.id: cell for cell in cells}
    known = {cell.id: seconds for cell, seconds in zip(cells, (10.0, 30.0, 20.0), strict=False)}
    assert [c.id for c in longest_first(cells, known)] == sorted(by_id, key=lambda i: -known[i])
    untimed = longest_first(cells, {})  # an expected rejection is short; more nodes take longer
    assert [c.nnodes for c in untimed] == [2, 1, 1] and untimed[-1].expect.outcome == "reject"
    # the engine matrix on a fresh clone: cells that boot a parity reference beside them go before those that do not
    engine = [c for c in load_cells([str(REPO / "matrices" / "cpu-engine.yaml")]) if c.expect.outcome != "reject"]
    ordered = longest_first(engine, {})
    with_reference = [c for c in ordered if "parity" in c.suites]
    assert with_reference and ordered[:len(with_reference)] == with_reference and ordered[0].nnodes == 2
    three_nodes = Capacity(max_parallel=3, nodes=3)
    assert three_nodes.fits(1, [2]) and not three_nodes.fits(2, [2]) and not three_nodes.fits(1, [1, 1, 1])
    assert Capacity(max_parallel=2, nodes=1).fits(4, [])  # a cell larger than the fleet still runs, alone


def _slurm_cluster() -> None:
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%N"], capture_output=True, text=True, timeout=20)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        done = None
    if done is None or done.returncode != 0 or not done.stdout.strip():
        if os.environ.get("DSPARK_REQUIRE_SLURM") == "1":
            pytest.fail("no Slurm cluster answers (DSPARK_REQUIRE_SLURM=1)")
        pytest.skip("no Slurm cluster answers: start one with eval \"$(bash .ci/slurm-up.sh)\"")


def test_sigkill_during_cells_side_by_side_on_slurm_then_cleanup_leaves_no_job(tmp_path):
    _slurm_cluster()
    run = SideBySide(tmp_path, decode_ms=200, requests=400)
    partition = os.environ.get("DSPARK_SLURM_PARTITION")
    argv = [*run.argv, "--launcher", "slurm", *(["--slurm-partition", partition] if partition else [])]
    process = subprocess.Popen(argv, env=run.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               cwd=REPO)
    measuring: set[str] = set()
    deadline = time.monotonic() + 180
    while len(measuring) < 2 and time.monotonic() < deadline:
        line = process.stderr.readline()
        measuring |= {cell for cell in HEALTHY if f"{cell}: measuring" in line}
    run_id = run.results()["run_id"]
    jobs = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True, timeout=20).stdout
    assert len(measuring) == 2 and jobs.count(run_id) >= 2, jobs  # two cells' jobs running side by side
    process.kill()
    process.wait(timeout=30)
    cleanup = subprocess.run([*DSPARK_CI, "cleanup", "--run", run_id], env=run.env, capture_output=True, text=True,
                             timeout=180, cwd=REPO)
    assert cleanup.returncode == 0, cleanup.stderr
    assert cleanup.stdout.count("removed Slurm job") >= 2, cleanup.stdout
    jobs = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True, timeout=20).stdout
    assert run_id not in jobs
    assert_no_process_with_env("DSPARK_TEST_RUN", run.tag)


def test_cells_side_by_side_on_kubernetes_and_the_pod_quota_sets_how_many(tmp_path):
    """Against the test API server (LWS stand-in): three cells in flight as three LeaderWorkerSets, the crashing one
    fails alone, nothing is left; and a namespace's pod quota is what the k8s launcher offers as its capacity."""
    from dspark_ci.launchers.contract import LaunchContext
    from dspark_ci.launchers.k8s import lifecycle as k8s
    from dspark_ci.launchers.k8s import spec as k8s_spec
    from dspark_ci.launchers.k8s.options import K8sOptions
    from kubernetes import client

    from tests.k8s_cluster import require_k8s

    cluster = require_k8s()
    run = SideBySide(tmp_path)
    done = subprocess.run([*run.argv, "--launcher", "k8s", "--kubeconfig", cluster["kubeconfig"], "--namespace",
                           cluster["namespace"]], env=run.env, capture_output=True, text=True, timeout=400, cwd=REPO)
    assert done.returncode == 1, done.stderr[-3000:]
    cells = run.cells()
    assert [cells[c]["status"] for c in (*HEALTHY, CRASHING)] == ["passed", "passed", "error"]
    assert "crash_first_prefill" in cells[CRASHING]["sglang_error"]
    assert max(_at(c["started_at"]) for c in cells.values()) < min(_at(c["finished_at"]) for c in cells.values())
    launcher = k8s.build(LaunchContext(run_id=run.results()["run_id"], run_dir=run.out), K8sOptions(**cluster))
    selector = f"{k8s_spec.LABEL_RUN}={k8s_spec.label_value(run.results()['run_id'])}"
    assert launcher.api.core.list_namespaced_pod(cluster["namespace"], label_selector=selector).items == []
    assert launcher.capacity().max_parallel == 1  # no pod quota: one at a time unless --max-parallel
    quota = client.V1ResourceQuota(metadata=client.V1ObjectMeta(name=f"pods-{run.tag[:8]}"),
                                   spec=client.V1ResourceQuotaSpec(hard={"pods": "5"}))
    core = launcher.api.core
    core.create_namespaced_resource_quota(cluster["namespace"], quota)
    try:  # no quota controller here: its status (what a cluster reports) is written as one would
        core.patch_namespaced_resource_quota_status(quota.metadata.name, cluster["namespace"],
                                                    {"status": {"hard": {"pods": "5"}, "used": {"pods": "2"}}})
        capacity = launcher.capacity()
        assert (capacity.max_parallel, capacity.nodes) == (3, 3) and "quota" in capacity.why
    finally:
        core.delete_namespaced_resource_quota(quota.metadata.name, cluster["namespace"])


def test_docker_cells_side_by_side_take_a_host_each_and_the_third_waits(tmp_path):
    """An inventory of two engines: two cells in flight, each on a host of its own (never both on the first); the
    third starts when a host is free; the crashing cell fails alone."""
    from tests.docker_engines import ENGINE1, ENGINE2, require_engine

    require_engine(ENGINE1)
    require_engine(ENGINE2)
    run = SideBySide(tmp_path)
    run.env["DSPARK_DOCKER_HOSTS"] = f"{ENGINE1}=127.0.0.1 {ENGINE2}=127.0.0.2"
    argv = [arg for arg in run.argv if arg not in ("--max-parallel", "3")]  # the inventory decides: 2
    done = subprocess.run([*argv, "--launcher", "docker"], env=run.env, capture_output=True, text=True,
                          timeout=400, cwd=REPO)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "up to 2 cells side by side (2 Docker host(s)" in done.stderr
    cells = run.cells()
    assert [cells[c]["status"] for c in (*HEALTHY, CRASHING)] == ["passed", "passed", "error"]
    by_start = sorted(cells.values(), key=lambda c: _at(c["started_at"]))
    first, second, third = by_start
    assert _at(second["started_at"]) < _at(first["finished_at"])  # side by side
    assert _at(third["started_at"]) >= min(_at(first["finished_at"]), _at(second["finished_at"])) - 0.5
    hosts = [(run.out / "logs" / c["id"] / "0.log").read_text().split("--host ")[1].split()[0] for c in (first, second)]
    assert sorted(hosts) == ["127.0.0.1", "127.0.0.2"]


def test_a_cell_whose_own_thread_saw_the_interrupt_first_is_recorded_cut_short():
    """Every wait checks the interrupt flag, so a cell's thread may end on it before the scheduler's loop does:
    the scheduler then gets that cell's KeyboardInterrupt as its outcome. The cell is cut short, never lost."""
    from dspark_ci.cell_queue import Interrupted, Scheduler

    cells = load_cells([str(REPO / "matrices" / "smoke.yaml")])[:2]
    first_seen = cells[0].id

    def run_one(cell):
        if cell.id == first_seen:
            raise KeyboardInterrupt("SIGTERM")  # this thread saw the flag first
        for _ in range(300):  # the other cell measures until the teardown interrupts it (between two polls)
            time.sleep(0.1)

    with pytest.raises(Interrupted) as stop:
        Scheduler(cells, run_one, Capacity(max_parallel=2)).run()
    assert sorted(cell.id for cell in stop.value.cut_short) == sorted(cell.id for cell in cells)
    assert stop.value.finished == () and stop.value.not_started == ()


def test_a_cell_and_its_reference_hold_twice_its_nodes_so_cells_never_wait_on_each_other():
    """Two one-node cells that each launch a one-node reference on three nodes: beside each other they would hold
    two nodes and each wait for the third, for ever; counted with their references, they run one after the other."""
    import threading

    from dspark_ci.cell_queue import Scheduler, need_of
    from dspark_ci.reference_boot import launches_reference

    smoke = load_cells([str(REPO / "matrices" / "smoke.yaml")])
    one_node = [cell for cell in smoke if cell.nnodes == 1 and not cell.expect.rejects][:1] * 2
    assert launches_reference(one_node[0], ("accept",)) and not launches_reference(one_node[0], ("gpqa",))
    in_flight, most, lock = [0], [0], threading.Lock()

    def run_one(cell):
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        time.sleep(0.3)
        with lock:
            in_flight[0] -= 1

    cells = [dataclasses.replace(cell, id=f"{cell.id}-{n}") for n, cell in enumerate(one_node)]
    Scheduler(cells, run_one, Capacity(max_parallel=3, nodes=3),
              need=lambda cell: need_of(cell, launches_reference(cell, ("accept",)))).run()
    assert most[0] == 1
    Scheduler(cells, run_one, Capacity(max_parallel=3, nodes=3), need=need_of).run()
    assert most[0] == 2  # without references, side by side
