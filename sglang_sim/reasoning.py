"""When the simulated model thinks, as SGLang decides it for a ``--reasoning-parser``.

SGLang's chat layer decides per request whether the model reasons (serving_chat._get_reasoning_from_request,
sent to the scheduler as ``require_reasoning``): with a chat template whose thinking toggle it cannot infer
(ours), by the parser's ``reasoning_default``. The simulated model thinks in ``<think>``/``</think>`` tags, so the
parsers here are those whose detectors use them (parser/reasoning_parser.py, read in the front-end venv). The
scheduler then counts a reasoning request's tokens up to and including ``</think>`` as ``reasoning_tokens``
(schedule_batch.Req.update_reasoning_tokens).

Without a parser SGLang never asks for reasoning; the simulated model still thinks when the request's chat
template arguments say so (``thinking`` or ``enable_thinking``), as a real model's template would switch it on,
and its tags stay in the content.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dspark_ci.sglang_sim.tokenizer import THINK_END

# parser -> its detector's reasoning_default (the SGLang release), for the detectors whose tags are <think></think>
REASONING_DEFAULTS = {
    "deepseek-r1": "always", "gigachat35": "always", "minimax-append-think": "always", "step3": "always",
    "step3p5": "always",
    "deepseek-v3": "explicit_thinking", "deepseek-v4": "explicit_thinking", "deepseek-v41": "explicit_thinking",
    "kimi_k2": "thinking",
    "dots": "enable_thinking", "glm45": "enable_thinking", "granite_thinking_parser": "enable_thinking",
    "interns1": "enable_thinking", "ling3": "enable_thinking", "minimax": "enable_thinking",
    "nanbeige": "enable_thinking", "nemotron_3": "enable_thinking", "qwen3": "enable_thinking",
    "qwen3-thinking": "enable_thinking",
    "mimo": "explicit_enable_thinking", "poolside_v1": "explicit_enable_thinking",
}
TEMPLATE_TOGGLES = ("thinking", "enable_thinking")  # what our template (and the simulator) reads without a parser


def reasoning_requested(parser: str | None, kwargs: Mapping | None) -> bool:
    """serving_chat._get_reasoning_from_request with no template toggle inferred: the parser's default mode."""
    mode = REASONING_DEFAULTS.get(parser or "")
    if mode is None:  # no parser (or one thinking in other tags): the template's arguments alone
        return any(bool((kwargs or {}).get(toggle)) for toggle in TEMPLATE_TOGGLES)
    if mode == "always":
        return True
    if mode in TEMPLATE_TOGGLES:
        return not kwargs or kwargs.get(mode) is not False
    return kwargs is not None and kwargs.get(mode.removeprefix("explicit_")) is True


def separates_reasoning(parser: str | None) -> bool:
    """Whether SGLang's parser splits this model's thinking into reasoning_content (and counts its tokens)."""
    return parser in REASONING_DEFAULTS


@dataclass
class ReasoningCount:
    """Req.update_reasoning_tokens: a reasoning request's tokens, step by step, up to and including the first
    ``</think>``; zero for a request that does not reason."""

    active: bool
    tokens: int = 0
    over: bool = False

    def add(self, step: list[str]) -> int:
        if self.active and not self.over:
            self.over = THINK_END in step
            self.tokens += step.index(THINK_END) + 1 if self.over else len(step)
        return self.tokens
