"""SGLang's admission rules for the flags the simulator understands, in SGLang's order.

Read from ``sglang/srt/arg_groups/pipeline.py`` (the order of the hooks), ``parallel_hook.py``,
``model_hook.py`` + ``deepseek_v4_hook.py`` (DeepSeek-V4 only), ``overrides.py`` and
``speculative_hook.py`` (``handle_speculative_decoding``, ``_handle_dspark``, ``_handle_dflash``,
``_handle_eagle_family``, ``_handle_ngram``). Messages are SGLang's text, character for character.

Each ``Stage`` is one SGLang hook: a guard (does the hook run for this launch), a table of
``Rule`` records checked in order (the first violated one rejects the launch), then the
field values the hook resolves. Stages that validate after resolving are split in two.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dspark_ci.ground.sglang.resolver import MODEL_CONFIG_DIR, MODEL_CONFIGS
from dspark_ci.sglang_sim.args import ServerArgs

DEFAULT_DSPARK_GAMMA = 7  # sglang/srt/speculative/dspark_components/dspark_config.py
DEFAULT_DFLASH_BLOCK_SIZE = 16  # _handle_dflash, when the draft config does not say
RAGGED_VERIFY_MODES = ("static", "cap-accept", "compact")  # speculative/ragged_verify.py
SPECULATIVE_ALGORITHMS = ("DFLASH", "UNO", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM")
DSV4 = "DeepseekV4ForCausalLM"
DSV4_CP_A2A_BACKENDS = ("none", "deepep", "megamoe", "mori")

# --model-path substring (lower case) -> the architecture its config.json would name
ARCHITECTURE_GUESSES = (
    ("deepseek-v4", DSV4), ("deepseek_v4", DSV4), ("deepseekv4", DSV4),
    ("deepseek-v3", "DeepseekV3ForCausalLM"), ("deepseek-r1", "DeepseekV3ForCausalLM"),
    ("llama", "LlamaForCausalLM"), ("qwen3", "Qwen3ForCausalLM"), ("qwen2", "Qwen2ForCausalLM"),
)
DEFAULT_ARCHITECTURE = "Qwen3ForCausalLM"

# Hub ids whose config.json the simulator can read offline: the stubs the resolver uses, and the tiny Llama
# SGLang's real engine serves on this CPU (every --model-path maps to it there).
_HERE = Path(__file__).resolve().parent
KNOWN_MODEL_CONFIGS = {
    **{hub_id: MODEL_CONFIG_DIR / stub / "config.json" for hub_id, stub in MODEL_CONFIGS.items()},
    "dspark-ci/tiny-llama": _HERE / "cpu_engine" / "model" / "target" / "config.json",
}
# utils/hf_transformers/common.py: get_context_length reads the first of these the config states
CONTEXT_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                       "max_position_embeddings")
SGLANG_DEFAULT_CONTEXT_LENGTH = 2048  # get_context_length when the config states none of them
LONGER_CONTEXT_ENV = ("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "SGLANG_IS_IN_CI")

# --device prefix -> the platform class SGLang names in its messages
PLATFORM_CLASSES = {"cuda": "CudaSRTPlatform", "npu": "NPUSRTPlatform", "xpu": "XpuSRTPlatform",
                    "cpu": "CpuSRTPlatform", "musa": "MusaSRTPlatform", "mps": "MpsSRTPlatform"}


def _env_bool(text: str | None) -> bool:
    """SGLang's EnvBool: unparseable values fall back to the default (False)."""
    return (text or "").strip().lower() in ("true", "1", "yes", "y")


@dataclass(frozen=True)
class SglangEnv:
    """The SGLang environment variables that change admission."""

    ragged_verify_mode: str = "static"  # SGLANG_RAGGED_VERIFY_MODE (default "static" in the release)
    dp_spec_prefill_coordination: bool = False  # SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION
    enable_cp_v2_set: bool = False  # SGLANG_ENABLE_CP_V2: deprecated in the release, only warned about
    allow_longer_context: bool = False  # SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN (or SGLANG_IS_IN_CI)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> SglangEnv:
        return cls(ragged_verify_mode=environ.get("SGLANG_RAGGED_VERIFY_MODE", "static"),
                   dp_spec_prefill_coordination=_env_bool(environ.get("SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION")),
                   enable_cp_v2_set="SGLANG_ENABLE_CP_V2" in environ,
                   allow_longer_context=any(_env_bool(environ.get(name)) for name in LONGER_CONTEXT_ENV))


@dataclass(frozen=True)
class View:
    """What a hook sees: the configuration resolved so far, SGLang's env, the model architecture."""

    args: ServerArgs
    env: SglangEnv
    architecture: str

    @property
    def npu(self) -> bool:
        return self.args.platform_is_npu

    @property
    def attn_dp(self) -> bool:
        return self.args.attn_dp_size > 1


@dataclass(frozen=True)
class Rule:
    violated: Callable[[View], bool]
    message: Callable[[View], str]
    error: str = "ValueError"  # SGLang's bare `assert`s raise AssertionError


@dataclass(frozen=True)
class Stage:
    hook: str  # "file.py:function", for the traceback
    runs: Callable[[View], bool]
    rules: tuple[Rule, ...] = ()
    resolve: Callable[[View], dict] | None = None  # fields this hook sets once its rules pass


class Rejected(Exception):
    """A launch SGLang refuses: ``error`` is the exception type, ``message`` its text."""

    def __init__(self, error: str, message: str, hook: str):
        super().__init__(f"{error}: {message}" if message else error)
        self.error, self.message, self.hook = error, message, hook

    @property
    def line(self) -> str:
        """The last line of SGLang's traceback."""
        return f"{self.error}: {self.message}" if self.message else self.error


def guess_architecture(model_path: str, override: str | None) -> str:
    if override:
        return override
    lowered = model_path.lower()
    return next((arch for needle, arch in ARCHITECTURE_GUESSES if needle in lowered), DEFAULT_ARCHITECTURE)


def _always(view: View) -> bool:
    return True


def _transfer_backend(v: View) -> str:
    return str(v.args.other_flags.get("disaggregation_transfer_backend") or "mooncake")


def _msg(text: str) -> Callable[[View], str]:
    return lambda view: text


def _algorithm(*names: str) -> Callable[[View], bool]:
    return lambda view: view.args.speculative_algorithm in names


# --- what some rules need to know -------------------------------------------------------------

def _local_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _dspark_draft_available(view: View) -> bool:
    """A draft bundled in the target checkpoint (dspark_* keys or a dspark/ subfolder).

    A Hub repo id cannot be inspected offline: the simulator assumes it bundles one.
    """
    model = Path(view.args.model_path)
    if not model.is_dir():
        return True
    config = _local_json(model / "config.json")
    bundled = any(key in config for key in ("dspark_block_size", "dspark_markov_rank",
                                            "dspark_noise_token_id", "dspark_target_layer_ids"))
    return bundled or (model / "dspark" / "config.json").is_file()


def _draft_config_gamma(view: View) -> int | None:
    """DSpark's gamma as the draft checkpoint's config states it (``read_draft_checkpoint_config``).

    A local draft (or target bundling it, or its ``dspark/`` subfolder) is read: ``dspark_block_size``, else
    ``block_size``. A Hub id cannot be read offline: the simulator models it as a draft config stating
    DEFAULT_DSPARK_GAMMA (SGLang's default, and what the DeepSeek-V4 config stubs in ground/sglang/model_configs
    state; the real checkpoints' value is not verified here), so ``--speculative-num-draft-tokens`` other than 8
    is refused, as SGLang refuses it for such a draft config.
    """
    args = view.args
    draft = Path(args.speculative_draft_model_path or args.model_path)
    if not draft.is_dir():
        return DEFAULT_DSPARK_GAMMA
    for config_path in (draft / "config.json", draft / "dspark" / "config.json"):
        config = _local_json(config_path)
        for key in ("dspark_block_size", "block_size"):
            if isinstance(config.get(key), int):
                return config[key]
    return None


def _dspark_gamma(view: View) -> int | None:
    """_handle_dspark: the flag, else the draft config, else (no --speculative-num-draft-tokens) the default."""
    args = view.args
    if args.speculative_dspark_block_size is not None:
        return args.speculative_dspark_block_size
    gamma = _draft_config_gamma(view)
    if gamma is None and args.speculative_num_draft_tokens is None:
        return DEFAULT_DSPARK_GAMMA
    return gamma


def _dspark_num_draft_tokens(view: View) -> int | None:
    gamma = _dspark_gamma(view)
    return gamma + 1 if gamma is not None else view.args.speculative_num_draft_tokens


def _model_config(view: View) -> dict:
    """The target's config.json when it can be read offline (a local directory or a known Hub id), else {}."""
    model = Path(view.args.model_path)
    path = model / "config.json" if model.is_dir() else KNOWN_MODEL_CONFIGS.get(view.args.model_path.lower())
    return _local_json(path) if path else {}


def _derived_context_length(view: View) -> int | None:
    """configs/model_config.py ``_derive_context_length``: what the model's config allows (None: unknown)."""
    config = _model_config(view)
    if not config:
        return None
    text = config.get("text_config") or config
    scaling = text.get("rope_scaling") or {}
    factor = scaling.get("factor", 1)
    if "original_max_position_embeddings" in scaling or scaling.get("rope_type") == "llama3":
        factor = 1
    stated = next((text[key] for key in CONTEXT_LENGTH_KEYS if text.get(key) is not None), None)
    return int(factor * stated) if stated is not None else SGLANG_DEFAULT_CONTEXT_LENGTH


def _context_too_long(view: View) -> bool:
    derived = _derived_context_length(view)
    asked = view.args.context_length
    return derived is not None and asked is not None and asked > derived and not view.env.allow_longer_context


def _context_message(view: View) -> str:
    return (f"Warning: User-specified context_length ({view.args.context_length}) is greater than the derived "
            f"context_length ({_derived_context_length(view)}). This may lead to incorrect model outputs or CUDA "
            "errors. Note that the derived context_length may differ from max_position_embeddings in the model's "
            "config. To allow overriding this maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1")


def _platform_class(view: View) -> str:
    device = view.args.device or "cuda"
    return next((cls for prefix, cls in PLATFORM_CLASSES.items() if device.startswith(prefix)), "CudaSRTPlatform")


# --- resolutions ------------------------------------------------------------------------------

def _resolve_defaults(view: View) -> dict:
    args = view.args
    return {"device": args.device or "cuda",  # the simulator stands in for a GPU node
            "served_model_name": args.served_model_name or args.model_path}


def _resolve_deprecated_dp_attention(view: View) -> dict:
    args = view.args
    if not args.enable_dp_attention:
        return {}
    moved = {"attn_dp_size": args.dp_size, "dp_size": 1} if args.attn_dp_size == 1 else {}
    return {**moved, "enable_dp_attention": False}


def _resolve_dp_lm_head_default(view: View) -> dict:
    args = view.args
    one_dp_rank = args.dp_size * args.attn_dp_size == 1
    return {"enable_dp_lm_head": False} if one_dp_rank and args.enable_dp_lm_head else {}


def _resolve_dsv4_defaults(view: View) -> dict:
    return {"max_running_requests": 256} if view.args.max_running_requests is None else {}


def _resolve_dsv4_cp(view: View) -> dict:
    args = view.args
    attn_dp_size = args.attn_dp_size * args.dp_size
    return {"attn_dp_size": attn_dp_size, "dp_size": 1, "moe_dense_tp_size": 1,
            "attn_cp_size": args.tp_size // attn_dp_size}


def _resolve_speculative_algorithm(view: View) -> dict:
    algorithm = view.args.speculative_algorithm
    if algorithm is None:
        return {}
    upper = algorithm.upper()
    return {"speculative_algorithm": "EAGLE" if upper == "NEXTN" else upper}


def _max_running_requests_48(view: View) -> dict:
    return {"max_running_requests": 48} if view.args.max_running_requests is None else {}


def _resolve_dspark(view: View) -> dict:
    args = view.args
    draft = {} if args.speculative_draft_model_path else {"speculative_draft_model_path": args.model_path}
    return {**draft, **_max_running_requests_48(view), "speculative_num_steps": 1, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": _dspark_num_draft_tokens(view)}


def _resolve_dflash(view: View) -> dict:
    args = view.args
    tokens = args.speculative_dflash_block_size or args.speculative_num_draft_tokens or DEFAULT_DFLASH_BLOCK_SIZE
    return {**_max_running_requests_48(view), "speculative_num_steps": 1, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": tokens}


# _auto_choose_speculative_params: architecture -> (num_steps, eagle_topk, num_draft_tokens)
EAGLE_AUTO_PARAMS = {"LlamaForCausalLM": (5, 4, 8), "Grok1ForCausalLM": (5, 4, 8), "Grok1VForCausalLM": (5, 4, 8)}
MTP_IN_CHECKPOINT = ("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", DSV4)


def _resolve_eagle(view: View) -> dict:
    args = view.args
    steps, topk, tokens = args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens
    if steps is None:
        auto = (3, 1, 4) if args.speculative_algorithm == "STANDALONE" else EAGLE_AUTO_PARAMS.get(view.architecture,
                                                                                                 (3, 1, 4))
        steps, topk, tokens = auto
    if topk == 1:
        tokens = steps + 1
    draft = ({"speculative_draft_model_path": args.model_path}
             if view.architecture in MTP_IN_CHECKPOINT and args.speculative_draft_model_path is None else {})
    return {**draft, **_max_running_requests_48(view), "speculative_num_steps": steps,
            "speculative_eagle_topk": topk, "speculative_num_draft_tokens": tokens}


def _resolve_ngram(view: View) -> dict:
    args = view.args
    topk = args.speculative_ngram_max_bfs_breadth
    tokens = args.speculative_num_draft_tokens or 12
    steps = args.speculative_num_steps or tokens // topk
    return {**_max_running_requests_48(view), "speculative_eagle_topk": topk,
            "speculative_num_draft_tokens": tokens, "speculative_num_steps": steps}


# --- the pipeline -----------------------------------------------------------------------------

def _dsv4(view: View) -> bool:
    return view.architecture == DSV4


def _dsv4_prefill_cp(view: View) -> bool:
    return _dsv4(view) and view.args.enable_prefill_cp


STAGES: tuple[Stage, ...] = (
    Stage("parallel_hook.py:handle_deprecated_dp_attention", _always,
          resolve=_resolve_deprecated_dp_attention),
    Stage("serving_hook.py:handle_missing_default_values", _always, resolve=_resolve_defaults),
    Stage("deepseek_v4_hook.py:apply_deepseek_v4_defaults", _dsv4, rules=(
        Rule(lambda v: v.args.speculative_algorithm is not None
             and v.args.speculative_algorithm not in ("EAGLE", "DSPARK"),
             lambda v: f"Only EAGLE and DSPARK speculative algorithms are supported for {v.architecture}",
             "AssertionError"),
        Rule(lambda v: v.args.speculative_algorithm == "EAGLE" and v.args.speculative_eagle_topk != 1,
             lambda v: f"Only EAGLE speculative algorithm with topk == 1 is supported for {v.architecture}",
             "AssertionError"),
    ), resolve=_resolve_dsv4_defaults),
    Stage("deepseek_v4_hook.py:validate_deepseek_v41_features", _dsv4, rules=(
        Rule(lambda v: v.args.enable_encoder_swa_bounded_replay,
             _msg("--enable-encoder-swa-bounded-replay requires DeepSeek-V4.1")),
    )),
    Stage("deepseek_v4_hook.py:validate_deepseek_v4_cp", _dsv4_prefill_cp, rules=(
        Rule(lambda v: v.args.cp_strategy not in ("interleave", "zigzag"),
             lambda v: f"DeepSeekV4 only supports interleave/zigzag CP strategy, got {v.args.cp_strategy}"),
        Rule(lambda v: v.args.cp_strategy == "zigzag" and not v.npu,
             _msg("DeepSeekV4 zigzag CP requires the NPU backend; CUDA/HIP backends "
                  "reindex with interleave order.")),
        Rule(lambda v: v.args.attn_dp_size > 1 and v.args.dp_size > 1,
             lambda v: f"--dp-size {v.args.dp_size} with --attn-dp-size {v.args.attn_dp_size}: "
                       "data-parallel replicas combined with attention data parallelism are not supported.",
             "AssertionError"),
    ), resolve=_resolve_dsv4_cp),
    Stage("deepseek_v4_hook.py:validate_deepseek_v4_cp", _dsv4_prefill_cp, rules=(
        Rule(lambda v: not v.npu and v.args.attn_dp_size != 1,
             _msg("For round-robin split mode, dp attention is not supported."), "AssertionError"),
        Rule(lambda v: not v.npu and v.args.tp_size > 8,
             _msg("Context parallel only supports single machine (tp_size <= 8). "
                  "Cross-machine CP has precision issues."), "AssertionError"),
        Rule(lambda v: v.args.moe_a2a_backend not in DSV4_CP_A2A_BACKENDS,
             lambda v: f"DeepSeekV4 CP supports moe_a2a_backend in {DSV4_CP_A2A_BACKENDS}, "
                       f"got {v.args.moe_a2a_backend!r}."),
    )),
    # overrides.py:_data_parallelism_defaults: with one DP rank the DP LM head is quietly turned off (not refused).
    Stage("overrides.py:_data_parallelism_defaults", _always, resolve=_resolve_dp_lm_head_default),
    Stage("parallel_hook.py:handle_data_parallelism", _always, rules=(
        Rule(lambda v: v.args.attn_dp_size < 1,
             lambda v: f"--attn-dp-size must be positive (got {v.args.attn_dp_size})."),
        Rule(lambda v: v.args.attn_dp_size > 1 and v.args.dp_size > 1,
             lambda v: f"--dp-size {v.args.dp_size} with --attn-dp-size {v.args.attn_dp_size}: "
                       "data-parallel replicas combined with attention data parallelism are not supported."),
        Rule(lambda v: v.attn_dp and v.args.tp_size % v.args.attn_dp_size != 0, _msg(""), "AssertionError"),
        Rule(lambda v: v.args.enable_dp_lm_head and not v.attn_dp,
             _msg("--enable-dp-lm-head requires attention DP (--attn-dp-size)."), "AssertionError"),
    )),
    Stage("parallel_hook.py:handle_context_parallelism", _always, rules=(
        Rule(lambda v: v.args.enable_prefill_cp and v.args.cp_strategy is None,
             _msg("--cp-strategy must be set when --enable-prefill-cp is enabled.")),
        Rule(lambda v: v.args.attn_cp_size > 1 and v.args.tp_size % v.args.attn_cp_size != 0,
             _msg("tp_size must be divisible by attn_cp_size"), "AssertionError"),
        Rule(lambda v: v.args.attn_cp_size > 1
             and v.args.tp_size % (v.args.attn_dp_size * v.args.attn_cp_size) != 0,
             _msg("tp_size must be divisible by attn_dp_size * attn_cp_size"), "AssertionError"),
    )),
    Stage("pd_disaggregation_hook.py:handle_pd_disaggregation", lambda v: v.args.disaggregation_mode != "null",
          rules=(
        Rule(lambda v: v.args.disaggregation_mode == "prefill" and _transfer_backend(v) == "fake",
             _msg("Prefill server does not support 'fake' as the transfer backend"), "AssertionError"),
    )),
    Stage("speculative_hook.py:handle_speculative_decoding", _always, resolve=_resolve_speculative_algorithm),
    Stage("speculative_hook.py:handle_speculative_decoding", _always, rules=(
        Rule(lambda v: v.args.speculative_algorithm is not None
             and v.args.speculative_algorithm not in SPECULATIVE_ALGORITHMS,
             lambda v: f"Unknown speculative algorithm name: {v.args.speculative_algorithm}"),
        Rule(lambda v: v.env.dp_spec_prefill_coordination
             and (v.args.speculative_algorithm not in ("EAGLE", "EAGLE3", "DSPARK") or v.args.enable_multi_layer_eagle),
             _msg("DP spec/prefill coordination requires single-layer EAGLE, EAGLE3 or DSPARK")),
        Rule(lambda v: v.args.speculative_algorithm is not None and v.env.ragged_verify_mode not in RAGGED_VERIFY_MODES,
             lambda v: f"invalid SGLANG_RAGGED_VERIFY_MODE={v.env.ragged_verify_mode!r}; expected one of "
                       + ", ".join(repr(mode) for mode in RAGGED_VERIFY_MODES)),
    )),
    Stage("speculative_hook.py:_handle_dspark", _algorithm("DSPARK"), rules=(
        Rule(lambda v: not (v.args.device or "cuda").startswith(("cuda", "npu", "xpu")),
             _msg("DSpark speculative decoding only supports CUDA, NPU or XPU device.")),
        Rule(lambda v: v.attn_dp and not v.args.enable_dp_lm_head,
             _msg("DSpark with dp attention requires --enable-dp-lm-head.")),
        Rule(lambda v: v.attn_dp and not v.npu and v.args.moe_a2a_backend not in ("none", "megamoe", "mori"),
             lambda v: "DSpark with dp attention supports moe_a2a_backend 'none' (built-in TP MoE), "
                       f"'megamoe', or 'mori', got {v.args.moe_a2a_backend!r}."),
        Rule(lambda v: v.attn_dp and not v.npu
             and (v.args.moe_a2a_backend != "none" or v.env.dp_spec_prefill_coordination)
             and v.env.ragged_verify_mode != "static",
             _msg("DSpark DP MoE or prefill coordination requires SGLANG_RAGGED_VERIFY_MODE=static.")),
        Rule(lambda v: v.attn_dp and v.args.attn_cp_size > 1,
             lambda v: "DSpark with dp attention does not support context parallel "
                       f"(attn_cp_size={v.args.attn_cp_size})."),
        Rule(lambda v: v.attn_dp and not v.npu and v.args.speculative_moe_a2a_backend is not None
             and v.args.speculative_moe_a2a_backend != v.args.moe_a2a_backend,
             lambda v: "DSpark ignores --speculative-moe-a2a-backend; with dp attention it must match the "
                       f"target moe_a2a_backend={v.args.moe_a2a_backend!r} "
                       f"(got {v.args.speculative_moe_a2a_backend!r})."),
        Rule(lambda v: v.args.pp_size != 1 and v.args.disaggregation_mode != "prefill",
             _msg("DSpark pipeline parallelism requires PD prefill; "
                  "decode and non-disaggregated serving require pp_size == 1.")),
        Rule(lambda v: v.args.speculative_draft_model_path is None and not _dspark_draft_available(v),
             _msg("DSpark dense speculative decoding requires setting --speculative-draft-model-path.")),
        Rule(lambda v: v.args.speculative_dspark_block_size is not None and v.args.speculative_dspark_block_size <= 0,
             lambda v: "DSpark requires --speculative-dspark-block-size to be positive, "
                       f"got {v.args.speculative_dspark_block_size}."),
        Rule(lambda v: (gamma := _dspark_gamma(v)) is not None and v.args.speculative_num_draft_tokens is not None
             and v.args.speculative_num_draft_tokens != gamma + 1,
             lambda v: "DSpark speculative_num_draft_tokens must equal gamma + 1 "
                       f"(= {(_dspark_gamma(v) or 0) + 1} for gamma={_dspark_gamma(v)}), but got "
                       f"speculative_num_draft_tokens={v.args.speculative_num_draft_tokens}."),
        Rule(lambda v: (_dspark_num_draft_tokens(v) or 0) < 2,
             lambda v: "DSpark speculative_num_draft_tokens must be >= 2 (= gamma + 1), "
                       f"got {_dspark_num_draft_tokens(v)}."),
    ), resolve=_resolve_dspark),
    Stage("speculative_hook.py:_handle_dflash", _algorithm("DFLASH"), rules=(
        Rule(lambda v: not ((v.args.device or "cuda").startswith("cuda") or v.args.device in ("npu", "xpu")),
             lambda v: f"DFLASH speculative decoding is not supported by {_platform_class(v)} "
                       f"on device {v.args.device!r}."),
        Rule(lambda v: v.attn_dp and v.args.device != "npu" and not (v.args.device or "cuda").startswith("cuda"),
             _msg("DFLASH with dp attention requires CUDA or NPU.")),
        Rule(lambda v: v.attn_dp and v.args.device != "npu" and not v.args.enable_dp_lm_head,
             _msg("DFLASH with dp attention requires --enable-dp-lm-head.")),
        Rule(lambda v: v.attn_dp and v.args.device != "npu" and v.args.attn_cp_size != 1,
             _msg("DFLASH with dp attention does not support context parallel.")),
        Rule(lambda v: v.attn_dp and v.args.device != "npu" and v.env.dp_spec_prefill_coordination,
             _msg("DFLASH with dp attention requires SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION=0.")),
        Rule(lambda v: v.args.pp_size != 1,
             _msg("Currently DFLASH speculative decoding only supports pp_size == 1.")),
        Rule(lambda v: v.args.speculative_draft_model_path is None,
             _msg("DFLASH speculative decoding requires setting --speculative-draft-model-path.")),
        Rule(lambda v: v.args.speculative_dflash_block_size is not None and v.args.speculative_dflash_block_size <= 0,
             lambda v: "DFLASH requires --speculative-dflash-block-size to be positive, "
                       f"got {v.args.speculative_dflash_block_size}."),
        Rule(lambda v: v.args.speculative_dflash_block_size is not None
             and v.args.speculative_num_draft_tokens is not None
             and v.args.speculative_num_draft_tokens != v.args.speculative_dflash_block_size,
             lambda v: "Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set but "
                       "they differ. For DFLASH they must match. "
                       f"speculative_num_draft_tokens={v.args.speculative_num_draft_tokens}, "
                       f"speculative_dflash_block_size={v.args.speculative_dflash_block_size}."),
    ), resolve=_resolve_dflash),
    Stage("speculative_hook.py:_handle_eagle_family", _algorithm("EAGLE", "EAGLE3", "STANDALONE"), rules=(
        Rule(lambda v: v.args.speculative_algorithm == "STANDALONE" and v.attn_dp,
             _msg("Currently standalone speculative decoding does not support dp attention.")),
        Rule(lambda v: v.args.speculative_num_steps is None
             and (v.args.speculative_eagle_topk is not None or v.args.speculative_num_draft_tokens is not None),
             _msg(""), "AssertionError"),
    ), resolve=_resolve_eagle),
    Stage("speculative_hook.py:_handle_ngram", _algorithm("NGRAM"), rules=(
        Rule(lambda v: v.args.device not in ("cuda", "cpu", "xpu"),
             _msg("Ngram speculative decoding only supports CUDA, CPU, or XPU devices.")),
    ), resolve=_resolve_ngram),
    Stage("speculative_hook.py:_handle_ngram", _algorithm("NGRAM"), rules=(
        Rule(lambda v: v.attn_dp, _msg("Currently ngram speculative decoding does not support dp attention.")),
    )),
    # Not a server-args hook: the scheduler's ModelConfig raises it at boot, once the args resolved.
    Stage("configs/model_config.py:_derive_context_length", lambda v: v.args.context_length is not None,
          rules=(Rule(_context_too_long, _context_message),)),
)


def admit(args: ServerArgs, env: SglangEnv, architecture: str, stages: tuple[Stage, ...] = STAGES) -> ServerArgs:
    """Run SGLang's resolution in order; return the resolved args or raise ``Rejected``."""
    for stage in stages:
        view = View(args, env, architecture)
        if not stage.runs(view):
            continue
        for rule in stage.rules:
            if rule.violated(view):
                raise Rejected(rule.error, rule.message(view), stage.hook)
        if stage.resolve is not None:
            args = dataclasses.replace(args, **stage.resolve(view))
    return args
