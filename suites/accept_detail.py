"""Acceptance as speculative-decoding developers read it: per draft position, per category, over time, sampled.

Per position (vLLM's definition, AIPerf's and llama.cpp's alike): every verify step proposes one draft at each
position k; position k is accepted when the step accepted at least k drafts. So, from the server's per-request
``spec_correct_drafts_histogram`` (SGLang's meta_info and sglext: verify steps by how many drafts each
accepted), summed over requests:
    accepted_k = Σ_{c >= k} histogram[c]        proposed_k = Σ_c histogram[c] (verify steps)
    accept_rate_pos{k} = accepted_k / proposed_k (non-increasing in k; conditional rates are their ratios)
and the accept-length histogram is the same histogram shifted by the bonus token (length c + 1). Without the
histogram the verify counts give the mean only: per-position figures are then absent and the summary says why.

Drift: each request's accept length in the order the requests were sent; PELT (ruptures, mean shift, penalty
``DRIFT_PENALTY_K`` · σ² · ln n with σ from successive differences) finds where the level moved.

Losslessness at temperature > 0: the same prompts drawn ``samples`` times on the speculative server and on the
reference without speculation, each draw its own request with its own seed (``draws``), their token ids compared per
generated position by ground/position_homogeneity.py (the statistics are there); the gate reads its family p at the
run's alpha (reports/gates.py). How many draws equal the greedy text is kept as a figure, not as the test.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import openai
from dspark_ci.ground.stats import ratio_stderr
from dspark_ci.ground.suites import ACCEPT_CATEGORIES, MAX_POSITIONS, category_metric
from dspark_ci.suites.prompts import Prompt
from dspark_ci.suites.server import Server

HISTOGRAM_SOURCE = "spec_correct_drafts_histogram"
DRIFT_PENALTY_K = 6.0  # as reports/change_points.py: about 1 in 50 pure-noise series shows a change
DRIFT_MIN_SEGMENT = 4
DRIFT_MIN_REQUESTS = 12


def position_metric(k: int) -> str:
    return f"accept_rate_pos{k}"


def _accepted_at(histogram: Sequence[int], k: int) -> int:
    return sum(histogram[k:])


def positions(requests: Sequence) -> list[dict]:
    """Per draft position k = 1..: accepted, proposed, rate and its per-request standard error."""
    with_histogram = [r for r in requests if r.histogram]
    depth = max((len(r.histogram) - 1 for r in with_histogram), default=0)
    table = []
    for k in range(1, depth + 1):
        accepted = [_accepted_at(r.histogram, k) for r in with_histogram]
        proposed = [sum(r.histogram) for r in with_histogram]
        total = sum(proposed)
        table.append({"position": k, "accepted": sum(accepted), "proposed": total,
                      "rate": sum(accepted) / total if total else None,
                      "stderr": ratio_stderr(accepted, proposed) if total and len(with_histogram) > 1 else None})
    return table


def accept_length_histogram(requests: Sequence) -> dict[str, int]:
    """Verify steps by accept length (accepted drafts + the bonus token), summed over requests."""
    counts: dict[str, int] = {}
    for r in requests:
        for correct, steps in enumerate(r.histogram or ()):
            if steps:
                counts[str(correct + 1)] = counts.get(str(correct + 1), 0) + steps
    return counts


def position_metrics(table: Sequence[dict]) -> dict[str, float | None]:
    metrics: dict[str, float | None] = {}
    for row in table[:MAX_POSITIONS]:
        metrics[position_metric(row["position"])] = row["rate"]
        metrics[f"{position_metric(row['position'])}_stderr"] = row["stderr"]
    return metrics


def by_category(requests: Sequence) -> dict[str, dict]:
    """Per category: requests, accept length, per-position rates and the accept-length histogram."""
    categories: dict[str, list] = {}
    for r in requests:
        if r.spec_verify_ct:
            categories.setdefault(r.category, []).append(r)
    detail = {}
    for name, members in sorted(categories.items()):
        verify = sum(r.spec_verify_ct for r in members)
        detail[name] = {"requests": len(members),
                        "accept_length": sum(r.completion_tokens for r in members) / verify if verify else None,
                        "positions": [{"position": row["position"], "rate": row["rate"]} for row in positions(members)],
                        "accept_length_histogram": accept_length_histogram(members)}
    return detail


def category_metrics(requests: Sequence) -> dict[str, float | None]:
    """accept_length_CATEGORY (Σ completion tokens / Σ verify steps over the category's requests, as accept_length)
    and its per-request standard error, for each category of ``dspark_ci.ground.suites.ACCEPT_CATEGORIES`` the workload
    has."""
    metrics: dict[str, float | None] = {}
    for category in ACCEPT_CATEGORIES:
        members = [r for r in requests if r.spec_verify_ct and r.category == category]
        if not members:
            continue
        tokens, steps = [r.completion_tokens for r in members], [r.spec_verify_ct for r in members]
        metrics[category_metric(category)] = sum(tokens) / sum(steps)
        metrics[f"{category_metric(category)}_stderr"] = ratio_stderr(tokens, steps)
    return metrics


def position_source(requests: Sequence) -> str | None:
    """Where per-position figures came from, or None when the server reported no histogram."""
    measured = [r for r in requests if r.spec_verify_ct]
    if measured and all(r.histogram for r in measured):
        return f"server: {HISTOGRAM_SOURCE} per request ({measured[0].source})"
    return None


@dataclass(frozen=True)
class Drift:
    change_at: int | None  # the first request (in sent order, 0-based) at the new level; None: no change found
    before: float | None
    after: float | None
    noise: float
    series: tuple[float, ...]  # accept length per request, in sent order

    def to_dict(self) -> dict:
        return {"change_at_request": self.change_at, "before": self.before, "after": self.after,
                "noise": self.noise, "requests": len(self.series),
                "method": f"ruptures PELT (l2), penalty {DRIFT_PENALTY_K:g}·σ²·ln n, σ from successive differences",
                "series": [round(v, 4) for v in self.series]}


def drift(requests: Sequence) -> Drift:
    """The first change of level of per-request accept length along the order the requests were sent."""
    import ruptures  # a dependency; imported here so the suite's other figures do not wait on it

    ordered = sorted((r for r in requests if r.spec_verify_ct), key=lambda r: r.order)
    series = np.array([r.completion_tokens / r.spec_verify_ct for r in ordered], dtype=float)
    if len(series) < DRIFT_MIN_REQUESTS:
        return Drift(None, None, None, 0.0, tuple(series))
    sigma = max(float(np.median(np.abs(np.diff(series)))) / (0.6745 * math.sqrt(2)), 1e-3 * float(np.mean(series)))
    breaks = ruptures.Pelt(model="l2", min_size=DRIFT_MIN_SEGMENT).fit(series).predict(
        pen=DRIFT_PENALTY_K * sigma ** 2 * math.log(len(series)))
    if len(breaks) < 2:
        return Drift(None, None, None, sigma, tuple(series))
    at = breaks[0]
    return Drift(ordered[at].order, float(np.median(series[:at])), float(np.median(series[at:breaks[1]])), sigma,
                 tuple(series))


# Seeds of the draws: one per request, and the two sides' never the same, so that a server that honours them
# (SGLang with --enable-deterministic-inference; otherwise it draws afresh) still gives independent draws.
SEED_SIDES = {"speculative": 1, "reference": 2}
SEED_STRIDE = 1_000_000


@dataclass(frozen=True)
class Draw:
    """One sampled reply: its tokens as its logprobs name them, and its text. Logprobs, not SGLang's
    ``return_token_ids``: sglang-router passes OpenAI's fields on and drops that one, which left every draw through
    a PD router without tokens."""

    tokens: tuple[str, ...]
    text: str


def draws(server: Server, prompts: Sequence[Prompt], samples: int, tokens: int, sampling: dict, concurrency: int,
          side: str) -> list[list[Draw | None]]:
    """Per prompt, ``samples`` draws of ``tokens`` tokens (None: the request failed or carried no tokens)."""
    items = [(index, repeat) for index in range(len(prompts)) for repeat in range(samples)]
    first = SEED_SIDES[side] * SEED_STRIDE

    def draw(client: openai.OpenAI, item: tuple[int, int]) -> Draw | None:
        body = {**sampling, "seed": first + item[0] * samples + item[1], "logprobs": True}
        return _draw(client, server.model, prompts[item[0]].text, tokens, body)

    answers = server.ask_each(draw, items, concurrency, label=f"accept lossless ({side})")
    return [answers[index * samples:(index + 1) * samples] for index in range(len(prompts))]


def greedy_share(per_prompt: Sequence[Sequence[Draw | None]], greedy: Sequence[str | None]) -> dict:
    """How many draws equal the greedy text of their prompt (a figure; the test is per position)."""
    counted = [(text, draw.text) for text, prompt_draws in zip(greedy, per_prompt, strict=False)
               for draw in prompt_draws if draw is not None and text is not None]
    failed = sum(draw is None for prompt_draws in per_prompt for draw in prompt_draws)
    return {"greedy_like": sum(a == b for a, b in counted), "samples": len(counted), "failed": failed}


def token_ids(sides: Mapping[str, Sequence[Sequence[Draw | None]]]
              ) -> tuple[dict[str, list[list[tuple[int, ...] | None]]], tuple[str, ...]]:
    """Each side's draws with their tokens numbered alike on both sides, and the tokens by number. Two tokens that
    print alike become one category on both sides: the test loses a little power, never a false alarm."""
    numbers: dict[str, int] = {}

    def ids(draw: Draw | None) -> tuple[int, ...] | None:
        return None if draw is None else tuple(numbers.setdefault(token, len(numbers)) for token in draw.tokens)

    numbered = {side: [[ids(draw) for draw in prompt_draws] for prompt_draws in per_prompt]
                for side, per_prompt in sides.items()}
    return numbered, tuple(numbers)


def repeated_words(texts: Sequence[str | None]) -> int:
    """Words that repeat an earlier word of the same text, summed over ``texts`` (what a repetition penalty cuts)."""
    total = 0
    for text in texts:
        words = [word.strip(".,;:!?").lower() for word in (text or "").split()]
        total += len(words) - len(set(words))
    return total


def greedy_texts(server: Server, prompts: Sequence[Prompt], tokens: int, concurrency: int,
                 **sampling) -> list[str | None]:
    body = {"temperature": 0.0, **sampling}
    return server.ask_each(lambda client, prompt: _text(client, server.model, prompt.text, tokens, body), prompts,
                           concurrency, label="accept greedy")


# OpenAI's own sampling parameters; the rest (top_k, SGLang's repetition_penalty) go in extra_body
OPENAI_SAMPLING = ("temperature", "top_p", "frequency_penalty", "presence_penalty", "seed")


def _reply(client: openai.OpenAI, model: str, text: str, tokens: int, body: dict):
    known = {key: value for key, value in body.items() if key in OPENAI_SAMPLING}
    extra = {key: value for key, value in body.items() if key not in OPENAI_SAMPLING}
    try:
        return client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}],
                                              max_tokens=tokens, extra_body=extra or None, **known)
    except openai.OpenAIError:
        return None


def _message_text(message) -> str:
    return (getattr(message, "reasoning_content", None) or "") + (message.content or "")


def _text(client: openai.OpenAI, model: str, text: str, tokens: int, body: dict) -> str | None:
    response = _reply(client, model, text, tokens, body)
    return None if response is None else _message_text(response.choices[0].message)


def _draw(client: openai.OpenAI, model: str, text: str, tokens: int, body: dict) -> Draw | None:
    response = _reply(client, model, text, tokens, body)
    if response is None:
        return None
    logprobs = response.choices[0].logprobs
    if logprobs is None or logprobs.content is None:
        return None
    return Draw(tuple(item.token for item in logprobs.content), _message_text(response.choices[0].message))
