"""YAML that PyYAML can parse but not build (tags, merge keys) is bad input: exit 2 with file:line, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def dspark_ci(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dspark_ci", *args], capture_output=True, text=True, cwd=cwd)


@pytest.mark.parametrize(
    "name, text, args, says",
    [
        ("matrix.yaml", "defaults:\n  model: m\n  tp: !!int abc\n", ["plan", "matrix.yaml"],
         "matrix.yaml:3: not valid YAML: cannot read 'abc'"),
        ("baseline.yaml", "schema: 1\ncells:\n  '*':\n    accept_length:\n      <<: {min: 1}\n",
         ["report", "RUN", "--baseline", "baseline.yaml"], "baseline.yaml:5: cannot read '<<'"),
        ("baseline.yaml", "schema: 1\ncells:\n  '*':\n    accept_length: {min: !!float x}\n",
         ["report", "RUN", "--baseline", "baseline.yaml"], "baseline.yaml:4: cannot read 'x'"),
        ("hosts.yaml", "hosts: [\n", ["run", str(REPO / "matrices" / "smoke.yaml"), "--launcher", "docker",
                                      "--hosts", "hosts.yaml"], "hosts.yaml:2: not valid YAML"),
    ],
    ids=["matrix-bad-int-tag", "baseline-merge-key", "baseline-bad-float-tag", "hosts-bad-syntax"],
)
def test_unbuildable_yaml_is_exit_2_with_file_and_line(tmp_path, name, text, args, says):
    (tmp_path / name).write_text(text)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "results.json").write_text('{"schema": 1, "run_id": "r", "started_at": null, "finished_at": null, '
                                          '"launcher": "local", "matrices": [], "cells": []}')
    done = dspark_ci(*[str(run_dir) if a == "RUN" else a for a in args], cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr


def test_missing_hosts_inventory_says_which_file(tmp_path):
    done = dspark_ci("run", str(REPO / "matrices" / "smoke.yaml"), "--launcher", "docker", "--hosts", "nope.yaml",
                     cwd=tmp_path)
    assert done.returncode == 2
    assert "nope.yaml: no such hosts inventory" in done.stderr
