"""GPQA as ``sgl-eval run gpqa`` asks and scores it, through the sgl-eval package itself (never a copy).

sgl-eval (PyPI, SGLang's one-command accuracy harness) vendors its scoring from NeMo-Skills. What we take
from the package, each the function ``sgl-eval run gpqa`` itself calls:
  - the sampling fields it sends besides temperature and max_tokens (top_p 0.95, min_p, repetition_penalty);
  - the question: NeMo-Skills' GPQA ``format_entry`` (choices shuffled by the global ``random`` seeded 42
    once, rows in dataset order, as its ``prepare.save_data("diamond", random_seed=42)`` writes them);
  - the prompt: ``render_prompt`` of the vendored ``mcq-4choices`` template ("Answer: A/B/C/D");
  - the score: its ``score_one`` (NeMo-Skills ``eval_mcq``: boxed/regex extraction, else the LAST
    ``Answer: X``);
  - the aggregate: ``aggregate_with_math_metrics`` (NeMo-Skills ``MathMetrics``: pass@1[avg-of-k] with the
    across-runs standard deviation and error, pass@k, majority@k, no_answer).
The package is an optional extra (`pip install -e '.[sgl-eval]'`; why: docs/DEVELOPMENT.md); without it, asking for this
scorer stops with that command. The modules imported are sgl-eval's internal ones (0.1.x has no public API
for them): a release that moves them fails here with the names, not with different numbers.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

from dspark_ci.suites.config import SuiteInputError

INSTALL_HINT = "pip install -e '.[sgl-eval]' (or: pip install sgl-eval)"
NS_SEED = 42  # sgl-eval's registry: gpqa prepared with save_kwargs {"random_seed": 42}
PROMPT = "mcq-4choices"  # NeMo-Skills' GPQA prompt_config (eval/aai/mcq-4choices)
# Columns format_entry reads beyond simple-evals' five; a CSV without them gets NeMo-Skills' None handling.
_OPTIONAL_COLUMNS = ("Explanation", "Subdomain", "Writer's Difficulty Estimate")


def modules() -> Mapping[str, ModuleType]:
    """sgl-eval's modules, or a SuiteInputError saying how to install it."""
    try:
        import sgl_eval
        from sgl_eval import types
        from sgl_eval._vendored.nemo_skills.dataset.gpqa import prepare
        from sgl_eval.evals import _multichoice, _prompts
    except ImportError as err:
        raise SuiteInputError(f"the sgl-eval scorer needs the sgl-eval package, which is not installed "
                              f"({err}): {INSTALL_HINT}") from None
    return {"sgl_eval": sgl_eval, "types": types, "prepare": prepare, "multichoice": _multichoice,
            "prompts": _prompts}


def version() -> str:
    return str(modules()["sgl_eval"].__version__)


def sampling() -> dict[str, Any]:
    """The sampling fields sgl-eval sends on every request besides temperature and max_tokens (its GenConfig
    defaults, NeMo-Skills' InferenceConfig): top_p, and min_p and repetition_penalty in the extra body."""
    gen = modules()["types"].GenConfig()
    return {"top_p": gen.top_p, "min_p": gen.min_p, "repetition_penalty": gen.repetition_penalty}


def entries(rows: Sequence[Mapping[str, str]]) -> list[dict[str, Any]]:
    """NeMo-Skills GPQA entries ({"problem", "expected_answer", "A".."D", ...}) for every row, in order,
    exactly as sgl-eval prepares them (the global random state is restored afterwards)."""
    prepare = modules()["prepare"]
    state = random.getstate()
    try:
        random.seed(NS_SEED)
        return [prepare.format_entry({**dict.fromkeys(_OPTIONAL_COLUMNS), **row}) for row in rows]
    finally:
        random.setstate(state)


def prompt(problem: str) -> str:
    m = modules()["prompts"]
    return m.render_prompt(m.resolve_prompt(PROMPT), problem=problem)


def score(content: str, expected: str) -> tuple[float, str | None]:
    """(1.0 or 0.0, the letter sgl-eval extracted) for one response."""
    m = modules()
    example = m["types"].Example(id="sample", inputs={"problem": ""}, target=expected)
    value, letter = m["multichoice"].make_score_one_fn()(example, m["types"].Sample(text=content))
    return float(value), letter


def aggregate(samples_by_question: Sequence[Sequence[tuple[float, str | None, str]]], repeats: int) -> dict:
    """sgl-eval's aggregate over questions, each a list of (score, extracted letter, expected letter)."""
    m = modules()
    types = m["types"]
    results = []
    for index, samples in enumerate(samples_by_question):
        example = types.Example(id=f"gpqa-{index}", inputs={"problem": ""}, target=samples[0][2])
        results.append(types.ExampleResult(example=example, samples=[types.Sample(text="") for _ in samples],
                                           scores=[s[0] for s in samples], extracted=[s[1] for s in samples]))
    return dict(m["multichoice"].aggregate_with_math_metrics(results, repeats))
