"""sglang-router of a disaggregated cell on Kubernetes: the Deployment and Service `dspark-ci plan --format k8s`
prints (``dspark_ci.launchers.pd.k8s.router_manifests``), pointed at the role instances' leader Services, created
through the API server (each recorded in the run's ledger first), its pod's log streamed into
``logs/<cell>/router.log``, watched like a rank (a terminated or restarted container, a pod that cannot start: the
router is named), deleted with foreground propagation when the group goes (``dspark-ci cleanup`` removes what a killed
run left)."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_ci.ground import interrupts
from dspark_ci.ground.errors import BadInput, InfraError
from dspark_ci.ground.processes import signals_deferred, sigterm_as_interrupt
from dspark_ci.launchers.contract import LOG_LINES_KEPT, Deployment, LaunchFailed
from dspark_ci.launchers.k8s.cleanup import apps, delete_all
from dspark_ci.launchers.k8s.client import api_errors, status_message
from dspark_ci.launchers.k8s.group import STUCK_REASONS, follow_log
from dspark_ci.launchers.k8s.wait import PodStuck
from dspark_ci.launchers.logs import tail
from dspark_ci.launchers.pd.k8s import ROUTER_CONTAINER, ROUTER_PORT, router_manifests, router_name
from dspark_ci.launchers.pd.pd_plan import RoleInstance
from dspark_ci.launchers.pd.router_process import Router
from dspark_ci.matrices.cell import Cell

if TYPE_CHECKING:
    from dspark_ci.launchers.k8s.lifecycle import K8sLauncher


class K8sRouter(Router):
    def __init__(self, launcher: K8sLauncher, cell: Cell, members: Sequence[tuple[RoleInstance, Any]],
                 logs_dir: Path):
        self.launcher, self.api, self.cell_id = launcher, launcher.api, cell.id
        self.name = router_name(cell.id, uuid.uuid4().hex[:6])
        # each role instance where other pods reach it: its leader Service (K8sDeployment.service_url)
        urls = {instance.label: deployment.service_url for instance, deployment in members}
        self.command, self.objects = router_manifests(
            cell, [instance for instance, _ in members], urls, name=self.name, image=members[0][1].image,
            namespace=self.api.namespace, run_id=launcher.context.run_id)
        self.selector = f"app={self.name}"
        self.log_path = logs_dir / "router.log"
        self.base_url = ""  # the pod's IP, once it runs
        self.created: list[tuple[str, str]] = []
        self.pod = ""
        self._stop = threading.Event()
        self._stream: threading.Thread | None = None

    def create(self) -> None:
        ns, api_exception = self.api.namespace, api_errors()[0]
        calls = {"Deployment": lambda body: apps(self.api).create_namespaced_deployment(ns, body),
                 "Service": lambda body: self.api.core.create_namespaced_service(ns, body)}
        for body in self.objects:
            kind, name = body["kind"], body["metadata"]["name"]
            self.launcher.ledger.record("k8s", self.cell_id, None, kind=kind, name=name, namespace=ns,
                                        kubeconfig=self.launcher.options.kubeconfig, server=self.api.where,
                                        what="router")
            try:
                calls[kind](body)
            except api_exception as err:
                if err.status in (400, 422):
                    raise BadInput(f"cell {self.cell_id}", f"the API server refused the router's {kind}: "
                                   f"{status_message(err)}", "`dspark-ci plan --format k8s` prints what is sent"
                                   ) from None
                raise InfraError(f"{self.cell_id}: creating the router's {kind} {name} in {ns} on {self.api.where}"
                                 f" failed: {status_message(err)}") from None
            self.created.append((kind, name))

    def pods(self) -> list[Any]:
        api_exception, http_error = api_errors()
        try:
            return self.api.core.list_namespaced_pod(self.api.namespace, label_selector=self.selector,
                                                     _request_timeout=10).items
        except (api_exception, http_error, OSError) as err:
            raise InfraError(f"{self.cell_id}: cannot list the router's pods ({self.selector}) on {self.api.where}:"
                             f" {status_message(err)}") from None

    def wait_running(self, timeout_s: float, poll_s: float) -> None:
        """Until the router's pod runs with an IP (its own pending limit), failing at once if it cannot start."""
        started = time.monotonic()
        while True:
            pods = self.pods()
            self._check(pods)
            running = [p for p in pods if p.status and p.status.phase == "Running" and p.status.pod_ip]
            if running:
                self.pod = running[0].metadata.name
                self.base_url = f"http://{running[0].status.pod_ip}:{ROUTER_PORT}"
                self._stream = follow_log(self.api, self.pod, self.log_path,
                                          f"router: pod {self.pod} of Deployment {self.name}", [], self._stop,
                                          container=ROUTER_CONTAINER)
                return
            if time.monotonic() - started >= timeout_s:
                raise PodStuck(cell_id=self.cell_id, reason="timeout", node_rank=0, role="router", hint=(
                    f"the router's pod was not running after {timeout_s:.0f}s ({len(pods)} pod(s) of Deployment "
                    f"{self.name}); `kubectl -n {self.api.namespace} describe pods -l {self.selector}` says more"))
            interrupts.check()
            time.sleep(poll_s)

    def check(self, cell_id: str) -> None:
        self._check(self.pods(), cell_id)

    def _check(self, pods: list[Any], cell_id: str | None = None) -> None:
        """A terminated or restarted router container (a Deployment's pod restarts it), a pod that cannot start, or
        the pod gone from outside: the cell fails naming the router."""
        cell_id = cell_id or self.cell_id
        for pod in pods:
            for status in (pod.status.container_statuses or []) if pod.status else []:
                ended = status.state.terminated if status.state else None
                if ended is None and status.restart_count:
                    ended = status.last_state.terminated if status.last_state else None
                waiting = status.state.waiting if status.state else None
                if ended is not None:
                    if self._stream:
                        self._stream.join(3.0)
                    raise LaunchFailed(cell_id=cell_id, reason="exited", node_rank=0, role="router",
                                       rank_exit_code=ended.exit_code, last_lines=self.log_tail(),
                                       hint=f"pod {pod.metadata.name} of Deployment {self.name}; full log: "
                                            f"{self.log_path}")
                if waiting and waiting.reason in STUCK_REASONS:
                    raise PodStuck(cell_id=cell_id, reason="exited", node_rank=0, role="router",
                                   hint=f"{waiting.reason} (pod {pod.metadata.name}, image {status.image})")
        if self.pod and not any(p.metadata.name == self.pod for p in pods):
            raise InfraError(f"{cell_id}: the router's pod {self.pod} (Deployment {self.name}) disappeared: "
                             "deleted from outside?")

    def log_tail(self) -> list[str]:
        return [line for line in tail(self.log_path, LOG_LINES_KEPT) if not line.startswith("# ")]

    def teardown(self) -> None:
        """Delete (foreground propagation) and wait until the router's pod is gone; never raises."""
        self._stop.set()
        wait_s = self.launcher.tuning.delete_wait_s
        left = delete_all(self.api, list(reversed(self.created)), self.selector, wait_s)
        if left:
            print(f"dspark-ci: {left} of the router still there {wait_s:g}s after deletion; "
                  f"`dspark-ci cleanup --run {self.launcher.context.run_id}` tries again", file=sys.stderr)
        if self._stream:
            self._stream.join(2.0)


@contextlib.contextmanager
def k8s_router(launcher: K8sLauncher, cell: Cell, members: Sequence[tuple[RoleInstance, Deployment]],
               logs_dir: Path) -> Iterator[K8sRouter]:
    """The router's Deployment and Service created, its pod running; deleted when the block ends."""
    logs_dir.mkdir(parents=True, exist_ok=True)
    router = K8sRouter(launcher, cell, members, logs_dir)
    with sigterm_as_interrupt():
        try:
            router.create()
            router.wait_running(launcher.pending_timeout_s, launcher.tuning.poll_s)
            yield router
        finally:
            with signals_deferred():
                router.teardown()
