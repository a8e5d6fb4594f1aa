"""Every registered launcher keeps the same contract (launchers/contract.py), checked the same way.

Like testcontainers' compliance suite: one set of behaviour tests, parametrized over ``ALL_LAUNCHERS``, each
against the real thing (local processes; containers on the Docker Engine CI starts; jobs on the Slurm cluster
CI starts). A launcher added to the catalog without a target here fails ``test_every_catalogued_launcher_is_covered``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import requests
from dspark_ci.ground.ledger import Ledger
from dspark_ci.ground.records import Status  # noqa: F401 (the contract's vocabulary, imported as a launcher author would)
from dspark_ci.launchers import catalog
from dspark_ci.launchers.contract import Capacity, Deployment, LaunchContext, Launcher, LaunchFailed

from tests.sim_plans import FAST_SIM, make_plan


def _local(tmp_path: Path) -> dict:
    return {}


def _docker(tmp_path: Path) -> dict:
    from tests.docker_engines import ENGINE1, require_engine

    require_engine(ENGINE1).close()
    return {"pull": "never"}


def _slurm(tmp_path: Path) -> dict:
    answers = shutil.which("sinfo") and subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    if not answers:
        if os.environ.get("DSPARK_REQUIRE_SLURM") == "1":
            pytest.fail("Slurm does not answer (DSPARK_REQUIRE_SLURM=1): .ci/slurm-up.sh starts the test cluster")
        pytest.skip("no Slurm cluster answers: eval \"$(bash .ci/slurm-up.sh)\" starts one")
    return {"slurm_partition": os.environ.get("DSPARK_SLURM_PARTITION")}


def _k8s(tmp_path: Path) -> dict:
    """The test API server .ci/kube-up.sh starts (real kube-apiserver + etcd, LWS CRD installed), and the LWS
    stand-in (tests/lws_standin.py: controller + kubelet played by local processes) on a namespace of our own."""
    from tests.k8s_cluster import require_k8s

    return require_k8s()


# How to reach each launcher's real engine here: its options, or a skip with the reason.
TARGETS = {"local": _local, "docker": _docker, "slurm": _slurm, "k8s": _k8s}


def test_every_catalogued_launcher_is_covered():
    assert set(catalog.NAMES) <= set(TARGETS), "add a target for the new launcher to TARGETS"


def launcher_for(name: str, tmp_path: Path, faults: str = "", boot_timeout_s: float = 40.0) -> tuple[Launcher, Ledger]:
    options = TARGETS[name](tmp_path)
    run_id = f"compliance-{uuid.uuid4().hex[:8]}"
    caller_env = {**os.environ, **FAST_SIM, "DSPARK_SIM_FAULTS": faults, "HF_TOKEN": "hf_compliance_secret"}
    context = LaunchContext(run_id=run_id, run_dir=tmp_path / "run", server="sim", boot_timeout_s=boot_timeout_s,
                            caller_env=caller_env)
    return catalog.get(name).build(context, options), Ledger(run_id, context.run_dir)


def assert_nothing_left(name: str, ledger: Ledger) -> None:
    """What the ledger recorded is gone: cleanup, asked to remove it, finds nothing to remove."""
    entries = ledger.entries()
    assert entries, "the launcher recorded nothing in the run's ledger"
    left = [what for what in (catalog.get(name).remove_started(e) for e in entries) if what]
    assert left == [], f"still there after the launch ended: {left}"


launchers = pytest.mark.parametrize("name", catalog.NAMES)


@launchers
def test_is_a_launcher_and_its_module_gives_what_cleanup_needs(name, tmp_path):
    launcher, _ = launcher_for(name, tmp_path)
    assert isinstance(launcher, Launcher) and launcher.name == name
    module = catalog.get(name).load()
    assert callable(module.build) and callable(module.remove_started)


@launchers
def test_says_how_many_cells_it_runs_side_by_side_and_why(name, tmp_path):
    """``capacity()`` is part of the contract: the run asks every launcher, none is assumed to lack it."""
    launcher, _ = launcher_for(name, tmp_path)
    launcher.preflight([])
    capacity = launcher.capacity()
    assert isinstance(capacity, Capacity) and capacity.max_parallel >= 1 and capacity.why
    assert capacity.nodes is None or capacity.nodes >= 0


@launchers
@pytest.mark.parametrize("nnodes", [1, 2], ids=["one-node", "two-nodes"])
def test_serves_rank_0_with_a_log_per_rank_and_leaves_nothing(name, nnodes, tmp_path):
    launcher, ledger = launcher_for(name, tmp_path)
    marker = f"compliance-{uuid.uuid4().hex[:8]}"
    plan = make_plan(launcher.placement(nnodes), nnodes, marker)
    launcher.preflight([plan])
    logs = tmp_path / "logs"
    with launcher.launch(plan, logs) as deployment:
        assert isinstance(deployment, Deployment) and deployment.boot_seconds > 0
        models = requests.get(f"{deployment.base_url}/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == [marker]  # our own server, not someone else's
        deployment.check()
    for rank in range(nnodes):
        text = (logs / f"{rank}.log").read_text()
        assert "hf_compliance_secret" not in text  # secrets never reach a log
    assert_nothing_left(name, ledger)


@launchers
def test_a_rank_that_exits_is_named_within_seconds(name, tmp_path):
    launcher, ledger = launcher_for(name, tmp_path, faults="rank_exit=1:2")
    with pytest.raises(LaunchFailed) as caught:
        with launcher.launch(make_plan(launcher.placement(2), 2, "compliance-exit"), tmp_path / "logs") as deployment:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                deployment.check()
                time.sleep(0.2)
            pytest.fail("rank 1 was configured to exit after 2 s")
    assert caught.value.node_rank == 1 and caught.value.reason == "exited"
    assert "rank_exit" in (caught.value.sglang_error or "")  # SGLang's own error line of the culprit
    assert_nothing_left(name, ledger)


@launchers
def test_a_boot_rejection_carries_sglangs_message(name, tmp_path):
    launcher, ledger = launcher_for(name, tmp_path, faults="boot_reject=DSpark needs a compliance test.")
    with pytest.raises(LaunchFailed) as caught:
        with launcher.launch(make_plan(launcher.placement(1), 1, "compliance-reject"), tmp_path / "logs"):
            pytest.fail("the server was configured to refuse its arguments")
    assert caught.value.sglang_error == "ValueError: DSpark needs a compliance test."
    assert_nothing_left(name, ledger)


@launchers
def test_a_boot_that_never_ends_times_out_saying_what_it_awaited(name, tmp_path):
    launcher, ledger = launcher_for(name, tmp_path, faults="hang_boot", boot_timeout_s=3.0)
    started = time.monotonic()
    with pytest.raises(LaunchFailed) as caught:
        with launcher.launch(make_plan(launcher.placement(1), 1, "compliance-hang"), tmp_path / "logs"):
            pytest.fail("the server was configured never to become healthy")
    assert caught.value.reason == "timeout" and "/health" in str(caught.value)
    assert time.monotonic() - started < 60
    assert_nothing_left(name, ledger)
