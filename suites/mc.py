"""Multiple choice by log-likelihood, as lm-eval's ``loglikelihood`` requests score it, through SGLang's /generate.

Per item: a context ("The capital of France is") and four continuations, each with its leading space (" Paris"),
one right. The model's score of a continuation is the sum of its tokens' log-probabilities given the context; the
item is right when the right continuation scores highest (lm-eval's ``acc``; ties go to the first option, as
numpy's argmax). ``acc_norm`` (each sum divided by the continuation's length in bytes) goes in the summary.

One /generate per item, SGLang's batch form: ``text`` = [context, context + option 1, ..., context + option 4],
``max_new_tokens`` 0 (SGLang's prefill-only path), ``return_logprob`` with ``logprob_start_len`` 0, so each reply's
``meta_info.input_token_logprobs`` holds every prompt token as ``[logprob, token id, text|None]`` (the first
token's logprob is null: nothing precedes it). The boundary between context and continuation is found from the
server's own tokenisation, never guessed from text:

- the context's token count is its reply's ``prompt_tokens``, and its token ids are read from its logprobs;
- a continuation's tokens are those of context + option past the context's: when that tokenisation starts with
  the context's ids (a BPE tokeniser keeps them when the continuation begins with a space), exactly the
  continuation's tokens are summed;
- when it does not (a merge across the boundary, e.g. a context ending in a space), the sum starts at the first
  token that differs from the context's, so the token spanning the boundary counts as the continuation's; the item
  records ``boundary_merged`` and the summary counts them (lm-eval avoids it by encoding the two parts apart, which
  needs the tokeniser client-side; SGLang's server only tokenises whole texts).

An item whose replies lack logprobs, or whose continuation has no token of its own, is an error (scored wrong and
failing the suite's test), never a silent guess.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import requests
from dspark_ci.suites.config import SuiteInputError
from dspark_ci.suites.server import Server

BUILTIN = Path(__file__).with_name("data") / "mc_countries.json"


@dataclass(frozen=True)
class McItem:
    id: str
    category: str
    context: str
    options: tuple[str, ...]  # continuations, each with its leading space
    answer: int  # index of the right option


@dataclass(frozen=True)
class McData:
    items: tuple[McItem, ...]
    about: Mapping[str, Any]  # the file's own header (source, license, generator)
    path: str
    sha256: str

    def describe(self) -> dict:
        return {"path": self.path, "sha256": self.sha256, "source": self.about.get("source")}


def load_items(source: str | None) -> McData:
    """The items of ``source`` (a file in mc_countries.json's format; None: the built-in one)."""
    path = Path(source).expanduser() if source else BUILTIN
    try:
        raw = path.read_bytes()
        data = json.loads(raw)
        items = tuple(McItem(str(i["id"]), str(i["category"]), str(i["context"]), tuple(map(str, i["options"])),
                             int(i["answer"])) for i in data["items"])
    except OSError as err:
        raise SuiteInputError(f"mc.dataset {path}: cannot read it ({err.strerror})") from None
    except (ValueError, KeyError, TypeError) as err:
        raise SuiteInputError(f"mc.dataset {path}: not an mc_countries.json-style file ({err!r})") from None
    bad = next((i for i in items if not 0 <= i.answer < len(i.options) or len(i.options) < 2), None)
    if bad is not None:
        raise SuiteInputError(f"mc.dataset {path}: item {bad.id} has answer {bad.answer} of {len(bad.options)} options")
    return McData(items, data.get("about") or {}, str(path), hashlib.sha256(raw).hexdigest())


def select(items: Sequence[McItem], categories: str, num_items: int | None) -> list[McItem]:
    """The items of ``categories`` (comma-separated; "" = all), then a seeded subsample of ``num_items``."""
    wanted = [c.strip() for c in categories.split(",") if c.strip()]
    known = sorted({i.category for i in items})
    unknown = [c for c in wanted if c not in known]
    if unknown:
        raise SuiteInputError(f"mc.categories names {', '.join(unknown)}, not in the data (it has {', '.join(known)})")
    chosen = [i for i in items if not wanted or i.category in wanted]
    if num_items:
        if num_items > len(chosen):
            raise SuiteInputError(f"mc.num_items={num_items}, but the data has {len(chosen)} such items")
        chosen = random.Random(0).sample(chosen, num_items)
    return chosen


@dataclass(frozen=True)
class Continuation:
    """One option's score: the sum of its tokens' logprobs and how many tokens that is."""

    logprob: float
    tokens: int
    boundary_merged: bool  # context + option did not start with the context's tokens (see the module's doc)


class ScoringError(ValueError):
    """A reply that cannot be scored (no logprobs, no token of the continuation's own)."""


def continuation_score(context_ids: Sequence[int], full: Sequence[Sequence[Any]]) -> Continuation:
    """Score one continuation from ``full``, the ``input_token_logprobs`` of context + continuation (logprob_start_len
    0), given the context's own token ids: the tokens past the longest common prefix with the context's."""
    ids = [int(triple[1]) for triple in full]
    common = 0
    while common < min(len(ids), len(context_ids)) and ids[common] == context_ids[common]:
        common += 1
    if common == 0:
        raise ScoringError("the continuation's tokens do not start with the context's first token")
    if common >= len(ids):
        raise ScoringError("context + continuation has no token past the context's")
    logprobs = [triple[0] for triple in full[common:]]
    if any(lp is None for lp in logprobs):
        raise ScoringError("a continuation token has no logprob")
    return Continuation(float(sum(logprobs)), len(logprobs), common < len(context_ids))


@dataclass(frozen=True)
class ItemResult:
    id: str
    category: str
    answer: int
    chosen: int | None  # the option scored highest (None: not scored)
    correct: bool
    logprobs: tuple[float, ...]  # each option's summed logprob
    tokens: tuple[int, ...]  # each option's token count
    context_tokens: int | None
    boundary_merged: int  # options whose tokenisation merged across the boundary
    error: str | None = None
    chosen_norm: int | None = None  # lm-eval's acc_norm choice: logprob per byte of the continuation


def request_body(item: McItem) -> dict:
    return {"text": [item.context] + [item.context + option for option in item.options],
            "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
            "return_logprob": True, "logprob_start_len": 0}


def score_replies(item: McItem, replies: Sequence[Mapping[str, Any]]) -> ItemResult:
    """An item scored from its /generate replies (context first, then one per option)."""
    if len(replies) != 1 + len(item.options):
        raise ScoringError(f"{len(replies)} replies to {1 + len(item.options)} texts")
    context_meta = replies[0]["meta_info"]
    context = context_meta.get("input_token_logprobs") or []
    context_tokens = int(context_meta["prompt_tokens"])
    if len(context) != context_tokens:
        raise ScoringError(f"the context's reply has {len(context)} token logprobs for {context_tokens} prompt tokens")
    scores = [continuation_score([int(t[1]) for t in context], reply["meta_info"].get("input_token_logprobs") or [])
              for reply in replies[1:]]
    logprobs = tuple(s.logprob for s in scores)
    chosen = max(range(len(logprobs)), key=lambda k: (logprobs[k], -k))
    per_byte = [lp / len(option.encode()) for lp, option in zip(logprobs, item.options, strict=False)]
    chosen_norm = max(range(len(per_byte)), key=lambda k: (per_byte[k], -k))
    return ItemResult(item.id, item.category, item.answer, chosen, chosen == item.answer, logprobs,
                      tuple(s.tokens for s in scores), context_tokens, sum(s.boundary_merged for s in scores),
                      chosen_norm=chosen_norm)


def ask(session: requests.Session, server: Server, item: McItem) -> ItemResult:
    try:
        response = session.post(f"{server.base_url}/generate", json=request_body(item),
                                headers={"Authorization": f"Bearer {server.api_key}"}, timeout=server.request_timeout)
        response.raise_for_status()
        return score_replies(item, response.json())
    except (requests.RequestException, ValueError, KeyError, TypeError) as err:
        return ItemResult(item.id, item.category, item.answer, None, False, (), (), None, 0,
                          error=f"{type(err).__name__}: {err}"[:300])


def run_items(server: Server, items: Sequence[McItem], concurrency: int) -> tuple[list[ItemResult], bool]:
    """(results in item order, interrupted), ``concurrency`` items in flight; progress as "mc DONE/TOTAL"."""
    session = requests.Session()
    session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=concurrency))
    tally = {"done": 0, "right": 0}

    def scored(result: ItemResult) -> str:
        tally["done"] += 1
        tally["right"] += result.correct
        return f"accuracy {tally['right'] / tally['done']:.1%}"

    try:
        return server.ask_until_interrupted(lambda _client, item: ask(session, server, item), items, concurrency,
                                            label="mc", on_answer=scored)
    finally:
        session.close()


def summarize(results: Sequence[ItemResult]) -> tuple[dict, dict]:
    """(metrics, summary record). The item is the unit: accuracy's standard error is the binomial √(p(1−p)/n)."""
    n = len(results)
    right = sum(r.correct for r in results)
    accuracy = right / n if n else float("nan")
    per_category: dict[str, list[int]] = {}
    for r in results:
        tally = per_category.setdefault(r.category, [0, 0])
        tally[0] += int(r.correct)
        tally[1] += 1
    metrics = {"mc_accuracy": accuracy, "mc_stderr": math.sqrt(accuracy * (1 - accuracy) / n) if n else float("nan"),
               "mc_num_items": n}
    summary = {
        "items": n, "accuracy": accuracy if n else None,
        "accuracy_norm": sum(r.chosen_norm == r.answer for r in results) / n if n else None,
        "chance": statistics_chance(results),
        "per_category": {c: {"right": t[0], "items": t[1], "accuracy": t[0] / t[1]} for c, t in
                         sorted(per_category.items())},
        "per_item": {r.id: [int(r.correct), 1] for r in results},  # what the paired gate reads (baseline record)
        "errors": sum(r.error is not None for r in results),
        "boundary_merged": sum(r.boundary_merged for r in results),
        "chosen_position": dict(sorted(Counter(r.chosen for r in results if r.chosen is not None).items())),
    }
    return metrics, summary


def statistics_chance(results: Sequence[ItemResult]) -> float | None:
    """A guesser's expected accuracy over these items (1 / options, averaged)."""
    counts = [len(r.logprobs) for r in results if r.logprobs]
    return sum(1 / k for k in counts) / len(counts) if counts else None


def item_record(result: ItemResult) -> dict:
    record = asdict(result)
    record["logprobs"], record["tokens"] = list(result.logprobs), list(result.tokens)
    return record
