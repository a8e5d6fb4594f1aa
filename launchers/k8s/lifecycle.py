"""The Kubernetes launcher: every cell as one LeaderWorkerSet, driven through the API with the official client.

Used like every launcher (``dspark_ci.launchers.contract``)::

    launcher = K8sLauncher(K8sOptions(namespace="sglang-ci", extra="site.yaml"), LaunchContext(run_id, run_dir))
    launcher.preflight(plans)       # the API answers, the LWS CRD is installed, the namespace exists, we may create
    with launcher.launch(plan, logs_dir) as deployment:
        ...                         # deployment.base_url is rank 0's pod; check() raises if a pod of the group failed

Per launch: a Secret with the cell's ``${NAME}`` values (if any), the LeaderWorkerSet and the leader's Service
(``dspark_ci.launchers.k8s.spec``), each written to the run's ledger before it is created. Then the pods of the group
are watched by label: every pod's log is streamed into ``logs/<cell>/<rank>.log`` (rank = LWS's worker index); a pod
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
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from dspark_ci.ground.errors import InfraError
from dspark_ci.ground.ledger import Ledger
from dspark_ci.ground.processes import signals_deferred, sigterm_as_interrupt
from dspark_ci.launchers.contract import Capacity, LaunchContext
from dspark_ci.launchers.k8s import spec as k8s_spec
from dspark_ci.launchers.k8s.cleanup import remove_started
from dspark_ci.launchers.k8s.client import POD_QUOTA_KEYS, Api, api_errors, connect, quantity, status_message
from dspark_ci.launchers.k8s.group import Group, K8sDeployment
from dspark_ci.launchers.k8s.options import K8sOptions
from dspark_ci.launchers.k8s.tuning import K8sTuning
from dspark_ci.launchers.k8s.wait import ProxyHealth
from dspark_ci.launchers.plan_types import LaunchPlan, Placement
from dspark_ci.launchers.readiness import Deadline, OurServer, wait_until_ready

__all__ = ["K8sLauncher", "build", "remove_started"]  # remove_started: the catalog's contract


def build(context: LaunchContext, options: K8sOptions) -> K8sLauncher:
    """The catalog's constructor (dspark_ci.launchers.catalog): --kubeconfig, --namespace, --k8s-extra, --k8s-reach,
    checked, in ``options``."""
    return K8sLauncher(options, context)


# --- the launcher --------------------------------------------------------------------------------------

class K8sLauncher:
    name = "k8s"

    def __init__(self, options: K8sOptions, context: LaunchContext, tuning: K8sTuning = K8sTuning()):
        """The user's options as declared (one record), the run's context, and what no user sets."""
        self.options, self.context, self.tuning = options, context, tuning
        self.ledger = Ledger(context.run_id, context.run_dir)  # every object is recorded here before it is created
        self.patches = tuple(k8s_spec.load_patches(options.extra))  # --k8s-extra, read and checked once
        self._api: Api | None = None

    @property
    def api(self) -> Api:
        """The API server the kubeconfig names (None: $KUBECONFIG, ~/.kube/config, else in-cluster), in --namespace
        (else the kubeconfig context's, else "default"); connected on first use."""
        if self._api is None:
            self._api = connect(self.options.kubeconfig, self.options.namespace)
        return self._api

    @property
    def pending_timeout_s(self) -> float:
        """Pods not all running by then: the cell fails naming why (the boot timeout has not started)."""
        return self.tuning.pending_timeout_for(self.context.server)

    def placement(self, nnodes: int, gpus_per_node: int | None = None) -> Placement:
        """Every pod binds its own IP; rank 0 is LWS's leader address; the same ports in every pod."""
        return k8s_spec.placement_for(nnodes)

    def capacity(self) -> Capacity:
        """As many cells side by side as the namespace's pod quota has room for (one pod per node of a cell);
        without a pod quota nothing says how much the cluster may take: one at a time, unless --max-parallel."""
        api, (api_exception, http_error) = self.api, api_errors()
        try:
            quotas = api.core.list_namespaced_resource_quota(api.namespace, _request_timeout=10).items
        except (api_exception, http_error, OSError) as err:
            raise InfraError(f"cannot read the resource quotas of namespace {api.namespace!r} on {api.where}: "
                             f"{status_message(err)} (or pass --max-parallel)") from None
        room = [quantity(q.status.hard[key]) - quantity((q.status.used or {}).get(key, "0"))
                for q in quotas if q.status and q.status.hard for key in POD_QUOTA_KEYS if key in q.status.hard]
        if not room:
            return Capacity(1, None, f"namespace {api.namespace} states no pod quota: one cell at a time unless "
                                     "--max-parallel says how many")
        pods = max(0, min(room))
        return Capacity(max(1, pods), pods or None, f"room for {pods} pod(s) in namespace {api.namespace}'s quota")

    def preflight(self, plans: Sequence[LaunchPlan]) -> None:
        """The API answers, the LWS CRD is installed, the namespace exists, this identity may create LWS."""
        from kubernetes import client

        api, (api_exception, http_error) = self.api, api_errors()
        try:
            api.core.get_api_resources(_request_timeout=10)
        except (api_exception, http_error, OSError) as err:
            raise InfraError(f"the Kubernetes API at {api.where} does not answer ({status_message(err)}): "
                             "check --kubeconfig and that the cluster is up") from None
        try:
            client.ApiextensionsV1Api(api.core.api_client).read_custom_resource_definition(
                f"{k8s_spec.LWS_PLURAL}.{k8s_spec.LWS_GROUP}", _request_timeout=10)
        except api_exception as err:
            if err.status == 404:
                raise InfraError(f"the LeaderWorkerSet CRD is not installed on {api.where}: install LWS "
                                 "(https://lws.sigs.k8s.io, v0.6 or later)") from None
            if err.status != 403:  # may not read CRDs: the create check below still tells
                raise InfraError(f"cannot look up the LWS CRD on {api.where}: {status_message(err)}") from None
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
            raise InfraError(f"cannot ask {api.where} what this identity may do: {status_message(err)}") from None
        if not answer.status.allowed:
            raise InfraError(f"this identity may not create LeaderWorkerSets in namespace {api.namespace!r} on "
                             f"{api.where} ({answer.status.reason or 'RBAC'}): grant create/get/list/watch/delete "
                             "on leaderworkersets, pods, pods/log, services, secrets, events (docs/K8S.md)")

    @contextlib.contextmanager
    def launch(self, plan: LaunchPlan, logs_dir: Path) -> Iterator[K8sDeployment]:
        logs_dir.mkdir(parents=True, exist_ok=True)
        group = Group(plan, logs_dir, self)
        with sigterm_as_interrupt():
            try:
                group.create()
                group.wait_running()
                deployment = K8sDeployment(plan.cell_id, group)
                leader = dataclasses.replace(plan, base_url=deployment.base_url,
                                             health_url=f"{deployment.base_url}/health")
                strategy = OurServer(leader) if self.options.reach == "pod-ip" else ProxyHealth(group, leader)
                wait_until_ready(strategy, Deadline(self.context.boot_timeout_s, self.tuning.poll_s),
                                 deployment.check, cell_id=plan.cell_id, last_lines=group.rank0_tail)
                deployment.boot_seconds = time.monotonic() - group.running_since
                deployment.pending_seconds = group.pending_seconds
                yield deployment
            finally:
                with signals_deferred():
                    group.teardown()
