"""The io_struct messages the front end's scheduler stand-in (sglang_sim/frontend/scheduler.py) speaks, held to
SGLang's own definitions in the front-end venv (``bash .ci/sglang-frontend.sh``).

A release that adds, drops, renames or re-requires a field of one of those messages changes
tests/golden/frontend/io_struct.txt and fails here, naming the message, before a run meets it as a crash in
SGLang's TokenizerManager or DetokenizerManager. Skipped, with the command, where that venv is not installed.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from dspark_ci.ground.install_root import IMPORT_ROOT
from dspark_ci.ground.sglang.release import DEFAULT_VERSION
from dspark_ci.sglang_sim.frontend import frontend_env

from tests.golden_files import GOLDEN_DIR, assert_golden
from tests.simulator_process import FRONTEND_MISSING, frontend_venv

GOLDEN = GOLDEN_DIR / "frontend" / "io_struct.txt"


@pytest.fixture(scope="module")
def probe() -> dict:
    python = frontend_venv()
    if python is None:
        pytest.skip(FRONTEND_MISSING)
    done = subprocess.run([python, "-m", "dspark_ci.sglang_sim.frontend.io_schema"], capture_output=True, text=True,
                          timeout=300, cwd=IMPORT_ROOT, env=frontend_env(os.environ))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_the_messages_the_stand_in_speaks_are_the_pinned_releases(probe):
    assert probe["sglang"] == DEFAULT_VERSION, f"the front-end venv holds sglang {probe['sglang']}, not the pinned one"
    # One line per message: its fields in order, "*" marking those a sender must set.
    lines = [f"{name}: " + ", ".join(field + ("*" if required else "") for field, required in fields)
             for name, fields in probe["messages"].items()]
    assert_golden(GOLDEN, "\n".join(lines) + "\n")


def test_one_step_reaches_the_detokenizer_as_sent(probe):
    step = probe["step"]
    assert step["type"] == "BatchTokenIDOutput"
    assert step["output_ids"] == [[10, 11, 12]], "output_ids are the step's new ids (deltas)"
    assert step["decode_ids"] == [[5, 6, 7, 10, 11, 12]] and step["read_offsets"] == [3], \
        "decode_ids carry the prompt's last ids first, read_offset where the output starts"
    assert (step["completion_tokens"], step["spec_verify_ct"], step["spec_num_correct_drafts"]) == ([3], [1], [2])
    assert step["finished_reasons"] == [{"type": "length", "length": 3}]
    assert step["sampling_fields_missing"] == [], "SamplingParams lost fields the stand-in reads"
