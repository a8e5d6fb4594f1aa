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

Losslessness at temperature > 0: the same prompts sampled on the speculative server and on the reference without
speculation; each sample's first ``tokens`` tokens either equal the greedy continuation or not. Speculative
sampling is lossless when the share equal to greedy is the same on both (a draft sampler that ignores the
temperature, or top-p/top-k, moves it toward greedy). The gate compares the two shares (reports/gates.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import openai

from ground.stats import ratio_stderr
from ground.suites import ACCEPT_CATEGORIES, MAX_POSITIONS, category_metric
from suites.prompts import Prompt
from suites.server import Server

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
    and its per-request standard error, for each category of ``ground.suites.ACCEPT_CATEGORIES`` the workload has."""
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


@dataclass(frozen=True)
class SampledShare:
    """How many samples' first ``tokens`` tokens equal the greedy continuation, on one server."""

    greedy_like: int
    samples: int
    failed: int

    @property
    def share(self) -> float | None:
        return self.greedy_like / self.samples if self.samples else None

    @property
    def stderr(self) -> float | None:
        """Binomial standard error with half a sample added each way, so a share of 0 or 1 is not certain."""
        if not self.samples:
            return None
        p = (self.greedy_like + 0.5) / (self.samples + 1)
        return math.sqrt(p * (1 - p) / self.samples)


def greedy_like_share(server: Server, prompts: Sequence[Prompt], samples: int, tokens: int, temperature: float,
                      top_p: float | None, concurrency: int, greedy: Sequence[str | None]) -> SampledShare:
    """Sample every prompt ``samples`` times; count the samples equal to ``greedy`` (per prompt, the greedy text)."""
    items = [(index, repeat) for index in range(len(prompts)) for repeat in range(samples)]
    body = {"temperature": temperature, **({"top_p": top_p} if top_p is not None else {})}
    texts = server.ask_each(lambda client, item: _text(client, server.model, prompts[item[0]].text, tokens, body),
                            items, concurrency, label="accept sampled")
    counted = [(greedy[index], text) for (index, _), text in zip(items, texts, strict=False)
               if text is not None and greedy[index] is not None]
    return SampledShare(sum(g == t for g, t in counted), len(counted), len(items) - len(counted))


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
OPENAI_SAMPLING = ("temperature", "top_p", "frequency_penalty", "presence_penalty")


def _text(client: openai.OpenAI, model: str, text: str, tokens: int, body: dict) -> str | None:
    known = {key: value for key, value in body.items() if key in OPENAI_SAMPLING}
    extra = {key: value for key, value in body.items() if key not in OPENAI_SAMPLING}
    try:
        response = client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}],
                                                  max_tokens=tokens, extra_body=extra or None, **known)
    except openai.OpenAIError:
        return None
    message = response.choices[0].message
    return (getattr(message, "reasoning_content", None) or "") + (message.content or "")
