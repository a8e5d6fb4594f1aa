"""A broken matrix gets one message naming file:line and the fix, exit code 2, never a traceback.

Each case is a small matrix as a user might mistype it; the test runs `dspark-ci plan` on it and
checks what the user reads on stderr.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from dspark_ci.ground.sglang.release import DEFAULT_VERSION

from dspark_ci.cli import main

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def in_repo_root(monkeypatch):
    """Shipped matrices are named as a user in the repository root names them."""
    monkeypatch.chdir(REPO)


# A valid head most cases build on: line 1 hardware, line 2 defaults, line 3 model.
HEAD = "hardware: {cuda: h200, npu: a3}\ndefaults:\n  model: org/model\n"


@dataclass(frozen=True)
class Case:
    yaml: str
    line: int  # the line the message must name
    problem: str  # text the message must contain
    fix: str  # the advice it must contain


CASES = {
    "bad-yaml-unclosed-bracket": Case(HEAD + "  tp: [8\ninclude: [{}]\n", 5,
                                      "not valid YAML", "unclosed quote or bracket"),
    "bad-yaml-indentation": Case(HEAD + "  tp: 8\n   dp: 2\n", 5,
                                 "not valid YAML: mapping values are not allowed here", "indentation"),
    "top-level-is-a-list": Case("- tp: 8\n- tp: 4\n", 1,
                                "must be a YAML mapping", "start from matrices/smoke.yaml"),
    "unknown-top-level-key": Case(HEAD + "axis:\n  dp: [2, 4]\n", 4,
                                  "unknown top-level key 'axis'", "did you mean 'axes'?"),
    "unknown-cell-key-typo": Case(HEAD + "  moe_a2a_backen: none\ninclude: [{}]\n", 4,
                                  "unknown defaults key 'moe_a2a_backen'", "did you mean 'moe_a2a_backend'?"),
    "unknown-cell-key-sglang-spelling": Case(HEAD + "  tp_size: 8\ninclude: [{}]\n", 4,
                                             "unknown defaults key 'tp_size'", "did you mean 'tp'?"),
    "unknown-key-in-include": Case(HEAD + "include:\n  - tp: 8\n    nnode: 2\n", 6,
                                   "unknown include entry key 'nnode'", "did you mean 'nnodes'?"),
    "duplicate-yaml-key": Case(HEAD + "  tp: 8\n  tp: 4\ninclude: [{}]\n", 5,
                               "key 'tp' appears twice in this mapping (first at line 4)", "keep one of them"),
    "tp-not-an-integer": Case(HEAD + "  tp: eight\ninclude: [{}]\n", 4,
                              "tp must be an integer >= 1, got 'eight'", "write it like `tp: 8`"),
    "tp-is-a-boolean": Case(HEAD + "  tp: true\ninclude: [{}]\n", 4,
                            "tp must be an integer >= 1, got True", "write it like `tp: 8`"),
    "nnodes-zero": Case(HEAD + "  nnodes: 0\ninclude: [{}]\n", 4,
                        "nnodes must be an integer >= 1, got 0", "write it like `nnodes: 2`"),
    "flag-not-a-boolean": Case(HEAD + "  enable_dp_lm_head: maybe\ninclude: [{}]\n", 4,
                               "enable_dp_lm_head must be true or false", "enable_dp_lm_head: true"),
    "a2a-backend-typo": Case(HEAD + "  moe_a2a_backend: deepepp\ninclude: [{}]\n", 4,
                             "moe_a2a_backend must be one of none, deepep", "did you mean 'deepep'?"),
    "unknown-device": Case(HEAD + "  device: gpu\ninclude: [{}]\n", 4,
                           "device must be one of cuda, npu", "did you mean 'cuda'?"),
    "algorithm-lowercase": Case(HEAD + "  speculative_algorithm: dspark\ninclude: [{}]\n", 4,
                                "speculative_algorithm must be one of DSPARK", "did you mean 'DSPARK'?"),
    "tp6-with-dp4-attention-dp": Case(HEAD + "  tp: 6\ninclude:\n  - dp: 4\n    enable_dp_attention: true\n", 7,
                                      "tp 6 is not divisible by dp 4 under attention DP (tp from line 4",
                                      "use a dp that divides tp (1, 2, 3, 6)"),
    "tp6-dp4-from-axes": Case(HEAD + "  tp: 6\n  enable_dp_attention: true\naxes:\n  dp: [2, 4]\n", 7,
                              "tp 6 is not divisible by dp 4", "use a dp that divides tp"),
    "cp-does-not-divide-tp": Case(HEAD + "  tp: 8\n  cp: 3\ninclude: [{}]\n", 5,
                                  "cp 3 does not divide tp 8", "use a cp that divides tp (1, 2, 4, 8)"),
    "dp-times-cp-does-not-divide-tp": Case(
        HEAD + "  tp: 8\ninclude:\n  - {enable_dp_attention: true, dp: 4, cp: 4}\n", 6,
        "tp 8 is not divisible by dp·cp = 16", "dp·cp must divide tp"),
    "more-ranks-than-gpus": Case(HEAD + "  tp: 16\n  gpus_per_node: 8\ninclude: [{}]\n", 5,
                                 "needs 16 accelerators (tp·pp·dp) but nnodes·gpus_per_node = 8",
                                 "raise nnodes or gpus_per_node"),
    "tp-times-pp-too-large-on-two-nodes": Case(HEAD + "  nnodes: 2\n  tp: 16\n  pp: 2\ninclude: [{}]\n", 6,
                                               "needs 32 accelerators", "lower tp/pp/dp"),
    "plain-dp-counts-replicas": Case(HEAD + "  tp: 8\n  dp: 2\ninclude: [{}]\n", 5,
                                     "needs 16 accelerators (tp·pp·dp)", "raise nnodes"),
    "ranks-not-split-over-nodes": Case(HEAD + "  nnodes: 2\n  tp: 3\ninclude: [{}]\n", 5,
                                       "3 ranks cannot be split evenly over 2 nodes", "multiple of nnodes"),
    "attention-dp-with-dp-1": Case(HEAD + "  enable_dp_attention: true\ninclude: [{}]\n", 4,
                                   "enable_dp_attention needs dp > 1", "set dp to the number of attention-DP groups"),
    "cp-strategy-without-cp": Case(HEAD + "  cp_strategy: zigzag\ninclude: [{}]\n", 4,
                                   "cp_strategy zigzag has no effect with cp 1", "set cp > 1"),
    "block-size-for-eagle": Case(HEAD + "  speculative_algorithm: EAGLE\n  speculative_block_size: 4\n"
                                 "include: [{}]\n", 5,
                                 "speculative_block_size is set but speculative_algorithm is 'EAGLE'",
                                 "block sizes exist for DSPARK and DFLASH"),
    "draft-without-algorithm": Case(HEAD + "  draft_model: org/draft\ninclude: [{}]\n", 4,
                                    "draft_model is set but speculative_algorithm is not",
                                    "set speculative_algorithm"),
    "duplicate-cell-id": Case(HEAD + "include:\n  - tp: 8\n  - {tp: 8, env: {DSPARK_SIM_SEED: '1'}}\n", 6,
                              "cell id 'model-tp8-a2a-none-cuda' is already used by the cell at",
                              "give one of them `id_suffix:`"),
    "id-and-id-suffix": Case(HEAD + "include:\n  - {id: my-cell, id_suffix: x}\n", 5,
                             "id and id_suffix are both set", "drop id_suffix"),
    "bad-id-characters": Case(HEAD + "include:\n  - {id: My Cell}\n", 5,
                              "id must be lowercase letters", "write it like `id: dsv4-flash-tp8-custom`"),
    "unknown-launch-flag-in-extra-args": Case(
        HEAD + "  extra_args:\n    - --mem-fraction-static\n    - '0.8'\n    - --tp-sise\ninclude: [{}]\n", 7,
        f"--tp-sise is not a flag of SGLang {DEFAULT_VERSION}'s launch_server", "did you mean '--tp-size'?"),
    "extra-args-repeat-a-config-flag": Case(HEAD + "  extra_args: [--tp-size, '4']\ninclude: [{tp: 8}]\n", 5,
                                            "extra_args repeats --tp-size, which the matrix config already sets",
                                            "set the config key instead"),
    "secret-as-literal": Case(HEAD + "  env: {HF_TOKEN: hf_abcdef}\ninclude: [{}]\n", 4,
                              "env HF_TOKEN looks like a secret and holds a literal value",
                              "write `HF_TOKEN: ${HF_TOKEN}`"),
    "env-value-boolean": Case(HEAD + "  env:\n    SGLANG_ENABLE_CP_V2: true\ninclude: [{}]\n", 5,
                              "env SGLANG_ENABLE_CP_V2 must be a string", 'quote it, e.g. `SGLANG_ENABLE_CP_V2: "1"`'),
    "reject-without-message": Case(HEAD + "include:\n  - expect: {outcome: reject}\n", 5,
                                   "expect.message must be a non-empty string",
                                   "message: \"DSpark with dp attention requires\""),
    "reject-message-bad-regex": Case(HEAD + "include:\n  - expect:\n      outcome: reject\n"
                                     "      message: 'got (deepep'\n", 7,
                                     "expect.message is not a valid regular expression", "escape regex characters"),
    "expect-outcome-typo": Case(HEAD + "include:\n  - expect: {outcome: rejected, message: x}\n", 5,
                                "expect.outcome must be one of serve, reject", "did you mean 'reject'?"),
    "expect-bare-word": Case(HEAD + "include:\n  - expect: reject\n", 5,
                             "expect must be `serve` or a mapping", "outcome: reject"),
    "bad-version-spec": Case('sglang: latest\n' + HEAD + "include: [{}]\n", 1,
                             "sglang must be a PEP 440 version specifier", f'sglang: ">={DEFAULT_VERSION}"'),
    "axis-not-a-list": Case(HEAD + "axes:\n  dp: 4\n", 5,
                            "axis dp must be a non-empty list of values", "write it like `dp: [4, ...]`"),
    "exclude-matches-nothing": Case(HEAD + "  enable_dp_attention: true\n  tp: 8\naxes:\n  dp: [2, 4]\n"
                                    "exclude:\n  - {dp: 8}\n", 9,
                                    "this exclude (dp=8) matches none of the crossed axes", "or remove it"),
    "override-matches-nothing": Case(HEAD + "include: [{tp: 8}]\noverrides:\n  - match: {moe_a2a_backend: deepep}\n"
                                     "    set: {expect: serve}\n", 6,
                                     "this override's match (moe_a2a_backend='deepep') matches no cell",
                                     "values are compared after defaults apply"),
    "override-without-set": Case(HEAD + "include: [{}]\noverrides:\n  - match: {tp: 1}\n", 6,
                                 "this override has no `set`", "give both `match:` and `set:`"),
    "no-cells": Case(HEAD, 1, "this matrix defines no cells", "add `axes:` to cross, or `include:` entries"),
    "no-model": Case("hardware: {cuda: h200}\ninclude:\n  - tp: 8\n", 3, "this cell has no model",
                     "set `model:` in defaults or on the cell"),
    "no-hardware-for-device": Case(HEAD + "include:\n  - {device: xpu}\n", 5,
                                   "cannot derive a runner label: no hardware type for device xpu",
                                   "add `hardware: {xpu: <type>}`"),
    "unknown-suite": Case(HEAD + "  suites: {gpqaa: {}}\ninclude: [{}]\n", 4,
                          "unknown suite 'gpqaa'", "did you mean 'gpqa'?"),
    "unknown-suite-option": Case(HEAD + "  suites:\n    accept: {num_request: 8}\ninclude: [{}]\n", 5,
                                 "unknown accept suite option key 'num_request'", "did you mean 'num_requests'?"),
    "suite-option-wrong-type": Case(HEAD + "  suites:\n    speed: {concurrency: four}\ninclude: [{}]\n", 5,
                                    'speed.concurrency must be int, got "four"', "write it like `concurrency: 8`"),
    "suite-option-not-positive": Case(HEAD + "  suites:\n    gpqa: {repeats: 0}\ninclude: [{}]\n", 5,
                                      "gpqa.repeats must be at least 1, got 0", "write it like `repeats: 1`"),
    "suite-option-not-allowed": Case(HEAD + "  suites:\n    speed: {client: curl}\ninclude: [{}]\n", 5,
                                     "speed.client must be one of aiohttp, openai, got 'curl'",
                                     "write it like `client: aiohttp`"),
}


def run_plan(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_broken_matrix_is_one_message_with_file_line_and_fix(case: Case, tmp_path, capsys):
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(case.yaml)
    code, out, err = run_plan([str(matrix)], capsys)
    assert code == 2, err
    assert out == ""
    assert f"{matrix}:{case.line}: " in err, err
    assert case.problem in err
    assert case.fix in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_duplicate_id_across_two_matrices_names_both_files(tmp_path, capsys):
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(HEAD + "include:\n  - tp: 8\n")
    second.write_text(HEAD + "include:\n  - {}\n  - tp: 8\n")
    code, _, err = run_plan([str(first), str(second)], capsys)
    assert code == 2
    assert f"{second}:6: cell id 'model-tp8-a2a-none-cuda' is already used by the cell at {first}:5" in err


def test_missing_matrix_file_is_bad_input(tmp_path, capsys):
    code, _, err = run_plan([str(tmp_path / "nope.yaml")], capsys)
    assert code == 2
    assert "nope.yaml: no such matrix file" in err


def test_select_matching_nothing_is_bad_input(capsys):
    code, _, err = run_plan(["matrices/smoke.yaml", "--select", "*-xpu"], capsys)
    assert code == 2
    assert "--select: *-xpu matches none of the 3 cells" in err


@pytest.mark.parametrize("fmt", ["table", "github"])
def test_every_format_validates_the_launch_flags(fmt, tmp_path, capsys):
    """An extra flag that repeats a config flag is caught even when no argv is printed."""
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(HEAD + "  extra_args: [--model-path, other]\ninclude: [{}]\n")
    code, _, err = run_plan([str(matrix), "--format", fmt], capsys)
    assert code == 2
    assert "extra_args repeats --model-path" in err


def test_real_process_exits_2_without_traceback(tmp_path):
    """The console script itself (not only main()): exit status 2 and a single line on stderr."""
    matrix = tmp_path / "broken.yaml"
    matrix.write_text(textwrap.dedent("""\
        hardware: {cuda: h200}
        defaults:
          model: org/model
          tp: 6
        include:
          - {dp: 4, enable_dp_attention: true}
        """))
    result = subprocess.run([sys.executable, "-m", "dspark_ci", "plan", str(matrix)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith(f"dspark-ci plan: {matrix}:6: tp 6 is not divisible by dp 4")
    assert "Traceback" not in result.stderr
