"""`dspark-ci run --launcher k8s` of a prefill/decode cell against the real API server (tests/k8s_cluster.py), the LWS
stand-in playing the controllers and the kubelet (tests/lws_standin.py): a LeaderWorkerSet per role instance and the
router as the Deployment `dspark-ci plan --format k8s` prints, all created, watched and deleted through the API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from dspark_ci.launchers.k8s import spec as k8s_spec

from tests.test_pd import ONE_EACH, PD, _gate, needs_router

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def cluster() -> dict:
    from tests.k8s_cluster import require_k8s

    return require_k8s()


def _run(cluster: dict, tmp_path: Path, env: dict) -> tuple[subprocess.CompletedProcess, dict, list[dict]]:
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "dspark_ci", "run", PD, "--cell", ONE_EACH, "--launcher", "k8s",
                           "--kubeconfig", cluster["kubeconfig"], "--namespace", cluster["namespace"],
                           "--out", str(out)],
                          env={**os.environ, "CI": "true", "DSPARK_STATE_DIR": str(tmp_path / "state"),
                               "DSPARK_HISTORY": str(tmp_path / "history"), "DSPARK_TEST_RUN": uuid.uuid4().hex,
                               **env},
                          capture_output=True, text=True, timeout=900, cwd=REPO)
    results = json.loads((out / "results.json").read_text())
    ledger = [json.loads(line) for line in (out / "launched.jsonl").read_text().splitlines()]
    return done, {**results["cells"][0], "run_id": results["run_id"]}, ledger


def left_in_api(cluster: dict, run_id: str) -> list[str]:
    """Every object of the run still in the API server: LWS, Deployments, Services, Secrets, pods."""
    from kubernetes import client, config

    api_client = config.new_client_from_config(config_file=cluster["kubeconfig"])
    core, apps, custom = client.CoreV1Api(api_client), client.AppsV1Api(api_client), client.CustomObjectsApi(api_client)
    ns, selector = cluster["namespace"], f"{k8s_spec.LABEL_RUN}={k8s_spec.label_value(run_id)}"
    lws = custom.list_namespaced_custom_object(k8s_spec.LWS_GROUP, k8s_spec.LWS_VERSION, ns, k8s_spec.LWS_PLURAL,
                                               label_selector=selector)["items"]
    return ([f"LeaderWorkerSet {o['metadata']['name']}" for o in lws]
            + [f"Deployment {o.metadata.name}"
               for o in apps.list_namespaced_deployment(ns, label_selector=selector).items]
            + [f"{kind} {o.metadata.name}" for kind, listed in (
                ("Service", core.list_namespaced_service), ("Secret", core.list_namespaced_secret),
                ("Pod", core.list_namespaced_pod)) for o in listed(ns, label_selector=selector).items])


@needs_router
def test_run_pd_cell_on_k8s_green_with_a_leaderworkerset_per_role_and_the_router_as_a_deployment(cluster, tmp_path):
    done, cell, ledger = _run(cluster, tmp_path, {})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert cell["status"] == "passed" and _gate(cell)["verdict"] == "passed", cell.get("error")
    assert cell["metrics"]["parity_mismatches"] == 0  # greedy text holds through the router's pod
    lws_cells = [e["cell"] for e in ledger if e.get("kind") == "LeaderWorkerSet"]
    assert lws_cells.count(f"{ONE_EACH}-prefill0") == 1 and lws_cells.count(f"{ONE_EACH}-decode0") == 1, lws_cells
    router = sorted((e["kind"], e["cell"]) for e in ledger if e["launcher"] == "k8s" and e.get("what") == "router")
    assert router == [("Deployment", ONE_EACH), ("Service", ONE_EACH)]  # the router's pod, no process of the run
    assert not [e for e in ledger if e["launcher"] == "local" and e.get("what") == "router"]
    router_log = (tmp_path / "run" / "logs" / ONE_EACH / "router.log").read_text()
    assert "of Deployment" in router_log and len(router_log.splitlines()) > 1  # streamed through pods/log
    assert left_in_api(cluster, cell["run_id"]) == []


@needs_router
def test_run_pd_cell_on_k8s_decode_rank_killed_red_naming_the_decode_rank(cluster, tmp_path):
    done, cell, _ = _run(cluster, tmp_path, {"DSPARK_SIM_DECODE_FAULTS": "rank_exit=0:5"})
    assert done.returncode != 0 and cell["status"] in ("error", "failed"), done.stderr[-3000:]
    assert "decode rank 0 exited" in cell["error"], cell["error"]
    assert "rank_exit" in (cell.get("sglang_error") or "")
    assert left_in_api(cluster, cell["run_id"]) == []


@needs_router
def test_a_pd_run_killed_hard_leaves_its_router_deployment_to_cleanup_from_the_ledger(cluster, tmp_path):
    """SIGKILL once the router's pod runs: the LWS of every role and the router's Deployment and Service stay in the
    API server; `dspark-ci cleanup --run ID` removes exactly those (from the ledger), foreground, pods first."""
    from kubernetes import client, config

    from tests.test_verdicts import wait_for

    out = tmp_path / "run"
    env = {**os.environ, "CI": "true", "DSPARK_STATE_DIR": str(tmp_path / "state"),
           "DSPARK_HISTORY": str(tmp_path / "history")}
    run = subprocess.Popen([sys.executable, "-m", "dspark_ci", "run", PD, "--cell", ONE_EACH, "--launcher", "k8s",
                            "--kubeconfig", cluster["kubeconfig"], "--namespace", cluster["namespace"], "--out",
                            str(out)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    core = client.CoreV1Api(config.new_client_from_config(config_file=cluster["kubeconfig"]))
    try:
        def router_running() -> list[dict]:
            ledger = [json.loads(line) for line in (out / "launched.jsonl").read_text().splitlines()] \
                if (out / "launched.jsonl").exists() else []
            router = [e for e in ledger if e.get("kind") == "Deployment"]
            pods = core.list_namespaced_pod(cluster["namespace"], label_selector=f"app={router[0]['name']}").items \
                if router else []
            return router if any(p.status.phase == "Running" for p in pods) else []

        run_id = wait_for(router_running, "the router's pod to run", timeout=600)[0]["run_id"]
    finally:
        run.kill()
        run.wait(30)
    left = left_in_api(cluster, run_id)
    assert [o for o in left if o.startswith("Deployment ")] and [o for o in left if o.startswith("LeaderWorkerSet ")]
    cleaned = subprocess.run([sys.executable, "-m", "dspark_ci", "cleanup", "--run", run_id], env=env,
                             capture_output=True, text=True, timeout=300, cwd=REPO)
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert "removed Deployment" in cleaned.stdout, cleaned.stdout
    assert left_in_api(cluster, run_id) == []


@needs_router
def test_run_pd_cell_on_k8s_router_killed_red_naming_the_router(cluster, tmp_path):
    """The router's container dies (its process killed, as an OOM kill would): the kubelet reports it terminated and
    the cell goes red naming the router, its exit code and its log's end; nothing is left."""
    import signal
    import threading

    from tests.k8s_cluster import standin

    killed: list[int] = []

    def kill_the_router() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not killed:
            for container in list(standin().containers.values()):
                process = container.process
                if process is not None and "sglang_router.launch_router" in " ".join(map(str, process.args)) \
                        and process.poll() is None and container.log.stat().st_size > 0:
                    time.sleep(3.0)  # serving, or still joining the roles: either way the router must be named
                    os.killpg(process.pid, signal.SIGKILL)
                    killed.append(process.pid)
                    return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_the_router, daemon=True)
    killer.start()
    done, cell, _ = _run(cluster, tmp_path, {})
    killer.join(5)
    assert killed, "the router's pod never ran"
    assert done.returncode != 0 and cell["status"] in ("error", "failed"), done.stderr[-3000:]
    assert "router rank 0 exited with code 137" in cell["error"], cell["error"]
    assert "of Deployment" in cell["error"]  # where its log is, and which object it was
    assert left_in_api(cluster, cell["run_id"]) == []
