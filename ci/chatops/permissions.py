"""Who may run which ChatOps command (SGLang's CI_PERMISSIONS.json rules).

The file maps a GitHub login to ``{"can_tag_run_ci_label": bool, "can_rerun_failed_ci": bool,
"cooldown_interval_minutes": int}`` (other keys, such as ``reason``, are kept for people).
- ``/tag-run-ci-label`` needs ``can_tag_run_ci_label``.
- ``/rerun-failed-ci`` needs ``can_rerun_failed_ci``, or being the PR's author.
- ``/tag-and-rerun-ci`` needs both of the above.
- ``/rerun-test`` runs PR code on self-hosted GPU runners, so it is gated on the commenter
  alone: write access or a cooldown of 0. Authoring the PR grants nothing here. ``/bisect`` re-runs cells on
  the same runners: the same rule.

Write access is the repository's answer (the collaborator permission API: ``admin`` or ``write``,
which includes the maintain role), never the comment's ``author_association``: an org MEMBER may
hold only read access. A cooldown of N > 0 minutes lets a user without write access run a rerun
command at most once per N minutes on a PR (counted from the bot's previous accepted reply to them).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from dspark_ci.ground.errors import BadInput

DEFAULT_PERMISSIONS = Path(__file__).with_name("permissions.json")
WRITE_PERMISSIONS = frozenset({"admin", "write"})

# key -> (accepted types, how to say it)
_FIELDS = {
    "can_tag_run_ci_label": ((bool,), "true or false"),
    "can_rerun_failed_ci": ((bool,), "true or false"),
    "cooldown_interval_minutes": ((int,), "a whole number of minutes (0 = no cooldown)"),
}


@dataclass(frozen=True)
class UserPermissions:
    can_tag_run_ci_label: bool = False
    can_rerun_failed_ci: bool = False
    cooldown_interval_minutes: int | None = None  # None: not listed


@dataclass(frozen=True)
class Commenter:
    login: str
    permission: str  # the repository's answer: admin | write | read | none
    is_pr_author: bool
    last_accepted: datetime | None = None  # the bot's last accepted rerun for this user on this PR
    now: datetime | None = None

    @property
    def has_write(self) -> bool:
        return self.permission in WRITE_PERMISSIONS


def load_permissions(path: Path, shown_as: str) -> Mapping[str, UserPermissions]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise BadInput(shown_as, f"cannot read the permissions file ({err.strerror})",
                       "pass --permissions FILE with a JSON object of GitHub logins") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise BadInput(f"{shown_as}:{err.lineno}", f"not valid JSON ({err.msg})",
                       "fix the JSON syntax") from None
    if not isinstance(data, dict):
        raise BadInput(shown_as, "must be a JSON object mapping GitHub logins to permissions",
                       'e.g. {"alice": {"can_rerun_failed_ci": true}}')
    return {login: _user(entry, login, shown_as) for login, entry in data.items()}


def _user(entry, login: str, shown_as: str) -> UserPermissions:
    if not isinstance(entry, dict):
        raise BadInput(shown_as, f"entry for {login!r} must be an object", 'e.g. {"can_rerun_failed_ci": true}')
    for key, (types, wanted) in _FIELDS.items():
        value = entry.get(key)
        if value is not None and not _valid(value, types):
            raise BadInput(shown_as, f"{login}.{key} is {json.dumps(value)}", f"it must be {wanted}")
    return UserPermissions(**{key: entry[key] for key in _FIELDS if entry.get(key) is not None})


def _valid(value, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):  # bool is an int in Python; a cooldown of `true` is a typo
        return bool in types
    return isinstance(value, types) and not (isinstance(value, int) and value < 0)


def refusal(permission: Permission, commenter: Commenter, users: Mapping[str, UserPermissions]) -> str | None:
    """Why ``commenter`` may not run a command that needs ``permission`` (None: allowed)."""
    user = users.get(commenter.login, UserPermissions())
    reasons = [reason for check in permission.checks if (reason := check(user, commenter))]
    if not reasons and permission.cooldown:
        reasons = [reason] if (reason := _cooldown(user, commenter)) else []
    return " ".join(reasons) or None


def _cooldown(user: UserPermissions, commenter: Commenter) -> str | None:
    minutes = user.cooldown_interval_minutes
    if commenter.has_write or not minutes or commenter.last_accepted is None or commenter.now is None:
        return None
    ready = commenter.last_accepted + timedelta(minutes=minutes)
    if commenter.now >= ready:
        return None
    wait = max(1, int((ready - commenter.now).total_seconds() // 60) + 1)
    return (f"Your cooldown is {minutes} minutes and your last rerun here was accepted "
            f"{commenter.last_accepted:%H:%M} UTC: try again in {wait} minutes.")


def _can_tag(user: UserPermissions, commenter: Commenter) -> str | None:
    if user.can_tag_run_ci_label:
        return None
    return "Adding the run-ci label needs can_tag_run_ci_label in the CI permissions file."


def _can_rerun_failed(user: UserPermissions, commenter: Commenter) -> str | None:
    if user.can_rerun_failed_ci or commenter.is_pr_author:
        return None
    return ("Rerunning failed CI needs can_rerun_failed_ci in the CI permissions file "
            "(PR authors may always rerun their own failed CI).")


def _can_rerun_test(user: UserPermissions, commenter: Commenter) -> str | None:
    if commenter.has_write or user.cooldown_interval_minutes == 0:
        return None
    return (f"/rerun-test runs PR code on self-hosted GPU runners, so it needs write access to this "
            f"repository (your permission is {commenter.permission}) or cooldown_interval_minutes: 0 in "
            "the CI permissions file. Being the PR's author is not enough.")


Check = Callable[[UserPermissions, Commenter], "str | None"]  # why not, or None


@dataclass(frozen=True)
class Permission:
    """What a command needs (one field of its row in ``dspark_ci.ci.chatops.handle.COMMANDS``): every check passed, and,
    for a command that reruns something, the commenter's cooldown over."""

    checks: tuple[Check, ...]
    cooldown: bool  # a rerun: a user without write access waits cooldown_interval_minutes between two


TAG_RUN_CI = Permission((_can_tag,), cooldown=False)
RERUN_FAILED = Permission((_can_rerun_failed,), cooldown=True)
TAG_AND_RERUN = Permission((_can_tag, _can_rerun_failed), cooldown=True)
# PR code on self-hosted GPU runners (/rerun-test, and /bisect, which re-runs cells on the same runners)
GPU_RUNNERS = Permission((_can_rerun_test,), cooldown=True)
