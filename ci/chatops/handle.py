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
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from difflib import get_close_matches
from pathlib import Path
from typing import Protocol

from dspark_ci.ci.chatops import grammar, permissions
from dspark_ci.ci.chatops.event import CommentEvent
from dspark_ci.ci.chatops.fleet import load_fleet
from dspark_ci.ci.chatops.github import ACCEPTED_MARKER, GitHub, HeadAt, PullHead
from dspark_ci.ci.chatops.grammar import (
    MAX_STARTS,
    Command,
    CommentRejected,
    NotACommand,
    bisect_arguments,
    no_arguments,
    split_command,
    test_arguments,
)
from dspark_ci.ci.chatops.permissions import Commenter, Permission, UserPermissions, refusal
from dspark_ci.ci.chatops.reply import REFUSED, group_by_runner, render_groups, render_refusals
from dspark_ci.ci.chatops.rerun_status import update_status
from dspark_ci.ci.chatops.resolve_test_paths import Deadline, ResolvedTest, TreeRefused, resolve_specs, scan_tree
from dspark_ci.ci.chatops.text import shown
from dspark_ci.ground.errors import BadInput, DsparkError, ExitCode
from dspark_ci.matrices import Cell, load_cells
from dspark_ci.reports.metrics import HIGHER, LOWER, METRICS

RERUN_WORKFLOW = "rerun-test.yml"
NIGHTLY_WORKFLOW = "nightly.yml"
BISECT_WORKFLOW = "bisect.yml"
RUN_CI_LABEL = "run-ci"
NOTHING_DISPATCHED = "Nothing was dispatched: fix the tests above and comment again."
DEFAULT_MATRICES = ("matrices/nightly.yaml", "matrices/pd.yaml")  # the nightly's (ci/workflows NIGHTLY_MATRICES)
# Offline (--dry-run) only: the association given on the command line stands in for the API's answer.
OFFLINE_WRITE_ASSOCIATIONS = frozenset({"OWNER", "MEMBER", "COLLABORATOR"})


class Context(Protocol):
    @property
    def verifies_head(self) -> bool: ...  # False only offline: no GitHub to ask what the head was

    def permission(self, login: str) -> str: ...
    def last_accepted(self, login: str, since: datetime) -> datetime | None: ...
    def pr_head(self) -> PullHead: ...
    def head_at(self, head: PullHead, moment: datetime) -> HeadAt: ...


@dataclass(frozen=True)
class OfflineContext:
    """What --dry-run knows without GitHub: the flags (or the event's association, as a stand-in)."""

    association: str
    sha: str = ""
    verifies_head: bool = False

    def permission(self, login: str) -> str:
        return "write" if self.association.upper() in OFFLINE_WRITE_ASSOCIATIONS else "read"

    def last_accepted(self, login: str, since: datetime) -> datetime | None:
        return None

    def pr_head(self) -> PullHead:
        return PullHead(self.sha)

    def head_at(self, head: PullHead, moment: datetime) -> HeadAt:
        return HeadAt(None, "offline: nothing to ask")


@dataclass
class GitHubContext:
    """The repository's answers: collaborator permission, PR head now, cooldown history."""

    github: GitHub
    pr: int
    verifies_head: bool = True

    def permission(self, login: str) -> str:
        return self.github.permission(login)

    def last_accepted(self, login: str, since: datetime) -> datetime | None:
        return self.github.last_accepted(self.pr, login, since)

    def pr_head(self) -> PullHead:
        return self.github.pr_head(self.pr)

    def head_at(self, head: PullHead, moment: datetime) -> HeadAt:
        return self.github.head_at(head, moment)


@dataclass(frozen=True)
class ChatOpsConfig:
    repo_root: Path  # an SGLang checkout: test/registered/** is searched here
    users: Mapping[str, UserPermissions]
    ref: str = "main"  # the branch the rerun workflow is dispatched on (its trusted definition)
    workflow: str = RERUN_WORKFLOW
    matrices: tuple[str, ...] = DEFAULT_MATRICES  # where `/rerun-test cell:...` finds cells
    tree_sha: str = ""  # the commit checked out at repo_root (--head-sha): what was resolved, and what runs
    fleet: frozenset[str] = field(default_factory=load_fleet)  # runner labels a rerun may be dispatched to
    now: Callable[[], datetime] = field(default=lambda: datetime.now(timezone.utc))


@dataclass(frozen=True)
class Outcome:
    reply: str  # markdown, as it would be posted ("" : no reply at all)
    plan: dict  # {"command", "user", "repo", "pr", "actions": [...]}
    exit_code: ExitCode
    problem: str | None = None  # one line for stderr when the comment was refused
    accepted: bool = False  # the command will run (a reply with plan actions)


def request_id(event: CommentEvent) -> str:
    """The command's identity, carried by every write it makes (reply marker, dispatch ``request`` input)."""
    return f"c{event.comment_id}" if event.comment_id is not None else f"u{uuid.uuid4().hex[:12]}"


def handle(event: CommentEvent, config: ChatOpsConfig, context: Context) -> Outcome:
    plan: dict = {"command": None, "user": event.user, "repo": event.repo, "pr": event.pr_number,
            "request": request_id(event), "actions": []}
    if event.ignored:  # edited, deleted, or a bot's: never a command, and nothing is said
        return Outcome("", plan, ExitCode.BAD_INPUT, f"ignored: {event.ignored}")
    try:
        name, args = split_command(event.body, tuple(COMMANDS))
    except NotACommand as err:
        # Never echo the comment: a did-you-mean names only our own command; anything else gets silence.
        return Outcome(render_refusals(err.refusals) if err.suggestion else "", plan, ExitCode.BAD_INPUT, str(err))
    plan["command"] = name
    row = COMMANDS[name]
    user = config.users.get(event.user, UserPermissions())
    cooldown = user.cooldown_interval_minutes or 0
    now = config.now()
    commenter = Commenter(
        event.user, context.permission(event.user), event.pr_author == event.user,
        last_accepted=context.last_accepted(event.user, now - timedelta(minutes=cooldown))
        if row.permission.cooldown and cooldown > 0 else None,
        now=now)
    why_not = refusal(row.permission, commenter, config.users)
    if why_not:
        return _refused(event, plan, name, why_not)
    try:
        command = row.parse(name, args)
    except CommentRejected as err:
        return _rejected(plan, err.refusals, str(err))
    outcome = row.run(command, event, config, context, plan)
    if outcome.accepted:  # cooldowns count from this marker
        outcome = Outcome(outcome.reply + ACCEPTED_MARKER.format(login=event.user) + "\n", outcome.plan,
                          outcome.exit_code, outcome.problem, True)
    return outcome


def _refused(event: CommentEvent, plan: dict, name: str, why_not: str) -> Outcome:
    # The commenter's own login (GitHub's, not their text) is the only mention a reply ever holds.
    return Outcome(f"{REFUSED} @{event.user}: {why_not}\n", plan, ExitCode.FELL_SHORT,
                   f"{name} refused for {event.user}: {why_not}")


def _rejected(plan: dict, refusals: list, problem: str) -> Outcome:
    footer = NOTHING_DISPATCHED if plan["command"] == grammar.RERUN_TEST else ""
    return Outcome(render_refusals(refusals, footer), plan, ExitCode.BAD_INPUT, shown(problem, 2000))


def _head_moved(head: PullHead, event: CommentEvent, config: ChatOpsConfig, context: Context) -> str | None:
    """Why the PR head cannot be taken as the commit the commenter reviewed (None: it can).

    Commits are compared, never clocks: the head now must be the head when the comment was written, and a
    head that cannot be known (no comment time, no listing, a push in the comment's second) is refused."""
    if config.tree_sha and head.sha != config.tree_sha:
        return (f"the PR head moved while this command was handled (resolved against {config.tree_sha[:12]}, "
                f"the head is now {head.sha[:12]}). Review the new commits and comment again.")
    if not context.verifies_head:
        return None
    if event.created_at is None:
        return ("the event does not say when your comment was written, so the commit you reviewed cannot be "
                "known. Comment again.")
    reviewed = context.head_at(head, event.created_at)
    if reviewed.sha is None:
        return f"the commit you reviewed cannot be known: {reviewed.why}. Review the head and comment again."
    if reviewed.sha != head.sha:
        return (f"commits were pushed to this PR after your comment: its head was {reviewed.sha[:12]} when you "
                f"commented and is {head.sha[:12]} now, and nothing runs code you have not seen. Review the new "
                "head and comment again.")
    return None


def _rerun_test(command, event: CommentEvent, config: ChatOpsConfig, context: Context, plan: dict) -> Outcome:
    file_specs = tuple(spec for spec in command.specs if not spec.cell)
    cell_specs = [spec for spec in command.specs if spec.cell]
    # Cells first: they are cheap to list, and what is left of the one cap bounds the file search.
    cells, refusals = _resolve_cells(cell_specs, config) if cell_specs else ([], [])
    refusals = _with_file_hints(refusals, cell_specs, config) if refusals else refusals
    if len(cells) > MAX_STARTS:
        return _rejected(plan, [(None, f"the cells named match {len(cells)} matrix cells; at most {MAX_STARTS} "
                                       "tests and matrix cells run per comment: narrow the pattern")],
                         f"{len(cells)} cells matched (cap {MAX_STARTS})")
    resolved: list[ResolvedTest] = []
    if file_specs:
        if not (config.repo_root / "test").is_dir() and not (config.repo_root / "test").is_symlink():
            raise BadInput("--repo-root", f"{config.repo_root} has no test/registered/ folder",
                           "pass the root of the SGLang checkout the PR is about")
        deadline = Deadline()
        try:
            tree = scan_tree(config.repo_root, deadline)
            resolved, file_refusals = resolve_specs(file_specs, tree, MAX_STARTS - len(cells), deadline)
        except TreeRefused as err:
            return _rejected(plan, [(None, str(err))], str(err))
        refusals = file_refusals + refusals
    # All or nothing: a half-dispatched rerun reads too easily as the whole request.
    if refusals:
        return _rejected(plan, refusals, f"{len(refusals)} of {len(command.specs)} tests refused: "
                         + "; ".join(f"{spec}: {why}" if spec else why for spec, why in refusals))
    groups = group_by_runner(resolved)
    strays = _outside_fleet(groups, config.fleet)
    if strays:
        return _rejected(plan, strays, "; ".join(f"{spec}: {why}" for spec, why in strays))
    ref = event.default_branch or config.ref
    sha = ""
    if groups:  # PR code will run: exactly the commit the commenter saw
        head = context.pr_head()
        moved = _head_moved(head, event, config, context)
        if moved:
            return _refused(event, plan, command.name, moved)
        sha = head.sha
    request = plan["request"]
    plan["actions"] = [{
        "type": "workflow_dispatch", "workflow": config.workflow, "ref": ref,
        "inputs": {"runner": group.runner, "backend": group.backend, "tests": group.tests_json,
                   "pr": _text(event.pr_number), "sha": sha, "reply_comment_id": "", "reply_marker": group.marker,
                   "request": f"{request}-{group.index}"},
    } for group in groups]
    reply = render_groups(groups) if groups else ""
    if cells:
        marker = f"<!--rrt:{len(groups)}-->"
        trials = {"trials": str(command.trials)} if command.trials else {}
        plan["actions"].append({"type": "workflow_dispatch", "workflow": NIGHTLY_WORKFLOW, "ref": ref,
                                "inputs": {"select": " ".join(cell.id for cell in cells), "reply_comment_id": "",
                                           "reply_marker": marker, "request": f"{request}-{len(groups)}", **trials}})
        reply += _cells_block(cells, marker, command.trials)
    return Outcome(reply, plan, ExitCode.OK, accepted=True)


def _resolve_cells(specs, config: ChatOpsConfig) -> tuple[list[Cell], list[tuple[str | None, str]]]:
    known = load_cells(list(config.matrices))
    ids = [cell.id for cell in known]
    chosen: dict[str, Cell] = {}
    refusals: list[tuple[str | None, str]] = []
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


def _outside_fleet(groups: list, fleet: frozenset[str]) -> list[tuple[str | None, str]]:
    """(test, why) for each test whose runner label no runner of ours carries: its job would wait forever."""
    known = ", ".join(sorted(fleet))
    return [(test.spec, f"needs runner {group.runner}, which is not in our fleet ({known}): "
                        "fix the runner_config or suite of its register_*_ci call")
            for group in groups if group.runner not in fleet for test in group.tests]


def _with_file_hints(refusals: list, cell_specs: list, config: ChatOpsConfig) -> list:
    """A name that is no cell but is a test file without its ``.py`` (``test_dflash``): name the file, so
    the commenter is not left guessing what to type."""
    try:
        tree = scan_tree(config.repo_root)
    except TreeRefused:
        return refusals
    specs = {spec.text: spec for spec in cell_specs}
    hinted = []
    for text, why in refusals:
        spec = specs.get(text)
        files = [f for f in tree.test_files if spec and fnmatch.fnmatchcase(f.rsplit("/", 1)[-1],
                                                                            spec.file_part + ".py")]
        hinted.append((text, f"no matrix cell named {spec.file_part}; the test file test/{files[0]} exists: "
                             f"/rerun-test {files[0].rsplit('/', 1)[-1]}") if spec and files else (text, why))
    return hinted


def _cells_block(cells: list[Cell], marker: str, trials: int | None = None) -> str:
    runners = ", ".join(f"`{r}`" for r in sorted({cell.runner for cell in cells}))
    boots = f" --max-boots {trials}" if trials else ""
    lines = "\n".join(f"dspark-ci run {cell.matrix} --cell {cell.id}{boots}" for cell in cells)
    count = len(cells)
    verdict = (f"up to {trials} boots each; the reply links the run, whose report gives each gate's statistical "
               "verdict (passed | regressed | inconclusive) with its effect and interval, not a pass/fail\n"
               if trials else "")
    return (f"\n🚀 matrix cell{'s' if count != 1 else ''} on {runners} ({count}): ⏳ queued on "
            f"{NIGHTLY_WORKFLOW} {marker}\n{verdict}```\n{lines}\n```\n")


def _bisect(command, event: CommentEvent, config: ChatOpsConfig, context: Context, plan: dict) -> Outcome:
    """One cell, one metric, GOOD..BAD: dispatched to bisect.yml on the cell's runner, pinned to the PR head the
    command was given for (as /rerun-test is)."""
    request = command.bisect
    matches = [cell for cell in load_cells(list(config.matrices)) if fnmatch.fnmatchcase(cell.id, request.cell)]
    if len(matches) != 1:
        why = (f"matches {len(matches)} cells "
               f"({', '.join(c.id for c in matches[:3])}{' ...' if len(matches) > 3 else ''})"
               if matches else "matches no matrix cell")
        return _rejected(plan, [(request.cell, f"{why}: /bisect chases exactly one cell")], f"{request.cell}: {why}")
    metric_problem = bisect_metric_problem(request.metric)
    if metric_problem:
        return _rejected(plan, [(request.metric, metric_problem)], metric_problem)
    head = context.pr_head()  # pinned as /rerun-test is: the commit the commenter saw, or refused
    moved = _head_moved(head, event, config, context)
    if moved:
        return _refused(event, plan, command.name, moved)
    cell, marker = matches[0], "<!--rrt:0-->"
    plan["actions"] = [{"type": "workflow_dispatch", "workflow": BISECT_WORKFLOW,
                        "ref": event.default_branch or config.ref,
                        "inputs": {"runner": cell.runner, "matrix": cell.matrix, "cell": cell.id,
                                   "metric": request.metric, "good": request.good, "bad": request.bad,
                                   "pr": _text(event.pr_number), "sha": head.sha, "reply_comment_id": "",
                                   "reply_marker": marker, "request": f"{plan['request']}-0"}}]
    line = (f"dspark-ci bisect {cell.matrix} --cell {cell.id} --metric {request.metric} --builds-file builds.txt "
            f"--launcher docker --server sglang --image-template IMAGE_TEMPLATE")
    reply = (f"🔎 bisect of `{cell.id}` ({request.metric}) over `{request.good}`..`{request.bad}` on `{cell.runner}`: "
             f"⏳ queued on {BISECT_WORKFLOW} {marker}\nEach build is judged by the gates' statistical verdict "
             f"(more runs while inconclusive), the culprit confirmed by an A/B against its parent.\n```\n{line}\n```\n")
    return Outcome(reply, plan, ExitCode.OK, accepted=True)


def bisect_metric_problem(metric: str) -> str | None:
    if metric == "failure" or (metric in METRICS and METRICS[metric].better in (HIGHER, LOWER)):
        return None
    return f"{metric} is not a metric with a better direction (e.g. tpot_ms_median, accept_length) nor failure"


def _tag(command, event: CommentEvent, config: ChatOpsConfig, context: Context, plan: dict) -> Outcome:
    says = f"🏷️ Added the `{RUN_CI_LABEL}` label: CI will run on this PR."
    plan["actions"] = [{"type": "add_label", "label": RUN_CI_LABEL, "says": says}]
    return Outcome(says + "\n", plan, ExitCode.OK, accepted=True)


def _rerun_failed(command, event: CommentEvent, config: ChatOpsConfig, context: Context, plan: dict) -> Outcome:
    says = "🔁 Rerunning the failed jobs (and skipped runs) of this PR's latest CI."
    plan["actions"] = [{"type": "rerun_failed_runs", "says": says}]
    return Outcome(says + "\n", plan, ExitCode.OK, accepted=True)


def _tag_and_rerun(command, event: CommentEvent, config: ChatOpsConfig, context: Context, plan: dict) -> Outcome:
    tagged = _tag(command, event, config, context, dict(plan))
    rerun = _rerun_failed(command, event, config, context, dict(plan))
    plan["actions"] = tagged.plan["actions"] + rerun.plan["actions"]
    return Outcome(tagged.reply + "\n" + rerun.reply, plan, ExitCode.OK, accepted=True)


Handler = Callable[[Command, CommentEvent, ChatOpsConfig, Context, dict], Outcome]


@dataclass(frozen=True)
class ChatOpsCommand:
    """One command, whole: adding a command is adding one of these to COMMANDS."""

    name: str  # what the comment's first line starts with
    parse: Callable[[str, list[str]], Command]  # its grammar (dspark_ci.ci.chatops.grammar), after the permission check
    permission: Permission  # who may run it (dspark_ci.ci.chatops.permissions)
    run: Handler  # what it does: the reply and the plan


# In this order in the "must be one of" message.
COMMANDS: Mapping[str, ChatOpsCommand] = {row.name: row for row in (
    ChatOpsCommand(grammar.TAG_RUN_CI_LABEL, no_arguments, permissions.TAG_RUN_CI, _tag),
    ChatOpsCommand(grammar.TAG_AND_RERUN_CI, no_arguments, permissions.TAG_AND_RERUN, _tag_and_rerun),
    ChatOpsCommand(grammar.RERUN_FAILED_CI, no_arguments, permissions.RERUN_FAILED, _rerun_failed),
    ChatOpsCommand(grammar.RERUN_TEST, test_arguments, permissions.GPU_RUNNERS, _rerun_test),
    ChatOpsCommand(grammar.BISECT, bisect_arguments, permissions.GPU_RUNNERS, _bisect),
)}


def _text(value) -> str:
    return "" if value is None else str(value)


@dataclass
class Execution:
    """What ``execute`` did: ``done`` and ``failed`` as (what, why) lines; ``warnings`` for cosmetic calls."""

    done: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def execute(outcome: Outcome, event: CommentEvent, github: GitHub) -> Execution:
    """React to the comment, carry the plan's actions out, and post the reply: each write at most once.

    A comment that gets no reply (not a command of ours, an ignored event) gets nothing at all, not even
    a reaction. The reaction is cosmetic: its failure is a warning. Every other action is attempted even
    when one before it failed, and the reply says only what happened: an action that failed is replaced
    by a line saying so, a group that was never dispatched is marked so (or corrected in a second comment),
    never left "queued". A reply that cannot be posted dispatches nothing and takes its 👍 back.
    """
    result = Execution()
    if not outcome.reply:
        return result
    pr, request = event.pr_number, outcome.plan["request"]
    if pr is None:
        raise BadInput("--pr", "no pull request to reply to", "pass --pr N or --dry-run")
    reaction = "accepted" if outcome.accepted else "refused"
    _react(github, event, reaction, result)
    actions = outcome.plan["actions"]
    dispatches = [action for action in actions if action["type"] == "workflow_dispatch"]
    # Labels and reruns before the reply, so it never claims what failed; dispatches after it,
    # because the rerun workflow edits that reply in place and needs its id.
    reply = _carry_out_pr_actions(github, pr, [a for a in actions if a not in dispatches], outcome.reply, result)
    try:
        reply_id = github.post_reply(pr, reply, request, since=event.created_at)
    except DsparkError as err:
        result.failed.append(("reply", str(err)))
        _unreact(github, event, reaction, result)  # a 👍 with no reply would say the command was taken
        return result
    for action in dispatches:
        _dispatch(github, event, request, reply_id, action, result)
    return result


def _react(github: GitHub, event: CommentEvent, reaction: str, result: Execution, add: bool = True) -> None:
    """Add (or take back) our reaction on the comment; a failure is a warning, never the command's outcome."""
    if event.comment_id is None:
        return
    try:
        (github.react if add else github.unreact)(event.comment_id, reaction)
    except DsparkError as err:
        result.warnings.append(f"reaction not {'added' if add else 'removed'}: {err}")


def _unreact(github: GitHub, event: CommentEvent, reaction: str, result: Execution) -> None:
    _react(github, event, reaction, result, add=False)


def _carry_out_pr_actions(github: GitHub, pr: int, actions: list[dict], reply: str, result: Execution) -> str:
    """Carry out labels and reruns; the reply with each failed one's line replaced by a line saying so."""
    for action in actions:
        try:
            _PR_ACTIONS[action["type"]](github, pr, action)
            result.done.append(action["type"])
        except DsparkError as err:
            result.failed.append((action["type"], str(err)))
            reply = reply.replace(action["says"], f"⚠️ {action['type'].replace('_', ' ')} failed: GitHub did "
                                  "not accept it; comment again.")
    return reply


def _dispatch(github: GitHub, event: CommentEvent, request: str, reply_id: int, action: dict,
              result: Execution) -> None:
    marker = action["inputs"]["reply_marker"]
    inputs = {**action["inputs"], "reply_comment_id": str(reply_id)}  # the run moves its line of this reply
    try:
        github.dispatch_workflow(action["workflow"], action["ref"], inputs)
        result.done.append(f"dispatch {marker}")
    except DsparkError as err:
        result.failed.append((f"dispatch {marker}", str(err)))
        _say_not_dispatched(github, event, request, reply_id, action, result)


def _say_not_dispatched(github: GitHub, event: CommentEvent, request: str, reply_id: int, action: dict,
                        result: Execution) -> None:
    """Mark the group's line "not dispatched"; when the reply cannot be edited, post a correction under it."""
    marker = action["inputs"]["reply_marker"]
    try:
        update_status(github, reply_id, marker, "not_dispatched",
                      text="not dispatched: GitHub refused the dispatch; comment again")
        return
    except DsparkError as err:
        result.warnings.append(f"could not mark {marker} as not dispatched: {err}")
    what = f"`{action['inputs']['runner']}`" if action["inputs"].get("runner") else action["workflow"]
    correction = (f"⚠️ Correction to the reply above: {what} was **not dispatched** (GitHub refused the dispatch, "
                  "and the reply could not be edited); nothing runs for it. Comment again.\n")
    index = marker.removeprefix("<!--rrt:").removesuffix("-->")
    try:
        github.post_reply(event.pr_number or 0, correction, f"{request}-undispatched-{index}", since=event.created_at)
    except DsparkError as err:
        result.warnings.append(f"could not post the correction for {marker}: {err}")


def execution_summary(result: Execution) -> str:
    return json.dumps({"done": result.done, "failed": [{"action": a, "error": e} for a, e in result.failed],
                       "warnings": result.warnings}, ensure_ascii=False)


# plan action type -> how it is carried out on the PR
_PR_ACTIONS = {
    "add_label": lambda github, pr, action: github.add_label(pr, action["label"]),
    "rerun_failed_runs": lambda github, pr, action: github.rerun_failed_runs(pr),
}
