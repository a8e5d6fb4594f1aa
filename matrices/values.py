"""Value parsers for matrix YAML: each checks one value where it was written and returns it
normalised, or raises ``BadInput`` naming ``file:line``, the problem and the fix.

A parser is ``parse(value, where, key, example)``; ``example`` is a correct line (``tp: 8``) the
message shows as the fix. Suite options and expectations have their own small schemas here.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from dspark_ci.ground.errors import BadInput
from dspark_ci.ground.records import REJECT, SERVE, Expect
from dspark_ci.ground.sglang.flags import load_flags
from dspark_ci.ground.sglang.release import DEFAULT_VERSION
from dspark_ci.ground.suites import SUITE_DEFAULTS, option_problem
from dspark_ci.ground.yaml_lines import YamlList, YamlMap
from packaging.specifiers import InvalidSpecifier, SpecifierSet

SGLANG_VERSION = DEFAULT_VERSION  # the launch-flag snapshot extra_args and choices are checked against
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Names that hold credentials (HF_TOKEN, GITHUB_TOKEN, AWS_SECRET_ACCESS_KEY, ...). Simulator knobs
# such as DSPARK_SIM_PREFILL_MS_PER_TOKEN are numbers, not secrets.
_SECRET_NAME = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|PRIVATE_KEY)$", re.IGNORECASE)
_NOT_SECRET_PREFIX = "DSPARK_SIM_"
_REFERENCE = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*\}$")
_SLUG = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


@dataclass(frozen=True)
class Where:
    """A place in a matrix file; builds the BadInput for a problem found there."""

    path: str
    line: int

    def error(self, problem: str, fix: str = "") -> BadInput:
        return BadInput(f"{self.path}:{self.line}", problem, fix)

    def at(self, node, key) -> Where:
        line_of = getattr(node, "line_of", None)
        return Where(self.path, line_of(key) if line_of else self.line)


# Other spellings of cell keys and values (SGLang's flag and field names, hardware words), for
# "did you mean".
OTHER_SPELLINGS: Mapping[str, str] = {
    "gpu": "cuda", "nvidia": "cuda", "rocm": "cuda", "hip": "cuda", "ascend": "npu",
    "tp_size": "tp", "tensor_parallel": "tp", "tensor_parallel_size": "tp",
    "dp_size": "dp", "data_parallel": "dp", "data_parallel_size": "dp",
    "attn_dp_size": "dp", "pp_size": "pp", "pipeline_parallel_size": "pp",
    "attn_cp_size": "cp", "cp_size": "cp", "enable_prefill_cp": "cp",
    "model_path": "model", "speculative_draft_model_path": "draft_model", "draft_model_path": "draft_model",
    "speculative_dspark_block_size": "speculative_block_size",
    "speculative_dflash_block_size": "speculative_block_size",
    "num_nodes": "nnodes", "nodes": "nnodes", "gpus": "gpus_per_node", "num_gpus": "gpus_per_node",
}


def closest(word: str, known) -> str:
    """`did you mean 'x' (what x is)?` text, or the list of known words when nothing is close. ``known`` may map
    each word to a record with a ``help`` text (dspark_ci.matrices.schema.Key), shown with the suggestion."""
    alias = OTHER_SPELLINGS.get(str(word).replace("-", "_").lstrip("_"))
    by_lower = {str(k).lower(): k for k in known}
    match = difflib.get_close_matches(str(word).lower(), list(by_lower), n=1, cutoff=0.6)
    suggestion = alias if alias in known else (by_lower[match[0]] if match else None)
    if suggestion is None:
        return "known keys: " + ", ".join(sorted(known))
    help_text = getattr(known[suggestion], "help", None) if isinstance(known, Mapping) else None
    return f"did you mean {suggestion!r}? that is: {help_text}" if help_text else f"did you mean {suggestion!r}?"


def check_keys(node: YamlMap, known, where: Where, what: str) -> None:
    for key in node:
        if key not in known:
            raise where.at(node, key).error(f"unknown {what} key {key!r}", closest(key, known))


# --- value parsers: (value, where, key, example) -> normalised value, or raise BadInput -------------

Parser = Callable[[Any, Where, str, str], Any]


def _fail(where: Where, key: str, expected: str, value, example: str) -> BadInput:
    return where.error(f"{key} must be {expected}, got {value!r}", f"write it like `{example}`")


def int_between(minimum: int, maximum: int) -> Parser:
    def parse(value, where, key, example):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise _fail(where, key, f"an integer >= {minimum}", value, example)
        if value > maximum:
            raise _fail(where, key, f"at most {maximum:,} (no deployment is larger)", value, example)
        return value
    return parse


def text(value, where, key, example):
    if not isinstance(value, str) or not value.strip():
        raise _fail(where, key, "a non-empty string", value, example)
    return value


def slug(value, where, key, example):
    if not isinstance(value, str) or not _SLUG.match(value):
        raise _fail(where, key, "lowercase letters, digits, '.', '_' or '-'", value, example)
    return value


def boolean(value, where, key, example):
    if not isinstance(value, bool):
        raise _fail(where, key, "true or false", value, example)
    return value


def one_of(choices) -> Parser:
    def parse(value, where, key, example):
        if value not in choices:
            hint = closest(value, choices) if isinstance(value, str) else ""
            raise where.error(f"{key} must be one of {', '.join(map(str, choices))}, got {value!r}",
                              hint or f"write it like `{example}`")
        return value
    return parse


def optional(parse: Parser) -> Parser:
    def parse_optional(value, where, key, example):
        return None if value is None else parse(value, where, key, example)
    return parse_optional


def version_spec(value, where, key, example):
    try:
        SpecifierSet(text(value, where, key, example))
    except InvalidSpecifier:
        raise _fail(where, key, "a PEP 440 version specifier", value, example) from None
    return value


def env_map(value, where, key, example) -> Mapping[str, str]:
    """Launch environment. Values are strings; secrets only as ``${NAME}`` references."""
    if not isinstance(value, YamlMap):
        raise _fail(where, key, "a mapping of NAME: value", value, example)
    env = {}
    for name, raw in value.items():
        here = where.at(value, name)
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise here.error(f"{name!r} is not an environment variable name", "use letters, digits and '_'")
        if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
            raise here.error(f"env {name} must be a string, got {raw!r}",
                             f"quote it, e.g. `{name}: \"1\"`")
        if _SECRET_NAME.search(name) and not name.startswith(_NOT_SECRET_PREFIX) and not _REFERENCE.match(str(raw)):
            raise here.error(f"env {name} looks like a secret and holds a literal value",
                             f"write `{name}: ${{{name}}}`; the launcher fills it from the environment at launch time")
        env[name] = str(raw)
    return MappingProxyType(env)


def arg_list(value, where, key, example) -> tuple[str, ...]:
    """Extra launch_server arguments, verbatim; every flag must exist in the SGLang release's flags."""
    if not isinstance(value, YamlList):
        raise _fail(where, key, "a list of strings", value, example)
    flags = load_flags(SGLANG_VERSION)
    args = []
    for index, item in enumerate(value):
        here = where.at(value, index)
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise here.error(f"{key} items must be strings, got {item!r}", f"write it like `{example}`")
        item = str(item)
        flag_name = item.split("=", 1)[0]
        if item.startswith("--") and flags.get(flag_name) is None:
            candidates = [f.name for f in flags.canonical()]
            raise here.error(f"{flag_name} is not a flag of SGLang {SGLANG_VERSION}'s launch_server",
                             closest(flag_name, candidates))
        args.append(item)
    return tuple(args)


def suite_map(value, where, key, example) -> Mapping[str, Mapping[str, Any]]:
    """``suites: {accept: {num_requests: 8}, gpqa: null}``; null options mean the suite's defaults."""
    if not isinstance(value, YamlMap):
        raise _fail(where, key, "a mapping of suite name to options", value, example)
    suites: dict[str, Mapping[str, Any]] = {}
    for name, options in value.items():
        here = where.at(value, name)
        if name not in SUITE_DEFAULTS:
            raise here.error(f"unknown suite {name!r}", closest(name, SUITE_DEFAULTS))
        if options is None:
            suites[name] = {}
            continue
        if not isinstance(options, YamlMap):
            raise here.error(f"options of suite {name} must be a mapping, got {options!r}",
                             f"write it like `{name}: {{{next(iter(SUITE_DEFAULTS[name]))}: ...}}` or `{name}: null`")
        check_keys(options, SUITE_DEFAULTS[name], here, f"{name} suite option")
        for opt, val in options.items():  # the suites' own rules (suites/config.py), at the option's line
            problem = option_problem(name, opt, val)
            if problem:
                default = SUITE_DEFAULTS[name][opt]
                example = f"write it like `{opt}: {default}`" if default is not None else "see suites/README.md"
                raise here.at(options, opt).error(problem, example)
        suites[name] = dict(options)
    return MappingProxyType(suites)


def expect_spec(value, where, key, example) -> Expect:
    """``expect: serve`` or ``expect: {outcome: reject, message: REGEX, sglang: SPEC}``."""
    if value == SERVE:
        return Expect(SERVE)
    if not isinstance(value, YamlMap):
        raise where.error(f"expect must be `serve` or a mapping with outcome/message/sglang, got {value!r}",
                          'write `expect: serve` or `expect: {outcome: reject, message: "regex", sglang: ">='
                          f'{DEFAULT_VERSION}"}}`')
    check_keys(value, ("outcome", "message", "sglang"), where, "expect")
    outcome = one_of((SERVE, REJECT))(value.get("outcome"), where.at(value, "outcome"), "expect.outcome",
                                      "outcome: reject")
    message = value.get("message")
    here = where.at(value, "message")
    if outcome == REJECT:
        message = text(message, here, "expect.message", 'message: "DSpark with dp attention requires"')
        try:
            re.compile(message)
        except re.error as err:
            raise here.error(f"expect.message is not a valid regular expression ({err})",
                             r"escape regex characters such as ( ) . with a backslash") from None
    elif message is not None:
        raise here.error("expect.message is only meaningful with outcome: reject",
                         "remove message, or set outcome: reject")
    sglang = optional(version_spec)(value.get("sglang"), where.at(value, "sglang"), "expect.sglang",
                                    f'sglang: ">={DEFAULT_VERSION}"')
    return Expect(outcome, message, sglang)
