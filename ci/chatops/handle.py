"""ChatOps: one PR comment in, a reply comment and a dispatch plan out.

``handle`` decides everything: it reads the command name, checks the commenter's permission (before
any argument is parsed or echoed), parses the arguments, resolves test files (or matrix cells) and
groups them by runner. What it needs to know about GitHub (the commenter's repository permission,
the PR head, the last accepted rerun for cooldowns) comes through a ``Context``: ``GitHubContext``
asks the API, ``OfflineContext`` (``--dry-run``) takes it from flags. ``execute`` then carries the
plan out against GitHub and returns what was done and what failed.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from difflib import get_close_matches
from pathlib import Path
from typing import Callable, Mapping, Protocol

from ci.chatops import commands
from ci.chatops.commands import CommentRejected, NotACommand, parse_arguments, split_command
from ci.chatops.event import CommentEvent
from ci.chatops.github import ACCEPTED_MARKER, GitHub
from ci.chatops.permissions import RERUN_COMMANDS, Commenter, UserPermissions, refusal
from ci.chatops.reply import REFUSED, group_by_runner, render_groups, render_refusals
from ci.chatops.rerun_status import update_status
from ci.chatops.resolve_test_paths import TreeRefused, resolve_specs, scan_tree
from ci.chatops.text import shown
from ground.errors import BadInput, DsparkError, ExitCode
from matrices import Cell, load_cells

RERUN_WORKFLOW = "rerun-test.yml"
NIGHTLY_WORKFLOW = "nightly.yml"
RUN_CI_LABEL = "run-ci"
NOTHING_DISPATCHED = "Nothing was dispatched: fix the tests above and comment again."
DEFAULT_MATRICES = ("matrices/nightly.yaml",)
# Offline (--dry-run) only: the association given on the command line stands in for the API's answer.
OFFLINE_WRITE_ASSOCIATIONS = frozenset({"OWNER", "MEMBER", "COLLABORATOR"})


class Context(Protocol):
    def permission(self, login: str) -> str: ...
    def last_accepted(self, login: str) -> datetime | None: ...
    def head_sha(self) -> str: ...


@dataclass(frozen=True)
class OfflineContext:
    """What --dry-run knows without GitHub: the flags (or the event's association, as a stand-in)."""

    association: str
    sha: str = ""

    def permission(self, login: str) -> str:
        return "write" if self.association.upper() in OFFLINE_WRITE_ASSOCIATIONS else "read"

    def last_accepted(self, login: str) -> datetime | None:
        return None

    def head_sha(self) -> str:
        return self.sha


@dataclass
class GitHubContext:
    """The repository's answers: collaborator permission, PR head at command time, cooldown history."""

    github: GitHub
    pr: int
    sha: str = ""  # the head the chatops workflow checked out (resolved against); asked for when empty

    def permission(self, login: str) -> str:
        return self.github.permission(login)

    def last_accepted(self, login: str) -> datetime | None:
        return self.github.last_accepted(self.pr, login)

    def head_sha(self) -> str:
        if not self.sha:
            self.sha = self.github.pr_head_sha(self.pr)
        return self.sha


@dataclass(frozen=True)
class ChatOpsConfig:
    repo_root: Path  # an SGLang checkout: test/registered/** is searched here
    users: Mapping[str, UserPermissions]
    ref: str = "main"  # the branch the rerun workflow is dispatched on (its trusted definition)
    workflow: str = RERUN_WORKFLOW
    matrices: tuple[str, ...] = DEFAULT_MATRICES  # where `/rerun-test cell:...` finds cells
    now: Callable[[], datetime] = field(default=lambda: datetime.now(timezone.utc))


@dataclass(frozen=True)
class Outcome:
    reply: str  # markdown, as it would be posted ("" : no reply at all)
    plan: dict  # {"command", "user", "repo", "pr", "actions": [...]}
    exit_code: ExitCode
    problem: str | None = None  # one line for stderr when the comment was refused
    accepted: bool = False  # the command will run (a reply with plan actions)


def handle(event: CommentEvent, config: ChatOpsConfig, context: Context) -> Outcome:
    plan = {"command": None, "user": event.user, "repo": event.repo, "pr": event.pr_number, "actions": []}
    try:
        name, args = split_command(event.body)
    except NotACommand as err:
        # Never echo the comment: a did-you-mean names only our own command; anything else gets silence.
        return Outcome(render_refusals(err.refusals) if err.suggestion else "", plan, ExitCode.BAD_INPUT, str(err))
    plan["command"] = name
    user = config.users.get(event.user, UserPermissions())
    commenter = Commenter(
        event.user, context.permission(event.user), event.pr_author == event.user,
        last_accepted=context.last_accepted(event.user)
        if name in RERUN_COMMANDS and (user.cooldown_interval_minutes or 0) > 0 else None,
        now=config.now())
    why_not = refusal(name, commenter, config.users)
    if why_not:
        # The commenter's own login (GitHub's, not their text) is the only mention a reply ever holds.
        return Outcome(f"{REFUSED} @{event.user}: {why_not}\n", plan, ExitCode.FELL_SHORT,
                       f"{name} refused for {event.user}: {why_not}")
    try:
        command = parse_arguments(name, args)
    except CommentRejected as err:
        return _rejected(plan, err.refusals, str(err))
    outcome = _HANDLERS[command.name](command, event, config, context, plan)
    if outcome.accepted:  # cooldowns count from this marker
        outcome = Outcome(outcome.reply + ACCEPTED_MARKER.format(login=event.user) + "\n", outcome.plan,
                          outcome.exit_code, outcome.problem, True)
    return outcome


def _rejected(plan: dict, refusals: list, problem: str) -> Outcome:
    footer = NOTHING_DISPATCHED if plan["command"] == commands.RERUN_TEST else ""
    return Outcome(render_refusals(refusals, footer), plan, ExitCode.BAD_INPUT, shown(problem, 2000))


def _rerun_test(command, event: CommentEvent, config: ChatOpsConfig, context: Context, plan: dict) -> Outcome:
    file_specs = tuple(spec for spec in command.specs if not spec.cell)
    cell_specs = [spec for spec in command.specs if spec.cell]
    resolved, refusals = [], []
    if file_specs:
        if not (config.repo_root / "test").is_dir() and not (config.repo_root / "test").is_symlink():
            raise BadInput("--repo-root", f"{config.repo_root} has no test/registered/ folder",
                           "pass the root of the SGLang checkout the PR is about")
        try:
            tree = scan_tree(config.repo_root)
        except TreeRefused as err:
            return _rejected(plan, [(None, str(err))], str(err))
        resolved, refusals = resolve_specs(file_specs, tree)
    cells, cell_refusals = _resolve_cells(cell_specs, config) if cell_specs else ([], [])
    refusals += cell_refusals
    # All or nothing: a half-dispatched rerun reads too easily as the whole request.
    if refusals:
        return _rejected(plan, refusals, f"{len(refusals)} of {len(command.specs)} tests refused: "
                         + "; ".join(f"{spec}: {why}" for spec, why in refusals))
    groups = group_by_runner(resolved)
    ref = event.default_branch or config.ref
    sha = context.head_sha() if groups else ""
    plan["actions"] = [{
        "type": "workflow_dispatch", "workflow": config.workflow, "ref": ref,
        "inputs": {"runner": group.runner, "backend": group.backend, "tests": group.tests_json,
                   "pr": _text(event.pr_number), "sha": sha, "reply_comment_id": "", "reply_marker": group.marker},
    } for group in groups]
    reply = render_groups(groups) if groups else ""
    if cells:
        marker = f"<!--rrt:{len(groups)}-->"
        plan["actions"].append({"type": "workflow_dispatch", "workflow": NIGHTLY_WORKFLOW, "ref": ref,
                                "inputs": {"select": " ".join(cell.id for cell in cells)},
                                "reply_marker": marker})
        reply += _cells_block(cells, marker)
    return Outcome(reply, plan, ExitCode.OK, accepted=True)


def _resolve_cells(specs, config: ChatOpsConfig) -> tuple[list[Cell], list[tuple[str, str]]]:
    known = load_cells(list(config.matrices))
    ids = [cell.id for cell in known]
    chosen: dict[str, Cell] = {}
    refusals = []
    for spec in specs:
        matches = [cell for cell in known if fnmatch.fnmatchcase(cell.id, spec.file_part)]
        if not matches:
            close = get_close_matches(spec.file_part, ids, n=3, cutoff=0.6)
            refusals.append((spec.text, f"no test file or matrix cell named {spec.file_part}"
                             + (f". Closest: {', '.join(close)}" if close else
                                " (test files end in .py; cells are listed by `dspark-ci plan " +
                                " ".join(config.matrices) + "`)")))
        chosen.update((cell.id, cell) for cell in matches)
    return list(chosen.values()), refusals


def _cells_block(cells: list[Cell], marker: str) -> str:
    runners = ", ".join(f"`{r}`" for r in sorted({cell.runner for cell in cells}))
    lines = "\n".join(f"dspark-ci run {cell.matrix} --cell {cell.id}" for cell in cells)
    count = len(cells)
    return (f"\n🚀 matrix cell{'s' if count != 1 else ''} on {runners} ({count}): ⏳ queued on "
            f"{NIGHTLY_WORKFLOW} {marker}\n```\n{lines}\n```\n")


def _tag(command, event: CommentEvent, config: ChatOpsConfig, context: Context, plan: dict) -> Outcome:
    plan["actions"] = [{"type": "add_label", "label": RUN_CI_LABEL}]
    return Outcome(f"🏷️ Added the `{RUN_CI_LABEL}` label: CI will run on this PR.\n", plan, ExitCode.OK,
                   accepted=True)


def _rerun_failed(command, event: CommentEvent, config: ChatOpsConfig, context: Context, plan: dict) -> Outcome:
    plan["actions"] = [{"type": "rerun_failed_runs"}]
    return Outcome("🔁 Rerunning the failed jobs (and skipped runs) of this PR's latest CI.\n", plan,
                   ExitCode.OK, accepted=True)


def _tag_and_rerun(command, event: CommentEvent, config: ChatOpsConfig, context: Context, plan: dict) -> Outcome:
    tagged = _tag(command, event, config, context, dict(plan))
    rerun = _rerun_failed(command, event, config, context, dict(plan))
    plan["actions"] = tagged.plan["actions"] + rerun.plan["actions"]
    return Outcome(tagged.reply + "\n" + rerun.reply, plan, ExitCode.OK, accepted=True)


_HANDLERS = {
    commands.RERUN_TEST: _rerun_test,
    commands.TAG_RUN_CI_LABEL: _tag,
    commands.RERUN_FAILED_CI: _rerun_failed,
    commands.TAG_AND_RERUN_CI: _tag_and_rerun,
}


def _text(value) -> str:
    return "" if value is None else str(value)


@dataclass
class Execution:
    """What ``execute`` did: ``done`` and ``failed`` as (what, why) lines; ``warnings`` for cosmetic calls."""

    done: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def execute(outcome: Outcome, event: CommentEvent, github: GitHub) -> Execution:
    """Post the reply, react to the comment, and carry the plan's actions out.

    The reaction is cosmetic: its failure is a warning. Every other action is attempted even when one
    before it failed, and the reply ends up saying which did not happen (a group that was never
    dispatched is marked so, never left "queued").
    """
    result = Execution()
    pr = event.pr_number
    if event.comment_id is not None:
        try:
            github.react(event.comment_id, "accepted" if outcome.accepted else "refused")
        except DsparkError as err:
            result.warnings.append(f"reaction not added: {err}")
    if not outcome.reply:
        return result
    actions = outcome.plan["actions"]
    dispatches = [action for action in actions if action["type"] == "workflow_dispatch"]
    # Labels and reruns first, so the reply never claims what failed; dispatches after the reply,
    # because the rerun workflow edits that reply in place and needs its id.
    notes = []
    for action in actions:
        if action in dispatches:
            continue
        try:
            _PR_ACTIONS[action["type"]](github, pr, action)
            result.done.append(action["type"])
        except DsparkError as err:
            result.failed.append((action["type"], str(err)))
            notes.append(f"⚠️ {action['type'].replace('_', ' ')} failed: GitHub did not accept it; comment again.")
    reply_id = github.post_comment(pr, outcome.reply + "".join(f"\n{note}\n" for note in notes))
    for action in dispatches:
        inputs = action["inputs"]
        marker = inputs.get("reply_marker") or action.get("reply_marker")
        if action["workflow"] == RERUN_WORKFLOW:
            inputs = {**inputs, "reply_comment_id": str(reply_id)}
        try:
            github.dispatch_workflow(action["workflow"], action["ref"], inputs)
            result.done.append(f"dispatch {marker}")
        except DsparkError as err:
            result.failed.append((f"dispatch {marker}", str(err)))
            try:
                update_status(github, reply_id, marker, "not_dispatched",
                              text="not dispatched: GitHub refused the dispatch; comment again")
            except DsparkError as edit_err:
                result.warnings.append(f"could not mark {marker} as not dispatched: {edit_err}")
    return result


def execution_summary(result: Execution) -> str:
    return json.dumps({"done": result.done, "failed": [{"action": a, "error": e} for a, e in result.failed],
                       "warnings": result.warnings}, ensure_ascii=False)


# plan action type -> how it is carried out on the PR
_PR_ACTIONS = {
    "add_label": lambda github, pr, action: github.add_label(pr, action["label"]),
    "rerun_failed_runs": lambda github, pr, action: github.rerun_failed_runs(pr),
}
