"""The Kubernetes API as the launcher uses it: the client objects for one kubeconfig, its errors and messages."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_ci.ground.errors import InfraError


@dataclass
class Api:
    """The client objects for one kubeconfig, and the namespace it resolves to."""

    core: Any
    custom: Any
    auth: Any
    namespace: str
    where: str  # for messages: the server's URL


def connect(kubeconfig: str | None, namespace: str | None) -> Api:
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    try:
        if kubeconfig or os.environ.get("KUBECONFIG") or Path("~/.kube/config").expanduser().is_file():
            api_client = config.new_client_from_config(config_file=kubeconfig)
            _, active = config.list_kube_config_contexts(config_file=kubeconfig)
            default_ns = (active or {}).get("context", {}).get("namespace") or "default"
        else:
            config.load_incluster_config()
            api_client = client.ApiClient()
            default_ns = "default"
    except (ConfigException, OSError, TypeError, ValueError) as err:
        raise InfraError(f"no usable Kubernetes configuration ({err}): pass --kubeconfig FILE or set KUBECONFIG"
                         ) from None
    return Api(client.CoreV1Api(api_client), client.CustomObjectsApi(api_client),
               client.AuthorizationV1Api(api_client), namespace or default_ns, api_client.configuration.host)


def api_errors():
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError

    return ApiException, HTTPError


def status_message(err: Any) -> str:
    import json

    with contextlib.suppress(Exception):
        return json.loads(err.body).get("message") or str(err.reason)
    return f"{getattr(err, 'status', '')} {getattr(err, 'reason', err)}"


POD_QUOTA_KEYS = ("pods", "count/pods")  # ResourceQuota limits on the number of pods


def quantity(text: str) -> int:
    """A pod count from a ResourceQuota (plain integers; ``1k`` style suffixes read too)."""
    from kubernetes.utils import parse_quantity

    return int(parse_quantity(str(text)))
