"""The front end's tokenizer vocabulary (sglang_sim/frontend/vocab.py): the same ids in every process that builds
it, and every piece the simulated model says, and every piece of the prompts it must read back, held as its own."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from dspark_ci.sglang_sim.frontend.vocab import Vocabulary
from dspark_ci.sglang_sim.gpqa_answers import GpqaAnswerKey
from dspark_ci.sglang_sim.openai_api import render_chat
from dspark_ci.sglang_sim.textgen import Ask, Persona, reply_tokens
from dspark_ci.sglang_sim.tokenizer import tokenize
from dspark_ci.suites.gpqa import QUERY_TEMPLATE
from dspark_ci.suites.prompts import PROMPTS

from dspark_ci.suite_runner import SYNTHETIC_GPQA

REPO = Path(__file__).resolve().parent.parent
BUILD = ("import hashlib, json, sys; from dspark_ci.sglang_sim.frontend.vocab import Vocabulary; "
         "print(hashlib.sha256(json.dumps(Vocabulary.build([], sys.argv[1:]).by_piece).encode()).hexdigest())")


def test_every_process_numbers_the_pieces_alike():
    """The TokenizerManager, the DetokenizerManager, the scheduler and a parity reference server each read or
    build it: ids that followed Python's per-process string hashing would differ between two servers."""
    digests = {subprocess.run([sys.executable, "-c", BUILD, *PROMPTS], capture_output=True, text=True, check=True,
                              env={"PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}, cwd=REPO).stdout
               for seed in ("1", "2", "3")}
    assert len(digests) == 1


def test_gpqa_prompts_read_back_and_replies_are_whole_tokens():
    rows = list(csv.DictReader(SYNTHETIC_GPQA.open(newline="", encoding="utf-8")))
    vocabulary = Vocabulary.build(rows, PROMPTS)
    persona = Persona(0, 0.7, GpqaAnswerKey.load(SYNTHETIC_GPQA))
    for row in rows[:20]:
        user = QUERY_TEMPLATE.format(A=row["Incorrect Answer 2"], B=row["Correct Answer"],
                                     C=row["Incorrect Answer 1"], D=row["Incorrect Answer 3"], Question=row["Question"])
        prompt, question = render_chat([{"role": "user", "content": user}])
        pieces = tokenize(prompt)
        assert [p for p in pieces if p not in vocabulary.by_piece] == []
        assert vocabulary.text(vocabulary.ids(p)[0] for p in pieces) == prompt
        for thinking in (False, True):
            reply = list(reply_tokens(persona, Ask(prompt, question, "greedy", thinking)))
            assert all(len(vocabulary.ids(piece)) == 1 for piece in reply), "a reply piece would split in two"
