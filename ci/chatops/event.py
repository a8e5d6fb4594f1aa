"""The PR comment ChatOps acts on: from GitHub's ``issue_comment`` event payload, or from flags."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ground.errors import BadInput

EVENT_FIX = "pass the issue_comment event payload, e.g. --event \"$GITHUB_EVENT_PATH\""


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


def load_event(path: Path) -> CommentEvent:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise BadInput(str(path), f"cannot read the event file ({err.strerror})", EVENT_FIX) from None
    except json.JSONDecodeError as err:
        raise BadInput(f"{path}:{err.lineno}", f"not valid JSON ({err.msg})", EVENT_FIX) from None
    comment, issue, repo = (_object(data, key, path) for key in ("comment", "issue", "repository"))
    if "pull_request" not in issue:
        raise BadInput(str(path), f"issue #{issue.get('number')} is not a pull request",
                       "ChatOps commands work in pull request comments only")
    pr_user = _optional(issue, "user", dict, path, "issue")
    return CommentEvent(
        body=_field(comment, "body", str, path, "comment"),
        user=_field(_object(comment, "user", path), "login", str, path, "comment.user"),
        author_association=_optional(comment, "author_association", str, path, "comment") or "NONE",
        pr_author=_optional(pr_user, "login", str, path, "issue.user") if pr_user else None,
        pr_number=_field(issue, "number", int, path, "issue"),
        repo=_optional(repo, "full_name", str, path, "repository"),
        default_branch=_optional(repo, "default_branch", str, path, "repository"),
        comment_id=_optional(comment, "id", int, path, "comment"),
    )


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
