"""The Kubernetes launcher: every cell as one LeaderWorkerSet through the API (``lifecycle``), its manifests
(``spec``). docs/K8S.md."""
