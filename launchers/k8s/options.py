"""The Kubernetes launcher's options (``--kubeconfig``, ``--namespace``, ``--k8s-*``), declared once
(``dspark_ci.launchers.optionset``)."""

from __future__ import annotations

from dataclasses import dataclass

from dspark_ci.launchers.optionset import option

REACH_MODES = ("pod-ip", "proxy")


@dataclass(frozen=True)
class K8sOptions:
    kubeconfig: str | None = option(None, "--kubeconfig", "kubeconfig file (default $KUBECONFIG, ~/.kube/config, "
                                    "else in-cluster)", metavar="FILE")
    namespace: str | None = option(None, "--namespace", "namespace of the LeaderWorkerSets (default "
                                   "$DSPARK_K8S_NAMESPACE, else the kubeconfig context's)", env="DSPARK_K8S_NAMESPACE",
                                   metavar="NS")
    extra: str | None = option(None, "--k8s-extra", "YAML patch merged into every generated object: node selectors, "
                               "tolerations, host network, pull secrets, volumes (docs/K8S.md)", metavar="FILE")
    reach: str = option("pod-ip", "--k8s-reach", "how rank 0 is reached: pod-ip (the runner is in the cluster "
                        "network) or proxy (its /health through the API server)", choices=REACH_MODES)
