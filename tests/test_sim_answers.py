"""GPQA answers: a GPQA-format prompt is looked up in DSPARK_SIM_GPQA_PATH and answered right with
probability DSPARK_SIM_GPQA_ACCURACY, fixed per question and seed, ending in ``Answer: X``."""

from __future__ import annotations

import csv
import random
import re

import openai
import pytest

from tests.sim_fixtures import sim  # noqa: F401 (sim is a fixture)

TEMPLATE = ("Answer the following multiple choice question. The last line of your response should be of the "
            "following format: 'Answer: $LETTER' (without quotes) where LETTER is one of ABCD. Think step by step "
            "before answering.\n\n{question}\n\nA) {A}\nB) {B}\nC) {C}\nD) {D}\n")
SGLANG_PATTERN = re.compile(r"(?i)Answer\s*:\s*([A-D])")
QUESTIONS = 40
INSTANT = {"DSPARK_SIM_DECODE_STEP_MS": "0"}  # replies are long; their timing is not under test


@pytest.fixture
def dataset(tmp_path):
    """A gpqa_diamond-shaped CSV and the prompts simple-evals would send for it (options shuffled)."""
    path = tmp_path / "gpqa_diamond.csv"
    rng = random.Random(0)
    rows, prompts = [], []
    for index in range(QUESTIONS):
        row = {"Question": f"In experiment {index}, which quantity is conserved\nwhen the field {index} is off?",
               "Correct Answer": f"energy {index}", "Incorrect Answer 1": f"momentum {index}",
               "Incorrect Answer 2": f"charge density {index}", "Incorrect Answer 3": f"entropy, {index} units"}
        rows.append(row)
        options = [row["Correct Answer"], row["Incorrect Answer 1"], row["Incorrect Answer 2"],
                   row["Incorrect Answer 3"]]
        order = rng.sample(range(4), 4)
        letters = dict(zip("ABCD", (options[i] for i in order), strict=False))
        prompts.append((TEMPLATE.format(question=row["Question"], **letters), "ABCD"[order.index(0)]))
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path, prompts


def answers(server, prompts, temperature=0.0, **extra) -> list[str | None]:
    client = openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0)
    found = []
    for prompt, _ in prompts:
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}],
                                               temperature=temperature, max_tokens=4000, extra_body=extra)
        content = reply.choices[0].message.content
        match = SGLANG_PATTERN.search(content)
        assert content.strip().splitlines()[-1] == f"Answer: {match.group(1)}"
        found.append(match.group(1))
    return found


@pytest.mark.parametrize("accuracy, right", [pytest.param("1", QUESTIONS, id="always-right"),
                                             pytest.param("0", 0, id="always-wrong")])
def test_accuracy_extremes(sim, dataset, accuracy, right):
    path, prompts = dataset
    server = sim([], env={**INSTANT, "DSPARK_SIM_GPQA_PATH": str(path), "DSPARK_SIM_GPQA_ACCURACY": accuracy})
    letters = answers(server, prompts)
    assert sum(letter == truth for letter, (_, truth) in zip(letters, prompts, strict=False)) == right


def test_right_or_wrong_is_fixed_per_question_whatever_the_sampling(sim, dataset):
    path, prompts = dataset
    server = sim([], env={**INSTANT, "DSPARK_SIM_GPQA_PATH": str(path), "DSPARK_SIM_GPQA_ACCURACY": "0.5"})
    greedy = [letter == truth for letter, (_, truth) in zip(answers(server, prompts), prompts, strict=False)]
    sampled = [letter == truth for letter, (_, truth) in zip(answers(server, prompts, 0.8), prompts, strict=False)]
    assert greedy == sampled
    assert 8 <= sum(greedy) <= 32  # about half of 40


def test_thinking_keeps_the_answer_in_content(sim, dataset):
    path, prompts = dataset
    server = sim(["--reasoning-parser", "deepseek-r1"],
                 env={**INSTANT, "DSPARK_SIM_GPQA_PATH": str(path), "DSPARK_SIM_GPQA_ACCURACY": "1"})
    letters = answers(server, prompts[:5], chat_template_kwargs={"thinking": True})
    assert letters == [truth for _, truth in prompts[:5]]


def test_unknown_question_still_ends_with_an_answer_line(sim):
    server = sim([], env=INSTANT)
    prompt = TEMPLATE.format(question="Not in any dataset?", A="yes", B="no", C="maybe", D="later")
    assert answers(server, [(prompt, "A")])[0] in "ABCD"
