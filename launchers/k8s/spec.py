"""What a cell looks like on Kubernetes, for the k8s launcher and ``dspark-ci plan --format k8s``: pure data.

Per cell one ``LeaderWorkerSet`` (leaderworkerset.x-k8s.io/v1, LWS >= 0.6) and one ``Service`` for rank 0's port:

- ``size`` = the cell's node count; one group (``replicas: 1``); ``startupPolicy: LeaderCreated`` (LeaderReady
  with a leader /health probe deadlocks: rank 0 is healthy only after the workers joined);
  ``restartPolicy: None`` and pods ``restartPolicy: Never``: a CI run wants a dead rank reported, not restarted.
- leader and worker templates run the same command: the plan's argv with the node-specific values taken from
  the environment LWS gives every pod: ``--node-rank $(LWS_WORKER_INDEX)``, ``--nnodes $(LWS_GROUP_SIZE)``,
  ``--dist-init-addr $(LWS_LEADER_ADDRESS):PORT``, and ``--host $(DSPARK_POD_IP)`` (the pod's IP, Downward API).
- accelerators as extended resources per pod (``nvidia.com/gpu``, ``amd.com/gpu`` on MI hardware,
  ``huawei.com/Ascend910`` for NPUs, the Ascend device plugin's name), ``/dev/shm`` as an in-memory emptyDir,
  the cell's environment with every ``${NAME}`` secret reference as a ``secretKeyRef`` (never a value),
  labels ``dspark-ci.run/cell`` (and ``dspark-ci.run/id`` for a run) on every object and pod.
- the leader has a readiness probe on ``/health``; workers none (their /health says nothing about the group).

Site-specific parts (node selectors, tolerations, host networking for RDMA, image pull secrets, model-cache volumes)
come from a patch file (``--k8s-extra``, YAML): each document is merged into the generated object of its ``kind``
(``LeaderWorkerSet`` when it names none, ``Service``, or ``Pod``: merged into both the leader and the worker
template) by ``merge``, a small subset of Kubernetes' strategic merge patch (documented there).
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from dspark_ci.ground.errors import BadInput
from dspark_ci.ground.sglang.release import AMD, ASCEND, NVIDIA, accelerator, release_image
from dspark_ci.ground.yaml_lines import config_file_words, read_bounded
from dspark_ci.launchers.materialize import server_command
from dspark_ci.launchers.plan_types import LaunchPlan, Placement, RankCommand

LWS_GROUP, LWS_VERSION, LWS_KIND, LWS_PLURAL = "leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet", "leaderworkersets"
LWS_API = f"{LWS_GROUP}/{LWS_VERSION}"
LABEL_RUN, LABEL_CELL = "dspark-ci.run/id", "dspark-ci.run/cell"
ANNOTATION_CELL = "dspark-ci.run/cell-id"  # the full cell id (label values stop at 63 characters)
LWS_NAME_LABEL, LWS_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/name", "leaderworkerset.sigs.k8s.io/worker-index"
CONTAINER = "sglang"
POD_IP_ENV = "DSPARK_POD_IP"
PORT, DIST_PORT = 30000, 20000
DEFAULT_SECRET = "dspark-ci-secrets"  # `kubectl create secret generic dspark-ci-secrets --from-literal=HF_TOKEN=...`

ACCELERATORS: Mapping[str, str] = {NVIDIA: "nvidia.com/gpu", AMD: "amd.com/gpu", ASCEND: "huawei.com/Ascend910"}
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def placement() -> Placement:
    """What the planner is given: every rank binds the pod's IP, rank 0 is LWS's leader address."""
    return Placement(bind_hosts=(f"$({POD_IP_ENV})",), leader_addr="$(LWS_LEADER_ADDRESS)", port=PORT,
                     dist_port=DIST_PORT)


def placement_for(nnodes: int) -> Placement:
    one = placement()
    return Placement(bind_hosts=one.bind_hosts * nnodes, leader_addr=one.leader_addr, port=one.port,
                     dist_port=one.dist_port)


def _short_hash(text: str, n: int = 6) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def label_value(text: str) -> str:
    """A valid label value (<= 63 characters of [A-Za-z0-9-_.]); long ids keep a hash of the whole."""
    clean = re.sub(r"[^A-Za-z0-9_.-]", "-", text).strip("-_.")
    if len(clean) > 63:
        clean = f"{clean[:56].rstrip('-_.')}-{_short_hash(text)}"
    return clean


def object_name(cell_id: str, token: str | None = None) -> str:
    """A DNS-1035 label for the LWS (its pods are <name>-0, <name>-0-1, ...; services add a suffix): at most
    40 characters, the cell id readable, a hash keeping distinct ids distinct, a launch token when given."""
    base = re.sub(r"[^a-z0-9-]", "-", cell_id.lower()).strip("-") or "cell"
    suffix = token or _short_hash(cell_id)
    room = 40 - len(suffix) - len("ds--")
    base = base[:room].rstrip("-")
    return f"ds-{base}-{suffix}"


def accelerator_resource(device: str, hardware: str | None = None) -> str | None:
    """The extended resource a pod asks for: AMD GPUs (SGLang's --device cuda on ROCm) by hardware name."""
    return ACCELERATORS.get(accelerator(device, hardware))


# Node-specific values taken from the environment LWS (and the Downward API) gives every pod.
_LWS_VALUES = {"host": f"$({POD_IP_ENV})", "node_rank": "$(LWS_WORKER_INDEX)", "nnodes": "$(LWS_GROUP_SIZE)",
               "leader_addr": "$(LWS_LEADER_ADDRESS)"}


def _templated(rank: RankCommand, server: str) -> list[str]:
    command = server_command(rank, server, python="python3")
    node = command.node.words(**_LWS_VALUES) if command.node else []
    return [*command.head, *node, *command.tail]


def pod_command(plan: LaunchPlan, server: str = "sglang") -> list[str]:
    """The one command every pod of the group runs (ranks differ only in what LWS's environment says)."""
    commands = [_templated(rank, server) for rank in plan.ranks]
    if any(command != commands[0] for command in commands):
        raise ValueError(f"{plan.cell_id}: ranks differ beyond host, node rank and leader address")
    return commands[0]


def pod_env(planned: Mapping[str, str], secret_name: str, extra: Mapping[str, str] = {}) -> list[dict]:
    """The container's env: secrets first (secretKeyRef, so later values may use them as $(NAME)), the pod IP,
    then plain values. A ``${NAME}`` reference never becomes a value here."""
    secrets = sorted({m.group(1) for value in planned.values() for m in _REFERENCE.finditer(value)})
    env: list[dict] = [{"name": name, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": name}}}
                       for name in secrets]
    env.append({"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    for key, value in {**extra, **planned}.items():
        if key in secrets and value == f"${{{key}}}":
            continue  # the secretKeyRef entry is this variable
        rendered = _REFERENCE.sub(lambda m: f"$({m.group(1)})", value)
        # An empty value is written as no value (Kubernetes' own EnvVar serialization, `value,omitempty`); a 1.20
        # API server with the LWS CRD refuses `value: ""` as null.
        env.append({"name": key, "value": rendered} if rendered else {"name": key})
    return env


def manifests(plan: LaunchPlan, *, name: str, namespace: str | None = "default", image: str | None = None,
              server: str = "sglang", run_id: str | None = None, hardware: str | None = None,
              secret_name: str = DEFAULT_SECRET, extra_env: Mapping[str, str] = {},
              patches: Sequence[dict] = ()) -> list[dict]:
    """[LeaderWorkerSet, Service] for one cell's plan, with the user's patches merged in."""
    device = plan.device
    hardware = hardware or plan.hardware
    image = image or plan.image or release_image(device, hardware)
    if not image:
        raise BadInput(plan.cell_id, f"no container image for device {device!r} on {hardware or 'its hardware'}",
                       "set `image:` in the matrix")
    labels = {LABEL_CELL: label_value(plan.cell_id)}
    if run_id:
        labels[LABEL_RUN] = label_value(run_id)
    port = plan.port
    container: dict[str, Any] = {
        "name": CONTAINER, "image": image, "command": pod_command(plan, server),
        "env": pod_env(plan.ranks[0].env, secret_name, extra_env),
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    resource = accelerator_resource(device, hardware)
    if resource and plan.gpus_per_node:
        container["resources"] = {"limits": {resource: plan.gpus_per_node}}
    pod_spec = {"restartPolicy": "Never", "containers": [container],
                "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]}
    metadata = {"name": name, "labels": labels, "annotations": {ANNOTATION_CELL: plan.cell_id}}
    if namespace:
        metadata["namespace"] = namespace
    leader: dict[str, Any] = copy.deepcopy({"metadata": {"labels": labels}, "spec": pod_spec})
    leader_container: dict[str, Any] = leader["spec"]["containers"][0]
    leader_container["readinessProbe"] = {
        "httpGet": {"path": "/health", "port": port}, "periodSeconds": 10, "failureThreshold": 3}
    worker = copy.deepcopy({"metadata": {"labels": labels}, "spec": pod_spec})
    for pod_patch in (p for p in patches if p.get("kind") == "Pod"):
        body = {k: v for k, v in pod_patch.items() if k not in ("kind", "apiVersion")}
        leader, worker = merge(leader, body), merge(worker, body)
    lws = {"apiVersion": LWS_API, "kind": LWS_KIND, "metadata": metadata,
           "spec": {"replicas": 1, "startupPolicy": "LeaderCreated",
                    "leaderWorkerTemplate": {"size": len(plan.ranks), "restartPolicy": "None",
                                             "leaderTemplate": leader, "workerTemplate": worker}}}
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {**copy.deepcopy(metadata), "name": f"{name}-leader"},
               "spec": {"selector": {LWS_NAME_LABEL: name, LWS_INDEX_LABEL: "0"},
                        "ports": _service_ports(plan)}}
    for patch in patches:
        kind = patch.get("kind", LWS_KIND)
        if kind == LWS_KIND:
            lws = merge(lws, patch)
        elif kind == "Service":
            service = merge(service, patch)
    return [lws, service]


def _service_ports(plan: LaunchPlan) -> list[dict]:
    """The leader's HTTP port, and a PD prefill's bootstrap port: the router hands decode servers the prefill's
    host (this Service) to fetch the KV cache from, and a Service forwards only the ports it lists."""
    ports = [{"name": "http", "port": plan.port, "targetPort": plan.port, "protocol": "TCP"}]
    if plan.bootstrap_port:
        ports.append({"name": "bootstrap", "port": plan.bootstrap_port, "targetPort": plan.bootstrap_port,
                      "protocol": "TCP"})
    return ports


# --- the user's patch file ---------------------------------------------------------------------------------

# Lists merged element by element on this key, as Kubernetes' strategic merge patch does for these fields
# (patchMergeKey); every other list is replaced whole.
MERGE_KEYS: Mapping[str, str] = {"containers": "name", "initContainers": "name", "env": "name", "volumes": "name",
                                 "volumeMounts": "name", "ports": "containerPort", "imagePullSecrets": "name",
                                 "hostAliases": "ip"}


def merge(base: Any, patch: Any, key: str | None = None) -> Any:
    """``patch`` merged into a copy of ``base``: mappings recursively (a ``null`` value deletes the key, as in
    JSON merge patch, RFC 7386); the lists named in MERGE_KEYS by their merge key (an element whose key matches
    is merged, a new one appended); any other list or value replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = copy.deepcopy(base)
        for k, v in patch.items():
            if v is None:
                merged.pop(k, None)
            else:
                merged[k] = merge(merged[k], v, k) if k in merged else copy.deepcopy(v)
        return merged
    merge_key = MERGE_KEYS.get(key or "")
    if isinstance(base, list) and isinstance(patch, list) and merge_key:
        items = copy.deepcopy(base)
        for item in patch:
            at = next((i for i, old in enumerate(items) if isinstance(old, dict) and isinstance(item, dict)
                       and merge_key in item and old.get(merge_key) == item[merge_key]), None)
            if at is None:
                items.append(copy.deepcopy(item))
            else:
                items[at] = merge(items[at], item)
        return items
    return copy.deepcopy(patch)


PATCH_KINDS = (LWS_KIND, "Service", "Pod")
PATCH_FILE = config_file_words("--k8s-extra patch file", "give an existing YAML file")


def load_patches(path: str | Path | None) -> list[dict]:
    """The documents of a ``--k8s-extra`` file; BadInput naming the file and document when one is not usable."""
    if not path:
        return []
    where = str(path)
    text = read_bounded(path, PATCH_FILE)  # a FIFO, /dev/zero or a huge file: refused before it is read
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f"{where}:{mark.line + 1}" if mark else where
        raise BadInput(at, f"not YAML ({getattr(err, 'problem', None) or err})", "fix the patch file") from None
    for number, doc in enumerate(docs, 1):
        if not isinstance(doc, dict):
            raise BadInput(f"{where} (document {number})", "a patch must be a mapping",
                           "write it like the object it patches, e.g. `spec: {leaderWorkerTemplate: ...}`")
        if doc.get("kind", LWS_KIND) not in PATCH_KINDS:
            raise BadInput(f"{where} (document {number})", f"kind {doc.get('kind')!r} is not patched",
                           f"use one of {', '.join(PATCH_KINDS)} (Pod: merged into both pod templates)")
    return docs


def to_yaml(objects: Sequence[dict]) -> str:
    """Multi-document YAML for ``kubectl apply -f -``."""
    return yaml.safe_dump_all(list(objects), sort_keys=False, default_flow_style=False)
