"""The simulator takes the pinned SGLang release's argv and refuses what SGLang refuses, with SGLang's own words.

Messages are copied from that release's source (arg_groups/speculative_hook.py, parallel_hook.py,
deepseek_v4_hook.py, overrides.py); a rejected launch exits 1 and its last stderr line is the
exception SGLang would print. argv SGLang's argparse refuses exits 2.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import requests

from tests.cli_under_test import DSPARK_CI
from tests.sim_fixtures import run_sim_to_exit, sim  # noqa: F401 (sim is a fixture)

DSPARK = ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", "sim/draft"]
DFLASH = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "sim/draft"]
DPATTN8 = ["--tp-size", "8", "--attn-dp-size", "8", "--enable-dp-lm-head"]
DSV4 = "deepseek-ai/DeepSeek-V4-Flash"
DSV4_CP = ["--tp-size", "8", "--enable-prefill-cp", "--cp-strategy", "interleave"]
STATIC_OFF = {"SGLANG_RAGGED_VERIFY_MODE": "compact"}
COORDINATION = {"SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION": "1"}

REJECTIONS = [
    pytest.param(DSPARK + ["--tp-size", "8", "--attn-dp-size", "8"], {}, "sim/tiny",
                 "ValueError: DSpark with dp attention requires --enable-dp-lm-head.",
                 id="dspark-dp-attention-needs-dp-lm-head"),
    pytest.param(DSPARK + ["--tp-size", "8", "--dp-size", "8", "--enable-dp-attention"], {}, "sim/tiny",
                 "ValueError: DSpark with dp attention requires --enable-dp-lm-head.",
                 id="dspark-deprecated-enable-dp-attention-counts-as-attention-dp"),
    pytest.param(DSPARK + DPATTN8 + ["--moe-a2a-backend", "deepep"], {}, "sim/tiny",
                 "ValueError: DSpark with dp attention supports moe_a2a_backend 'none' (built-in TP MoE), "
                 "'megamoe', or 'mori', got 'deepep'.", id="dspark-dp-attention-deepep"),
    pytest.param(DSPARK + DPATTN8 + ["--moe-a2a-backend", "megamoe"], STATIC_OFF, "sim/tiny",
                 "ValueError: DSpark DP MoE or prefill coordination requires SGLANG_RAGGED_VERIFY_MODE=static.",
                 id="dspark-dp-moe-needs-static-verify"),
    pytest.param(DSPARK + DPATTN8, {**STATIC_OFF, **COORDINATION}, "sim/tiny",
                 "ValueError: DSpark DP MoE or prefill coordination requires SGLANG_RAGGED_VERIFY_MODE=static.",
                 id="dspark-prefill-coordination-needs-static-verify"),
    pytest.param(DSPARK + ["--tp-size", "8", "--attn-dp-size", "4", "--attn-cp-size", "2", "--enable-dp-lm-head"],
                 {}, "sim/tiny", "ValueError: DSpark with dp attention does not support context parallel "
                 "(attn_cp_size=2).", id="dspark-dp-attention-with-context-parallel"),
    pytest.param(DSPARK + DPATTN8 + ["--speculative-moe-a2a-backend", "deepep"], {}, "sim/tiny",
                 "ValueError: DSpark ignores --speculative-moe-a2a-backend; with dp attention it must match the "
                 "target moe_a2a_backend='none' (got 'deepep').", id="dspark-speculative-a2a-mismatch"),
    pytest.param(DSPARK + ["--device", "cpu"], {}, "sim/tiny",
                 "ValueError: DSpark speculative decoding only supports CUDA, NPU or XPU device.", id="dspark-on-cpu"),
    pytest.param(DSPARK + ["--pp-size", "2"], {}, "sim/tiny",
                 "ValueError: DSpark pipeline parallelism requires PD prefill; decode and non-disaggregated "
                 "serving require pp_size == 1.", id="dspark-pipeline-parallel"),
    pytest.param(DSPARK + ["--speculative-dspark-block-size", "0"], {}, "sim/tiny",
                 "ValueError: DSpark requires --speculative-dspark-block-size to be positive, got 0.",
                 id="dspark-block-size-zero"),
    pytest.param(DSPARK + ["--speculative-dspark-block-size", "3", "--speculative-num-draft-tokens", "5"], {},
                 "sim/tiny", "ValueError: DSpark speculative_num_draft_tokens must equal gamma + 1 (= 4 for "
                 "gamma=3), but got speculative_num_draft_tokens=5.", id="dspark-draft-tokens-not-gamma-plus-one"),
    pytest.param(["--speculative-algorithm", "DFLASH"], {}, "sim/tiny",
                 "ValueError: DFLASH speculative decoding requires setting --speculative-draft-model-path.",
                 id="dflash-without-draft-model"),
    pytest.param(DFLASH + ["--tp-size", "8", "--attn-dp-size", "8"], {}, "sim/tiny",
                 "ValueError: DFLASH with dp attention requires --enable-dp-lm-head.",
                 id="dflash-dp-attention-needs-dp-lm-head"),
    # handle_speculative_decoding's generic check runs before _handle_dflash's own: SGLang's order wins
    pytest.param(DFLASH + DPATTN8, COORDINATION, "sim/tiny",
                 "ValueError: DP spec/prefill coordination requires single-layer EAGLE, EAGLE3 or DSPARK",
                 id="dflash-prefill-coordination-refused-by-the-generic-check-first"),
    pytest.param(DFLASH + ["--pp-size", "2"], {}, "sim/tiny",
                 "ValueError: Currently DFLASH speculative decoding only supports pp_size == 1.",
                 id="dflash-pipeline-parallel"),
    pytest.param(DFLASH + ["--speculative-dflash-block-size", "8", "--speculative-num-draft-tokens", "4"], {},
                 "sim/tiny", "ValueError: Both --speculative-num-draft-tokens and --speculative-dflash-block-size "
                 "are set but they differ. For DFLASH they must match. speculative_num_draft_tokens=4, "
                 "speculative_dflash_block_size=8.", id="dflash-block-size-mismatch"),
    pytest.param(["--speculative-algorithm", "NGRAM", "--tp-size", "2", "--attn-dp-size", "2"], {}, "sim/tiny",
                 "ValueError: Currently ngram speculative decoding does not support dp attention.",
                 id="ngram-dp-attention"),
    pytest.param(["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "d", "--tp-size", "2",
                  "--attn-dp-size", "2"], {}, "sim/tiny",
                 "ValueError: Currently standalone speculative decoding does not support dp attention.",
                 id="standalone-dp-attention"),
    pytest.param(["--speculative-algorithm", "medusa"], {}, "sim/tiny",
                 "ValueError: Unknown speculative algorithm name: MEDUSA", id="unknown-speculative-algorithm"),
    pytest.param([], COORDINATION, "sim/tiny",
                 "ValueError: DP spec/prefill coordination requires single-layer EAGLE, EAGLE3 or DSPARK",
                 id="prefill-coordination-without-speculation"),
    pytest.param(DSPARK, {"SGLANG_RAGGED_VERIFY_MODE": "fast"}, "sim/tiny",
                 "ValueError: invalid SGLANG_RAGGED_VERIFY_MODE='fast'; expected one of 'static', 'cap-accept', "
                 "'compact'", id="invalid-ragged-verify-mode"),
    pytest.param(["--tp-size", "4", "--attn-dp-size", "2", "--dp-size", "2"], {}, "sim/tiny",
                 "ValueError: --dp-size 2 with --attn-dp-size 2: data-parallel replicas combined with attention "
                 "data parallelism are not supported.", id="dp-replicas-with-attention-dp"),
    pytest.param(["--dp-size", "2", "--enable-dp-lm-head"], {}, "sim/tiny",
                 "AssertionError: --enable-dp-lm-head requires attention DP (--attn-dp-size).",
                 id="dp-lm-head-with-dp-replicas-but-no-attention-dp"),
    pytest.param(["--enable-prefill-cp"], {}, "sim/tiny",
                 "ValueError: --cp-strategy must be set when --enable-prefill-cp is enabled.",
                 id="prefill-cp-without-strategy"),
    pytest.param(["--tp-size", "8", "--enable-prefill-cp"], {}, DSV4,
                 "ValueError: DeepSeekV4 only supports interleave/zigzag CP strategy, got None",
                 id="dsv4-prefill-cp-without-strategy"),
    pytest.param(["--tp-size", "8", "--enable-prefill-cp", "--cp-strategy", "zigzag"], {}, DSV4,
                 "ValueError: DeepSeekV4 zigzag CP requires the NPU backend; CUDA/HIP backends reindex with "
                 "interleave order.", id="dsv4-zigzag-cp-on-cuda"),
    pytest.param(DSV4_CP + ["--attn-dp-size", "2"], {}, DSV4,
                 "AssertionError: For round-robin split mode, dp attention is not supported.",
                 id="dsv4-cp-with-attention-dp"),
    pytest.param(["--tp-size", "16", "--enable-prefill-cp", "--cp-strategy", "interleave"], {}, DSV4,
                 "AssertionError: Context parallel only supports single machine (tp_size <= 8). Cross-machine CP "
                 "has precision issues.", id="dsv4-cp-across-nodes"),
    pytest.param(DSV4_CP + ["--moe-a2a-backend", "nixl"], {}, DSV4,
                 "ValueError: DeepSeekV4 CP supports moe_a2a_backend in ('none', 'deepep', 'megamoe', 'mori'), "
                 "got 'nixl'.", id="dsv4-cp-a2a-nixl"),
    pytest.param(["--speculative-algorithm", "NEXTN"], {}, DSV4,
                 "AssertionError: Only EAGLE and DSPARK speculative algorithms are supported for "
                 "DeepseekV4ForCausalLM", id="dsv4-nextn-spelling"),
    pytest.param(["--speculative-algorithm", "EAGLE"], {}, DSV4,
                 "AssertionError: Only EAGLE speculative algorithm with topk == 1 is supported for "
                 "DeepseekV4ForCausalLM", id="dsv4-eagle-needs-explicit-topk-1"),
]


@pytest.mark.parametrize("args, env, model, last_line", REJECTIONS)
def test_rejected_launch_exits_1_with_sglangs_message(args, env, model, last_line):
    result = run_sim_to_exit(args, env, model=model)
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == last_line
    assert "Traceback (most recent call last):" in result.stderr


def test_dspark_without_draft_model_needs_one_unless_the_checkpoint_bundles_it(tmp_path):
    local_model = tmp_path / "model"
    local_model.mkdir()
    (local_model / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"]}')
    result = run_sim_to_exit(["--speculative-algorithm", "DSPARK"], model=str(local_model))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "ValueError: DSpark dense speculative decoding requires setting --speculative-draft-model-path.")


@pytest.mark.parametrize("args, message", [
    pytest.param(["--model-path", "m", "--no-such-flag"], "unrecognized arguments: --no-such-flag",
                 id="unknown-flag"),
    pytest.param(["--model-path", "m", "--tp-size", "eight"],
                 "argument --tp-size/--tensor-parallel-size: invalid int value: 'eight'", id="bad-integer"),
    pytest.param(["--model-path", "m", "--moe-a2a-backend", "nccl"], "argument --moe-a2a-backend: invalid choice",
                 id="bad-choice"),
])
def test_argv_sglang_refuses_exits_2(args, message):
    result = subprocess.run([sys.executable, "-m", "dspark_ci.sglang_sim", *args], capture_output=True, text=True,
                            timeout=20)
    assert result.returncode == 2
    assert message in result.stderr.strip().splitlines()[-1]


def test_missing_model_path_exits_2():
    result = subprocess.run([sys.executable, "-m", "dspark_ci.sglang_sim", "--port", "1"], capture_output=True,
                            text=True, timeout=20)
    assert result.returncode == 2
    assert "the following arguments are required: --model-path/--model" in result.stderr


def test_dspark_ci_sim_verb_is_the_same_server():
    result = subprocess.run([*DSPARK_CI, "sim", "--model-path", "m", "--speculative-algorithm", "DSPARK",
                             "--device", "cpu"], capture_output=True, text=True, timeout=20)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "ValueError: DSpark speculative decoding only supports CUDA, NPU or XPU device.")
    listed = subprocess.run([*DSPARK_CI, "--help"], capture_output=True, text=True, timeout=20)
    assert "simulated SGLang server" in listed.stdout


# --- what SGLang resolves, visible in /server_info --------------------------------------------

ADMITTED = [
    pytest.param(DSPARK, "sim/tiny", {"speculative_algorithm": "DSPARK", "speculative_num_draft_tokens": 8,
                                      "speculative_num_steps": 1, "speculative_eagle_topk": 1}, 1,
                 id="dspark-default-gamma-7"),
    pytest.param(["--speculative-algorithm", "dspark", "--speculative-draft-model-path", "d",
                  "--speculative-dspark-block-size", "3"], "sim/tiny",
                 {"speculative_algorithm": "DSPARK", "speculative_num_draft_tokens": 4}, 1, id="dspark-gamma-3"),
    pytest.param(DSPARK + ["--tp-size", "4", "--dp-size", "4", "--enable-dp-attention", "--enable-dp-lm-head"],
                 "sim/tiny", {"attn_dp_size": 4, "dp_size": 1}, 4, id="deprecated-dp-attention-becomes-attn-dp"),
    pytest.param(DSPARK + ["--tp-size", "8", "--attn-dp-size", "8", "--enable-dp-lm-head", "--moe-a2a-backend",
                           "megamoe"], "sim/tiny", {"attn_dp_size": 8, "moe_a2a_backend": "megamoe"}, 8,
                 id="dspark-dp-moe-with-default-static-verify"),
    pytest.param(["--dp-size", "2"], "sim/tiny", {"dp_size": 2, "speculative_algorithm": None}, 2,
                 id="plain-dp-replicas"),
    # overrides._data_parallelism_defaults: one DP rank turns the DP LM head off instead of refusing it
    # (checked against the pinned release's resolver by tests/test_sim_conformance.py).
    pytest.param(["--enable-dp-lm-head"], "sim/tiny", {"enable_dp_lm_head": False}, 1,
                 id="dp-lm-head-quietly-off-with-one-dp-rank"),
    pytest.param(DSV4_CP + DSPARK + ["--enable-dp-lm-head"], DSV4, {"enable_dp_lm_head": False, "attn_cp_size": 8},
                 1, id="dsv4-cp-with-dp-lm-head-and-one-dp-rank"),
    pytest.param(DFLASH, "sim/tiny", {"speculative_num_draft_tokens": 16}, 1, id="dflash-default-block"),
    pytest.param(DFLASH + ["--speculative-dflash-block-size", "8"], "sim/tiny",
                 {"speculative_num_draft_tokens": 8}, 1, id="dflash-block-8"),
    pytest.param(["--speculative-algorithm", "NEXTN"], "sim/tiny",
                 {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
                  "speculative_num_draft_tokens": 4}, 1, id="nextn-is-eagle-auto-params"),
    pytest.param(["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "d"],
                 "meta-llama/Llama-3.1-8B-Instruct",
                 {"speculative_num_steps": 5, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8}, 1,
                 id="eagle-llama-auto-params"),
    pytest.param(DSPARK + ["--device", "npu", "--tp-size", "8", "--enable-prefill-cp", "--cp-strategy", "zigzag"],
                 DSV4, {"attn_cp_size": 8, "attn_dp_size": 1}, 1, id="dsv4-zigzag-cp-on-npu"),
]


@pytest.mark.parametrize("args, model, resolved, dp_ranks", ADMITTED)
def test_admitted_launch_reports_sglangs_resolution(sim, args, model, resolved, dp_ranks):
    server = sim(args, model=model)
    info = requests.get(server.url("/server_info"), timeout=5).json()
    assert {key: info[key] for key in resolved} == resolved
    assert len(info["internal_states"]) == dp_ranks
