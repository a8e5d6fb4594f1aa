"""The simulated model's logprobs of the tokens it generates, in pinned SGLang's shapes, and the parity faults.

At every position the model has a table of candidates, best first: the token the model's own text takes there (the
argmax when greedy), a runner-up at least MIN_GAP below it, and further words. The table depends only on the seed,
the prompt, the sample key and the position, never on speculation, so a server with and without it report the same
logprobs, as a lossless engine does. Asked for logprobs, the simulator answers what SGLang does:

- ``/generate`` with ``return_logprob`` (and ``top_logprobs_num``): ``meta_info.output_token_logprobs`` as
  ``[logprob, token_id, text]`` triples (text None unless ``return_text_in_logprobs``),
  ``output_token_logprobs_length`` and, with a top count, ``output_top_logprobs`` (a list of triples per position:
  tokenizer_manager.add_logprob_to_meta_info);
- chat with ``logprobs: true`` (and ``top_logprobs``): ``choices[i].logprobs.content[j]`` as
  ``{token, bytes, logprob, top_logprobs: [{token, bytes, logprob}]}`` (serving_chat._build_token_logprobs_from_raw).

Faults (CONTRACT.md; each changes a greedy reply's token at position FAULT_POSITION):
``parity_tie_flip``: the model's two best candidates there carry the same logprob (on every server: it is the
model's tie), and the speculative server takes the runner-up, as a different kernel order may: a tie, not a bug.
``parity_mismatch``: the speculative server takes the runner-up though it lies MIN_GAP or more below: a real bug.
``tp_numerics``: a server at tp > 1 does the same, speculative or not (an all-reduce skipped: every rank healthy).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from dspark_ci.sglang_sim.textgen import WORDS, Ask, Persona, reply_tokens
from dspark_ci.sglang_sim.tokenizer import token_id

FAULT_POSITION = 3  # the fourth generated token (where the SmolLM2 probe's tie was)
TABLE_SIZE = 20  # candidates per position: OpenAI's top_logprobs allows up to 20
MIN_GAP, MAX_GAP = 0.25, 2.0  # the runner-up's distance below the best: far beyond a bf16 tie at these magnitudes
BELOW_TABLE = 1.0  # a token outside the table lies this far below its last candidate


@dataclass(frozen=True)
class Candidate:
    piece: str  # the token's text ("" is EOS)
    logprob: float

    @property
    def token_id(self) -> int:
        return token_id(self.piece)


def candidates(persona: Persona, ask: Ask, index: int, best: str, tie: bool = False) -> tuple[Candidate, ...]:
    """The model's table at position ``index`` whose best token is ``best``; ``tie``: the runner-up equals it."""
    rng = random.Random(f"logprobs\x1f{persona.seed}\x1f{ask.prompt}\x1f{ask.sample_key}\x1f{index}")
    logprob = -rng.uniform(0.02, 1.2)
    table = [Candidate(best, logprob)]
    others = [piece for piece in (" " + word[:6] for word in rng.sample(WORDS, TABLE_SIZE)) if piece != best]
    logprob -= 0.0 if tie else rng.uniform(MIN_GAP, MAX_GAP)
    for piece in others[:TABLE_SIZE - 1]:
        table.append(Candidate(piece, logprob))
        logprob -= rng.uniform(0.05, 0.8)
    return tuple(table)


def served_source(source: Iterator[str], persona: Persona, ask: Ask, faults: Any, speculative: bool,
                  tp_size: int) -> Iterator[str]:
    """The tokens a server emits: ``source`` (the model's own), but for a parity fault's runner-up at FAULT_POSITION
    of a greedy reply: on a speculative server (parity_tie_flip, parity_mismatch) or at tp > 1 (tp_numerics)."""
    tie = speculative and faults.parity_tie_flip
    flips = tie or (speculative and faults.parity_mismatch) or (tp_size > 1 and faults.tp_numerics)
    if ask.sample_key != "greedy" or not flips:
        return source
    return _flipped(source, persona, ask, tie)


def _flipped(source: Iterator[str], persona: Persona, ask: Ask, tie: bool) -> Iterator[str]:
    for index, piece in enumerate(source):
        yield candidates(persona, ask, index, piece, tie)[1].piece if index == FAULT_POSITION else piece


def positions(persona: Persona, ask: Ask, emitted: Sequence[str], faults: Any) -> list[tuple[Candidate, tuple]]:
    """For each emitted token: (it with its logprob, the position's table), the table being the model's own."""
    own = itertools.islice(reply_tokens(persona, ask), len(emitted))
    tie_at = FAULT_POSITION if faults.parity_tie_flip and ask.sample_key == "greedy" else None
    out = []
    for index, (taken, best) in enumerate(itertools.zip_longest(emitted, own)):
        if taken is None:
            break
        table = candidates(persona, ask, index, taken if best is None else best, tie=index == tie_at)
        logprob = next((c.logprob for c in table if c.piece == taken), table[-1].logprob - BELOW_TABLE)
        out.append((Candidate(taken, logprob), table))
    return out


def meta_info_fields(persona: Persona, ask: Ask, emitted: Sequence[str], faults: Any, top: int,
                     with_text: bool) -> dict:
    """What ``return_logprob`` adds to /generate's meta_info about the output tokens."""
    rows = positions(persona, ask, emitted, faults)
    fields: dict[str, Any] = {
        "output_token_logprobs": [_triple(taken, with_text) for taken, _ in rows],
        "output_token_logprobs_length": len(rows)}
    if top > 0:
        fields["output_top_logprobs"] = [[_triple(c, with_text) for c in table[:top]] for _, table in rows]
    return fields


def chat_logprobs(persona: Persona, ask: Ask, emitted: Sequence[str], faults: Any, top: int) -> dict:
    """Chat's ``choices[i].logprobs``: ChoiceLogprobs(content=[ChatCompletionTokenLogprob, ...])."""
    return {"content": [{**_entry(taken), "top_logprobs": [_entry(c) for c in table[:top]]}
                        for taken, table in positions(persona, ask, emitted, faults)]}


def _triple(candidate: Candidate, with_text: bool) -> list:
    return [candidate.logprob, candidate.token_id, candidate.piece if with_text else None]


def _entry(candidate: Candidate) -> dict:
    return {"token": candidate.piece, "bytes": list(candidate.piece.encode()), "logprob": candidate.logprob}
