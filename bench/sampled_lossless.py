"""False-alarm and detection rates of the sampled-losslessness test (ground/position_homogeneity.py), on the draws the
accept suite takes: its prompts, ``accept.lossless_samples`` draws per prompt and side, ``accept.lossless_tokens``.

    python bench/sampled_lossless.py [--nights 200] [--repeats 3] [--seed 1] [--samples N] [--smoke]

Each night draws both sides and judges them as the gate does (``judge`` at the run's alpha, ``stats.RUN_FALSE_RED``
with no baseline gates). Two sources of draws:

- ``simulator``: the simulated model itself (``dspark_ci.sglang_sim.textgen.reply_tokens``, the text the simulator
  serves for each prompt and seed), clean on both sides, or with the speculative side under fault ``greedy_verify=Q``
  (each token after the first is the greedy text's with probability Q, ``dspark_ci.sglang_sim.textgen.argmax_mixed``) or
  ``lossy_sampling`` (every second draw is the greedy text);
- ``model-like``: a language-model-shaped distribution per position (Zipf over ``VOCAB`` tokens, exponent
  ``ZIPF_S``: the argmax holds about half the probability, as a small instruct model's does at temperature 0.7 on a
  fixed prompt), with greedy verification accepting the argmax at each position after the first with probability
  Q (a draft that proposes the argmax that often).

Printed per scenario: the share of nights red, green and inconclusive, min / median / max over the repeats.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dspark_ci.ground.position_homogeneity import GREEN, INCONCLUSIVE, RED, compare, judge  # noqa: E402
from dspark_ci.ground.stats import RUN_FALSE_RED  # noqa: E402
from dspark_ci.ground.suites import SUITE_DEFAULTS  # noqa: E402
from dspark_ci.sglang_sim.gpqa_answers import GpqaAnswerKey  # noqa: E402
from dspark_ci.sglang_sim.textgen import Ask, Persona, argmax_mixed, reply_tokens  # noqa: E402
from dspark_ci.sglang_sim.tokenizer import token_id  # noqa: E402
from dspark_ci.suites.prompts import builtin_workload  # noqa: E402

OPTIONS = SUITE_DEFAULTS["accept"]
SHARES = (0.1, 0.2, 0.3, 0.5)  # greedy_verify=Q: the share of positions after the first that follow the argmax
VOCAB, ZIPF_S = 200, 1.6  # the model-like distribution per position
Draw = list[int]


def suite_prompts(count: int) -> list[str]:
    return [p.text for p in builtin_workload() if p.category != "long_context"][:count]


def _sim_draw(persona: Persona, prompt: str, key: str, tokens: int, fault: str, share: float) -> Draw:
    ask = Ask(prompt, prompt, key)
    stream = reply_tokens(persona, ask)
    if fault == "greedy_verify":
        greedy = reply_tokens(persona, Ask(prompt, prompt, "greedy"))
        stream = argmax_mixed(stream, greedy, random.Random(f"verify\x1f{key}"), share, first=1)
    elif fault == "lossy_sampling" and key.endswith(("0", "2", "4", "6", "8")):
        stream = reply_tokens(persona, Ask(prompt, prompt, "greedy"))
    return [token_id(piece) for _, piece in zip(range(tokens), stream, strict=False)]


def simulator_night(night: int, samples: int, tokens: int, prompts: list[str], fault: str, share: float,
                    seed: int) -> tuple[list[list[Draw]], list[list[Draw]]]:
    persona = Persona(seed, 0.7, GpqaAnswerKey.empty())
    sides = []
    for side, side_fault in (("s", fault), ("r", "")):
        sides.append([[_sim_draw(persona, prompt, f"{night}-{side}-{p}-{i}", tokens, side_fault, share)
                       for i in range(samples)] for p, prompt in enumerate(prompts)])
    return sides[0], sides[1]


def model_like_night(rng: np.random.Generator, samples: int, tokens: int, prompts: int, share: float):
    """Per prompt and position its own Zipf distribution over a shuffled vocabulary (argmax first)."""
    weights = 1.0 / np.arange(1, VOCAB + 1) ** ZIPF_S
    weights /= weights.sum()
    here, there = [], []
    for _ in range(prompts):
        order = [rng.permutation(VOCAB) for _ in range(tokens)]

        def draw(greedy_share: float, order: list[np.ndarray] = order) -> list[int]:
            return [int(order[k][0]) if k and rng.random() < greedy_share
                    else int(order[k][rng.choice(VOCAB, p=weights)]) for k in range(tokens)]

        here.append([draw(share) for _ in range(samples)])
        there.append([draw(0.0) for _ in range(samples)])
    return here, there


def rates(nights: int, night: Callable[[int], tuple], tokens: int) -> dict[str, float]:
    outcomes = []
    for n in range(nights):
        here, there = night(n)
        result = compare(here, there, tokens)
        outcomes.append(judge(result.family_p, len(result.tests), result.untested, result.samples,
                              RUN_FALSE_RED)[0])
    return {name: outcomes.count(name) / nights for name in (RED, GREEN, INCONCLUSIVE)}


def scenarios(samples: int, tokens: int, prompts: int, seed: int) -> dict[str, Callable[[int], tuple]]:
    texts = suite_prompts(prompts)
    rng = np.random.default_rng(seed)
    table: dict[str, Callable[[int], tuple]] = {
        "simulator clean": lambda n: simulator_night(n, samples, tokens, texts, "", 0.0, seed),
        "simulator lossy_sampling": lambda n: simulator_night(n, samples, tokens, texts, "lossy_sampling", 0.0, seed),
    }
    for q in SHARES:
        table[f"simulator greedy_verify={q:g}"] = (
            lambda n, q=q: simulator_night(n, samples, tokens, texts, "greedy_verify", q, seed))
    table["model-like clean"] = lambda n: model_like_night(rng, samples, tokens, prompts, 0.0)
    for q in SHARES:
        table[f"model-like greedy verification, argmax accepted {q:g}"] = (
            lambda n, q=q: model_like_night(rng, samples, tokens, prompts, q))
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nights", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3, help="independent repeats (seeds SEED, SEED+1, ...)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--samples", type=int, default=OPTIONS["lossless_samples"], help="draws per prompt and side")
    parser.add_argument("--prompts", type=int, default=OPTIONS["lossless_prompts"])
    parser.add_argument("--tokens", type=int, default=OPTIONS["lossless_tokens"])
    parser.add_argument("--smoke", action="store_true", help="CI's check that the bench runs: 3 nights, 1 repeat")
    args = parser.parse_args()
    if args.smoke:
        args.nights, args.repeats = 3, 1
    print(f"{args.prompts} prompts × {args.samples} draws per side, positions 2..{args.tokens}, α {RUN_FALSE_RED:g}; "
          f"{args.nights} nights × {args.repeats} repeats (min / median / max over repeats)")
    repeats = [{name: rates(args.nights, night, args.tokens)
                for name, night in scenarios(args.samples, args.tokens, args.prompts, args.seed + r).items()}
               for r in range(args.repeats)]
    for name in repeats[0]:
        cells = []
        for outcome in (RED, GREEN, INCONCLUSIVE):
            values = sorted(r[name][outcome] for r in repeats)
            cells.append(f"{outcome} {values[0]:.1%} / {statistics.median(values):.1%} / {values[-1]:.1%}")
        print(f"{name:56} " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
