"""Kubernetes manifests (launchers/k8s/spec.py), level 1: offline, against the real LWS CRD's schema.

The CRD is the LWS project's own, vendored at launchers/k8s/crd/lws-crd.yaml; its openAPIV3Schema is what an API server
with LWS installed validates against. Pure data: no cluster needed.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from dspark_ci.launchers.k8s import spec as k8s_spec
from dspark_ci.launchers.launch_plan import plan_launch
from dspark_ci.matrices import load_cells

REPO = Path(__file__).resolve().parent.parent
CRD = REPO / "launchers" / "k8s" / "crd" / "lws-crd.yaml"
MATRICES = [REPO / "matrices" / "nightly.yaml", REPO / "matrices" / "smoke.yaml"]


@functools.lru_cache(maxsize=1)
def lws_schema() -> dict:
    crd = yaml.safe_load(CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == k8s_spec.LWS_VERSION)
    return version["schema"]["openAPIV3Schema"]


def validate(lws: dict) -> None:
    jsonschema.Draft7Validator(lws_schema()).validate(lws)


def cell_manifests(matrix: Path) -> list[tuple[str, list[dict]]]:
    out = []
    for cell in load_cells([str(matrix)]):
        plan = plan_launch(cell, k8s_spec.placement_for(cell.nnodes))
        out.append((cell.id, k8s_spec.manifests(plan, name=k8s_spec.object_name(cell.id),
                                                hardware=cell.config.get("hardware"))))
    return out


@pytest.mark.parametrize("matrix", MATRICES, ids=lambda p: p.name)
def test_every_shipped_manifest_validates_against_the_lws_crd(matrix):
    generated = cell_manifests(matrix)
    assert generated
    for cell_id, (lws, service) in generated:
        validate(lws)
        template = lws["spec"]["leaderWorkerTemplate"]
        assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1" and lws["kind"] == "LeaderWorkerSet"
        assert lws["spec"]["startupPolicy"] == "LeaderCreated"
        assert lws["metadata"]["annotations"][k8s_spec.ANNOTATION_CELL] == cell_id
        assert len(lws["metadata"]["name"]) <= 40 and len(lws["metadata"]["labels"][k8s_spec.LABEL_CELL]) <= 63
        assert service["kind"] == "Service" and service["spec"]["selector"][k8s_spec.LWS_INDEX_LABEL] == "0"
        for role in ("leaderTemplate", "workerTemplate"):
            container = template[role]["spec"]["containers"][0]
            assert container["image"]
            assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in template[role]["spec"]["volumes"]


def test_rank_and_leader_come_from_lws_env_and_devices_from_the_cell():
    by_id = dict(cell_manifests(MATRICES[0]))
    two_node = next(m for cid, m in by_id.items() if m[0]["spec"]["leaderWorkerTemplate"]["size"] == 2)
    command = two_node[0]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["command"]
    after = {flag: command[command.index(flag) + 1] for flag in ("--node-rank", "--nnodes", "--dist-init-addr")}
    assert after == {"--node-rank": "$(LWS_WORKER_INDEX)", "--nnodes": "$(LWS_GROUP_SIZE)",
                     "--dist-init-addr": "$(LWS_LEADER_ADDRESS):20000"}
    limits = {cid: m[0]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["resources"]
              ["limits"] for cid, m in by_id.items()}
    assert any(v == {"huawei.com/Ascend910": 16} for cid, v in limits.items() if cid.endswith("-npu"))
    assert any(v == {"nvidia.com/gpu": 8} for v in limits.values())
    assert any("amd.com/gpu" in v for v in limits.values())  # the MI355 cell


def test_secrets_are_secret_key_refs_never_values():
    from tests.sim_plans import make_plan
    plan = make_plan(k8s_spec.placement_for(1), 1, "secret-cell", env={"AUTH": "Bearer ${API_KEY}"})
    lws, _ = k8s_spec.manifests(plan, name="ds-secret", image="x")
    env = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["env"]
    by_name = {e["name"]: e for e in env}
    assert by_name["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": k8s_spec.DEFAULT_SECRET, "key": "HF_TOKEN"}
    assert by_name["API_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "API_KEY"
    assert by_name["AUTH"]["value"] == "Bearer $(API_KEY)"  # expanded by Kubernetes from the secret
    assert [e["name"] for e in env].index("API_KEY") < [e["name"] for e in env].index("AUTH")
    assert "${" not in yaml.safe_dump(lws)


def test_a_malformed_lws_is_refused_by_the_schema():
    (_, (lws, _)), *_ = cell_manifests(MATRICES[1])
    for path, bad in ((("spec", "leaderWorkerTemplate", "size"), "two"),
                      (("spec", "leaderWorkerTemplate", "restartPolicy"), "Sometimes"),
                      (("spec", "startupPolicy"), "Whenever")):
        broken = yaml.safe_load(yaml.safe_dump(lws))
        node = broken
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = bad
        with pytest.raises(jsonschema.ValidationError):
            validate(broken)
    broken = yaml.safe_load(yaml.safe_dump(lws))
    del broken["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    with pytest.raises(jsonschema.ValidationError):
        validate(broken)


PATCH = """\
kind: Pod
spec:
  nodeSelector: {gpu-pool: h200}
  tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
  imagePullSecrets: [{name: regcred}]
  containers:
  - name: sglang
    env: [{name: NCCL_IB_HCA, value: mlx5}]
    volumeMounts: [{name: models, mountPath: /root/.cache/huggingface}]
  volumes: [{name: models, persistentVolumeClaim: {claimName: hf-cache}}]
---
spec:
  leaderWorkerTemplate:
    restartPolicy: RecreateGroupOnPodRestart
---
kind: Service
spec:
  type: ClusterIP
"""


def test_a_site_patch_merges_into_both_templates_and_still_validates(tmp_path):
    patch = tmp_path / "site.yaml"
    patch.write_text(PATCH)
    cell = load_cells([str(MATRICES[1])])[0]
    plan = plan_launch(cell, k8s_spec.placement_for(cell.nnodes))
    lws, service = k8s_spec.manifests(plan, name="ds-x", patches=k8s_spec.load_patches(patch))
    validate(lws)
    assert lws["spec"]["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert service["spec"]["type"] == "ClusterIP" and service["spec"]["ports"]
    for role in ("leaderTemplate", "workerTemplate"):
        spec = lws["spec"]["leaderWorkerTemplate"][role]["spec"]
        assert spec["nodeSelector"] == {"gpu-pool": "h200"} and spec["imagePullSecrets"] == [{"name": "regcred"}]
        (container,) = spec["containers"]  # merged by name, not appended
        assert container["command"][:3] == ["python3", "-m", "sglang.launch_server"]
        assert {"name": "NCCL_IB_HCA", "value": "mlx5"} in container["env"]
        assert [m["name"] for m in container["volumeMounts"]] == ["dshm", "models"]
        assert [v["name"] for v in spec["volumes"]] == ["dshm", "models"]


def test_merge_deletes_with_null_and_replaces_other_lists():
    base = {"a": {"b": 1, "c": 2}, "args": ["x"], "env": [{"name": "A", "value": "1"}]}
    out = k8s_spec.merge(base, {"a": {"c": None}, "args": ["y"], "env": [{"name": "A", "value": "2"}]})
    assert out == {"a": {"b": 1}, "args": ["y"], "env": [{"name": "A", "value": "2"}]}
    assert base["a"]["c"] == 2  # the input is untouched


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dspark_ci.cli", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=120)


def test_plan_format_k8s_prints_valid_multi_document_yaml():
    done = run_cli("plan", "matrices/smoke.yaml", "--format", "k8s")
    assert done.returncode == 0, done.stderr
    docs = list(yaml.safe_load_all(done.stdout))
    assert [d["kind"] for d in docs] == ["LeaderWorkerSet", "Service"] * 3
    for doc in docs[::2]:
        validate(doc)


def test_plan_format_k8s_refuses_a_bad_patch_file_as_bad_input(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Deployment\nspec: {}\n")
    done = run_cli("plan", "matrices/smoke.yaml", "--format", "k8s", "--k8s-extra", str(bad))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "bad.yaml" in done.stderr and "Deployment" in done.stderr
