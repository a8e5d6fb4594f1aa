"""``dspark-ci preflight``: the pinned SGLang release's own resolver on every rank, as a user sees it through the CLI.

Needs the resolver environment (``bash .ci/sglang-resolver.sh``; ``.ci/run`` installs it); skipped with the reason
where no Python with sglang is found. Exit 3 without it is tested everywhere.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from dspark_ci.ground.sglang.release import DEFAULT_VERSION

from tests.cli_under_test import DSPARK_CI

REPO = Path(__file__).resolve().parent.parent
DSPARK_DP = {"model": "deepseek-ai/DeepSeek-V4-Flash", "model_slug": "dsv4-flash", "device": "cuda",
             "gpus_per_node": 8, "tp": 8, "speculative_algorithm": "DSPARK"}


def preflight(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*DSPARK_CI, "preflight", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300, env=env)


def test_nightly_agrees_with_every_judged_cell_and_lists_the_hardware_bound_apart(sglang_python):
    done = preflight("matrices/nightly.yaml", "--sglang", sglang_python)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SGLang {DEFAULT_VERSION}" in done.stdout and "stubbed modules: torchvision" in done.stdout
    assert "0 disagree" in done.stdout
    hardware = done.stdout.split("needs the hardware (not judged on a CPU):")[1]
    assert "megamoe needs a CUDA SM90 GPU" in hardware and "torch_npu is required" in hardware
    assert "rank 1: admitted" in done.stdout  # both nodes of the two-node cell resolved


def _matrix(tmp_path: Path, body: str) -> str:
    path = tmp_path / "m.yaml"
    path.write_text(f"sglang: \">={DEFAULT_VERSION}\"\nhardware: {{cuda: h200}}\ndefaults:\n"
                    + "".join(f"  {k}: {v}\n" for k, v in DSPARK_DP.items()) + body)
    return str(path)


def test_a_wrong_expectation_is_reported_with_sglangs_actual_message(sglang_python, tmp_path):
    matrix = _matrix(tmp_path, "include:\n  - enable_dp_attention: true\n    dp: 8\n    moe_a2a_backend: deepep\n"
                     "    enable_dp_lm_head: true\n    expect: {outcome: reject, message: 'requires --enable-dp-lm-head'}\n")
    done = preflight(matrix, "--sglang", sglang_python)
    assert done.returncode == 1, done.stdout + done.stderr
    assert ("disagreement: dsv4-flash-tp8-dp8-dpattn-lmhead-a2a-deepep-dspark-cuda" in done.stdout)
    assert ("expected reject /requires --enable-dp-lm-head/; SGLang rejects with: rank 0: ValueError: DSpark with dp "
            "attention supports moe_a2a_backend 'none' (built-in TP MoE), 'megamoe', or 'mori', got 'deepep'."
            in done.stdout)


def test_a_wrong_dspark_draft_token_count_is_refused_with_sglangs_message(sglang_python, tmp_path):
    matrix = _matrix(tmp_path, "include:\n  - extra_args: ['--speculative-num-draft-tokens', '5']\n")
    done = preflight(matrix, "--sglang", sglang_python)
    assert done.returncode == 1, done.stdout + done.stderr
    assert ("expected serve; SGLang rejects: rank 0: ValueError: DSpark speculative_num_draft_tokens must equal "
            "gamma + 1 (= 8 for gamma=7), but got speculative_num_draft_tokens=5." in done.stdout)


def test_no_sglang_is_exit_3_saying_how_to_install_it(tmp_path):
    done = preflight("matrices/nightly.yaml", "--sglang", "/usr/bin/env")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "bash .ci/sglang-resolver.sh" in done.stderr and "Traceback" not in done.stderr


def test_an_unknown_cell_is_bad_input():
    done = preflight("matrices/nightly.yaml", "--cell", "nope", "--sglang", "/usr/bin/env")
    assert done.returncode == 2 and "--cell nope: no such cell in the given matrices" in done.stderr
