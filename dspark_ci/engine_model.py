"""Writes the model directories shipped in ``sglang_sim/cpu_engine/model/`` (``python -m dspark_ci.engine_model``,
in the SGLang venv: it needs ``tokenizers``): the tiny Llama's config, its draft's, and a WordLevel tokenizer that
splits text as the simulator's tokenizer does (``dspark_ci.sglang_sim.frontend.vocab``) and holds the words the suites
send (their prompts, the speed suite's words, GPQA's instruction and answer format). Any other piece is [UNK]: counted
as one token, its text lost, which a model of random weights does not mind. Run again after changing anything here;
the checkpoint cache is keyed by these files' bytes."""

from __future__ import annotations

import json
import string
from collections.abc import Iterator
from pathlib import Path

from dspark_ci.sglang_sim.cpu_engine import MODEL_DIR
from dspark_ci.sglang_sim.frontend.vocab import GPQA_TEXTS, Vocabulary, write_model_dir
from dspark_ci.sglang_sim.tokenizer import THINK_END, THINK_START, onig_pattern, tokenize

# The probe's Llama: hidden 64, intermediate 128, 2 layers, 4 heads / 2 KV heads, bf16.
TARGET_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
                 "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "max_position_embeddings": 4096, "rms_norm_eps": 1e-05,
                 "rope_theta": 10000.0, "bos_token_id": 0, "tie_word_embeddings": False, "hidden_act": "silu"}
# The STANDALONE draft: the target's own layers and weights (checkpoint.py). Its first layer alone agreed with the
# target in 4-7 % of drafts (accept length 1.1-1.2, under the suites' collapse floor of 1.2): too weak to show a
# working verify-and-accept path from a broken one. The whole target drafts what the target would say, except where
# bf16 rounding differs between drafting and verifying.
DRAFT_LAYERS = 2


def _pieces(texts: tuple[str, ...]) -> Iterator[str]:
    yield from (THINK_START, THINK_END, *string.printable, *(" " + c for c in string.printable if not c.isspace()))
    for text in texts:
        for word in text.split():
            for prefix in ("", " ", "\n"):
                yield from tokenize(prefix + word)


def vocabulary() -> Vocabulary:
    from dspark_ci.suites.prompts import PROMPTS
    from dspark_ci.suites.speed import WORDS

    vocab = {"[UNK]": 0, "</s>": 1}
    for piece in _pieces((*PROMPTS, " ".join(WORDS), *GPQA_TEXTS)):
        if piece:
            vocab.setdefault(piece, len(vocab))
    return Vocabulary(vocab)


def write(root: Path = MODEL_DIR) -> None:
    words = vocabulary()
    write_model_dir(root / "target", words, TARGET_CONFIG, onig_pattern())
    target = json.loads((root / "target" / "config.json").read_text())
    draft = {**target, "num_hidden_layers": DRAFT_LAYERS}
    (root / "draft").mkdir(parents=True, exist_ok=True)
    (root / "draft" / "config.json").write_text(json.dumps(draft, indent=1) + "\n")


if __name__ == "__main__":
    write()
