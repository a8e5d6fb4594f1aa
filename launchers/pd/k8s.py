"""A disaggregated cell on Kubernetes, as manifests: one LeaderWorkerSet (and its leader Service) per role
instance, from the k8s launcher's own ``manifests``, and sglang-router as a Deployment with a Service, pointed at
the role instances' leader Services. The release image runs the router (SGLang's images ship sglang-router)."""

from __future__ import annotations

import copy
from typing import Sequence

from ground.sglang.router import ROUTER_ENTRYPOINT
from launchers.k8s import spec as k8s_spec
from launchers.pd.pd_plan import RoleInstance, plan_pd, router_command
from matrices.cell import Cell

ROUTER_PORT = 30000


def instance_name(cell: Cell, instance: RoleInstance) -> str:
    return k8s_spec.object_name(f"{cell.id}-{instance.role}{instance.index}")


def pd_manifests(cell: Cell, namespace: str | None = None, patches: Sequence[dict] = ()) -> list[dict]:
    plan = plan_pd(cell, lambda role, index, nnodes, gpus: k8s_spec.placement_for(nnodes))
    objects: list[dict] = []
    urls = {}
    for instance in plan.instances:
        name = instance_name(cell, instance)
        objects += k8s_spec.manifests(instance.plan, name=name, namespace=namespace, hardware=cell.config.hardware,
                                      patches=patches)
        urls[instance.label] = f"http://{name}-leader:{k8s_spec.PORT}"
    command = router_command(cell, plan.instances, urls, "0.0.0.0", ROUTER_PORT)
    return objects + _router_objects(cell, command.argv, objects[0], namespace)


def _router_objects(cell: Cell, argv: Sequence[str], first_lws: dict, namespace: str | None) -> list[dict]:
    name = k8s_spec.object_name(f"{cell.id}-router")
    labels = {k8s_spec.LABEL_CELL: k8s_spec.label_value(cell.id), "app": name}
    metadata = {"name": name, "labels": labels, "annotations": {k8s_spec.ANNOTATION_CELL: cell.id},
                **({"namespace": namespace} if namespace else {})}
    image = first_lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["image"]
    container = {"name": "router", "image": image, "command": ["python3", *argv[len(ROUTER_ENTRYPOINT) - 2:]],
                 "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"}],
                 "readinessProbe": {"httpGet": {"path": "/health", "port": ROUTER_PORT}, "periodSeconds": 5}}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata,
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                           "template": {"metadata": {"labels": dict(labels)}, "spec": {"containers": [container]}}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {**copy.deepcopy(metadata), "name": f"{name}-svc"},
               "spec": {"selector": {"app": name},
                        "ports": [{"name": "http", "port": ROUTER_PORT, "targetPort": ROUTER_PORT, "protocol": "TCP"}]}}
    return [deployment, service]
