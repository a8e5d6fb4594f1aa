"""The tiny Llama's weights, drawn once with a fixed seed and kept in a cache: ``model.safetensors`` beside the
shipped config and tokenizer (``--load-format safetensors``).

Why not SGLang's ``--load-format dummy``: its weights are uniform in +-1e-3, seeded tensor by tensor alike, so
tp 2's shards differ from tp 1's weights (parity across tp sizes means nothing) and tp 1's greedy output is
degenerate (``[485, 0, 485, 0, ...]``). Normal weights of std 0.05 give varied output with loops in it (NGRAM's
drafts find them: 37-76 % of a 64-token reply's bigrams repeat; std 0.2 gave 0-5 %), identical at every tp size.

A draft (``model/draft``) takes the target's weights for the layers its config has (same embeddings, norm and LM
head): the shipped STANDALONE draft has all of them (dspark_ci/engine_model.py says why). Runs in the SGLang venv
(torch, safetensors)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

SEED = 20260512
STD = 0.05  # small enough that greedy output falls into loops now and then (n-gram drafts then hit), not always
GENERATOR_VERSION = "1"  # bump when the drawing changes: the cache key changes with it
WEIGHTS = "model.safetensors"
SHIPPED = ("config.json", "tokenizer.json", "tokenizer_config.json")


def _shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """LlamaForCausalLM's parameters in the checkpoint's names, in a fixed order (the draw order)."""
    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        shapes.update({prefix + "self_attn.q_proj.weight": (heads * head_dim, hidden),
                       prefix + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
                       prefix + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
                       prefix + "self_attn.o_proj.weight": (hidden, heads * head_dim),
                       prefix + "mlp.gate_proj.weight": (inter, hidden),
                       prefix + "mlp.up_proj.weight": (inter, hidden),
                       prefix + "mlp.down_proj.weight": (hidden, inter),
                       prefix + "input_layernorm.weight": (hidden,),
                       prefix + "post_attention_layernorm.weight": (hidden,)})
    shapes.update({"model.norm.weight": (hidden,), "lm_head.weight": (vocab, hidden)})
    return shapes


def draw(config: dict) -> dict:
    import torch

    generator = torch.Generator().manual_seed(SEED)
    tensors = {}
    for name, shape in _shapes(config).items():
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            tensors[name] = (torch.randn(shape, generator=generator) * STD).to(torch.bfloat16)
    return tensors


def _key(source: Path, target_source: Path) -> str:
    digest = hashlib.sha256(f"{GENERATOR_VERSION} {SEED} {STD}".encode())
    for directory in (target_source, source):
        for name in SHIPPED:
            if (directory / name).exists():
                digest.update((directory / name).read_bytes())
    return digest.hexdigest()[:16]


def ensure(source: Path, cache: Path, target_source: Path | None = None) -> Path:
    """A model directory for ``source`` (config + tokenizer) with its weights: written once under ``cache``
    (atomically: several ranks may start at once), then reused. With ``target_source``, the weights are the
    target's, truncated to this config's layers (a draft)."""
    target_source = target_source or source
    directory = cache / f"{source.name}-{_key(source, target_source)}"
    if (directory / WEIGHTS).is_file():
        return directory
    from safetensors.torch import save_file

    cache.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{source.name}-", dir=cache))
    try:
        for name in SHIPPED:
            if (source / name).exists():
                shutil.copy(source / name, scratch / name)
            elif (target_source / name).exists():
                shutil.copy(target_source / name, scratch / name)
        config = json.loads((source / "config.json").read_text())
        drawn = draw(json.loads((target_source / "config.json").read_text()))
        save_file({name: drawn[name] for name in _shapes(config)}, str(scratch / WEIGHTS))
        try:
            os.rename(scratch, directory)
        except OSError:  # another rank wrote it first: the same bytes
            pass
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return directory
