"""``dspark-ci run --rejections resolver``: expected rejections the pinned SGLang release's own resolver decides on
this CPU are recorded as decided by it and never launched; hardware-bound ones still launch. Needs the resolver
environment (``bash .ci/sglang-resolver.sh``); skipped with the reason where no Python with sglang is found.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from dspark_ci.ground.sglang.release import DEFAULT_VERSION

from tests.cli_under_test import DSPARK_CI

REPO = Path(__file__).resolve().parent.parent
NIGHTLY = str(REPO / "matrices" / "nightly.yaml")
DECIDED = ("dsv4-flash-tp8-dp2-dpattn-a2a-none-dspark-cuda", "dsv4-flash-tp8-dp8-dpattn-lmhead-a2a-deepep-dspark-cuda",
           "dsv4-flash-tp8-dp2-dpattn-lmhead-cp4-a2a-none-dspark-cuda",
           "dsv4-flash-tp8-dp8-dpattn-lmhead-a2a-none-dflash-cuda")
HARDWARE_BOUND = ("dsv4-flash-tp8-dp8-dpattn-lmhead-a2a-megamoe-dspark-rv-compact-cuda",)  # megamoe's SM90 probe
WRONG_MESSAGE = f"""\
description: an expected rejection whose message is not SGLang's
sglang: ">={DEFAULT_VERSION}"
hardware: {{cuda: h200}}
defaults: {{model: deepseek-ai/DeepSeek-V4-Flash, model_slug: dsv4-flash, device: cuda, gpus_per_node: 8, tp: 8,
           moe_a2a_backend: none, speculative_algorithm: DSPARK}}
include:
  - {{dp: 2, enable_dp_attention: true, expect: {{outcome: reject, message: 'some other refusal'}}}}
"""


def run(tmp_path: Path, sglang_python: str, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "run"
    env = {**os.environ, "CI": "true", "DSPARK_SGLANG_PYTHON": sglang_python,
           "DSPARK_STATE_DIR": str(tmp_path / "state"), "DSPARK_HISTORY": str(tmp_path / "history.sqlite")}
    done = subprocess.run([*DSPARK_CI, "run", *args, "--rejections", "resolver", "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    results = json.loads((out / "results.json").read_text()) if (out / "results.json").is_file() else {}
    return done, {cell["id"]: cell for cell in results.get("cells", [])}


def test_rejections_the_resolver_decides_are_not_launched_and_hardware_bound_ones_are(tmp_path, sglang_python):
    done, cells = run(tmp_path, sglang_python, NIGHTLY, *(f"--cell={c}" for c in (*DECIDED, *HARDWARE_BOUND)))
    assert done.returncode == 0, done.stderr[-3000:]
    for cell_id in DECIDED:
        cell = cells[cell_id]
        assert (cell["status"], cell["decided_by"]) == ("rejected_as_expected", "resolver")
        assert cell["sglang_error"].startswith(("ValueError: ", "AssertionError: "))
        assert not (tmp_path / "run" / "logs" / cell_id).exists()  # nothing was launched for it
    for cell_id in HARDWARE_BOUND:
        assert "decided_by" not in cells[cell_id] and (tmp_path / "run" / "logs" / cell_id / "0.log").is_file()
    report = (tmp_path / "run" / "report.md").read_text()
    assert report.count(f"Decided by SGLang {DEFAULT_VERSION}'s resolver, not launched.") == len(DECIDED)


def test_a_rejection_with_another_message_fails_decided_by_the_resolver(tmp_path, sglang_python):
    matrix = tmp_path / "wrong.yaml"
    matrix.write_text(WRONG_MESSAGE)
    done, cells = run(tmp_path, sglang_python, str(matrix))
    assert done.returncode == 1, done.stderr[-3000:]
    (cell,) = cells.values()
    assert (cell["status"], cell["decided_by"]) == ("failed", "resolver")
    assert "requires --enable-dp-lm-head" in cell["error"] and "some other refusal" in cell["error"]
