"""The local launcher against the real simulated server: up, fail fast, time out, tear down, no orphans."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests
from dspark_ci.ground.errors import InfraError
from dspark_ci.ground.ledger import Ledger
from dspark_ci.ground.processes import free_port, port_is_free, remove_run_temp_dir, run_env, started_at
from dspark_ci.launchers.contract import LaunchContext, LaunchFailed, LaunchTimeout
from dspark_ci.launchers.local.lifecycle import LocalLauncher
from dspark_ci.launchers.local.options import LocalOptions
from dspark_ci.launchers.local.tuning import LocalTuning

from tests.cli_under_test import DSPARK_CI
from tests.process_table import assert_none_left
from tests.sim_plans import FAST_SIM, make_plan


@pytest.fixture
def launcher_with(tmp_path):
    """A local launcher of a run of its own (ledger in ``tmp_path/run``); the run's temp directory goes with the test,
    as a finished run's does."""
    run_ids = []

    def made(faults: str = "", boot_timeout_s: float = 30.0, **env) -> LocalLauncher:
        caller_env = {**os.environ, **FAST_SIM, "DSPARK_SIM_FAULTS": faults, "HF_TOKEN": "hf_secret_marker_123", **env}
        run_ids.append(f"local-{uuid.uuid4().hex[:8]}")
        context = LaunchContext(run_id=run_ids[-1], run_dir=tmp_path / "run", server="sim",
                                boot_timeout_s=boot_timeout_s, caller_env=caller_env)
        return LocalLauncher(LocalOptions(), context, LocalTuning(poll_s=0.1, stop_grace_s=3.0))

    yield made
    for run_id in run_ids:
        remove_run_temp_dir(run_id)


@pytest.fixture
def marker() -> str:
    return f"launcher-test-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("nnodes", [1, 2], ids=["one-node", "two-nodes"])
def test_serves_then_leaves_nothing_behind(tmp_path, marker, nnodes, launcher_with):
    launcher = launcher_with()
    plan = make_plan(launcher.placement(nnodes), nnodes, marker)
    with launcher.launch(plan, tmp_path / "logs") as deployment:
        models = requests.get(f"{deployment.base_url}/v1/models", timeout=5).json()
        assert [m["id"] for m in models["data"]] == [marker]
        deployment.check()  # every rank alive
    assert_none_left(marker)
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [f"{r}.log" for r in range(nnodes)]


def test_secrets_are_passed_but_never_logged(tmp_path, marker, launcher_with):
    launcher = launcher_with()
    with launcher.launch(make_plan(launcher.placement(1), 1, marker), tmp_path):
        pass
    assert "hf_secret_marker_123" not in (tmp_path / "0.log").read_text()


def test_boot_rejection_fails_fast_with_sglang_message(tmp_path, marker, launcher_with):
    launcher = launcher_with("boot_reject=DSpark with dp attention requires --enable-dp-lm-head.")
    with pytest.raises(LaunchFailed) as caught:
        with launcher.launch(make_plan(launcher.placement(1), 1, marker), tmp_path):
            pytest.fail("a rejected server must not become healthy")
    err = caught.value
    assert (err.reason, err.node_rank) == ("exited", 0)
    assert err.rank_exit_code != 0
    assert err.sglang_error == "ValueError: DSpark with dp attention requires --enable-dp-lm-head."
    assert "ValueError" in str(err)
    assert_none_left(marker)


def test_hung_boot_times_out_saying_what_was_awaited(tmp_path, marker, launcher_with):
    launcher = launcher_with("hang_boot", boot_timeout_s=2.0)
    with pytest.raises(LaunchTimeout) as caught:
        with launcher.launch(make_plan(launcher.placement(1), 1, marker), tmp_path):
            pytest.fail("a hung server must not become healthy")
    message = str(caught.value)
    assert "/health" in message and "waited 2s" in message and "--boot-timeout" in message
    assert caught.value.exit_code == 3
    assert_none_left(marker)


def test_losing_a_rank_is_seen_and_the_group_torn_down(tmp_path, marker, launcher_with):
    launcher = launcher_with("rank_exit=1:1")
    with pytest.raises(LaunchFailed) as caught:
        with launcher.launch(make_plan(launcher.placement(2), 2, marker), tmp_path) as deployment:
            for _ in range(100):
                deployment.check()
                time.sleep(0.1)
            pytest.fail("rank 1 was configured to exit after 1 s")
    assert caught.value.node_rank == 1
    assert caught.value.rank_exit_code != 0
    assert_none_left(marker)


def test_ports_are_not_the_ones_the_kernel_gives_outgoing_connections():
    """A server's port comes from below the ephemeral range, where no client connection of any program here can be
    holding it, is free to bind, and is never handed out twice by one run."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50 and all(1024 < p < low for p in ports)
    assert all(port_is_free("127.0.0.1", p) for p in ports)


def test_another_server_on_the_port_is_never_taken_for_ours(tmp_path, marker, launcher_with):
    """Another run's server already answers /health on the port: the launch fails (its server args are not
    ours, or our rank cannot bind), it never serves the suites someone else's numbers."""
    from dspark_ci.launchers.plan_types import Placement

    from tests.sim_fixtures import running_sim

    with running_sim(["--served-model-name", "someone-elses-run"], tmp_path / "foreign.log") as foreign:
        launcher = launcher_with()
        plan = make_plan(Placement.loopback(1, port=foreign.port, dist_port=free_port()), 1, marker)
        with pytest.raises((LaunchFailed, InfraError)) as caught:
            with launcher.launch(plan, tmp_path / "logs"):
                pytest.fail("a foreign server was taken for ours")
        said = str(caught.value)
        assert "not the one this run launched" in said or "Address already in use" in said or "OSError" in said
        assert foreign.health() == 200  # and theirs is left alone
    assert_none_left(marker)


# A rank whose launcher forks the real server (a wrapper script, as site launchers are): dspark-ci is SIGKILLed, the
# wrapper dies with it (PDEATHSIG), the server it forked keeps listening in the rank's process group.
FORKING_DRIVER = """
import os, sys, time
from pathlib import Path
from dspark_ci.launchers.contract import LaunchContext
from dspark_ci.ground.ledger import Ledger
from dspark_ci.launchers.local.lifecycle import LocalLauncher
from dspark_ci.launchers.local.options import LocalOptions
from dspark_ci.launchers.local.tuning import LocalTuning
from tests.sim_plans import FAST_SIM, make_plan

logs = Path(os.environ["LOGS"])
Ledger(os.environ["RUN_ID"], logs).register(os.environ)
context = LaunchContext(os.environ["RUN_ID"], logs, boot_timeout_s=60, caller_env={**os.environ, **FAST_SIM})
launcher = LocalLauncher(LocalOptions(), context, LocalTuning(poll_s=0.1, python=os.environ["WRAPPER"]))
plan = make_plan(launcher.placement(1), 1, os.environ["MARKER"])
with launcher.launch(plan, logs / "logs"):
    print(plan.base_url, flush=True)
    time.sleep(300)
"""


def test_cleanup_kills_the_server_a_rank_forked_after_a_sigkill(tmp_path, marker):

    wrapper = tmp_path / "forking-python"
    wrapper.write_text(f'#!/bin/sh\n"{sys.executable}" "$@" &\nwait\n')
    wrapper.chmod(0o755)
    run_id = f"forking-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "LOGS": str(tmp_path), "RUN_ID": run_id, "WRAPPER": str(wrapper), "MARKER": marker,
           "DSPARK_STATE_DIR": str(tmp_path / "state")}
    driver = subprocess.Popen([sys.executable, "-c", FORKING_DRIVER], env=env, stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parent.parent)
    try:
        base_url = driver.stdout.readline().strip()
        assert base_url.startswith("http://"), "the forked server never became healthy"
    finally:
        driver.kill()
        driver.wait()
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    time.sleep(0.5)
    assert not port_is_free(host, int(port)), "the forked server should have outlived the SIGKILL"
    cleaned = subprocess.run([*DSPARK_CI, "cleanup", "--run", run_id], env=env, capture_output=True, text=True,
                             timeout=60)
    assert cleaned.returncode == 0, cleaned.stderr
    assert "and its group" in cleaned.stdout
    assert_none_left(marker)
    assert port_is_free(host, int(port))


def test_cleanup_still_reads_a_ledger_an_earlier_version_wrote(tmp_path, marker):
    """A run recorded before ledger lines were read as records (no process group, a key no longer written, the last
    line cut short by the kill): `dspark-ci cleanup --run` still finds the rank's group and removes it."""
    run_id = f"old-ledger-{uuid.uuid4().hex[:8]}"
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", marker],
                            env=run_env(os.environ, run_id), start_new_session=True)
    try:
        run_dir, env = tmp_path / "run", {**os.environ, "DSPARK_STATE_DIR": str(tmp_path / "state")}
        run_dir.mkdir()
        old = {"run_id": run_id, "launcher": "local", "cell": "old-cell", "rank": 0, "pid": rank.pid,
               "pid_started": started_at(rank.pid), "host": "127.0.0.1"}
        (run_dir / "launched.jsonl").write_text(json.dumps(old) + '\n{"run_id": "' + run_id)
        Ledger(run_id, run_dir).register(env)  # this test is its owner, alive: hence --force
        cleaned = subprocess.run([*DSPARK_CI, "cleanup", "--run", run_id, "--force"], env=env, capture_output=True,
                                 text=True, timeout=60)
        assert cleaned.returncode == 0, cleaned.stderr
        assert f"process {rank.pid} (cell old-cell, node rank 0) and its group" in cleaned.stdout
        assert_none_left(marker)
    finally:
        rank.kill()
        rank.wait()
