"""Prefill/decode roles of a disaggregated cell: the ``roles:`` and ``router:`` keys, and the per-role configs.

    roles:
      prefill: {count: 1, tp: 8, cp: 8}
      decode: {count: 2, tp: 8, dp: 8, enable_dp_attention: true, enable_dp_lm_head: true}
    router: {prefill_policy: round_robin, decode_policy: round_robin}

A role's config is the cell's with the role's own settings written over it and ``disaggregation_mode`` set to the
role; both roles inherit the cell's speculative settings unless they say otherwise (a prefill without speculation
feeding a speculative decode is a cell of its own: sglang#17212 gave wrong answers there).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from dspark_ci.ground.sglang.router import DECODE_POLICIES, DEFAULT_POLICY, PREFILL_POLICIES, ROLES
from dspark_ci.ground.sglang.settings import DEFAULT_BOOTSTRAP_PORT, CellConfig
from dspark_ci.ground.yaml_lines import YamlMap
from dspark_ci.matrices.values import Where, check_keys, int_between, one_of

# Settings the cell decides for both roles (the transfer must agree on both ends).
CELL_LEVEL = ("disaggregation_mode", "disaggregation_transfer_backend", "disaggregation_bootstrap_port", "model",
              "model_slug", "device", "hardware")
MAX_INSTANCES = 64


@dataclass(frozen=True)
class Role:
    name: str  # "prefill" | "decode"
    count: int  # instances of this role, each its own server (and node group)
    config: CellConfig  # what each instance runs (disaggregation_mode set)
    runner: str  # CI runner label one instance needs

    def to_dict(self) -> dict:
        return {"count": self.count, "runner": self.runner, "config": dict(self.config)}


@dataclass(frozen=True)
class RouterSpec:
    prefill_policy: str = DEFAULT_POLICY
    decode_policy: str = DEFAULT_POLICY

    def to_dict(self) -> dict:
        return {"prefill_policy": self.prefill_policy, "decode_policy": self.decode_policy}


def role_map(value, where: Where, key: str, example: str) -> Mapping[str, Mapping[str, Any]]:
    """``roles: {prefill: {count: 1, tp: 4}, decode: {...}}``: both roles, each its count and own settings."""
    from dspark_ci.matrices.schema import CELL_KEYS  # the settings' parsers (schema lists this parser among its keys)

    if not isinstance(value, YamlMap):
        raise where.error(f"roles must map prefill and decode to their settings, got {value!r}",
                          f"write it like `{example}`")
    check_keys(value, ROLES, where, "role")
    missing = [r for r in ROLES if r not in value]
    if missing:
        raise where.error(f"roles has no {' and no '.join(missing)}", "a disaggregated cell needs both roles: "
                          "`roles: {prefill: {count: 1}, decode: {count: 1}}`")
    allowed = {"count": None, **{k: s for k, s in CELL_KEYS.items() if s.in_config and k not in CELL_LEVEL}}
    roles = {}
    for name in ROLES:
        node, here = value[name] if value[name] is not None else YamlMap(), where.at(value, name)
        if not isinstance(node, YamlMap):
            raise here.error(f"role {name} must be a mapping of settings, got {node!r}", "write it like `{count: 1}`")
        check_keys(node, allowed, here, f"{name} role")
        parsed = {k: (int_between(1, MAX_INSTANCES) if k == "count" else CELL_KEYS[k].parse)(
            v, here.at(node, k), k, "count: 1" if k == "count" else CELL_KEYS[k].example) for k, v in node.items()}
        roles[name] = MappingProxyType({"count": 1, **parsed})
    return MappingProxyType(roles)


def router_spec(value, where: Where, key: str, example: str) -> RouterSpec:
    if not isinstance(value, YamlMap):
        raise where.error(f"router must be a mapping, got {value!r}", f"write it like `{example}`")
    check_keys(value, ("prefill_policy", "decode_policy"), where, "router")
    choices = {"prefill_policy": PREFILL_POLICIES, "decode_policy": DECODE_POLICIES}
    return RouterSpec(**{k: one_of(choices[k])(v, where.at(value, k), k, f"{k}: {DEFAULT_POLICY}")
                         for k, v in value.items()})


def build_roles(config: Mapping[str, Any], written: Mapping[str, Mapping[str, Any]],
                finish: Callable[[dict, str], str]) -> tuple[Role, ...]:
    """Each role's config (the cell's, the role's settings over it, its mode); ``finish`` checks a role's layout
    and gives its runner label."""
    roles = []
    for name in ROLES:
        own = {k: v for k, v in written[name].items() if k != "count"}
        role_config = {**config, **own, "disaggregation_mode": name,
                       "disaggregation_transfer_backend": config.get("disaggregation_transfer_backend") or "mooncake"}
        if name == "prefill":
            role_config["disaggregation_bootstrap_port"] = (config.get("disaggregation_bootstrap_port")
                                                            or DEFAULT_BOOTSTRAP_PORT)
        role_config = {k: v for k, v in role_config.items() if v is not None or k == "speculative_algorithm"}
        runner = finish(role_config, name)
        roles.append(Role(name, written[name]["count"], CellConfig.from_dict(role_config), runner))
    return tuple(roles)


def _layout(c: CellConfig) -> str:
    parts = [f"{c.nnodes}node" if c.nnodes > 1 else "", f"tp{c.tp}", f"pp{c.pp}" if c.pp > 1 else "",
             f"dp{c.dp}" if c.dp > 1 else "", "dpattn" if c.enable_dp_attention else "",
             f"cp{c.cp}" if c.cp > 1 else "",
             "nospec" if not c.speculative else ""]
    return "".join(p for p in parts if p)


def roles_id(roles: tuple[Role, ...]) -> str:
    """The id part naming the roles, e.g. ``pd-p1tp8cp8-d2tp8dp8dpattn``."""
    return "pd-" + "-".join(f"{r.name[0]}{r.count}{_layout(r.config)}" for r in roles)
