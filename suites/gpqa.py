"""GPQA with simple-evals semantics (openai/simple-evals gpqa_eval.py, as SGLang's run_eval adapts it).

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
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import openai

from suites.config import SuiteInputError
from suites.datasets import Dataset, load_csv
from suites.server import Server

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


@dataclass(frozen=True)
class Example:
    row: Mapping[str, str]
    permutation: tuple[int, ...]
    repeat: int  # which pass over the questions (0-based)

    @property
    def question_id(self) -> str:
        return hashlib.sha256(self.row["Question"].encode()).hexdigest()[:16]

    def prompt_and_answer(self) -> tuple[str, str]:
        """The user message and the correct letter, as simple-evals builds them."""
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
    max_tokens: int
    temperature: float
    extractor: str
    concurrency: int
    chat_template_kwargs: Mapping[str, Any] | None

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> "GpqaSettings":
        kwargs = options["chat_template_kwargs"]
        if kwargs is None and options["thinking"]:
            # Templates disagree on the key: DeepSeek reads `thinking`, Qwen3 `enable_thinking`.
            kwargs = {"thinking": True, "enable_thinking": True}
        return cls(max_tokens=options["max_tokens"], temperature=float(options["temperature"]),
                   extractor=options["extractor"], concurrency=options["concurrency"],
                   chat_template_kwargs=kwargs)


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
    response: str  # the full scored content (not the reasoning), to rescore with another extractor
    reasoning_chars: int  # length of the reasoning content (not scored)
    error: str | None


def load_gpqa(source: str | None, cache_dir: Path) -> Dataset:
    return load_csv(source or PUBLISHED_URL, cache_dir / "gpqa", REQUIRED_COLUMNS)


def build_examples(rows: Sequence[Mapping[str, str]], num_questions: int | None, repeats: int) -> list[Example]:
    rng = random.Random(0)
    chosen = list(rows)
    if num_questions:  # simple-evals samples whenever a number is given, even the full count
        if num_questions > len(chosen):
            raise SuiteInputError(f"gpqa.num_questions={num_questions}, but the dataset has {len(chosen)}")
        chosen = rng.sample(chosen, num_questions)
    examples = chosen * repeats
    return [Example(row=row, permutation=tuple(rng.sample(range(4), 4)), repeat=index // len(chosen))
            for index, row in enumerate(examples)]


def extract_answer(content: str, extractor: str) -> str | None:
    match = re.search(EXTRACTORS[extractor], content)
    return match.group(1) if match else None


def run_examples(server: Server, examples: Sequence[Example], settings: GpqaSettings) -> list[SampleResult]:
    # An eval, not a timing: retry transient errors as simple-evals does (the openai client's backoff).
    return server.ask_each(lambda client, example: ask(client, server.model, example, settings), examples,
                           settings.concurrency, max_retries=3, label="gpqa")


def ask(client: openai.OpenAI, model: str, example: Example, settings: GpqaSettings) -> SampleResult:
    prompt, correct = example.prompt_and_answer()
    extra_body = {"chat_template_kwargs": dict(settings.chat_template_kwargs)} if settings.chat_template_kwargs else None
    try:
        response = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], temperature=settings.temperature,
            max_tokens=settings.max_tokens, extra_body=extra_body)
    except openai.OpenAIError as err:
        return _scored(example, correct, content="", reasoning="", finish=None, tokens=None, error=str(err),
                       extractor=settings.extractor)
    choice = response.choices[0]
    reasoning = getattr(choice.message, "reasoning_content", None) or ""  # SGLang's --reasoning-parser field
    tokens = response.usage.completion_tokens if response.usage else None
    return _scored(example, correct, content=choice.message.content or "", reasoning=reasoning,
                   finish=choice.finish_reason, tokens=tokens, error=None, extractor=settings.extractor)


def _scored(example: Example, correct: str, *, content: str, reasoning: str, finish: str | None,
            tokens: int | None, error: str | None, extractor: str) -> SampleResult:
    extracted = extract_answer(content, extractor) if content else None
    return SampleResult(
        question_id=example.question_id, repeat=example.repeat, permutation=example.permutation,
        correct_answer=correct, extracted_answer=extracted, score=1.0 if extracted == correct else 0.0,
        finish_reason=finish, completion_tokens=tokens, response=content,
        reasoning_chars=len(reasoning), error=error)


def summarize(results: Sequence[SampleResult], num_questions: int, repeats: int) -> tuple[dict, dict]:
    """(metrics, summary record). gpqa_stderr is clustered by question (``clustered_stderr``)."""
    scores = [r.score for r in results]
    n = len(scores)
    accuracy = statistics.fmean(scores)
    stderr = clustered_stderr(results)
    metrics = {"gpqa_accuracy": accuracy, "gpqa_stderr": stderr, "gpqa_num_questions": num_questions,
               "gpqa_repeats": repeats}
    summary = {
        "samples": n,
        "score_std": statistics.pstdev(scores),  # what simple-evals prints as score:std (not an error bar)
        "stderr_clustered_by_question": stderr,
        # What treating every sample as independent would say: too small when repeats > 1 (shown for comparison).
        "stderr_samples_independent": statistics.stdev(scores) / math.sqrt(n) if n > 1 else float("nan"),
        "unanswered": sum(r.extracted_answer is None for r in results),
        "errors": sum(r.error is not None for r in results),
        "truncated": sum(r.finish_reason == "length" for r in results),
    }
    return metrics, summary


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
