"""Runs INSIDE the SGLang venv (``bash .ci/sglang-bench-serving.sh``), for bench/sglang_bench_serving.py.

Standard library plus what that venv has (tokenizers, transformers, sglang); nothing of ours but the
torchvision stub of ground/sglang/resolve_child.py, loaded by path. Three modes:

    tokenizer DIR   stdin {"pattern": ..., "chat_template": ...}: write a Hugging Face tokenizer to DIR
                    whose every token is one match of ``pattern`` (WordLevel with only [UNK], Split
                    pre-tokenizer, behaviour "isolated") and whose chat template is ``chat_template``.
    count DIR       stdin {"texts": [...], "chats": [[message, ...], ...]}: print {"texts": [n, ...],
                    "chats": [n, ...], "rendered": [text, ...]}, counted as bench_serving counts
                    (``AutoTokenizer.from_pretrained``, ``encode(add_special_tokens=False)``,
                    ``apply_chat_template(tokenize=True)``), and each chat as the template renders it.
    run ARG...      print one JSON line {"sglang", "stubs", "perf_counter"}, then run bench_serving's own
                    command line (``python -m sglang.benchmark.serving ARG...``) unchanged.

Stub: SGLang's config package imports ``torchvision.transforms`` at module level and bench_serving
imports that package (``FAKE_BOOTSTRAP_HOST``); no torchvision build matches torch 2.13's CPU build
here and bench_serving never calls it, so it is an empty module, exactly as for the resolver.
"""

from __future__ import annotations

import importlib.util
import json
import runpy
import sys
import time
from pathlib import Path

RESOLVE_CHILD = Path(__file__).resolve().parent.parent / "ground" / "sglang" / "resolve_child.py"


def write_tokenizer(directory: Path, pattern: str, chat_template: str) -> None:
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    # No unk_token here: a declared special token would be cut out of any text that contains "[UNK]"
    # before the pre-tokenizer runs, and counted differently from the simulator.
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": chat_template,
              "clean_up_tokenization_spaces": False, "model_max_length": 1 << 30}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def count(directory: Path, texts: list[str], chats: list[list[dict]]) -> dict:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    return {"texts": [len(tokenizer.encode(text, add_special_tokens=False)) for text in texts],
            "chats": [len(tokenizer.apply_chat_template(chat, tokenize=True, add_generation_prompt=True,
                                                        return_dict=False)) for chat in chats],
            "rendered": [tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
                         for chat in chats]}


def install_stubs() -> tuple[str, ...]:
    spec = importlib.util.spec_from_file_location("dspark_resolve_child", RESOLVE_CHILD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.meta_path.insert(0, module._StubFinder())
    return tuple(module.STUBBED)


def run_bench_serving(argv: list[str]) -> None:
    stubs = install_stubs()
    import sglang

    # bench_serving's start_time is time.perf_counter(): say which clock that is here, so the caller
    # knows whether it compares with time.monotonic() in other processes (CLOCK_MONOTONIC on Linux).
    head = {"sglang": getattr(sglang, "__version__", None), "stubs": list(stubs),
            "perf_counter": time.get_clock_info("perf_counter").implementation,
            "monotonic": time.get_clock_info("monotonic").implementation}
    print(json.dumps(head), flush=True)
    sys.argv = ["sglang.benchmark.serving", *argv]
    runpy.run_module("sglang.benchmark.serving", run_name="__main__", alter_sys=True)


def main() -> int:
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "tokenizer":
        request = json.load(sys.stdin)
        write_tokenizer(Path(rest[0]), request["pattern"], request["chat_template"])
    elif mode == "count":
        request = json.load(sys.stdin)
        print(json.dumps(count(Path(rest[0]), request.get("texts", []), request.get("chats", []))))
    elif mode == "run":
        run_bench_serving(rest)
    else:
        print(f"unknown mode {mode!r}: tokenizer DIR | count DIR | run ARG...", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
