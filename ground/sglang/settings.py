"""Every setting a matrix cell may carry for the SGLang release under test, one row each: its key and type (the
field of ``CellConfig``), how a matrix value is checked, the ``launch_server`` flag it becomes and by which rule,
its default, and how the report's one-line summary shows it.

The matrix schema and expansion (``matrices/schema.py``, ``matrices/expand.py``), the launch plan's argv
(``launchers/launch_plan.py``) and the report's config line (``reports/markdown.py``) all read these rows; none keeps a
table of its own. A new setting is one field here; a new SGLang release is a new set of rows (and its
``flags-<version>.json``). Rules target SGLang 0.5.23 (sglang/srt/arg_groups/fields/*.py); every flag a rule
emits is checked against the snapshot when a cell is planned.

A row is one ``CellConfig`` field, ``key: type = setting(type, example, help, flag_rule, **facts)``; every fact of
the setting is on it, and every other place derives from the rows:

- ``flag_rule`` (``value``, ``value_unless``, ``switch``, ``rule``): the ``launch_server`` argv it becomes
  (``launch_args``; ``launchers/launch_plan.py``).
- ``default``, ``always``, ``nullable``, ``choices``, ``slug``, ``minimum``, ``maximum``: how a matrix value is
  checked (``matrices/schema.py``; ``maximum`` is the bound past which a count is a typo).
- ``id``: its part of the cell id (``IdPart(position, render)``; ``matrices/ids.py`` orders the parts by position),
  so sibling cells that differ only in this setting get distinct ids. None: not part of the id.
- ``resolved``: the fields of SGLang's resolved ``ServerArgs`` that report it for an admitted launch
  (``RESOLVED_FIELDS``, sent to ``resolve_child.py``).
- ``summary``: how the report's one-line config summary shows it. ``speculative``: dropped for the parity reference.

The simulator parses every flag of the snapshot (``sglang_sim/args.py``) and acts on those it models; a row it does
not model needs nothing there (``tests/test_settings.py`` checks each row's flag parses).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from dspark_ci.ground.sglang.flags import load_flags
from dspark_ci.ground.sglang.release import BLOCK_SIZE_FLAGS, DEFAULT_VERSION, DEVICES, SPECULATIVE_ALGORITHMS

_FLAGS = load_flags(DEFAULT_VERSION)


def _choices(flag: str) -> tuple | None:
    """The values SGLang itself accepts for a flag (its snapshot), so a matrix is checked against the release."""
    known = _FLAGS.get(flag)
    if known is None:
        raise KeyError(f"{flag} is not a flag of SGLang {DEFAULT_VERSION} (ground/sglang/flags-*.json)")
    return known.choices
Config = Mapping[str, Any]  # the cell's settings by key (the CONTRACT.md ``config`` object, defaults filled in)


@dataclass(frozen=True)
class FlagRule:
    """How settings become launch_server arguments: ``render(config)`` (``[]``: nothing to say). ``position``
    orders the argv (model first, then placement, parallelism, speculation, parsers, switches)."""

    flag: str  # the flag it emits (checked against the snapshot), for messages and docs
    render: Callable[[Config], list[str]]
    position: int


@dataclass(frozen=True)
class Summary:
    """How the report's one-line config summary shows a setting: ``format`` of the value, values not worth
    showing, and the place in the line."""

    format: str
    hidden: tuple = ()
    position: int = 0


@dataclass(frozen=True)
class IdPart:
    """A setting's part of the cell id: ``render(config)`` ("" leaves it out) at ``position`` (lowest first)."""

    position: int
    render: Callable[[Config], str]


# Upper bounds of the counts a cell sets: past them a value is a typo (2**64 GPUs) that would plan and even run green
# on the simulator. tp/dp/cp/pp are bounded by the layout rules too (ranks <= nnodes * gpus_per_node).
MAX_NODES, MAX_GPUS_PER_NODE = 1024, 128
MAX_PARALLEL = MAX_NODES * MAX_GPUS_PER_NODE
MAX_SPECULATIVE = 1024  # block size, steps, top-k, draft tokens


@dataclass(frozen=True)
class Setting:
    key: str
    type: type  # str, int or bool
    example: str  # how a matrix writes it, shown when a value is wrong
    help: str  # what it is (its SGLang flag, when it has one), shown when a typo is corrected
    default: Any = None  # the value when the matrix does not say (SGLang's own default where it has one)
    always: bool = False  # in every cell's config (CONTRACT.md), even when null; otherwise only when set
    nullable: bool = False  # a matrix may write null
    minimum: int | None = None  # for integers
    choices: tuple | None = None
    slug: bool = False  # lowercase letters, digits, '.', '_' or '-' (it enters cell ids and runner labels)
    flag: FlagRule | None = None  # None: placement or naming, not an SGLang argument (or rendered by another row)
    summary: Summary | None = None
    speculative: bool = False  # part of speculative decoding (dropped for the non-speculative reference)
    maximum: int | None = None  # for integers: past it a value is a typo
    id: IdPart | None = None  # its part of the cell id; None: not in the id
    resolved: tuple[str, ...] = ()  # SGLang's resolved ServerArgs fields reported for an admitted launch


def value(flag: str, position: int) -> Callable[[str], FlagRule]:
    """``--flag VALUE`` whenever the config sets the key."""
    return lambda key: FlagRule(flag, lambda c: [flag, str(c[key])] if c.get(key) is not None else [], position)


def value_unless(flag: str, default: Any, position: int) -> Callable[[str], FlagRule]:
    """``--flag VALUE`` when the value differs from SGLang's default (keeps argv short and readable)."""
    return lambda key: FlagRule(flag, lambda c: [flag, str(c[key])] if c.get(key, default) != default else [],
                                position)


def switch(flag: str, position: int) -> Callable[[str], FlagRule]:
    """``--flag`` when the key is true."""
    return lambda key: FlagRule(flag, lambda c: [flag] if c.get(key) else [], position)


def rule(flag: str, render: Callable[[Config], list[str]], position: int) -> Callable[[str], FlagRule]:
    """A rule reading several settings (the other rows name it as what renders them)."""
    return lambda key: FlagRule(flag, render, position)


def _data_parallel(c: Config) -> list[str]:
    # 0.5.23 deprecates `--dp-size N --enable-dp-attention` in favour of `--attn-dp-size N`
    # (parallel_hook.handle_deprecated_dp_attention); plain --dp-size counts model replicas.
    if c["dp"] == 1:
        return []
    return ["--attn-dp-size" if c["enable_dp_attention"] else "--dp-size", str(c["dp"])]


def _context_parallel(c: Config) -> list[str]:
    # CP v2: strategy-based prefill CP. DeepSeek-V4 derives attn_cp_size = tp / attn_dp itself
    # (deepseek_v4_hook.validate_deepseek_v4_cp); other models read --attn-cp-size.
    if c["cp"] == 1:
        return []
    return ["--enable-prefill-cp", "--cp-strategy", c.get("cp_strategy") or "interleave",
            "--attn-cp-size", str(c["cp"])]


def _block_size(c: Config) -> list[str]:
    size = c.get("speculative_block_size")
    return [BLOCK_SIZE_FLAGS[c["speculative_algorithm"]], str(size)] if size is not None else []


# SGLang 0.5.23's DISAGG_TRANSFER_BACKEND_CHOICES (arg_groups/choices.py); the flag snapshot has no choices for it
# (they are filled in at import), so they are written here. mooncake_tcp is mooncake over TCP (no RDMA).
DISAGGREGATION_TRANSFER_BACKENDS = ("mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp")
DEFAULT_BOOTSTRAP_PORT = 8998  # fields/disagg.py


def _transfer_backend(c: Config) -> list[str]:
    # only a disaggregated role says it: on a colocated server it means nothing
    backend = c.get("disaggregation_transfer_backend")
    return ["--disaggregation-transfer-backend", backend] if backend and c.get("disaggregation_mode") else []


def served_bootstrap_port(c: Config) -> int | None:
    """The port a prefill server hosts its bootstrap server on (decode connects to it; it learns it per request)."""
    port = c.get("disaggregation_bootstrap_port")
    return port if port and c.get("disaggregation_mode") == "prefill" else None


def _bootstrap_port(c: Config) -> list[str]:
    port = served_bootstrap_port(c)
    return ["--disaggregation-bootstrap-port", str(port)] if port else []


def model_slug(model: str) -> str:
    """``deepseek-ai/DeepSeek-V4-Flash`` -> ``deepseek-v4-flash`` (a matrix may set model_slug instead)."""
    base = model.rstrip("/").rsplit("/", 1)[-1].lower()
    return re.sub(r"[^a-z0-9._-]+", "-", base).strip("-._") or "model"


def _speculative_id(c: Config) -> str:
    algorithm = c.get("speculative_algorithm")
    if not algorithm:
        return ""
    block = c.get("speculative_block_size")
    return algorithm.lower() + (f"-b{block}" if block else "")


def _context_parallel_id(c: Config) -> str:
    if c["cp"] == 1:
        return ""
    strategy = c.get("cp_strategy") or "interleave"
    return f"cp{c['cp']}" + ("" if strategy == "interleave" else f"-{strategy}")


def setting(type_: type, example: str, help: str, flag: Callable[[str], FlagRule] | None = None,
            **facts: Any) -> Any:
    """One row: a ``CellConfig`` field whose metadata is the ``Setting`` (its key is the field's name)."""
    return field(default=facts.get("default"), metadata={"row": (type_, example, help, flag, facts)})


@dataclass(frozen=True, kw_only=True)
class CellConfig(Mapping[str, Any]):
    """A cell's settings, typed; rows in the order results.json and plans show them. Read as a mapping it is the
    CONTRACT.md ``config`` object (``to_dict``): every ``always`` setting, the others when set."""

    model: str = setting(str, "model: deepseek-ai/DeepSeek-V4-Flash", "--model-path", value("--model-path", 0),
        id=IdPart(10, lambda c: c.get("model_slug") or model_slug(c["model"])))
    model_slug: str | None = setting(str, "model_slug: dsv4-flash", "short model name used in cell ids", slug=True)
    draft_model: str | None = setting(str, "draft_model: z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat",
                                      "--speculative-draft-model-path",
                                      value("--speculative-draft-model-path", 90), nullable=True, speculative=True,
        resolved=("speculative_draft_model_path",))
    device: str = setting(str, "device: cuda", "--device", value("--device", 10), default="cuda", always=True,
                          choices=DEVICES, summary=Summary("{}", position=0),
        id=IdPart(120, lambda c: c["device"]), resolved=("device",))
    hardware: str | None = setting(str, "hardware: h200", "accelerator type in the runner label", slug=True)
    nnodes: int = setting(int, "nnodes: 2", "nodes of the deployment", default=1, always=True, minimum=1,
                          summary=Summary("{} nodes", (1,), position=5),
        maximum=MAX_NODES, id=IdPart(20, lambda c: f"{c['nnodes']}node" if c["nnodes"] > 1 else ""))
    gpus_per_node: int = setting(int, "gpus_per_node: 8", "accelerators per node", default=8, always=True,
                                 minimum=1,
        maximum=MAX_GPUS_PER_NODE)
    tp: int = setting(int, "tp: 8", "--tp-size", value("--tp-size", 20), default=1, always=True, minimum=1,
                      summary=Summary("tp {}", position=1),
        maximum=MAX_PARALLEL, id=IdPart(30, lambda c: f"tp{c['tp']}"), resolved=("tp_size",))
    dp: int = setting(int, "dp: 4", "--dp-size, or --attn-dp-size with enable_dp_attention",
                      rule("--dp-size/--attn-dp-size", _data_parallel, 40), default=1, always=True, minimum=1,
                      summary=Summary("dp {}", (1,), position=2),
        maximum=MAX_PARALLEL, id=IdPart(50, lambda c: f"dp{c['dp']}" if c["dp"] > 1 else ""),
        resolved=("dp_size", "attn_dp_size"))
    enable_dp_attention: bool = setting(bool, "enable_dp_attention: true", "dp counts attention-DP groups "
                                        "(rendered by dp's rule)", default=False, always=True,
                                        summary=Summary("dp-attention", (False,), position=6),
        id=IdPart(60, lambda c: "dpattn" if c["enable_dp_attention"] else ""))
    enable_dp_lm_head: bool = setting(bool, "enable_dp_lm_head: true", "--enable-dp-lm-head",
                                      switch("--enable-dp-lm-head", 50), default=False, always=True,
        id=IdPart(70, lambda c: "lmhead" if c["enable_dp_lm_head"] else ""), resolved=("enable_dp_lm_head",))
    cp: int = setting(int, "cp: 4", "prefill context parallel (CP v2) size",
                      rule("--enable-prefill-cp", _context_parallel, 60), default=1, always=True, minimum=1,
                      summary=Summary("cp {}", (1,), position=3),
        maximum=MAX_PARALLEL, id=IdPart(80, _context_parallel_id), resolved=("attn_cp_size",))
    cp_strategy: str | None = setting(str, "cp_strategy: interleave", "--cp-strategy (rendered by cp's rule)",
                                      nullable=True, choices=_choices("--cp-strategy"))
    pp: int = setting(int, "pp: 2", "--pp-size", value_unless("--pp-size", 1, 30), default=1, always=True,
                      minimum=1, summary=Summary("pp {}", (1,), position=4),
        maximum=MAX_PARALLEL, id=IdPart(40, lambda c: f"pp{c['pp']}" if c["pp"] > 1 else ""))
    moe_a2a_backend: str = setting(str, "moe_a2a_backend: none", "--moe-a2a-backend",
                                   value("--moe-a2a-backend", 70), default="none", always=True,
                                   choices=_choices("--moe-a2a-backend"),
                                   summary=Summary("a2a {}", ("none",), position=7),
        id=IdPart(90, lambda c: f"a2a-{c['moe_a2a_backend']}"), resolved=("moe_a2a_backend",))
    speculative_algorithm: str | None = setting(str, "speculative_algorithm: DSPARK", "--speculative-algorithm",
                                                value("--speculative-algorithm", 80), always=True, nullable=True,
                                                choices=SPECULATIVE_ALGORITHMS, summary=Summary("{}", position=8),
                                                speculative=True,
        id=IdPart(100, _speculative_id), resolved=("speculative_algorithm",))
    speculative_block_size: int | None = setting(
        int, "speculative_block_size: 7", "--speculative-dspark-block-size / --speculative-dflash-block-size",
        rule("--speculative-*-block-size", _block_size, 100), nullable=True, minimum=1, speculative=True,
        maximum=MAX_SPECULATIVE, resolved=("speculative_dspark_block_size", "speculative_dflash_block_size"))
    speculative_num_steps: int | None = setting(int, "speculative_num_steps: 3", "--speculative-num-steps",
                                                value("--speculative-num-steps", 110), nullable=True, minimum=1,
                                                speculative=True,
        maximum=MAX_SPECULATIVE, resolved=("speculative_num_steps",))
    speculative_eagle_topk: int | None = setting(int, "speculative_eagle_topk: 1", "--speculative-eagle-topk",
                                                 value("--speculative-eagle-topk", 120), nullable=True, minimum=1,
                                                 speculative=True,
        maximum=MAX_SPECULATIVE, resolved=("speculative_eagle_topk",))
    speculative_num_draft_tokens: int | None = setting(
        int, "speculative_num_draft_tokens: 4", "--speculative-num-draft-tokens",
        value("--speculative-num-draft-tokens", 130), nullable=True, minimum=1, speculative=True,
        maximum=MAX_SPECULATIVE, resolved=("speculative_num_draft_tokens",))
    speculative_draft_kv_cache_dtype: str | None = setting(
        str, "speculative_draft_kv_cache_dtype: fp8_e4m3", "--speculative-draft-kv-cache-dtype (the draft model's "
        "KV cache only; default: follows kv_cache_dtype)", value("--speculative-draft-kv-cache-dtype", 135),
        nullable=True, choices=_choices("--speculative-draft-kv-cache-dtype"), speculative=True,
        id=IdPart(105, lambda c: f"dkv-{c['speculative_draft_kv_cache_dtype']}"
                  if c.get("speculative_draft_kv_cache_dtype") else ""),
        resolved=("speculative_draft_kv_cache_dtype",))
    reasoning_parser: str | None = setting(str, "reasoning_parser: deepseek-v4", "--reasoning-parser",
                                           value("--reasoning-parser", 140), nullable=True)
    kv_cache_dtype: str | None = setting(str, "kv_cache_dtype: fp8_e4m3", "--kv-cache-dtype",
                                         value("--kv-cache-dtype", 145), nullable=True,
                                         choices=_choices("--kv-cache-dtype"),
                                         summary=Summary("kv {}", ("auto",), position=9))
    trust_remote_code: bool | None = setting(bool, "trust_remote_code: true", "--trust-remote-code",
                                             switch("--trust-remote-code", 150))
    enable_metrics: bool | None = setting(bool, "enable_metrics: true", "--enable-metrics",
                                          switch("--enable-metrics", 160))
    # Prefill/decode disaggregation (fields/disagg.py). A cell's `roles` set the mode per role; the transfer
    # backend is the cell's (both roles must agree); the bootstrap port is served by each prefill instance.
    disaggregation_mode: str | None = setting(str, "disaggregation_mode: decode", "--disaggregation-mode "
                                              "(set by the cell's roles)", value("--disaggregation-mode", 170),
                                              nullable=True, choices=("prefill", "decode"),
                                              summary=Summary("PD {}", position=10))
    disaggregation_transfer_backend: str | None = setting(
        str, "disaggregation_transfer_backend: mooncake", "--disaggregation-transfer-backend",
        rule("--disaggregation-transfer-backend", _transfer_backend, 175), nullable=True,
        choices=DISAGGREGATION_TRANSFER_BACKENDS, summary=Summary("via {}", position=11))
    disaggregation_bootstrap_port: int | None = setting(
        int, "disaggregation_bootstrap_port: 8998", "--disaggregation-bootstrap-port (prefill; instance i "
        "serves it plus i)", rule("--disaggregation-bootstrap-port", _bootstrap_port, 180), nullable=True,
        minimum=1)

    @property
    def speculative(self) -> bool:
        return bool(self.speculative_algorithm)

    def __getitem__(self, key: str) -> Any:
        if key not in BY_KEY or not (BY_KEY[key].always or getattr(self, key) is not None):
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    def colocated(self) -> CellConfig:
        """The same server without disaggregation (a PD role's colocated baseline)."""
        return dataclasses.replace(self, disaggregation_mode=None, disaggregation_transfer_backend=None,
                                   disaggregation_bootstrap_port=None)

    def without_speculation(self) -> CellConfig:
        """The same deployment with no speculative decoding (the parity suite's reference)."""
        cleared: dict[str, Any] = {s.key: None for s in SETTINGS if s.speculative}
        return dataclasses.replace(self, **cleared)

    def to_dict(self) -> dict[str, Any]:
        """The CONTRACT.md ``config`` object: every ``always`` setting, the others when set."""
        return {s.key: getattr(self, s.key) for s in SETTINGS if s.always or getattr(self, s.key) is not None}

    @classmethod
    def from_dict(cls, config: Config) -> CellConfig:
        return cls(**{key: config[key] for key in BY_KEY if key in config})


def _rows() -> tuple[Setting, ...]:
    rows = []
    for f in dataclasses.fields(CellConfig):
        type_, example, help_, flag, facts = f.metadata["row"]
        rows.append(Setting(f.name, type_, example, help_, flag=flag(f.name) if flag else None, **facts))
    return tuple(rows)


SETTINGS: tuple[Setting, ...] = _rows()
BY_KEY: Mapping[str, Setting] = {s.key: s for s in SETTINGS}
DEFAULTS: Mapping[str, Any] = {s.key: s.default for s in SETTINGS if s.always}
FLAG_RULES: tuple[FlagRule, ...] = tuple(sorted((s.flag for s in SETTINGS if s.flag), key=lambda r: r.position))
ID_PARTS: tuple[IdPart, ...] = tuple(sorted((s.id for s in SETTINGS if s.id), key=lambda part: part.position))
MAXIMUM: Mapping[str, int] = {s.key: s.maximum for s in SETTINGS if s.maximum is not None}
# Resolved fields that no row sets but that decide what is served (SGLang derives them).
RESOLVED_BEYOND_ROWS = ("chunked_prefill_size", "max_running_requests")
RESOLVED_FIELDS: tuple[str, ...] = (*(name for s in SETTINGS for name in s.resolved), *RESOLVED_BEYOND_ROWS)
SUMMARIES: tuple[tuple[str, Summary], ...] = tuple(sorted(((s.key, s.summary) for s in SETTINGS if s.summary),
                                                          key=lambda item: item[1].position))


def launch_args(config: Config) -> list[str]:
    """The launch_server arguments the settings of one cell say, in argv order."""
    return [arg for flag_rule in FLAG_RULES for arg in flag_rule.render(config)]


def summary_items(config: Config) -> list[str]:
    """The report's one-line summary of a config, setting by setting."""
    return [summary.format.format(config[key]) for key, summary in SUMMARIES
            if config.get(key) is not None and config[key] not in summary.hidden]


# Environment a config value implies: (applies?, variables).
DERIVED_ENV: tuple[tuple[Callable[[Config], bool], Mapping[str, str]], ...] = (
    # CP v2 was switched on by this variable before 0.5.23; 0.5.23 only warns that it is
    # deprecated (environ._DEPRECATED_ENVS), so one command line serves both.
    (lambda c: c["cp"] > 1, {"SGLANG_ENABLE_CP_V2": "1"}),
)


def launch_env(config: Config) -> dict[str, str]:
    return {name: value for applies, variables in DERIVED_ENV if applies(config) for name, value in variables.items()}
