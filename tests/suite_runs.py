"""Running one measurement suite as a user does: ``pytest suites/test_<suite>.py --base-url URL --dspark-out OUT``
in a subprocess from the repository root."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SYNTHETIC_GPQA = REPO / "suites" / "data" / "gpqa_synthetic.csv"


def run_suite(tmp_path: Path, suite: str, base_url: str, *args: str) -> tuple[int, dict, str]:
    """(pytest exit code, the --dspark-out JSON, pytest's output) of one suite file."""
    out = tmp_path / f"{suite}.json"
    done = subprocess.run([sys.executable, "-m", "pytest", f"suites/test_{suite}.py", "-p", "no:cacheprovider", "-q",
                           "--base-url", base_url, "--dspark-out", str(out), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    return done.returncode, json.loads(out.read_text()), done.stdout + done.stderr


def outcomes(output: dict) -> dict[str, str]:
    """Each suite test's outcome by its name, from a --dspark-out JSON or a results.json cell (both have "tests")."""
    return {test["nodeid"].split("::")[-1]: test["outcome"] for test in output["tests"]}
