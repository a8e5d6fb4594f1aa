"""The k8s launcher against a real API server (level 2) with the LWS stand-in playing controller and kubelet (3).

Level 2: a real kube-apiserver (built from Debian 12's kubernetes source, .ci/kube-build.sh) with the real LWS CRD
installed (.ci/kube-up.sh): objects are created, validated, watched and deleted by it. Level 3: pods appear and run
only because tests/lws_standin.py (a stand-in, not Kubernetes) plays the LWS controller and a kubelet. Skipped
when no such API server answers (failing with DSPARK_REQUIRE_K8S=1). The launcher contract itself is checked by
tests/test_launcher_compliance.py (target "k8s").
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from dspark_ci.ground.errors import BadInput, InfraError
from dspark_ci.launchers.contract import LaunchContext, LaunchFailed
from dspark_ci.launchers.k8s import group as k8s_group
from dspark_ci.launchers.k8s import lifecycle as k8s
from dspark_ci.launchers.k8s import spec as k8s_spec
from dspark_ci.launchers.k8s.options import K8sOptions
from dspark_ci.launchers.k8s.tuning import K8sTuning
from dspark_ci.launchers.plan_types import LaunchPlan

from tests.sim_plans import FAST_SIM, make_plan
from tests.test_run_cli import FEW_BOOTS, assert_served_at_worst_undecided

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def cluster() -> dict:
    from tests.k8s_cluster import require_k8s

    return require_k8s()


def launcher_for(cluster: dict, tmp_path: Path, faults: str = "", boot_timeout_s: float = 40.0,
                 tuning: K8sTuning = K8sTuning(), **options) -> k8s.K8sLauncher:
    """The launcher on the test cluster (``options``: more --k8s-* values), the simulator told ``faults``."""
    env = {**os.environ, **FAST_SIM, "DSPARK_SIM_FAULTS": faults, "HF_TOKEN": "hf_k8s_secret"}
    context = LaunchContext(run_id=f"k8s-{uuid.uuid4().hex[:8]}", run_dir=tmp_path / "run", server="sim",
                            boot_timeout_s=boot_timeout_s, caller_env=env)
    return k8s.K8sLauncher(K8sOptions(**{**cluster, **options}), context, tuning)


def group_left(launcher: k8s.K8sLauncher, run_id: str) -> list[str]:
    api = launcher.api
    selector = f"{k8s_spec.LABEL_RUN}={k8s_spec.label_value(run_id)}"
    lws = api.custom.list_namespaced_custom_object(k8s_spec.LWS_GROUP, k8s_spec.LWS_VERSION, api.namespace,
                                                   k8s_spec.LWS_PLURAL, label_selector=selector)["items"]
    pods = api.core.list_namespaced_pod(api.namespace, label_selector=selector).items
    return [f"lws {o['metadata']['name']}" for o in lws] + [f"pod {p.metadata.name}" for p in pods]


def test_preflight_passes_on_the_test_api_server_and_names_a_missing_namespace(cluster, tmp_path):
    launcher = launcher_for(cluster, tmp_path)
    launcher.preflight([])
    missing = launcher_for({**cluster, "namespace": f"nowhere-{uuid.uuid4().hex[:6]}"}, tmp_path)
    with pytest.raises(Exception) as caught:
        missing.preflight([])
    assert "does not exist" in str(caught.value)


def test_the_api_server_refuses_a_malformed_lws_and_the_launcher_says_bad_input(cluster, tmp_path):
    patch = tmp_path / "site.yaml"
    patch.write_text("spec:\n  leaderWorkerTemplate:\n    restartPolicy: Sometimes\n")
    launcher = launcher_for(cluster, tmp_path, extra=str(patch))
    plan = make_plan(launcher.placement(1), 1, "k8s-malformed")
    with pytest.raises(BadInput) as caught:
        with launcher.launch(plan, tmp_path / "logs"):
            pytest.fail("the API server accepted an unknown restartPolicy")
    assert "restartPolicy" in str(caught.value) and "Sometimes" in str(caught.value)
    assert group_left(launcher, launcher.context.run_id) == []
    # the Secret created before the refused LWS is gone too
    secrets = launcher.api.core.list_namespaced_secret(
        launcher.api.namespace, label_selector=f"{k8s_spec.LABEL_RUN}={k8s_spec.label_value(launcher.context.run_id)}").items
    assert secrets == []


def test_two_ranks_get_worker_indices_0_and_1_and_rank_1_joins(cluster, tmp_path):
    launcher = launcher_for(cluster, tmp_path)
    plan = make_plan(launcher.placement(2), 2, "k8s-two")
    logs = tmp_path / "logs"
    with launcher.launch(plan, logs) as deployment:
        pods = launcher.api.core.list_namespaced_pod(
            launcher.api.namespace, label_selector=f"{k8s_spec.LABEL_RUN}={k8s_spec.label_value(launcher.context.run_id)}").items
        assert sorted(p.metadata.labels[k8s_spec.LWS_INDEX_LABEL] for p in pods) == ["0", "1"]
        assert deployment.boot_seconds > 0 and deployment.pending_seconds >= 0
        deadline = time.monotonic() + 10
        while "joined rank 0" not in (logs / "1.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
    assert "Node rank 1 joined rank 0" in (logs / "1.log").read_text()  # streamed through the API server
    assert "hf_k8s_secret" not in (logs / "0.log").read_text() + (logs / "1.log").read_text()
    assert group_left(launcher, launcher.context.run_id) == []


def test_rank_1_exiting_is_reported_with_its_log_tail_within_seconds(cluster, tmp_path):
    launcher = launcher_for(cluster, tmp_path, faults="rank_exit=1:5")
    started = time.monotonic()
    with pytest.raises(LaunchFailed) as caught:
        with launcher.launch(make_plan(launcher.placement(2), 2, "k8s-exit"), tmp_path / "logs") as deployment:
            while time.monotonic() - started < 40:
                deployment.check()
                time.sleep(0.5)
    assert caught.value.node_rank == 1 and caught.value.reason == "exited" and caught.value.rank_exit_code
    assert "rank_exit" in (caught.value.sglang_error or "") and caught.value.last_lines
    assert time.monotonic() - started < 30
    assert group_left(launcher, launcher.context.run_id) == []


def test_an_image_that_cannot_be_pulled_fails_at_once_with_the_reason(cluster, tmp_path):
    launcher = launcher_for(cluster, tmp_path, tuning=K8sTuning(sim_image="unpullable/sglang:nope"))
    started = time.monotonic()
    with pytest.raises(LaunchFailed) as caught:
        with launcher.launch(make_plan(launcher.placement(1), 1, "k8s-pull"), tmp_path / "logs"):
            pytest.fail("the image cannot be pulled")
    assert "ImagePullBackOff" in str(caught.value) and time.monotonic() - started < 20  # not the boot timeout
    assert "Failed to pull image" in str(caught.value)  # the kubelet's event
    assert group_left(launcher, launcher.context.run_id) == []


def test_an_unschedulable_group_times_out_on_pending_with_the_schedulers_reason(cluster, tmp_path):
    launcher = launcher_for(cluster, tmp_path, tuning=K8sTuning(pending_timeout_s=4.0))
    plan = make_plan(launcher.placement(1), 1, "k8s-big")
    plan = LaunchPlan(**{**plan.__dict__, "gpus_per_node": 16})
    with pytest.raises(LaunchFailed) as caught:
        with launcher.launch(plan, tmp_path / "logs"):
            pytest.fail("16 GPUs do not fit an 8-GPU node")
    assert "Insufficient nvidia.com/gpu" in str(caught.value) and "boot timeout had not started" in str(caught.value)
    assert "FailedScheduling" in str(caught.value)  # the scheduler's event
    assert group_left(launcher, launcher.context.run_id) == []


def test_the_smoke_matrix_runs_green_through_the_cli_on_k8s(cluster, tmp_path):
    """The issue's must-show: `dspark-ci run matrices/smoke.yaml --launcher k8s` against the test API server."""
    from tests.cli_under_test import DSPARK_CI

    out = tmp_path / "run"
    env = {**os.environ, "DSPARK_STATE_DIR": str(tmp_path / "state"), "CI": "true"}
    # the launcher is under test, not the verdict: the sanity check (the suites are the local launcher's tests'),
    # two boots at most, an undecided gate accepted (never a red one)
    done = subprocess.run([*DSPARK_CI, "run", "matrices/smoke.yaml", "--launcher", "k8s", "--out", str(out),
                           "--suites", "sanity",
                           "--kubeconfig", cluster["kubeconfig"], "--namespace", cluster["namespace"], *FEW_BOOTS,
                           "--accept-inconclusive"], cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert_served_at_worst_undecided(results["cells"])
    two_nodes = next(c["id"] for c in results["cells"] if c["config"]["nnodes"] == 2)
    rank1 = (out / "logs" / two_nodes / "1.log").read_text()
    assert "Node rank 1 joined rank 0" in rank1 and "-0-1 of LeaderWorkerSet" in rank1
    launcher = launcher_for(cluster, tmp_path)
    assert group_left(launcher, results["run_id"]) == []


def test_proxy_reach_goes_through_the_api_server_which_refuses_loopback_pods(cluster, tmp_path):
    """--k8s-reach proxy asks the real API server for rank 0's /health (pods/proxy). The stand-in's pods have
    loopback IPs, which kube-apiserver never proxies to (IsProxyableIP): that answer must end the wait at once,
    saying what to use instead, not run into the boot timeout."""
    launcher = launcher_for(cluster, tmp_path, reach="proxy", boot_timeout_s=30.0)
    started = time.monotonic()
    with pytest.raises(InfraError) as caught:
        with launcher.launch(make_plan(launcher.placement(1), 1, "k8s-proxy"), tmp_path / "logs"):
            pytest.fail("kube-apiserver proxied to a loopback pod IP")
    assert "will not proxy" in str(caught.value) and "--k8s-reach pod-ip" in str(caught.value)
    assert time.monotonic() - started < 20
    assert group_left(launcher, launcher.context.run_id) == []


def test_what_a_killed_run_left_is_removed_by_cleanup_from_the_ledger(cluster, tmp_path):
    """A run killed hard after creating its objects: `dspark-ci cleanup` (catalog remove_started per ledger entry)
    deletes the LWS (foreground: its pods go first), the Service and the Secret; a second pass finds nothing."""
    from dspark_ci.ground.ledger import Ledger
    from dspark_ci.launchers import catalog

    launcher = launcher_for(cluster, tmp_path)
    run_id = launcher.context.run_id
    (tmp_path / "logs").mkdir()
    group = k8s_group.Group(make_plan(launcher.placement(2), 2, "k8s-killed"), tmp_path / "logs", launcher)
    group.create()
    group.wait_running()  # pods exist and run: the state a SIGKILL would leave behind
    entries = Ledger(run_id, tmp_path / "run").entries()
    assert sorted(e.kind or "" for e in entries) == ["LeaderWorkerSet", "Secret", "Service"]
    removed = [catalog.get("k8s").remove_started(e) for e in entries]
    assert all(removed), removed
    assert group_left(launcher, run_id) == []
    assert [catalog.get("k8s").remove_started(e) for e in entries] == [None, None, None]


def test_sigterm_during_boot_deletes_the_group(cluster, tmp_path):
    """`dspark-ci run` stopped by SIGTERM while a cell boots: the LWS and its pods are gone when it exits."""
    import signal

    from tests.cli_under_test import DSPARK_CI

    env = {**os.environ, "DSPARK_STATE_DIR": str(tmp_path / "state"), "CI": "true", "DSPARK_SIM_FAULTS": "hang_boot"}
    run = subprocess.Popen([*DSPARK_CI, "run", "matrices/smoke.yaml", "--launcher", "k8s", "--out",
                            str(tmp_path / "run"), "--kubeconfig", cluster["kubeconfig"], "--namespace",
                            cluster["namespace"]], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    launcher = launcher_for(cluster, tmp_path)
    api = launcher.api
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pods = api.core.list_namespaced_pod(api.namespace, label_selector=k8s_spec.LABEL_RUN).items
            if any(p.status and p.status.phase == "Running" for p in pods):
                break
            time.sleep(0.3)
        else:
            pytest.fail("no pod of the run came up")
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=90)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode != 0 and "Traceback" not in err, err[-2000:]
    run_id = json.loads((tmp_path / "run" / "results.json").read_text())["run_id"]
    assert group_left(launcher, run_id) == []
