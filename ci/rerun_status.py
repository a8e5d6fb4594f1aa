"""``python -m ci.rerun_status``: move one runner group's line of a /rerun-test reply to a new status.

Called by rerun-test.yml: ``--status running`` when a runner picks the job up, then ``success`` or
``failure`` when it ends. The text change itself is ``ci.reply.set_status``; a finished line is
never changed again, so a late or repeated call is harmless.
"""

from __future__ import annotations

import argparse
import os
import sys

from ci.github import DEFAULT_API, GitHub
from ci.reply import STATUS_ICONS, set_status
from ci.tool import run_tool
from ground.errors import BadInput


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.rerun_status", description=__doc__.splitlines()[0])
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
        old = github.comment_body(args.comment_id)
        new = set_status(old, args.marker, args.status, args.run_url)
        if new != old:
            github.edit_comment(args.comment_id, new)
        return 0

    return run_tool("ci.rerun_status", body)


if __name__ == "__main__":
    sys.exit(main())
