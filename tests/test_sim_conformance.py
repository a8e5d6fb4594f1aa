"""The simulator's admission (sglang_sim/admission.py) held to the pinned SGLang release's own resolver.

A generated grid of launches people run (tp 1-16, attention DP in both spellings, DP LM head, a2a backends,
CP flags, every speculative algorithm, two nodes, SGLang's environment variables; DeepSeek-V4 and Llama config
stubs) goes through ``prepare_server_args(argv).resolve_once()`` in the resolver environment
(``bash .ci/sglang-resolver.sh``; ``.ci/run`` installs it) and through the simulator; decision, SGLang's error
line and the resolved draft-token count must be the same. What only hardware decides (megamoe's SM90/SM100
check) is left out and counted. Skipped, with the reason, where no Python with sglang is found.
"""

from __future__ import annotations

import random

import pytest
from dspark_ci.ground.errors import InfraError
from dspark_ci.ground.sglang.release import DEFAULT_VERSION
from dspark_ci.ground.sglang.resolver import MODEL_CONFIG_DIR, Resolution, locate, prepare_argv, resolve
from dspark_ci.sglang_sim.admission import Rejected, SglangEnv, admit, guess_architecture
from dspark_ci.sglang_sim.args import parse_server_args

DSV4 = "deepseek-ai/DeepSeek-V4-Flash"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
DFLASH_DRAFT = "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat"
GRID_SIZE = 400


def _speculative(rng: random.Random, model: str) -> list[str]:
    algorithm = rng.choice(["DSPARK", "DSPARK", "DSPARK", "DFLASH", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE",
                            "NGRAM", None])
    if algorithm is None:
        return []
    argv = ["--speculative-algorithm", algorithm]
    if algorithm == "DSPARK":
        argv += rng.choice([[], [], ["--speculative-num-draft-tokens", "8"], ["--speculative-num-draft-tokens", "5"],
                            ["--speculative-dspark-block-size", "3"],
                            ["--speculative-dspark-block-size", "3", "--speculative-num-draft-tokens", "4"]])
    elif algorithm == "DFLASH":
        argv += rng.choice([["--speculative-draft-model-path", DFLASH_DRAFT], [],
                            ["--speculative-draft-model-path", DFLASH_DRAFT, "--speculative-dflash-block-size", "8"]])
    elif algorithm in ("EAGLE", "EAGLE3", "STANDALONE") and model == LLAMA:
        argv += ["--speculative-draft-model-path", DFLASH_DRAFT]
        argv += rng.choice([[], ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                                 "--speculative-num-draft-tokens", "4"]])
    elif algorithm in ("EAGLE", "NEXTN"):
        argv += rng.choice([[], ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                                 "--speculative-num-draft-tokens", "4"]])
    return argv


def grid(size: int = GRID_SIZE, seed: int = 0) -> list[tuple[list[str], dict[str, str]]]:
    """Launches as (argv without the entrypoint, env); deterministic."""
    rng = random.Random(seed)
    launches = []
    while len(launches) < size:
        model = rng.choice([DSV4, DSV4, DSV4, LLAMA])
        tp = rng.choice([1, 2, 4, 8, 8, 16])
        argv = ["--model-path", model, "--device", "cuda", "--tp-size", str(tp)]
        if tp == 16:
            argv += ["--nnodes", "2", "--node-rank", str(rng.choice([0, 1])), "--dist-init-addr", "127.0.0.1:20000"]
        dp = rng.choice([d for d in (1, 2, 4, 8, tp) if d <= tp])
        argv += rng.choice([[], ["--attn-dp-size", str(dp)], ["--enable-dp-attention", "--dp-size", str(dp)]])
        if rng.random() < 0.6:
            argv.append("--enable-dp-lm-head")
        argv += rng.choice([[], [], ["--moe-a2a-backend", "none"], ["--moe-a2a-backend", "deepep"],
                            ["--moe-a2a-backend", "mori"], ["--moe-a2a-backend", "megamoe"]])
        argv += rng.choice([[], [], ["--enable-prefill-cp", "--cp-strategy", "interleave"],
                            ["--enable-prefill-cp", "--cp-strategy", "zigzag"], ["--enable-prefill-cp"],
                            ["--attn-cp-size", "2"]])
        argv += _speculative(rng, model)
        env = rng.choice([{}, {}, {"SGLANG_RAGGED_VERIFY_MODE": "compact"}, {"SGLANG_RAGGED_VERIFY_MODE": "static"},
                          {"SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION": "1"}, {"SGLANG_ENABLE_CP_V2": "1"}])
        launches.append((argv, env))
    return launches


def simulated(argv: list[str], env: dict[str, str]) -> Resolution:
    args = parse_server_args(prepare_argv(argv, str(MODEL_CONFIG_DIR)))
    try:
        resolved = admit(args, SglangEnv.from_environ(env), guess_architecture(args.model_path, None))
    except Rejected as rejected:
        return Resolution("rejected", rejected.error, rejected.message)
    return Resolution("admitted", resolved={"speculative_num_draft_tokens": resolved.speculative_num_draft_tokens})


def _side(result: Resolution) -> str:
    if result.verdict == "admitted":
        return f"admitted (speculative_num_draft_tokens={result.resolved.get('speculative_num_draft_tokens')})"
    return f"rejected: {result.line}"


@pytest.fixture(scope="module")
def resolver():
    try:
        return locate("local")
    except InfraError as err:
        pytest.skip(f"SGLang's resolver is not installed here: {err}")


def test_the_simulator_admits_exactly_what_sglang_admits(resolver):
    launches = grid()
    described, real = resolve(resolver, launches)
    assert described.version == DEFAULT_VERSION, (f"the grid was written for {DEFAULT_VERSION}, "
                                                   f"the resolver is {described.version}")
    judged = [(launch, truth) for launch, truth in zip(launches, real, strict=False) if truth.verdict != "hardware"]
    unexpected = [truth for truth in real if truth.verdict == "environment"]
    assert not unexpected, f"the resolver environment lacks a module: {unexpected[0].line}"
    assert len(judged) >= 300, f"only {len(judged)} of {len(launches)} launches judged without hardware"
    both = {"admitted": 0, "rejected": 0}
    disagreements = []
    for (argv, env), truth in judged:
        ours = simulated(argv, env)
        if _side(ours) != _side(truth):
            disagreements.append(f"{' '.join(argv)} {env}\n    SGLang:    {_side(truth)}\n    simulator: {_side(ours)}")
        both[truth.verdict] += 1
    assert both["admitted"] >= 50 and both["rejected"] >= 50, f"a one-sided grid proves little: {both}"
    assert not disagreements, (f"{len(disagreements)} of {len(judged)} launches disagree:\n"
                               + "\n".join(disagreements[:40]))
