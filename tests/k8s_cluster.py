"""The test Kubernetes API server (.ci/kube-up.sh) and, on a namespace of this test session's own, the LWS stand-in.

``require_k8s()`` gives the k8s launcher's options, or skips saying why (fails with DSPARK_REQUIRE_K8S=1). Other
sessions may share the API server: each session works in its own namespace with its own stand-in and node.
"""

from __future__ import annotations

import atexit
import os
import uuid
from pathlib import Path

import pytest

DEFAULT_KUBECONFIG = "/etc/dspark-kube/kubeconfig"
_session: dict = {}


def kubeconfig_path() -> str:
    return os.environ.get("DSPARK_KUBECONFIG") or DEFAULT_KUBECONFIG


def api_answers(kubeconfig: str) -> str | None:
    """None if the API server answers and has the LWS CRD, else why not."""
    if not Path(kubeconfig).is_file():
        return f"no kubeconfig at {kubeconfig}"
    try:
        from kubernetes import client, config

        api_client = config.new_client_from_config(config_file=kubeconfig)
        client.ApiextensionsV1Api(api_client).read_custom_resource_definition(
            "leaderworkersets.leaderworkerset.x-k8s.io", _request_timeout=5)
    except Exception as err:  # noqa: BLE001 - any failure means: no usable test API server
        return f"the API server in {kubeconfig} does not answer with the LWS CRD ({type(err).__name__}: {err})"[:300]
    return None


def skip_or_fail(reason: str) -> None:
    if os.environ.get("DSPARK_REQUIRE_K8S") == "1":
        pytest.fail(f"{reason} (DSPARK_REQUIRE_K8S=1): eval \"$(bash .ci/kube-up.sh)\" starts the test API server")
    pytest.skip(f"{reason}: eval \"$(bash .ci/kube-up.sh)\" starts the test API server (built by "
                ".ci/kube-build.sh, ~25 min cold)")


def require_k8s() -> dict:
    """The k8s launcher's options for this session: the kubeconfig and a fresh namespace watched by a stand-in."""
    kubeconfig = kubeconfig_path()
    why = api_answers(kubeconfig)
    if why:
        skip_or_fail(why)
    if "namespace" not in _session:
        from kubernetes import client, config

        from tests.lws_standin import LwsStandIn

        api = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
        namespace = f"dspark-test-{uuid.uuid4().hex[:8]}"
        api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        standin = LwsStandIn(kubeconfig, namespace)
        standin.start()
        _session.update(namespace=namespace, standin=standin)

        def stop() -> None:
            standin.stop()
            standin.remove_namespace()

        atexit.register(stop)
    return {"kubeconfig": kubeconfig, "namespace": _session["namespace"]}


def standin():
    return _session.get("standin")
