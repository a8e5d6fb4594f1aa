"""Waiting for a LeaderWorkerSet: rank 0's health through the API server's pod proxy, and the failure of a pod
that cannot start (its reason named)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dspark_ci.ground.errors import InfraError
from dspark_ci.launchers.contract import LaunchTimeout
from dspark_ci.launchers.k8s.client import api_errors, status_message
from dspark_ci.launchers.plan_types import LaunchPlan
from dspark_ci.launchers.readiness import NotReady

if TYPE_CHECKING:
    from dspark_ci.launchers.k8s.group import Group


@dataclass(frozen=True)
class ProxyHealth:
    """Rank 0's /health through the API server's pod proxy (no network path to the pod needed)."""

    group: Group
    plan: LaunchPlan

    def describe(self) -> str:
        return f"HTTP 200 from /health of pod {self.group.leader_pod} through the API server's proxy"

    def probe(self, timeout_s: float) -> None:
        api_exception, http_error = api_errors()
        port = self.plan.port
        try:
            self.group.api.core.connect_get_namespaced_pod_proxy_with_path(
                f"{self.group.leader_pod}:{port}", self.group.api.namespace, "health",
                _request_timeout=max(0.1, min(5.0, timeout_s)))
        except api_exception as err:
            message = status_message(err)
            if err.status == 400 and "not allowed" in message:  # IsProxyableIP: loopback/link-local pod IPs
                raise InfraError(f"{self.plan.cell_id}: the API server will not proxy to pod {self.group.leader_pod}"
                                 f" ({message}): its IP is loopback or link-local; use --k8s-reach pod-ip") from None
            raise NotReady(message) from None
        except (http_error, OSError) as err:
            raise NotReady(status_message(err)) from None


class PodStuck(LaunchTimeout):
    """A pod of the group cannot run (not schedulable, image not pullable, config refused): its reason named."""

    def __str__(self) -> str:
        who = f"{self.role} rank" if self.role else "node rank"  # a PD cell's role, or its router
        parts = [f"{self.cell_id}: {who} {self.node_rank} cannot start: {self.hint}"]
        if self.last_lines:
            parts.append("last log lines:\n    " + "\n    ".join(self.last_lines[-10:]))
        return "\n  ".join(parts)
