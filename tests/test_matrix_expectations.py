"""Every shipped matrix cell's expectation agrees with the simulator's model of SGLang 0.5.23's admission.

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

from sglang_sim.admission import Rejected, SglangEnv, admit, guess_architecture
from sglang_sim.args import parse_server_args

REPO = Path(__file__).resolve().parent.parent
ENTRYPOINT_LEN = 3  # python3 -m sglang.launch_server


def planned_cells() -> list[dict]:
    matrices = sorted(str(p) for p in (REPO / "matrices").glob("*.yaml"))
    done = subprocess.run([sys.executable, "-m", "dspark_ci", "plan", *matrices, "--format", "json"],
                          capture_output=True, text=True, check=True, cwd=REPO)
    return json.loads(done.stdout)["cells"]


CELLS = planned_cells()


@pytest.mark.parametrize("cell", CELLS, ids=[c["id"] for c in CELLS])
def test_expectation_matches_sglang_admission(cell):
    rank0 = cell["ranks"][0]
    args = parse_server_args(rank0["argv"][ENTRYPOINT_LEN:])
    env = SglangEnv.from_environ(rank0["env"])
    expect = cell["expect"]
    try:
        admit(args, env, guess_architecture(args.model_path, None))
    except Rejected as rejected:
        assert expect["outcome"] == "reject", f"SGLang would refuse this cell: {rejected.line}"
        assert re.search(expect["message"], rejected.line), f"SGLang says {rejected.line!r}"
        return
    assert expect["outcome"] == "serve", f"SGLang would admit this cell, but it expects /{expect['message']}/"
