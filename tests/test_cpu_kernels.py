"""``dspark_ci.sglang_sim.cpu_kernels``: SGLang's ``sgl_kernel`` CPU ops, each against a plain reference.

The checks (tests/cpu_kernels_checks.py) need torch, which this interpreter does not have: they run once, in a
subprocess of SGLang's venv ($DSPARK_SGLANG_PYTHON; ``.ci/run`` sets it from ``.ci/sglang-resolver.sh``, whose CPU
torch is all they import), and each check is one test here. Skipped, with the reason, without that venv."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECKS = Path(__file__).with_name("cpu_kernels_checks.py")
NAMES = [node.name for node in ast.parse(CHECKS.read_text()).body
         if isinstance(node, ast.FunctionDef) and node.name.startswith("check_")]


@pytest.fixture(scope="module")
def results() -> dict[str, str | None]:
    python = os.environ.get("DSPARK_SGLANG_PYTHON")
    if not python:
        pytest.skip("needs torch: set DSPARK_SGLANG_PYTHON to SGLang's venv (bash .ci/sglang-resolver.sh), as CI does")
    done = subprocess.run([python, str(CHECKS)], capture_output=True, text=True, timeout=900,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, f"the checks did not run ({done.returncode}):\n{done.stderr[-3000:]}"
    return {line["check"]: line["error"] for line in lines}


@pytest.mark.parametrize("name", NAMES)
def test_op(results, name):
    assert name in results, f"{name} did not report"
    error = results[name]
    if error:
        sys.stderr.write(error)
    assert error is None, error


def test_there_are_checks_for_every_registered_op():
    """An op added to the registry without a check of its own fails here (names as SGLang calls them)."""
    registry = (CHECKS.parent.parent / "sglang_sim" / "cpu_kernels" / "registry.py").read_text()
    checks = CHECKS.read_text()
    table = next(node.value for node in ast.walk(ast.parse(registry))
                 if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "OPS")
    assert isinstance(table, ast.Dict)
    ops = [key.value for key in table.keys if isinstance(key, ast.Constant)]
    assert len(ops) >= 14
    unchecked = [op for op in ops if op not in checks]
    assert not unchecked, unchecked
