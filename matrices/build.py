"""From one expanded fragment to a ``Cell``: fill defaults, reject impossible layouts, derive the
runner label and the id, attach the expectation.

Layout rules reject what cannot be placed or means nothing (tp not divisible by the attention-DP
groups, more ranks than the runner has, ...). What SGLang itself refuses at admission (e.g. DSpark
with attention DP and no --enable-dp-lm-head) is *not* rejected here: a matrix tests exactly that
with ``expect: {outcome: reject, ...}``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dspark_ci.ground.sglang.release import AMD, BLOCK_SIZE_FLAGS, ROCM_IMAGES, accelerator, release_image
from dspark_ci.ground.sglang.settings import CellConfig
from dspark_ci.matrices.cell import SERVE, Cell, Expect
from dspark_ci.matrices.expand import CODE_DEFAULTS, effective
from dspark_ci.matrices.ids import cell_id
from dspark_ci.matrices.roles import RouterSpec, build_roles, roles_id
from dspark_ci.matrices.schema import CONFIG_KEYS, Fragment, MatrixSpec, Where
from dspark_ci.matrices.values import SGLANG_VERSION

# Which flag carries a speculative algorithm's block size (sglang/srt/arg_groups/fields/spec.py).
BLOCK_SIZE_ALGORITHMS = tuple(BLOCK_SIZE_FLAGS)
# Runner label word per device: `8-gpu-h200`, `16-npu-a3`.
DEVICE_KIND: Mapping[str, str] = {"npu": "npu", "cpu": "cpu"}
DEFAULT_DEVICE_KIND = "gpu"


def ranks_needed(c: Mapping[str, Any]) -> int:
    """Accelerators a cell occupies: attention DP lives inside the TP group, plain DP replicates it."""
    replicas = 1 if c["enable_dp_attention"] else c["dp"]
    return c["tp"] * c["pp"] * replicas


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


@dataclass(frozen=True)
class LayoutRule:
    keys: tuple[str, ...]  # the config keys the rule reads (their lines are named in the message)
    broken: Callable[[Mapping[str, Any]], bool]
    problem: Callable[[Mapping[str, Any]], str]
    fix: Callable[[Mapping[str, Any]], str]


LAYOUT_RULES: tuple[LayoutRule, ...] = (
    LayoutRule(("enable_dp_attention", "dp"),
               lambda c: c["enable_dp_attention"] and c["dp"] == 1,
               lambda c: "enable_dp_attention needs dp > 1 (dp counts the attention-DP groups)",
               lambda c: "set dp to the number of attention-DP groups, or remove enable_dp_attention"),
    LayoutRule(("tp", "dp", "enable_dp_attention"),
               lambda c: c["enable_dp_attention"] and c["tp"] % c["dp"] != 0,
               lambda c: f"tp {c['tp']} is not divisible by dp {c['dp']} under attention DP",
               lambda c: f"attention-DP groups split the TP group: use a dp that divides tp ({_divisors(c['tp'])})"),
    LayoutRule(("tp", "cp"),
               lambda c: c["tp"] % c["cp"] != 0,
               lambda c: f"cp {c['cp']} does not divide tp {c['tp']}",
               lambda c: f"context parallelism splits the TP group: use a cp that divides tp ({_divisors(c['tp'])})"),
    LayoutRule(("tp", "dp", "cp", "enable_dp_attention"),
               lambda c: c["enable_dp_attention"] and c["cp"] > 1 and c["tp"] % (c["dp"] * c["cp"]) != 0,
               lambda c: f"tp {c['tp']} is not divisible by dp·cp = {c['dp'] * c['cp']}",
               lambda c: "with attention DP and CP, dp·cp must divide tp (SGLang asserts it)"),
    LayoutRule(("cp_strategy", "cp"),
               lambda c: c.get("cp_strategy") is not None and c["cp"] == 1,
               lambda c: f"cp_strategy {c['cp_strategy']} has no effect with cp 1",
               lambda c: "set cp > 1 to enable prefill context parallelism, or remove cp_strategy"),
    LayoutRule(("tp", "pp", "dp", "enable_dp_attention", "nnodes", "gpus_per_node"),
               lambda c: ranks_needed(c) > c["nnodes"] * c["gpus_per_node"],
               lambda c: (f"the layout needs {ranks_needed(c)} accelerators (tp·pp"
                          f"{'' if c['enable_dp_attention'] else '·dp'}) but nnodes·gpus_per_node = "
                          f"{c['nnodes'] * c['gpus_per_node']}"),
               lambda c: "lower tp/pp/dp, or raise nnodes or gpus_per_node"),
    LayoutRule(("tp", "pp", "dp", "enable_dp_attention", "nnodes"),
               lambda c: ranks_needed(c) % c["nnodes"] != 0,
               lambda c: f"{ranks_needed(c)} ranks cannot be split evenly over {c['nnodes']} nodes",
               lambda c: "make tp·pp (·dp without attention DP) a multiple of nnodes"),
    LayoutRule(("speculative_block_size", "speculative_algorithm"),
               lambda c: (c.get("speculative_block_size") is not None
                          and c["speculative_algorithm"] not in BLOCK_SIZE_ALGORITHMS),
               lambda c: (f"speculative_block_size is set but speculative_algorithm is "
                          f"{c['speculative_algorithm']!r}"),
               lambda c: f"block sizes exist for {' and '.join(BLOCK_SIZE_ALGORITHMS)}; "
                         "set one, or remove the block size"),
    LayoutRule(("draft_model", "speculative_algorithm"),
               lambda c: c.get("draft_model") is not None and not c["speculative_algorithm"],
               lambda c: "draft_model is set but speculative_algorithm is not",
               lambda c: "set speculative_algorithm (e.g. DSPARK), or remove draft_model"),
)


def _check_layout(config: Mapping[str, Any], fragment: Fragment, path: str) -> None:
    for rule in LAYOUT_RULES:
        if not rule.broken(config):
            continue
        written = {k: fragment.lines[k] for k in rule.keys if k in fragment.lines}
        line = max(written.values(), default=fragment.line)
        origin = ", ".join(f"{k} from line {n}" for k, n in written.items())
        problem = rule.problem(config) + (f" ({origin})" if origin else "")
        raise Where(path, line).error(problem, rule.fix(config))


def _runner(config: Mapping[str, Any], fragment: Fragment, path: str) -> str:
    if "runner" in fragment.values:
        return fragment.values["runner"]
    device, hardware = config["device"], config.get("hardware")
    if not hardware:
        raise Where(path, fragment.lines.get("device", fragment.line)).error(
            f"cannot derive a runner label: no hardware type for device {device}",
            f"add `hardware: {{{device}: <type>}}` at the top of the matrix, or set `runner:` on the cell")
    label = f"{config['gpus_per_node']}-{DEVICE_KIND.get(device, DEFAULT_DEVICE_KIND)}-{hardware}"
    return f"{config['nnodes']}x{label}" if config["nnodes"] > 1 else label


def _check_image(config: Mapping[str, Any], fragment: Fragment, path: str) -> None:
    """A cell runs in its own `image:` or in SGLang's release image for its device and hardware; with neither, a
    container launcher would start it in an image for other hardware (a CUDA build on an AMD node): refused here."""
    if fragment.values.get("image") is not None:
        return
    device, hardware = config["device"], config.get("hardware")
    if release_image(device, hardware) is not None:
        return
    line = fragment.lines.get("hardware", fragment.lines.get("device", fragment.line))
    if accelerator(device, hardware) == AMD:
        known = ", ".join(sorted(ROCM_IMAGES))
        problem = (f"hardware {hardware} is AMD (ROCm) and SGLang {SGLANG_VERSION} publishes no ROCm image for it "
                   f"(release images exist for {known})")
    else:
        problem = f"SGLang {SGLANG_VERSION} publishes no image for device {device}"
    raise Where(path, line).error(problem, "set `image:` on the cell to an SGLang build for that hardware")


def _config(fragment: Fragment, spec: MatrixSpec) -> dict:
    values = effective(fragment)
    values.pop("env")
    if "hardware" not in values and values["device"] in spec.hardware:
        values["hardware"] = spec.hardware[values["device"]]
    # CONTRACT.md's keys are always present (speculative_algorithm may be null); others only when set.
    return {key: values[key] for key in CONFIG_KEYS
            if key in CODE_DEFAULTS or values.get(key) is not None}


def _beside(matrix_path: str, path: str | None) -> str | None:
    """A relative path in a matrix is relative to the matrix file, wherever the command runs."""
    if path is None or os.path.isabs(path):
        return path
    return os.path.normpath(os.path.join(os.path.dirname(matrix_path), path))


def build_cell(fragment: Fragment, spec: MatrixSpec) -> Cell:
    where = Where(spec.path, fragment.line)
    if "model" not in fragment.values:
        raise where.error("this cell has no model", "set `model:` in defaults or on the cell")
    config = _config(fragment, spec)
    _check_layout(config, fragment, spec.path)
    env = fragment.values.get("env", {})
    if "id" in fragment.values and "id_suffix" in fragment.values:
        raise Where(spec.path, fragment.lines["id"]).error("id and id_suffix are both set",
                                                           "an explicit id is the whole id: drop id_suffix")
    roles = _roles(config, fragment, spec.path)
    suffix = "-".join(filter(None, [roles_id(roles) if roles else "", fragment.values.get("id_suffix")]))
    identity = fragment.values.get("id") or cell_id(config, env, spec.id_prefix, suffix or None)
    expect: Expect = fragment.values.get("expect", Expect(SERVE))
    expect = dataclasses.replace(expect, sglang=expect.sglang or spec.sglang)
    runner = _runner(config, fragment, spec.path) if not roles else fragment.values.get("runner") or pd_runner(roles)
    _check_image(config, fragment, spec.path)
    return Cell(
        id=identity, matrix=spec.path, config=CellConfig.from_dict(config), runner=runner,
        expect=expect, env=env, extra_args=fragment.values.get("extra_args", ()),
        suites=_pd_suites(fragment.values.get("suites", {})) if roles else fragment.values.get("suites", {}),
        baseline=_beside(spec.path, fragment.values.get("baseline")),
        image=fragment.values.get("image"), line=fragment.line, roles=roles,
        router=fragment.values.get("router", RouterSpec()) if roles else None,
    )


def _roles(config: dict, fragment: Fragment, path: str):
    """A disaggregated cell's roles, each checked like a cell of its own; a router without roles is a mistake."""
    if "roles" not in fragment.values:
        for key in ("router", "disaggregation_mode"):
            if fragment.values.get(key) is not None:
                raise Where(path, fragment.lines[key]).error(
                    f"{key} is set but the cell has no roles", "add `roles: {prefill: {count: 1}, decode: {count: 1}}`"
                    " for a disaggregated cell, or remove it")
        return ()

    def finish(role_config: dict, name: str) -> str:
        _check_layout(role_config, fragment, path)
        return _runner(role_config, Fragment({}, {}, fragment.line), path)
    return build_roles(config, fragment.values["roles"], finish)


def _pd_suites(suites):
    """Through sglang-router, acceptance is asked of completions unless the matrix says (ground/sglang/router.py)."""
    return {name: ({"api": "completions", **options} if name == "accept" else options)
            for name, options in suites.items()}


def pd_runner(roles) -> str:
    """A disaggregated cell's runner label: its nodes over every role instance, ``2x8-gpu-h200`` when the roles
    run on the same kind of node, else each role's share joined (``1x8-gpu-h200+2x8-gpu-b200``)."""
    def base(label: str) -> str:
        return label.split("x", 1)[1] if label.split("x", 1)[0].isdigit() else label
    shares = [(r.count * r.config.nnodes, base(r.runner)) for r in roles]
    if len({label for _, label in shares}) == 1:
        return f"{sum(n for n, _ in shares)}x{shares[0][1]}"
    return "+".join(f"{n}x{label}" for n, label in shares)
