"""A local stand-in for the GitHub REST endpoints ChatOps uses, on 127.0.0.1 (tests only; not GitHub).

It keeps comments, reactions, labels and dispatches in memory, answers permission and pull requests
from what a test set, and can be scripted to fail: ``fail(method, path_regex, status, headers, body,
times)`` answers the next ``times`` matching requests with that failure instead. ``hold_reads(n)``
makes the first ``n`` reads of a comment wait for each other, so that ``n`` writers read the same body
(a forced read-modify-write race). Every request is recorded with its arrival time.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Failure:
    method: str
    path: re.Pattern
    status: int
    headers: dict
    body: str
    times: int


@dataclass
class StandInState:
    repo: str = "sgl-project/sglang"
    head_sha: str = "c0ffee" * 6 + "beef"
    permissions: dict[str, str] = field(default_factory=dict)  # login -> admin|write|read (absent: 404)
    comments: dict[int, dict] = field(default_factory=dict)
    reactions: list[tuple[int, str]] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    dispatches: list[dict] = field(default_factory=list)
    requests: list[tuple[float, str, str]] = field(default_factory=list)  # (time, method, path)
    failures: list[Failure] = field(default_factory=list)
    read_barrier: threading.Barrier | None = None
    next_id: int = 1000
    lock: threading.Lock = field(default_factory=threading.Lock)


class GitHubStandIn:
    def __init__(self):
        self.state = StandInState()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.state))
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

    def hold_reads(self, count: int) -> None:
        self.state.read_barrier = threading.Barrier(count, timeout=10)

    def add_comment(self, body: str, user: dict | None = None, created_at: str = "2026-01-01T00:00:00Z") -> int:
        with self.state.lock:
            self.state.next_id += 1
            cid = self.state.next_id
            self.state.comments[cid] = {"id": cid, "body": body, "user": user or {"login": "github-actions[bot]",
                                                                                 "type": "Bot"},
                                        "created_at": created_at}
        return cid

    def times_of(self, method: str, path_part: str) -> list[float]:
        return [t for t, m, p in self.state.requests if m == method and path_part in p]


def _handler(state: StandInState):
    prefix = f"/repos/{state.repo}"

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def _send(self, status: int, payload=None, headers: dict | None = None):
            body = b"" if payload is None else (payload if isinstance(payload, bytes) else json.dumps(payload).encode())
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, str(value))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _body(self) -> dict:
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length)) if length else {}

        def _scripted_failure(self) -> bool:
            with state.lock:
                for failure in state.failures:
                    if failure.times and failure.method == self.command and failure.path.search(self.path):
                        failure.times -= 1
                        self._send(failure.status, failure.body.encode(), failure.headers)
                        return True
            return False

        def _route(self):
            with state.lock:
                state.requests.append((time.monotonic(), self.command, self.path))
            if self.headers.get("Authorization") != "Bearer stand-in-token":
                return self._send(401, {"message": "Bad credentials"})
            payload = self._body() if self.command in ("POST", "PATCH") else {}
            if self._scripted_failure():
                return None
            path = self.path.split("?", 1)[0]
            if not path.startswith(prefix):
                return self._send(404, {"message": "Not Found"})
            path = path[len(prefix):]
            if m := re.fullmatch(r"/collaborators/([^/]+)/permission", path):
                permission = state.permissions.get(m.group(1))
                return self._send(200, {"permission": permission}) if permission else \
                    self._send(404, {"message": "Not a collaborator"})
            if re.fullmatch(r"/pulls/\d+", path):
                return self._send(200, {"head": {"sha": state.head_sha}})
            if re.fullmatch(r"/issues/\d+/comments", path):
                if self.command == "GET":
                    return self._send(200, sorted(state.comments.values(), key=lambda c: c["id"]))
                with state.lock:
                    state.next_id += 1
                    cid = state.next_id
                    state.comments[cid] = {"id": cid, "body": payload["body"], "created_at": "2026-01-01T00:00:00Z",
                                           "user": {"login": "github-actions[bot]", "type": "Bot"}}
                return self._send(201, state.comments[cid])
            if m := re.fullmatch(r"/issues/comments/(\d+)/reactions", path):
                state.reactions.append((int(m.group(1)), payload["content"]))
                return self._send(201, {"content": payload["content"]})
            if m := re.fullmatch(r"/issues/comments/(\d+)", path):
                cid = int(m.group(1))
                if cid not in state.comments:
                    return self._send(404, {"message": "Not Found"})
                if self.command == "GET":
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
                state.comments[cid]["body"] = payload["body"]
                return self._send(200, state.comments[cid])
            if re.fullmatch(r"/issues/\d+/labels", path):
                state.labels += payload["labels"]
                return self._send(200, [{"name": label} for label in state.labels])
            if m := re.fullmatch(r"/actions/workflows/([^/]+)/dispatches", path):
                state.dispatches.append({"workflow": m.group(1), **payload})
                return self._send(204)
            if path == "/actions/runs":
                return self._send(200, {"workflow_runs": []})
            return self._send(404, {"message": "Not Found"})

        do_GET = do_POST = do_PATCH = _route

    return Handler
