"""The Docker launcher against real engines running the simulator image.

Every test ends by asserting that no container of its run is left on any engine, running or stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dspark_ci.ground.state import STATE_DIR_ENV
from dspark_ci.launchers.contract import LaunchFailed, LaunchTimeout
from dspark_ci.launchers.docker.lifecycle import DockerLauncher
from dspark_ci.launchers.docker.spec import LABEL_CELL, LABEL_RANK, LABEL_RUN
from openai import OpenAI

from tests.cli_under_test import DSPARK_CI
from tests.docker_engines import ENGINE1, ENGINE2, SECRET, containers_of, launcher_on, new_run_id, require_engine
from tests.sim_plans import make_plan
from tests.test_run_cli import FEW_BOOTS, assert_served_at_worst_undecided

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parents[1]
REJECTION = "DSpark with dp attention requires --enable-dp-lm-head."


@pytest.fixture(scope="module")
def engine1():
    client = require_engine(ENGINE1)
    yield client
    client.close()


@pytest.fixture(scope="module")
def engine2():
    client = require_engine(ENGINE2)
    yield client
    client.close()


@pytest.fixture
def run_id() -> str:
    return new_run_id()


def assert_nothing_left(run_id: str, *engines) -> None:
    assert containers_of(run_id, list(engines)) == []


def launched_until_failure(launcher: DockerLauncher, plan, logs: Path) -> LaunchFailed:
    """Launch and keep checking the group until a rank's death is reported."""
    with pytest.raises(LaunchFailed) as failure:
        with launcher.launch(plan, logs) as deployment:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                deployment.check()
                time.sleep(0.2)
            pytest.fail("a rank was meant to die, but check() kept saying the group is fine")
    return failure.value


def test_one_node_serves_a_chat_request(tmp_path, engine1, run_id):
    launcher = launcher_on(run_id, tmp_path / "run", ENGINE1)
    plan = make_plan(launcher.placement(1), 1, "docker-one-node")
    with launcher.launch(plan, tmp_path) as deployment:
        client = OpenAI(base_url=f"{deployment.base_url}/v1", api_key="unused")
        reply = client.chat.completions.create(model="docker-one-node", max_tokens=16,
                                               messages=[{"role": "user", "content": "Say hello."}])
        assert reply.choices[0].message.content
        assert reply.usage.completion_tokens > 0
        deployment.check()
    assert_nothing_left(run_id, engine1)
    log = (tmp_path / "0.log").read_text()
    assert "node rank 0 on" in log and "sglang_sim" in log


def test_two_nodes_run_on_two_engines(tmp_path, engine1, engine2, run_id):
    launcher = launcher_on(run_id, tmp_path / "run", ENGINE1, ENGINE2)
    plan = make_plan(launcher.placement(2), 2, "docker-two-nodes")
    with launcher.launch(plan, tmp_path / "logs") as deployment:
        ranks_on = {name: [c.labels[LABEL_RANK] for c in engine.containers.list(filters={"label": f"{LABEL_RUN}={run_id}"})]
                    for name, engine in (("engine1", engine1), ("engine2", engine2))}
        assert ranks_on == {"engine1": ["0"], "engine2": ["1"]}
        client = OpenAI(base_url=f"{deployment.base_url}/v1", api_key="unused")
        reply = client.chat.completions.create(model="docker-two-nodes", max_tokens=8,
                                               messages=[{"role": "user", "content": "Two nodes?"}])
        assert reply.choices[0].message.content
        deployment.check()
    assert_nothing_left(run_id, engine1, engine2)
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["0.log", "1.log"]


@pytest.mark.parametrize("boot_seconds", ["30", "0.2"], ids=["while-booting", "while-serving"])
def test_node_loss_names_the_rank_and_tears_the_group_down(tmp_path, engine1, engine2, run_id, boot_seconds):
    launcher = launcher_on(run_id, tmp_path / "run", ENGINE1, ENGINE2, faults="rank_exit=1:3",
                                       boot_timeout_s=120, DSPARK_SIM_BOOT_SECONDS=boot_seconds)
    failure = launched_until_failure(launcher, make_plan(launcher.placement(2), 2, "docker-node-loss"), tmp_path)
    assert not isinstance(failure, LaunchTimeout)  # it failed fast, not at the boot deadline
    assert failure.node_rank == 1 and failure.rank_exit_code not in (None, 0)
    assert f"node rank 1 exited with code {failure.rank_exit_code}" in str(failure)
    assert_nothing_left(run_id, engine1, engine2)


def test_boot_rejection_surfaces_sglangs_error_line(tmp_path, engine1, run_id):
    launcher = launcher_on(run_id, tmp_path / "run", ENGINE1, faults=f"boot_reject={REJECTION}")
    failure = launched_until_failure(launcher, make_plan(launcher.placement(1), 1, "docker-rejected"), tmp_path)
    assert failure.node_rank == 0 and failure.rank_exit_code not in (None, 0)
    assert failure.sglang_error.endswith(f"ValueError: {REJECTION}")
    assert f"SGLang said: {failure.sglang_error}" in str(failure)
    assert f"ValueError: {REJECTION}" in (tmp_path / "0.log").read_text()
    assert_nothing_left(run_id, engine1)


def test_boot_timeout_is_infrastructure_trouble(tmp_path, engine1, run_id):
    launcher = launcher_on(run_id, tmp_path / "run", ENGINE1, faults="hang_boot", boot_timeout_s=3)
    with pytest.raises(LaunchTimeout) as failure:
        with launcher.launch(make_plan(launcher.placement(1), 1, "docker-hang"), tmp_path):
            pytest.fail("a hanging boot became healthy")
    assert failure.value.exit_code == 3 and "raise --boot-timeout" in str(failure.value)
    assert_nothing_left(run_id, engine1)


def test_secrets_reach_the_container_but_no_log_or_error(tmp_path, engine1, run_id):
    # The server is made to print the secret (as its rejection message): logs and errors must mask it.
    launcher = launcher_on(run_id, tmp_path / "run", ENGINE1)
    plan = make_plan(launcher.placement(1), 1, "docker-secret",
                     env={"DSPARK_SIM_FAULTS": "boot_reject=token ${HF_TOKEN}"})
    failure = launched_until_failure(launcher, plan, tmp_path)
    assert failure.sglang_error.endswith("ValueError: token ***")  # it arrived, and was masked
    assert SECRET not in str(failure)
    assert SECRET not in (tmp_path / "0.log").read_text()
    assert_nothing_left(run_id, engine1)


# --- interrupted runs, in a subprocess as a user's terminal would have it ---------------------------

DRIVER = """
import os, sys, time
from pathlib import Path
from dspark_ci.ground.ledger import Ledger
from dspark_ci.ground.processes import reset_inherited_signals
from tests.docker_engines import ENGINE1, ENGINE2, launcher_on
from tests.sim_plans import make_plan

reset_inherited_signals()  # as `dspark-ci` does at its start: Ctrl-C obeyed even if inherited blocked or ignored
nnodes, logs = int(os.environ["NNODES"]), Path(os.environ["LOGS"])
Ledger(os.environ["RUN_ID"], logs).register(os.environ)  # as `dspark-ci run` does: `cleanup --run ID` finds it
if os.environ.get("INTERRUPT_IN_CREATE"):  # Ctrl-C lands while a (slow) engine is still creating the container
    import signal, threading
    from docker.models.containers import ContainerCollection
    create = ContainerCollection.create

    def interrupted_create(self, *args, **kwargs):
        made = []
        engine = threading.Thread(target=lambda: (time.sleep(1.0), made.append(create(self, *args, **kwargs))))
        engine.start()
        os.kill(os.getpid(), signal.SIGINT)  # handled at the next bytecode: while the create is in flight
        engine.join()
        return made[0]

    ContainerCollection.create = interrupted_create
launcher = launcher_on(os.environ["RUN_ID"], logs, *[ENGINE1, ENGINE2][:nnodes], faults=os.environ["FAULTS"],
                       boot_timeout_s=120)
with launcher.launch(make_plan(launcher.placement(nnodes), nnodes, "docker-interrupted"), logs):
    print("serving", flush=True)
    time.sleep(300)
"""


def start_driver(tmp_path: Path, run_id: str, nnodes: int, faults: str = "", **extra: str) -> subprocess.Popen:
    env = {**os.environ, **extra, "RUN_ID": run_id, "NNODES": str(nnodes), "FAULTS": faults, "LOGS": str(tmp_path),
           "DOCKER_HOST": ENGINE1, "DSPARK_DOCKER_HOST2": ENGINE2, STATE_DIR_ENV: str(tmp_path / "state")}
    return subprocess.Popen([sys.executable, "-c", DRIVER], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def wait_for(condition, what: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def wait_until_serving(driver: subprocess.Popen) -> None:
    line = driver.stdout.readline()  # blocks until the launch is healthy, or the driver dies
    assert line.strip() == "serving", f"driver did not come up: {line}{driver.stdout.read()}"


@pytest.mark.parametrize("sig, moment, nnodes", [
    (signal.SIGINT, "serving", 2),
    (signal.SIGINT, "booting", 1),
    (signal.SIGTERM, "serving", 1),
], ids=["ctrl-c-while-serving-two-engines", "ctrl-c-while-booting", "sigterm-while-serving"])
def test_interrupt_removes_every_container(tmp_path, engine1, engine2, run_id, sig, moment, nnodes):
    engines = [engine1, engine2]
    driver = start_driver(tmp_path, run_id, nnodes, faults="hang_boot" if moment == "booting" else "")
    try:
        if moment == "serving":
            wait_until_serving(driver)
        else:
            wait_for(lambda: len(containers_of(run_id, engines)) == nnodes, "the containers to exist")
        driver.send_signal(sig)
        driver.wait(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode != 0  # interrupted, not finished
    assert_nothing_left(run_id, *engines)


def test_ctrl_c_while_a_container_is_being_created_removes_it(tmp_path, engine1, run_id):
    driver = start_driver(tmp_path, run_id, 1, INTERRUPT_IN_CREATE="1")
    output, _ = driver.communicate(timeout=120)
    assert driver.returncode != 0 and "KeyboardInterrupt" in output, output
    ledger = [json.loads(line) for line in (tmp_path / "launched.jsonl").read_text().splitlines()]
    assert [entry["container"] for entry in ledger if entry["launcher"] == "docker"]  # recorded before the create
    assert_nothing_left(run_id, engine1)


def test_cleanup_removes_what_a_killed_run_left(tmp_path, engine1, engine2, run_id):
    driver = start_driver(tmp_path, run_id, 2)
    try:
        wait_until_serving(driver)
    finally:
        driver.kill()  # SIGKILL: no teardown can run
        driver.wait(timeout=30)
    left = containers_of(run_id, [engine1, engine2])
    assert len(left) == 2

    # No inventory needed: the run's ledger names each container and the engine it was created on.
    env = {**os.environ, STATE_DIR_ENV: str(tmp_path / "state")}
    dry = subprocess.run([*DSPARK_CI, "cleanup", "--run", run_id, "--dry-run"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert all(name in dry.stdout for name in left) and ENGINE2 in dry.stdout
    assert sorted(containers_of(run_id, [engine1, engine2])) == sorted(left)  # a dry run removes nothing

    real = subprocess.run([*DSPARK_CI, "cleanup", "--run", run_id], env=env, capture_output=True, text=True, timeout=60)
    assert real.returncode == 0, real.stderr
    assert "2 leftover(s) removed" in real.stdout
    assert_nothing_left(run_id, engine1, engine2)



def test_run_verb_runs_smoke_cells_in_containers_on_two_engines(tmp_path, engine1, engine2):
    """`dspark-ci run --launcher docker` end to end: a 2-node cell across engines and an expected rejection."""
    plan = subprocess.run([*DSPARK_CI, "plan", "matrices/smoke.yaml", "--format", "json"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=True)
    cells = json.loads(plan.stdout)["cells"]
    two_nodes = next(c["id"] for c in cells if c["config"]["nnodes"] == 2 and c["expect"]["outcome"] == "serve")
    rejected = next(c["id"] for c in cells if c["expect"]["outcome"] == "reject")
    env = {**os.environ, "DSPARK_DOCKER_HOSTS": f"{ENGINE1}=127.0.0.1 {ENGINE2}=127.0.0.2"}
    # Placement across the engines is what is tested, so the suites are the accept suite's (with its reference beside
    # the cell), and two boots at most, an undecided gate accepted (never a red one): the statistical gates may take
    # more boots to decide against the smoke baseline's noise (tests/test_gates_cli.py tests them).
    run = subprocess.run([*DSPARK_CI, "run", "matrices/smoke.yaml", "--launcher", "docker", "--cell", two_nodes,
                          "--cell", rejected, "--suites", "accept", "--out", str(tmp_path), *FEW_BOOTS,
                          "--accept-inconclusive"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert {c["id"] for c in results["cells"]} == {two_nodes, rejected}
    assert_served_at_worst_undecided(results["cells"], serving=1)
    assert (tmp_path / "logs" / two_nodes / "1.log").read_text().startswith(f"# node rank 1 on {ENGINE2}")
    for engine in (engine1, engine2):
        assert engine.containers.list(all=True, filters={"label": f"{LABEL_CELL}={two_nodes}"}) == []


def test_missing_image_fails_the_run_in_preflight_before_any_container(tmp_path, engine1):
    run = subprocess.run([*DSPARK_CI, "run", "matrices/smoke.yaml", "--launcher", "docker", "--image",
                          "dspark-ci/no-such-image:0", "--pull", "never", "--out", str(tmp_path / "run")],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 3, run.stderr[-2000:]
    assert "dspark-ci/no-such-image:0 is not on Docker engine" in run.stderr and "docker save" in run.stderr
    assert not (tmp_path / "run").exists()
    # Other runs may share the engine: only a container of this image would be ours.
    ours = [c for c in engine1.containers.list(all=True, filters={"label": LABEL_RUN})
            if c.attrs["Config"]["Image"] == "dspark-ci/no-such-image:0"]
    assert ours == []


def test_rank_0_crash_across_two_engines_is_named_with_its_sglang_line(tmp_path, engine1, engine2):
    """Rank 0 dies of its own error (the CP-v2 assertion on the first prefill) and rank 1 of losing it, within
    milliseconds on two engines' clocks: rank 0 is the culprit, every time, with SGLang's line."""
    for attempt in range(3):
        run_id = new_run_id()
        launcher = launcher_on(run_id, tmp_path / "run", ENGINE1, ENGINE2, faults="crash_first_prefill")
        plan = make_plan(launcher.placement(2), 2, "docker-rank0-crash")
        with pytest.raises(LaunchFailed) as failure:
            with launcher.launch(plan, tmp_path / str(attempt)) as deployment:
                with contextlib.suppress(Exception):  # the first prefill kills rank 0 mid-request
                    OpenAI(base_url=f"{deployment.base_url}/v1", api_key="unused", max_retries=0, timeout=10) \
                        .completions.create(model="docker-rank0-crash", prompt="hello", max_tokens=4)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    deployment.check()
                    time.sleep(0.2)
                pytest.fail("rank 0 was configured to crash on the first prefill")
        assert failure.value.node_rank == 0, str(failure.value)
        assert (failure.value.sglang_error or "").startswith("AssertionError"), str(failure.value)
        assert_nothing_left(run_id, engine1, engine2)


def test_a_simulator_image_built_from_other_code_is_refused_before_any_container(tmp_path, engine1):
    """An image left from an earlier checkout would measure another simulator than the tree reports for: the run
    stops in preflight and says how to rebuild. The image is derived from the real one under a tag of its own, so
    the shared image is never touched."""
    import io
    import uuid

    tag = f"dspark-test/stale-sim:{uuid.uuid4().hex[:8]}"
    dockerfile = b"FROM dspark-ci/sglang-sim:latest\nLABEL dspark-ci.source=0123456789abcdef\n"
    engine1.images.build(fileobj=io.BytesIO(dockerfile), tag=tag, rm=True)
    try:
        run = subprocess.run([*DSPARK_CI, "run", "matrices/smoke.yaml", "--launcher", "docker", "--image", tag,
                              "--pull", "never", "--out", str(tmp_path / "run")],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
        assert run.returncode == 3, run.stderr[-2000:]
        assert f"image {tag} on Docker engine" in run.stderr
        assert "built from other code (source 0123456789abcdef" in run.stderr
        assert "docker/build-sim-image.sh --docker-host" in run.stderr
        assert not (tmp_path / "run").exists()
        assert [c for c in engine1.containers.list(all=True, filters={"label": LABEL_RUN})
                if c.attrs["Config"]["Image"] == tag] == []
    finally:
        engine1.images.remove(tag, force=True)
