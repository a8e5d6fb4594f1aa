"""ChatOps: one PR comment in, a reply comment and a dispatch plan out.

``handle`` decides everything without touching the network: it parses the first line, checks the
commenter's permission, resolves test files and groups them by runner. ``execute`` then carries
the plan out against GitHub (only when the caller has a token and did not ask for a dry run).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ci import commands
from ci.commands import CommentRejected, parse_comment
from ci.event import CommentEvent
from ci.github import GitHub
from ci.permissions import Commenter, UserPermissions, refusal
from ci.reply import group_by_runner, render_groups, render_refusals
from ci.resolve import resolve_specs
from ground.errors import BadInput, ExitCode

RERUN_WORKFLOW = "rerun-test.yml"
RUN_CI_LABEL = "run-ci"
NOTHING_DISPATCHED = "Nothing was dispatched: fix the tests above and comment again."


@dataclass(frozen=True)
class ChatOpsConfig:
    repo_root: Path  # an SGLang checkout: test/registered/** is searched here
    users: Mapping[str, UserPermissions]
    ref: str = "main"  # the branch the rerun workflow is dispatched on (its trusted definition)
    workflow: str = RERUN_WORKFLOW


@dataclass(frozen=True)
class Outcome:
    reply: str  # markdown, as it would be posted
    plan: dict  # {"command", "user", "repo", "pr", "actions": [...]}
    exit_code: ExitCode
    problem: str | None = None  # one line for stderr when the comment was refused
    accepted: bool = False  # the command will run (a reply with plan actions)


def handle(event: CommentEvent, config: ChatOpsConfig) -> Outcome:
    plan = {"command": None, "user": event.user, "repo": event.repo, "pr": event.pr_number, "actions": []}
    try:
        command = parse_comment(event.body)
    except CommentRejected as err:
        plan["command"] = err.command
        return _rejected(plan, err.refusals, str(err))
    plan["command"] = command.name
    commenter = Commenter(event.user, event.author_association.upper(), event.pr_author == event.user)
    why_not = refusal(command.name, commenter, config.users)
    if why_not:
        return Outcome(render_refusals([(f"@{event.user}", why_not)]), plan, ExitCode.FELL_SHORT,
                       f"{command.name} refused for {event.user}: {why_not}")
    return _HANDLERS[command.name](command, event, config, plan)


def _rejected(plan: dict, refusals: list, problem: str) -> Outcome:
    footer = NOTHING_DISPATCHED if plan["command"] == commands.RERUN_TEST else ""
    return Outcome(render_refusals(refusals, footer), plan, ExitCode.BAD_INPUT, problem)


def _rerun_test(command, event: CommentEvent, config: ChatOpsConfig, plan: dict) -> Outcome:
    if not (config.repo_root / "test" / "registered").is_dir():
        raise BadInput("--repo-root", f"{config.repo_root} has no test/registered/ folder",
                       "pass the root of the SGLang checkout the PR is about")
    resolved, refusals = resolve_specs(command.specs, config.repo_root)
    # All or nothing: a half-dispatched rerun reads too easily as the whole request.
    if refusals:
        return _rejected(plan, refusals, f"{len(refusals)} of {len(command.specs)} tests refused: "
                         + "; ".join(f"{spec}: {why}" for spec, why in refusals))
    groups = group_by_runner(resolved)
    plan["actions"] = [{
        "type": "workflow_dispatch", "workflow": config.workflow, "ref": event.default_branch or config.ref,
        "inputs": {"runner": group.runner, "backend": group.backend, "test_command": group.test_command,
                   "pr": _text(event.pr_number), "reply_comment_id": "", "reply_marker": group.marker},
    } for group in groups]
    return Outcome(render_groups(groups), plan, ExitCode.OK, accepted=True)


def _tag(command, event: CommentEvent, config: ChatOpsConfig, plan: dict) -> Outcome:
    plan["actions"] = [{"type": "add_label", "label": RUN_CI_LABEL}]
    return Outcome(f"🏷️ Added the `{RUN_CI_LABEL}` label: CI will run on this PR.\n", plan, ExitCode.OK,
                   accepted=True)


def _rerun_failed(command, event: CommentEvent, config: ChatOpsConfig, plan: dict) -> Outcome:
    plan["actions"] = [{"type": "rerun_failed_runs"}]
    return Outcome("🔁 Rerunning the failed jobs (and skipped runs) of this PR's latest CI.\n", plan,
                   ExitCode.OK, accepted=True)


def _tag_and_rerun(command, event: CommentEvent, config: ChatOpsConfig, plan: dict) -> Outcome:
    tagged = _tag(command, event, config, dict(plan))
    rerun = _rerun_failed(command, event, config, dict(plan))
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


def execute(outcome: Outcome, event: CommentEvent, github: GitHub) -> None:
    """Post the reply, react to the comment, and carry the plan's actions out."""
    pr = event.pr_number
    if event.comment_id is not None:
        github.react(event.comment_id, "accepted" if outcome.accepted else "refused")
    actions = outcome.plan["actions"]
    dispatches = [action for action in actions if action["type"] == "workflow_dispatch"]
    # Labels and reruns first, so the reply never claims what failed; dispatches after the reply,
    # because the rerun workflow edits that reply in place and needs its id.
    for action in actions:
        if action not in dispatches:
            _PR_ACTIONS[action["type"]](github, pr, action)
    reply_id = github.post_comment(pr, outcome.reply)
    for action in dispatches:
        github.dispatch_workflow(action["workflow"], action["ref"],
                                 {**action["inputs"], "reply_comment_id": str(reply_id)})


# plan action type -> how it is carried out on the PR
_PR_ACTIONS = {
    "add_label": lambda github, pr, action: github.add_label(pr, action["label"]),
    "rerun_failed_runs": lambda github, pr, action: github.rerun_failed_runs(pr),
}
