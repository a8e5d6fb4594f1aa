"""The few GitHub REST calls ChatOps makes when it really dispatches (never in --dry-run)."""

from __future__ import annotations

from dataclasses import dataclass

import requests

from ground.errors import InfraError

DEFAULT_API = "https://api.github.com"
TIMEOUT_SECONDS = 30
REACTIONS = {"accepted": "+1", "refused": "confused", "seen": "eyes"}


@dataclass(frozen=True)
class GitHub:
    token: str
    repo: str  # owner/name
    api_url: str = DEFAULT_API

    def _call(self, method: str, path: str, json_body: dict | None = None, params: dict | None = None):
        url = f"{self.api_url}/repos/{self.repo}{path}"
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/vnd.github+json",
                   "X-GitHub-Api-Version": "2022-11-28"}
        try:
            response = requests.request(method, url, json=json_body, params=params, headers=headers,
                                        timeout=TIMEOUT_SECONDS)
        except requests.RequestException as err:
            raise InfraError(f"GitHub API {method} {path} failed: {err} (check the network)") from None
        if response.status_code >= 400:
            raise InfraError(f"GitHub API {method} {path} answered {response.status_code}: "
                             f"{response.text[:200]} (check that the token may do this)")
        return response.json() if response.content else None

    def post_comment(self, pr: int, body: str) -> int:
        return self._call("POST", f"/issues/{pr}/comments", {"body": body})["id"]

    def comment_body(self, comment_id: int) -> str:
        return self._call("GET", f"/issues/comments/{comment_id}")["body"] or ""

    def edit_comment(self, comment_id: int, body: str) -> None:
        self._call("PATCH", f"/issues/comments/{comment_id}", {"body": body})

    def react(self, comment_id: int, reaction: str) -> None:
        self._call("POST", f"/issues/comments/{comment_id}/reactions", {"content": REACTIONS[reaction]})

    def add_label(self, pr: int, label: str) -> None:
        self._call("POST", f"/issues/{pr}/labels", {"labels": [label]})

    def dispatch_workflow(self, workflow: str, ref: str, inputs: dict) -> None:
        self._call("POST", f"/actions/workflows/{workflow}/dispatches", {"ref": ref, "inputs": inputs})

    def rerun_failed_runs(self, pr: int) -> int:
        """Rerun the failed jobs (and whole skipped runs) of the PR head's workflow runs; how many."""
        head_sha = self._call("GET", f"/pulls/{pr}")["head"]["sha"]
        runs = self._call("GET", "/actions/runs", params={"head_sha": head_sha, "per_page": 100})
        rerun = 0
        for run in runs.get("workflow_runs", []):
            # A skipped run has no failed jobs to rerun: it needs a full rerun.
            endpoint = {"failure": "rerun-failed-jobs", "skipped": "rerun"}.get(run.get("conclusion"))
            if run.get("status") == "completed" and endpoint:
                self._call("POST", f"/actions/runs/{run['id']}/{endpoint}")
                rerun += 1
        return rerun
