"""Run by tests/test_real_model.py with the SGLang venv's Python: ``PYTHON tests/real_model_logits.py CACHE``.
Converts SmolLM2 into CACHE (sglang_sim/cpu_engine/real_model.py), then prints, as JSON, how the converted (padded)
checkpoint's logits compare on a few chat prompts with (a) transformers' own GGUF loader's, from the same GGUF, and
(b) the unpadded model's (the same bf16 weights without the padding heads), all computed in float32."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = ("What is the capital of France?", "Write a haiku about the sea.",
           "Explain how a hash map handles collisions.")


def _compare(reference, other) -> dict[str, float]:
    reference_lp, other_lp = reference.log_softmax(-1), other.log_softmax(-1)
    kl = (reference_lp.exp() * (reference_lp - other_lp)).sum(-1)
    return {"max_abs": float((reference - other).abs().max()), "logit_scale": float(reference.abs().max()),
            "max_kl": float(kl.max()),
            "top1_agreement": float((reference.argmax(-1) == other.argmax(-1)).double().mean())}


def main() -> int:
    import torch
    from dspark_ci.sglang_sim.cpu_engine import real_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    target, _ = real_model.ensure(Path(sys.argv[1]))
    gguf = real_model.gguf_path()
    theirs = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    ours = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    config, tensors = real_model.read_gguf(gguf)
    unpadded = LlamaForCausalLM(LlamaConfig(**config)).eval()
    unpadded.load_state_dict({name: weight.float() for name, weight in tensors.items()}, strict=False)
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    report = {"config": json.loads((target / "config.json").read_text()), "prompts": {}}
    for prompt in PROMPTS:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)["input_ids"]
        with torch.no_grad():
            logits = {name: model(ids).logits[0] for name, model in
                      (("theirs", theirs), ("ours", ours), ("unpadded", unpadded))}
            reply = ours.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1]:]
        report["prompts"][prompt] = {"gguf_loader": _compare(logits["theirs"], logits["ours"]),
                                     "unpadded": _compare(logits["unpadded"], logits["ours"]),
                                     "reply": tokenizer.decode(reply, skip_special_tokens=True)}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
