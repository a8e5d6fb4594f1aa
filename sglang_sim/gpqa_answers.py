"""Recognising GPQA prompts and knowing their answers.

Two templates, both an instruction line starting "Answer the following multiple choice question.", a blank
line, the question, a blank line, then ``A) ..`` to ``D) ..``: simple-evals' (``sglang/test/simple_eval_common.py``
QUERY_TEMPLATE_MULTICHOICE, as SGLang's run_eval sends it) and NeMo-Skills' ``mcq-4choices`` (as sgl-eval
sends it). The dataset is simple-evals'
``gpqa_diamond.csv`` (columns ``Question``, ``Correct Answer``, ``Incorrect Answer 1..3``).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

INSTRUCTION = "Answer the following multiple choice question."
LETTERS = ("A", "B", "C", "D")
_OPTIONS = re.compile(r"\n[ \t]*A\) (?P<A>.*?)\n[ \t]*B\) (?P<B>.*?)\n[ \t]*C\) (?P<C>.*?)\n[ \t]*D\) (?P<D>.*?)\s*\Z",
                      re.DOTALL)


class GpqaDatasetError(ValueError):
    """The CSV at DSPARK_SIM_GPQA_PATH cannot be used."""


@dataclass(frozen=True)
class GpqaPrompt:
    question: str
    options: Mapping[str, str]  # letter -> option text


@dataclass(frozen=True)
class GpqaAnswerKey:
    """Question text -> its correct answer text, from the dataset."""

    correct_by_question: Mapping[str, str]

    @classmethod
    def empty(cls) -> GpqaAnswerKey:
        return cls(MappingProxyType({}))

    @classmethod
    def load(cls, path: Path | None) -> GpqaAnswerKey:
        if path is None:
            return cls.empty()
        try:
            with path.open(newline="", encoding="utf-8") as handle:
                rows = list(csv.DictReader(handle))
        except OSError as err:
            raise GpqaDatasetError(f"{path}: cannot read ({err.strerror})") from None
        if rows and not {"Question", "Correct Answer"} <= set(rows[0]):
            raise GpqaDatasetError(f"{path}:1: expected gpqa_diamond columns 'Question' and 'Correct Answer'")
        return cls(MappingProxyType({_normal(row["Question"]): row["Correct Answer"].strip() for row in rows}))

    def correct_letter(self, prompt: GpqaPrompt) -> str | None:
        """The letter whose option holds the dataset's correct answer (None: unknown question)."""
        correct = self.correct_by_question.get(_normal(prompt.question))
        if correct is None:
            return None
        return next((letter for letter, text in prompt.options.items() if _normal(text) == _normal(correct)), None)


def _normal(text: str) -> str:
    return " ".join(text.split())


def parse_gpqa_prompt(text: str) -> GpqaPrompt | None:
    """The question and options of a GPQA-format prompt, or None for any other prompt."""
    start = text.find(INSTRUCTION)
    if start < 0:
        return None
    body_start = text.find("\n\n", start)  # the instruction ends at the first blank line
    body = text[body_start:] if body_start >= 0 else text[start + len(INSTRUCTION):]
    match = _OPTIONS.search(body)
    if match is None:
        return None
    question = body[:match.start()].strip()
    if not question:
        return None
    return GpqaPrompt(question, MappingProxyType({letter: match.group(letter).strip() for letter in LETTERS}))
