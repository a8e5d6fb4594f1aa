"""Speculative acceptance, per request and as the server counts it (CONTRACT.md definitions).

Per request (the metrics): chat completions with ``return_spec_tokens_details`` give
``sglext.spec_tokens_details``; ``return_meta_info`` adds ``choices[0].meta_info`` (same spec fields,
plus ``dp_rank``), used when sglext is missing.
    accept_length = Σ completion_tokens / Σ spec_verify_ct      (bonus token included)
    accept_rate   = Σ spec_num_correct_drafts / Σ spec_num_proposed_drafts

Server side (the cross-check), snapshots before and after the requests:
- ``/metrics`` (with --enable-metrics): counters ``sglang:generation_tokens_total`` and
  ``sglang:spec_verify_calls_total``; their differences give the window exactly, all DP ranks together.
  SGLang's counters are labelled, and a labelled counter appears only once a request has moved it: one
  absent before the window on a server that serves /metrics is a fresh one (started with
  --skip-server-warmup, or nothing counted yet) and counts from zero, so the check runs whenever
  metrics are enabled. When it cannot run, the summary record says why.
- ``/server_info``: ``internal_states`` has one entry per DP rank with ``avg_spec_accept_length``, a
  ratio cumulative since start (no counts). The window is exact for a rank that had no speculative
  step before the snapshot; otherwise the value mixes in earlier traffic and is recorded but not
  compared. The scheduler counts the tokens of verify steps only (not a request's first token, which
  prefill makes), so it is compared with (Σ completion_tokens − requests) / Σ spec_verify_ct. Ranks
  are combined weighted by the verify-step tokens each emitted in the window (``dp_rank`` of each
  response): Σ tokens_r / Σ (tokens_r / accept_length_r) = Σ tokens / Σ verify steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import openai
from dspark_ci.ground.stats import ratio_stderr
from dspark_ci.suites.prompts import Prompt
from dspark_ci.suites.sanity import usage_contradiction
from dspark_ci.suites.server import Server

SPEC_FIELDS = ("spec_verify_ct", "spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_accept_length",
               "spec_accept_rate", "spec_correct_drafts_histogram")
GENERATION_TOKENS = "sglang:generation_tokens_total"
VERIFY_CALLS = "sglang:spec_verify_calls_total"


@dataclass(frozen=True)
class RequestSpec:
    prompt_index: int
    completion_tokens: int
    spec_verify_ct: int | None  # None: the response carried no speculative statistics
    spec_num_correct_drafts: int | None
    spec_num_proposed_drafts: int | None
    spec_accept_length: float | None  # as the server computed it for this request
    dp_rank: int | None
    source: str | None  # "sglext" | "meta_info" | None
    error: str | None = None
    category: str = "other"  # the workload's category of its prompt
    histogram: tuple[int, ...] | None = None  # spec_correct_drafts_histogram: verify steps by correct drafts
    order: int = 0  # its place in the order the requests were sent (drift is read along it)
    temperature: float = 0.0


@dataclass(frozen=True)
class ServerSnapshot:
    has_server_info: bool  # False: the server does not serve /server_info
    speculative_algorithm: str | None
    rank_accept_lengths: tuple[float | None, ...]  # avg_spec_accept_length per DP rank, cumulative
    metrics_served: bool  # GET /metrics answered 200 (SGLang: --enable-metrics)
    counters: Mapping[str, float]  # GENERATION_TOKENS and VERIFY_CALLS as far as /metrics has them
    num_draft_tokens: int | None = None  # speculative_num_draft_tokens: the most tokens one verify step can emit


def take_snapshot(server: Server) -> ServerSnapshot:
    info = server.get_json("/server_info") or server.get_json("/get_server_info")
    if info is not None and "model_path" not in info and "internal_states" not in info:
        info = None  # not a server's: sglang-router answers /get_server_info about itself (router_manager, ...)
    states = (info or {}).get("internal_states") or []
    samples = server.metrics_samples()
    return ServerSnapshot(
        has_server_info=info is not None,
        speculative_algorithm=(info or {}).get("speculative_algorithm"),
        rank_accept_lengths=tuple(state.get("avg_spec_accept_length") for state in states),
        metrics_served=samples is not None,
        counters={name: value for name in (GENERATION_TOKENS, VERIFY_CALLS)
                  if (value := (samples or {}).get(name)) is not None},
        num_draft_tokens=(info or {}).get("speculative_num_draft_tokens"),
    )


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_p: float | None = None

    def body(self) -> dict:
        return {"temperature": self.temperature, **({"top_p": self.top_p} if self.top_p is not None else {})}


GREEDY = Sampling()


def measure_requests(server: Server, num_requests: int, max_tokens: int, concurrency: int,
                     workload: Sequence[Prompt], sampling: Sampling = GREEDY, api: str = "chat") -> list[RequestSpec]:
    """``num_requests`` requests cycling through ``workload``, sent in order (``order``), ``concurrency`` at a time."""
    items = [(order, order % len(workload)) for order in range(num_requests)]
    return server.ask_each(lambda client, item: _one_request(client, server.model, workload, item, max_tokens, sampling,
                                                               api),
                           items, concurrency, label="accept")


def _one_request(client: openai.OpenAI, model: str, workload: Sequence[Prompt], item: tuple[int, int],
                 max_tokens: int, sampling: Sampling, api: str = "chat") -> RequestSpec:
    order, prompt_index = item
    prompt = workload[prompt_index]
    try:
        extra = {"return_spec_tokens_details": True, "return_meta_info": True}
        # completions through sglang-router, which drops return_spec_tokens_details from chat (accept.api)
        response: Any = (client.completions.create(model=model, prompt=prompt.text, max_tokens=max_tokens,
                                                   extra_body=extra, **sampling.body()) if api == "completions"
                         else client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt.text}], max_tokens=max_tokens,
            extra_body=extra, **sampling.body()))
    except openai.OpenAIError as err:
        return RequestSpec(prompt_index, 0, None, None, None, None, None, None, error=str(err),
                           category=prompt.category, order=order, temperature=sampling.temperature)
    body = response.model_dump()
    meta = (body["choices"][0].get("meta_info") or {})
    details, source = _spec_details(body, meta)
    tokens = (body.get("usage") or {}).get("completion_tokens") or meta.get("completion_tokens") or 0
    return RequestSpec(
        prompt_index=prompt_index, completion_tokens=tokens,
        spec_verify_ct=details.get("spec_verify_ct"), spec_num_correct_drafts=details.get("spec_num_correct_drafts"),
        spec_num_proposed_drafts=details.get("spec_num_proposed_drafts"),
        spec_accept_length=details.get("spec_accept_length"), dp_rank=meta.get("dp_rank"), source=source,
        category=prompt.category, histogram=tuple(details.get("spec_correct_drafts_histogram") or ()) or None,
        order=order, temperature=sampling.temperature)


def _spec_details(body: Mapping[str, Any], meta: Mapping[str, Any]) -> tuple[dict, str | None]:
    details = (body.get("sglext") or {}).get("spec_tokens_details")
    if isinstance(details, list):  # n > 1 gives a list; we send n = 1
        details = details[0] if details else None
    if details and details.get("spec_verify_ct"):
        return dict(details), "sglext"
    if meta.get("spec_verify_ct"):
        return {key: meta.get(key) for key in SPEC_FIELDS}, "meta_info"
    return {}, None


def with_spec(requests: Sequence[RequestSpec]) -> list[RequestSpec]:
    return [r for r in requests if r.spec_verify_ct]


def impossible_requests(requests: Sequence[RequestSpec]) -> list[str]:
    """Requests whose usage contradicts their own speculative counts (``sanity.usage_contradiction``, the rule
    the sanity check applies to its own replies). Any one of them makes the figures an error of measurement, not
    a result."""
    problems = []
    for r in with_spec(requests):
        verify, correct, proposed = r.spec_verify_ct or 0, r.spec_num_correct_drafts, r.spec_num_proposed_drafts
        if verify and isinstance(correct, int) and isinstance(proposed, int):
            contradiction = usage_contradiction(r.completion_tokens, verify, correct, proposed)
            problems += [f"request {r.order}: {contradiction}"] if contradiction else []
    return problems


def per_request_metrics(requests: Sequence[RequestSpec]) -> dict[str, float | None]:
    measured = with_spec(requests)
    verify = sum(r.spec_verify_ct or 0 for r in measured)
    proposed = sum(r.spec_num_proposed_drafts or 0 for r in measured)
    return {
        "accept_length": sum(r.completion_tokens for r in measured) / verify if verify else None,
        "accept_rate": sum(r.spec_num_correct_drafts or 0 for r in measured) / proposed if proposed else None,
        # this boot's per-request standard errors (paired bootstrap over requests), for the statistical gates
        "accept_length_stderr": ratio_stderr([r.completion_tokens for r in measured],
                                             [r.spec_verify_ct or 0 for r in measured]) if verify else None,
        "accept_rate_stderr": ratio_stderr([r.spec_num_correct_drafts or 0 for r in measured],
                                           [r.spec_num_proposed_drafts or 0 for r in measured]) if proposed else None,
    }


@dataclass(frozen=True)
class ServerFigures:
    figures: list[dict]  # the server's own accept length over the window, each with how it was obtained
    no_metrics_figure_because: str | None  # why /metrics gave no figure; None when it did


def server_side_figures(before: ServerSnapshot, after: ServerSnapshot,
                        requests: Sequence[RequestSpec]) -> ServerFigures:
    metrics_figure, because = _metrics_figure(before, after)
    figures = [metrics_figure] if metrics_figure is not None else []
    if after.rank_accept_lengths:
        figures.append(_server_info_figure(before, after, requests))
    failed = sum(1 for r in requests if r.error)
    if failed:  # the server counted the abandoned requests' steps, which no response reports: not one window
        inexact = (f"{failed} of {len(requests)} requests failed: the server's counters hold work no response "
                   f"reports, so they are not compared")
        figures = [{**figure, "exact_window": False, "not_compared_because": inexact} for figure in figures]
    return ServerFigures(figures, because)


def _metrics_figure(before: ServerSnapshot, after: ServerSnapshot) -> tuple[dict | None, str | None]:
    """The /metrics figure, or None and why there is none."""
    if not (before.metrics_served and after.metrics_served):
        return None, "/metrics not served (GET /metrics did not answer 200: SGLang serves it with --enable-metrics)"
    missing = [name for name in (GENERATION_TOKENS, VERIFY_CALLS) if name not in after.counters]
    if missing:
        before_too = all(name not in before.counters for name in missing)
        return None, (f"{' and '.join(missing)} absent from /metrics after the window{' too' if before_too else ''}"
                      f" (no request moved it, or a server without it)")
    # A labelled counter appears once moved: absent before the window on a server serving /metrics is zero.
    window = {name: after.counters[name] - before.counters.get(name, 0.0)
              for name in (GENERATION_TOKENS, VERIFY_CALLS)}
    verify = window[VERIFY_CALLS]
    return {"source": "/metrics counters", "exact_window": True, "counts_first_token": True,
            "window_start": _window_start(before), "generation_tokens": window[GENERATION_TOKENS],
            "verify_calls": verify,  # none counted while responses report some is a disagreement too
            "accept_length": window[GENERATION_TOKENS] / verify if verify > 0 else None}, None


def _window_start(before: ServerSnapshot) -> str:
    """How the counters' values at the window's start were known."""
    absent = [name for name in (GENERATION_TOKENS, VERIFY_CALLS) if name not in before.counters]
    if not absent:
        return "counter values before the window"
    if len(absent) == 2:
        return "counters absent before the window (fresh server): counted from zero"
    [present] = [name for name in (GENERATION_TOKENS, VERIFY_CALLS) if name in before.counters]
    return f"{absent[0]} absent before the window: counted from zero; {present} from its value before the window"


def _server_info_figure(before: ServerSnapshot, after: ServerSnapshot, requests: Sequence[RequestSpec]) -> dict:
    reconstructed = _server_info_window(before, after)
    if reconstructed is not None:
        return reconstructed
    ranks = len(after.rank_accept_lengths)
    before_values = before.rank_accept_lengths or (None,) * ranks
    tokens_by_rank = _tokens_by_rank(requests, ranks)
    per_rank, exact, tokens_sum, verify_sum = [], True, 0.0, 0.0
    for rank, (old, new) in enumerate(zip(before_values, after.rank_accept_lengths, strict=False)):
        window_tokens = tokens_by_rank.get(rank, 0) if tokens_by_rank is not None else None
        per_rank.append({"rank": rank, "before": old, "after": new, "window_tokens": window_tokens})
        weight = 1.0 if window_tokens is None else window_tokens  # equal weights when dp_rank is unknown
        if new is None or not weight:
            continue
        exact = exact and old is None
        tokens_sum += weight
        verify_sum += weight / new
    return {
        "source": "/server_info internal_states",
        "exact_window": exact and verify_sum > 0 and tokens_by_rank is not None,
        # The scheduler counts tokens per verify step: a request's first token (from prefill) is not in it.
        "counts_first_token": False,
        "weighting": "tokens per dp_rank" if tokens_by_rank is not None else "equal (no dp_rank in responses)",
        "accept_length": tokens_sum / verify_sum if verify_sum else None, "ranks": per_rank,
    }


def _server_info_window(before: ServerSnapshot, after: ServerSnapshot) -> dict | None:
    """/server_info's figure over the window when the rank had verify steps before it (the sanity check's): its
    cumulative ratio times /metrics' verify calls gives the tokens at each end (both count one step per request per
    verify), so the cross-check still runs. None when that cannot be done (several ranks, no /metrics counters)."""
    if len(after.rank_accept_lengths) != 1 or len(before.rank_accept_lengths) != 1:
        return None
    old, new = before.rank_accept_lengths[0], after.rank_accept_lengths[0]
    if old is None or new is None or not all(VERIFY_CALLS in snapshot.counters for snapshot in (before, after)):
        return None
    calls_before, calls_after = before.counters[VERIFY_CALLS], after.counters[VERIFY_CALLS]
    window = calls_after - calls_before
    return {"source": "/server_info internal_states", "exact_window": window > 0, "counts_first_token": False,
            "weighting": "one rank", "window_start": "cumulative ratio times /metrics verify calls at both ends",
            "accept_length": (new * calls_after - old * calls_before) / window if window > 0 else None,
            "ranks": [{"rank": 0, "before": old, "after": new, "window_tokens": None}]}


def beyond_draft_bound(requests: Sequence[RequestSpec], snapshot: ServerSnapshot) -> list[str]:
    """Accept lengths no verify step can give: one emits at most its accepted drafts + 1, i.e. num_draft_tokens
    (SGLang: draft_per_round = num_draft_tokens - 1, accept tokens per step = correct drafts + 1). Such a figure
    contradicts the server's own configuration: an error of measurement, never a result to gate."""
    bound = snapshot.num_draft_tokens
    if not bound:
        return []
    measured = with_spec(requests)
    verify = sum(r.spec_verify_ct or 0 for r in measured)
    ours = (sum(r.completion_tokens for r in measured) - len(measured)) / verify if verify else None
    named = [("per-request (completion tokens - first token) / verify steps", ours)] + [
        (f"/server_info avg_spec_accept_length of rank {rank}", value)
        for rank, value in enumerate(snapshot.rank_accept_lengths)]
    return [f"{name} {value:.3f} exceeds speculative_num_draft_tokens {bound} (the most one verify step emits)"
            for name, value in named if value is not None and value > bound + BOUND_SLACK]


BOUND_SLACK = 1e-9  # a ratio at the bound exactly is possible (every draft accepted); floats only


def _tokens_by_rank(requests: Sequence[RequestSpec], ranks: int) -> dict[int, int] | None:
    """Tokens each DP rank emitted from verify steps in the window (a request's first token comes from prefill)."""
    measured = with_spec(requests)
    if ranks == 1:
        return {0: sum(r.completion_tokens - 1 for r in measured)}
    if not measured or any(r.dp_rank is None for r in measured):
        return None
    totals: dict[int, int] = {}
    for r in measured:
        if r.dp_rank is not None:  # every one (checked above)
            totals[r.dp_rank] = totals.get(r.dp_rank, 0) + r.completion_tokens - 1
    return totals


def disagreements(requests: Sequence[RequestSpec], figures: Sequence[dict], tolerance: float) -> list[str]:
    """Messages for exact server-side figures further than ``tolerance`` (relative) from ours,
    each compared with the per-request figure computed the way that source counts."""
    measured = with_spec(requests)
    verify = sum(r.spec_verify_ct or 0 for r in measured)
    if not verify:
        return []
    tokens = sum(r.completion_tokens for r in measured)
    ours_by_definition = {True: tokens / verify, False: (tokens - len(measured)) / verify}
    messages = []
    for figure in figures:
        theirs, ours = figure["accept_length"], ours_by_definition[figure["counts_first_token"]]
        if not figure["exact_window"]:
            continue
        if theirs is None:
            messages.append(f"accept: {figure['source']} counted no verify step over the window, in which the "
                            f"responses report {verify}")
        elif abs(theirs - ours) > tolerance * ours:
            messages.append(f"accept: per-request accept length {ours:.3f} disagrees with {figure['source']} "
                            f"{theirs:.3f} (tolerance {tolerance:.0%}; both counted as {figure['source']} counts)")
    return messages


def request_record(request: RequestSpec) -> dict:
    record = asdict(request)
    record["histogram"] = list(request.histogram) if request.histogram is not None else None
    return record
