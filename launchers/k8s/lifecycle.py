"""The Kubernetes launcher: every cell as one LeaderWorkerSet, driven through the API with the official client.

Used like every launcher (``launchers.contract``)::

    launcher = build(context, {"kubeconfig": None, "namespace": "sglang-ci", "k8s_extra": "site.yaml"})
    launcher.preflight(plans)       # the API answers, the LWS CRD is installed, the namespace exists, we may create
    with launcher.launch(plan, logs_dir) as deployment:
        ...                         # deployment.base_url is rank 0's pod; check() raises if a pod of the group failed

Per launch: a Secret with the cell's ``${NAME}`` values (if any), the LeaderWorkerSet and the leader's Service
(``launchers.k8s.spec``), each written to the run's ledger before it is created. Then the pods of the group are
watched by label: every pod's log is streamed into ``logs/<cell>/<rank>.log`` (rank = LWS's worker index); a pod
that cannot be scheduled or pulled, a container that terminated or restarted, fails the cell with the reason,
the rank, the exit code, SGLang's error line and the log's end. Pending time (scheduling, pulling) has its own
limit and is kept apart from the boot time, which starts once every pod of the group runs. Readiness: rank 0's
``/health`` (and ``/server_info`` naming our arguments), reached at the pod's IP (``reach="pod-ip"``: the runner
is inside the cluster network) or through the API server's pod proxy (``reach="proxy"``). Teardown: delete with
foreground propagation, then wait until no pod of the group is left. docs/K8S.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from ground.errors import BadInput, InfraError
from launchers.k8s import spec as k8s_spec
from launchers.k8s.options import K8sOptions
from launchers.contract import (LOG_LINES_KEPT, Capacity, LOG_LINES_SEARCHED, LaunchContext, LaunchTimeout,
                                RankExit, group_failed)
from launchers.ledger import Ledger
from launchers.logs import rank_log_path, tail
from launchers.plan_types import LaunchPlan, Placement
from launchers.processes import signals_deferred, sigterm_as_interrupt
from launchers.materialize import redact, secret_values
from launchers.readiness import Deadline, NotReady, OurServer, wait_until_ready

DEFAULT_PENDING_TIMEOUT_S = {"sim": 120.0, "sglang": 1800.0}
# Waiting reasons that never resolve on their own (kubelet's names).
STUCK_REASONS = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull",
                           "CreateContainerConfigError", "CreateContainerError", "CrashLoopBackOff",
                           "RunContainerError"})
POD_CACHE_S = 0.5
SETTLE_S = 0.5


def _stderr_progress(message: str) -> None:
    print(f"dspark-ci: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class K8sSettings:
    server: str = "sim"
    kubeconfig: str | None = None  # None: $KUBECONFIG, ~/.kube/config, else in-cluster
    namespace: str | None = None  # None: the kubeconfig context's namespace, else "default"
    patches: tuple[dict, ...] = ()
    reach: str = "pod-ip"
    image: str | None = None  # None: the cell's (sglang) or the simulator image (sim)
    boot_timeout_s: float = 600.0
    pending_timeout_s: float = 120.0
    delete_wait_s: float = 60.0
    poll_s: float = 0.5
    run_id: str = "manual"
    ledger: Ledger | None = None
    caller_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    forward_env_prefixes: tuple[str, ...] = ("DSPARK_SIM_",)
    progress: Callable[[str], None] | None = _stderr_progress


def build(context: LaunchContext, options: K8sOptions) -> "K8sLauncher":
    """The catalog's constructor (launchers.catalog): --kubeconfig, --namespace, --k8s-extra, --k8s-reach, checked,
    in ``options``."""
    return K8sLauncher(K8sSettings(
        server=context.server, kubeconfig=options.kubeconfig, namespace=options.namespace,
        patches=tuple(k8s_spec.load_patches(options.extra)), reach=options.reach,
        boot_timeout_s=context.boot_timeout_s, pending_timeout_s=DEFAULT_PENDING_TIMEOUT_S.get(context.server, 600.0),
        run_id=context.run_id, ledger=Ledger(context.run_id, context.run_dir), caller_env=dict(context.caller_env)))


# --- the API ---------------------------------------------------------------------------------------------

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


def _api_errors():
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError

    return ApiException, HTTPError


def _status_message(err: Any) -> str:
    import json

    with contextlib.suppress(Exception):
        return json.loads(err.body).get("message") or str(err.reason)
    return f"{getattr(err, 'status', '')} {getattr(err, 'reason', err)}"


POD_QUOTA_KEYS = ("pods", "count/pods")  # ResourceQuota limits on the number of pods


def _quantity(text: str) -> int:
    """A pod count from a ResourceQuota (plain integers; ``1k`` style suffixes read too)."""
    from kubernetes.utils import parse_quantity

    return int(parse_quantity(str(text)))


# --- the launcher --------------------------------------------------------------------------------------

class K8sLauncher:
    name = "k8s"

    def __init__(self, settings: K8sSettings | None = None):
        self.settings = settings or K8sSettings()
        self._api: Api | None = None

    @property
    def api(self) -> Api:
        if self._api is None:
            self._api = connect(self.settings.kubeconfig, self.settings.namespace)
        return self._api

    def placement(self, nnodes: int, gpus_per_node: int | None = None) -> Placement:
        """Every pod binds its own IP; rank 0 is LWS's leader address; the same ports in every pod."""
        return k8s_spec.placement_for(nnodes)

    def capacity(self) -> Capacity:
        """As many cells side by side as the namespace's pod quota has room for (one pod per node of a cell);
        without a pod quota nothing says how much the cluster may take: one at a time, unless --max-parallel."""
        api, (api_exception, http_error) = self.api, _api_errors()
        try:
            quotas = api.core.list_namespaced_resource_quota(api.namespace, _request_timeout=10).items
        except (api_exception, http_error, OSError) as err:
            raise InfraError(f"cannot read the resource quotas of namespace {api.namespace!r} on {api.where}: "
                             f"{_status_message(err)} (or pass --max-parallel)") from None
        room = [_quantity(q.status.hard[key]) - _quantity((q.status.used or {}).get(key, "0"))
                for q in quotas if q.status and q.status.hard for key in POD_QUOTA_KEYS if key in q.status.hard]
        if not room:
            return Capacity(1, None, f"namespace {api.namespace} states no pod quota: one cell at a time unless "
                                     "--max-parallel says how many")
        pods = max(0, min(room))
        return Capacity(max(1, pods), pods or None, f"room for {pods} pod(s) in namespace {api.namespace}'s quota")

    def preflight(self, plans: Sequence[LaunchPlan]) -> None:
        """The API answers, the LWS CRD is installed, the namespace exists, this identity may create LWS."""
        from kubernetes import client

        api, (api_exception, http_error) = self.api, _api_errors()
        try:
            api.core.get_api_resources(_request_timeout=10)
        except (api_exception, http_error, OSError) as err:
            raise InfraError(f"the Kubernetes API at {api.where} does not answer ({_status_message(err)}): "
                             "check --kubeconfig and that the cluster is up") from None
        try:
            client.ApiextensionsV1Api(api.core.api_client).read_custom_resource_definition(
                f"{k8s_spec.LWS_PLURAL}.{k8s_spec.LWS_GROUP}", _request_timeout=10)
        except api_exception as err:
            if err.status == 404:
                raise InfraError(f"the LeaderWorkerSet CRD is not installed on {api.where}: install LWS "
                                 "(https://lws.sigs.k8s.io, v0.6 or later)") from None
            if err.status != 403:  # may not read CRDs: the create check below still tells
                raise InfraError(f"cannot look up the LWS CRD on {api.where}: {_status_message(err)}") from None
        try:
            api.core.read_namespace(api.namespace, _request_timeout=10)
        except api_exception as err:
            if err.status == 404:
                raise InfraError(f"namespace {api.namespace!r} does not exist on {api.where}: create it or pass "
                                 "--namespace") from None
        review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(namespace=api.namespace, verb="create",
                                                            group=k8s_spec.LWS_GROUP,
                                                            resource=k8s_spec.LWS_PLURAL)))
        try:
            answer = api.auth.create_self_subject_access_review(review, _request_timeout=10)
        except api_exception as err:
            raise InfraError(f"cannot ask {api.where} what this identity may do: {_status_message(err)}") from None
        if not answer.status.allowed:
            raise InfraError(f"this identity may not create LeaderWorkerSets in namespace {api.namespace!r} on "
                             f"{api.where} ({answer.status.reason or 'RBAC'}): grant create/get/list/watch/delete "
                             "on leaderworkersets, pods, pods/log, services, secrets, events (docs/K8S.md)")

    @contextlib.contextmanager
    def launch(self, plan: LaunchPlan, logs_dir: Path) -> Iterator["K8sDeployment"]:
        logs_dir.mkdir(parents=True, exist_ok=True)
        group = _Group(plan, logs_dir, self.settings, self.api)
        with sigterm_as_interrupt():
            try:
                group.create()
                group.wait_running()
                deployment = K8sDeployment(plan.cell_id, group)
                leader = dataclasses.replace(plan, base_url=deployment.base_url,
                                             health_url=f"{deployment.base_url}/health")
                strategy = OurServer(leader) if self.settings.reach == "pod-ip" else _ProxyHealth(group, leader)
                wait_until_ready(strategy, Deadline(self.settings.boot_timeout_s, self.settings.poll_s),
                                 deployment.check, cell_id=plan.cell_id, last_lines=group.rank0_tail)
                deployment.boot_seconds = time.monotonic() - group.running_since
                deployment.pending_seconds = group.pending_seconds
                yield deployment
            finally:
                with signals_deferred():
                    group.teardown()


class K8sDeployment:
    def __init__(self, cell_id: str, group: "_Group"):
        self.cell_id, self._group = cell_id, group
        self.base_url = group.leader_url()
        self.boot_seconds = 0.0
        self.pending_seconds = 0.0  # scheduling and pulling, before the boot clock started

    def check(self) -> None:
        self._group.check()


@dataclass(frozen=True)
class _ProxyHealth:
    """Rank 0's /health through the API server's pod proxy (no network path to the pod needed)."""

    group: "_Group"
    plan: LaunchPlan

    def describe(self) -> str:
        return f"HTTP 200 from /health of pod {self.group.leader_pod} through the API server's proxy"

    def probe(self, timeout_s: float) -> None:
        api_exception, http_error = _api_errors()
        port = k8s_spec._port_of(self.plan.ranks[0].argv)
        try:
            self.group.api.core.connect_get_namespaced_pod_proxy_with_path(
                f"{self.group.leader_pod}:{port}", self.group.api.namespace, "health",
                _request_timeout=max(0.1, min(5.0, timeout_s)))
        except api_exception as err:
            message = _status_message(err)
            if err.status == 400 and "not allowed" in message:  # IsProxyableIP: loopback/link-local pod IPs
                raise InfraError(f"{self.plan.cell_id}: the API server will not proxy to pod {self.group.leader_pod}"
                                 f" ({message}): its IP is loopback or link-local; use --k8s-reach pod-ip") from None
            raise NotReady(message) from None
        except (http_error, OSError) as err:
            raise NotReady(_status_message(err)) from None


class PodStuck(LaunchTimeout):
    """A pod of the group cannot run (not schedulable, image not pullable, config refused): its reason named."""

    def __str__(self) -> str:
        parts = [f"{self.cell_id}: node rank {self.node_rank} cannot start: {self.hint}"]
        if self.last_lines:
            parts.append("last log lines:\n    " + "\n    ".join(self.last_lines[-10:]))
        return "\n  ".join(parts)


def _epoch(value: Any) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    return time.time()


class _Group:
    """One cell's LeaderWorkerSet: created, watched, deleted."""

    def __init__(self, plan: LaunchPlan, logs_dir: Path, settings: K8sSettings, api: Api):
        self.plan, self.logs_dir, self.settings, self.api = plan, logs_dir, settings, api
        self.token = uuid.uuid4().hex[:6]
        self.name = k8s_spec.object_name(plan.cell_id, self.token)
        self.secrets = secret_values(plan.ranks[0].env, settings.caller_env)
        self.created: list[tuple[str, str]] = []  # (kind, name) created, for teardown
        self.started = time.monotonic()
        self.running_since = self.started
        self.pending_seconds = 0.0
        self.leader_pod = ""
        self._pods: list[Any] = []
        self._pods_at = float("-inf")
        self._streams: dict[str, threading.Thread] = {}
        self._stop = threading.Event()

    # creation -------------------------------------------------------------------------------------------
    def objects(self) -> tuple[dict | None, dict, dict]:
        s = self.settings
        image = s.image or (k8s_spec.SIM_IMAGE if s.server == "sim" else None)
        forwarded = {k: v for k, v in s.caller_env.items() if k.startswith(s.forward_env_prefixes)}
        lws, service = k8s_spec.manifests(self.plan, name=self.name, namespace=self.api.namespace, image=image,
                                          server=s.server, run_id=s.run_id, secret_name=self.name,
                                          extra_env=forwarded, patches=s.patches)
        names = sorted({e["valueFrom"]["secretKeyRef"]["key"] for e in _containers_env(lws)
                        if "secretKeyRef" in e.get("valueFrom", {})})
        secret = None
        if names:
            secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                      "metadata": {**lws["metadata"], "name": self.name},
                      "stringData": {n: s.caller_env.get(n, "") for n in names}}
        return secret, lws, service

    def create(self) -> None:
        secret, lws, service = self.objects()
        ns, api_exception = self.api.namespace, _api_errors()[0]
        for kind, body, call in (
                ("Secret", secret, lambda b: self.api.core.create_namespaced_secret(ns, b)),
                (k8s_spec.LWS_KIND, lws, lambda b: self.api.custom.create_namespaced_custom_object(
                    k8s_spec.LWS_GROUP, k8s_spec.LWS_VERSION, ns, k8s_spec.LWS_PLURAL, b)),
                ("Service", service, lambda b: self.api.core.create_namespaced_service(ns, b))):
            if body is None:
                continue
            name = body["metadata"]["name"]
            if self.settings.ledger:
                self.settings.ledger.record("k8s", self.plan.cell_id, None, kind=kind, name=name, namespace=ns,
                                            kubeconfig=self.settings.kubeconfig, server=self.api.where)
            try:
                call(body)
            except api_exception as err:
                message = redact(_status_message(err), self.secrets)
                if err.status in (400, 422):
                    raise BadInput(f"cell {self.plan.cell_id}", f"the API server refused the {kind}: {message}",
                                   "fix the matrix or the --k8s-extra patch (`dspark-ci plan --format k8s` "
                                   "prints what is sent)") from None
                raise InfraError(f"{self.plan.cell_id}: creating {kind} {name} in {ns} on {self.api.where} "
                                 f"failed: {message}") from None
            self.created.append((kind, name))
        self.started = time.monotonic()

    # watching -------------------------------------------------------------------------------------------
    def pods(self, max_age_s: float = POD_CACHE_S) -> list[Any]:
        if time.monotonic() - self._pods_at > max_age_s:
            api_exception, http_error = _api_errors()
            try:
                found = self.api.core.list_namespaced_pod(
                    self.api.namespace, label_selector=f"{k8s_spec.LWS_NAME_LABEL}={self.name}",
                    _request_timeout=10).items
            except (api_exception, http_error, OSError) as err:
                raise InfraError(f"{self.plan.cell_id}: cannot list the pods of {self.name} on {self.api.where}: "
                                 f"{_status_message(err)}") from None
            self._pods, self._pods_at = found, time.monotonic()
            for pod in found:
                self._stream_log(pod)
        return self._pods

    @staticmethod
    def rank_of(pod: Any) -> int:
        return int((pod.metadata.labels or {}).get(k8s_spec.LWS_INDEX_LABEL, "0"))

    def wait_running(self) -> None:
        """Until every pod of the group runs (the pending limit), failing at once on a stuck pod."""
        s, shown = self.settings, None
        while True:
            pods = self.pods(max_age_s=0)
            self.check(pods)
            running = [p for p in pods if p.status and p.status.phase == "Running" and p.status.pod_ip]
            if len(running) >= len(self.plan.ranks):
                self.leader_pod = next(p.metadata.name for p in running if self.rank_of(p) == 0)
                self.running_since = time.monotonic()
                self.pending_seconds = self.running_since - self.started
                return
            waited = time.monotonic() - self.started
            why = self._pending_reason(pods) or f"{len(pods)} of {len(self.plan.ranks)} pod(s) created"
            if s.progress and why != shown:
                s.progress(f"{self.plan.cell_id}: LeaderWorkerSet {self.name} pending ({why})")
                shown = why
            if waited >= s.pending_timeout_s:
                events = [e for p in pods for e in self.warnings(p.metadata.name)]
                raise PodStuck(cell_id=self.plan.cell_id, reason="timeout", node_rank=0, hint=(
                    f"the group's pods were not all running after {waited:.0f}s ({why}); the boot timeout had not "
                    "started" + (f"; events: {'; '.join(events)}" if events else "")
                    + f". `kubectl -n {self.api.namespace} describe pods -l {k8s_spec.LWS_NAME_LABEL}={self.name}`"
                    " says more"))
            time.sleep(s.poll_s)

    def warnings(self, pod_name: str, keep: int = 3) -> list[str]:
        """The pod's last Warning events, "Reason: message" (none if events may not be read)."""
        api_exception, http_error = _api_errors()
        try:
            events = self.api.core.list_namespaced_event(
                self.api.namespace, field_selector=f"involvedObject.name={pod_name}", _request_timeout=10).items
        except (api_exception, http_error, OSError):
            return []
        warned = [e for e in events if e.type == "Warning"]
        warned.sort(key=lambda e: _epoch(e.last_timestamp or e.event_time or e.metadata.creation_timestamp))
        return [f"{e.reason}: {e.message}" for e in warned[-keep:]]

    def _pending_reason(self, pods: list[Any]) -> str | None:
        for pod in sorted(pods, key=self.rank_of):
            for cond in (pod.status.conditions or []) if pod.status else []:
                if cond.type == "PodScheduled" and cond.status == "False":
                    return f"rank {self.rank_of(pod)}: {cond.reason}: {cond.message}"
            for status in (pod.status.container_statuses or []) if pod.status else []:
                if status.state and status.state.waiting and status.state.waiting.reason:
                    return f"rank {self.rank_of(pod)}: {status.state.waiting.reason}"
        return None

    def check(self, pods: list[Any] | None = None) -> None:
        """Raise for the group: a terminated or restarted container (the culprit rank, its exit code and log),
        a pod stuck on a reason that never resolves (ImagePullBackOff...), or pods gone from outside."""
        pods = self.pods() if pods is None else pods
        exits = self._exits(pods)
        if exits:
            time.sleep(SETTLE_S)  # the ranks that die of losing this one are a moment behind
            exits = self._exits(self.pods(max_age_s=0)) or exits
            self._drain_logs()
            exits = [dataclasses.replace(e, log_lines=self.log_tail(e.node_rank)) for e in exits]
            raise group_failed(self.plan.cell_id, exits, [f"LeaderWorkerSet {self.name} in {self.api.namespace}",
                                                          f"full logs: {self.logs_dir}"])
        for pod in pods:
            for status in (pod.status.container_statuses or []) if pod.status else []:
                waiting = status.state.waiting if status.state else None
                if waiting and waiting.reason in STUCK_REASONS:
                    rank = self.rank_of(pod)
                    events = self.warnings(pod.metadata.name)
                    if not events:  # the kubelet's event may be listed a moment after the status it explains
                        time.sleep(SETTLE_S)
                        events = self.warnings(pod.metadata.name)
                    raise PodStuck(cell_id=self.plan.cell_id, reason="exited", node_rank=rank,
                                   last_lines=self.log_tail(rank, LOG_LINES_KEPT),
                                   hint=f"{waiting.reason}" + (f" ({waiting.message})" if waiting.message else "")
                                   + f" (pod {pod.metadata.name}, image {status.image})"
                                   + (f"; events: {'; '.join(events)}" if events else ""))
        if self.leader_pod and len(pods) < len(self.plan.ranks):
            raise InfraError(f"{self.plan.cell_id}: pods of LeaderWorkerSet {self.name} disappeared ("
                             f"{len(pods)} of {len(self.plan.ranks)} left): deleted from outside?")

    def _exits(self, pods: list[Any]) -> list[RankExit]:
        found = []
        for pod in pods:
            for status in (pod.status.container_statuses or []) if pod.status else []:
                ended = status.state.terminated if status.state else None
                if ended is None and status.restart_count:
                    ended = status.last_state.terminated if status.last_state else None
                if ended is not None:
                    rank = self.rank_of(pod)
                    found.append(RankExit(rank, ended.exit_code, _epoch(ended.finished_at), self.log_tail(rank)))
        return found

    # logs -----------------------------------------------------------------------------------------------
    def _stream_log(self, pod: Any) -> None:
        name = pod.metadata.name
        started = any(s.state and (s.state.running or s.state.terminated)
                      for s in ((pod.status.container_statuses or []) if pod.status else []))
        if name in self._streams or not started:
            return
        rank = self.rank_of(pod)
        path = rank_log_path(self.logs_dir, rank)

        def follow() -> None:
            api_exception, http_error = _api_errors()
            with open(path, "a", encoding="utf-8") as log:
                log.write(f"# node rank {rank}: pod {name} of LeaderWorkerSet {self.name}\n")
                log.flush()
                try:
                    response = self.api.core.read_namespaced_pod_log(
                        name, self.api.namespace, container=k8s_spec.CONTAINER, follow=True,
                        _preload_content=False)
                    for chunk in response.stream(4096):
                        log.write(redact(chunk.decode("utf-8", "replace"), self.secrets))
                        log.flush()
                        if self._stop.is_set():
                            break
                except (api_exception, http_error, OSError) as err:
                    log.write(f"# dspark-ci: log stream of pod {name} ended: {_status_message(err)}\n")

        thread = threading.Thread(target=follow, name=f"log-{name}", daemon=True)
        self._streams[name] = thread
        thread.start()

    def _drain_logs(self, timeout_s: float = 3.0) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in list(self._streams.values()):
            thread.join(max(0.0, deadline - time.monotonic()))

    def log_tail(self, rank: int, lines: int = LOG_LINES_SEARCHED) -> list[str]:
        return [line for line in tail(rank_log_path(self.logs_dir, rank), lines) if not line.startswith("# ")]

    def rank0_tail(self) -> list[str]:
        return self.log_tail(0, LOG_LINES_KEPT)

    def leader_url(self) -> str:
        pod = next(p for p in self.pods(max_age_s=0) if p.metadata.name == self.leader_pod)
        return f"http://{pod.status.pod_ip}:{k8s_spec._port_of(self.plan.ranks[0].argv)}"

    # teardown -------------------------------------------------------------------------------------------
    def teardown(self) -> None:
        """Delete (foreground propagation), then wait until no pod of the group is left; never raises."""
        self._stop.set()
        left = delete_all(self.api, [(k, n) for k, n in reversed(self.created)], self.name,
                          self.settings.delete_wait_s)
        if left:
            print(f"dspark-ci: {left} of LeaderWorkerSet {self.name} still there {self.settings.delete_wait_s:g}s "
                  f"after deletion; `dspark-ci cleanup --run {self.settings.run_id}` tries again", file=sys.stderr)
        self._drain_logs(2.0)


def _containers_env(lws: dict) -> list[dict]:
    template = lws["spec"]["leaderWorkerTemplate"]
    return [e for role in ("leaderTemplate", "workerTemplate") if role in template
            for c in template[role]["spec"]["containers"] for e in c.get("env", [])]


def delete_all(api: Api, objects: Sequence[tuple[str, str]], lws_name: str | None, wait_s: float) -> str | None:
    """Delete the objects (foreground propagation) and wait until they and the group's pods are gone.
    Returns what is still there after ``wait_s``, or None."""
    from kubernetes import client

    api_exception, http_error = _api_errors()
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
            elif kind == "Service":  # no dependents: a plain delete (foreground would wait for a GC to no end)
                api.core.delete_namespaced_service(name, ns, _request_timeout=10, _preload_content=False)
            elif kind == "Secret":
                api.core.delete_namespaced_secret(name, ns, _request_timeout=10, _preload_content=False)
    deadline = time.monotonic() + wait_s
    while True:
        left = []
        with contextlib.suppress(api_exception, http_error, OSError):
            if lws_name:
                pods = api.core.list_namespaced_pod(ns, label_selector=f"{k8s_spec.LWS_NAME_LABEL}={lws_name}",
                                                    _request_timeout=10).items
                left += [f"pod {p.metadata.name}" for p in pods]
            for kind, name in objects:
                if _exists(api, kind, name):
                    left.append(f"{kind} {name}")
        if not left:
            return None
        if time.monotonic() >= deadline:
            return ", ".join(left)
        time.sleep(0.5)


def _exists(api: Api, kind: str, name: str) -> bool:
    api_exception = _api_errors()[0]
    try:
        if kind == k8s_spec.LWS_KIND:
            api.custom.get_namespaced_custom_object(k8s_spec.LWS_GROUP, k8s_spec.LWS_VERSION, api.namespace,
                                                    k8s_spec.LWS_PLURAL, name, _request_timeout=10)
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


def remove_started(entry: dict) -> str | None:
    """Delete one object a dead run recorded (catalog contract), if it is still there; None if already gone."""
    kind, name, ns = entry.get("kind"), entry.get("name"), entry.get("namespace")
    if not (kind and name and ns):
        return None
    api = connect(entry.get("kubeconfig"), ns)
    api_exception, http_error = _api_errors()
    try:
        if not _exists(api, kind, name):
            return None
    except (api_exception, http_error, OSError) as err:
        raise InfraError(f"cannot reach {api.where} to remove {kind} {name}: {_status_message(err)}") from None
    left = delete_all(api, [(kind, name)], name if kind == k8s_spec.LWS_KIND else None, 60.0)
    if left:
        raise InfraError(f"still there after deletion: {left}")
    return f"{kind} {name} in namespace {ns} (cell {entry.get('cell')}) on {api.where}"
