"""Every shipped matrix cell's expectation agrees with the simulator's model of the pinned SGLang release's admission.

The expectations in matrices/*.yaml and the rules in sglang_sim/admission.py were each written from SGLang's
source, separately; this pins that they tell the same story, cell by cell, for the exact argv `plan` emits.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from dspark_ci.sglang_sim.admission import Rejected, SglangEnv, admit, guess_architecture
from dspark_ci.sglang_sim.args import parse_server_args

REPO = Path(__file__).resolve().parent.parent
ENTRYPOINT_LEN = 3  # python3 -m sglang.launch_server


def planned_cells() -> list[dict]:
    matrices = sorted(str(p) for p in (REPO / "matrices").glob("*.yaml"))
    done = subprocess.run([sys.executable, "-m", "dspark_ci", "plan", *matrices, "--format", "json"],
                          capture_output=True, text=True, check=True, cwd=REPO)
    return json.loads(done.stdout)["cells"]


CELLS = planned_cells()


def first_ranks(cell: dict) -> list[dict]:
    """Rank 0 of the cell, or (PD: its ``ranks`` is [] and ``pd`` holds the plan) of every role instance."""
    if "pd" in cell:
        return [instance["ranks"][0] for instance in cell["pd"]["instances"]]
    return [cell["ranks"][0]]


def admission_line(rank0: dict) -> str | None:
    """SGLang's refusal of this rank's argv and env (the last line of its traceback), or None: admitted."""
    args = parse_server_args(rank0["argv"][ENTRYPOINT_LEN:])
    try:
        admit(args, SglangEnv.from_environ(rank0["env"]), guess_architecture(args.model_path, None))
    except Rejected as rejected:
        return rejected.line
    return None


@pytest.mark.parametrize("cell", CELLS, ids=[c["id"] for c in CELLS])
def test_expectation_matches_sglang_admission(cell):
    expect = cell["expect"]
    refusals = [line for line in map(admission_line, first_ranks(cell)) if line is not None]
    if expect["outcome"] == "serve":
        assert refusals == [], f"SGLang would refuse this cell: {refusals}"
    else:
        assert refusals, f"SGLang would admit this cell, but it expects /{expect['message']}/"
        assert re.search(expect["message"], refusals[0]), f"SGLang says {refusals[0]!r}"
