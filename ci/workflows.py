"""The GitHub Actions workflows, as records; ``python -m ci.workflows`` writes .github/workflows/.

- ``nightly.yml``: plan -> one job per cell on the cell's runner label -> one merged report.
  Past 256 cells (GitHub's per-matrix limit) the plan is chunked and each chunk gets a run job.
- ``chatops.yml``: a PR comment starting with ``/`` -> ``dspark-ci chatops --event``.
- ``rerun-test.yml``: what ``/rerun-test`` dispatches, once per runner group.

``python -m ci.workflows --check`` exits 1 when the files on disk differ from what this module renders.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ci.matrix_outputs import MAX_CHUNKS, chunk_output_name
from ci.workflow_model import Job, Step, Workflow

WORKFLOW_DIR = Path(".github/workflows")
CHECKOUT, SETUP_PYTHON = "actions/checkout@v4", "actions/setup-python@v5"
UPLOAD, DOWNLOAD = "actions/upload-artifact@v4", "actions/download-artifact@v4"
HOSTED = "ubuntu-latest"
PYTHON = "3.11"
NIGHTLY_MATRIX = "matrices/nightly.yaml"
RUNS_DIR = "runs"


def _checkout(name: str = "Check out", **with_) -> Step:
    return Step(name, uses=CHECKOUT, with_={"persist-credentials": False, **with_})


def _install_on_hosted() -> list[Step]:
    return [Step("Set up Python", uses=SETUP_PYTHON, with_={"python-version": PYTHON}),
            Step("Install dspark-ci", run="python3 -m pip install -e .")]


# --- nightly ------------------------------------------------------------------------------------

def _plan_job() -> Job:
    plan = Step("Plan cells", id="plan", env={"SELECT": "${{ inputs.select }}"}, run=(
        'select_args=()\n'
        'if [ -n "$SELECT" ]; then select_args=(--select "$SELECT"); fi\n'
        f'dspark-ci plan {NIGHTLY_MATRIX} --format github "${{select_args[@]}}" > plan.json\n'
        'python3 -m ci.matrix_outputs plan.json >> "$GITHUB_OUTPUT"\n'))
    outputs = {"cells": "${{ steps.plan.outputs.cells }}", "chunks": "${{ steps.plan.outputs.chunks }}"}
    outputs |= {chunk_output_name(i): f"${{{{ steps.plan.outputs.{chunk_output_name(i)} }}}}"
                for i in range(MAX_CHUNKS)}
    keep_plan = Step("Keep the plan for the report", uses=UPLOAD,
                     with_={"name": "nightly-plan", "path": "plan.json", "retention-days": 14})
    return Job("plan", HOSTED, (_checkout(), *_install_on_hosted(), plan, keep_plan), name="Plan",
               outputs=outputs, timeout_minutes=15)


def _run_job(chunk: int) -> Job:
    output = chunk_output_name(chunk)
    run_dir = f"{RUNS_DIR}/${{{{ matrix.cell }}}}"
    steps = (
        _checkout(),
        Step("Install dspark-ci", run="python3 -m pip install -e ."),
        Step("Run the cell", env={"MATRIX": "${{ matrix.matrix }}", "CELL": "${{ matrix.cell }}",
                                  "HF_TOKEN": "${{ secrets.HF_TOKEN }}"},
             run=(
                 # Multi-node cells need the runner's Docker hosts inventory (DSPARK_HOSTS in its environment).
                 'hosts_args=()\n'
                 'if [ -n "${DSPARK_HOSTS:-}" ]; then hosts_args=(--hosts "$DSPARK_HOSTS"); fi\n'
                 f'dspark-ci run "$MATRIX" --cell "$CELL" --launcher docker --out "{RUNS_DIR}/$CELL" '
                 '--server sglang "${hosts_args[@]}"\n')),
        # A run that finishes writes its short report to the job summary itself (heading and overview once);
        # this step speaks only for a run that was stopped before it could.
        Step("Add the report to the job summary", if_="always()", env={"CELL": "${{ matrix.cell }}"}, run=(
            f'if [ ! -f "{RUNS_DIR}/$CELL/report.md" ]; then\n'
            '  echo "No report.md: the run stopped before writing one (see the log above)." >> "$GITHUB_STEP_SUMMARY"\n'
            f'elif grep -q \'"finished_at": null\' "{RUNS_DIR}/$CELL/results.json"; then\n'
            f'  cat "{RUNS_DIR}/$CELL/report.md" >> "$GITHUB_STEP_SUMMARY"\n'
            'fi\n')),
        Step("Upload the run directory", if_="always()", uses=UPLOAD, with_={
            "name": "run-${{ matrix.cell }}", "path": f"{run_dir}/", "if-no-files-found": "warn",
            "retention-days": 14, "overwrite": True}),
    )
    first = chunk == 0
    return Job(
        "run" if first else f"run_{chunk + 1}", "${{ matrix.runner }}", steps, name="${{ matrix.cell }}",
        needs=("plan",), if_=None if first else f"fromJSON(needs.plan.outputs.chunks) > {chunk}",
        matrix=f"${{{{ fromJSON(needs.plan.outputs.{output}) }}}}", fail_fast=False, timeout_minutes=300)


def _report_job(run_jobs: list[Job]) -> Job:
    steps = (
        _checkout(), *_install_on_hosted(),
        Step("Download the plan", uses=DOWNLOAD, with_={"name": "nightly-plan", "path": "plan"}),
        Step("Download every cell's run directory", uses=DOWNLOAD,
             with_={"pattern": "run-*", "path": RUNS_DIR}),
        Step("Merge and report", run=(
            f'python3 -m ci.merge_runs --out merged --plan plan/plan.json --run-id "nightly-$GITHUB_RUN_ID" {RUNS_DIR}/*/\n'
            'dspark-ci report merged --format md >> "$GITHUB_STEP_SUMMARY"\n')),
        Step("Upload the merged report", if_="always()", uses=UPLOAD, with_={
            "name": "nightly-report", "path": "merged/", "retention-days": 30}),
        # junit.xml (one test case per cell and suite) as the run's test results, for test-report viewers.
        Step("Publish the test results", if_="always()", uses=UPLOAD, with_={
            "name": "nightly-junit", "path": "merged/junit.xml", "if-no-files-found": "warn", "retention-days": 30}),
    )
    # Runs even when cells failed: the nightly reports everything; it fails only if the plan did.
    return Job("report", HOSTED, steps, name="Report", needs=("plan", *(job.id for job in run_jobs)),
               if_="always() && needs.plan.result == 'success'", timeout_minutes=30)


def nightly() -> Workflow:
    run_jobs = [_run_job(chunk) for chunk in range(MAX_CHUNKS)]
    return Workflow(
        "nightly.yml", "Nightly",
        on={"schedule": [{"cron": "0 18 * * *"}],
            "workflow_dispatch": {"inputs": {"select": {
                "description": "Only cells whose id matches this glob (dspark-ci plan --select)",
                "type": "string", "required": False, "default": ""}}}},
        permissions={"contents": "read"},
        concurrency={"group": "nightly-${{ github.ref }}", "cancel-in-progress": False},
        jobs=(_plan_job(), *run_jobs, _report_job(run_jobs)),
    )


# --- ChatOps ------------------------------------------------------------------------------------

def chatops() -> Workflow:
    steps = (
        # The default branch: dspark-ci and the permissions file come from reviewed code only.
        _checkout(),
        # The PR's tree is only read as text (register_*_ci calls parsed with ast), never run.
        _checkout("Check out the PR", ref="refs/pull/${{ github.event.issue.number }}/head", path="pr"),
        *_install_on_hosted(),
        Step("Handle the command", env={"GITHUB_TOKEN": "${{ secrets.GITHUB_TOKEN }}"},
             run='dspark-ci chatops --event "$GITHUB_EVENT_PATH" --repo-root pr --permissions ci/permissions.json\n'),
    )
    job = Job("chatops", HOSTED, steps, name="ChatOps",
              if_="github.event.issue.pull_request && startsWith(github.event.comment.body, '/')",
              permissions={"actions": "write", "contents": "read", "issues": "write", "pull-requests": "write"},
              timeout_minutes=10)
    return Workflow("chatops.yml", "ChatOps", on={"issue_comment": {"types": ["created"]}},
                    permissions={}, jobs=(job,))


def _status_step(name: str, status: str, if_: str) -> Step:
    # Inputs reach the script through env, never pasted into it (no script injection).
    env = {"GITHUB_TOKEN": "${{ secrets.GITHUB_TOKEN }}", "COMMENT_ID": "${{ inputs.reply_comment_id }}",
           "MARKER": "${{ inputs.reply_marker }}", "STATUS": status}
    return Step(name, if_=if_, continue_on_error=True, env=env, run=(
        'python3 -m ci.rerun_status --repo "$GITHUB_REPOSITORY" --comment-id "$COMMENT_ID" --marker "$MARKER" \\\n'
        '  --status "$STATUS" --run-url "$GITHUB_SERVER_URL/$GITHUB_REPOSITORY/actions/runs/$GITHUB_RUN_ID"\n'))


RERUN_INPUTS = {
    "runner": "Runner label the tests need (from their register_*_ci call)",
    "backend": "cuda, amd, npu or cpu",
    "test_command": "One test per line, relative to test/ (e.g. registered/spec/test_x.py TestX.test_y)",
    "pr": "Pull request whose head is tested (empty: the dispatched ref)",
    "reply_comment_id": "The ChatOps reply comment to update (empty: none)",
    "reply_marker": "This group's marker in the reply, e.g. <!--rrt:0-->",
}
_HAS_REPLY = "inputs.reply_comment_id != ''"


def rerun_test() -> Workflow:
    run_tests = Step(
        "Run the tests", env={"TEST_COMMAND": "${{ inputs.test_command }}"}, run=(
            "cd pr/test\n"
            "status=0\n"
            'while IFS= read -r line; do\n'
            '  [ -z "$line" ] && continue\n'
            '  read -ra words <<< "$line"  # split on spaces, no globbing: ChatOps allowed only [A-Za-z0-9_./-]\n'
            '  echo "::group::python3 $line"\n'
            '  python3 "${words[@]}" || status=1\n'
            '  echo "::endgroup::"\n'
            'done <<< "$TEST_COMMAND"\n'
            'exit "$status"\n'))
    steps = (
        _checkout(),
        _checkout("Check out the code under test",
                  ref="${{ inputs.pr != '' && format('refs/pull/{0}/head', inputs.pr) || github.sha }}", path="pr"),
        Step("Install dspark-ci", run="python3 -m pip install -e ."),
        _status_step("Mark the reply as running", "running", _HAS_REPLY),
        Step("Install the code under test", env={"INSTALL": "${{ vars.RERUN_TEST_INSTALL }}"}, run=(
            'cd pr\n'
            'if [ -n "$INSTALL" ]; then bash -c "$INSTALL"; else python3 -m pip install -e "python[dev]"; fi\n'),
             timeout_minutes=30),
        run_tests,
    )
    test_job = Job("rerun_test", "${{ inputs.runner }}", steps, name="${{ inputs.runner }}",
                   permissions={"contents": "read", "issues": "write"}, timeout_minutes=120)
    # One job per reply comment at a time, so groups finishing together do not overwrite each other's line.
    finish = Job("finish", HOSTED, (
        _checkout(), *_install_on_hosted(),
        _status_step("Mark the reply as finished", "${{ needs.rerun_test.result == 'success' && 'success' || 'failure' }}",
                     "always()"),
    ), name="Update the reply", needs=("rerun_test",), if_=f"always() && {_HAS_REPLY}",
        permissions={"contents": "read", "issues": "write"},
        concurrency={"group": "rerun-reply-${{ inputs.reply_comment_id }}", "cancel-in-progress": False},
        timeout_minutes=10)
    return Workflow(
        "rerun-test.yml", "Rerun Test",
        run_name="[rerun-test] ${{ inputs.runner }} ${{ inputs.pr != '' && format('PR #{0}', inputs.pr) || github.ref_name }}",
        on={"workflow_dispatch": {"inputs": {
            name: {"description": text, "type": "string", "required": name in ("runner", "test_command"),
                   **({} if name in ("runner", "test_command") else {"default": ""})}
            for name, text in RERUN_INPUTS.items()}}},
        permissions={"contents": "read"}, jobs=(test_job, finish))


WORKFLOWS = (nightly, chatops, rerun_test)


def render_all() -> dict[str, str]:
    """File name -> YAML text of every workflow."""
    return {workflow.file_name: workflow.render() for workflow in (make() for make in WORKFLOWS)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.workflows", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=WORKFLOW_DIR, help="where to write (default .github/workflows)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is out of date")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render_all().items():
        path = args.dir / name
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    verb = "out of date" if args.check else "written"
    for path in stale:
        print(f"{path}: {verb}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
