"""--server sglang-engine without an engine: what a cell's argv becomes on this CPU, what is refused before launch,
and which Python and volumes each launcher gives the engine."""

from __future__ import annotations

from pathlib import Path

import pytest
from dspark_ci.ground.sglang.release import DEFAULT_VERSION
from dspark_ci.launchers.contract import LaunchContext
from dspark_ci.launchers.docker.options import DockerOptions
from dspark_ci.launchers.docker.spec import engine_volumes, image_for
from dspark_ci.launchers.docker.tuning import DockerTuning
from dspark_ci.launchers.materialize import server_argv, server_python
from dspark_ci.launchers.plan_types import RankCommand
from dspark_ci.sglang_sim.cpu_engine import (
    ENTRY,
    MODEL_DIR,
    engine_argv,
    engine_env,
    flag_value,
    refusal,
    threads_bind,
    unserved_model_modules,
    workdir,
)

from tests.test_run_cli import SMOKE, Run

CELL = ["--model-path", "dspark-ci/tiny-llama", "--device", "cuda", "--tp-size", "2", "--moe-a2a-backend", "none",
        "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4", "--host", "127.0.0.1",
        "--port", "30000", "--attention-backend=fa3", "--mem-fraction-static", "0.9"]


def test_serving_and_speculative_flags_are_kept_and_the_hardware_is_the_cpus():
    argv = engine_argv(CELL, Path("/m/target"), Path("/m/draft"))
    for flag, value in (("--tp-size", "2"), ("--speculative-algorithm", "NGRAM"), ("--port", "30000"),
                        ("--speculative-num-draft-tokens", "4"), ("--model-path", "dspark-ci/tiny-llama"),
                        ("--served-model-name", "dspark-ci/tiny-llama"), ("--device", "cpu"), ("--dtype", "bfloat16"),
                        ("--load-format", "safetensors"), ("--mem-fraction-static", "0.6"),
                        ("--max-total-tokens", "4096")):
        assert flag_value(argv, flag) == value, (flag, argv)
    assert argv.count("--device") == 1 and argv.count("--mem-fraction-static") == 1
    assert not any(word.startswith("--attention-backend=") for word in argv)
    assert "--skip-server-warmup" in argv and "--enable-metrics" in argv
    assert "--speculative-draft-model-path" not in argv  # NGRAM has no draft model


def test_a_draft_algorithm_gets_the_shipped_draft():
    argv = engine_argv(["--model-path", "x", "--speculative-algorithm", "STANDALONE"], Path("/t"), Path("/d"))
    assert flag_value(argv, "--speculative-draft-model-path") == "/d"
    assert (MODEL_DIR / "draft" / "config.json").is_file() and (MODEL_DIR / "target" / "tokenizer.json").is_file()


@pytest.mark.parametrize("algorithm", ["DSPARK", "DFLASH"])
def test_algorithms_without_a_cpu_branch_are_refused_with_the_reason(algorithm):
    assert f"no CPU branch in SGLang {DEFAULT_VERSION}" in refusal(["--speculative-algorithm", algorithm])
    assert refusal(["--speculative-algorithm", "NGRAM"]) is None and refusal([]) is None


def test_one_core_per_rank_and_node_ranks_side_by_side():
    assert threads_bind(["--tp-size", "1"], 2) is None
    assert threads_bind(["--tp-size", "2"], 2) == "0|1"
    two_nodes = ["--tp-size", "2", "--nnodes", "2", "--node-rank"]
    assert [threads_bind(two_nodes + [rank], 2) for rank in ("0", "1")] == ["0", "1"]
    env = engine_env({"PYTHONPATH": "/elsewhere"}, ["--tp-size", "2"])
    assert env["SGLANG_USE_CPU_ENGINE"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    paths = env["PYTHONPATH"].split(":")
    assert paths[0].endswith("cpu_kernels/boot") and paths[-1] == "/elsewhere"
    # one OpenMP thread a process unless the caller says otherwise
    assert env["OMP_NUM_THREADS"] == "1"
    assert engine_env({"OMP_NUM_THREADS": "4"}, ["--tp-size", "1"])["OMP_NUM_THREADS"] == "4"


def test_the_model_registry_imports_only_the_llama_module(tmp_path, monkeypatch):
    """SGLang's registry skips the modules named in SGLANG_DISABLED_MODEL_ARCHS: all of them but llama's (the
    engine's log then has none of the registry's 'Ignore import error when loading' lines)."""
    models = tmp_path / "sglang" / "srt" / "models"
    models.mkdir(parents=True)
    for name in ("__init__", "registry", "llama", "grok", "qwen3_5"):
        (models / f"{name}.py").write_text("")
    (tmp_path / "sglang" / "__init__.py").write_text("")
    assert unserved_model_modules(models) == ["grok", "qwen3_5", "registry"]
    monkeypatch.syspath_prepend(str(tmp_path))
    assert engine_env({}, ["--tp-size", "1"])["SGLANG_DISABLED_MODEL_ARCHS"] == "grok,qwen3_5,registry"
    assert engine_env({"SGLANG_DISABLED_MODEL_ARCHS": ""}, [])["SGLANG_DISABLED_MODEL_ARCHS"] == ""  # the caller's


def test_every_launcher_runs_the_wrapper_with_the_engine_venv(tmp_path):
    (tmp_path / "engine-cache").mkdir()
    env = {"DSPARK_SGLANG_ENGINE_PYTHON": str(tmp_path / "venv" / "bin" / "python"),
           "DSPARK_CPU_ENGINE_CACHE": str(tmp_path / "engine-cache")}
    rank = RankCommand(node_rank=0, head=("python3", "-m", "sglang.launch_server", "--model-path", "m"), env={})
    python = server_python("sglang-engine", env)
    assert server_argv(rank, "sglang-engine", python)[:2] == [python, str(ENTRY)]
    context = LaunchContext("r1", tmp_path / "run", server="sglang-engine", caller_env=env)
    mounts = engine_volumes(context)
    assert {str(tmp_path / "venv"): {"bind": str(tmp_path / "venv"), "mode": "ro"}}.items() <= mounts.items()
    assert all(volume["mode"] == "ro" for volume in mounts.values())
    assert str(tmp_path / "engine-cache") in mounts  # the converted model and the compiled attention
    tuning = DockerTuning()
    assert image_for(DockerOptions(), context, tuning, None) == tuning.sim_image  # type: ignore[arg-type]


def test_a_dspark_cell_is_refused_before_anything_starts(tmp_path):
    run = Run(tmp_path, SMOKE, "--server", "sglang-engine",
              "--cell", "dsv4-flash-tp8-a2a-none-dspark-b7-cuda")
    done = run()
    assert done.returncode == 2, done.stderr
    assert f"DSPARK has no CPU branch in SGLang {DEFAULT_VERSION}" in done.stderr and not run.out.exists()


def test_intel_amx_only_once_the_cpu_kernels_serve_its_attention():
    assert flag_value(engine_argv(CELL, Path("/t"), Path("/d"), ["assign_req_to_token_pool_cpu"]),
                      "--attention-backend") == "torch_native"
    ops = ["decode_attention_cpu", "extend_attention_cpu", "assign_req_to_token_pool_cpu"]
    assert flag_value(engine_argv(CELL, Path("/t"), Path("/d"), ops), "--attention-backend") == "intel_amx"


def test_the_cells_model_path_leads_to_the_tiny_llama(tmp_path):
    target = tmp_path / "target-123"
    target.mkdir()
    root = workdir(["--model-path", "dspark-ci/tiny-llama"], target)
    assert (root / "dspark-ci" / "tiny-llama").resolve() == target.resolve()
    assert flag_value(engine_argv(["--model-path", "/abs/model"], target, target), "--model-path") == str(target)
