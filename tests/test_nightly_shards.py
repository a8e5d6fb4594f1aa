"""The nightly's schedule (`python -m dspark_ci.ci.nightly.shards`) and a shard's run
(`python -m dspark_ci.ci.nightly.shard_run`), through their CLIs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def shards_cli(tmp_path: Path, entries: list[dict], durations: dict | None = None, fleet: dict | None = None,
               red_rates: dict | None = None):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"include": entries}))
    argv = [sys.executable, "-m", "dspark_ci.ci.nightly.shards", str(plan)]
    for flag, data in (("--durations", durations), ("--fleet", fleet), ("--red-rates", red_rates)):
        if data is not None:
            (tmp_path / f"{flag[2:]}.json").write_text(json.dumps(data))
            argv += [flag, str(tmp_path / f"{flag[2:]}.json")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)
    outputs = dict(line.split("=", 1) for line in proc.stdout.splitlines())
    return proc, json.loads(outputs["matrix"])["include"] if "matrix" in outputs else None


def entry(cell: str, runner: str = "8-gpu-h200", expect: str = "serve", nnodes: int = 1) -> dict:
    return {"cell": cell, "runner": runner, "matrix": "matrices/nightly.yaml", "expect": expect, "nnodes": nnodes}


def test_cells_are_packed_longest_first_onto_the_least_loaded_runner(tmp_path):
    durations = {"a": 100, "b": 70, "c": 60, "d": 40, "e": 30}
    proc, shards = shards_cli(tmp_path, [entry(c) for c in "abcde"], durations, {"8-gpu-h200": 2})
    assert proc.returncode == 0, proc.stderr
    assert [(s["shard"], set(s["cells"].split())) for s in shards] == [("8-gpu-h200-1", {"a", "d"}),
                                                                      ("8-gpu-h200-2", {"b", "c", "e"})]
    # Nothing known of reds: each shard runs its shortest cell first, the soonest verdict
    assert [s["cells"] for s in shards] == ["d a", "e c b"]


def test_a_cell_often_red_runs_first_in_its_shard_and_the_packing_stays(tmp_path):
    durations = {"long_flaky": 3000, "short_steady": 600, "mid_steady": 1200}
    rates = {"long_flaky": 0.6, "short_steady": 0.02}  # mid_steady: never judged, the prior
    proc, shards = shards_cli(tmp_path, [entry(c) for c in durations], durations, {"8-gpu-h200": 1}, rates)
    assert proc.returncode == 0, proc.stderr
    # red per second: 0.6/3000 = 2e-4 beats 0.1/1200 = 8e-5 beats 0.02/600 = 3e-5
    assert shards[0]["cells"] == "long_flaky mid_steady short_steady"
    assert shards[0]["est_minutes"] == round(4800 / 60)


def test_tonights_verdicts_move_the_red_rates_the_next_plan_reads(tmp_path):
    from dspark_ci.ci.nightly.shards import PRIOR_RED_RATE, RED_RATE_MEMORY, updated_red_rates

    rates = updated_red_rates({"a": 0.5, "gone": 0.9}, {"a": False, "new": True})
    assert rates["a"] == pytest.approx(0.5 * (1 - RED_RATE_MEMORY))
    assert rates["new"] == pytest.approx(PRIOR_RED_RATE * (1 - RED_RATE_MEMORY) + RED_RATE_MEMORY)
    assert rates["gone"] == 0.9  # not run tonight: what was known stays


def test_measured_durations_win_over_estimates_and_labels_shard_apart(tmp_path):
    entries = [entry("rej", expect="reject"), entry("srv"), entry("npu", runner="16-npu-a3"),
               entry("multi", runner="2x8-gpu-h200", nnodes=2)]
    _, shards = shards_cli(tmp_path, entries, {"rej": 9000}, {"8-gpu-h200": 1})
    by_shard = {s["shard"]: s for s in shards}
    assert by_shard["8-gpu-h200-1"]["cells"] == "srv rej"  # the 45 min estimate before the measured 150 min
    assert by_shard["8-gpu-h200-1"]["est_minutes"] == 150 + 45
    assert by_shard["2x8-gpu-h200-1"]["est_minutes"] == 55 and by_shard["16-npu-a3-1"]["cells"] == "npu"


@pytest.mark.parametrize("name, content, message", [
    pytest.param("durations", '{"a": "soon"}', "must be a JSON object of numbers", id="durations-not-numbers"),
    pytest.param("fleet", "[1, 2]", "must be a JSON object of numbers", id="fleet-not-object"),
])
def test_bad_durations_or_fleet_exit_2(tmp_path, name, content, message):
    (tmp_path / "plan.json").write_text(json.dumps({"include": [entry("a")]}))
    (tmp_path / "x.json").write_text(content)
    proc = subprocess.run([sys.executable, "-m", "dspark_ci.ci.nightly.shards", str(tmp_path / "plan.json"),
                           f"--{name}", str(tmp_path / "x.json")], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


# --- a shard's run: one `dspark-ci run` per cell, infrastructure failures retried once ----------

FAKE_DSPARK_CI = '''
import json, sys, pathlib
args = sys.argv[1:]
cell, out = args[args.index("--cell") + 1], pathlib.Path(args[args.index("--out") + 1])
behaviour = json.loads(pathlib.Path(sys.argv[0]).with_name("behaviour.json").read_text())
calls = pathlib.Path(sys.argv[0]).with_name("calls.jsonl")
with calls.open("a") as f:
    f.write(json.dumps(args) + "\\n")
attempt = sum(1 for line in calls.read_text().splitlines() if json.loads(line)[3] == cell)
code = behaviour[cell][min(attempt, len(behaviour[cell])) - 1]
status = {0: "passed", 1: "failed", 3: "error"}[code]
out.mkdir(parents=True)
(out / "results.json").write_text(json.dumps({"schema": 1, "run_id": cell, "started_at": None, "finished_at": None,
    "launcher": "docker", "matrices": ["m.yaml"], "cells": [{"id": cell, "config": {}, "expect": {}, "status": status,
    "error": None if code == 0 else ("engine unreachable" if code == 3 else "accept_length 1.0 < 2.5"),
    "boot_seconds": None, "metrics": {}, "gates": []}]}))
sys.exit(code)
'''


def run_shard(tmp_path: Path, behaviour: dict[str, list[int]]) -> tuple[subprocess.CompletedProcess, list]:
    fake = tmp_path / "fake_dspark_ci.py"
    fake.write_text(FAKE_DSPARK_CI)
    (tmp_path / "behaviour.json").write_text(json.dumps(behaviour))
    proc = subprocess.run([sys.executable, "-m", "dspark_ci.ci.nightly.shard_run",
                           "--dspark-ci", f"{sys.executable} {fake}",
                           "--out", str(tmp_path / "runs/s1"), "m.yaml", *behaviour, "--", "--launcher", "docker"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    return proc, calls


def cell_result(tmp_path: Path, cell: str) -> dict:
    return json.loads((tmp_path / "runs/s1" / cell / "results.json").read_text())["cells"][0]


def test_an_infrastructure_failure_is_retried_once_and_marked_flaky(tmp_path):
    proc, calls = run_shard(tmp_path, {"a": [3, 0], "b": [0]})
    assert proc.returncode == 0, proc.stderr
    assert [c[3] for c in calls] == ["a", "a", "b"]  # one boot per cell (and one more for the retry)
    assert calls[0] == ["run", "m.yaml", "--cell", "a", "--out", str(tmp_path / "runs/s1/a"), "--launcher", "docker"]
    a = cell_result(tmp_path, "a")
    assert a["status"] == "passed" and any(w.startswith("flaky: the first attempt failed on infrastructure (exit 3: "
                                                        "engine unreachable)") for w in a["warnings"])
    assert (tmp_path / "runs/s1/attempts/a-1/results.json").is_file()
    assert not cell_result(tmp_path, "b").get("warnings")


def test_a_gate_failure_is_never_retried_and_a_second_infra_failure_stays(tmp_path):
    proc, calls = run_shard(tmp_path, {"gate": [1, 0], "infra": [3, 3]})
    assert proc.returncode == 3
    # Each red cell is announced as GitHub annotates it, the moment it is decided (the first before the next runs)
    assert proc.stdout.splitlines()[0] == "::error title=dspark-ci%3A gate is red::accept_length 1.0 < 2.5"
    assert "::error title=dspark-ci%3A infra is red::engine unreachable" in proc.stdout
    assert [c[3] for c in calls] == ["gate", "infra", "infra"]
    assert cell_result(tmp_path, "gate")["status"] == "failed"
    assert cell_result(tmp_path, "infra")["status"] == "error"


def test_the_next_plan_reads_each_cells_own_time_from_a_shard_that_ran_several(tmp_path):
    """A shard runs several cells in one run directory: each cell's own ``seconds`` is its duration for the next
    plan (before cells were timed, a multi-cell run told the planner nothing)."""
    cells = [{"id": cell, "config": {}, "expect": {"outcome": "serve"}, "status": "passed", "error": None,
              "boot_seconds": 30.0, "metrics": {}, "gates": [], "started_at": "2026-12-01T01:00:00+00:00",
              "finished_at": "2026-12-01T01:10:00+00:00", "seconds": seconds}
             for cell, seconds in (("a", 600.0), ("b", 1500.0))]
    shard = tmp_path / "runs" / "shard-1"
    shard.mkdir(parents=True)
    (shard / "results.json").write_text(json.dumps({
        "schema": 1, "run_id": "r", "started_at": "2026-12-01T01:00:00+00:00",
        "finished_at": "2026-12-01T01:35:00+00:00", "launcher": "local", "matrices": [], "cells": cells}))
    durations = tmp_path / "durations.json"
    merged = subprocess.run([sys.executable, "-m", "dspark_ci.ci.nightly.merge_runs", "--out", str(tmp_path / "merged"),
                             "--durations", str(durations), str(shard)], capture_output=True, text=True, timeout=60,
                            cwd=REPO)
    assert merged.returncode == 0, merged.stderr
    assert json.loads(durations.read_text()) == {"a": 600.0, "b": 1500.0}
    proc, shards = shards_cli(tmp_path, [entry("a"), entry("b")], json.loads(durations.read_text()))
    assert proc.returncode == 0, proc.stderr
    assert {s["cells"]: s["est_minutes"] for s in shards} == {"b": 25, "a": 10}


def test_resolver_decided_rejections_take_one_cpu_job_and_no_gpu_runner(tmp_path):
    decided = [{**entry(c, expect="reject"), "decided_by": "resolver"} for c in ("r1", "r2", "r3")]
    launched = [entry("s1"), entry("s2"), entry("hw-reject", expect="reject")]  # hardware-bound: still launched
    proc, shards = shards_cli(tmp_path, [*decided, *launched], fleet={"8-gpu-h200": 2})
    assert proc.returncode == 0, proc.stderr
    cpu = [s for s in shards if s["rejections"] == "resolver"]
    assert [(s["runner"], s["cells"]) for s in cpu] == [("ubuntu-latest", "r1 r2 r3")]
    gpu_cells = " ".join(s["cells"] for s in shards if s["runner"] == "8-gpu-h200").split()
    assert sorted(gpu_cells) == ["hw-reject", "s1", "s2"]
    assert all(s["rejections"] == "launch" for s in shards if s["runner"] == "8-gpu-h200")
