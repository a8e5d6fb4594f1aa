"""History triage: a failing cell is a regression, flaky, infrastructure or broken; node-level signals listed.

The history is a temporary file (DSPARK_HISTORY), never the user's."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.cli_under_test import DSPARK_CI

REPO = Path(__file__).resolve().parent.parent
ENGINE = "tcp://10.0.0.7:2375"
PARTS = {"argv": "a", "env": "e"}


def cell(cell_id: str, status: str, build: str, error: str | None = None, infrastructure: bool = False) -> dict:
    data = {"id": cell_id, "status": status, "config": {}, "expect": {"outcome": "serve"}, "error": error,
            "metrics": {}, "gates": [], "identity": {"build": build, "parts": PARTS}}
    if infrastructure:
        data["infrastructure"] = True
    return data


def nights() -> list[list[dict]]:
    lost = f"lost Docker engine {ENGINE} while watching node rank 0 (connection refused)"
    return [
        [cell("reg", "passed", "sim 1.0.0"), cell("flaky", "passed", "sim 1.0.0"),
         cell("broken", "failed", "sim 1.0.0", "gate"), cell("infra", "passed", "sim 1.0.0"),
         cell("other", "passed", "sim 1.0.0")],
        [cell("reg", "passed", "sim 1.0.0"), cell("flaky", "failed", "sim 1.0.0", "gate"),
         cell("broken", "failed", "sim 1.0.0", "gate"), cell("infra", "passed", "sim 1.0.0"),
         cell("other", "error", "sim 1.0.0", lost, infrastructure=True)],
        [cell("reg", "failed", "sim 1.0.1", "gate"), cell("flaky", "passed", "sim 1.0.0"),
         cell("broken", "failed", "sim 1.0.1", "gate"), cell("infra", "passed", "sim 1.0.1"),
         cell("other", "passed", "sim 1.0.1")],
        [cell("reg", "failed", "sim 1.0.1", "gate"), cell("flaky", "failed", "sim 1.0.0", "gate"),
         cell("broken", "failed", "sim 1.0.1", "gate"), cell("infra", "error", "sim 1.0.1", lost, infrastructure=True),
         cell("other", "passed", "sim 1.0.1")],
    ]


def test_triage_classifies_each_failing_cell_and_names_the_node(tmp_path):
    env = {**os.environ, "DSPARK_HISTORY": str(tmp_path / "h.sqlite"), "DSPARK_STATE_DIR": str(tmp_path)}
    dirs = []
    for night, cells in enumerate(nights(), 1):
        run_dir = tmp_path / f"n{night}"
        run_dir.mkdir()
        (run_dir / "results.json").write_text(json.dumps({
            "schema": 1, "run_id": f"night-{night}", "started_at": f"2026-11-0{night}T03:00:00+00:00",
            "finished_at": None, "launcher": "docker", "matrices": ["m.yaml"], "cells": cells,
            "environment": {"hostname": "runner-1"}}))
        dirs.append(str(run_dir))
    added = subprocess.run([*DSPARK_CI, "history", "--add", *dirs], capture_output=True, text=True, env=env, cwd=REPO)
    assert added.returncode == 0, added.stderr
    done = subprocess.run([*DSPARK_CI, "history", "--triage", "--format", "json"], capture_output=True, text=True,
                          env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    kinds = {t["cell"]: (t["kind"], t["why"]) for t in report["failing"]}
    assert kinds["reg"] == ("regression", "passed in night-2, failing since night-3 (build sim 1.0.0 → sim 1.0.1)")
    assert kinds["flaky"] == ("flaky", "the same identity (sim 1.0.0) passed in night-3 and failed in night-4")
    assert kinds["infra"][0] == "infrastructure" and ENGINE in kinds["infra"][1]
    assert kinds["broken"][0] == "broken" and set(kinds) == {"reg", "flaky", "infra", "broken"}  # "other" passes now
    signals = {s["node"]: (s["failures"], s["of"]) for s in report["node_signals"]}
    assert signals == {ENGINE: (2, 2), "runner-1": (2, 2)}

    table = subprocess.run([*DSPARK_CI, "history", "--triage"], capture_output=True, text=True, env=env, cwd=REPO)
    assert f"{ENGINE}: 2 of 2 infrastructure failures (every one: suspect this node)" in table.stdout
