"""The matrix YAML schema: which keys exist, what each accepts, and the strict records they become.

A matrix file is read once into frozen input records (``MatrixSpec``, ``Fragment``); everything
after that (crossing, matching, building cells) works on those records, never on raw YAML.
Validation happens here, where the YAML enters, so every message can name ``file:line``.

Top level (all optional except that some cells must result)::

    description: free text
    sglang: ">=0.5.23"          # default version spec of every `expect`
    id_prefix: release          # prepended to every generated cell id
    hardware: {cuda: h200, npu: a3}   # device -> hardware type, for derived runner labels
    defaults: {CELL KEYS}        # shared by every cell
    axes: {CELL KEY: [values], ...}   # crossed into one cell per combination
    exclude: [{CELL KEYS to match}, ...]   # drops crossed combinations
    include: [{CELL KEYS}, ...]           # extra cells: defaults + this entry (not crossed)
    overrides: [{match: {...}, set: {CELL KEYS}}, ...]   # patches every matching cell

Cell keys: see ``CELL_KEYS`` below (config keys go into ``Cell.config``).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from dspark_ci.errors import BadInput
from dspark_ci.sglang.flags import load_flags
from matrices.cell import REJECT, SERVE, Expect
from matrices.yaml_lines import YamlList, YamlMap

SGLANG_VERSION = "0.5.23"  # the launch-flag snapshot extra_args and choices are checked against

# SpeculativeAlgorithm members and reserved aliases in sglang/srt/speculative/spec_info.py (0.5.23).
SPECULATIVE_ALGORITHMS = ("DSPARK", "DFLASH", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM",
                          "FROZEN_KV_MTP", "UNO")
DEVICES = ("cuda", "npu", "xpu", "hpu", "cpu", "mps", "musa")
SUITE_NAMES = ("gpqa", "accept", "speed", "parity")
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

    def at(self, node, key) -> "Where":
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
    """`did you mean 'x'?` text, or the list of known words when nothing is close."""
    alias = OTHER_SPELLINGS.get(str(word).replace("-", "_").lstrip("_"))
    if alias in known:
        return f"did you mean {alias!r}?"
    by_lower = {str(k).lower(): k for k in known}
    match = difflib.get_close_matches(str(word).lower(), list(by_lower), n=1, cutoff=0.6)
    if match:
        return f"did you mean {by_lower[match[0]]!r}?"
    return "known keys: " + ", ".join(sorted(known))


def check_keys(node: YamlMap, known, where: Where, what: str) -> None:
    for key in node:
        if key not in known:
            raise where.at(node, key).error(f"unknown {what} key {key!r}", closest(key, known))


# --- value parsers: (value, where, key, example) -> normalised value, or raise BadInput -------------

Parser = Callable[[Any, Where, str, str], Any]


def _fail(where: Where, key: str, expected: str, value, example: str) -> BadInput:
    return where.error(f"{key} must be {expected}, got {value!r}", f"write it like `{example}`")


def int_at_least(minimum: int) -> Parser:
    def parse(value, where, key, example):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise _fail(where, key, f"an integer >= {minimum}", value, example)
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


def number(value, where, key, example):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(where, key, "a number", value, example)
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
    """Extra launch_server arguments, verbatim; every flag must exist in SGLang 0.5.23."""
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


# Suite options (docs/ARCHITECTURE.md, "Suites and their options"): option -> (parser, example).
SUITE_OPTIONS: Mapping[str, Mapping[str, tuple[Parser, str]]] = {
    "gpqa": {
        "num_questions": (optional(int_at_least(1)), "num_questions: 20"),
        "repeats": (int_at_least(1), "repeats: 4"),
        "concurrency": (int_at_least(1), "concurrency: 16"),
        "max_tokens": (int_at_least(1), "max_tokens: 4096"),
        "temperature": (number, "temperature: 0.0"),
        "extractor": (one_of(("sglang", "openai")), "extractor: sglang"),
        "dataset": (text, "dataset: data/gpqa_diamond.csv"),
        "thinking": (boolean, "thinking: true"),
    },
    "accept": {
        "num_requests": (int_at_least(1), "num_requests: 8"),
        "max_tokens": (int_at_least(1), "max_tokens: 256"),
        "concurrency": (int_at_least(1), "concurrency: 4"),
        "min_accept_length": (number, "min_accept_length: 1.5"),
    },
    "speed": {
        "num_requests": (int_at_least(1), "num_requests: 16"),
        "concurrency": (int_at_least(1), "concurrency: 4"),
        "input_len": (int_at_least(1), "input_len: 1024"),
        "output_len": (int_at_least(1), "output_len: 64"),
        "warmup_requests": (int_at_least(0), "warmup_requests: 2"),
    },
    "parity": {
        "num_prompts": (int_at_least(1), "num_prompts: 8"),
        "max_tokens": (int_at_least(1), "max_tokens: 128"),
    },
}


def suite_map(value, where, key, example) -> Mapping[str, Mapping[str, Any]]:
    """``suites: {accept: {num_requests: 8}, gpqa: null}``; null options mean the suite's defaults."""
    if not isinstance(value, YamlMap):
        raise _fail(where, key, "a mapping of suite name to options", value, example)
    suites = {}
    for name, options in value.items():
        here = where.at(value, name)
        if name not in SUITE_OPTIONS:
            raise here.error(f"unknown suite {name!r}", closest(name, SUITE_OPTIONS))
        if options is None:
            suites[name] = {}
            continue
        if not isinstance(options, YamlMap):
            raise here.error(f"options of suite {name} must be a mapping, got {options!r}",
                             f"write it like `{name}: {{{next(iter(SUITE_OPTIONS[name]))}: ...}}` or `{name}: null`")
        known = SUITE_OPTIONS[name]
        check_keys(options, known, here, f"{name} suite option")
        suites[name] = {opt: known[opt][0](val, here.at(options, opt), opt, known[opt][1])
                        for opt, val in options.items()}
    return MappingProxyType(suites)


def expect_spec(value, where, key, example) -> Expect:
    """``expect: serve`` or ``expect: {outcome: reject, message: REGEX, sglang: SPEC}``."""
    if value == SERVE:
        return Expect(SERVE)
    if not isinstance(value, YamlMap):
        raise where.error(f"expect must be `serve` or a mapping with outcome/message/sglang, got {value!r}",
                          'write `expect: serve` or `expect: {outcome: reject, message: "regex", sglang: ">=0.5.23"}`')
    check_keys(value, ("outcome", "message", "sglang"), where, "expect")
    outcome = one_of((SERVE, REJECT))(value.get("outcome"), where.at(value, "outcome"), "expect.outcome",
                                      "outcome: reject")
    message = value.get("message")
    here = where.at(value, "message")
    if outcome == REJECT:
        text(message, here, "expect.message", 'message: "DSpark with dp attention requires"')
        try:
            re.compile(message)
        except re.error as err:
            raise here.error(f"expect.message is not a valid regular expression ({err})",
                             r"escape regex characters such as ( ) . with a backslash") from None
    elif message is not None:
        raise here.error("expect.message is only meaningful with outcome: reject",
                         "remove message, or set outcome: reject")
    sglang = optional(version_spec)(value.get("sglang"), where.at(value, "sglang"), "expect.sglang",
                                    'sglang: ">=0.5.23"')
    return Expect(outcome, message, sglang)


@dataclass(frozen=True)
class Key:
    parse: Parser
    example: str
    in_config: bool  # part of Cell.config (and of CONTRACT.md's `config`)
    help: str


_flags = load_flags(SGLANG_VERSION)
_CHOICES_A2A = _flags.get("--moe-a2a-backend").choices
_CHOICES_CP = _flags.get("--cp-strategy").choices

# Every key a cell (defaults, axes, include, overrides' set) may carry, in the order config is shown.
CELL_KEYS: Mapping[str, Key] = MappingProxyType({
    "model": Key(text, "model: deepseek-ai/DeepSeek-V4-Flash", True, "--model-path"),
    "model_slug": Key(slug, "model_slug: dsv4-flash", True, "short model name used in cell ids"),
    "draft_model": Key(optional(text), "draft_model: z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat", True,
                       "--speculative-draft-model-path"),
    "device": Key(one_of(DEVICES), "device: cuda", True, "--device"),
    "hardware": Key(slug, "hardware: h200", True, "accelerator type in the runner label"),
    "nnodes": Key(int_at_least(1), "nnodes: 2", True, "nodes of the deployment"),
    "gpus_per_node": Key(int_at_least(1), "gpus_per_node: 8", True, "accelerators per node"),
    "tp": Key(int_at_least(1), "tp: 8", True, "--tp-size"),
    "dp": Key(int_at_least(1), "dp: 4", True, "--dp-size, or --attn-dp-size with enable_dp_attention"),
    "enable_dp_attention": Key(boolean, "enable_dp_attention: true", True, "dp counts attention-DP groups"),
    "enable_dp_lm_head": Key(boolean, "enable_dp_lm_head: true", True, "--enable-dp-lm-head"),
    "cp": Key(int_at_least(1), "cp: 4", True, "prefill context parallel (CP v2) size"),
    "cp_strategy": Key(optional(one_of(_CHOICES_CP)), "cp_strategy: interleave", True, "--cp-strategy"),
    "pp": Key(int_at_least(1), "pp: 2", True, "--pp-size"),
    "moe_a2a_backend": Key(one_of(_CHOICES_A2A), "moe_a2a_backend: none", True, "--moe-a2a-backend"),
    "speculative_algorithm": Key(optional(one_of(SPECULATIVE_ALGORITHMS)), "speculative_algorithm: DSPARK", True,
                                 "--speculative-algorithm"),
    "speculative_block_size": Key(optional(int_at_least(1)), "speculative_block_size: 7", True,
                                  "--speculative-dspark-block-size / --speculative-dflash-block-size"),
    "speculative_num_steps": Key(optional(int_at_least(1)), "speculative_num_steps: 3", True,
                                 "--speculative-num-steps"),
    "speculative_eagle_topk": Key(optional(int_at_least(1)), "speculative_eagle_topk: 1", True,
                                  "--speculative-eagle-topk"),
    "speculative_num_draft_tokens": Key(optional(int_at_least(1)), "speculative_num_draft_tokens: 4", True,
                                        "--speculative-num-draft-tokens"),
    "reasoning_parser": Key(optional(text), "reasoning_parser: deepseek-v4", True, "--reasoning-parser"),
    "trust_remote_code": Key(boolean, "trust_remote_code: true", True, "--trust-remote-code"),
    "enable_metrics": Key(boolean, "enable_metrics: true", True, "--enable-metrics"),
    # Not config: how the cell is named, launched, measured and judged.
    "id": Key(slug, "id: dsv4-flash-tp8-custom", False, "the whole cell id (otherwise generated)"),
    "id_suffix": Key(slug, "id_suffix: long-ctx", False, "appended to the generated cell id"),
    "runner": Key(text, "runner: 8-gpu-h200", False, "CI runner label (otherwise derived)"),
    "env": Key(env_map, 'env: {SGLANG_RAGGED_VERIFY_MODE: static}', False, "launch environment (merged)"),
    "extra_args": Key(arg_list, 'extra_args: ["--mem-fraction-static", "0.8"]', False,
                      "launch_server flags, verbatim (appended)"),
    "suites": Key(suite_map, "suites: {accept: {num_requests: 8}}", False, "suites to run, with options"),
    "expect": Key(expect_spec, "expect: serve", False, "serve, or reject with SGLang's message"),
    "baseline": Key(optional(text), "baseline: baselines/nightly.yaml", False, "baseline file for gates"),
    "image": Key(optional(text), "image: lmsysorg/sglang:v0.5.23", False, "container image"),
})
CONFIG_KEYS = tuple(k for k, spec in CELL_KEYS.items() if spec.in_config)
MERGED_KEYS = ("env",)  # a later fragment adds to these mappings instead of replacing them
APPENDED_KEYS = ("extra_args",)  # a later fragment appends to these lists
MATCH_KEYS = CONFIG_KEYS + ("env",)


@dataclass(frozen=True)
class Fragment:
    """Cell keys as written in one place (defaults, one axis combination, an include entry, an
    override's ``set``), already validated. ``lines[key]`` is where each value was written."""

    values: Mapping[str, Any]
    lines: Mapping[str, int]
    line: int

    def __post_init__(self):
        object.__setattr__(self, "values", MappingProxyType(dict(self.values)))
        object.__setattr__(self, "lines", MappingProxyType(dict(self.lines)))

    def merged(self, top: "Fragment") -> "Fragment":
        """This fragment with ``top`` written over it (env merged, extra_args appended)."""
        values, lines = dict(self.values), dict(self.lines)
        for key, value in top.values.items():
            if key in MERGED_KEYS and key in values:
                value = MappingProxyType({**values[key], **value})
            elif key in APPENDED_KEYS and key in values:
                value = values[key] + value
            values[key] = value
            lines[key] = top.lines[key]
        return Fragment(values, lines, top.line)


def parse_fragment(node, where: Where, what: str, allowed=CELL_KEYS) -> Fragment:
    if not isinstance(node, YamlMap):
        raise where.error(f"{what} must be a mapping of cell keys, got {node!r}",
                          "write `key: value` lines, e.g. `tp: 8`")
    check_keys(node, allowed, where.at(node, None), what)
    values = {key: CELL_KEYS[key].parse(value, where.at(node, key), key, CELL_KEYS[key].example)
              for key, value in node.items()}
    return Fragment(values, {key: node.line_of(key) for key in node}, node.line)


@dataclass(frozen=True)
class Axis:
    key: str
    values: tuple[Fragment, ...]  # one single-key fragment per value, with its own line
    line: int


@dataclass(frozen=True)
class Override:
    match: Fragment
    set: Fragment
    line: int


@dataclass(frozen=True)
class MatrixSpec:
    """One matrix file, validated: the strict input record everything else reads."""

    path: str
    sglang: str | None
    id_prefix: str | None
    hardware: Mapping[str, str]
    defaults: Fragment
    axes: tuple[Axis, ...]
    axes_line: int
    exclude: tuple[Fragment, ...]
    include: tuple[Fragment, ...]
    overrides: tuple[Override, ...]


TOP_KEYS = ("description", "sglang", "id_prefix", "hardware", "defaults", "axes", "exclude", "include",
            "overrides")


def _list_of(node, where: Where, key: str, example: str) -> YamlList:
    if node is None:
        return YamlList()
    if not isinstance(node, YamlList):
        raise where.error(f"{key} must be a list, got {node!r}", f"write it like `{example}`")
    return node


def _parse_axes(node, where: Where) -> tuple[Axis, ...]:
    if node is None:
        return ()
    if not isinstance(node, YamlMap):
        raise where.error(f"axes must be a mapping of cell key to a list of values, got {node!r}",
                          "write it like `axes: {dp: [2, 4, 8]}`")
    check_keys(node, CELL_KEYS, where, "axes")
    axes = []
    for key, values in node.items():
        here = where.at(node, key)
        if not isinstance(values, YamlList) or not values:
            raise here.error(f"axis {key} must be a non-empty list of values, got {values!r}",
                             f"write it like `{key}: [{CELL_KEYS[key].example.split(': ', 1)[1]}, ...]`")
        fragments = []
        for index, value in enumerate(values):
            value_where = here.at(values, index)
            parsed = CELL_KEYS[key].parse(value, value_where, key, CELL_KEYS[key].example)
            fragments.append(Fragment({key: parsed}, {key: value_where.line}, value_where.line))
        axes.append(Axis(key, tuple(fragments), here.line))
    return tuple(axes)


def _parse_overrides(node, where: Where) -> tuple[Override, ...]:
    overrides = []
    for index, entry in enumerate(_list_of(node, where, "overrides", "overrides: [{match: {...}, set: {...}}]")):
        here = where.at(node, index)
        if not isinstance(entry, YamlMap):
            raise here.error(f"an override must be a mapping with match and set, got {entry!r}",
                             "write it like `- {match: {moe_a2a_backend: deepep}, set: {expect: ...}}`")
        check_keys(entry, ("match", "set"), here, "override")
        for part in ("match", "set"):
            if part not in entry:
                raise here.error(f"this override has no `{part}`", "give both `match:` and `set:`")
        match = parse_fragment(entry["match"], here.at(entry, "match"), "override match", MATCH_KEYS)
        patch = parse_fragment(entry["set"], here.at(entry, "set"), "override set")
        overrides.append(Override(match, patch, here.line))
    return tuple(overrides)


def parse_matrix(doc, path: str) -> MatrixSpec:
    top = Where(path, 1)
    if not isinstance(doc, YamlMap):
        raise top.error("a matrix file must be a YAML mapping (defaults, axes, include, ...)",
                        "start from matrices/smoke.yaml")
    check_keys(doc, TOP_KEYS, top, "top-level")
    if "description" in doc:
        text(doc["description"], top.at(doc, "description"), "description", "description: nightly DSpark cells")
    sglang = optional(version_spec)(doc.get("sglang"), top.at(doc, "sglang"), "sglang", 'sglang: ">=0.5.23"')
    id_prefix = optional(slug)(doc.get("id_prefix"), top.at(doc, "id_prefix"), "id_prefix", "id_prefix: release")
    hardware_node = doc.get("hardware") or YamlMap()
    hw_where = top.at(doc, "hardware")
    if not isinstance(hardware_node, YamlMap):
        raise hw_where.error(f"hardware must map a device to a hardware type, got {hardware_node!r}",
                             "write it like `hardware: {cuda: h200, npu: a3}`")
    check_keys(hardware_node, DEVICES, hw_where, "hardware device")
    hardware = {device: slug(kind, hw_where.at(hardware_node, device), f"hardware.{device}", "cuda: h200")
                for device, kind in hardware_node.items()}
    defaults = parse_fragment(doc.get("defaults", YamlMap()), top.at(doc, "defaults"), "defaults")
    exclude_node = doc.get("exclude")
    exclude = tuple(parse_fragment(entry, top.at(exclude_node, i), "exclude entry", MATCH_KEYS)
                    for i, entry in enumerate(_list_of(exclude_node, top.at(doc, "exclude"), "exclude",
                                                       "exclude: [{dp: 8, moe_a2a_backend: deepep}]")))
    include_node = doc.get("include")
    include = tuple(parse_fragment(entry, top.at(include_node, i), "include entry")
                    for i, entry in enumerate(_list_of(include_node, top.at(doc, "include"), "include",
                                                       "include: [{tp: 4, cp: 4}]")))
    return MatrixSpec(
        path=path, sglang=sglang, id_prefix=id_prefix, hardware=MappingProxyType(hardware),
        defaults=defaults, axes=_parse_axes(doc.get("axes"), top.at(doc, "axes")),
        axes_line=doc.line_of("axes"), exclude=exclude, include=include,
        overrides=_parse_overrides(doc.get("overrides"), top.at(doc, "overrides")),
    )
