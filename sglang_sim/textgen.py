"""What the simulated model says: a deterministic stream of tokens for a prompt.

The text depends only on the seed, the prompt and the sampling key (``"greedy"`` at temperature 0),
never on speculative decoding, so greedy output is identical with and without it, as real
speculative decoding guarantees. Tokens are produced lazily: no work for tokens never sent.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterator

from sglang_sim.gpqa_answers import LETTERS, GpqaAnswerKey, parse_gpqa_prompt
from sglang_sim.noise import question_probability
from sglang_sim.tokenizer import THINK_END, THINK_START, tokenize

# Words of the filler prose. None contains "answer", so GPQA extraction only ever sees the last line.
WORDS = tuple("""
the a of to and in that is for it as with on this by be are from at an we which can consider
first then next so because therefore however thus given energy system value state rate each
term result since both case model step check compute follow known factor equation structure
reaction particle field mass charge spin orbital bond group ratio order phase wave function
sample measure observe expect assume derive simplify estimate compare option choice reasoning
constant small large higher lower total initial final effect change process condition data
""".split())
GIBBERISH = "bcdfghjklmnpqrstvwxz"


@dataclass(frozen=True)
class Persona:
    """How the model answers, fixed for one server."""

    seed: int
    gpqa_accuracy: float
    answer_key: GpqaAnswerKey
    garbage: bool = False  # fault garbage_output
    concentration: float = 0.0  # > 0: per-question probabilities, each sample drawn (sglang_sim/noise.py)
    nonce: str = ""  # this boot's, so two boots draw their samples independently


@dataclass(frozen=True)
class Ask:
    """One sample to generate: the prompt and what shapes the text."""

    prompt: str  # the full templated prompt (what the model would read)
    question: str  # the last user turn (where a GPQA question would be)
    sample_key: str  # "greedy", or something unique per sample when temperature > 0
    thinking: bool = False
    ignore_eos: bool = False


def _rng(*parts: object) -> random.Random:
    # str seeds go through SHA-512 in random.seed: stable across processes, unlike hash()
    return random.Random("\x1f".join(map(str, parts)))


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(6, 18))]
    return " ".join(words).capitalize() + "."


def _prose(rng: random.Random, sentences: int) -> str:
    return " ".join(_sentence(rng) for _ in range(sentences))


def _gpqa_reply(persona: Persona, ask: Ask, rng: random.Random) -> tuple[str, str] | None:
    """(reasoning, final answer text) for a GPQA prompt, else None."""
    prompt = parse_gpqa_prompt(ask.question)
    if prompt is None:
        return None
    # Right or wrong is fixed per question and seed, whatever the sampling.
    fate = _rng("gpqa", persona.seed, " ".join(prompt.question.split()))
    right = persona.answer_key.correct_letter(prompt)
    answers_right = _answers_right(persona, ask, fate)
    if right is None:
        letter = fate.choice(LETTERS)  # a question the simulator has no key for: a guess
    elif answers_right:
        letter = right
    else:
        letter = fate.choice([other for other in LETTERS if other != right])
    reasoning = "Let me work through this step by step. " + _prose(rng, rng.randint(3, 10))
    final = f"The best match is {letter}) {prompt.options[letter]}\n\nAnswer: {letter}"
    return reasoning, final


def _answers_right(persona: Persona, ask: Ask, fate: random.Random) -> bool:
    """Fixed per question and seed; with a concentration, drawn per sample from the question's own probability."""
    if not persona.concentration:
        return fate.random() < persona.gpqa_accuracy
    probability = question_probability(fate.random(), persona.gpqa_accuracy, persona.concentration)
    return _rng("gpqa-sample", persona.seed, persona.nonce, ask.prompt, ask.sample_key).random() < probability


def _visible_text(persona: Persona, ask: Ask, rng: random.Random) -> list[str]:
    """The natural reply as tokens (thinking included), before EOS."""
    gpqa = _gpqa_reply(persona, ask, rng)
    if gpqa is not None:
        reasoning, final = gpqa
    else:
        reasoning, final = _prose(rng, rng.randint(2, 6)), _prose(rng, rng.randint(2, 8))
    if ask.thinking:
        return [THINK_START, *tokenize(reasoning), THINK_END, *tokenize("\n\n" + final)]
    if gpqa is not None:
        return tokenize(reasoning + "\n\n" + final)
    return tokenize(final)


def _endless_prose(rng: random.Random) -> Iterator[str]:
    while True:
        yield from tokenize(" " + _sentence(rng))


def _endless_gibberish(rng: random.Random) -> Iterator[str]:
    while True:
        yield " " + "".join(rng.choice(GIBBERISH) for _ in range(rng.randint(1, 5)))


def reply_tokens(persona: Persona, ask: Ask) -> Iterator[str]:
    """The model's tokens, in order. Ends where the model would emit EOS, unless ``ignore_eos``:
    then it goes on (as a model told to ignore EOS does) for as long as it is asked."""
    rng = _rng("text", persona.seed, ask.prompt, ask.sample_key)
    if persona.garbage:
        gibberish = _endless_gibberish(rng)
        if ask.ignore_eos:
            yield from gibberish
        for _ in range(rng.randint(20, 200)):
            yield next(gibberish)
        return
    yield from _visible_text(persona, ask, rng)
    if ask.ignore_eos:
        yield from _endless_prose(rng)
