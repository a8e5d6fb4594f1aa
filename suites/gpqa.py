"""GPQA as each scorer SGLang users compare with asks and scores it (``gpqa.scorer``).

- ``sglang`` (default): SGLang's ``run_eval`` (simple-evals adapted in ``sglang/test/simple_eval_gpqa.py``):
  simple-evals' prompt and sampling, SGLang's answer regex (first match), mean of 0/1 scores.
- ``simple-evals``: openai/simple-evals ``gpqa_eval.py``: the same prompt and sampling, openai's regex.
- ``sgl-eval``: ``sgl-eval run gpqa``: NeMo-Skills' question order, prompt, extraction and aggregation,
  through the sgl-eval package itself (``suites/sgl_eval_scorer.py``).

For the first two, simple-evals semantics (openai/simple-evals gpqa_eval.py, as SGLang's run_eval adapts it).

Kept exactly: one ``random.Random(0)``; optional subsample ``rng.sample(rows, n)``; ``rows * repeats``;
then one ``rng.sample(range(4), 4)`` permutation per example, in order; the prompt text; the first
match of the answer regex; score 0/1. Beyond simple-evals: per-sample records (the full response, the
reasoning's length and the question id, so any run can be rescored by another extractor), reasoning
content kept apart from the answer (only the content is scored), and a true standard error next to the
per-question standard deviation that simple-evals reports as ``score:std``. The standard error treats
each question as one unit: repeats of a question are correlated (same question, often the same answer),
so it is the standard error over questions of each question's mean score (with one repeat, the usual
sd/√n). simple-evals refuses a
subsample together with repeats; here the two combine (sample first, then repeat), which is the same
sequence of random draws whenever either is left at its default.

Every scorer: each sample is streamed to a JSONL file as it is scored (an interrupted run keeps them), the
requests done and the running accuracy go to --dspark-progress (``dspark_ci.suites.progress_file``), and the full response
is recorded (``response``), so ``dspark-ci rescore`` can score it again with another scorer. On top of the
question-clustered standard error, the summary carries the scorer's aggregate (pass@k, majority@k with repeats).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import statistics
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import openai
from dspark_ci.suites import sgl_eval_scorer
from dspark_ci.suites.config import SuiteInputError
from dspark_ci.suites.datasets import Dataset, load_csv
from dspark_ci.suites.server import Server

PUBLISHED_URL = "https://openaipublic.blob.core.windows.net/simple-evals/gpqa_diamond.csv"
REQUIRED_COLUMNS = ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
                    "Incorrect Answer 3")

# simple_eval_common.QUERY_TEMPLATE_MULTICHOICE, character for character.
QUERY_TEMPLATE = """
Answer the following multiple choice question. The last line of your response should be of the following format: 'Answer: $LETTER' (without quotes) where LETTER is one of ABCD. Think step by step before answering.

{Question}

A) {A}
B) {B}
C) {C}
D) {D}
""".strip()

# Which answer regex: SGLang's simple_eval_common, or openai/simple-evals' common.py.
EXTRACTORS = {
    "sglang": r"(?i)Answer\s*:\s*([A-D])",
    "openai": r"(?i)Answer[ \t]*:[ \t]*\$?([A-D])\$?",
}
SCORERS = ("simple-evals", "sglang", "sgl-eval")
# The regex of each regex scorer (sgl-eval's extraction is NeMo-Skills' eval_mcq, from the package).
SCORER_EXTRACTOR = {"sglang": "sglang", "simple-evals": "openai"}
# What a reply is held to when the model answers at chance (SGLang's `regex` sampling parameter): what every
# regex scorer's extraction reads.
AT_CHANCE_REPLY = "Answer: [ABCD]"


@dataclass(frozen=True)
class Example:
    row: Mapping[str, str]
    permutation: tuple[int, ...]  # choice i shows [correct, incorrect 1..3][permutation[i]]
    repeat: int  # which pass over the questions (0-based)
    ns_entry: Mapping[str, Any] | None = None  # sgl-eval: the NeMo-Skills entry (problem, expected_answer)

    @property
    def question_id(self) -> str:
        return hashlib.sha256(self.row["Question"].encode()).hexdigest()[:16]

    def prompt_and_answer(self) -> tuple[str, str]:
        """The user message and the correct letter, as the scorer builds them."""
        if self.ns_entry is not None:
            return sgl_eval_scorer.prompt(self.ns_entry["problem"]), self.ns_entry["expected_answer"]
        row = self.row
        choices = [row["Correct Answer"], row["Incorrect Answer 1"], row["Incorrect Answer 2"],
                   row["Incorrect Answer 3"]]
        choices = [choices[i] for i in self.permutation]
        correct_letter = "ABCD"[choices.index(row["Correct Answer"])]
        prompt = QUERY_TEMPLATE.format(A=choices[0], B=choices[1], C=choices[2], D=choices[3],
                                       Question=row["Question"])
        return prompt, correct_letter


@dataclass(frozen=True)
class GpqaSettings:
    max_tokens: int | None  # None: none sent (sgl-eval's default), the server's context decides
    temperature: float
    scorer: str
    concurrency: int
    chat_template_kwargs: Mapping[str, Any] | None
    answers_at_chance: bool = False

    @property
    def extractor(self) -> str | None:
        """The regex scorers' extractor name (None for sgl-eval's)."""
        return SCORER_EXTRACTOR.get(self.scorer)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> GpqaSettings:
        kwargs = options["chat_template_kwargs"]
        if kwargs is None and options["thinking"]:
            # Templates disagree on the key: DeepSeek reads `thinking`, Qwen3 `enable_thinking`.
            kwargs = {"thinking": True, "enable_thinking": True}
        return cls(max_tokens=options["max_tokens"], temperature=float(options["temperature"]),
                   scorer=resolve_scorer(options), concurrency=options["concurrency"],
                   chat_template_kwargs=kwargs, answers_at_chance=bool(options.get("answers_at_chance")))


def resolve_scorer(options: Mapping[str, Any]) -> str:
    """``scorer``; the older ``extractor: openai`` still means simple-evals when the scorer is left default."""
    scorer = options["scorer"]
    if scorer == "sglang" and options.get("extractor") == "openai":
        return "simple-evals"
    return scorer


@dataclass(frozen=True)
class SampleResult:
    question_id: str
    repeat: int
    permutation: tuple[int, ...]
    correct_answer: str  # letter
    extracted_answer: str | None
    score: float  # 1.0 or 0.0
    finish_reason: str | None
    completion_tokens: int | None
    response: str  # the full scored content (not the reasoning): what rescoring reads
    reasoning_chars: int  # length of the reasoning content (not scored)
    error: str | None
    scorer: str = "sglang"  # whose prompt was sent and whose extraction scored it


def load_gpqa(source: str | None, cache_dir: Path) -> Dataset:
    return load_csv(source or PUBLISHED_URL, cache_dir / "gpqa", REQUIRED_COLUMNS)


def build_examples(rows: Sequence[Mapping[str, str]], num_questions: int | None, repeats: int,
                   scorer: str = "sglang") -> list[Example]:
    if scorer == "sgl-eval":
        return build_sgl_eval_examples(rows, num_questions, repeats)
    rng = random.Random(0)
    chosen = list(rows)
    if num_questions:  # simple-evals samples whenever a number is given, even the full count
        if num_questions > len(chosen):
            raise SuiteInputError(f"gpqa.num_questions={num_questions}, but the dataset has {len(chosen)}")
        chosen = rng.sample(chosen, num_questions)
    examples = chosen * repeats
    return [Example(row=row, permutation=tuple(rng.sample(range(4), 4)), repeat=index // len(chosen))
            for index, row in enumerate(examples)]


def build_sgl_eval_examples(rows: Sequence[Mapping[str, str]], num_questions: int | None,
                            repeats: int) -> list[Example]:
    """sgl-eval's questions: every row prepared in order, then the first ``num_questions`` (its
    ``--num-examples``); each repeat asks the same prompt again (no new shuffle)."""
    if num_questions and num_questions > len(rows):
        raise SuiteInputError(f"gpqa.num_questions={num_questions}, but the dataset has {len(rows)}")
    entries = sgl_eval_scorer.entries(rows)
    chosen = list(zip(rows, entries, strict=False))[:num_questions or len(rows)]
    return [Example(row=row, permutation=_shown_order(row, entry), repeat=repeat, ns_entry=entry)
            for repeat in range(repeats) for row, entry in chosen]


def _shown_order(row: Mapping[str, str], entry: Mapping[str, Any]) -> tuple[int, ...]:
    originals = [" ".join((row[key] or "").split()) for key in REQUIRED_COLUMNS[1:]]
    shown = [" ".join(str(entry[letter]).split()) for letter in "ABCD"]
    return tuple(originals.index(text) if text in originals else -1 for text in shown)


def extract_answer(content: str, extractor: str) -> str | None:
    match = re.search(EXTRACTORS[extractor], content)
    return match.group(1) if match else None


def score_content(content: str, correct: str, scorer: str) -> tuple[float, str | None]:
    """(score, extracted letter) of one response by ``scorer``'s extraction."""
    if scorer == "sgl-eval":
        return sgl_eval_scorer.score(content, correct)
    extracted = extract_answer(content, SCORER_EXTRACTOR[scorer]) if content else None
    return (1.0 if extracted == correct else 0.0), extracted


def run_examples(server: Server, examples: Sequence[Example], settings: GpqaSettings,
                 on_result: Callable[[SampleResult], None] = lambda _r: None) -> tuple[list[SampleResult], bool]:
    """(results in example order, interrupted). ``on_result`` sees each sample as it is scored. Ctrl-C stops
    at once: queued examples are dropped, in-flight requests cut (their client closed), and the samples
    scored so far come back with ``interrupted`` True."""
    # An eval, not a timing: retry transient errors as simple-evals does (the openai client's backoff).
    tally = {"done": 0, "correct": 0.0}

    def scored(result: SampleResult) -> str:
        on_result(result)
        tally["done"] += 1
        tally["correct"] += result.score
        return f"accuracy {tally['correct'] / tally['done']:.1%}"  # the progress line's running figure

    return server.ask_until_interrupted(lambda client, example: ask(client, server.model, example, settings),
                                        examples, settings.concurrency, max_retries=3, label="gpqa",
                                        on_answer=scored)


def ask(client: openai.OpenAI, model: str, example: Example, settings: GpqaSettings) -> SampleResult:
    prompt, correct = example.prompt_and_answer()
    extra_body: dict[str, Any] = sgl_eval_scorer.sampling() if settings.scorer == "sgl-eval" else {}
    top_p = extra_body.pop("top_p", openai.NOT_GIVEN)
    if settings.chat_template_kwargs:
        extra_body["chat_template_kwargs"] = dict(settings.chat_template_kwargs)
    if settings.answers_at_chance:
        extra_body["regex"] = AT_CHANCE_REPLY
    limit: dict[str, Any] = {} if settings.max_tokens is None else {"max_tokens": settings.max_tokens}  # none: unsent
    try:
        response = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], temperature=settings.temperature,
            top_p=top_p, extra_body=extra_body or None, **limit)
    except openai.OpenAIError as err:
        return _scored(example, correct, content="", reasoning="", finish=None, tokens=None, error=str(err),
                       scorer=settings.scorer)
    choice = response.choices[0]
    reasoning = getattr(choice.message, "reasoning_content", None) or ""  # SGLang's --reasoning-parser field
    tokens = response.usage.completion_tokens if response.usage else None
    return _scored(example, correct, content=choice.message.content or "", reasoning=reasoning,
                   finish=choice.finish_reason, tokens=tokens, error=None, scorer=settings.scorer)


def _scored(example: Example, correct: str, *, content: str, reasoning: str, finish: str | None,
            tokens: int | None, error: str | None, scorer: str) -> SampleResult:
    score, extracted = score_content(content, correct, scorer) if content else (0.0, None)
    return SampleResult(
        question_id=example.question_id, repeat=example.repeat, permutation=example.permutation,
        correct_answer=correct, extracted_answer=extracted, score=score,
        finish_reason=finish, completion_tokens=tokens, response=content,
        reasoning_chars=len(reasoning), error=error, scorer=scorer)


def rescored(result: SampleResult, scorer: str) -> SampleResult:
    """The same response scored by ``scorer``'s extraction (the prompt stays the one that was sent)."""
    score, extracted = (score_content(result.response, result.correct_answer, scorer) if result.response
                        else (0.0, None))
    return SampleResult(**{**asdict(result), "score": score, "extracted_answer": extracted, "scorer": scorer})


class SampleStream:
    """Appends each scored sample to a JSONL file as it lands (flushed per line, so any ending keeps it)."""

    def __init__(self, path: Path | None, planned: int = 0):
        self.path, self.planned = path, planned
        self._lock = threading.Lock()
        self._handle = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = path.open("w", encoding="utf-8")

    def __call__(self, result: SampleResult) -> None:
        if self._handle is None:
            return
        with self._lock:
            line = {**sample_record(result), "planned_samples": self.planned}
            self._handle.write(json.dumps(line, ensure_ascii=False) + "\n")
            self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()


def summarize(results: Sequence[SampleResult], num_questions: int, repeats: int,
              scorer: str = "sglang") -> tuple[dict, dict]:
    """(metrics, summary record). gpqa_accuracy is the scorer's own headline (pass@1, averaged over the
    repeats); gpqa_stderr is clustered by question (``clustered_stderr``), whatever the scorer."""
    scores = [r.score for r in results]
    n = len(scores)
    aggregate = aggregate_of(results, repeats, scorer)
    accuracy = aggregate["pass@1"] if n else float("nan")
    stderr = clustered_stderr(results)
    unanswered = sum(r.extracted_answer is None for r in results)
    metrics = {"gpqa_accuracy": accuracy, "gpqa_stderr": stderr, "gpqa_num_questions": num_questions,
               "gpqa_repeats": repeats, "gpqa_no_answer": unanswered / n if n else float("nan")}
    summary = {
        "scorer": scorer,
        "aggregate": aggregate,
        "samples": n,
        "score_std": statistics.pstdev(scores) if n else None,  # simple-evals' score:std (not an error bar)
        "stderr_clustered_by_question": stderr,
        # What treating every sample as independent would say: too small when repeats > 1 (shown for comparison).
        "stderr_samples_independent": statistics.stdev(scores) / math.sqrt(n) if n > 1 else float("nan"),
        "unanswered": unanswered,
        "errors": sum(r.error is not None for r in results),
        "truncated": sum(r.finish_reason == "length" for r in results),
        "per_question": per_question(results),
    }
    return metrics, summary


def per_question(results: Sequence[SampleResult]) -> dict[str, list[int]]:
    """question id -> [right, asked]: what a paired comparison over questions reads (baseline record keeps it)."""
    outcomes: dict[str, list[int]] = {}
    for r in results:
        tally = outcomes.setdefault(r.question_id, [0, 0])
        tally[0] += int(r.score >= 1.0)
        tally[1] += 1
    return outcomes


def aggregate_of(results: Sequence[SampleResult], repeats: int, scorer: str) -> dict[str, float]:
    """The scorer's aggregate, with one set of keys: pass@1 (averaged over the k repeats), and with k > 1
    pass@1_sem and pass@1_std (across runs: the sd of the k per-repeat accuracies, its error over sqrt(k)),
    pass@k, majority@k; no_answer (the fraction of samples without an extracted letter). sgl-eval's comes
    from the package; simple-evals and SGLang report only the mean, so theirs uses the same definitions."""
    by_question: dict[str, list[SampleResult]] = {}
    for r in sorted(results, key=lambda r: r.repeat):
        by_question.setdefault(r.question_id, []).append(r)
    if not by_question:
        return {}
    if scorer == "sgl-eval":
        raw = sgl_eval_scorer.aggregate(
            [[(r.score, r.extracted_answer, r.correct_answer) for r in group] for group in by_question.values()],
            repeats)
        out = {"pass@1": float(raw["score"])}  # their headline: pass@1[avg-of-k] (the plain mean when k = 1)
        keys = ["no_answer"] + (["pass@1_std", "pass@1_sem", f"pass@{repeats}", f"majority@{repeats}"]
                                if repeats > 1 else [])
        return out | {key: float(raw[key]) for key in keys if key in raw}
    out = {"pass@1": statistics.fmean(r.score for r in results),
           "no_answer": statistics.fmean(r.extracted_answer is None for r in results)}
    if repeats > 1:
        runs = [[r.score for r in results if r.repeat == k] for k in range(repeats)]
        run_means = [statistics.fmean(run) for run in runs if run]
        if len(run_means) > 1:
            out["pass@1_std"] = statistics.stdev(run_means)
            out["pass@1_sem"] = out["pass@1_std"] / math.sqrt(len(run_means))
        out[f"pass@{repeats}"] = statistics.fmean(max(r.score for r in g) for g in by_question.values())
        out[f"majority@{repeats}"] = statistics.fmean(_majority_score(g) for g in by_question.values())
    return out


def _majority_score(group: Sequence[SampleResult]) -> float:
    """The most common extracted letter's score (no letter: 0; a tie: the mean over the tied letters)."""
    answers = Counter((r.extracted_answer, r.score) for r in group if r.extracted_answer is not None)
    if not answers:
        return 0.0
    top = max(answers.values())
    tied = [score for (_letter, score), count in answers.items() if count == top]
    return statistics.fmean(tied)


def clustered_stderr(results: Sequence[SampleResult]) -> float:
    """Standard error of the accuracy with questions as the unit: sd over questions of each question's mean
    score, divided by √(number of questions). NaN with fewer than two questions."""
    per_question: dict[str, list[float]] = {}
    for r in results:
        per_question.setdefault(r.question_id, []).append(r.score)
    means = [statistics.fmean(scores) for scores in per_question.values()]
    return statistics.stdev(means) / math.sqrt(len(means)) if len(means) > 1 else float("nan")


def sample_record(result: SampleResult) -> dict:
    record = asdict(result)
    record["permutation"] = list(result.permutation)
    return record


def sample_from_record(record: Mapping[str, Any]) -> SampleResult:
    """A SampleResult read back from a record (a suite output or the streamed JSONL)."""
    known = {f.name for f in fields(SampleResult)}
    data = {k: v for k, v in record.items() if k in known}
    data.setdefault("response", "")  # recorded before full responses were kept (only content_tail): not rescorable
    data["permutation"] = tuple(data.get("permutation") or ())
    return SampleResult(**data)
