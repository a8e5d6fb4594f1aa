"""``dspark-ci chatops``: a PR comment -> reply comment (markdown) + dispatch plan (JSON)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ci.chatops.handle import (DEFAULT_MATRICES, ChatOpsConfig, GitHubContext, OfflineContext, Outcome, execute,
                        execution_summary, handle)
from ci.chatops.event import event_from_flags, load_event
from ci.chatops.github import DEFAULT_API, GitHub
from ci.chatops.permissions import DEFAULT_PERMISSIONS, load_permissions
from ground.errors import BadInput, ExitCode


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
                        help="the PR head the tree under --repo-root is (the rerun runs exactly this commit; "
                             "without it, asked of GitHub at command time)")
    parser.add_argument("--matrix", action="append", metavar="MATRIX",
                        help=f"where `/rerun-test cell:PATTERN` finds cells (default {' '.join(DEFAULT_MATRICES)})")
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="text: reply then plan; json: {\"reply\", \"plan\", \"dry_run\"}")
    parser.add_argument("--dry-run", action="store_true",
                        help="print what would be posted and dispatched; call nothing")


def run(args) -> int:
    if args.comment is not None and not args.user:
        raise BadInput("--comment", "needs --user LOGIN (who wrote the comment)")
    token = os.environ.get("GITHUB_TOKEN")
    if not args.dry_run and not token:
        raise BadInput("GITHUB_TOKEN", "not set, so nothing can be dispatched",
                       "set GITHUB_TOKEN to a token that may dispatch workflows and comment, or pass --dry-run")
    event = load_event(args.event) if args.event else event_from_flags(
        args.comment, args.user, args.author_association, args.pr_author, args.pr, args.repo)
    permissions = args.permissions or DEFAULT_PERMISSIONS
    shown = str(args.permissions) if args.permissions else "ci/chatops/permissions.json"
    config = ChatOpsConfig(repo_root=args.repo_root, users=load_permissions(permissions, shown), ref=args.ref,
                           matrices=tuple(args.matrix or DEFAULT_MATRICES))
    if args.dry_run:
        outcome = handle(event, config, OfflineContext(event.author_association, args.head_sha))
    else:
        github = _github(token, event, args)
        outcome = handle(event, config, GitHubContext(github, event.pr_number, args.head_sha))
        done = execute(outcome, event, github)
    _print(outcome, args.format, args.dry_run)
    if outcome.problem:
        where = str(args.event) if args.event else "--comment"
        print(f"dspark-ci chatops: {where}: {outcome.problem}", file=sys.stderr)
    if not args.dry_run:
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
    return GitHub(token=token, repo=event.repo, api_url=os.environ.get("GITHUB_API_URL", DEFAULT_API))


def _print(outcome: Outcome, fmt: str, dry_run: bool) -> None:
    if fmt == "json":
        print(json.dumps({"reply": outcome.reply, "plan": outcome.plan, "dry_run": dry_run}, indent=2,
                         ensure_ascii=False))
        return
    print(outcome.reply)
    print(f"Dispatch plan{' (dry run: nothing dispatched)' if dry_run else ''}:")
    print(json.dumps(outcome.plan, indent=2, ensure_ascii=False))
