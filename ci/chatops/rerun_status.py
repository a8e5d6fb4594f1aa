"""``python -m dspark_ci.ci.chatops.rerun_status``: move one runner group's line of a /rerun-test reply to a new status.

Called by rerun-test.yml: ``--status running`` when a runner picks the job up, then ``success`` or
``failure`` when it ends (and by ``dspark-ci chatops`` for a group whose dispatch failed). The text
change itself is ``dspark_ci.ci.chatops.reply.set_status``; a finished line is never changed again, so a late or
repeated call is harmless.

Several groups edit the same comment, and GitHub offers no conditional update of a comment (no
If-Match on PATCH), so a plain read-modify-write loses a line when two groups finish together. Each
update is therefore a merge that is verified: read, change only our line, write, wait a short
randomised settle time, read again, and redo the merge while our line does not show our status (or a
later one). A writer that overwrote another group's line with a stale body does not undo it for good:
the other writer's verification sees its line gone and writes it again. Bounded in attempts.
"""

from __future__ import annotations

import argparse
import os
import sys

import tenacity
from dspark_ci.ci.chatops.github import DEFAULT_API, GitHub
from dspark_ci.ci.chatops.reply import STATUS_ICONS, TERMINAL, line_status, set_status
from dspark_ci.ci.tool import run_tool
from dspark_ci.ground.errors import BadInput, InfraError

UPDATE_ATTEMPTS = 8
SETTLE_SECONDS = 1.0  # between our write and the read that verifies it (randomised up to twice this)


def update_status(github: GitHub, comment_id: int, marker: str, status: str, run_url: str | None = None,
                  text: str | None = None, settle_seconds: float = SETTLE_SECONDS) -> None:
    """Make the line carrying ``marker`` show ``status`` (or a later one), surviving concurrent writers."""

    def merge_once() -> bool:  # True: the comment shows it
        old = github.comment_body(comment_id)
        current = line_status(old, marker)
        if current is None:
            raise InfraError(f"comment {comment_id} has no line {marker} (was the reply edited by hand?)")
        if current == status or current in TERMINAL:
            return True
        github.edit_comment(comment_id, set_status(old, marker, status, run_url, text))
        return False

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(UPDATE_ATTEMPTS),
        retry=tenacity.retry_if_result(lambda shown: not shown),
        wait=tenacity.wait_random(settle_seconds, 2 * settle_seconds),
        retry_error_callback=lambda state: False)
    if not retrying(merge_once):
        raise InfraError(f"comment {comment_id}: line {marker} still not {status} after {UPDATE_ATTEMPTS} "
                         "verified writes (something else keeps rewriting the reply)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dspark_ci.ci.chatops.rerun_status",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True, metavar="OWNER/NAME")
    parser.add_argument("--comment-id", type=int, required=True)
    parser.add_argument("--marker", required=True, help="the group's marker, e.g. <!--rrt:0-->")
    parser.add_argument("--status", required=True, choices=[s for s in STATUS_ICONS if s != "queued"])
    parser.add_argument("--run-url", help="link the line to this workflow run")
    args = parser.parse_args(argv)

    def body() -> int:
        token = os.environ.get("GITHUB_TOKEN")
        if not token:
            raise BadInput("GITHUB_TOKEN", "not set", "give the job's token (issues: write) in GITHUB_TOKEN")
        github = GitHub(token=token, repo=args.repo, api_url=os.environ.get("GITHUB_API_URL", DEFAULT_API))
        update_status(github, args.comment_id, args.marker, args.status, args.run_url)
        return 0

    return run_tool("dspark_ci.ci.chatops.rerun_status", body)


if __name__ == "__main__":
    sys.exit(main())
