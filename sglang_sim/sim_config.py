"""What the simulator does beyond SGLang, read once from ``DSPARK_SIM_*`` environment variables.

Never from flags: the simulator takes exactly SGLang's argv (CONTRACT.md). Every knob is listed
in ``KNOBS`` with its default; ``SimConfig.from_env`` is the only reader of the environment.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

from dspark_ci.ground.sglang.release import DEFAULT_VERSION
from packaging.version import InvalidVersion, Version


class SimConfigError(ValueError):
    """A ``DSPARK_SIM_*`` variable has a value the simulator cannot use (exit code 2)."""


@dataclass(frozen=True)
class Faults:
    """Injected failures (``DSPARK_SIM_FAULTS``), each named in CONTRACT.md."""

    accept_collapse: bool = False  # no draft token is ever accepted
    boot_reject: str | None = None  # exit at start with "ValueError: <message>"
    crash_first_prefill: bool = False  # healthy until the first real request, then AssertionError + exit
    hang_boot: bool = False  # never becomes healthy
    garbage_output: bool = False  # random text, no parseable answer
    slow_decode: float = 1.0  # every decode step takes this many times longer
    decode_sleep: float = 0.0  # ms: every decode step also blocks the server this long (time.sleep: no CPU used)
    rank_exit: tuple[int, float] | None = None  # (node rank, seconds after start)
    malformed_stream: bool = False  # streamed responses break off mid-event
    crash_once: str | None = None  # crash_first_prefill unless this file exists; creates it (fails once, then serves)
    position_regression: int | None = None  # draft positions >= this accept half as often; earlier ones make up
    accept_drift: int | None = None  # after this many requests, every draft is accepted less often (EPLB-like)
    lossy_sampling: bool = False  # at temperature > 0 speculation skews samples toward the greedy text
    greedy_verify: float | None = None  # at temperature > 0 each token after the first is greedy with this chance
    spec_ignores_top_p: bool = False  # a speculative server samples as if top_p were 1
    envelope_shift: float = 1.0  # verify steps' cost per running request past the knee, times this
    pd_transfer_fail: bool = False  # a prefill's bootstrap server fails every transfer (decode answers 500)
    pd_random_hidden: bool = False  # a prefill hands decode random hidden states (acceptance drops, text holds)
    pd_prefill_stall: bool = False  # a prefill never finishes a routed request
    nonstream_garbage: bool = False  # non-streamed replies carry random letters (streams stay right)
    nonstream_empty: bool = False  # non-streamed replies carry no text (streams stay right)
    usage_doubled: bool = False  # non-streamed usage counts twice the completion tokens
    category_regression: str | None = None  # drafts on this prompt category accept less often (others unchanged)
    parity_tie_flip: bool = False  # greedy speculation takes a runner-up tied with the argmax (sglang_sim/logprobs.py)
    parity_mismatch: bool = False  # greedy speculation takes a runner-up well below the argmax
    tp_numerics: bool = False  # at tp > 1 greedy output takes a runner-up well below the argmax (an all-reduce skipped)
    garbled_logprobs: bool = False  # prompt logprobs unrelated to the text: log-likelihood MC falls to chance

    @property
    def names(self) -> list[str]:
        defaults = Faults()
        return [name for name in FAULT_PARSERS if getattr(self, name) != getattr(defaults, name)]


def _flag(name: str) -> Callable[[str | None], dict]:
    def parse(value: str | None) -> dict:
        if value is not None:
            raise SimConfigError(f"fault {name!r} takes no value (got {name}={value})")
        return {name: True}
    return parse


def _boot_reject(value: str | None) -> dict:
    if not value:
        raise SimConfigError("fault 'boot_reject' needs a message: boot_reject=MESSAGE")
    return {"boot_reject": value}


def _slow_decode(value: str | None) -> dict:
    factor = _number("slow_decode", value or "", minimum=0.0)
    if factor <= 0:
        raise SimConfigError(f"fault 'slow_decode' needs a factor > 0: slow_decode=FACTOR (got {value!r})")
    return {"slow_decode": factor}


def _crash_once(value: str | None) -> dict:
    if not value:
        raise SimConfigError("fault 'crash_once' needs a marker file: crash_once=PATH")
    return {"crash_once": value}


def _rank_exit(value: str | None) -> dict:
    rank, sep, seconds = (value or "").partition(":")
    if not sep or not rank.strip().isdigit():
        raise SimConfigError(f"fault 'rank_exit' needs RANK:SECONDS, e.g. rank_exit=1:5 (got {value!r})")
    return {"rank_exit": (int(rank), _number("rank_exit", seconds, minimum=0.0))}


def _count_fault(name: str, least: int) -> Callable[[str | None], dict]:
    def parse(value: str | None) -> dict:
        if not (value or "").strip().isdigit() or int(value or 0) < least:
            raise SimConfigError(f"fault {name!r} needs a whole number >= {least}: {name}=N (got {value!r})")
        return {name: int(value or 0)}
    return parse


def _greedy_verify(value: str | None) -> dict:
    share = _number("greedy_verify", value or "", minimum=0.0, maximum=1.0)
    if share <= 0:
        raise SimConfigError(f"fault 'greedy_verify' needs a share in (0, 1]: greedy_verify=SHARE (got {value!r})")
    return {"greedy_verify": share}


def _category_regression(value: str | None) -> dict:
    from dspark_ci.sglang_sim.speculation import CATEGORIES

    if value not in CATEGORIES:
        raise SimConfigError(f"fault 'category_regression' needs a category the simulated draft tells apart: "
                             f"category_regression={{{','.join(CATEGORIES)}}} (got {value!r})")
    return {"category_regression": value}


# fault name -> parser of its optional "=VALUE" part, returning the Faults fields it sets
FAULT_PARSERS: dict[str, Callable[[str | None], dict]] = {
    "accept_collapse": _flag("accept_collapse"),
    "boot_reject": _boot_reject,
    "crash_first_prefill": _flag("crash_first_prefill"),
    "hang_boot": _flag("hang_boot"),
    "garbage_output": _flag("garbage_output"),
    "garbled_logprobs": _flag("garbled_logprobs"),
    "slow_decode": _slow_decode,
    "decode_sleep": lambda value: {"decode_sleep": _number("decode_sleep", value or "", minimum=0.0)},
    "rank_exit": _rank_exit,
    "malformed_stream": _flag("malformed_stream"),
    "crash_once": _crash_once,
    "position_regression": _count_fault("position_regression", 2),
    "accept_drift": _count_fault("accept_drift", 0),
    "lossy_sampling": _flag("lossy_sampling"),
    "greedy_verify": _greedy_verify,
    "spec_ignores_top_p": _flag("spec_ignores_top_p"),
    "envelope_shift": lambda value: {"envelope_shift": _number("envelope_shift", value or "", minimum=1.0)},
    "pd_transfer_fail": _flag("pd_transfer_fail"),
    "pd_random_hidden": _flag("pd_random_hidden"),
    "pd_prefill_stall": _flag("pd_prefill_stall"),
    "nonstream_garbage": _flag("nonstream_garbage"),
    "nonstream_empty": _flag("nonstream_empty"),
    "usage_doubled": _flag("usage_doubled"),
    "category_regression": _category_regression,
    "parity_tie_flip": _flag("parity_tie_flip"),
    "parity_mismatch": _flag("parity_mismatch"),
    "tp_numerics": _flag("tp_numerics"),
}


# fault -> (how it is written, what it does), for `dspark-ci sim --help`
FAULT_HELP: dict[str, tuple[str, str]] = {
    "accept_collapse": ("accept_collapse", "serves normally, but no draft token is ever accepted (accept length 1.0)"),
    "boot_reject": ("boot_reject=MESSAGE", "exits at start with `ValueError: MESSAGE`, as SGLang does for an "
                                           "inadmissible config"),
    "crash_first_prefill": ("crash_first_prefill", "healthy until the first real request, then an AssertionError "
                                                   "and exit"),
    "hang_boot": ("hang_boot", "never becomes healthy"),
    "garbage_output": ("garbage_output", "serves random text (answers unparseable or wrong)"),
    "slow_decode": ("slow_decode=FACTOR", "every decode step takes FACTOR times longer"),
    "decode_sleep": ("decode_sleep=MS", "every decode step also blocks the server's process MS ms (time.sleep, no "
                                        "CPU used: a sleep, lock or sync planted in the decode step)"),
    "rank_exit": ("rank_exit=RANK:SECONDS", "node rank RANK exits SECONDS after start"),
    "malformed_stream": ("malformed_stream", "a streamed response breaks off mid-event"),
    "crash_once": ("crash_once=PATH", "as crash_first_prefill unless PATH exists, which it creates: the first boot "
                                      "crashes, later ones serve (a flaky cell)"),
    "position_regression": ("position_regression=K", "draft positions >= K accept half as often, earlier ones more, "
                                                     "so the mean accept length stays (a per-position regression)"),
    "accept_drift": ("accept_drift=N", "after N requests every draft position accepts 0.6 times as often (an "
                                       "EPLB-like step down mid-run)"),
    "envelope_shift": ("envelope_shift=FACTOR", "a verify step's cost per running request past 8 grows FACTOR times "
                                                "faster: speculation stops paying at a lower concurrency"),
    "lossy_sampling": ("lossy_sampling", "at temperature > 0, half the samples of a speculative server follow the "
                                         "greedy text (a draft sampler ignoring temperature); greedy output stays "
                                         "exact"),
    "greedy_verify": ("greedy_verify=SHARE", "at temperature > 0 a speculative server's tokens after the first are "
                                             "the greedy text's with probability SHARE (drafts verified by argmax, "
                                             "not by rejection sampling); the first token and greedy output stay "
                                             "exact"),
    "spec_ignores_top_p": ("spec_ignores_top_p", "a speculative server's sampler ignores top_p (as one fork's "
                                                 "speculative path did): top_p near 0 still samples; "
                                                 "greedy stays exact"),
    "pd_transfer_fail": ("pd_transfer_fail", "PD prefill: every KV/hidden-state transfer fails (decode answers 500)"),
    "pd_random_hidden": ("pd_random_hidden", "PD prefill: hands decode random hidden states (sglang#7242): "
                                             "acceptance drops, text and health hold"),
    "pd_prefill_stall": ("pd_prefill_stall", "PD prefill: never finishes a routed request"),
    "nonstream_garbage": ("nonstream_garbage", "non-streamed replies (chat, completions, /generate) carry random "
                                               "letters, streamed ones stay right"),
    "nonstream_empty": ("nonstream_empty", "non-streamed replies carry no text, streamed ones stay right"),
    "usage_doubled": ("usage_doubled", "non-streamed usage counts twice the completion tokens (and still adds up)"),
    "category_regression": ("category_regression=CATEGORY", "drafts on prompts of CATEGORY (code, math, long_context "
                                                            "or other) accept 0.6 times as often; other categories "
                                                            "keep theirs"),
    "parity_tie_flip": ("parity_tie_flip", "the model's two best tokens at the 4th greedy position carry the same "
                                           "logprob, and a speculative server takes the second: a tie flip"),
    "parity_mismatch": ("parity_mismatch", "a speculative server's 4th greedy token is the model's second best, "
                                           "0.25 or more below the best: a real parity mismatch"),
    "tp_numerics": ("tp_numerics", "at tp > 1 the 4th greedy token is the model's second best, 0.25 or more below "
                                   "(an all-reduce skipped): every rank healthy, parity against one rank fails"),
}


def parse_faults(text: str) -> Faults:
    """``"accept_collapse,slow_decode=3,boot_reject=a, b"`` -> Faults.

    A comma starts a new fault only when a known fault name follows, so a boot_reject
    message may itself contain commas (SGLang's messages often do).
    """
    pieces: list[str] = []
    for piece in text.split(","):
        name = piece.split("=", 1)[0].strip()
        if pieces and name not in FAULT_PARSERS:
            pieces[-1] += "," + piece
        else:
            pieces.append(piece)
    updates: dict = {}
    for piece in pieces:
        name, sep, value = piece.strip().partition("=")
        if not name:
            continue
        if name not in FAULT_PARSERS:
            raise SimConfigError(f"unknown fault {name!r}; known: {', '.join(FAULT_PARSERS)}")
        updates.update(FAULT_PARSERS[name](value if sep else None))
    return replace(Faults(), **updates)


def _number(name: str, text: str, minimum: float | None = None, maximum: float | None = None) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SimConfigError(f"{name}={text!r}: expected a number") from None
    if (not math.isfinite(value) or (minimum is not None and value < minimum)
            or (maximum is not None and value > maximum)):
        bounds = f"[{minimum if minimum is not None else '-inf'}, {maximum if maximum is not None else 'inf'}]"
        raise SimConfigError(f"{name}={text!r}: expected a finite number in {bounds}")
    return value


@dataclass(frozen=True)
class Knob:
    env: str
    default: str
    help: str
    parse: Callable[[str, str], object]  # (env name, text) -> value


def _probability(env: str, text: str) -> float:
    return _number(env, text, 0.0, 1.0)


def _non_negative(env: str, text: str) -> float:
    return _number(env, text, minimum=0.0)


def _converting(convert: Callable[[str], object], error: type[Exception],
                expected: str) -> Callable[[str, str], object]:
    """A knob parser: ``convert(text)``, its ``error`` one SimConfigError naming the variable and what it expects."""
    def parse(env: str, text: str):
        try:
            return convert(text)
        except error:
            raise SimConfigError(f"{env}={text!r}: expected {expected}") from None
    return parse


def _optional(parse: Callable[[str, str], object]) -> Callable[[str, str], object]:
    """``parse``, or None for an empty value."""
    return lambda env, text: parse(env, text) if text else None


_integer = _converting(int, ValueError, "an integer")
_optional_integer = _optional(_integer)


def _shards(env: str, text: str) -> int | None:
    """A positive count, or ``auto`` (None): as many shards as DP ranks, at most one per usable core."""
    if text == "auto":
        return None
    count = cast(int, _integer(env, text))
    if count < 1:
        raise SimConfigError(f"{env}={text!r}: expected a count >= 1 or auto")
    return count
_version = _converting(Version, InvalidVersion, "a PEP 440 version, e.g. 0.5.24")
_optional_version = _optional(_version)


def _optional_path(env: str, text: str) -> Path | None:
    return Path(text).expanduser() if text else None


def _optional_text(env: str, text: str) -> str | None:
    return text or None


# Regression effects that set a knob rather than inject a fault: name -> (SimConfig field, parser)
SETTING_EFFECTS: dict[str, Callable[[str, str], object]] = {"accept_prob": _probability, "gpqa_accuracy": _probability,
                                                             "mc_accuracy": _probability}


@dataclass(frozen=True)
class Regression:
    """Planted at ``since``: from that version on, ``faults`` are injected and ``settings`` override knobs."""

    since: Version
    faults: Faults
    settings: Mapping[str, Any]

    def applies_to(self, version: Version | None) -> bool:
        return (version or Version(DEFAULT_VERSION)) >= self.since

    def applied(self, config: SimConfig) -> SimConfig:
        if not self.applies_to(config.version):
            return config
        merged = {name: getattr(self.faults, name) for name in self.faults.names}
        return replace(config, faults=replace(config.faults, **merged), **self.settings)


def _regression(env: str, text: str) -> Regression | None:
    if not text:
        return None
    since, sep, effects = text.partition(":")
    if not sep or not effects.strip():
        raise SimConfigError(f"{env}={text!r}: expected FROM_VERSION:EFFECT[,EFFECT...], e.g. 0.5.30:slow_decode=1.05")
    settings, fault_text = {}, []
    for effect in effects.split(","):
        name, _, value = effect.strip().partition("=")
        if name in SETTING_EFFECTS:
            settings[name] = SETTING_EFFECTS[name](f"{env} {name}", value)
        else:
            fault_text.append(effect)
    return Regression(cast(Version, _version(env, since.strip())), _faults(env, ",".join(fault_text)), settings)


def _faults(env: str, text: str) -> Faults:
    try:
        return parse_faults(text)
    except SimConfigError as err:
        raise SimConfigError(f"{env}: {err}") from None


def _category_factors(env: str, text: str) -> Mapping[str, float]:
    factors = {}
    for piece in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = piece.partition("=")
        if not sep:
            raise SimConfigError(f"{env}={text!r}: expected CATEGORY=FACTOR[,...], e.g. code=1.2,math=1.1")
        factors[name.strip()] = _number(f"{env} {name.strip()}", value, minimum=0.0)
    return MappingProxyType(factors)


# SimConfig field -> its environment variable, default (as the text a user would set) and meaning
KNOBS: dict[str, Knob] = {
    "accept_prob": Knob("DSPARK_SIM_ACCEPT_PROB", "0.7",
                        "alpha: probability that each draft token is accepted, given the previous one was",
                        _probability),
    "accept_decay": Knob("DSPARK_SIM_ACCEPT_DECAY", "1",
                         "factor on alpha per draft position deeper into the block (alpha_k = alpha·decay^(k-1))",
                         _probability),
    "category_accept": Knob("DSPARK_SIM_CATEGORY_ACCEPT", "code=1.1,math=1.05,long_context=0.8",
                            "factor on alpha per prompt category (sglang_sim/speculation.py: code and math by marker "
                            "words, long_context by length); empty: every category alike", _category_factors),
    "spec_batch_cost": Knob("DSPARK_SIM_SPEC_BATCH_COST", "0.05",
                            "a verify step's extra time, as a fraction of a decode step, per running request past 8 "
                            "(at alpha 0.7, gamma 7 speculation stops paying near 50 running requests)", _non_negative),
    "spec_context_cost": Knob("DSPARK_SIM_SPEC_CONTEXT_COST", "0.15",
                              "a verify step's extra time, as a fraction of a decode step, per 1024 context tokens "
                              "past 2048", _non_negative),
    "boot_seconds": Knob("DSPARK_SIM_BOOT_SECONDS", "2",
                         "seconds from start until /health answers 200", _non_negative),
    "prefill_ms_per_token": Knob("DSPARK_SIM_PREFILL_MS_PER_TOKEN", "0.05",
                                 "prefill time per prompt token (time to first token)", _non_negative),
    "decode_step_ms": Knob("DSPARK_SIM_DECODE_STEP_MS", "20",
                           "one decode (verify) step; it emits accepted+1 tokens under speculation",
                           _non_negative),
    "gpqa_accuracy": Knob("DSPARK_SIM_GPQA_ACCURACY", "0.7",
                          "probability of answering a GPQA question right (fixed per question and seed)",
                          _probability),
    "gpqa_path": Knob("DSPARK_SIM_GPQA_PATH", "",
                      "gpqa_diamond.csv used to recognise GPQA prompts and their right answers", _optional_path),
    "mc_accuracy": Knob("DSPARK_SIM_MC_ACCURACY", "0.7",
                        "share of multiple-choice items (DSPARK_SIM_MC_PATH) whose right continuation the prompt "
                        "logprobs favour (fixed per item and seed)", _probability),
    "mc_path": Knob("DSPARK_SIM_MC_PATH", "",
                    "mc_countries.json-style items whose contexts and right continuations /generate's prompt "
                    "logprobs know (sglang_sim/mc_logprobs.py)", _optional_path),
    "seed": Knob("DSPARK_SIM_SEED", "0", "seed of every random choice (text, acceptance, answers)", _integer),
    "faults": Knob("DSPARK_SIM_FAULTS", "", "comma-separated faults (CONTRACT.md)", _faults),
    "join_timeout_seconds": Knob("DSPARK_SIM_JOIN_TIMEOUT_SECONDS", "120",
                                 "how long node ranks >= 1 keep trying to reach rank 0", _non_negative),
    "architecture": Knob("DSPARK_SIM_ARCHITECTURE", "",
                         "model architecture to pretend (default: guessed from --model-path)", _optional_text),
    "version": Knob("DSPARK_SIM_VERSION", "",
                    f"the SGLang version the simulator pretends to be (default {DEFAULT_VERSION}; `dspark-ci run "
                    "--sglang-version V` sets it); a planted regression applies from a version on", _optional_version),
    "regression": Knob("DSPARK_SIM_REGRESSION", "",
                       "a regression planted at a version: FROM_VERSION:EFFECT[,EFFECT...]; effects are faults "
                       "(slow_decode=1.05, crash_first_prefill, ...) or accept_prob=X / gpqa_accuracy=X, applied when "
                       "DSPARK_SIM_VERSION >= FROM_VERSION", _regression),
    # The noise model (sglang_sim/noise.py): all 0 keeps the simulator deterministic, as it always was.
    "step_jitter_boot": Knob("DSPARK_SIM_STEP_JITTER_BOOT", "0",
                             "per-boot σ (log scale) of the decode step time: run-to-run noise of TPOT/throughput",
                             _non_negative),
    "step_jitter_request": Knob("DSPARK_SIM_STEP_JITTER_REQUEST", "0",
                                "per-request σ (log scale) of the decode step time, on top of the boot's",
                                _non_negative),
    "accept_drift_boot": Knob("DSPARK_SIM_ACCEPT_DRIFT_BOOT", "0",
                              "per-boot σ of a shift of the accept probability (clipped to [0, 1])", _non_negative),
    "gpqa_concentration": Knob("DSPARK_SIM_GPQA_CONCENTRATION", "0",
                               "0: each GPQA question's answer is fixed per seed; c > 0: each question has its own "
                               "probability Beta(c·accuracy, c·(1-accuracy)) and every sample is drawn with it",
                               _non_negative),
    "boot_seed": Knob("DSPARK_SIM_BOOT_SEED", "",
                      "seed of the per-boot draws above (unset: a fresh seed every boot)", _optional_integer),
    "emission_log": Knob("DSPARK_SIM_EMISSION_LOG", "",
                         "file to append one JSON line to per finished request: token counts and the monotonic "
                         "and wall-clock times of its arrival, first and last token (node rank 0 only)",
                         _optional_path),
    # One process (the default) round-robins every request over the DP ranks exactly as SGLang's DP controller
    # does, and paces ~8,000-13,000 chunks/s on a core (BENCHMARKS.md: 256 streams at 20 ms steps). More shards pace
    # more streams but spread requests by connection (sglang_sim/engine_shards.py), so they are asked for, not guessed.
    "shards": Knob("DSPARK_SIM_SHARDS", "1",
                   "engine processes behind the one port, each scheduling its share of the DP ranks (N <= DP ranks; "
                   "auto: min(DP ranks, usable cores)); more than 1 for more streams than one core paces (about 256 "
                   "at 20 ms steps); not with --nnodes > 1 or PD disaggregation", _shards),
}


@dataclass(frozen=True)
class SimConfig:
    accept_prob: float = 0.7
    accept_decay: float = 1.0
    category_accept: Mapping[str, float] = field(default_factory=lambda: MappingProxyType(
        {"code": 1.1, "math": 1.05, "long_context": 0.8}))
    spec_batch_cost: float = 0.05
    spec_context_cost: float = 0.15
    boot_seconds: float = 2.0
    prefill_ms_per_token: float = 0.05
    decode_step_ms: float = 20.0
    gpqa_accuracy: float = 0.7
    gpqa_path: Path | None = None
    mc_accuracy: float = 0.7
    mc_path: Path | None = None
    seed: int = 0
    faults: Faults = field(default_factory=Faults)
    join_timeout_seconds: float = 120.0
    architecture: str | None = None
    version: Version | None = None  # None: the release's own
    regression: Regression | None = None
    emission_log: Path | None = None
    step_jitter_boot: float = 0.0
    step_jitter_request: float = 0.0
    accept_drift_boot: float = 0.0
    gpqa_concentration: float = 0.0
    boot_seed: int | None = None
    shards: int | None = 1  # None: auto

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> SimConfig:
        values: dict[str, Any] = {name: knob.parse(knob.env, environ.get(knob.env, knob.default).strip())
                  for name, knob in KNOBS.items()}
        config = cls(**values)
        return _category_regressed(config.regression.applied(config) if config.regression else config)


def _category_regressed(config: SimConfig) -> SimConfig:
    """Fault category_regression folded into the per-category factors on alpha the acceptance model reads."""
    from dspark_ci.sglang_sim.speculation import CATEGORY_REGRESSION_ACCEPT

    category = config.faults.category_regression
    if category is None:
        return config
    factor = config.category_accept.get(category, 1.0) * CATEGORY_REGRESSION_ACCEPT
    factors = {**config.category_accept, category: factor}
    return replace(config, category_accept=MappingProxyType(factors))
