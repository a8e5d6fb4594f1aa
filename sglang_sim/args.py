"""SGLang's launch argv -> a typed, immutable record of the fields the simulator acts on.

Parsing uses the snapshot of SGLang's own flags (``dspark_ci.ground.sglang.flags``), so an unknown flag
is an argparse error with exit code 2, exactly as with ``python3 -m sglang.launch_server``.
The snapshot stores values as text; ``ServerArgs`` declares the type and SGLang default of each
field the simulator reads (defaults copied from ``sglang/srt/arg_groups/fields/*.py``), and
``FIELD_TYPES`` is derived from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from dspark_ci.ground.sglang.flags import load_flags
from dspark_ci.ground.sglang.release import DEFAULT_VERSION

SGLANG_VERSION = DEFAULT_VERSION  # the flag snapshot the simulator parses with


def _bool(value: Any) -> bool:
    return bool(value)


@dataclass(frozen=True)
class ServerArgs:
    """The launch configuration as SGLang would hold it while resolving (see ``admission``)."""

    model_path: str
    served_model_name: str | None = None
    tokenizer_path: str | None = None
    revision: str | None = None
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    device: str | None = None
    random_seed: int | None = None
    log_level: str = "info"
    context_length: int | None = None
    tp_size: int = 1
    dp_size: int = 1
    attn_dp_size: int = 1
    attn_cp_size: int = 1
    pp_size: int = 1
    ep_size: int = 1
    dcp_size: int = 1
    moe_dense_tp_size: int | None = None
    enable_dp_attention: bool = False
    enable_dp_lm_head: bool = False
    moe_a2a_backend: str = "none"
    enable_prefill_cp: bool = False
    cp_strategy: str | None = None
    enable_encoder_swa_bounded_replay: bool = False
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None
    dist_timeout: int | None = None
    disaggregation_mode: str = "null"
    max_running_requests: int | None = None
    decode_log_interval: int = 40
    enable_metrics: bool = False
    skip_server_warmup: bool = False  # fields/serving.py: no startup /generate before /health says 200
    reasoning_parser: str | None = None
    stream_response_default_include_usage: bool = False
    enable_cache_report: bool = False
    return_input_ids: bool = False  # sglext.input_ids on every chat completion (fields/serving.py)
    return_output_ids: bool = False  # sglext.output_ids on every chat completion
    trust_remote_code: bool = False
    speculative_algorithm: str | None = None
    speculative_draft_model_path: str | None = None
    speculative_draft_model_revision: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    speculative_dspark_block_size: int | None = None
    speculative_dflash_block_size: int | None = None
    speculative_moe_a2a_backend: str | None = None
    speculative_ngram_max_bfs_breadth: int = 10
    enable_multi_layer_eagle: bool = False
    # every other flag as given on the command line (text), for /server_info
    other_flags: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "other_flags", MappingProxyType(dict(self.other_flags)))

    @property
    def model_name(self) -> str:
        """What /v1/models and the OpenAI responses call the model."""
        return self.served_model_name or self.model_path

    @property
    def num_dp_ranks(self) -> int:
        """Scheduler DP ranks: DP replicas times attention-DP groups (each answers /server_info's internal state)."""
        return max(1, self.dp_size * self.attn_dp_size)

    @property
    def launch_command(self) -> str:
        """/server_info's launch_command: the flags as given (server_args.launch_command), the API key hidden."""
        words = []
        for name, value in (*((f.name, getattr(self, f.name)) for f in dataclasses.fields(self)
                              if f.name != "other_flags"), *self.other_flags.items()):
            spec = FIELD_TYPES.get(name)
            if value is None or value is False or (spec is not None and value == spec[1] and name != "model_path"):
                continue
            flag = "--" + name.replace("_", "-")
            words += [flag] if value is True else [flag, "<redacted>" if name == "api_key" else str(value)]
        return " ".join(words)

    @property
    def platform_is_npu(self) -> bool:
        return (self.device or "").startswith("npu")

    def describe(self) -> str:
        """The launch line for the log: typed fields, plus the other flags that were given."""
        given = {name: value for name, value in self.other_flags.items() if value is not None}
        typed = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                          if f.name != "other_flags")
        return f"ServerArgs({typed}, other_flags={given!r})"

    def to_dict(self) -> dict:
        """Every SGLang field the command line could set, as /server_info reports it."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "other_flags"}
        return {**dict(self.other_flags), **values}


# How the snapshot's text becomes each field's type, read off the dataclass's annotations.
_CONVERTERS: Mapping[str, Callable[[Any], Any]] = {"str": str, "int": int, "bool": _bool}


def _field_types() -> Mapping[str, tuple[Callable[[Any], Any], Any]]:
    """SGLang field -> (converter of the parsed text, SGLang's default), from ``ServerArgs`` itself."""
    types = {}
    for spec in dataclasses.fields(ServerArgs):
        if spec.name == "other_flags":
            continue
        base = str(spec.type).split("|")[0].strip()
        types[spec.name] = (_CONVERTERS[base], None if spec.default is dataclasses.MISSING else spec.default)
    return MappingProxyType(types)


FIELD_TYPES = _field_types()


USAGE = (f"%(prog)s --model-path PATH [SGLang {SGLANG_VERSION} launch_server flags ...]  "
         "(`dspark-ci sim --help` lists them)")


def argument_parser() -> argparse.ArgumentParser:
    parser = load_flags(SGLANG_VERSION).argument_parser(prog="sglang serve")
    parser.usage = USAGE  # one line: SGLang's own usage lists every flag (hundreds of lines)
    parser.error = lambda message: _short_error(parser, message)  # type: ignore[method-assign, assignment, return-value]
    return parser


def _short_error(parser: argparse.ArgumentParser, message: str) -> None:
    """argparse's error line exactly as SGLang's parser prints it (``sglang serve: error: ...``, exit 2), after a
    one-line usage instead of its 36 kB one. No "did you mean": real SGLang gives none, and a launcher's log must
    read as SGLang's would; the hint for a mistyped flag belongs to ``dspark-ci plan`` (matrices' extra_args)."""
    parser.print_usage(sys.stderr)
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def sim_help(width: int = 100) -> str:
    """`dspark-ci sim --help`: the simulator's own knobs and faults first, SGLang's flags after, by name."""
    from dspark_ci.sglang_sim.sim_config import FAULT_HELP, KNOBS  # the knobs live with their parsers

    def rows(pairs: list[tuple[str, str]]) -> list[str]:
        left = max(len(name) for name, _ in pairs) + 2
        return [textwrap.fill(meaning, width, initial_indent=f"  {name:<{left}}", subsequent_indent=" " * (left + 2))
                for name, meaning in pairs]

    flags = sorted({flag.name for flag in load_flags(SGLANG_VERSION).canonical()})
    lines = [
        f"usage: dspark-ci sim --model-path PATH [SGLang {SGLANG_VERSION} launch_server flags ...]",
        "",
        textwrap.fill(f"The simulated SGLang server. It takes exactly the flags of `python3 -m sglang.launch_server` "
                      f"(SGLang {SGLANG_VERSION}), so a cell's command line runs unchanged against either; what it "
                      "simulates (latency, acceptance, accuracy, faults) comes from DSPARK_SIM_* environment "
                      "variables, never from flags. Also `python -m dspark_ci.sglang_sim`.", width),
        "",
        "environment (default):",
        *rows([(f"{knob.env} ({knob.default or 'unset'})", knob.help) for knob in KNOBS.values()]),
        "",
        "faults, comma-separated in DSPARK_SIM_FAULTS:",
        *rows(list(FAULT_HELP.values())),
        "",
        "example:",
        "  DSPARK_SIM_FAULTS=slow_decode=3 dspark-ci sim --model-path m --port 30000 \\",
        "      --speculative-algorithm DSPARK --speculative-draft-model-path d --speculative-dspark-block-size 7",
        "",
        "exit codes: 2 a flag SGLang refuses or an unusable DSPARK_SIM_* value; 1 a launch SGLang rejects, a busy "
        "port or a crash (the last stderr line is SGLang's error line); 0 after SIGTERM/SIGINT.",
        "",
        f"SGLang {SGLANG_VERSION} launch_server flags ({len(flags)}; meanings and defaults in "
        "`python3 -m sglang.launch_server --help`):",
        textwrap.fill(" ".join(flags), width, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False),
    ]
    return "\n".join(lines) + "\n"


def parse_server_args(argv: list[str]) -> ServerArgs:
    """Parse like SGLang: argparse errors (unknown flag, bad int, missing --model-path) exit 2."""
    if "-h" in argv or "--help" in argv:
        sys.stdout.write(sim_help())
        raise SystemExit(0)
    parser = argument_parser()
    namespace = vars(parser.parse_args(argv))
    if namespace.get("model_path") is None:
        parser.error("the following arguments are required: --model-path/--model")
    typed: dict = {}
    for name, (convert, default) in FIELD_TYPES.items():
        raw = namespace.pop(name, None)
        typed[name] = default if raw is None else _convert(parser, name, convert, raw)
    other = {name: value for name, value in namespace.items()}
    return ServerArgs(**typed, other_flags=other)


def _convert(parser: argparse.ArgumentParser, name: str, convert: Callable, raw: Any) -> Any:
    try:
        return convert(raw)
    except ValueError:
        # argparse's own wording, as SGLang's typed parser would print it
        spellings = next("/".join(a.option_strings) for a in parser._actions if a.dest == name)
        parser.error(f"argument {spellings}: invalid {convert.__name__} value: {raw!r}")
