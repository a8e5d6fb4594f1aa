"""A TEST STAND-IN for the LeaderWorkerSet controller, the garbage collector and a kubelet: not Kubernetes.

No LWS controller, scheduler or kubelet can run on the test machine (docs/K8S.md), so pods of an LWS
never appear on their own. This stand-in, talking only through the real API server, does what they would for the
LWS objects of ONE namespace:

- controller: for each LeaderWorkerSet (one group), creates the pods LWS creates: ``<lws>-0`` from the leader
  template, ``<lws>-0-<i>`` from the worker template, with LWS's labels (name, group-index, worker-index,
  group-key) and env (``LWS_LEADER_ADDRESS``, ``LWS_GROUP_SIZE``, ``LWS_WORKER_INDEX``, ``LWS_NAME``). Deviation:
  ``LWS_LEADER_ADDRESS`` is the leader pod's IP, not ``<lws>-0.<lws>.<ns>`` (there is no cluster DNS here).
- scheduler: binds a pod to this stand-in's node unless its ``nvidia.com/gpu`` limit exceeds the node's 8; then
  the pod stays Pending with ``PodScheduled=False, Unschedulable, 0/1 nodes are available: 1 Insufficient ...``.
- kubelet: "pulls" the image (an image named ``unpullable/...`` fails with ``ImagePullBackOff``), runs the
  container's command as a local process (``python3`` is this interpreter, so the simulator is importable;
  ``$(VAR)`` expanded from the container env as Kubernetes does; ``status.podIP`` and ``secretKeyRef`` resolved),
  gives each pod its own loopback IP (127.100.x.y), writes pod status (Running, then terminated with the exit
  code), serves logs on a kubelet-like HTTPS endpoint the API server streams from (``pods/log``), and on pod
  deletion stops the process and removes the pod.
- Deployment controller (PD's router): for each Deployment, ``replicas`` pods ``<deployment>-<hash>-<random>``
  from its template, labelled ``pod-template-hash``, created once. Deviation: no ReplicaSet in between (the pod's
  owner is the Deployment), and a pod that ends is neither restarted nor replaced (the kubelet here restarts no
  container; dspark-ci reports the router's exit either way).
- cluster DNS: a Service's name as a URL's host in a container's command (``http://<svc>:30000``, also
  ``<svc>.<ns>`` and ``<svc>.<ns>.svc.cluster.local``) is replaced by the IP of the pod its selector picks.
  Deviation: no name resolution and no kube-proxy here; the pod is reached at that IP on any port.
- garbage collector: a LeaderWorkerSet or Deployment deleted with foreground propagation keeps its
  ``foregroundDeletion`` finalizer until its pods are gone; the stand-in deletes the pods, then removes the finalizer.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import os
import random
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from tempfile import mkdtemp
from urllib.parse import parse_qs, urlparse

from kubernetes import client, config
from kubernetes.client.rest import ApiException

GROUP, VERSION, PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"
L_NAME, L_GROUP = "leaderworkerset.sigs.k8s.io/name", "leaderworkerset.sigs.k8s.io/group-index"
L_INDEX, L_KEY = "leaderworkerset.sigs.k8s.io/worker-index", "leaderworkerset.sigs.k8s.io/group-key"
NODE_GPUS = 8
REPO = Path(__file__).resolve().parent.parent
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def now() -> datetime:
    return datetime.now(timezone.utc)


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined variables replaced, others left as written."""
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), text)


class _Container:
    def __init__(self, process: subprocess.Popen | None, log: Path):
        self.process, self.log = process, log
        self.reported_exit = False


class LwsStandIn:
    def __init__(self, kubeconfig: str, namespace: str, poll_s: float = 0.25):
        api_client = config.new_client_from_config(config_file=kubeconfig)
        self.core, self.custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.namespace, self.poll_s = namespace, poll_s
        self.node = f"standin-{namespace}"[:60]
        self.work = Path(mkdtemp(prefix=f"lws-standin-{namespace}-"))
        self.containers: dict[str, _Container] = {}  # pod name -> its process
        self.created_pods: set[str] = set()
        self.ips: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._server: ThreadingHTTPServer | None = None
        self.errors: list[str] = []

    # lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> None:
        port = self._serve_logs()
        node = client.V1Node(metadata=client.V1ObjectMeta(name=self.node, labels={"dspark-ci/standin": "1"}))
        with contextlib.suppress(ApiException):
            self.core.delete_node(self.node, _preload_content=False)
        self.core.create_node(node)
        status = {"status": {
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
            "capacity": {"nvidia.com/gpu": str(NODE_GPUS), "cpu": "2", "pods": "110"},
            "allocatable": {"nvidia.com/gpu": str(NODE_GPUS), "cpu": "2", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "StandIn",
                            "lastHeartbeatTime": now().isoformat(), "lastTransitionTime": now().isoformat()}]}}
        self.core.patch_node_status(self.node, status)
        self._thread = threading.Thread(target=self._loop, name=f"lws-standin-{self.namespace}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(5)
        for container in self.containers.values():
            self._kill(container)
        if self._server:
            self._server.shutdown()
        with contextlib.suppress(ApiException):
            self.core.delete_node(self.node, _preload_content=False)

    def remove_namespace(self) -> None:
        """Delete the namespace and finalize it ourselves (no namespace controller runs here)."""
        with contextlib.suppress(ApiException):  # what a failed test left: finalizing would orphan it in etcd
            for deployment in self.apps.list_namespaced_deployment(self.namespace).items:
                self.apps.patch_namespaced_deployment(deployment.metadata.name, self.namespace,
                                                      [{"op": "replace", "path": "/metadata/finalizers", "value": []}])
                self.apps.delete_namespaced_deployment(deployment.metadata.name, self.namespace,
                                                       _preload_content=False)
            for lws in self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)["items"]:
                self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL,
                                                           lws["metadata"]["name"], {"metadata": {"finalizers": []}})
                self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL,
                                                            lws["metadata"]["name"], _preload_content=False)
            for service in self.core.list_namespaced_service(self.namespace).items:
                self.core.delete_namespaced_service(service.metadata.name, self.namespace, _preload_content=False)
            for secret in self.core.list_namespaced_secret(self.namespace).items:
                self.core.delete_namespaced_secret(secret.metadata.name, self.namespace, _preload_content=False)
            for pod in self.core.list_namespaced_pod(self.namespace).items:
                self.core.delete_namespaced_pod(pod.metadata.name, self.namespace, grace_period_seconds=0,
                                                _preload_content=False)
            self.core.delete_namespace(self.namespace, _preload_content=False)
            ns = self.core.read_namespace(self.namespace)
            ns.spec.finalizers = []
            self.core.replace_namespace_finalize(self.namespace, ns)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as err:  # noqa: BLE001 - a stand-in must keep going; the test sees the errors
                self.errors.append(f"{type(err).__name__}: {err}")
            self._stop.wait(self.poll_s)

    # one round ------------------------------------------------------------------------------------------
    def _tick(self) -> None:
        lwss = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)["items"]
        pods = {p.metadata.name: p for p in self.core.list_namespaced_pod(self.namespace).items}
        live = set()
        for lws in lwss:
            name = lws["metadata"]["name"]
            owned = [p for p in pods.values() if (p.metadata.labels or {}).get(L_NAME) == name]
            if lws["metadata"].get("deletionTimestamp"):
                self._collect(lws, owned)
                continue
            live.add(name)
            self._reconcile(lws, pods)
        for deployment in self.apps.list_namespaced_deployment(self.namespace).items:
            owned = [p for p in pods.values() if _owner(p, "Deployment") == deployment.metadata.name]
            if deployment.metadata.deletion_timestamp:
                self._collect_deployment(deployment, owned)
                continue
            live.add(deployment.metadata.name)
            self._reconcile_deployment(deployment, owned)
        for pod in pods.values():  # pods whose LWS is gone (background deletion): the garbage collector's job
            owner = (pod.metadata.labels or {}).get(L_NAME)
            if owner and owner not in live and not pod.metadata.deletion_timestamp and any(
                    o.kind == "LeaderWorkerSet" for o in pod.metadata.owner_references or []):
                if not any(lw["metadata"]["name"] == owner for lw in lwss):
                    self._delete_pod(pod.metadata.name)
            elif _owner(pod, "Deployment") and _owner(pod, "Deployment") not in live \
                    and not pod.metadata.deletion_timestamp:
                self._delete_pod(pod.metadata.name)
        for pod in pods.values():
            self._kubelet(pod)

    def _collect(self, lws: dict, owned: list) -> None:
        """Foreground deletion: dependents first, then the finalizer goes and the API server removes the LWS."""
        for pod in owned:
            if not pod.metadata.deletion_timestamp:
                self._delete_pod(pod.metadata.name)
        if not owned and "foregroundDeletion" in (lws["metadata"].get("finalizers") or []):
            rest = [f for f in lws["metadata"]["finalizers"] if f != "foregroundDeletion"]
            self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL,
                                                       lws["metadata"]["name"], {"metadata": {"finalizers": rest}})

    def _collect_deployment(self, deployment, owned: list) -> None:
        for pod in owned:
            if not pod.metadata.deletion_timestamp:
                self._delete_pod(pod.metadata.name)
        finalizers = deployment.metadata.finalizers or []
        if not owned and "foregroundDeletion" in finalizers:
            # a JSON patch: a strategic merge patch merges metadata.finalizers (patchStrategy merge), never shortens it
            self.apps.patch_namespaced_deployment(deployment.metadata.name, self.namespace, [{
                "op": "replace", "path": "/metadata/finalizers",
                "value": [f for f in finalizers if f != "foregroundDeletion"]}])

    def _reconcile_deployment(self, deployment, owned: list) -> None:
        """The Deployment's pods, created once (what its ReplicaSet would create)."""
        template = self.apps.api_client.sanitize_for_serialization(deployment.spec.template)
        pod_hash = hashlib.sha1(repr(template).encode()).hexdigest()[:10]
        wanted = (deployment.spec.replicas or 1) - len(owned)
        for _ in range(wanted if deployment.metadata.uid not in self.created_pods else 0):
            pod_name = f"{deployment.metadata.name}-{pod_hash}-{uuid.uuid4().hex[:5]}"
            owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment.metadata.name,
                     "uid": deployment.metadata.uid, "controller": True, "blockOwnerDeletion": True}
            meta = template.get("metadata") or {}
            pod_spec = copy.deepcopy(template["spec"])
            pod_spec["nodeName"] = self.node
            self.core.create_namespaced_pod(self.namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": pod_name, "labels": {**(meta.get("labels") or {}), "pod-template-hash": pod_hash},
                "ownerReferences": [owner]}, "spec": pod_spec})
        self.created_pods.add(deployment.metadata.uid)

    def _service_hosts(self) -> dict[str, str]:
        """Cluster DNS, stood in for: each Service's name -> the IP of a pod its selector picks."""
        pods = self.core.list_namespaced_pod(self.namespace).items
        hosts = {}
        for service in self.core.list_namespaced_service(self.namespace).items:
            selector = service.spec.selector or {}
            picked = [p for p in pods if selector and selector.items() <= (p.metadata.labels or {}).items()
                      and p.metadata.name in self.ips]
            if picked:
                hosts[service.metadata.name] = self.ips[picked[0].metadata.name]
        return hosts

    def _resolve(self, arg: str, hosts: dict[str, str]) -> str:
        suffix = rf"(?:\.{re.escape(self.namespace)}(?:\.svc(?:\.cluster\.local)?)?)?"
        return re.sub(rf"(?<=//)([a-z0-9-]+){suffix}(?=[:/]|$)", lambda m: hosts.get(m.group(1), m.group(0)), arg)

    def _delete_pod(self, name: str) -> None:
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(name, self.namespace, _preload_content=False)

    def _reconcile(self, lws: dict, pods: dict) -> None:
        name, spec = lws["metadata"]["name"], lws["spec"]["leaderWorkerTemplate"]
        size = int(spec.get("size", 1))
        leader_ip = self.ips.setdefault(f"{name}-0", self._new_ip())
        key = hashlib.sha1(f"{self.namespace}/{name}-0".encode()).hexdigest()
        for index in range(size):
            pod_name = f"{name}-0" if index == 0 else f"{name}-0-{index}"
            if pod_name in pods or pod_name in self.created_pods:
                continue
            template = spec["leaderTemplate"] if index == 0 and spec.get("leaderTemplate") else spec["workerTemplate"]
            meta = template.get("metadata") or {}
            labels = {**(meta.get("labels") or {}), L_NAME: name, L_GROUP: "0", L_INDEX: str(index), L_KEY: key}
            pod_spec = copy.deepcopy(template["spec"])
            lws_env = [{"name": "LWS_LEADER_ADDRESS", "value": leader_ip},
                       {"name": "LWS_GROUP_SIZE", "value": str(size)},
                       {"name": "LWS_WORKER_INDEX", "value": str(index)},
                       {"name": "LWS_NAME", "value": name}]
            for container in pod_spec["containers"]:
                container["env"] = lws_env + list(container.get("env") or [])
                for kind in ("limits", "requests"):  # quantities: the LWS schema allows ints, Pod's client strings
                    amounts = (container.get("resources") or {}).get(kind) or {}
                    amounts.update({k: str(v) for k, v in amounts.items()})
            gpus = sum(int(((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0))
                       for c in pod_spec["containers"])
            schedulable = gpus <= NODE_GPUS
            if schedulable:
                pod_spec["nodeName"] = self.node
            owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "LeaderWorkerSet", "name": name,
                     "uid": lws["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": pod_name, "labels": labels, "annotations": meta.get("annotations") or {},
                                "ownerReferences": [owner]},
                   "spec": pod_spec}
            self.core.create_namespaced_pod(self.namespace, pod)
            self.created_pods.add(pod_name)
            if not schedulable:
                self._status(pod_name, {"phase": "Pending", "conditions": [{
                    "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
                    "lastTransitionTime": now().isoformat()}]})
                self._event(pod_name, "FailedScheduling", "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
                            "default-scheduler")

    # the kubelet ----------------------------------------------------------------------------------------
    def _event(self, pod_name: str, reason: str, message: str, component: str) -> None:
        """A Warning event on the pod, as the scheduler or a kubelet writes one."""
        stamp = now().isoformat()
        with contextlib.suppress(ApiException):
            self.core.create_namespaced_event(self.namespace, {
                "metadata": {"name": f"{pod_name}.{uuid.uuid4().hex[:10]}", "namespace": self.namespace},
                "involvedObject": {"kind": "Pod", "name": pod_name, "namespace": self.namespace, "apiVersion": "v1"},
                "reason": reason, "message": message, "type": "Warning", "count": 1,
                "firstTimestamp": stamp, "lastTimestamp": stamp, "source": {"component": component}})

    def _new_ip(self) -> str:
        return f"127.100.{random.randint(0, 255)}.{random.randint(2, 254)}"

    def _status(self, pod_name: str, status: dict) -> None:
        with contextlib.suppress(ApiException):
            self.core.patch_namespaced_pod_status(pod_name, self.namespace, {"status": status})

    def _kubelet(self, pod) -> None:
        name = pod.metadata.name
        if pod.spec.node_name != self.node:
            return
        if pod.metadata.deletion_timestamp:
            container = self.containers.pop(name, None)
            if container:
                self._kill(container)
            with contextlib.suppress(ApiException):
                self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0, _preload_content=False)
            return
        spec = pod.spec.containers[0]
        if name not in self.containers:
            ip = self.ips.setdefault(name, self._new_ip())
            log = self.work / f"{name}.log"
            if spec.image.startswith("unpullable/"):
                log.write_text("")
                self.containers[name] = _Container(None, log)
                # the kubelet's event first, as a real pull fails (ErrImagePull) before it backs off
                self._event(name, "Failed", f'Failed to pull image "{spec.image}": not found', "kubelet")
                self._status(name, {"phase": "Pending", "podIP": ip, "hostIP": "127.0.0.1", "containerStatuses": [{
                    "name": spec.name, "image": spec.image, "imageID": "", "ready": False, "restartCount": 0,
                    "state": {"waiting": {"reason": "ImagePullBackOff",
                                          "message": f'Back-off pulling image "{spec.image}"'}}}]})
                return
            env = self._env(pod, spec, ip)
            argv = [expand(a, env) for a in [*(spec.command or []), *(spec.args or [])]]
            if any("//" in a for a in argv):
                hosts = self._service_hosts()
                argv = [self._resolve(a, hosts) for a in argv]
            if argv and argv[0] in ("python3", "python"):
                argv[0] = sys.executable
            with open(log, "w") as out:
                process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO),
                                                "HOME": os.environ.get("HOME", "/root"), **env},
                                           cwd=str(REPO), start_new_session=True)
            self.containers[name] = _Container(process, log)
            self._status(name, {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "127.0.0.1",
                                "startTime": now().isoformat(),
                                "conditions": [{"type": "PodScheduled", "status": "True"}],
                                "containerStatuses": [{
                                    "name": spec.name, "image": spec.image, "imageID": spec.image, "ready": False,
                                    "restartCount": 0, "started": True,
                                    "state": {"running": {"startedAt": now().isoformat()}}}]})
            return
        container = self.containers[name]
        if container.process is None or container.reported_exit:
            return
        code = container.process.poll()
        if code is not None:
            container.reported_exit = True
            self._status(name, {"phase": "Succeeded" if code == 0 else "Failed", "containerStatuses": [{
                "name": spec.name, "image": spec.image, "imageID": spec.image, "ready": False, "restartCount": 0,
                "state": {"terminated": {"exitCode": code if code >= 0 else 128 - code,
                                         "reason": "Completed" if code == 0 else "Error",
                                         "finishedAt": now().isoformat()}}}]})

    def _env(self, pod, spec, ip: str) -> dict[str, str]:
        env: dict[str, str] = {}
        for var in spec.env or []:
            if var.value_from is None:
                env[var.name] = expand(var.value or "", env)
            elif var.value_from.field_ref is not None:
                path = var.value_from.field_ref.field_path
                env[var.name] = {"status.podIP": ip, "metadata.name": pod.metadata.name,
                                 "metadata.namespace": self.namespace}.get(path, "")
            elif var.value_from.secret_key_ref is not None:
                ref = var.value_from.secret_key_ref
                secret = self.core.read_namespaced_secret(ref.name, self.namespace)
                raw = (secret.data or {}).get(ref.key, "")
                env[var.name] = base64.b64decode(raw).decode() if raw else ""
        return env

    def _kill(self, container: _Container) -> None:
        process = container.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(3)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(3)

    # logs: the kubelet's /containerLogs endpoint, which the API server's pods/log streams from ---------
    def _serve_logs(self) -> int:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                url = urlparse(self.path)
                parts = url.path.strip("/").split("/")
                if len(parts) != 4 or parts[0] != "containerLogs" or parts[1] != standin.namespace:
                    self.send_error(404)
                    return
                container = standin.containers.get(parts[2])
                if container is None:
                    self.send_error(404)
                    return
                follow = parse_qs(url.query).get("follow", ["false"])[0] == "true"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                with open(container.log, "rb") as handle:
                    while True:
                        chunk = handle.read(65536)
                        if chunk:
                            self.wfile.write(chunk)
                            self.wfile.flush()
                            continue
                        alive = container.process is not None and container.process.poll() is None
                        if not follow or not alive or standin._stop.is_set():
                            rest = handle.read()
                            if rest:
                                self.wfile.write(rest)
                            return
                        time.sleep(0.1)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        cert = os.environ.get("DSPARK_KUBELET_CERT", "/etc/dspark-kube/pki/kubelet.crt")
        key = os.environ.get("DSPARK_KUBELET_KEY", "/etc/dspark-kube/pki/kubelet.key")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self._server = server
        threading.Thread(target=server.serve_forever, name="standin-kubelet", daemon=True).start()
        return server.server_address[1]


def _owner(pod, kind: str) -> str | None:
    return next((o.name for o in pod.metadata.owner_references or [] if o.kind == kind), None)


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"
