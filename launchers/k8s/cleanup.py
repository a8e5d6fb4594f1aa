"""Deleting what a launch created (foreground propagation, then waiting until the group's pods are gone), and
``remove_started`` for ``dspark-ci cleanup``: one ledger entry of a dead run."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

from dspark_ci.ground.errors import InfraError
from dspark_ci.ground.ledger import LedgerEntry
from dspark_ci.launchers.k8s import spec as k8s_spec
from dspark_ci.launchers.k8s.client import Api, api_errors, connect, status_message


def delete_all(api: Api, objects: Sequence[tuple[str, str]], pods_selector: str | None, wait_s: float) -> str | None:
    """Delete the objects (foreground propagation) and wait until they and their pods (``pods_selector``) are
    gone. Returns what is still there after ``wait_s``, or None."""
    from kubernetes import client

    api_exception, http_error = api_errors()
    ns = api.namespace
    body = client.V1DeleteOptions(propagation_policy="Foreground")
    # Responses are not parsed (_preload_content=False): a 1.20 API server answers some deletes with a Status the
    # client's models do not expect.
    for kind, name in objects:
        with contextlib.suppress(api_exception, http_error, OSError):
            if kind == k8s_spec.LWS_KIND:
                api.custom.delete_namespaced_custom_object(k8s_spec.LWS_GROUP, k8s_spec.LWS_VERSION, ns,
                                                           k8s_spec.LWS_PLURAL, name, body=body, _request_timeout=10,
                                                           _preload_content=False)
            elif kind == "Deployment":  # PD's router
                apps(api).delete_namespaced_deployment(name, ns, body=body, _request_timeout=10,
                                                       _preload_content=False)
            elif kind == "Service":  # no dependents: a plain delete (foreground would wait for a GC to no end)
                api.core.delete_namespaced_service(name, ns, _request_timeout=10, _preload_content=False)
            elif kind == "Secret":
                api.core.delete_namespaced_secret(name, ns, _request_timeout=10, _preload_content=False)
    deadline = time.monotonic() + wait_s
    while True:
        left = []
        with contextlib.suppress(api_exception, http_error, OSError):
            if pods_selector:
                pods = api.core.list_namespaced_pod(ns, label_selector=pods_selector, _request_timeout=10).items
                left += [f"pod {p.metadata.name}" for p in pods]
            for kind, name in objects:
                if exists(api, kind, name):
                    left.append(f"{kind} {name}")
        if not left:
            return None
        if time.monotonic() >= deadline:
            return ", ".join(left)
        time.sleep(0.5)


def apps(api: Api):
    """The apps/v1 API (Deployments) on the same connection."""
    from kubernetes import client

    return client.AppsV1Api(api.core.api_client)


def exists(api: Api, kind: str, name: str) -> bool:
    api_exception = api_errors()[0]
    try:
        if kind == k8s_spec.LWS_KIND:
            api.custom.get_namespaced_custom_object(k8s_spec.LWS_GROUP, k8s_spec.LWS_VERSION, api.namespace,
                                                    k8s_spec.LWS_PLURAL, name, _request_timeout=10)
        elif kind == "Deployment":
            apps(api).read_namespaced_deployment(name, api.namespace, _request_timeout=10)
        elif kind == "Service":
            api.core.read_namespaced_service(name, api.namespace, _request_timeout=10)
        elif kind == "Secret":
            api.core.read_namespaced_secret(name, api.namespace, _request_timeout=10)
        else:
            return False
    except api_exception as err:
        if err.status == 404:
            return False
        raise
    return True


def remove_started(entry: LedgerEntry, dry_run: bool = False) -> str | None:
    """Delete one object a dead run recorded (catalog contract), if it is still there; None if already gone.
    ``dry_run``: only say so."""
    kind, name, ns = entry.kind, entry.name, entry.namespace
    if not (kind and name and ns):
        return None
    api = connect(entry.kubeconfig, ns)
    api_exception, http_error = api_errors()
    try:
        if not exists(api, kind, name):
            return None
    except (api_exception, http_error, OSError) as err:
        raise InfraError(f"cannot reach {api.where} to remove {kind} {name}: {status_message(err)}") from None
    # a Deployment stays until its pods go
    pods = f"{k8s_spec.LWS_NAME_LABEL}={name}" if kind == k8s_spec.LWS_KIND else None
    if not dry_run and (left := delete_all(api, [(kind, name)], pods, 60.0)):
        raise InfraError(f"still there after deletion: {left}")
    return f"{kind} {name} in namespace {ns} (cell {entry.cell}) on {api.where}"
