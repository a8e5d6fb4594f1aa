"""The model of speculative decoding: how many draft tokens each verify step accepts.

Draft position k (1-based) is accepted with probability alpha_k, given the previous one was; the first
rejection ends the step. The step emits accepted + 1 tokens (the target's bonus token). With one alpha
for every position, E[accept length] = (1 - alpha^(g+1)) / (1 - alpha) for g = max_accept.

``AcceptModel`` gives alpha_k as drafts behave in the field: a base alpha (DSPARK_SIM_ACCEPT_PROB),
lower deeper into the block (DSPARK_SIM_ACCEPT_DECAY per position), higher on code and math and lower on
long context (drafts predict boilerplate and derivations well, lose track over long inputs: vllm#47602),
lower when sampling (temperature > 0 flattens the target's distribution, so drafts match it less often).
The category is read from the prompt's text, as a draft model sees nothing else.
Per-request statistics follow SGLang's definitions (tokenizer_manager._calculate_spec_decoding_metrics).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dspark_ci.sglang_sim.args import ServerArgs


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
    def of(cls, args: ServerArgs) -> SpecShape | None:
        """From resolved args; None when the server does not speculate."""
        if args.speculative_algorithm is None:
            return None
        tokens = args.speculative_num_draft_tokens or 2
        # Tree-shaped EAGLE verifies num_draft_tokens nodes but a path is at most num_steps deep.
        deep = args.speculative_num_steps if args.speculative_algorithm in ("EAGLE", "EAGLE3", "STANDALONE") else None
        return cls(args.speculative_algorithm, tokens, max(0, min(tokens - 1, deep or tokens - 1)))


# category -> words that mark a prompt of it; the first category whose word appears wins (factors: the
# DSPARK_SIM_CATEGORY_ACCEPT knob)
CATEGORY_WORDS: dict[str, tuple[str, ...]] = {
    "code": ("```", "def ", "python", "sql", "bash", "javascript", "function", "code", "program"),
    "math": ("prove", "solve", "equation", "integral", "calculate", "compute", "math"),
}
LONG_CONTEXT_TOKENS = 2048  # prompts at least this long are long context, whatever they ask
CATEGORIES = (*CATEGORY_WORDS, "long_context", "other")  # every category prompt_category returns
CATEGORY_REGRESSION_ACCEPT = 0.6  # fault category_regression=NAME: the factor on alpha for that category's prompts
SAMPLED_ACCEPT = 0.85  # factor on alpha at temperature > 0
DRIFT_ACCEPT = 0.6  # fault accept_drift: the factor on alpha after the step (an EPLB rebalance gone wrong)
LATE_POSITION_FACTOR = 0.5  # fault position_regression=K: accepted / proposed at positions >= K halves


def prompt_category(prompt: str, prompt_tokens: int) -> str:
    """The category the simulated draft behaves by: long context by length, else code/math by a marker word."""
    if prompt_tokens >= LONG_CONTEXT_TOKENS:
        return "long_context"
    lowered = prompt.lower()
    return next((name for name, words in CATEGORY_WORDS.items() if any(w in lowered for w in words)), "other")


@dataclass(frozen=True)
class AcceptModel:
    """alpha_k per draft position: the boot's alpha, the decay per position and the planted faults."""

    alpha: float
    decay: float = 1.0  # alpha_k = alpha * decay^(k-1)
    late_from: int | None = None  # fault position_regression: accepted/proposed halves from this position on
    max_accept: int = 1
    category_factors: Mapping[str, float] = field(default_factory=dict)  # category -> factor on alpha

    def alphas(self, category: str = "other", sampled: bool = False, drifted: bool = False) -> tuple[float, ...]:
        factor = self.category_factors.get(category, 1.0)
        factor *= (SAMPLED_ACCEPT if sampled else 1.0) * (DRIFT_ACCEPT if drifted else 1.0)
        base = [min(0.99, self.alpha * factor * self.decay ** k) for k in range(self.max_accept)]
        return tuple(base) if self.late_from is None else _late_halved(base, self.late_from)


def _late_halved(base: list[float], late_from: int) -> tuple[float, ...]:
    """Accepted / proposed halved at every position from ``late_from`` on (alpha at that position halved: the
    positions after it are reached half as often), the earlier positions raised by one common factor so the expected
    accept length stays what it was, as far as alpha <= 0.99 allows: a draft that trades depth for its first
    tokens, which a mean accept-length gate cannot see."""
    if late_from > len(base) or not any(base):
        return tuple(base)
    late = [base[late_from - 1] * LATE_POSITION_FACTOR, *base[late_from:]]
    target = expected_length(base)
    low, high = 1.0, 1.0 / max(min(base[:late_from - 1] or [1.0]), 1e-9)
    for _ in range(60):  # bisection on the early factor: the expected length grows with it
        mid = (low + high) / 2
        early = [min(0.99, a * mid) for a in base[:late_from - 1]]
        low, high = (mid, high) if expected_length(early + late) < target else (low, mid)
    return tuple([min(0.99, a * low) for a in base[:late_from - 1]] + late)


def expected_length(alphas) -> float:
    """E[accept length] of one verify step: 1 + Σ_k Π_{j<=k} alpha_j."""
    total, reach = 1.0, 1.0
    for alpha in alphas:
        reach *= alpha
        total += reach
    return total


def expected_accept_length(alpha: float, max_accept: int) -> float:
    if alpha >= 1.0:
        return float(max_accept + 1)
    return (1 - alpha ** (max_accept + 1)) / (1 - alpha)


def draw_accepted(rng: random.Random, alphas: float | tuple[float, ...], max_accept: int) -> int:
    """Drafts accepted in one step: position k is accepted with probability alphas[k-1] (one float: every position)."""
    per_position = alphas if isinstance(alphas, tuple) else (alphas,) * max_accept
    accepted = 0
    while accepted < min(max_accept, len(per_position)) and rng.random() < per_position[accepted]:
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
