"""A disaggregated cell on Kubernetes, as manifests: one LeaderWorkerSet (and its leader Service) per role
instance, from the k8s launcher's own ``manifests``, and sglang-router as a Deployment with a Service, pointed at
the role instances' leader Services. The release image runs the router (SGLang's images ship sglang-router).
``router_manifests`` is the one source of the router's objects: `dspark-ci plan --format k8s` prints them,
`dspark-ci run --launcher k8s` creates them (launchers/pd/k8s_router.py)."""

from __future__ import annotations

import copy
from collections.abc import Sequence

from dspark_ci.ground.sglang.router import ROUTER_ENTRYPOINT
from dspark_ci.launchers.k8s import spec as k8s_spec
from dspark_ci.launchers.pd.pd_plan import RoleInstance, RouterCommand, plan_pd, router_command
from dspark_ci.matrices.cell import Cell

ROUTER_PORT = 30000
# sglang-router always serves Prometheus (its default port): bound, like its HTTP port, on the pod's own IP
ROUTER_METRICS_PORT = 29000
ROUTER_CONTAINER = "router"


def instance_name(cell: Cell, instance: RoleInstance) -> str:
    return k8s_spec.object_name(f"{cell.id}-{instance.role}{instance.index}")


def router_name(cell_id: str, token: str | None = None) -> str:
    return k8s_spec.object_name(f"{cell_id}-router", token)


def pd_manifests(cell: Cell, namespace: str | None = None, patches: Sequence[dict] = ()) -> list[dict]:
    plan = plan_pd(cell, lambda role, index, nnodes, gpus: k8s_spec.placement_for(nnodes))
    objects: list[dict] = []
    urls = {}
    for instance in plan.instances:
        name = instance_name(cell, instance)
        objects += k8s_spec.manifests(instance.plan, name=name, namespace=namespace, hardware=cell.config.hardware,
                                      patches=patches)
        urls[instance.label] = f"http://{name}-leader:{k8s_spec.PORT}"
    image = objects[0]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["image"]
    _, router = router_manifests(cell, plan.instances, urls, name=router_name(cell.id), image=image,
                                 namespace=namespace)
    return objects + router


def router_manifests(cell: Cell, instances: Sequence[RoleInstance], urls: dict[str, str], *, name: str, image: str,
                     namespace: str | None, run_id: str | None = None) -> tuple[RouterCommand, list[dict]]:
    """The router over the role instances at ``urls`` (their leader Services): its command, and [Deployment,
    Service] running it on the pod's own IP."""
    command = router_command(cell, instances, urls, f"$({k8s_spec.POD_IP_ENV})", ROUTER_PORT, ROUTER_METRICS_PORT)
    labels = {k8s_spec.LABEL_CELL: k8s_spec.label_value(cell.id), "app": name}
    if run_id:
        labels[k8s_spec.LABEL_RUN] = k8s_spec.label_value(run_id)
    metadata = {"name": name, "labels": labels, "annotations": {k8s_spec.ANNOTATION_CELL: cell.id},
                **({"namespace": namespace} if namespace else {})}
    container = {"name": ROUTER_CONTAINER, "image": image,
                 "command": ["python3", *command.argv[len(ROUTER_ENTRYPOINT) - 2:]],
                 "env": [{"name": k8s_spec.POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                 "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"}],
                 "readinessProbe": {"httpGet": {"path": "/health", "port": ROUTER_PORT}, "periodSeconds": 5}}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata,
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                           "template": {"metadata": {"labels": dict(labels)}, "spec": {"containers": [container]}}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {**copy.deepcopy(metadata), "name": f"{name}-svc"},
               "spec": {"selector": {"app": name},
                        "ports": [{"name": "http", "port": ROUTER_PORT, "targetPort": ROUTER_PORT, "protocol": "TCP"}]}}
    return command, [deployment, service]
