"""Which layers of SmolLM2-135M-Instruct make a STANDALONE draft worth verifying (``real_model.DRAFT_LAYERS``):
``python bench/draft_layers.py [--smoke]`` (it re-runs itself in the engine's venv, ``DSPARK_SGLANG_ENGINE_PYTHON``
or .cache/sglang-venv, after ``real_model.py`` converted the model; ``--smoke``: one prompt, two candidates).

Cheap, without a server: the target's greedy reply to each of the first PROMPTS chat prompts (the accept suite's),
then one teacher-forced pass of each candidate draft over it. A chain of drafts is accepted while each draft token
is the target's greedy one, and while it is, the draft's context IS the target's sequence; so the teacher-forced
agreements give, step by step as SGLang verifies (speculative_num_steps 3: up to 3 drafts, plus the target's own
token), the accept length a greedy speculative run would have."""

from __future__ import annotations

import os
import sys
from pathlib import Path

STEPS = 3  # speculative_num_steps of the matrix's STANDALONE cell (num_draft_tokens 4)
PROMPTS = 8
REPLY_TOKENS = 48
# name -> the target's layers the draft keeps (in order)
CANDIDATES = {"all 30 (the target)": tuple(range(30)), "first 15": tuple(range(15)),
              "every 2nd + last": (*range(0, 29, 2), 29), "first 20 + last 4": (*range(20), *range(26, 30)),
              "first 22 + last 2": (*range(22), 28, 29), "first 18 + last 6": (*range(18), *range(24, 30)),
              "all but 3 (9, 14, 19)": tuple(i for i in range(30) if i not in (9, 14, 19)),
              "all but 6 (every 3rd of 6-23)": tuple(i for i in range(30) if i not in range(8, 24, 3)),
              "all but 10 (every 2nd of 5-24)": tuple(i for i in range(30) if i not in range(6, 25, 2)),
              "first 24 + last 2": (*range(24), 28, 29)}


def accept_length(agrees: list[bool], steps: int = STEPS) -> tuple[int, int]:
    """(tokens, verify steps) of a greedy speculative run over a reply whose draft agreements are ``agrees``."""
    position = verifies = 0
    while position < len(agrees):
        accepted = 0
        while accepted < steps and position + accepted < len(agrees) and agrees[position + accepted]:
            accepted += 1
        position += accepted + 1
        verifies += 1
    return position, verifies


def engine_python() -> str | None:
    """The engine venv's python (torch, transformers), unless this is it already."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        return None
    except ImportError:
        default = Path(__file__).resolve().parents[1] / ".cache" / "sglang-venv" / "bin" / "python"
        return os.environ.get("DSPARK_SGLANG_ENGINE_PYTHON") or (str(default) if default.exists() else None)


def main() -> int:
    smoke = "--smoke" in sys.argv[1:]
    if (python := engine_python()) is not None:
        os.execv(python, [python, __file__, *sys.argv[1:]])
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch
    from dspark_ci.sglang_sim.cpu_engine import cache_root
    from dspark_ci.sglang_sim.cpu_engine.real_model import draft_of, ensure, load
    from dspark_ci.suites.prompts import PROMPTS as TEXTS
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    target_dir, _ = ensure(cache_root(os.environ))
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.bfloat16).eval()
    config, tensors = load(target_dir)
    replies = []
    prompts, tokens = (1, 16) if smoke else (PROMPTS, REPLY_TOKENS)
    candidates = dict(list(CANDIDATES.items())[:2]) if smoke else CANDIDATES
    for text in TEXTS[:prompts]:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)["input_ids"]
        with torch.no_grad():
            replies.append((ids.shape[1], target.generate(ids, max_new_tokens=tokens, do_sample=False)))
    for name, layers in candidates.items():
        draft_config, draft_tensors = draft_of(config, tensors, layers)
        draft = LlamaForCausalLM(LlamaConfig(**draft_config)).to(torch.bfloat16).eval()
        draft.load_state_dict(draft_tensors, strict=False)
        tokens = verifies = 0
        for prompt_len, sequence in replies:
            with torch.no_grad():
                guesses = draft(sequence[:, :-1]).logits[0].argmax(-1)
            agrees = (guesses[prompt_len - 1:] == sequence[0, prompt_len:]).tolist()
            done, steps = accept_length(agrees[1:])  # the first reply token is the prefill's, not a draft's
            tokens, verifies = tokens + done, verifies + steps
        print(f"{name:20s} layers {len(layers):2d}  accept length {tokens / verifies:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
