"""Baseline files: reference values per cell and metric, and how far a new run may stray from them.

Format (documented for users in baselines/README.md)::

    schema: 1
    description: nightly H200 numbers      # optional, free text
    source: runs/2025-06-01-nightly         # optional, where the numbers came from
    cells:
      CELL-ID-OR-GLOB:
        METRIC: {value: 3.1, min_ratio: 0.95}      # accept_length >= 0.95 x 3.1
        METRIC: {min: 1.5}                         # absolute floor
        gpqa_accuracy: {value: 0.62, stderr: 0.034, max_drop_stderr: 2}
        tpot_ms_median: {value: 6.8, max_ratio: 1.05, noise: 0.004}  # noise: measured run-to-run sd / value
        # statistical gates: runs behind `noise`, its per-request part, GPQA's tolerance and per-question record
        output_throughput_tok_s: {value: 528, min_ratio: 0.97, noise: 0.01, runs: 8, request_noise: 0.002}
        gpqa_accuracy: {value: 0.7, stderr: 0.03, max_drop_stderr: 2, max_drop: 0.02, per_question: smoke.gpqa.json}
        # the regression a statistical gate's pass rules out (default: twice the tolerance)
        output_throughput_tok_s: {value: 528, min_ratio: 0.97, detect: 0.05, noise: 0.01, runs: 20}

Every mistake is a ``BadInput`` with ``file:line``. Gates that sampling noise alone would trip
are accepted but reported in ``Baseline.warnings``.
"""

from __future__ import annotations

import difflib
import fnmatch
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import yaml
from dspark_ci.ground.errors import BadInput
from dspark_ci.ground.stats import DETECT_FACTOR, RESOLUTION
from dspark_ci.ground.yaml_lines import FileWords, compose_file, describe, mapping_items, scalar, where
from dspark_ci.reports.metrics import HIGHER, LOWER, METRICS, NEUTRAL, NOISE_STDERRS, PAIRED_STDERR_OF, STDERR_OF

SCHEMA = 1
# A ratio gate is never tighter than this many run-to-run standard deviations (the baseline's `noise`):
# three leave about one false alarm in 700 runs for a normally distributed metric.
NOISE_RUN_SDS = 3.0
DEFAULT_GPQA_DROP = 0.02  # GPQA's tolerance (absolute) when the baseline states no `max_drop`
TOP_LEVEL_KEYS = ("schema", "description", "source", "cells")
GATE_KEYS = ("min", "max", "min_ratio", "max_ratio", "max_drop_stderr")
# key -> (lowest allowed value, whether the lowest is allowed itself)
SPEC_KEYS = {"value": (-math.inf, True), "stderr": (0.0, True), "min": (-math.inf, True), "max": (-math.inf, True),
             "min_ratio": (0.0, False), "max_ratio": (0.0, False), "max_drop_stderr": (0.0, False),
             "noise": (0.0, True), "runs": (1.0, True), "request_noise": (0.0, True), "max_drop": (0.0, True),
             "detect": (0.0, False), "drift": (0.0, True)}
# Not a number: a JSON file beside the baseline, {question id: mean score} (`baseline record` writes it).
PER_QUESTION_KEY = "per_question"
# Not a number: `true` on the boundary where speculation pays makes it a statistical gate that the boundary does not
# move inward: every sweep point at or below `value` must not be shown to stop paying (reports/gates.py).
NEVER_INWARD_KEY = "never_inward"
NEVER_INWARD_METRICS = ("speculation_boundary_concurrency",)
FRACTION_KEYS = ("value", "stderr", "min", "max")  # keys that carry the metric's own unit
# A ratio gate must point the way the metric gets worse, or it would fail on improvements.
RATIO_KEY_FOR = {HIGHER: "min_ratio", LOWER: "max_ratio", NEUTRAL: None}
# How a baseline file that cannot be read or parsed is reported.
BASELINE_FILE = FileWords(
    missing=("no such file", "check the --baseline path"),
    unreadable=("cannot read it ({error})", "check the file's permissions and contents"),
    syntax=("not valid YAML ({either})", "fix the YAML syntax"),
    unplaced=("not valid YAML ({error})", "fix the YAML syntax"),
)


@dataclass(frozen=True)
class MetricSpec:
    """One metric's reference and limits for the cells a baseline entry matches."""

    metric: str
    where: str  # file:line, for messages
    value: float | None = None
    stderr: float | None = None
    min: float | None = None
    max: float | None = None
    min_ratio: float | None = None
    max_ratio: float | None = None
    max_drop_stderr: float | None = None
    noise: float | None = None  # run-to-run standard deviation measured for this cell, as a fraction of value
    runs: float | None = None  # how many boots `noise` and `value` come from
    request_noise: float | None = None  # the part of `noise` one boot's per-request sampling explains (a fraction)
    max_drop: float | None = None  # GPQA's tolerance: the drop (absolute) a statistical gate still passes
    # The regression a statistical gate's pass rules out (a fraction of the value; GPQA: absolute); None: twice the
    # tolerance (dspark_ci.ground.stats.DETECT_FACTOR)
    detect: float | None = None
    per_question: Mapping[str, float] | None = None  # GPQA question id -> mean score, for the paired test
    # The allowance for drift between the baseline's runs and today (one sd, a fraction of the value); None: the
    # stated default (dspark_ci.ground.stats.DEFAULT_DRIFT)
    drift: float | None = None
    never_inward: bool = False  # the envelope gate (NEVER_INWARD_KEY)

    def ratio(self, key: str) -> float:
        """The ratio gate actually applied: the stated ``min_ratio``/``max_ratio``, widened to
        NOISE_RUN_SDS measured run-to-run standard deviations when the measured noise is larger."""
        stated: float | None = getattr(self, key)
        if stated is None:
            raise ValueError(f"{self.where}: {self.metric}: no {key} to apply")
        if not self.noise:
            return stated
        if key == "min_ratio":
            return min(stated, 1 - NOISE_RUN_SDS * self.noise)
        return max(stated, 1 + NOISE_RUN_SDS * self.noise)

    @property
    def tolerance(self) -> float:
        """The stated tolerance as an unsigned size of regression: 1 − min_ratio, max_ratio − 1, or max_drop."""
        for key, size in (("min_ratio", lambda r: 1 - r), ("max_ratio", lambda r: r - 1)):
            if getattr(self, key) is not None:
                return size(getattr(self, key))
        return self.drop_tolerance

    @property
    def drop_tolerance(self) -> float:
        """GPQA's statistical tolerance: ``max_drop``, or DEFAULT_GPQA_DROP when the baseline states none."""
        return self.max_drop if self.max_drop is not None else DEFAULT_GPQA_DROP

    @property
    def reference(self) -> float:
        """``value``, which validation requires of every gate measured against it (ratios, max_drop_stderr)."""
        if self.value is None:
            raise ValueError(f"{self.where}: {self.metric}: this gate needs the reference `value`")
        return self.value

    @property
    def reference_stderr(self) -> float:
        """``stderr``, which validation requires of max_drop_stderr."""
        if self.stderr is None:
            raise ValueError(f"{self.where}: {self.metric}: this gate needs the baseline's `stderr`")
        return self.stderr


@dataclass(frozen=True)
class BaselineEntry:
    pattern: str  # a cell id, or a glob (fnmatch: *, ?, [...])
    where: str
    metrics: Mapping[str, MetricSpec]

    @property
    def is_glob(self) -> bool:
        return any(char in self.pattern for char in "*?[")

    def matches(self, cell_id: str) -> bool:
        return fnmatch.fnmatchcase(cell_id, self.pattern) if self.is_glob else cell_id == self.pattern


@dataclass(frozen=True)
class Baseline:
    path: str
    entries: tuple[BaselineEntry, ...]
    description: str | None = None
    source: str | None = None
    warnings: tuple[str, ...] = ()

    def specs_for(self, cell_id: str) -> dict[str, MetricSpec]:
        """Per metric, the spec that applies: an exact id beats globs; among globs the first in the file."""
        ordered = [e for e in self.entries if not e.is_glob] + [e for e in self.entries if e.is_glob]
        specs: dict[str, MetricSpec] = {}
        for entry in ordered:
            if entry.matches(cell_id):
                for name, spec in entry.metrics.items():
                    specs.setdefault(name, spec)
        return specs

    def unmatched(self, cell_ids) -> list[str]:
        """Entries that match none of ``cell_ids`` (usually a typo or a renamed cell), as "file:line: pattern"."""
        return [f"{e.where}: {e.pattern!r} matches no cell" for e in self.entries
                if not any(e.matches(cell_id) for cell_id in cell_ids)]


def load_baseline(path: Path | str) -> Baseline:
    path = Path(path)
    root = compose_file(path, BASELINE_FILE)
    if root is None:
        raise BadInput(f"{path}:1", "the file is empty", f"start it with `schema: {SCHEMA}` and `cells:`")
    top = {key: (key_node, value_node) for key, key_node, value_node in mapping_items(path, root, "the baseline")}
    for key, (key_node, _) in top.items():
        if key not in TOP_LEVEL_KEYS:
            raise BadInput(where(path, key_node), f"unknown key {key!r}", f"allowed: {', '.join(TOP_LEVEL_KEYS)}")
    _check_schema(path, root, top.get("schema"))
    if "cells" not in top:
        raise BadInput(where(path, root), "no `cells:` mapping", "add `cells:` mapping cell ids (or globs) to metrics")
    entries = tuple(_entry(path, pattern, key_node, value_node)
                    for pattern, key_node, value_node in mapping_items(path, top["cells"][1], "`cells`"))
    warnings = tuple(w for entry in entries for spec in entry.metrics.values() for w in _noise_warnings(spec))
    return Baseline(path=str(path), entries=entries, description=_optional_text(path, top.get("description")),
                    source=_optional_text(path, top.get("source")), warnings=warnings)


def _check_schema(path: Path, root: yaml.Node, schema_item) -> None:
    if schema_item is None:
        raise BadInput(where(path, root), "no `schema:` key", f"add `schema: {SCHEMA}` at the top")
    _, value_node = schema_item
    value = scalar(value_node)
    if value != SCHEMA or isinstance(value, bool):
        shown = repr(value) if isinstance(value_node, yaml.ScalarNode) else describe(value_node)
        raise BadInput(where(path, value_node), f"schema {shown} is not supported",
                       f"this dspark-ci reads `schema: {SCHEMA}`")


def _optional_text(path: Path, item) -> str | None:
    if item is None:
        return None
    value = scalar(item[1])
    if not isinstance(value, str):
        raise BadInput(where(path, item[1]), f"{item[0].value} must be a string, not {describe(item[1])}")
    return value


def _entry(path: Path, pattern: str, key_node: yaml.Node, node: yaml.Node) -> BaselineEntry:
    if not pattern.strip():
        raise BadInput(where(path, key_node), "empty cell id", "give a cell id or a glob such as `smoke-*`")
    specs = {}
    for metric, metric_key_node, spec_node in mapping_items(path, node, f"cell {pattern!r}"):
        if metric not in METRICS:
            close = difflib.get_close_matches(metric, METRICS, n=1)
            fix = f"did you mean {close[0]!r}?" if close else f"known metrics: {', '.join(METRICS)}"
            raise BadInput(where(path, metric_key_node), f"unknown metric {metric!r}", fix)
        specs[metric] = _metric_spec(path, metric, metric_key_node, spec_node)
    return BaselineEntry(pattern=pattern, where=where(path, key_node), metrics=MappingProxyType(specs))


def _metric_spec(path: Path, metric: str, key_node: yaml.Node, node: yaml.Node) -> MetricSpec:
    fields: dict[str, float] = {}
    per_question = None
    never_inward = False
    for key, key_node, value_node in mapping_items(path, node, metric):
        if key == PER_QUESTION_KEY and metric in PAIRED_STDERR_OF:
            per_question = _per_question(path, value_node)
            continue
        if key == NEVER_INWARD_KEY and metric in NEVER_INWARD_METRICS:
            never_inward = _never_inward(path, metric, value_node)
            continue
        if key not in SPEC_KEYS:
            raise BadInput(where(path, key_node), f"unknown key {key!r} for {metric}",
                           f"allowed: {', '.join(SPEC_KEYS)}")
        fields[key] = _number(path, metric, key, value_node)
    spec = MetricSpec(metric=metric, where=where(path, key_node), per_question=per_question,
                      never_inward=never_inward, **fields)
    _check_spec(spec)
    return spec


def _per_question(path: Path, node: yaml.Node) -> Mapping[str, float]:
    """The per-question record a `per_question: FILE` names (relative to the baseline file)."""
    name = scalar(node)
    if not isinstance(name, str) or not name:
        raise BadInput(where(path, node), f"per_question must name a JSON file, not {describe(node)}")
    record = path.parent / name
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError) as err:
        raise BadInput(where(path, node), f"per_question file {record} cannot be read ({err})",
                       "re-record it with `dspark-ci baseline record`") from None
    if not isinstance(data, dict) or not all(isinstance(v, (int, float)) for v in data.values()):
        raise BadInput(where(path, node), f"per_question file {record} is not {{question id: mean score}}")
    return MappingProxyType({str(k): float(v) for k, v in data.items()})


def _never_inward(path: Path, metric: str, node: yaml.Node) -> bool:
    value = scalar(node)
    if not isinstance(value, bool):
        raise BadInput(where(path, node), f"{metric}.{NEVER_INWARD_KEY} must be true or false, not {describe(node)}")
    return value


def _number(path: Path, metric: str, key: str, node: yaml.Node) -> float:
    value = scalar(node)
    # YAML numbers load as int or float (bool is an int: `true` is not a number here).
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise BadInput(where(path, node), f"{metric}.{key} must be a number, not {describe(node)}")
    lowest, inclusive = SPEC_KEYS[key]
    if value < lowest or (value == lowest and not inclusive):
        bound = "0 or more" if inclusive else "more than 0"
        raise BadInput(where(path, node), f"{metric}.{key} is {value}, it must be {bound}")
    if METRICS[metric].fraction and key in FRACTION_KEYS and not 0 <= value <= 1:
        raise BadInput(where(path, node), f"{metric}.{key} is {value}: {metric} is a fraction between 0 and 1",
                       f"write {value / 100:g} for {value:g}%")
    return float(value)


def _check_spec(spec: MetricSpec) -> None:
    """Rules across keys; each failure names the metric and says what to write instead."""
    for problem, fix in _spec_problems(spec):
        raise BadInput(spec.where, f"{spec.metric}: {problem}", fix)


def _range_problems(spec: MetricSpec, given: set[str]):
    """Values no gate can use: a ratio of a reference that is not positive, a ratio on the wrong side of 1 (it would
    fail the baseline's own value), a negative limit where every measured value is positive."""
    if given & {"min_ratio", "max_ratio"} and spec.value is not None and spec.value <= 0:
        yield f"value {spec.value:g} is not positive: a ratio of it means nothing", "write the measured value (> 0)"
    if spec.max_ratio is not None and spec.max_ratio < 1:
        yield (f"max_ratio {spec.max_ratio:g} is below 1: the baseline's own value would fail it",
               "write a ratio of 1 or more (e.g. 1.05: up to 5 % above value)")
    if spec.min_ratio is not None and not 0 < spec.min_ratio <= 1:
        yield (f"min_ratio {spec.min_ratio:g} is not in (0, 1]: the baseline's own value would fail it",
               "write a ratio of at most 1 (e.g. 0.95: down to 5 % below value)")
    for key in ("min", "max"):
        if getattr(spec, key) is not None and getattr(spec, key) < 0:
            yield f"{key} {getattr(spec, key):g} is negative: no measured value is below 0", f"write {key}: 0 or more"


def _spec_problems(spec: MetricSpec):
    given = {key for key in SPEC_KEYS if getattr(spec, key) is not None}
    better = METRICS[spec.metric].better
    if not given & set(GATE_KEYS) and not spec.never_inward:
        yield "no gate", f"add one of {', '.join(GATE_KEYS)}"
    if spec.never_inward and "value" not in given:
        yield f"{NEVER_INWARD_KEY} needs the baseline's boundary `value`", "add value: (the recorded boundary)"
    for ratio_key in ("min_ratio", "max_ratio"):
        if ratio_key in given and RATIO_KEY_FOR[better] != ratio_key:
            if better == NEUTRAL:
                yield f"{ratio_key} on a metric where neither direction is better", "use min/max (absolute)"
            else:
                yield (f"{better} is better, so {ratio_key} would fail on improvements",
                       f"use {RATIO_KEY_FOR[better]} (or {ratio_key[:3]} for an absolute limit)")
    for key in ("min_ratio", "max_ratio", "max_drop_stderr"):
        if key in given and "value" not in given:
            yield f"{key} needs the reference `value`", "add value: (the baseline run's measurement)"
    yield from _range_problems(spec, given)
    if given & {"runs", "request_noise", "drift"} and "noise" not in given:
        yield "runs, request_noise and drift describe `noise`, and there is none", "add noise (or remove them)"
    if spec.noise is not None and spec.noise <= RESOLUTION and not spec.request_noise:
        yield (f"noise {spec.noise:g} is not a standard error (identical runs measure none) and there is no "
               "request_noise to bound it from below",
               "re-record from runs that vary (`dspark-ci baseline record`), or add request_noise (one boot's "
               "per-request standard error, a fraction)")
    if "max_drop" in given and "max_drop_stderr" not in given:
        yield "max_drop is GPQA's statistical tolerance beside max_drop_stderr", "add max_drop_stderr: 2"
    if "detect" in given and not ("noise" in given or "max_drop_stderr" in given):
        yield ("detect is what a statistical gate's pass rules out, and this gate is a fixed limit",
               "add the run-to-run noise (`baseline record` from several runs) or remove detect")
    if spec.detect is not None and spec.detect < spec.tolerance:
        yield (f"detect {spec.detect:g} is below the tolerance {spec.tolerance:g}: a pass would rule out less than "
               "what is red", f"write detect: {DETECT_FACTOR * spec.tolerance:g} or more (or remove it)")
    if "noise" in given and not given & {"min_ratio", "max_ratio"}:
        yield "noise widens a ratio gate, and there is none", "add min_ratio or max_ratio (or remove noise)"
    if spec.noise is not None and spec.noise >= 1 / NOISE_RUN_SDS:
        yield (f"noise {spec.noise:g} is a fraction of the value ({spec.noise:.0%} run-to-run)",
               "write e.g. 0.004 for 0.4%, or re-measure: a metric this noisy cannot gate anything")
    if "stderr" in given and spec.metric not in PAIRED_STDERR_OF:
        yield "stderr is only known for " + ", ".join(PAIRED_STDERR_OF), "remove stderr"
    if "max_drop_stderr" in given and "stderr" not in given:
        yield ("max_drop_stderr needs the baseline's `stderr`",
               f"add stderr: (the baseline run's {PAIRED_STDERR_OF.get(spec.metric, 'stderr')})")
    if spec.min is not None and spec.max is not None and spec.min > spec.max:
        yield f"min {spec.min:g} is above max {spec.max:g}", "swap them"


def _noise_warnings(spec: MetricSpec):
    """Gates on a sampled metric that noise alone would trip, and noises that are floored, as readable warnings."""
    if spec.noise is not None and spec.noise <= RESOLUTION and spec.request_noise:
        yield (f"{spec.where}: {spec.metric}: noise {spec.noise:g} is not a standard error (its runs were identical, "
               f"so they measured none): floored at its request_noise {spec.request_noise:.2%} (a boot whose requests "
               "draw fresh randomness varies at least that much); re-record from runs that vary for a tighter gate")
    if spec.metric not in STDERR_OF:  # the fixed-floor checks below are an accuracy's (its stderr is sampling error)
        return
    if spec.max_drop_stderr is not None and spec.max_drop_stderr < NOISE_STDERRS:
        yield (f"{spec.where}: {spec.metric}: max_drop_stderr {spec.max_drop_stderr:g} is tighter than "
               f"{NOISE_STDERRS:g} standard errors: expect failures from sampling noise alone")
    floors = [spec.min] if spec.min is not None else []
    if spec.min_ratio is not None:
        floors.append(spec.reference * spec.min_ratio)
    if not floors:
        return
    if spec.stderr is None or spec.value is None:
        yield (f"{spec.where}: {spec.metric}: a fixed floor cannot be checked against sampling error; "
               "prefer value + stderr + max_drop_stderr: 2")
        return
    allowed_drop = spec.value - max(floors)
    if allowed_drop < NOISE_STDERRS * spec.stderr:
        yield (f"{spec.where}: {spec.metric}: the gate allows a drop of {allowed_drop:.3f}, less than "
               f"{NOISE_STDERRS:g} standard errors ({NOISE_STDERRS * spec.stderr:.3f}): expect failures from "
               "sampling noise alone; prefer max_drop_stderr: 2")
