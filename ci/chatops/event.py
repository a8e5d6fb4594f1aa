"""The PR comment ChatOps acts on: from GitHub's ``issue_comment`` event payload, or from flags.

The file is read as untrusted bytes: at most ``MAX_EVENT_BYTES``, UTF-8 only (GitHub writes UTF-8),
JSON nested no deeper than ``MAX_DEPTH``; anything else is one BadInput (exit 2), never a traceback.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from dspark_ci.ground.errors import BadInput

EVENT_FIX = "pass the issue_comment event payload, e.g. --event \"$GITHUB_EVENT_PATH\""
MAX_EVENT_BYTES = 8 * 1024 * 1024  # GitHub caps a comment at 65,536 characters; its payload is far smaller
MAX_DEPTH = 64  # an issue_comment payload nests about 5 deep


@dataclass(frozen=True)
class CommentEvent:
    body: str
    user: str  # who commented
    author_association: str  # OWNER | MEMBER | COLLABORATOR | CONTRIBUTOR | NONE | ...
    pr_author: str | None  # None: unknown
    pr_number: int | None
    repo: str | None  # owner/name
    default_branch: str | None
    comment_id: int | None
    action: str = "created"  # created | edited | deleted: only a new comment is a command
    created_at: datetime | None = None  # when the comment was written (GitHub's clock); None: unknown
    user_type: str = "User"  # User | Bot | Organization

    @property
    def ignored(self) -> str | None:
        """Why this event is no command at all (None: it may be one)."""
        if self.action != "created":
            return f"the comment was {self.action}, not created: only a new comment is a command"
        if self.user_type == "Bot" or self.user.endswith("[bot]"):
            return f"{self.user} is a bot: bots' comments are never commands"
        return None


def load_event(path: Path) -> CommentEvent:
    data = _read_json(path)
    comment, issue, repo = (_object(data, key, path) for key in ("comment", "issue", "repository"))
    if not isinstance(issue.get("pull_request"), dict):  # absent or null: a plain issue
        raise BadInput(str(path), f"issue #{issue.get('number')} is not a pull request",
                       "ChatOps commands work in pull request comments only")
    pr_user = _optional(issue, "user", dict, path, "issue")
    user = _object(comment, "user", path)
    login = _field(user, "login", str, path, "comment.user")
    if not login.strip():
        raise BadInput(str(path), "comment.user.login is empty", EVENT_FIX)
    number = _field(issue, "number", int, path, "issue")
    if number < 1:  # GitHub numbers issues from 1: anything else was not written by GitHub
        raise BadInput(str(path), f"issue.number is {number}: not a pull request number", EVENT_FIX)
    action = _optional(data, "action", str, path, "event") or "created"
    created_at = _optional(comment, "created_at", str, path, "comment")
    return CommentEvent(
        body=_field(comment, "body", str, path, "comment"),
        user=login,
        action=action,
        created_at=_timestamp(created_at, path) if created_at else None,
        user_type=_optional(user, "type", str, path, "comment.user") or "User",
        author_association=_optional(comment, "author_association", str, path, "comment") or "NONE",
        pr_author=_optional(pr_user, "login", str, path, "issue.user") if pr_user else None,
        pr_number=number,
        repo=_optional(repo, "full_name", str, path, "repository"),
        default_branch=_optional(repo, "default_branch", str, path, "repository"),
        comment_id=_optional(comment, "id", int, path, "comment"),
    )


def _read_bytes(path: Path) -> bytes:
    """At most MAX_EVENT_BYTES + 1 bytes of a regular file: a FIFO or a device would block or never end, so
    it is opened without waiting for a writer and refused before any read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as err:
        raise BadInput(str(path), f"cannot read the event file ({err.strerror})", EVENT_FIX) from None
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BadInput(str(path), "not a regular file (a FIFO, device or directory)", EVENT_FIX)
        try:
            return file.read(MAX_EVENT_BYTES + 1)
        except OSError as err:
            raise BadInput(str(path), f"cannot read the event file ({err.strerror})", EVENT_FIX) from None


def _read_json(path: Path):
    raw = _read_bytes(path)
    if len(raw) > MAX_EVENT_BYTES:
        raise BadInput(str(path), f"larger than {MAX_EVENT_BYTES // (1024 * 1024)} MB: not an issue_comment event",
                       EVENT_FIX)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadInput(str(path), f"not UTF-8 (byte {err.start}: {err.reason})", EVENT_FIX) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise BadInput(f"{path}:{err.lineno}", f"not valid JSON ({err.msg})", EVENT_FIX) from None
    except ValueError as err:  # e.g. a number with more digits than Python converts
        raise BadInput(str(path), f"not a usable JSON document ({str(err)[:120]})", EVENT_FIX) from None
    except RecursionError:  # deeper than the parser's stack: certainly too deep
        data = None
        too_deep = True
    else:
        too_deep = _depth(data) > MAX_DEPTH
    if too_deep:
        raise BadInput(str(path), f"JSON nested deeper than {MAX_DEPTH} levels: not an issue_comment event",
                       EVENT_FIX)
    return data


def _depth(value) -> int:
    """How deep ``value`` nests (iteratively: a hostile file cannot exhaust the stack here)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            return deepest
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def _timestamp(text: str, path: Path) -> datetime:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadInput(str(path), f"comment.created_at {text[:40]!r} is not an ISO 8601 time", EVENT_FIX) from None
    if value.tzinfo is None:
        raise BadInput(str(path), f"comment.created_at {text[:40]!r} has no time zone", EVENT_FIX)
    return value


def event_from_flags(comment: str, user: str, association: str, pr_author: str | None,
                     pr_number: int | None, repo: str | None) -> CommentEvent:
    return CommentEvent(body=comment, user=user, author_association=association, pr_author=pr_author,
                        pr_number=pr_number, repo=repo, default_branch=None, comment_id=None)


def _object(data, key: str, path: Path) -> dict:
    value = data.get(key) if isinstance(data, dict) else None
    if not isinstance(value, dict):
        raise BadInput(str(path), f"no '{key}' object: not an issue_comment event", EVENT_FIX)
    return value


def _optional(obj: dict, key: str, kind: type, path: Path, where: str):
    """``obj[key]`` when present (None when absent or null); wrongly typed: BadInput, never a crash later."""
    return None if obj.get(key) is None else _field(obj, key, kind, path, where)


def _field(obj: dict, key: str, kind: type, path: Path, where: str):
    value = obj.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise BadInput(str(path), f"{where}.{key} is missing or not a {kind.__name__}", EVENT_FIX)
    return value
