"""The GitHub Actions workflows, as records; ``python -m dspark_ci.ci.workflows`` writes .github/workflows/.

- ``nightly.yml``: plan -> one job per cell on the cell's runner label -> one merged report.
  Past 256 cells (GitHub's per-matrix limit) the plan is chunked and each chunk gets a run job.
- ``chatops.yml``: a PR comment starting with ``/`` -> ``dspark-ci chatops --event``.
- ``rerun-test.yml``: what ``/rerun-test`` dispatches, once per runner group.

``python -m dspark_ci.ci.workflows --check`` exits 1 when the files on disk differ from what this module renders.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from dspark_ci.ci.chatops.github import run_title_tag
from dspark_ci.ci.nightly.matrix_outputs import MAX_CHUNKS, chunk_output_name
from dspark_ci.ci.workflows.model import Job, Step, Workflow

WORKFLOW_DIR = Path(".github/workflows")
# Pinned to commits by dspark_ci.ci.workflows.model.PINNED_ACTIONS.
CHECKOUT, SETUP_PYTHON = "actions/checkout", "actions/setup-python"
UPLOAD, DOWNLOAD = "actions/upload-artifact", "actions/download-artifact"
CACHE, CACHE_RESTORE, CACHE_SAVE = "actions/cache", "actions/cache/restore", "actions/cache/save"
DURATIONS = "nightly-durations.json"  # {cell_id: seconds} of the last nightly, for dspark_ci.ci.nightly.shards
RED_RATES = "nightly-red.json"  # {cell_id: recent red rate}: dspark_ci.ci.nightly.shards runs likely reds first
NIGHTLY_MEMORY = f"{DURATIONS}\n{RED_RATES}\n"  # what one nightly leaves the next (one cache entry)
FLEET = "ci/nightly/fleet.json"  # runners per label
HOSTED = "ubuntu-latest"
PYTHON = "3.11"
NIGHTLY_MATRIX = "matrices/nightly.yaml"
# The nightly plans these together; pd.yaml's disaggregated cells need the router (extra `pd`) on the shard's runner.
NIGHTLY_MATRICES = (NIGHTLY_MATRIX, "matrices/pd.yaml")
RUNS_DIR = "runs"


REQUEST_INPUT = {"description": "Set by ChatOps: the command's identity, shown in the run's title, so a dispatch "
                                 "whose answer was lost is found instead of repeated",
                  "type": "string", "required": False, "default": ""}
# The request as the run's title shows it (dspark_ci.ci.chatops.github.run_title_tag, which finds it there).
_TITLE_TAG = "format('{}', inputs.request)".format(run_title_tag("{0}"))


_FROM_CHATOPS = "inputs.request != ''"
# Every job of a dispatched workflow waits for the guard, and does nothing when its run repeats an earlier
# dispatch of the same command (dspark_ci.ci.chatops.duplicate_run): a retried dispatch never runs twice.
_NOT_DUPLICATE = "needs.guard.outputs.duplicate != 'true'"


def _guard_job(file_name: str) -> Job:
    """Is this run a repeat of an earlier dispatch of the same request? Asked only of runs ChatOps dispatched."""
    check = Step("Is this run a repeated dispatch?", id="check", if_=_FROM_CHATOPS, env={
        "GITHUB_TOKEN": "${{ secrets.GITHUB_TOKEN }}", "REQUEST": "${{ inputs.request }}", "WORKFLOW": file_name},
        run=('python3 -m dspark_ci.ci.chatops.duplicate_run --repo "$GITHUB_REPOSITORY" --workflow "$WORKFLOW" '
             '--request "$REQUEST" --run-id "$GITHUB_RUN_ID" >> "$GITHUB_OUTPUT"\n'))
    install = [replace(step, if_=_FROM_CHATOPS) for step in _install_on_hosted()]
    return Job("guard", HOSTED, (_checkout(), *install, check), name="Guard against a repeated dispatch",
               outputs={"duplicate": "${{ steps.check.outputs.duplicate }}"},
               permissions={"actions": "read", "contents": "read"}, timeout_minutes=10)


def _checkout(name: str = "Check out", **with_) -> Step:
    return Step(name, uses=CHECKOUT, with_={"persist-credentials": False, **with_})


def _install_on_hosted() -> list[Step]:
    return [Step("Set up Python", uses=SETUP_PYTHON, with_={"python-version": PYTHON}),
            Step("Install dspark-ci", run="python3 -m pip install -e .")]


# --- nightly ------------------------------------------------------------------------------------

def _resolver_setup(name: str, **conditions) -> tuple[Step, ...]:
    """SGLang's resolver environment on a CPU (cached; ~80 s cold), exported as DSPARK_SGLANG_PYTHON."""
    cache = Step("Cache SGLang's resolver environment", uses=CACHE, with_={
        "path": ".cache/sglang-venv", "key": "sglang-resolver-${{ hashFiles('.ci/sglang-resolver.txt') }}"},
        **conditions)
    setup = Step(name, run='echo "DSPARK_SGLANG_PYTHON=$(bash .ci/sglang-resolver.sh)" >> "$GITHUB_ENV"\n',
                 **conditions)
    return cache, setup


def _plan_job() -> Job:
    restore = Step("Restore the last nightly's cell durations and red rates", uses=CACHE_RESTORE, with_={
        "path": NIGHTLY_MEMORY, "key": "nightly-durations-${{ github.run_id }}", "restore-keys": "nightly-durations-"})
    plan = Step("Plan cells", id="plan", env={"SELECT": "${{ inputs.select }}"}, run=(
        # Split on spaces with read -a: no pathname expansion, so `d*` stays a glob over cell ids
        # (an unquoted $SELECT would expand it against the checkout: --select docker --select docs).
        'read -ra patterns <<< "$SELECT"\n'
        'select_args=()\n'
        'for pattern in "${patterns[@]}"; do select_args+=(--select "$pattern"); done\n'
        "# Expected rejections SGLang's resolver decides on this CPU are marked, and go to one CPU job (dspark_ci.ci.nightly.shards)\n"
        f'dspark-ci plan {" ".join(NIGHTLY_MATRICES)} --format github --rejections resolver "${{select_args[@]}}" > plan.json\n'
        f'python3 -m dspark_ci.ci.nightly.shards plan.json --durations {DURATIONS} --red-rates {RED_RATES} --fleet {FLEET} '
        '>> "$GITHUB_OUTPUT"\n'))
    outputs = {"cells": "${{ steps.plan.outputs.cells }}", "chunks": "${{ steps.plan.outputs.chunks }}"}
    outputs |= {chunk_output_name(i): f"${{{{ steps.plan.outputs.{chunk_output_name(i)} }}}}"
                for i in range(MAX_CHUNKS)}
    keep_plan = Step("Keep the plan for the report", uses=UPLOAD,
                     with_={"name": "nightly-plan", "path": "plan.json", "retention-days": 14})
    resolver = _resolver_setup("Set up SGLang's resolver (CPU)")
    return Job("plan", HOSTED, (_checkout(), *_install_on_hosted(), *resolver, restore, plan, keep_plan), name="Plan",
               needs=("guard",), if_=_NOT_DUPLICATE, outputs=outputs, timeout_minutes=15)


def _run_job(chunk: int) -> Job:
    output = chunk_output_name(chunk)
    run_dir = f"{RUNS_DIR}/${{{{ matrix.shard }}}}"
    steps = (
        _checkout(),
        Step("Set up Python (the CPU shard runs on a hosted runner)", uses=SETUP_PYTHON,
             with_={"python-version": PYTHON}, if_="matrix.rejections == 'resolver'"),
        Step("Install dspark-ci (with sglang-router, for disaggregated cells)",
             run="python3 -m pip install -e '.[pd]'"),
        *_resolver_setup("Set up SGLang's resolver (the CPU shard of expected rejections)",
                         if_="matrix.rejections == 'resolver'"),
        Step("Run the shard's cells", env={"MATRIX": "${{ matrix.matrix }}", "CELLS": "${{ matrix.cells }}",
                                           "SHARD": "${{ matrix.shard }}", "HF_TOKEN": "${{ secrets.HF_TOKEN }}",
                                           "REJECTIONS": "${{ matrix.rejections }}",
                                           "TRIALS": "${{ inputs.trials }}"},
             run=(
                 # Multi-node cells need the runner's Docker hosts inventory (DSPARK_HOSTS in its environment).
                 'hosts_args=()\n'
                 'if [ -n "${DSPARK_HOSTS:-}" ]; then hosts_args=(--hosts "$DSPARK_HOSTS"); fi\n'
                 '# /rerun-test cell:ID --trials N: up to N boots, each gate a statistical verdict with its interval\n'
                 'trials_args=()\n'
                 'if [ -n "${TRIALS:-}" ]; then trials_args=(--max-boots "$TRIALS"); fi\n'
                 'read -ra cells <<< "$CELLS"  # cell ids: [A-Za-z0-9._-], space-separated by dspark_ci.ci.nightly.shards\n'
                 f'python3 -m dspark_ci.ci.nightly.shard_run --out "{RUNS_DIR}/$SHARD" "$MATRIX" "${{cells[@]}}" -- '
                 '--launcher docker --server sglang --rejections "$REJECTIONS" "${hosts_args[@]}" "${trials_args[@]}"\n')),
        # A run that finishes writes its short report to the job summary itself (heading and overview once);
        # this step speaks only for runs that were stopped before they could.
        Step("Add the reports to the job summary", if_="always()", env={"SHARD": "${{ matrix.shard }}"}, run=(
            f'found=0\n'
            f'for report in "{RUNS_DIR}/$SHARD"/*/report.md; do\n'
            '  [ -f "$report" ] || continue\n'
            '  found=1\n'
            '  if grep -q \'"finished_at": null\' "$(dirname "$report")/results.json"; then\n'
            '    cat "$report" >> "$GITHUB_STEP_SUMMARY"\n'
            '  fi\n'
            'done\n'
            'if [ "$found" = 0 ]; then\n'
            '  echo "No report.md: the shard stopped before writing one (see the log above)." >> "$GITHUB_STEP_SUMMARY"\n'
            'fi\n')),
        Step("Upload the shard's run directories", if_="always()", uses=UPLOAD, with_={
            "name": "run-${{ matrix.shard }}", "path": f"{run_dir}/", "if-no-files-found": "warn",
            "retention-days": 14, "overwrite": True}),
    )
    first = chunk == 0
    return Job(
        "run" if first else f"run_{chunk + 1}", "${{ matrix.runner }}", steps, name="${{ matrix.shard }}",
        needs=("plan",), if_=None if first else f"fromJSON(needs.plan.outputs.chunks) > {chunk}",
        matrix=f"${{{{ fromJSON(needs.plan.outputs.{output}) }}}}", fail_fast=False, timeout_minutes=720)


def _report_job(run_jobs: list[Job]) -> Job:
    steps = (
        _checkout(), *_install_on_hosted(),
        Step("Download the plan", uses=DOWNLOAD, with_={"name": "nightly-plan", "path": "plan"}),
        Step("Download every cell's run directory", uses=DOWNLOAD,
             with_={"pattern": "run-*", "path": RUNS_DIR}),
        Step("Merge and report", run=(
            f'python3 -m dspark_ci.ci.nightly.merge_runs --out merged --plan plan/plan.json --run-id "nightly-$GITHUB_RUN_ID" '
            f'--durations {DURATIONS} --red-rates {RED_RATES} {RUNS_DIR}/*/*/\n'
            'dspark-ci report merged --format md >> "$GITHUB_STEP_SUMMARY"\n')),
        Step("Upload the merged report", if_="always()", uses=UPLOAD, with_={
            "name": "nightly-report", "path": "merged/", "retention-days": 30}),
        Step("Keep the cell durations and red rates for the next plan", if_="always()", uses=CACHE_SAVE, with_={
            "path": NIGHTLY_MEMORY, "key": "nightly-durations-${{ github.run_id }}"}),
        # junit.xml (one test case per cell and suite) as the run's test results, for test-report viewers.
        Step("Publish the test results", if_="always()", uses=UPLOAD, with_={
            "name": "nightly-junit", "path": "merged/junit.xml", "if-no-files-found": "warn", "retention-days": 30}),
    )
    # Runs even when cells failed: the nightly reports everything; it fails only if the plan did.
    return Job("report", HOSTED, steps, name="Report", needs=("plan", *(job.id for job in run_jobs)),
               if_="always() && needs.plan.result == 'success'", timeout_minutes=30)


def _reply_jobs(finished_job: str) -> tuple[Job, Job]:
    """A dispatch from ChatOps names its reply: these move its line (🔄 at start, ✅/❌ when ``finished_job``
    ends), on a hosted runner with reviewed code only; the jobs that run cells or PR code cannot write."""
    start = Job("start", HOSTED, (
        _checkout(), *_install_on_hosted(), _status_step("Mark the reply as running", "running", "always()"),
    ), name="Mark the reply as running", needs=("guard",), if_=f"{_NOT_DUPLICATE} && {_HAS_REPLY}",
        permissions={"issues": "write"}, timeout_minutes=10)
    # Groups finishing together edit the same reply: dspark_ci.ci.chatops.rerun_status merges and verifies its own line.
    finish = Job("finish", HOSTED, (
        _checkout(), *_install_on_hosted(),
        _status_step("Mark the reply as finished",
                     f"${{{{ needs.{finished_job}.result == 'success' && 'success' || 'failure' }}}}", "always()"),
    ), name="Update the reply", needs=(finished_job, "guard"), if_=f"always() && {_NOT_DUPLICATE} && {_HAS_REPLY}",
        permissions={"issues": "write"}, timeout_minutes=10)
    return start, finish


def nightly() -> Workflow:
    run_jobs = [_run_job(chunk) for chunk in range(MAX_CHUNKS)]
    start, finish = _reply_jobs("report")
    return Workflow(
        "nightly.yml", "Nightly",
        run_name=f"${{{{ inputs.request != '' && format('Nightly: rerun of {{0}} {{1}}', inputs.select, "
                 f"{_TITLE_TAG}) || 'Nightly' }}}}",
        on={"schedule": [{"cron": "0 18 * * *"}],
            "workflow_dispatch": {"inputs": {"select": {
                "description": "Only cells whose id matches one of these space-separated globs (dspark-ci plan --select)",
                "type": "string", "required": False, "default": ""},
                **{name: {"description": RERUN_INPUTS[name], "type": "string", "required": False, "default": ""}
                   for name in ("reply_comment_id", "reply_marker")},
                "trials": {"description": "Boots per cell at most (run --max-boots; ChatOps /rerun-test --trials N)",
                           "type": "string", "required": False, "default": ""},
                "request": REQUEST_INPUT}}},
        permissions={"contents": "read"},
        # Scheduled nightlies queue behind each other (one pending at most: the newer replaces it). A ChatOps
        # cell rerun or a manual run is a group of its own: never cancelled, nor cancelling, by anyone else's.
        concurrency={"group": "nightly-${{ github.ref }}-${{ inputs.request || "
                              "(github.event_name == 'schedule' && 'schedule') || github.run_id }}",
                     "cancel-in-progress": False},
        jobs=(_guard_job("nightly.yml"), start, _plan_job(), *run_jobs, _report_job(run_jobs), finish),
    )


# --- ChatOps ------------------------------------------------------------------------------------

DECISION = "decision.json"


def chatops() -> Workflow:
    head = Step("Find the PR head at command time", id="head", env={
        "GH_TOKEN": "${{ secrets.GITHUB_TOKEN }}", "PR": "${{ github.event.issue.number }}"}, run=(
            'sha=$(gh api "repos/$GITHUB_REPOSITORY/pulls/$PR" --jq .head.sha)\n'
            'echo "sha=$sha" >> "$GITHUB_OUTPUT"\n'))
    decide_steps = (
        # The default branch: dspark-ci and the permissions file come from reviewed code only.
        _checkout(),
        # One commit, fixed now: what is resolved here is what the rerun checks out (input sha).
        head,
        # The PR's tree is only read as text (register_*_ci calls parsed with ast), never run.
        _checkout("Check out the PR", ref="${{ steps.head.outputs.sha }}", path="pr"),
        *_install_on_hosted(),
        Step("Decide", env={"GITHUB_TOKEN": "${{ secrets.GITHUB_TOKEN }}", "HEAD_SHA": "${{ steps.head.outputs.sha }}"},
             run=('dspark-ci chatops --event "$GITHUB_EVENT_PATH" --repo-root pr --permissions '
                  f'ci/chatops/permissions.json --head-sha "$HEAD_SHA" --decision-out {DECISION}\n')),
        Step("Hand the decision over", uses=UPLOAD, with_={"name": "chatops-decision", "path": DECISION,
                                                           "retention-days": 1}),
    )
    # Reads only: the PR's files are on this runner, so its token can write nothing.
    decide = Job("decide", HOSTED, decide_steps, name="Decide",
                 if_="github.event.issue.pull_request && startsWith(github.event.comment.body, '/')",
                 permissions={"contents": "read", "issues": "read", "pull-requests": "read"}, timeout_minutes=10)
    # Writes only: reviewed code and the decision (checked again before use), never a PR file.
    act = Job("act", HOSTED, (
        _checkout(), *_install_on_hosted(),
        Step("Download the decision", uses=DOWNLOAD, with_={"name": "chatops-decision"}),
        Step("Reply and dispatch", env={"GITHUB_TOKEN": "${{ secrets.GITHUB_TOKEN }}"},
             run=f'dspark-ci chatops --event "$GITHUB_EVENT_PATH" --carry-out {DECISION}\n'),
    ), name="Reply and dispatch", needs=("decide",),
        permissions={"actions": "write", "contents": "read", "issues": "write", "pull-requests": "write"},
        timeout_minutes=10)
    return Workflow("chatops.yml", "ChatOps", on={"issue_comment": {"types": ["created"]}},
                    permissions={}, jobs=(decide, act))


def _status_step(name: str, status: str, if_: str) -> Step:
    # Inputs reach the script through env, never pasted into it (no script injection).
    env = {"GITHUB_TOKEN": "${{ secrets.GITHUB_TOKEN }}", "COMMENT_ID": "${{ inputs.reply_comment_id }}",
           "MARKER": "${{ inputs.reply_marker }}", "STATUS": status}
    return Step(name, if_=if_, continue_on_error=True, env=env, run=(
        'python3 -m dspark_ci.ci.chatops.rerun_status --repo "$GITHUB_REPOSITORY" --comment-id "$COMMENT_ID" --marker "$MARKER" \\\n'
        '  --status "$STATUS" --run-url "$GITHUB_SERVER_URL/$GITHUB_REPOSITORY/actions/runs/$GITHUB_RUN_ID"\n'))


RERUN_INPUTS = {
    "runner": "Runner label the tests need (from their register_*_ci call)",
    "backend": "cuda, amd, npu or cpu",
    "tests": 'JSON list of argv lists run as python3 ARGV in test/, e.g. [["registered/spec/test_x.py", "TestX.test_y"]]',
    "pr": "Pull request whose head is tested (empty: the dispatched ref)",
    "sha": "The PR head commit reviewed when the command was given: exactly this commit runs",
    "reply_comment_id": "The ChatOps reply comment to update (empty: none)",
    "reply_marker": "This group's marker in the reply, e.g. <!--rrt:0-->",
}
_HAS_REPLY = "inputs.reply_comment_id != ''"


def rerun_test() -> Workflow:
    pinned = Step("Check that the commit under test is the one reviewed", env={
        "PR": "${{ inputs.pr }}", "SHA": "${{ inputs.sha }}"}, run=(
            'if [ -n "$PR" ] && [ -z "$SHA" ]; then\n'
            '  echo "::error::a PR rerun needs the head commit reviewed at command time (input sha)"; exit 1\n'
            'fi\n'
            'head=$(git -C pr rev-parse HEAD)\n'
            'if [ -n "$SHA" ] && [ "$head" != "$SHA" ]; then\n'
            '  echo "::error::checked out $head, but the command was given for $SHA"; exit 1\n'
            'fi\n'
            'echo "Testing $head"\n'))
    run_tests = Step("Run the tests", env={"RERUN_TESTS": "${{ inputs.tests }}"},
                     run="python3 -m dspark_ci.ci.chatops.run_tests --dir pr/test\n")
    steps = (
        _checkout(),
        # The commit reviewed when the command was given, never refs/pull/N/head as it is when the job starts.
        _checkout("Check out the code under test", ref="${{ inputs.sha != '' && inputs.sha || github.sha }}",
                  path="pr"),
        pinned,
        Step("Install dspark-ci", run="python3 -m pip install -e ."),
        Step("Install the code under test", env={"INSTALL": "${{ vars.RERUN_TEST_INSTALL }}"}, run=(
            'cd pr\n'
            'if [ -n "$INSTALL" ]; then bash -c "$INSTALL"; else python3 -m pip install -e "python[dev]"; fi\n'),
             timeout_minutes=30),
        run_tests,
    )
    # The job that runs PR code can only read: its token cannot comment, label or dispatch. The reply is
    # moved by the jobs around it, which run reviewed code only (the default branch, no PR checkout).
    test_job = Job("rerun_test", "${{ inputs.runner }}", steps, name="${{ inputs.runner }}", needs=("guard",),
                   if_=_NOT_DUPLICATE, permissions={"contents": "read"}, timeout_minutes=120)
    start, finish = _reply_jobs("rerun_test")
    required = ("runner", "tests")
    inputs = {name: {"description": text, "type": "string", "required": name in required,
                     **({} if name in required else {"default": ""})} for name, text in RERUN_INPUTS.items()}
    return Workflow(
        "rerun-test.yml", "Rerun Test",
        run_name="[rerun-test] ${{ inputs.runner }} ${{ inputs.pr != '' && format('PR #{0}', inputs.pr) || "
                 f"github.ref_name }}}} ${{{{ inputs.request != '' && {_TITLE_TAG} || '' }}}}",
        on={"workflow_dispatch": {"inputs": {**inputs, "request": REQUEST_INPUT}}},
        permissions={"contents": "read"},
        # One group per command and runner group: a rerun is never cancelled by (nor cancels) anyone else's.
        concurrency={"group": "rerun-test-${{ inputs.request || github.run_id }}", "cancel-in-progress": False},
        jobs=(_guard_job("rerun-test.yml"), start, test_job, finish))


BISECT_INPUTS = {
    "runner": "Runner label of the cell", "matrix": "Matrix file holding the cell", "cell": "Cell id",
    "metric": "Metric to chase, or failure", "good": "Last good build (version, tag or commit)",
    "bad": "First bad build", "pr": "Pull request the command was given on (empty: none)",
    "sha": "The PR head reviewed when the command was given (recorded with the bisect)",
    "reply_comment_id": RERUN_INPUTS["reply_comment_id"], "reply_marker": RERUN_INPUTS["reply_marker"],
}


def bisect() -> Workflow:
    """``/bisect CELL METRIC GOOD..BAD``: dspark-ci bisect on the cell's runner, builds as images. GOOD..BAD is a
    patch-version range, or the builds come from the repository variable BISECT_BUILDS_COMMAND (printing one build
    per line for GOOD and BAD); the image of a build is vars.BISECT_IMAGE_TEMPLATE (default lmsysorg/sglang:v{ref})."""
    env = {name.upper(): f"${{{{ inputs.{name} }}}}" for name in ("matrix", "cell", "metric", "good", "bad")}
    env |= {"TEMPLATE": "${{ vars.BISECT_IMAGE_TEMPLATE || 'lmsysorg/sglang:v{ref}' }}",
            "BUILDS_COMMAND": "${{ vars.BISECT_BUILDS_COMMAND }}", "HF_TOKEN": "${{ secrets.HF_TOKEN }}"}
    run = Step("Bisect", env=env, run=(
        # Inputs reach the script through env only; ChatOps allowed [A-Za-z0-9._-] in each of them.
        'builds=(--good "$GOOD" --bad "$BAD")\n'
        'if [ -n "$BUILDS_COMMAND" ]; then bash -c "$BUILDS_COMMAND" _ "$GOOD" "$BAD" > builds.txt; '
        'builds=(--builds-file builds.txt); fi\n'
        'hosts_args=()\n'
        'if [ -n "${DSPARK_HOSTS:-}" ]; then hosts_args=(--hosts "$DSPARK_HOSTS"); fi\n'
        'dspark-ci bisect "$MATRIX" --cell "$CELL" --metric "$METRIC" "${builds[@]}" --launcher docker --server sglang '
        '--image-template "$TEMPLATE" "${hosts_args[@]}" --out bisect\n'))
    steps = (_checkout(), Step("Install dspark-ci", run="python3 -m pip install -e ."), run,
             Step("Add the bisect to the job summary", if_="always()",
                  run='if [ -f bisect/bisect.md ]; then cat bisect/bisect.md >> "$GITHUB_STEP_SUMMARY"; fi\n'),
             Step("Upload the bisect", if_="always()", uses=UPLOAD, with_={
                 "name": "bisect", "path": "bisect/", "if-no-files-found": "warn", "retention-days": 14}))
    job = Job("bisect", "${{ inputs.runner }}", steps, name="${{ inputs.cell }}", needs=("guard",), if_=_NOT_DUPLICATE,
              permissions={"contents": "read"}, timeout_minutes=720)
    start, finish = _reply_jobs("bisect")
    required = ("runner", "matrix", "cell", "metric", "good", "bad")
    inputs = {name: {"description": text, "type": "string", "required": name in required,
                     **({} if name in required else {"default": ""})} for name, text in BISECT_INPUTS.items()}
    return Workflow(
        "bisect.yml", "Bisect",
        run_name="[bisect] ${{ inputs.cell }} ${{ inputs.metric }} ${{ inputs.good }}..${{ inputs.bad }}",
        on={"workflow_dispatch": {"inputs": {**inputs, "request": REQUEST_INPUT}}},
        permissions={"contents": "read"},
        concurrency={"group": "bisect-${{ inputs.request || github.run_id }}", "cancel-in-progress": False},
        jobs=(_guard_job("bisect.yml"), start, job, finish))


WORKFLOWS = (nightly, chatops, rerun_test, bisect)


def render_all() -> dict[str, str]:
    """File name -> YAML text of every workflow."""
    return {workflow.file_name: workflow.render() for workflow in (make() for make in WORKFLOWS)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dspark_ci.ci.workflows", description=__doc__.splitlines()[0])
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
