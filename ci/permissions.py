"""Who may run which ChatOps command (SGLang's CI_PERMISSIONS.json rules).

The file maps a GitHub login to ``{"can_tag_run_ci_label": bool, "can_rerun_failed_ci": bool,
"cooldown_interval_minutes": int}`` (other keys, such as ``reason``, are kept for people).
- ``/tag-run-ci-label`` needs ``can_tag_run_ci_label``.
- ``/rerun-failed-ci`` needs ``can_rerun_failed_ci``, or being the PR's author.
- ``/tag-and-rerun-ci`` needs both of the above.
- ``/rerun-test`` runs PR code on self-hosted GPU runners, so it is gated on the commenter
  alone: write access (author_association OWNER, MEMBER or COLLABORATOR) or a cooldown of 0.
  Authoring the PR grants nothing here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ci.commands import RERUN_FAILED_CI, RERUN_TEST, TAG_AND_RERUN_CI, TAG_RUN_CI_LABEL
from ground.errors import BadInput

DEFAULT_PERMISSIONS = Path(__file__).with_name("permissions.json")
WRITE_ASSOCIATIONS = frozenset({"OWNER", "MEMBER", "COLLABORATOR"})

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
    author_association: str  # OWNER | MEMBER | COLLABORATOR | CONTRIBUTOR | NONE | ...
    is_pr_author: bool


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


def refusal(command: str, commenter: Commenter, users: Mapping[str, UserPermissions]) -> str | None:
    """Why ``commenter`` may not run ``command`` (None: allowed)."""
    user = users.get(commenter.login, UserPermissions())
    reasons = [reason for check in _CHECKS[command] if (reason := check(user, commenter))]
    return " ".join(reasons) or None


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
    if commenter.author_association in WRITE_ASSOCIATIONS or user.cooldown_interval_minutes == 0:
        return None
    return (f"/rerun-test runs PR code on self-hosted GPU runners, so it needs write access to this "
            f"repository (you are {commenter.author_association}) or cooldown_interval_minutes: 0 in "
            "the CI permissions file. Being the PR's author is not enough.")


# command -> the checks it must pass (all of them)
_CHECKS = {
    TAG_RUN_CI_LABEL: (_can_tag,),
    RERUN_FAILED_CI: (_can_rerun_failed,),
    TAG_AND_RERUN_CI: (_can_tag, _can_rerun_failed),
    RERUN_TEST: (_can_rerun_test,),
}
