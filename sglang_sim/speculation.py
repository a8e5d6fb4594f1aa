"""The model of speculative decoding: how many draft tokens each verify step accepts.

Each of the up to ``max_accept`` drafts is accepted with probability alpha, given the previous one
was; the first rejection ends the step. The step emits accepted + 1 tokens (the target's bonus
token), so E[accept length] = (1 - alpha^(g+1)) / (1 - alpha) for g = max_accept.
Per-request statistics follow SGLang's definitions (tokenizer_manager._calculate_spec_decoding_metrics).
"""

from __future__ import annotations

from typing import Any

import random
from dataclasses import dataclass, field

from sglang_sim.args import ServerArgs


@dataclass(frozen=True)
class SpecShape:
    algorithm: str
    num_draft_tokens: int  # SGLang's speculative_num_draft_tokens (DSpark: gamma + 1)
    max_accept: int  # the most drafts one verify step can accept

    @property
    def drafts_per_step(self) -> int:
        """Proposed drafts per verify step, as SGLang counts them (num_draft_tokens - 1)."""
        return self.num_draft_tokens - 1

    @classmethod
    def of(cls, args: ServerArgs) -> "SpecShape | None":
        """From resolved args; None when the server does not speculate."""
        if args.speculative_algorithm is None:
            return None
        tokens = args.speculative_num_draft_tokens or 2
        # Tree-shaped EAGLE verifies num_draft_tokens nodes but a path is at most num_steps deep.
        deep = args.speculative_num_steps if args.speculative_algorithm in ("EAGLE", "EAGLE3", "STANDALONE") else None
        return cls(args.speculative_algorithm, tokens, max(0, min(tokens - 1, deep or tokens - 1)))


def expected_accept_length(alpha: float, max_accept: int) -> float:
    if alpha >= 1.0:
        return float(max_accept + 1)
    return (1 - alpha ** (max_accept + 1)) / (1 - alpha)


def draw_accepted(rng: random.Random, alpha: float, max_accept: int) -> int:
    accepted = 0
    while accepted < max_accept and rng.random() < alpha:
        accepted += 1
    return accepted


@dataclass
class SpecStats:
    """One request's speculative statistics, kept in step with the tokens actually emitted."""

    shape: SpecShape
    verify_ct: int = 0
    correct_drafts: int = 0
    histogram: list[int] = field(default_factory=list)  # index = correct drafts in a step

    def record_step(self, correct: int) -> None:
        self.verify_ct += 1
        self.correct_drafts += correct
        if len(self.histogram) <= correct:
            self.histogram.extend([0] * (correct + 1 - len(self.histogram)))
        self.histogram[correct] += 1

    def meta_info(self, completion_tokens: int) -> dict:
        """SGLang's meta_info spec fields (only once a verify step has run, as SGLang does)."""
        if self.verify_ct == 0:
            return {}
        proposed = self.verify_ct * self.shape.drafts_per_step
        fields: dict[str, Any] = {}
        if proposed:  # SGLang only reports the rates when drafts were proposed
            fields = {
                "spec_accept_rate": self.correct_drafts / proposed,
                "spec_accept_length": completion_tokens / self.verify_ct,
                "spec_num_correct_drafts": self.correct_drafts,
                "spec_num_proposed_drafts": proposed,
                "spec_verify_ct": self.verify_ct,
            }
        if any(self.histogram):
            fields["spec_correct_drafts_histogram"] = list(self.histogram)
        return fields
