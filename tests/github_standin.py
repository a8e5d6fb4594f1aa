"""A local stand-in for the GitHub REST endpoints ChatOps uses, on 127.0.0.1 (tests only; not GitHub).

It keeps comments, reactions, labels, dispatches, workflow runs and pushes to the PR's branch in memory, answers
permission and pull requests from what a test set, and can be scripted to fail:
- ``fail(method, path_regex, status, headers, body, times)`` answers the next ``times`` matching requests
  with that failure instead of carrying them out;
- ``fault_after(method, path_regex, kind, times)`` is the worse case: the request is carried out, then its
  answer is lost: ``"502"`` (Bad Gateway), ``"reset"`` (the connection dropped without an answer) or
  ``"timeout"`` (the answer comes ``slow_seconds`` later, after the client gave up).
Writes are not idempotent here (a second POST adds a second comment, label, reaction or run), so only a
client that looks before it retries ends with one of each. ``hold_reads(n)`` makes the first ``n`` reads
of a comment wait for each other, so that ``n`` writers read the same body (a forced read-modify-write
race). Comments are listed oldest first, ``per_page`` at a time with a Link header, filtered by ``since``,
as GitHub does. Every request is recorded with its arrival time.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from dspark_ci.ci.chatops.github import run_title_tag

BOT = {"login": "github-actions[bot]", "type": "Bot"}
FAULT_KINDS = ("502", "reset", "timeout")


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Failure:
    method: str
    path: re.Pattern
    status: int
    headers: dict
    body: str
    times: int
    after: str | None = None  # carried out first, then this fault (FAULT_KINDS); None: instead of it


@dataclass
class StandInState:
    repo: str = "sgl-project/sglang"
    head_sha: str = "c0ffee" * 6 + "beef"
    head_ref: str = "feature"  # the PR's head branch, in this same repository
    # Pushes to the head branch, oldest first, as GET /repos/R/activity lists them (newest first there).
    activities: list[dict] = field(default_factory=lambda: [{
        "before": "0" * 40, "after": "c0ffee" * 6 + "beef", "ref": "refs/heads/feature",
        "timestamp": "2026-01-01T00:00:00Z", "activity_type": "branch_creation"}])
    permissions: dict[str, str] = field(default_factory=dict)  # login -> admin|write|read (absent: 404)
    comments: dict[int, dict] = field(default_factory=dict)
    reactions: list[tuple[int, str]] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    dispatches: list[dict] = field(default_factory=list)
    runs: list[dict] = field(default_factory=list)  # workflow runs: dispatched ones and those of the PR head
    requests: list[tuple[float, str, str]] = field(default_factory=list)  # (time, method, path)
    failures: list[Failure] = field(default_factory=list)
    read_barrier: threading.Barrier | None = None
    slow_seconds: float = 2.0  # a "timeout" fault answers this late
    listing_lag_seconds: float = 0.0  # a dispatched run is listed only this long after it was created
    next_id: int = 1000
    lock: threading.Lock = field(default_factory=threading.Lock)


class GitHubStandIn:
    def __init__(self):
        self.state = StandInState()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.state))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> GitHubStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def fail(self, method: str, path: str, status: int, headers: dict | None = None, body: str = "", times: int = 1):
        self.state.failures.append(Failure(method, re.compile(path), status, headers or {}, body, times))

    def fault_after(self, method: str, path: str, kind: str, times: int = 1):
        assert kind in FAULT_KINDS, kind
        self.state.failures.append(Failure(method, re.compile(path), 502, {}, "Bad Gateway", times, after=kind))

    def hold_reads(self, count: int) -> None:
        self.state.read_barrier = threading.Barrier(count, timeout=10)

    def add_comment(self, body: str, user: dict | None = None, created_at: str | None = None) -> int:
        with self.state.lock:
            return _new_comment(self.state, body, user or BOT, created_at or now_iso())["id"]

    def push(self, sha: str, pushed_at: str | None = None) -> None:
        """Someone pushes a new head to the PR (at ``pushed_at``, GitHub's time to the second)."""
        self.state.activities.append({"before": self.state.head_sha, "after": sha,
                                      "ref": f"refs/heads/{self.state.head_ref}",
                                      "timestamp": pushed_at or now_iso(), "activity_type": "push"})
        self.state.head_sha = sha

    def times_of(self, method: str, path_part: str) -> list[float]:
        return [t for t, m, p in self.state.requests if m == method and path_part in p]

    def replies(self) -> list[str]:
        return [c["body"] for c in self.state.comments.values() if c["user"].get("type") == "Bot"]


def _reaction_id(comment_id: int, content: str) -> int:
    """A stable id per (comment, content): the stand-in keeps reactions as pairs."""
    reactions = sorted(("+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes"))
    return comment_id * 100 + reactions.index(content)


def _new_comment(state: StandInState, body: str, user: dict, created_at: str) -> dict:
    state.next_id += 1
    comment = {"id": state.next_id, "body": body, "user": user, "created_at": created_at, "updated_at": created_at}
    state.comments[state.next_id] = comment
    return comment


def _handler(state: StandInState):
    prefix = f"/repos/{state.repo}"

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        fault: Failure | None = None  # set for a request that is carried out, then answered badly

        def log_message(self, *args):  # quiet
            pass

        def _send(self, status: int, payload=None, headers: dict | None = None):
            fault, self.fault = self.fault, None
            if fault is not None and fault.after == "reset":
                # RST instead of an answer: SO_LINGER 0, then close.
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                return None
            if fault is not None and fault.after == "timeout":
                time.sleep(state.slow_seconds)
            if fault is not None and fault.after == "502":
                status, payload, headers = 502, b"Bad Gateway", {}
            body = b"" if payload is None else (payload if isinstance(payload, bytes) else json.dumps(payload).encode())
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, str(value))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except OSError:  # the client gave up (a "timeout" fault)
                self.close_connection = True
            return None

        def _body(self) -> dict:
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length)) if length else {}

        def _scripted_failure(self) -> bool:
            with state.lock:
                for failure in state.failures:
                    if failure.times and failure.method == self.command and failure.path.search(self.path):
                        failure.times -= 1
                        if failure.after:
                            self.fault = failure
                            return False
                        self._send(failure.status, failure.body.encode(), failure.headers)
                        return True
            return False

        def _route(self):
            with state.lock:
                state.requests.append((time.monotonic(), self.command, self.path))
            payload = self._body() if self.command in ("POST", "PATCH") else {}
            if self.headers.get("Authorization") != "Bearer stand-in-token":
                return self._send(401, {"message": "Bad credentials"})
            if self._scripted_failure():
                return None
            url = urlsplit(self.path)
            query = {key: values[-1] for key, values in parse_qs(url.query).items()}
            if not url.path.startswith(prefix):
                return self._send(404, {"message": "Not Found"})
            path = url.path[len(prefix):]
            for pattern, method, answer in ROUTES:
                if method == self.command and (match := re.fullmatch(pattern, path)):
                    return answer(self, match, payload, query)
            return self._send(404, {"message": "Not Found"})

        def permission(self, m, payload, query):
            permission = state.permissions.get(m.group(1))
            return self._send(200, {"permission": permission}) if permission else \
                self._send(404, {"message": "Not a collaborator"})

        def pull(self, m, payload, query):
            return self._send(200, {"head": {"sha": state.head_sha, "ref": state.head_ref,
                                             "repo": {"full_name": state.repo}}})

        def activity(self, m, payload, query):
            listed = [a for a in reversed(state.activities) if a["ref"] == query.get("ref", a["ref"])]
            return self._send(200, listed[:int(query.get("per_page", 30))])

        def list_comments(self, m, payload, query):
            since = query.get("since", "")
            listed = [c for c in sorted(state.comments.values(), key=lambda c: c["id"]) if c["updated_at"] >= since]
            per_page, page = int(query.get("per_page", 30)), int(query.get("page", 1))
            last = max(1, -(-len(listed) // per_page))
            link = f'<{prefix}/issues/{m.group(1)}/comments?per_page={per_page}&page={last}>; rel="last"'
            return self._send(200, listed[(page - 1) * per_page:page * per_page], {"Link": link})

        def post_comment(self, m, payload, query):
            with state.lock:
                comment = _new_comment(state, payload["body"], BOT, now_iso())
            return self._send(201, comment)

        def list_reactions(self, m, payload, query):
            listed = [{"id": _reaction_id(cid, content), "content": content, "user": BOT}
                      for cid, content in state.reactions
                      if cid == int(m.group(1)) and content == query.get("content", content)]
            return self._send(200, listed)

        def unreact(self, m, payload, query):
            cid, rid = int(m.group(1)), int(m.group(2))
            kept = [(c, content) for c, content in state.reactions if (c, _reaction_id(c, content)) != (cid, rid)]
            if len(kept) == len(state.reactions):
                return self._send(404, {"message": "Not Found"})
            state.reactions[:] = kept
            return self._send(204)

        def react(self, m, payload, query):
            state.reactions.append((int(m.group(1)), payload["content"]))
            return self._send(201, {"content": payload["content"]})

        def get_comment(self, m, payload, query):
            cid = int(m.group(1))
            if cid not in state.comments:
                return self._send(404, {"message": "Not Found"})
            body = state.comments[cid]["body"]
            barrier = state.read_barrier
            if barrier is not None:
                try:
                    barrier.wait()  # every held reader has read the same body
                except threading.BrokenBarrierError:
                    pass
                state.read_barrier = None
                time.sleep(0.05)
            return self._send(200, {**state.comments[cid], "body": body})

        def edit_comment(self, m, payload, query):
            cid = int(m.group(1))
            if cid not in state.comments:
                return self._send(404, {"message": "Not Found"})
            state.comments[cid].update(body=payload["body"], updated_at=now_iso())
            return self._send(200, state.comments[cid])

        def list_labels(self, m, payload, query):
            return self._send(200, [{"name": label} for label in state.labels])

        def add_labels(self, m, payload, query):
            state.labels += payload["labels"]
            return self._send(200, [{"name": label} for label in state.labels])

        def dispatch(self, m, payload, query):
            request = (payload.get("inputs") or {}).get("request", "")
            with state.lock:
                state.dispatches.append({"workflow": m.group(1), **payload})
                state.next_id += 1
                # What the workflows' run-name shows: the request tag (dspark_ci.ci.chatops.github.run_title_tag).
                state.runs.append({"id": state.next_id, "workflow": m.group(1), "event": "workflow_dispatch",
                                   "status": "queued", "created_at": now_iso(),
                                   "listed_from": time.monotonic() + state.listing_lag_seconds,
                                   "display_title": f"{m.group(1)} {run_title_tag(request) if request else ''}"})
            return self._send(204)

        def workflow_runs(self, m, payload, query):
            runs = [run for run in state.runs if run.get("workflow") == m.group(1)
                    and run.get("listed_from", 0) <= time.monotonic()]
            return self._send(200, {"total_count": len(runs), "workflow_runs": runs})

        def head_runs(self, m, payload, query):
            runs = [run for run in state.runs if run.get("head_sha") == query.get("head_sha")]
            return self._send(200, {"total_count": len(runs), "workflow_runs": runs})

        def get_run(self, m, payload, query):
            run = next((r for r in state.runs if r["id"] == int(m.group(1))), None)
            return self._send(200, run) if run else self._send(404, {"message": "Not Found"})

        def rerun(self, m, payload, query):
            run = next((r for r in state.runs if r["id"] == int(m.group(1))), None)
            if run is None:
                return self._send(404, {"message": "Not Found"})
            run.update(status="queued", conclusion=None, reruns=run.get("reruns", 0) + 1)
            return self._send(201, {})

        do_GET = do_POST = do_PATCH = do_DELETE = _route

    ROUTES = (
        (r"/collaborators/([^/]+)/permission", "GET", Handler.permission),
        (r"/pulls/\d+", "GET", Handler.pull),
        (r"/activity", "GET", Handler.activity),
        (r"/issues/(\d+)/comments", "GET", Handler.list_comments),
        (r"/issues/(\d+)/comments", "POST", Handler.post_comment),
        (r"/issues/comments/(\d+)/reactions", "GET", Handler.list_reactions),
        (r"/issues/comments/(\d+)/reactions", "POST", Handler.react),
        (r"/issues/comments/(\d+)/reactions/(\d+)", "DELETE", Handler.unreact),
        (r"/issues/comments/(\d+)", "GET", Handler.get_comment),
        (r"/issues/comments/(\d+)", "PATCH", Handler.edit_comment),
        (r"/issues/\d+/labels", "GET", Handler.list_labels),
        (r"/issues/\d+/labels", "POST", Handler.add_labels),
        (r"/actions/workflows/([^/]+)/dispatches", "POST", Handler.dispatch),
        (r"/actions/workflows/([^/]+)/runs", "GET", Handler.workflow_runs),
        (r"/actions/runs", "GET", Handler.head_runs),
        (r"/actions/runs/(\d+)", "GET", Handler.get_run),
        (r"/actions/runs/(\d+)/(?:rerun|rerun-failed-jobs)", "POST", Handler.rerun),
    )
    return Handler
