"""The model directory SGLang's front end loads: a config.json and a tokenizer that reads like the simulator's.

SGLang's TokenizerManager counts and encodes prompts with this tokenizer and its DetokenizerManager turns the
scheduler's token ids back into text, so it must split text exactly as ``dspark_ci.sglang_sim.tokenizer`` does (one
token per piece of ``PIECE_PATTERN``: prompt counts agree) and hold, as its own tokens, every piece the simulated
model can say (the ids the scheduler sends decode to the simulator's text). The pieces come from the same
generators the engine draws from (``dspark_ci.sglang_sim.textgen``): the prose words in every position a sentence puts
them, the GPQA replies for every question of the dataset it answers from, the thinking tags, and the garbage
fault's letters. A piece outside the vocabulary (text the generators never produce) is sent character by
character (``Vocabulary.ids``).

Runs inside the SGLang venv (it needs the ``tokenizers`` package); the pieces themselves are plain Python.
"""

from __future__ import annotations

import json
import string
from collections.abc import Iterable, Iterator
from pathlib import Path

from dspark_ci.sglang_sim.textgen import GIBBERISH, WORDS
from dspark_ci.sglang_sim.tokenizer import EOS_TOKEN_ID, PIECE_PATTERN, THINK_END, THINK_START, tokenize

UNK, EOS = "[UNK]", "</s>"
# dspark_ci.sglang_sim.openai_api.render_chat in Jinja: every turn as "<|role|>\n{text}\n", then "<|assistant|>\n"
# (the last newline is an expression: Jinja drops a template's trailing newline). Same as bench/'s.
CHAT_TEMPLATE = ("{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
                 "<|assistant|>{{ '\\n' }}")
# The whitespace a word can follow in a prompt or a reply: a piece is that whitespace and up to six characters.
PREFIXES = ("", " ", "\n", "\n\n", "\n\n\n", "  ")
# simple-evals' GPQA instruction as SGLang's run_eval sends it (dspark_ci.sglang_sim.gpqa_answers recognises its first
# sentence), the words of the simulator's GPQA replies (dspark_ci.sglang_sim.textgen), and our chat template's turn
# markers.
GPQA_TEXTS = ("Answer the following multiple choice question. The last line of your response should be of the "
              "following format: 'Answer: $LETTER' (without quotes) where LETTER is one of ABCD. Think step by "
              "step before answering.",
              "Let me work through this step by step. The best match is A) B) C) D) Answer: A B C D",
              "<|system|> <|user|> <|assistant|>")


def _word_pieces(texts: Iterable[str]) -> Iterator[str]:
    """Every piece a word of ``texts`` becomes after any of PREFIXES (the pieces of a word depend only on the
    whitespace before it), with and without a sentence's capital and full stop."""
    for text in texts:
        for word in text.split():
            for form in dict.fromkeys((word, word.capitalize(), word + ".")):  # ordered: ids must not vary by run
                for prefix in PREFIXES:
                    yield from tokenize(prefix + form)


def _gibberish_pieces() -> Iterator[str]:
    """The garbage_output fault's words: " " + 1..5 letters; all of up to two letters, the rest by letter."""
    for first in GIBBERISH:
        yield " " + first
        yield from (" " + first + second for second in GIBBERISH)


def _gpqa_texts(rows: Iterable[dict]) -> Iterator[str]:
    for row in rows:
        yield row.get("Question") or ""
        yield from (row.get(column) or "" for column in ("Correct Answer", "Incorrect Answer 1",
                                                          "Incorrect Answer 2", "Incorrect Answer 3"))


def pieces(gpqa_rows: Iterable[dict] = (), prompts: Iterable[str] = ()) -> list[str]:
    """Every piece the vocabulary holds, in a stable order (ids follow it). ``prompts``: texts whose words
    clients will send (a prompt piece outside the vocabulary reaches the engine as [UNK]: counted right, but
    its text, which seeds the reply and the acceptance draws, is lost)."""
    seen: dict[str, None] = {}
    fixed = [THINK_START, THINK_END, *string.printable, *(" " + c for c in string.printable if not c.isspace())]
    texts = (" ".join(WORDS), *GPQA_TEXTS, *_gpqa_texts(gpqa_rows), *prompts)
    for piece in (*fixed, *_word_pieces(texts), *_gibberish_pieces()):
        if piece:
            seen.setdefault(piece, None)
    return list(seen)


class Vocabulary:
    """piece -> id, as the written tokenizer has it (0 = [UNK], 1 = EOS, as the simulator's EOS id)."""

    def __init__(self, vocab: dict[str, int]):
        self.by_piece = vocab
        self.by_id = {token_id: piece for piece, token_id in vocab.items()}

    @classmethod
    def build(cls, gpqa_rows: Iterable[dict] = (), prompts: Iterable[str] = ()) -> Vocabulary:
        vocab = {UNK: 0, EOS: EOS_TOKEN_ID}
        for piece in pieces(gpqa_rows, prompts):
            vocab.setdefault(piece, len(vocab))
        return cls(vocab)

    @classmethod
    def read(cls, model_dir: Path) -> Vocabulary:
        data = json.loads((model_dir / "tokenizer.json").read_text())
        return cls(dict(data["model"]["vocab"]))

    def ids(self, piece: str) -> list[int]:
        """The ids of one engine token: EOS for the empty piece, its own id, else one id per character."""
        if not piece:
            return [EOS_TOKEN_ID]
        known = self.by_piece.get(piece)
        if known is not None:
            return [known]
        return [self.by_piece.get(char, 0) for char in piece]


    def text(self, ids: Iterable[int]) -> str:
        """The text of prompt ids (a request sent as ids, e.g. /generate with input_ids)."""
        return "".join(self.by_id.get(token_id, "") for token_id in ids if token_id > EOS_TOKEN_ID)


def write_model_dir(directory: Path, vocabulary: Vocabulary, config: dict, pattern: str) -> None:
    """config.json (the architecture SGLang loads; no weights: --load-format dummy) and the tokenizer files.

    ``pattern`` is ``PIECE_PATTERN`` as the tokenizers library's regex engine reads it
    (bench/sglang_bench_serving.onig_pattern)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel(vocabulary.by_piece, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()  # the pieces carry their own whitespace: join them as they are
    tokenizer.add_special_tokens([AddedToken(EOS, special=True, normalized=False)])
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE,
                        "eos_token": EOS, "clean_up_tokenization_spaces": False, "model_max_length": 1 << 30}
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
    (directory / "config.json").write_text(json.dumps({**config, "eos_token_id": EOS_TOKEN_ID,
                                                       "vocab_size": max(len(vocabulary.by_piece), 1024)}, indent=1))


__all__ = ["CHAT_TEMPLATE", "PIECE_PATTERN", "Vocabulary", "pieces", "write_model_dir"]
