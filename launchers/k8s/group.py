"""One cell's LeaderWorkerSet: its objects created (each recorded in the ledger first), its pods watched and
their logs streamed, the culprit rank named when one fails, everything deleted at the end."""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_ci.ground import interrupts
from dspark_ci.ground.errors import BadInput, InfraError
from dspark_ci.launchers.contract import LOG_LINES_KEPT, LOG_LINES_SEARCHED, RankExit, group_failed
from dspark_ci.launchers.k8s import spec as k8s_spec
from dspark_ci.launchers.k8s.cleanup import delete_all
from dspark_ci.launchers.k8s.client import api_errors, status_message
from dspark_ci.launchers.k8s.wait import PodStuck
from dspark_ci.launchers.logs import rank_log_path, tail
from dspark_ci.launchers.materialize import redact, secret_values
from dspark_ci.launchers.plan_types import LaunchPlan

if TYPE_CHECKING:
    from dspark_ci.launchers.k8s.lifecycle import K8sLauncher

# Waiting reasons that never resolve on their own (kubelet's names).
STUCK_REASONS = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull",
                           "CreateContainerConfigError", "CreateContainerError", "CrashLoopBackOff",
                           "RunContainerError"})
POD_CACHE_S = 0.5
SETTLE_S = 0.5


class K8sDeployment:
    def __init__(self, cell_id: str, group: Group):
        self.cell_id, self._group = cell_id, group
        self.base_url = group.leader_url()
        # rank 0 as other pods reach it (PD's router): the leader Service, which lists a prefill's bootstrap port
        self.service_url = f"http://{group.name}-leader:{group.plan.port}"
        self.image = group.image
        self.boot_seconds = 0.0
        self.pending_seconds = 0.0  # scheduling and pulling, before the boot clock started

    def check(self) -> None:
        self._group.check()



def _epoch(value: Any) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    return time.time()



class Group:
    """One cell's LeaderWorkerSet: created, watched, deleted."""

    def __init__(self, plan: LaunchPlan, logs_dir: Path, launcher: K8sLauncher):
        self.plan, self.logs_dir, self.launcher = plan, logs_dir, launcher
        self.context, self.tuning, self.api = launcher.context, launcher.tuning, launcher.api
        self.token = uuid.uuid4().hex[:6]
        self.name = k8s_spec.object_name(plan.cell_id, self.token)
        self.secrets = secret_values(plan.ranks[0].env, self.context.caller_env)
        self.created: list[tuple[str, str]] = []  # (kind, name) created, for teardown
        self.started = time.monotonic()
        self.running_since = self.started
        self.pending_seconds = 0.0
        self.leader_pod = ""
        self.image = ""  # what the pods run, once created
        self._pods: list[Any] = []
        self._pods_at = float("-inf")
        self._streams: dict[str, threading.Thread] = {}
        self._stop = threading.Event()

    # creation -------------------------------------------------------------------------------------------
    def objects(self) -> tuple[dict | None, dict, dict]:
        context, tuning = self.context, self.tuning
        image = tuning.sim_image if context.server == "sim" else None  # None: the cell's
        forwarded = {k: v for k, v in context.caller_env.items() if k.startswith(tuning.forward_env_prefixes)}
        lws, service = k8s_spec.manifests(self.plan, name=self.name, namespace=self.api.namespace, image=image,
                                          server=context.server, run_id=context.run_id, secret_name=self.name,
                                          extra_env=forwarded, patches=self.launcher.patches)
        names = sorted({e["valueFrom"]["secretKeyRef"]["key"] for e in _containers_env(lws)
                        if "secretKeyRef" in e.get("valueFrom", {})})
        secret = None
        if names:
            secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                      "metadata": {**lws["metadata"], "name": self.name},
                      "stringData": {n: context.caller_env.get(n, "") for n in names}}
        return secret, lws, service

    def create(self) -> None:
        secret, lws, service = self.objects()
        self.image = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["image"]
        ns, api_exception = self.api.namespace, api_errors()[0]
        for kind, body, call in (
                ("Secret", secret, lambda b: self.api.core.create_namespaced_secret(ns, b)),
                (k8s_spec.LWS_KIND, lws, lambda b: self.api.custom.create_namespaced_custom_object(
                    k8s_spec.LWS_GROUP, k8s_spec.LWS_VERSION, ns, k8s_spec.LWS_PLURAL, b)),
                ("Service", service, lambda b: self.api.core.create_namespaced_service(ns, b))):
            if body is None:
                continue
            name = body["metadata"]["name"]
            self.launcher.ledger.record("k8s", self.plan.cell_id, None, kind=kind, name=name, namespace=ns,
                                        kubeconfig=self.launcher.options.kubeconfig, server=self.api.where)
            try:
                call(body)
            except api_exception as err:
                message = redact(status_message(err), self.secrets)
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
            api_exception, http_error = api_errors()
            try:
                found = self.api.core.list_namespaced_pod(
                    self.api.namespace, label_selector=f"{k8s_spec.LWS_NAME_LABEL}={self.name}",
                    _request_timeout=10).items
            except (api_exception, http_error, OSError) as err:
                raise InfraError(f"{self.plan.cell_id}: cannot list the pods of {self.name} on {self.api.where}: "
                                 f"{status_message(err)}") from None
            self._pods, self._pods_at = found, time.monotonic()
            for pod in found:
                self._stream_log(pod)
        return self._pods

    @staticmethod
    def rank_of(pod: Any) -> int:
        return int((pod.metadata.labels or {}).get(k8s_spec.LWS_INDEX_LABEL, "0"))

    def wait_running(self) -> None:
        """Until every pod of the group runs (the pending limit), failing at once on a stuck pod."""
        tuning, shown = self.tuning, None
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
            if tuning.progress and why != shown:
                tuning.progress(f"{self.plan.cell_id}: LeaderWorkerSet {self.name} pending ({why})")
                shown = why
            if waited >= self.launcher.pending_timeout_s:
                events = [e for p in pods for e in self.warnings(p.metadata.name)]
                raise PodStuck(cell_id=self.plan.cell_id, reason="timeout", node_rank=0, hint=(
                    f"the group's pods were not all running after {waited:.0f}s ({why}); the boot timeout had not "
                    "started" + (f"; events: {'; '.join(events)}" if events else "")
                    + f". `kubectl -n {self.api.namespace} describe pods -l {k8s_spec.LWS_NAME_LABEL}={self.name}`"
                    " says more"))
            interrupts.check()  # a Ctrl-C or SIGTERM is a flag: acted on here
            time.sleep(tuning.poll_s)

    def warnings(self, pod_name: str, keep: int = 3) -> list[str]:
        """The pod's last Warning events, "Reason: message" (none if events may not be read)."""
        api_exception, http_error = api_errors()
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
        self._streams[name] = follow_log(self.api, name, rank_log_path(self.logs_dir, rank),
                                         f"node rank {rank}: pod {name} of LeaderWorkerSet {self.name}",
                                         self.secrets, self._stop)

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
        return f"http://{pod.status.pod_ip}:{self.plan.port}"

    # teardown -------------------------------------------------------------------------------------------
    def teardown(self) -> None:
        """Delete (foreground propagation), then wait until no pod of the group is left; never raises."""
        self._stop.set()
        wait_s = self.tuning.delete_wait_s
        left = delete_all(self.api, [(k, n) for k, n in reversed(self.created)],
                          f"{k8s_spec.LWS_NAME_LABEL}={self.name}", wait_s)
        if left:
            print(f"dspark-ci: {left} of LeaderWorkerSet {self.name} still there {wait_s:g}s after deletion; "
                  f"`dspark-ci cleanup --run {self.context.run_id}` tries again", file=sys.stderr)
        self._drain_logs(2.0)


def follow_log(api: Any, pod: str, path: Path, header: str, secrets: list[str], stop: threading.Event,
               container: str = k8s_spec.CONTAINER) -> threading.Thread:
    """Stream a pod's log through the API server (pods/log) into ``path``, secrets redacted, until it ends or
    ``stop`` is set."""
    def follow() -> None:
        api_exception, http_error = api_errors()
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"# {header}\n")
            log.flush()
            try:
                response = api.core.read_namespaced_pod_log(pod, api.namespace, container=container, follow=True,
                                                            _preload_content=False)
                for chunk in response.stream(4096):
                    log.write(redact(chunk.decode("utf-8", "replace"), secrets))
                    log.flush()
                    if stop.is_set():
                        break
            except (api_exception, http_error, OSError) as err:
                log.write(f"# dspark-ci: log stream of pod {pod} ended: {status_message(err)}\n")

    thread = threading.Thread(target=follow, name=f"log-{pod}", daemon=True)
    thread.start()
    return thread


def _containers_env(lws: dict) -> list[dict]:
    template = lws["spec"]["leaderWorkerTemplate"]
    return [e for role in ("leaderTemplate", "workerTemplate") if role in template
            for c in template[role]["spec"]["containers"] for e in c.get("env", [])]
