"""What the simulated model says: a deterministic stream of tokens for a prompt.

The text depends only on the seed, the prompt and the sampling key (``"greedy"`` at temperature 0),
never on speculative decoding, so greedy output is identical with and without it, as real
speculative decoding guarantees. Tokens are produced lazily: no work for tokens never sent.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from dspark_ci.sglang_sim.gpqa_answers import LETTERS, GpqaAnswerKey, parse_gpqa_prompt
from dspark_ci.sglang_sim.noise import question_probability
from dspark_ci.sglang_sim.tokenizer import THINK_END, THINK_START, tokenize

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
class Penalties:
    """SGLang's repetition-shaping sampling parameters (OpenAI's frequency and presence penalties, SGLang's
    repetition_penalty); the defaults change nothing."""

    frequency: float = 0.0  # subtracted from a token's logit once per earlier occurrence
    presence: float = 0.0  # subtracted once from the logit of a token that occurred before
    repetition: float = 1.0  # a token that occurred before has its logit divided by it (> 1: less likely)

    def on(self, count: int) -> float:
        """How much a word seen ``count`` times so far loses against the others, in logits (negative: gains)."""
        if count == 0:
            return 0.0
        return self.frequency * count + self.presence + math.log(self.repetition) * REPETITION_LOGIT

    @property
    def active(self) -> bool:
        return self != Penalties()


# The simulated model's logits: at every word, how far the word it picks (the argmax when greedy) lies above the next
# best is drawn from [0, MAX_MARGIN); SGLang's repetition_penalty divides a positive logit by r, which moves a logit of
# REPETITION_LOGIT by about ln(r) times it.
MAX_MARGIN = 2.0
REPETITION_LOGIT = 3.0
# The probability of the model's most likely token at every step when sampling: a top_p at or below it leaves the
# argmax alone, and the sample is the greedy text (dspark_ci.sglang_sim.engine.Engine.sample_key).
ARGMAX_PROBABILITY = 0.3


@dataclass(frozen=True)
class Ask:
    """One sample to generate: the prompt and what shapes the text."""

    prompt: str  # the full templated prompt (what the model would read)
    question: str  # the last user turn (where a GPQA question would be)
    sample_key: str  # "greedy", or something unique per sample when temperature > 0
    thinking: bool = False
    ignore_eos: bool = False
    penalties: Penalties = field(default_factory=Penalties)


def _rng(*parts: object) -> random.Random:
    # str seeds go through SHA-512 in random.seed: stable across processes, unlike hash()
    return random.Random("\x1f".join(map(str, parts)))


class Words:
    """The model's word choices for one reply: the text's own random stream, reshaped by the penalties. A word the
    stream picks loses its lead to the next best word when its penalty exceeds its margin (both drawn from a stream
    of their own, so a reply without penalties is the text it always was); with a negative penalty a word seen
    before may win instead."""

    def __init__(self, rng: random.Random, penalties: Penalties, seed: tuple):
        self.rng, self.penalties = rng, penalties
        self.logits = _rng("logits", *seed) if penalties.active else None
        self.counts: dict[str, int] = {}

    def choice(self) -> str:
        word = self.rng.choice(WORDS)
        if self.logits is not None:
            word = self._penalised(word)
        self.counts[word] = self.counts.get(word, 0) + 1
        return word

    def _penalised(self, word: str) -> str:
        assert self.logits is not None
        margin = self.logits.uniform(0.0, MAX_MARGIN)
        penalty = self.penalties.on(self.counts.get(word, 0))
        if penalty > margin:  # another word, less penalised, now leads
            fresh = [w for w in WORDS if self.penalties.on(self.counts.get(w, 0)) < penalty - margin]
            return self.logits.choice(fresh) if fresh else word
        if penalty == 0 and self.counts:  # a negative penalty lifts a word seen before above this one
            best = min(self.counts, key=lambda w: (self.penalties.on(self.counts[w]), w))
            return best if -self.penalties.on(self.counts[best]) > margin else word
        return word


def _sentence(words: Words) -> str:
    chosen = [words.choice() for _ in range(words.rng.randint(6, 18))]
    return " ".join(chosen).capitalize() + "."


def _prose(words: Words, sentences: int) -> str:
    return " ".join(_sentence(words) for _ in range(sentences))


def _gpqa_reply(persona: Persona, ask: Ask, words: Words) -> tuple[str, str] | None:
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
    reasoning = "Let me work through this step by step. " + _prose(words, words.rng.randint(3, 10))
    final = f"The best match is {letter}) {prompt.options[letter]}\n\nAnswer: {letter}"
    return reasoning, final


def _answers_right(persona: Persona, ask: Ask, fate: random.Random) -> bool:
    """Fixed per question and seed; with a concentration, drawn per sample from the question's own probability."""
    if not persona.concentration:
        return fate.random() < persona.gpqa_accuracy
    probability = question_probability(fate.random(), persona.gpqa_accuracy, persona.concentration)
    return _rng("gpqa-sample", persona.seed, persona.nonce, ask.prompt, ask.sample_key).random() < probability


def _visible_text(persona: Persona, ask: Ask, words: Words) -> list[str]:
    """The natural reply as tokens (thinking included), before EOS."""
    gpqa = _gpqa_reply(persona, ask, words)
    if gpqa is not None:
        reasoning, final = gpqa
    else:
        rng = words.rng
        reasoning, final = _prose(words, rng.randint(2, 6)), _prose(words, rng.randint(2, 8))
    if ask.thinking:
        return [THINK_START, *tokenize(reasoning), THINK_END, *tokenize("\n\n" + final)]
    if gpqa is not None:
        return tokenize(reasoning + "\n\n" + final)
    return tokenize(final)


def _endless_prose(words: Words) -> Iterator[str]:
    while True:
        yield from tokenize(" " + _sentence(words))


def _endless_gibberish(rng: random.Random) -> Iterator[str]:
    while True:
        yield " " + "".join(rng.choice(GIBBERISH) for _ in range(rng.randint(1, 5)))


def reply_tokens(persona: Persona, ask: Ask) -> Iterator[str]:
    """The model's tokens, in order. Ends where the model would emit EOS, unless ``ignore_eos``:
    then it goes on (as a model told to ignore EOS does) for as long as it is asked. A sample (not greedy) takes the
    greedy text's token at each position with probability ARGMAX_PROBABILITY, as a model whose argmax holds that much
    probability does (GPQA replies keep their own structure: their answer line must stay whole)."""
    tokens = _model_tokens(persona, ask)
    if ask.sample_key == "greedy" or persona.garbage or parse_gpqa_prompt(ask.question) is not None:
        return tokens
    greedy = _model_tokens(persona, replace(ask, sample_key="greedy"))
    return argmax_mixed(tokens, greedy, _rng("argmax", persona.seed, ask.prompt, ask.sample_key), ARGMAX_PROBABILITY)


def argmax_mixed(sampled: Iterator[str], greedy: Iterator[str], rng: random.Random, share: float,
                 first: int = 0) -> Iterator[str]:
    """``sampled`` with each token from position ``first`` on replaced, with probability ``share``, by ``greedy``'s
    token at the same position (while ``greedy`` lasts). Ends where ``sampled`` ends."""
    for position, token in enumerate(sampled):
        argmax = next(greedy, None)
        yield argmax if position >= first and argmax is not None and rng.random() < share else token


def _model_tokens(persona: Persona, ask: Ask) -> Iterator[str]:
    rng = _rng("text", persona.seed, ask.prompt, ask.sample_key)
    if persona.garbage:
        gibberish = _endless_gibberish(rng)
        if ask.ignore_eos:
            yield from gibberish
        for _ in range(rng.randint(20, 200)):
            yield next(gibberish)
        return
    words = Words(rng, ask.penalties, (persona.seed, ask.prompt, ask.sample_key))
    yield from _visible_text(persona, ask, words)
    if ask.ignore_eos:
        yield from _endless_prose(words)
