"""The matrix YAML schema: which keys exist, what each accepts, and the strict records they become.

A matrix file is read once into frozen input records (``MatrixSpec``, ``Fragment``); everything
after that (crossing, matching, building cells) works on those records, never on raw YAML.
Validation happens here, where the YAML enters, so every message can name ``file:line``.

Top level (all optional except that some cells must result)::

    description: free text
    sglang: ">=X.Y.Z"          # default version spec of every `expect`
    id_prefix: release          # prepended to every generated cell id
    hardware: {cuda: h200, npu: a3}   # device -> hardware type, for derived runner labels
    defaults: {CELL KEYS}        # shared by every cell
    axes: {CELL KEY: [values], ...}   # crossed into one cell per combination
    exclude: [{CELL KEYS to match}, ...]   # drops crossed combinations
    include: [{CELL KEYS}, ...]           # extra cells: defaults + this entry (not crossed)
    overrides: [{match: {...}, set: {CELL KEYS}}, ...]   # patches every matching cell

Cell keys: see ``CELL_KEYS`` below (the SGLang settings, rows of ``ground/sglang/settings.py``, go into
``Cell.config``). When fragments are laid
over each other (defaults < axis values < include entry < override ``set``), ``env`` mappings
merge, ``extra_args`` lists append, every other key is replaced. ``exclude`` and override
``match`` compare config keys (and a subset of ``env``) after code defaults apply, so
``{moe_a2a_backend: none}`` matches a cell that never set it. YAML anchors and ``<<:`` merge
keys work as usual. matrices/README.md is the user-facing reference.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from dspark_ci.ground.sglang.release import DEFAULT_VERSION, DEVICE_IMAGES, DEVICES
from dspark_ci.ground.sglang.settings import MAXIMUM, SETTINGS, Setting
from dspark_ci.ground.yaml_lines import YamlList, YamlMap
from dspark_ci.matrices.roles import role_map, router_spec
from dspark_ci.matrices.values import (
    Parser,
    Where,
    arg_list,
    boolean,
    check_keys,
    env_map,
    expect_spec,
    int_between,
    one_of,
    optional,
    slug,
    suite_map,
    text,
    version_spec,
)


@dataclass(frozen=True)
class Key:
    parse: Parser
    example: str
    in_config: bool  # part of Cell.config (and of CONTRACT.md's `config`)
    help: str  # what the key is (its SGLang flag, when it has one), shown when a typo is corrected


# Upper bounds of the counts a cell sets are on their rows (``maximum``, ground/sglang/settings.py).
MAX_INTEGER: Mapping[str, int] = MappingProxyType(dict(MAXIMUM))
MAX_OTHER_INTEGER = 2**31 - 1

_SCALAR: Mapping[type, Parser] = {str: text, int: int_between(0, MAX_OTHER_INTEGER), bool: boolean}


def _parser(s: Setting) -> Parser:
    """How a matrix value of one SGLang setting is checked, from its row (ground/sglang/settings.py)."""
    parse = (one_of(s.choices) if s.choices else slug if s.slug
             else int_between(s.minimum, MAX_INTEGER.get(s.key, MAX_OTHER_INTEGER)) if s.minimum is not None
             else _SCALAR[s.type])
    return optional(parse) if s.nullable else parse


# Every key a cell (defaults, axes, include, overrides' set) may carry: first the settings, in the order config
# is shown (one row each in ground/sglang/settings.py), then what is not config.
CELL_KEYS: Mapping[str, Key] = MappingProxyType({
    **{s.key: Key(_parser(s), s.example, True, s.help) for s in SETTINGS},
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
    "image": Key(optional(text), f"image: {DEVICE_IMAGES['cuda']}", False, "container image"),
    "roles": Key(role_map, "roles: {prefill: {count: 1, tp: 8}, decode: {count: 1, tp: 8}}", False,
                 "prefill/decode disaggregation: each role's count and own settings (matrices/roles.py)"),
    "router": Key(router_spec, "router: {prefill_policy: round_robin}", False,
                  "sglang-router's policies in front of a disaggregated cell"),
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

    def merged(self, top: Fragment) -> Fragment:
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
    sglang = optional(version_spec)(doc.get("sglang"), top.at(doc, "sglang"), "sglang",
                                    f'sglang: ">={DEFAULT_VERSION}"')
    id_prefix = optional(slug)(doc.get("id_prefix"), top.at(doc, "id_prefix"), "id_prefix", "id_prefix: release")
    hardware_node = doc.get("hardware") or YamlMap()
    hw_where = top.at(doc, "hardware")
    if not isinstance(hardware_node, YamlMap):
        raise hw_where.error(f"hardware must map a device to a hardware type, got {hardware_node!r}",
                             "write it like `hardware: {cuda: h200, npu: a3}`")
    check_keys(hardware_node, DEVICES, hw_where, "hardware device")
    hardware = {device: slug(kind, hw_where.at(hardware_node, device), f"hardware.{device}", "cuda: h200")
                for device, kind in hardware_node.items()}
    defaults_node = YamlMap() if doc.get("defaults") is None else doc["defaults"]  # `defaults:` alone is empty
    defaults = parse_fragment(defaults_node, top.at(doc, "defaults"), "defaults")
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
        exclude=exclude, include=include,
        overrides=_parse_overrides(doc.get("overrides"), top.at(doc, "overrides")),
    )
