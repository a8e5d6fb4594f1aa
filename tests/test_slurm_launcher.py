"""The Slurm launcher against a real Slurm cluster (.ci/slurm-up.sh: slurmctld + one slurmd per node on this
machine, each node on its own loopback address with 8 GPUs as countable GRES) running the simulator.

Without a cluster that answers (`sinfo`, with SLURM_CONF from `eval "$(bash .ci/slurm-up.sh)"`) these tests skip,
saying so, unless DSPARK_REQUIRE_SLURM=1, where that is a failure. Tests never assume they are alone on the
cluster: each one's cell id carries a unique marker, found in job names and comments.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
import requests
from dspark_ci.ground.errors import BadInput, InfraError
from dspark_ci.ground.ledger import Ledger
from dspark_ci.ground.sglang.release import DEVICE_IMAGES
from dspark_ci.launchers import catalog
from dspark_ci.launchers.contract import LaunchContext, LaunchFailed, LaunchTimeout, group_failed
from dspark_ci.launchers.plan_types import LaunchPlan, Placement
from dspark_ci.launchers.slurm import commands, lifecycle, script
from dspark_ci.launchers.slurm.lifecycle import SlurmLauncher
from dspark_ci.launchers.slurm.options import SlurmOptions
from dspark_ci.launchers.slurm.tuning import SlurmTuning

from tests.sim_plans import FAST_SIM, make_plan

REPO = Path(__file__).resolve().parents[1]
SECRET = "hf_slurm_secret_marker_4417"
PARTITION = os.environ.get("DSPARK_SLURM_PARTITION") or None
CUDA_IMAGE = DEVICE_IMAGES["cuda"]


def _unavailable(reason: str):
    if os.environ.get("DSPARK_REQUIRE_SLURM") == "1":
        pytest.fail(f"{reason} (DSPARK_REQUIRE_SLURM=1)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def cluster() -> dict[str, int]:
    """Nodes of the test partition and their GPUs; skips (or fails in CI) without a Slurm cluster that answers."""
    conf = os.environ.get("SLURM_CONF")
    if conf and not Path(conf).is_file():  # sinfo would retry for a minute
        _unavailable(f"SLURM_CONF={conf} does not exist: start the cluster with eval \"$(bash .ci/slurm-up.sh)\"")
    args = ["sinfo", "-h", "-N", "-o", "%N|%G"] + (["-p", PARTITION] if PARTITION else [])
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=20)
    except FileNotFoundError:
        _unavailable("Slurm is not installed here (no sinfo): .ci/slurm-up.sh installs and starts a cluster")
    except subprocess.TimeoutExpired:
        _unavailable("sinfo does not answer within 20 s: start the cluster with eval \"$(bash .ci/slurm-up.sh)\"")
    if done.returncode != 0 or not done.stdout.strip():
        said = done.stderr.strip().splitlines()[-1][:200] if done.stderr.strip() else "no nodes"
        _unavailable(f"no Slurm cluster answers (sinfo: {said}): "
                     "start one with eval \"$(bash .ci/slurm-up.sh)\"")
    nodes = {}
    for line in done.stdout.splitlines():
        node, _, gres = line.partition("|")
        nodes[node] = commands.gpus_of(gres)
    if len(nodes) < 2:
        _unavailable(f"the Slurm partition has {len(nodes)} node(s); these tests need 2")
    return nodes


@pytest.fixture
def marker() -> str:
    return f"slurmtest-{uuid.uuid4().hex[:8]}"


def with_gpus(plan: LaunchPlan, gpus: int) -> LaunchPlan:
    """The plan asking for ``gpus`` GPUs per node."""
    return replace(plan, gpus_per_node=gpus)


def slurm_launcher(tmp_path: Path, faults: str = "", boot_timeout_s: float = 30.0, caller_env=None, progress=None,
                   **options) -> SlurmLauncher:
    """A launcher on the test cluster: the options as a user gives them, the run's context, quick polling."""
    caller_env = caller_env or {**os.environ, **FAST_SIM, "DSPARK_SIM_FAULTS": faults, "HF_TOKEN": SECRET}
    context = LaunchContext(run_id=f"t{uuid.uuid4().hex[:6]}", run_dir=tmp_path / "run", server="sim",
                            boot_timeout_s=boot_timeout_s, caller_env=caller_env)
    return SlurmLauncher(SlurmOptions(**{"partition": PARTITION, "queue_timeout_s": 60.0, **options}), context,
                         SlurmTuning(poll_s=0.2, progress=progress))


def plan_for(launcher: SlurmLauncher, nnodes: int, marker: str, gpus: int = 1) -> LaunchPlan:
    return with_gpus(make_plan(launcher.placement(nnodes), nnodes, marker), gpus)


def jobs_with(marker: str) -> list[str]:
    """Jobs in the queue (any state squeue shows) whose name or comment carries the marker."""
    out = subprocess.run(["squeue", "-h", "-o", "%i|%j|%k|%T"], capture_output=True, text=True, timeout=20).stdout
    return [line for line in out.splitlines() if marker in line]


def assert_nothing_left(marker: str, job_id: str | None) -> None:
    assert jobs_with(marker) == [], "the job is still in squeue"
    if job_id:
        assert commands.is_over(commands.job_info(job_id, os.environ, 20)["JobState"])
        assert commands.job_processes(job_id) == [], "a process of the job is still running"


def headers(logs: Path, nnodes: int) -> list[str]:
    return [(logs / f"{rank}.log").read_text().splitlines()[0] for rank in range(nnodes)]


def test_two_nodes_serve_from_two_slurm_nodes_then_nothing_is_left(cluster, tmp_path, marker):
    launcher = slurm_launcher(tmp_path)
    plan = plan_for(launcher, 2, marker)
    launcher.preflight([plan])
    logs = tmp_path / "logs"
    with launcher.launch(plan, logs) as deployment:
        job_id = deployment.job_id
        models = requests.get(f"{deployment.base_url}/v1/models", timeout=5).json()
        assert [m["id"] for m in models["data"]] == [marker]
        deployment.check()
        assert deployment.boot_seconds > 0
        assert len(jobs_with(marker)) == 1
    assert_nothing_left(marker, job_id)
    # Each task computed its own rank: node ranks 0 and 1, on two different Slurm nodes, rank 0 = the leader.
    first, second = headers(logs, 2)
    assert first.startswith("# node rank 0 on ") and second.startswith("# node rank 1 on ")
    node0, node1 = first.split()[5], second.split()[5]
    assert node0 != node1 and {node0, node1} <= set(cluster)
    assert f"leader {node0} " in first and f"leader {node0} " in second
    assert f"job {job_id}" in first
    assert "--node-rank 0 " in (logs / "0.log").read_text() and "--node-rank 1 " in (logs / "1.log").read_text()
    assert deployment.base_url.startswith(f"http://{commands.node_address(node0, os.environ, 20)}:")
    # The script is kept; the secret was passed through sbatch's environment, never written anywhere.
    script = (logs / "job.sbatch").read_text()
    assert "sbatch" in script.splitlines()[2] and "#SBATCH --gpus-per-node=1" in script
    for path in logs.iterdir():
        assert SECRET not in path.read_text(errors="replace"), path
    recorded = [e for e in Ledger("slurm-test", tmp_path / "run").entries() if e.job_id]
    assert [e.job_id for e in recorded] == [job_id] and recorded[0].launcher == "slurm"


def test_a_rank_exit_names_node_rank_1_within_seconds(cluster, tmp_path, marker, monkeypatch):
    reported_at: list[float] = []

    def timed_group_failed(*args, **kwargs):
        reported_at.append(time.time())
        return group_failed(*args, **kwargs)

    monkeypatch.setattr(lifecycle, "group_failed", timed_group_failed)
    launcher = slurm_launcher(tmp_path, faults="rank_exit=1:3")
    logs = tmp_path / "logs"
    job_id = None
    with pytest.raises(LaunchFailed) as caught:
        with launcher.launch(plan_for(launcher, 2, marker), logs) as deployment:
            job_id = deployment.job_id
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                deployment.check()
                time.sleep(0.2)
            pytest.fail("node rank 1 was configured to exit after 3 s")
    err = caught.value
    assert (err.reason, err.node_rank, err.rank_exit_code) == ("exited", 1, 1)
    assert "rank_exit" in (err.sglang_error or "")
    assert "node rank 1 on " in str(err) and "1.log" in str(err)
    exited_at = float((logs / "1.exit").read_text().split()[-1])
    assert reported_at[0] - exited_at < 3.0, f"reported {reported_at[0] - exited_at:.1f}s after rank 1 exited"
    job_id = job_id or next(iter(e.job_id for e in Ledger("slurm-test", tmp_path / "run").entries() if e.job_id))
    assert_nothing_left(marker, job_id)


def test_a_hung_boot_times_out_naming_what_it_awaited(cluster, tmp_path, marker):
    launcher = slurm_launcher(tmp_path, faults="hang_boot", boot_timeout_s=3.0)
    with pytest.raises(LaunchTimeout) as caught:
        with launcher.launch(plan_for(launcher, 1, marker), tmp_path / "logs"):
            pytest.fail("a hung server must not become healthy")
    message = str(caught.value)
    assert "waited 3s for HTTP 200 from http://" in message and "/health" in message
    assert caught.value.exit_code == 3
    assert jobs_with(marker) == []


def test_a_job_that_stays_pending_times_out_with_slurms_reason(cluster, tmp_path, marker):
    messages: list[str] = []
    launcher = slurm_launcher(tmp_path, queue_timeout_s=2.0, extra=("--begin=now+1hour",),
                              progress=messages.append)
    with pytest.raises(LaunchTimeout) as caught:
        with launcher.launch(plan_for(launcher, 1, marker), tmp_path / "logs"):
            pytest.fail("a job held until later must not run")
    message = str(caught.value)
    assert " pending (BeginTime) for " in message and "partition " in message and "queue limit" in message
    assert any("(BeginTime)" in m for m in messages)
    assert jobs_with(marker) == []


def test_preflight_refuses_cells_that_can_never_fit_before_submitting(cluster, tmp_path, marker):
    launcher = slurm_launcher(tmp_path)
    most = max(cluster.values())
    with pytest.raises(BadInput) as caught:
        launcher.preflight([plan_for(launcher, 1, f"{marker}-ok"), plan_for(launcher, 2, marker, gpus=most + 8)])
    text = str(caught.value)
    assert marker in text and f"asks for {most + 8} GPUs per node" in text and f"at most {most}" in text
    assert "partition " in text and caught.value.exit_code == 2
    with pytest.raises(BadInput, match=f"needs {len(cluster) + 1} nodes"):
        launcher.preflight([plan_for(launcher, len(cluster) + 1, marker)])
    assert jobs_with(marker) == []


def test_preflight_names_a_missing_partition_and_a_silent_cluster(cluster, tmp_path, marker):
    with pytest.raises(InfraError, match="partition 'no-such-partition' does not exist .*known: "):
        slurm_launcher(tmp_path, partition="no-such-partition").preflight([])
    env = {**os.environ, "SLURM_CONF": str(tmp_path / "missing.conf")}
    with pytest.raises(InfraError, match="Slurm does not answer.*SLURM_CONF"):
        slurm_launcher(tmp_path, caller_env=env).preflight([])


def test_ctrl_c_inside_the_block_leaves_nothing(cluster, tmp_path, marker):
    launcher = slurm_launcher(tmp_path)
    job_id = None
    with pytest.raises(KeyboardInterrupt):
        with launcher.launch(plan_for(launcher, 2, marker), tmp_path / "logs") as deployment:
            job_id = deployment.job_id
            raise KeyboardInterrupt
    assert job_id
    assert_nothing_left(marker, job_id)


CHILD = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from dspark_ci.launchers.contract import LaunchContext
    from dspark_ci.launchers.slurm import lifecycle
    from dspark_ci.launchers.slurm.options import SlurmOptions
    run_dir, marker = Path(sys.argv[1]), sys.argv[2]
    env = {**os.environ, "DSPARK_SIM_FAULTS": "hang_boot", "DSPARK_SIM_BOOT_SECONDS": "0.2"}
    context = LaunchContext(run_id="r" + marker, run_dir=run_dir, server="sim", boot_timeout_s=600, caller_env=env)
    launcher = lifecycle.build(context, SlurmOptions(partition=os.environ.get("DSPARK_SLURM_PARTITION"),
                                                     queue_timeout_s=60))
    from tests.sim_plans import make_plan
    with launcher.launch(make_plan(launcher.placement(2), 2, marker), run_dir / "logs"):
        time.sleep(600)
""")


def run_killed_by(signum: int, run_dir: Path, marker: str) -> subprocess.Popen:
    """A run (in a child process) whose job's tasks have started, then sent ``signum``; it has exited."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(run_dir), marker], cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (run_dir / "logs" / "0.log").exists():
            assert child.poll() is None, child.stderr.read().decode()
            time.sleep(0.2)
        assert (run_dir / "logs" / "0.log").exists(), "the job never started its tasks"
    finally:
        child.send_signal(signum)
        try:
            child.wait(timeout=45)
        except subprocess.TimeoutExpired:
            child.kill()
            raise
    return child


def test_sigterm_tears_the_job_down(cluster, tmp_path, marker):
    run_dir = tmp_path / "run"
    run_killed_by(signal.SIGTERM, run_dir, marker)
    job_id = next(e.job_id for e in Ledger("r" + marker, run_dir).entries() if e.job_id)
    assert_nothing_left(marker, job_id)


def test_a_killed_run_leaves_a_job_that_remove_started_cancels(cluster, tmp_path, marker):
    run_dir = tmp_path / "run"
    run_killed_by(signal.SIGKILL, run_dir, marker)
    entries = Ledger("r" + marker, run_dir).entries()
    job_id = next(e.job_id for e in entries if e.job_id)
    assert len(jobs_with(marker)) == 1 and commands.job_processes(job_id), "a hard kill leaves the job running"
    removed = [lifecycle.remove_started(e) for e in entries]
    assert [bool(r) for r in removed].count(True) == 1 and f"Slurm job {job_id}" in next(r for r in removed if r)
    assert_nothing_left(marker, job_id)
    assert all(lifecycle.remove_started(e) is None for e in entries), "a second cleanup finds nothing"


def test_build_reads_the_catalog_options():
    """The --slurm-* values as the command line gives them (text, by argparse dest), the partition's environment
    variable when the flag is not given, and the server's queue-timeout default, all through the options record."""
    context = LaunchContext(run_id="r1", run_dir=Path("/tmp/unused"), server="sim", boot_timeout_s=42,
                            caller_env={"SLURM_CONF": "/x", "DSPARK_SLURM_PARTITION": "from-env"})
    kind = catalog.get("slurm")
    launcher = kind.build(context, {"slurm_partition": "gpu", "slurm_account": "acct", "slurm_time": "01:00:00",
                                    "slurm_extra": ["--qos=high"], "slurm_gpus": "gres",
                                    "slurm_container": None, "slurm_queue_timeout": None})
    o = launcher.options
    assert (o.partition, o.account, o.time, o.extra, o.gpus) == ("gpu", "acct", "01:00:00", ("--qos=high",), "gres")
    assert (launcher.context.boot_timeout_s, launcher.queue_timeout_s, launcher.context.run_id) == (42, 600.0, "r1")
    again = kind.build(replace(context, server="sglang"), {"slurm_queue_timeout": "90"})
    assert (again.options.partition, again.queue_timeout_s, again.options.gpus) == ("from-env", 90.0, "gpus-per-node")
    assert kind.build(replace(context, server="sglang"), {}).queue_timeout_s == 3600.0
    with pytest.raises(BadInput, match="--slurm-container"):
        kind.build(context, {"slurm_container": "docker:img"})
    with pytest.raises(BadInput, match="--slurm-queue-timeout"):
        kind.build(context, {"slurm_queue_timeout": "-1"})


def test_the_script_expands_node_rank_inside_each_task(tmp_path):
    """SGLang's sbatch example expands $SLURM_NODEID in the batch shell (every node rank 0): here it is only
    read inside the task function, and the script is valid bash in every container mode."""
    for container in (None, f"pyxis:{CUDA_IMAGE}", "apptainer:/images/sglang.sif"):
        options = SlurmOptions(container=container)
        context = LaunchContext(run_id="r1", run_dir=tmp_path / "run", caller_env={"HF_TOKEN": SECRET})
        launcher = SlurmLauncher(options, context)
        spec = script.render_job(with_gpus(make_plan(launcher.placement(2), 2, "c"), 8), tmp_path, options, context,
                                 launcher.tuning, "tok")
        before_task, _, task = spec.script.partition("dspark_task() {")
        assert "SLURM_NODEID" not in before_task and "local rank=$SLURM_NODEID" in task
        assert "--node-rank \"$rank\"" in task and "--host \"$addr\"" in task
        assert SECRET not in spec.script and spec.env["HF_TOKEN"] == SECRET
        path = tmp_path / "job.sbatch"
        path.write_text(spec.script)
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    assert f"--container-image={CUDA_IMAGE}" in script.render_job(
        make_plan(launcher.placement(1), 1, "c"), tmp_path,
        replace(options, container=f"pyxis:{CUDA_IMAGE}"), context, launcher.tuning, "tok").script
    gres = script.render_job(with_gpus(make_plan(launcher.placement(1), 1, "c"), 4), tmp_path,
                            replace(options, gpus="gres", container=None), context, launcher.tuning, "tok").script
    assert "#SBATCH --gres=gpu:4" in gres
    assert commands.gpus_of("gpu:h100:4(S:0-1),gpu:a100:2") == 6 and commands.gpus_of("(null)") == 0


def test_a_job_cancelled_behind_our_back_is_reported_as_such(cluster, tmp_path, marker):
    launcher = slurm_launcher(tmp_path)
    with pytest.raises(InfraError) as caught:
        with launcher.launch(plan_for(launcher, 1, marker), tmp_path / "logs") as deployment:
            job_id = deployment.job_id
            subprocess.run(["scancel", job_id], check=True, timeout=20)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                deployment.check()
                time.sleep(0.2)
            pytest.fail("check() did not notice that the job was cancelled")
    assert not isinstance(caught.value, LaunchFailed)
    message = str(caught.value)
    assert f"Slurm job {job_id} ended (CANCELLED" in message and "without any rank failing on its own" in message
    assert_nothing_left(marker, job_id)


def test_the_smoke_matrix_runs_green_through_the_cli_on_slurm(cluster, tmp_path):
    """The issue's must-show, as a user runs it: `dspark-ci run matrices/smoke.yaml --launcher slurm`."""
    from tests.cli_under_test import DSPARK_CI
    from tests.test_run_cli import FEW_BOOTS, assert_served_at_worst_undecided

    out = tmp_path / "run"
    env = {**os.environ, "DSPARK_STATE_DIR": str(tmp_path / "state"), "CI": "true"}
    # the launcher is under test, not the verdict: the sanity check (the suites are the local launcher's tests'),
    # two boots at most, an undecided gate accepted (never a red one)
    done = subprocess.run([*DSPARK_CI, "run", "matrices/smoke.yaml", "--launcher", "slurm", "--out", str(out),
                           "--suites", "sanity",
                           *(["--slurm-partition", PARTITION] if PARTITION else []), *FEW_BOOTS,
                           "--accept-inconclusive"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert_served_at_worst_undecided(results["cells"])
    two_nodes = next(c["id"] for c in results["cells"] if c["config"]["nnodes"] == 2)
    headers = [(out / "logs" / two_nodes / f"{rank}.log").read_text().splitlines()[0] for rank in (0, 1)]
    nodes = [header.split(" on ")[1].split()[0] for header in headers]
    assert [h.split()[3] for h in headers] == ["0", "1"] and nodes[0] != nodes[1], headers
    queued = subprocess.run(["squeue", "-h", "-o", "%k"], capture_output=True, text=True, timeout=20).stdout
    assert results["run_id"] not in queued  # every job of the run has left the queue


def test_a_survivors_marker_seen_first_does_not_make_it_the_culprit(monkeypatch):
    """On a busy node the rank that only noticed its peer's death can write its exit marker before the peer does:
    judged alone it would be blamed. The lost rank's own marker, a moment later, names the culprit."""
    from dspark_ci.launchers.contract import RankExit

    noticed = RankExit(0, 1, 10.2, ["RuntimeError: NCCL communicator was aborted: node rank 1 disconnected"])
    died = RankExit(1, 1, 10.0, ["ValueError: rank_exit fault (sglang_sim)"])
    seen = iter([[noticed], [noticed], [noticed, died]])
    job = object.__new__(lifecycle._Job)
    job.plan = make_plan(Placement.loopback(2, port=30000, dist_port=20000), 2, "cell-a")
    monkeypatch.setattr(job, "exits", lambda: next(seen, [noticed, died]), raising=False)
    monkeypatch.setattr(lifecycle, "SETTLE_S", 0.0)
    assert {e.node_rank for e in job._settled_exits()} == {0, 1}
    assert group_failed("cell-a", job._settled_exits(), []).node_rank == 1
