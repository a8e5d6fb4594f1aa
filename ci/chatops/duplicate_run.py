"""``python -m dspark_ci.ci.chatops.duplicate_run``: is this dispatched run a repeat of an earlier dispatch of the \
same command?

A dispatch whose answer GitHub lost is looked for before it is retried (``dspark_ci.ci.chatops.github``), but a run can
be listed later than any wait the dispatcher could afford, so the dispatch may happen twice. The command's identity
(``request``, shown in the run's title) closes it here, where it is certain: the first job of every workflow
ChatOps dispatches asks for the runs of that workflow carrying the same request, and a run that is not the first of
them (GitHub's run ids grow) does nothing: no GPU job, no reply update. Prints ``duplicate=true|false`` for
``$GITHUB_OUTPUT``; a run without a request (scheduled, manual) is never a duplicate. Exit 3 when GitHub cannot
answer: the workflow then runs nothing and its reply line says it failed.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta

from dspark_ci.ci.chatops.github import DEFAULT_API, GitHub
from dspark_ci.ci.tool import run_tool
from dspark_ci.ground.errors import BadInput

# How long before this run the first one may have been created: the dispatcher's retries span about a minute.
LOOK_BACK = timedelta(minutes=30)


def is_duplicate(github: GitHub, workflow: str, request: str, run_id: int) -> bool:
    if not request:
        return False
    since = github.run_created_at(run_id) - LOOK_BACK
    return any(other < run_id for other in github.runs_with_request(workflow, request, since))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dspark_ci.ci.chatops.duplicate_run",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True, metavar="OWNER/NAME")
    parser.add_argument("--workflow", required=True, help="this workflow's file name, e.g. rerun-test.yml")
    parser.add_argument("--request", default="", help="the run's request input (empty: not from ChatOps)")
    parser.add_argument("--run-id", type=int, required=True, help="this run ($GITHUB_RUN_ID)")
    args = parser.parse_args(argv)

    def body() -> int:
        if not args.request:
            print("duplicate=false")
            return 0
        token = os.environ.get("GITHUB_TOKEN")
        if not token:
            raise BadInput("GITHUB_TOKEN", "not set", "give the job's token (actions: read) in GITHUB_TOKEN")
        github = GitHub(token=token, repo=args.repo, api_url=os.environ.get("GITHUB_API_URL", DEFAULT_API))
        duplicate = is_duplicate(github, args.workflow, args.request, args.run_id)
        if duplicate:
            print(f"run {args.run_id} repeats an earlier dispatch of {args.request}: it does nothing", file=sys.stderr)
        print(f"duplicate={'true' if duplicate else 'false'}")
        return 0

    return run_tool("dspark_ci.ci.chatops.duplicate_run", body)


if __name__ == "__main__":
    sys.exit(main())
