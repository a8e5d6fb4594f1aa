"""The GitHub REST calls ChatOps and the rerun workflow make, through one client (never in --dry-run).

Every call goes through ``GitHub._call``: one ``requests.Session``, retried by tenacity when the
failure is transient (a connection error or timeout, a 5xx, a 429, or a 403 that is a rate limit),
waiting what GitHub asks (``Retry-After``, else ``x-ratelimit-reset`` when the remaining quota is 0),
otherwise exponential backoff; bounded in attempts and in the longest wait. A rate limit that asks
for more than ``max_wait_seconds`` is not waited for: the call fails at once, saying until when.

A POST that failed with a 5xx may have been carried out anyway (GitHub sometimes answers 502 after
acting): retrying a dispatch can, rarely, start the same rerun twice, which is cheaper than a rerun
that silently never starts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from urllib.parse import quote

import requests
import tenacity

from ground.errors import InfraError

DEFAULT_API = "https://api.github.com"
TIMEOUT_SECONDS = 30
REACTIONS = {"accepted": "+1", "refused": "confused", "seen": "eyes"}
ACCEPTED_MARKER = "<!--chatops:accepted:{login}-->"  # in the bot's accepted replies: cooldowns count from them


class GitHubError(InfraError):
    """A GitHub call that failed for good. ``status``: the HTTP status (None: no answer)."""

    def __init__(self, message: str, status: int | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


@dataclass(frozen=True)
class GitHub:
    token: str
    repo: str  # owner/name
    api_url: str = DEFAULT_API
    attempts: int = 5
    backoff_seconds: float = 1.0  # first retry after this, doubling
    max_wait_seconds: float = 60.0  # the longest single wait (rate limits asking more fail at once)
    session: requests.Session = field(default_factory=requests.Session, compare=False, repr=False)

    def _call(self, method: str, path: str, json_body: dict | None = None, params: dict | None = None):
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.attempts),
            retry=tenacity.retry_if_exception(self._worth_retrying),
            wait=self._wait, reraise=True, sleep=time.sleep)
        return retrying(self._once, method, path, json_body, params)

    def _once(self, method: str, path: str, json_body: dict | None, params: dict | None):
        url = f"{self.api_url}/repos/{self.repo}{path}"
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/vnd.github+json",
                   "X-GitHub-Api-Version": "2022-11-28"}
        try:
            response = self.session.request(method, url, json=json_body, params=params, headers=headers,
                                            timeout=TIMEOUT_SECONDS)
        except requests.RequestException as err:
            raise GitHubError(f"GitHub API {method} {path} failed: {err} (check the network)") from None
        if response.status_code >= 400:
            retry_after = _rate_limit_wait(response)
            fix = ("rate limited: GitHub asks to wait {:.0f} s".format(retry_after) if retry_after is not None
                   else "check that the token may do this")
            raise GitHubError(f"GitHub API {method} {path} answered {response.status_code}: "
                              f"{response.text[:200]} ({fix})", response.status_code, retry_after)
        try:
            return response.json() if response.content else None
        except ValueError:
            raise GitHubError(f"GitHub API {method} {path} answered {response.status_code} with no JSON: "
                              f"{response.text[:200]!r} (check GITHUB_API_URL)") from None

    def _get(self, answer, *keys: str):
        """``answer[k1][k2]...``; a missing key is GitHub answering something else: an InfraError, not a crash."""
        for key in keys:
            if not isinstance(answer, dict) or key not in answer:
                raise GitHubError(f"GitHub API answer has no {'.'.join(keys)} (check GITHUB_API_URL)")
            answer = answer[key]
        return answer

    def _worth_retrying(self, err: BaseException) -> bool:
        if not isinstance(err, GitHubError):
            return False
        if err.retry_after is not None:
            return err.retry_after <= self.max_wait_seconds
        return err.status is None or err.status >= 500 or err.status == 429

    def _wait(self, state: tenacity.RetryCallState) -> float:
        err = state.outcome.exception() if state.outcome else None
        if isinstance(err, GitHubError) and err.retry_after is not None:
            return err.retry_after
        return min(self.max_wait_seconds, self.backoff_seconds * 2 ** (state.attempt_number - 1))

    # --- the calls ------------------------------------------------------------------------------

    def post_comment(self, pr: int, body: str) -> int:
        return self._get(self._call("POST", f"/issues/{pr}/comments", {"body": body}), "id")

    def comment_body(self, comment_id: int) -> str:
        return self._get(self._call("GET", f"/issues/comments/{comment_id}"), "body") or ""

    def edit_comment(self, comment_id: int, body: str) -> None:
        self._call("PATCH", f"/issues/comments/{comment_id}", {"body": body})

    def react(self, comment_id: int, reaction: str) -> None:
        self._call("POST", f"/issues/comments/{comment_id}/reactions", {"content": REACTIONS[reaction]})

    def add_label(self, pr: int, label: str) -> None:
        self._call("POST", f"/issues/{pr}/labels", {"labels": [label]})

    def dispatch_workflow(self, workflow: str, ref: str, inputs: dict) -> None:
        self._call("POST", f"/actions/workflows/{workflow}/dispatches", {"ref": ref, "inputs": inputs})

    def pr_head_sha(self, pr: int) -> str:
        return str(self._get(self._call("GET", f"/pulls/{pr}"), "head", "sha"))

    def permission(self, login: str) -> str:
        """The user's permission on the repository: admin | write | read | none."""
        try:
            answer = self._call("GET", f"/collaborators/{quote(login, safe='')}/permission")
        except GitHubError as err:
            if err.status == 404:  # not a collaborator at all
                return "none"
            raise
        return str(answer.get("permission") or "none") if isinstance(answer, dict) else "none"

    def last_accepted(self, pr: int, login: str) -> datetime | None:
        """When the bot last accepted a rerun command from ``login`` on this PR (for cooldowns)."""
        marker = ACCEPTED_MARKER.format(login=login)
        latest = None
        for page in range(1, 4):  # 300 comments at most: a bounded cost per command
            comments = self._call("GET", f"/issues/{pr}/comments", params={"per_page": 100, "page": page}) or []
            for comment in comments if isinstance(comments, list) else []:
                if (comment.get("user") or {}).get("type") == "Bot" and marker in (comment.get("body") or ""):
                    try:
                        latest = datetime.fromisoformat(str(comment.get("created_at")).replace("Z", "+00:00"))
                    except ValueError:
                        continue
            if len(comments) < 100:
                break
        return latest

    def rerun_failed_runs(self, pr: int) -> int:
        """Rerun the failed jobs (and whole skipped runs) of the PR head's workflow runs; how many."""
        head_sha = self.pr_head_sha(pr)
        runs = self._get(self._call("GET", "/actions/runs", params={"head_sha": head_sha, "per_page": 100}),
                         "workflow_runs")
        rerun = 0
        for run in runs if isinstance(runs, list) else []:
            # A skipped run has no failed jobs to rerun: it needs a full rerun.
            endpoint = {"failure": "rerun-failed-jobs", "skipped": "rerun"}.get(run.get("conclusion"))
            if run.get("status") == "completed" and endpoint:
                self._call("POST", f"/actions/runs/{run['id']}/{endpoint}")
                rerun += 1
        return rerun


def _rate_limit_wait(response: requests.Response) -> float | None:
    """Seconds GitHub asks us to wait (Retry-After, or x-ratelimit-reset at quota 0); None: not a rate limit."""
    if response.status_code not in (403, 429):
        return None
    retry_after = response.headers.get("Retry-After")
    if retry_after:
        try:
            return max(0.0, float(retry_after))
        except ValueError:
            try:
                return max(0.0, (parsedate_to_datetime(retry_after) - datetime.now(timezone.utc)).total_seconds())
            except (TypeError, ValueError):
                return None
    if response.headers.get("x-ratelimit-remaining") == "0" and response.headers.get("x-ratelimit-reset"):
        try:
            return max(0.0, float(response.headers["x-ratelimit-reset"]) - time.time())
        except ValueError:
            return None
    if "secondary rate limit" in response.text.lower():
        return 60.0  # GitHub's advice when a secondary limit names no time: wait at least a minute
    return None
