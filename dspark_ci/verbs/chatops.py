"""``dspark-ci chatops``: a PR comment -> reply comment (markdown) + dispatch plan (JSON)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from dspark_ci.ci.chatops.decision import read_decision, write_decision
from dspark_ci.ci.chatops.event import event_from_flags, load_event
from dspark_ci.ci.chatops.fleet import load_fleet
from dspark_ci.ci.chatops.github import DEFAULT_API, DEFAULT_BOT_LOGIN, GitHub
from dspark_ci.ci.chatops.handle import (
    DEFAULT_MATRICES,
    ChatOpsConfig,
    Execution,
    GitHubContext,
    OfflineContext,
    Outcome,
    execute,
    execution_summary,
    handle,
)
from dspark_ci.ci.chatops.permissions import DEFAULT_PERMISSIONS, load_permissions
from dspark_ci.ground.errors import BadInput, ExitCode


def _pr_number(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a pull request number (a whole number from 1)")
    return int(text)


def add_arguments(parser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--event", type=Path, metavar="FILE",
                        help="GitHub issue_comment event payload (e.g. $GITHUB_EVENT_PATH)")
    source.add_argument("--comment", metavar="TEXT", help="the comment text (needs --user)")
    parser.add_argument("--user", metavar="LOGIN", help="who wrote --comment")
    parser.add_argument("--author-association", default="NONE", metavar="ASSOC",
                        help="with --dry-run only: stands in for the repository's permission check (OWNER, "
                             "MEMBER, COLLABORATOR count as write access; default NONE). Without --dry-run "
                             "write access is asked of GitHub's collaborator permission API")
    parser.add_argument("--pr-author", metavar="LOGIN", help="with --comment: who opened the PR")
    parser.add_argument("--pr", type=_pr_number, metavar="N", help="with --comment: the PR number")
    parser.add_argument("--repo", metavar="OWNER/NAME", default=os.environ.get("GITHUB_REPOSITORY"),
                        help="with --comment: the repository (default $GITHUB_REPOSITORY)")
    parser.add_argument("--repo-root", type=Path, default=Path("."), metavar="DIR",
                        help="SGLang checkout whose test/registered/ holds the tests (default .)")
    parser.add_argument("--permissions", type=Path, metavar="FILE",
                        help="CI permissions JSON (default ci/chatops/permissions.json)")
    parser.add_argument("--ref", default="main", metavar="BRANCH",
                        help="branch the rerun workflow is dispatched on, unless the event names the "
                             "repository's default branch (default main)")
    parser.add_argument("--head-sha", default="", metavar="SHA",
                        help="the commit checked out under --repo-root (the rerun runs exactly this commit, and "
                             "is refused when the PR head is no longer it; without it, the head GitHub names "
                             "when the command is handled)")
    parser.add_argument("--fleet", type=Path, metavar="FILE",
                        help="runner labels a rerun may be dispatched to, as {label: runners} (default "
                             "ci/nightly/fleet.json and the labels SGLang's CI maps its runner configs to; "
                             "ubuntu-latest is always known)")
    parser.add_argument("--bot-login", default=DEFAULT_BOT_LOGIN, metavar="LOGIN",
                        help="who GITHUB_TOKEN writes as: earlier replies and reactions are ours only when written "
                             f"by this login (default {DEFAULT_BOT_LOGIN})")
    parser.add_argument("--matrix", action="append", metavar="MATRIX",
                        help=f"where `/rerun-test cell:PATTERN` finds cells (default {' '.join(DEFAULT_MATRICES)})")
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="text: reply then plan; json: {\"reply\", \"plan\", \"dry_run\"}")
    parser.add_argument("--dry-run", action="store_true",
                        help="print what would be posted and dispatched; call nothing")
    split = parser.add_mutually_exclusive_group()
    split.add_argument("--decision-out", type=Path, metavar="FILE",
                       help="decide only (GitHub is read, never written) and write the decision to FILE; exit 0 "
                            "once it is written (the ChatOps workflow's read-only job that has the PR's tree)")
    split.add_argument("--carry-out", type=Path, metavar="FILE",
                       help="with --event: carry out the decision in FILE (checked first) and exit with its code "
                            "(the ChatOps workflow's writing job, which never sees PR files)")


def run(args) -> int:
    if args.comment is not None and not args.user:
        raise BadInput("--comment", "needs --user LOGIN (who wrote the comment)")
    if args.dry_run and (args.decision_out or args.carry_out):
        raise BadInput("--dry-run", "calls nothing, so it cannot decide for another job or carry a decision out")
    if args.carry_out and not args.event:
        raise BadInput("--carry-out", "needs --event: the decision is checked against the comment it is about")
    token = os.environ.get("GITHUB_TOKEN")
    if not args.dry_run and not token:
        raise BadInput("GITHUB_TOKEN", "not set, so nothing can be dispatched",
                       "set GITHUB_TOKEN to a token that may dispatch workflows and comment, or pass --dry-run")
    event = load_event(args.event) if args.event else event_from_flags(
        args.comment, args.user, args.author_association, args.pr_author, args.pr, args.repo)
    if args.dry_run:
        outcome = handle(event, _config(args), OfflineContext(event.author_association, args.head_sha))
        return _report(outcome, None, args)
    github = _github(token or "", event, args)
    if args.carry_out:
        outcome = read_decision(args.carry_out, event, load_fleet(args.fleet))
    else:
        outcome = handle(event, _config(args), GitHubContext(github, event.pr_number or 0))
    if args.decision_out:
        write_decision(args.decision_out, outcome)
        _report(outcome, None, args)
        return int(ExitCode.OK)
    return _report(outcome, execute(outcome, event, github), args)


def _config(args) -> ChatOpsConfig:
    permissions = args.permissions or DEFAULT_PERMISSIONS
    shown = str(args.permissions) if args.permissions else "ci/chatops/permissions.json"
    return ChatOpsConfig(repo_root=args.repo_root, users=load_permissions(permissions, shown), ref=args.ref,
                         matrices=tuple(args.matrix or DEFAULT_MATRICES), tree_sha=args.head_sha,
                         fleet=load_fleet(args.fleet))


def _report(outcome: Outcome, done: Execution | None, args) -> int:
    """Print the outcome (and what was carried out); the exit code."""
    _print(outcome, args.format, args.dry_run)
    if outcome.problem:
        where = str(args.event) if args.event else "--comment"
        print(f"dspark-ci chatops: {where}: {outcome.problem}", file=sys.stderr)
    if done is not None:
        for warning in done.warnings:
            print(f"dspark-ci chatops: warning: {warning}", file=sys.stderr)
        if done.failed:
            print(f"dspark-ci chatops: not everything was carried out: {execution_summary(done)}", file=sys.stderr)
            return int(ExitCode.INFRA)
    return int(outcome.exit_code)


def _github(token: str, event, args) -> GitHub:
    if not event.repo:
        raise BadInput("--repo", "no repository to dispatch in", "pass --repo OWNER/NAME or --dry-run")
    if event.pr_number is None:
        raise BadInput("--pr", "no pull request to reply to", "pass --pr N or --dry-run")
    return GitHub(token=token, repo=event.repo, api_url=os.environ.get("GITHUB_API_URL", DEFAULT_API),
                  bot_login=args.bot_login)


def _print(outcome: Outcome, fmt: str, dry_run: bool) -> None:
    if fmt == "json":
        print(json.dumps({"reply": outcome.reply, "plan": outcome.plan, "dry_run": dry_run}, indent=2,
                         ensure_ascii=False))
        return
    print(outcome.reply)
    print(f"Dispatch plan{' (dry run: nothing dispatched)' if dry_run else ''}:")
    print(json.dumps(outcome.plan, indent=2, ensure_ascii=False))
