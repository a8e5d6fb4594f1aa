"""The GitHub REST calls ChatOps and the rerun workflow make, through one client (never in --dry-run).

Every call goes through ``GitHub._call``: one ``requests.Session``, retried by tenacity when the
failure is transient (a connection error or timeout, a 5xx, a 429, or a 403 that is a rate limit),
waiting what GitHub asks (``Retry-After``, else ``x-ratelimit-reset`` when the remaining quota is 0),
otherwise exponential backoff; bounded in attempts and in the longest wait. A rate limit that asks
for more than ``max_wait_seconds`` is not waited for: the call fails at once, saying until when.

Writes are done at most once (``GitHub._write``). GitHub sometimes acts and then answers 502, drops the
connection, or answers after the client gave up; a blind retry then dispatches two GPU runs or posts
two replies. So each write carries an identity that can be looked up (a dispatch's ``request`` input
shows in its run's title, a reply holds a hidden marker, a label or a reaction is there or not), and
every attempt looks before it writes: a write whose answer was lost is found, not repeated. A dispatched
run can take longer to be listed than any wait we could afford, so a dispatch may still be repeated: the
run itself closes that (``dspark_ci.ci.chatops.duplicate_run``: a run whose request an earlier run of the same
workflow carries does nothing).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from typing import TypeVar
from urllib.parse import quote

import requests
import tenacity
from dspark_ci.ground.errors import InfraError

DEFAULT_API = "https://api.github.com"
# Who the workflow's GITHUB_TOKEN writes as. Our replies and reactions are found by this login, never by a
# marker alone: any bot (or app) could post a comment holding our marker.
DEFAULT_BOT_LOGIN = "github-actions[bot]"
TIMEOUT_SECONDS = 30
REACTIONS = {"accepted": "+1", "refused": "confused", "seen": "eyes"}
ACCEPTED_MARKER = "<!--chatops:accepted:{login}-->"  # in the bot's accepted replies: cooldowns count from them
REPLY_MARKER = "<!--chatops:reply:{request}-->"  # in every reply: the reply to one command is found, not reposted
PAGE_SIZE = 100
MAX_PAGES = 3  # comments read per look: the newest 300 (a bounded cost per command)
_LAST_PAGE = re.compile(r'[?&]page=(\d+)[^>]*>;\s*rel="last"')
T = TypeVar("T")


def run_title_tag(request: str) -> str:
    """How a dispatched run shows its ``request`` input in its title (the workflows' run-name)."""
    return f"[{request}]"


class GitHubError(InfraError):
    """A GitHub call that failed for good. ``status``: the HTTP status (None: no answer)."""

    def __init__(self, message: str, status: int | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


@dataclass(frozen=True)
class PullHead:
    sha: str
    repo: str | None = None  # owner/name the head branch lives in (a fork's, or ours)
    ref: str | None = None  # the head branch's name


@dataclass(frozen=True)
class HeadAt:
    """The PR head at one moment: ``sha``, or None with ``why`` it cannot be known."""

    sha: str | None
    why: str = ""


@dataclass(frozen=True)
class GitHub:
    token: str
    repo: str  # owner/name
    api_url: str = DEFAULT_API
    attempts: int = 5
    backoff_seconds: float = 1.0  # first retry after this, doubling
    max_wait_seconds: float = 60.0  # the longest single wait (rate limits asking more fail at once)
    timeout_seconds: float = TIMEOUT_SECONDS
    bot_login: str = DEFAULT_BOT_LOGIN  # who this client's token writes as
    session: requests.Session = field(default_factory=requests.Session, compare=False, repr=False)

    def _retrying(self) -> tenacity.Retrying:
        return tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.attempts),
            retry=tenacity.retry_if_exception(self._worth_retrying),
            wait=self._wait, reraise=True, sleep=time.sleep)

    def _call(self, method: str, path: str, json_body: dict | None = None, params: dict | None = None,
              repo: str | None = None):
        return self._retrying()(self._once, method, path, json_body, params, repo)

    def _write(self, perform: Callable[[], T], find: Callable[[bool], T | None]) -> T:
        """``perform`` at most once: every attempt first looks (``find(ambiguous)``) for the write having
        happened; only a write that is not found is (re)done. ``ambiguous``: the last attempt got no answer
        or a 5xx, so GitHub may have acted (a 4xx or a rate limit says it did not)."""
        ambiguous = [False]

        def attempt() -> T:
            found = find(ambiguous[0])
            if found is not None:
                return found
            try:
                return perform()
            except GitHubError as err:
                ambiguous[0] = err.status is None or err.status >= 500
                raise

        return self._retrying()(attempt)

    def _once(self, method: str, path: str, json_body: dict | None, params: dict | None, repo: str | None = None):
        return self._response(method, path, json_body, params, repo)[0]

    def _response(self, method: str, path: str, json_body: dict | None, params: dict | None,
                  repo: str | None = None):
        url = f"{self.api_url}/repos/{repo or self.repo}{path}"
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/vnd.github+json",
                   "X-GitHub-Api-Version": "2022-11-28"}
        try:
            response = self.session.request(method, url, json=json_body, params=params, headers=headers,
                                            timeout=self.timeout_seconds)
        except requests.RequestException as err:
            raise GitHubError(f"GitHub API {method} {path} failed: {err} (check the network)") from None
        if response.status_code >= 400:
            retry_after = _rate_limit_wait(response)
            fix = (f"rate limited: GitHub asks to wait {retry_after:.0f} s" if retry_after is not None
                   else "check that the token may do this")
            raise GitHubError(f"GitHub API {method} {path} answered {response.status_code}: "
                              f"{response.text[:200]} ({fix})", response.status_code, retry_after)
        try:
            return (response.json() if response.content else None), response
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

    # --- reads ----------------------------------------------------------------------------------

    def newest_comments(self, pr: int, since: datetime | None = None) -> list[dict]:
        """The PR's comments updated at or after ``since``, newest first, at most MAX_PAGES pages.

        GitHub lists them oldest first; the last page is read first (its number from the Link header)."""
        params: dict = {"per_page": PAGE_SIZE}
        if since is not None:
            params["since"] = since.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        first, response = self._retrying()(self._response, "GET", f"/issues/{pr}/comments", None,
                                           {**params, "page": 1})
        match = _LAST_PAGE.search(response.headers.get("Link", ""))
        last = int(match.group(1)) if match else 1
        pages = {1: first}
        newest: list[dict] = []
        for page in range(last, max(0, last - MAX_PAGES), -1):
            comments = pages.get(page)
            if comments is None:
                comments = self._call("GET", f"/issues/{pr}/comments", params={**params, "page": page})
            newest += reversed([c for c in comments or [] if isinstance(c, dict)])
        return newest

    def _ours(self, item: dict) -> bool:
        """Written by this client's identity (a comment or a reaction)."""
        return (item.get("user") or {}).get("login") == self.bot_login

    def _bot_comment_with(self, pr: int, marker: str, since: datetime | None) -> dict | None:
        for comment in self.newest_comments(pr, since):
            if self._ours(comment) and marker in (comment.get("body") or ""):
                return comment
        return None

    def comment_body(self, comment_id: int) -> str:
        return self._get(self._call("GET", f"/issues/comments/{comment_id}"), "body") or ""

    def pr_head(self, pr: int) -> PullHead:
        answer = self._call("GET", f"/pulls/{pr}")
        repo = (self._get(answer, "head").get("repo") or {}).get("full_name")
        ref = self._get(answer, "head").get("ref")
        return PullHead(str(self._get(answer, "head", "sha")), repo if isinstance(repo, str) else None,
                        ref if isinstance(ref, str) else None)

    def head_at(self, head: PullHead, moment: datetime) -> HeadAt:
        """What the head branch pointed at, at ``moment``, from the head repository's activity (its pushes,
        newest first, each with ``after`` and GitHub's own timestamp). GitHub's times are whole seconds, so a
        push in the same second as ``moment`` cannot be ordered against it: unknown, never a guess."""
        if not head.repo or not head.ref:
            return HeadAt(None, "GitHub did not name the PR's head branch")
        try:
            listed = self._call("GET", "/activity", params={"ref": f"refs/heads/{head.ref}", "direction": "desc",
                                                            "per_page": PAGE_SIZE}, repo=head.repo)
        except GitHubError as err:
            return HeadAt(None, f"GitHub did not list the pushes to the PR's branch ({str(err)[:160]})")
        second = _whole_second(moment)
        for activity in listed if isinstance(listed, list) else []:
            when = _timestamp(activity.get("timestamp")) if isinstance(activity, dict) else None
            after = activity.get("after") if isinstance(activity, dict) else None
            if when is None or not isinstance(after, str):
                return HeadAt(None, "GitHub listed a push to the PR's branch without its time or commit")
            if _whole_second(when) == second:
                return HeadAt(None, f"a push to the PR's branch came in the same second as your comment "
                                    f"({when:%H:%M:%S} UTC), so it cannot be told whether you saw it")
            if when < moment:
                return HeadAt(after)
        return HeadAt(None, "GitHub lists no push to the PR's branch before your comment")

    def pr_head_sha(self, pr: int) -> str:
        return self.pr_head(pr).sha

    def permission(self, login: str) -> str:
        """The user's permission on the repository: admin | write | read | none."""
        try:
            answer = self._call("GET", f"/collaborators/{quote(login, safe='')}/permission")
        except GitHubError as err:
            if err.status == 404:  # not a collaborator at all
                return "none"
            raise
        return str(answer.get("permission") or "none") if isinstance(answer, dict) else "none"

    def last_accepted(self, pr: int, login: str, since: datetime | None = None) -> datetime | None:
        """When the bot last accepted a rerun command from ``login`` on this PR (for cooldowns), looking
        at the newest comments (updated since ``since``)."""
        comment = self._bot_comment_with(pr, ACCEPTED_MARKER.format(login=login), since)
        return _timestamp(comment.get("created_at")) if comment else None

    # --- writes: each at most once --------------------------------------------------------------

    def post_reply(self, pr: int, body: str, request: str, since: datetime | None = None) -> int:
        """Post ``body`` as the reply to command ``request`` (once: an earlier reply to it is reused)."""
        marker = REPLY_MARKER.format(request=request)
        body = body if marker in body else f"{body}{marker}\n"

        def find(_: bool) -> int | None:
            comment = self._bot_comment_with(pr, marker, since)
            return int(comment["id"]) if comment and isinstance(comment.get("id"), int) else None

        return self._write(lambda: self._get(self._once("POST", f"/issues/{pr}/comments", {"body": body}, None),
                                             "id"), find)

    def edit_comment(self, comment_id: int, body: str) -> None:
        self._call("PATCH", f"/issues/comments/{comment_id}", {"body": body})  # the same PATCH twice: same body

    def react(self, comment_id: int, reaction: str) -> None:
        content = REACTIONS[reaction]
        path = f"/issues/comments/{comment_id}/reactions"

        def find(_: bool) -> bool | None:
            listed = self._call("GET", path, params={"content": content, "per_page": PAGE_SIZE}) or []
            return True if any(self._ours(r) and r.get("content") == content
                               for r in listed if isinstance(r, dict)) else None

        self._write(lambda: self._once("POST", path, {"content": content}, None) or True, find)

    def unreact(self, comment_id: int, reaction: str) -> None:
        """Take back every ``reaction`` of ours on the comment (a DELETE of one already gone is a 404: done)."""
        content = REACTIONS[reaction]
        path = f"/issues/comments/{comment_id}/reactions"
        listed = self._call("GET", path, params={"content": content, "per_page": PAGE_SIZE}) or []
        for item in listed if isinstance(listed, list) else []:
            if isinstance(item, dict) and self._ours(item) and item.get("content") == content:
                try:
                    self._call("DELETE", f"{path}/{int(item['id'])}")
                except GitHubError as err:
                    if err.status != 404:
                        raise

    def add_label(self, pr: int, label: str) -> None:
        def find(_: bool) -> bool | None:
            listed = self._call("GET", f"/issues/{pr}/labels", params={"per_page": PAGE_SIZE}) or []
            return True if any(isinstance(item, dict) and item.get("name") == label for item in listed) else None

        self._write(lambda: self._once("POST", f"/issues/{pr}/labels", {"labels": [label]}, None) or True, find)

    def dispatch_workflow(self, workflow: str, ref: str, inputs: dict) -> None:
        """Dispatch once; ``inputs["request"]`` (shown in the run's title) is how a lost answer is resolved."""
        request = inputs.get("request", "")
        since = datetime.now(timezone.utc)

        def find(_: bool) -> bool | None:
            return True if request and self.runs_with_request(workflow, request, since) else None

        self._write(lambda: self._once("POST", f"/actions/workflows/{workflow}/dispatches",
                                       {"ref": ref, "inputs": inputs}, None) or True, find)

    def runs_with_request(self, workflow: str, request: str, since: datetime) -> list[int]:
        """Ids of the dispatched runs of ``workflow`` created since ``since`` whose title carries ``request``."""
        created = (since.astimezone(timezone.utc).replace(microsecond=0) - _CLOCK_SKEW).strftime("%Y-%m-%dT%H:%M:%SZ")
        answer = self._call("GET", f"/actions/workflows/{workflow}/runs",
                            params={"event": "workflow_dispatch", "created": f">={created}", "per_page": PAGE_SIZE})
        runs = self._get(answer, "workflow_runs")
        tag = run_title_tag(request)
        return [int(run["id"]) for run in runs or [] if isinstance(run, dict) and isinstance(run.get("id"), int)
                and tag in str(run.get("display_title") or "")]

    def run_created_at(self, run_id: int) -> datetime:
        created = _timestamp(self._get(self._call("GET", f"/actions/runs/{run_id}"), "created_at"))
        if created is None:
            raise GitHubError(f"GitHub gave run {run_id} no usable created_at (check GITHUB_API_URL)")
        return created

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
                self._rerun_once(int(run["id"]), endpoint)
                rerun += 1
        return rerun

    def _rerun_once(self, run_id: int, endpoint: str) -> None:
        def perform() -> bool:
            self._once("POST", f"/actions/runs/{run_id}/{endpoint}", None, None)
            return True

        self._write(perform, lambda _: self._rerun_started(run_id))

    def _rerun_started(self, run_id: int) -> bool | None:
        """A completed run that was rerun is queued (or further) again."""
        status = self._get(self._call("GET", f"/actions/runs/{run_id}"), "status")
        return None if status == "completed" else True


_CLOCK_SKEW = timedelta(minutes=2)  # our clock against GitHub's, when filtering runs


def _whole_second(moment: datetime) -> int:
    return int(moment.timestamp() // 1)


def _timestamp(text) -> datetime | None:
    """An ISO 8601 time with its zone (None: absent, unreadable or zoneless, which cannot be compared)."""
    try:
        moment = datetime.fromisoformat(str(text).replace("Z", "+00:00")) if text else None
    except ValueError:
        return None
    return moment if moment is not None and moment.tzinfo is not None else None


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
