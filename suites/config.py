"""The suites' configuration: one frozen record built from the pytest command line, passed to fixtures.

Each suite's options (docs/ARCHITECTURE.md, "Suites and their options") start from the defaults below;
``--suite-options FILE.json`` (suite name -> options, as ``dspark-ci run`` writes it) and repeated
``--suite-option SUITE.KEY=VALUE`` override them. Unknown suites or keys, and values of the wrong type,
are input errors (``SuiteInputError``), reported once by conftest.py as a pytest usage error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

# Every option a suite reads, with its default. A value's type is the default's type
# (None-valued defaults list their accepted types in OPTION_TYPES).
SUITE_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpqa": {
        "num_questions": None,  # subsample (simple-evals `num_examples`); None = every question
        "repeats": 1,  # simple-evals `n_repeats`
        "concurrency": 32,
        "max_tokens": 2048,
        "temperature": 0.0,
        "extractor": "sglang",  # "sglang" | "openai": which answer regex
        "dataset": None,  # path or URL; None = the published gpqa_diamond.csv
        "thinking": False,  # ask the chat template for thinking mode
        "chat_template_kwargs": None,  # explicit kwargs; overrides what `thinking` sets
    },
    "accept": {
        "num_requests": 32,
        "max_tokens": 256,
        "concurrency": 8,
        "min_accept_length": 1.2,  # the collapse floor: below this, drafts are (nearly) never accepted
        "disagreement_tolerance": 0.05,  # relative gap between per-request and server-side figures
    },
    "speed": {
        "num_requests": 64,
        "concurrency": 8,
        "input_len": 256,  # prompt tokens (approximate: built from words, calibrated with usage)
        "output_len": 128,  # max_tokens, with ignore_eos
        "warmup_requests": 4,
        "workers": 1,  # client processes sharing the concurrency (see BENCHMARKS.md)
        "ignore_eos": True,
        "client": "aiohttp",  # "aiohttp" | "openai": what reads the streams (BENCHMARKS.md: why aiohttp)
    },
    "parity": {
        "num_prompts": 8,
        "max_tokens": 64,
        "concurrency": 1,  # batching can change greedy numerics on real GPUs: one at a time by default
        "max_mismatches": 0,  # the parity test fails above this many differing prompts
    },
}

OPTION_TYPES: dict[tuple[str, str], tuple[type, ...]] = {
    ("gpqa", "num_questions"): (int, type(None)),
    ("gpqa", "dataset"): (str, type(None)),
    ("gpqa", "chat_template_kwargs"): (dict, type(None)),
}

ALLOWED_VALUES: dict[tuple[str, str], tuple[str, ...]] = {
    ("gpqa", "extractor"): ("sglang", "openai"),
    ("speed", "client"): ("aiohttp", "openai"),
}

# Counts and sizes: zero or less is a mistake, not a request for nothing.
POSITIVE_OPTIONS = frozenset(
    {"num_questions", "repeats", "concurrency", "max_tokens", "num_requests", "input_len", "output_len",
     "workers", "num_prompts"}
)


class SuiteInputError(Exception):
    """Bad suite input (options, dataset, reference file). ``str()`` is the whole message for the user."""


@dataclass(frozen=True)
class SuiteConfig:
    base_url: str | None  # the server under test, "http://HOST:PORT" (no /v1)
    model: str | None  # served model name; None = ask /v1/models
    api_key: str
    request_timeout: float  # seconds, per request
    options: Mapping[str, Mapping[str, Any]]  # suite name -> full option set
    reference_url: str | None = None
    reference_file: Path | None = None
    save_reference: Path | None = None
    cache_dir: Path = Path.home() / ".cache" / "dspark-ci"
    out_path: Path | None = None

    def suite(self, name: str) -> Mapping[str, Any]:
        return self.options[name]

    @property
    def api_base(self) -> str:
        return f"{self.base_url}/v1"


def normalize_base_url(url: str) -> str:
    """Accept "http://h:p", "http://h:p/" or "http://h:p/v1" alike."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def merge_options(from_file: Mapping[str, Any] | None, from_flags: list[str], where_file: str) -> dict:
    """Defaults, then the options file, then ``SUITE.KEY=VALUE`` flags. Raises SuiteInputError."""
    merged = {suite: dict(defaults) for suite, defaults in SUITE_DEFAULTS.items()}
    for suite, options in (from_file or {}).items():
        if not isinstance(options, Mapping):
            raise SuiteInputError(f"{where_file}: suite '{suite}' must map option names to values")
        for key, value in options.items():
            _set_option(merged, suite, key, value, where_file)
    for flag in from_flags:
        suite, key, value = _parse_flag(flag)
        _set_option(merged, suite, key, value, f"--suite-option {flag}")
    return merged


def load_options_file(path: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as err:
        raise SuiteInputError(f"--suite-options {path}: cannot read it ({err.strerror})") from None
    except json.JSONDecodeError as err:
        raise SuiteInputError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(data, dict):
        raise SuiteInputError(f"{path}: expected a JSON object of suite name -> options")
    return data


def _parse_flag(flag: str) -> tuple[str, str, Any]:
    name, sep, raw = flag.partition("=")
    suite, dot, key = name.partition(".")
    if not (sep and dot and suite and key):
        raise SuiteInputError(f"--suite-option {flag}: expected SUITE.KEY=VALUE, e.g. gpqa.repeats=4")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw  # a bare string such as a path
    return suite, key, value


def option_problem(suite: str, key: str, value: Any) -> str | None:
    """What is wrong with one option value, or None. Shared with the matrix loader, which checks
    a cell's `suites:` options where the YAML enters (with the option's own line)."""
    if suite not in SUITE_DEFAULTS:
        return f"unknown suite '{suite}' (known: {', '.join(SUITE_DEFAULTS)})"
    defaults = SUITE_DEFAULTS[suite]
    if key not in defaults:
        return f"suite '{suite}' has no option '{key}' (known: {', '.join(defaults)})"
    expected = OPTION_TYPES.get((suite, key)) or _types_like(defaults[key])
    if isinstance(value, bool) and bool not in expected or not isinstance(value, expected):
        names = " or ".join("null" if t is type(None) else t.__name__ for t in expected)
        return f"{suite}.{key} must be {names}, got {json.dumps(value)}"
    if key in POSITIVE_OPTIONS and value is not None and value <= 0:
        return f"{suite}.{key} must be at least 1, got {value}"
    allowed = ALLOWED_VALUES.get((suite, key))
    if allowed and value not in allowed:
        return f"{suite}.{key} must be one of {', '.join(allowed)}, got {value!r}"
    return None


def _set_option(merged: dict, suite: str, key: str, value: Any, where: str) -> None:
    problem = option_problem(suite, key, value)
    if problem:
        raise SuiteInputError(f"{where}: {problem}")
    merged[suite][key] = value


def _types_like(default: Any) -> tuple[type, ...]:
    if isinstance(default, bool):
        return (bool,)
    if isinstance(default, float):
        return (float, int)  # 1 is a fine temperature or floor
    return (type(default),)


def freeze(options: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Mapping[str, Any]]:
    return MappingProxyType({suite: MappingProxyType(dict(opts)) for suite, opts in options.items()})
