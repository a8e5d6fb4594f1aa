"""Cell ids: stable, readable, unique (CONTRACT.md), e.g. ``dsv4-flash-tp8-dp4-dpattn-a2a-none-cuda``.

An id is built only from what defines the deployment, in a fixed order, so the same config
always gets the same id and a reviewer can read the layout from it. Suites, images and
simulator knobs never enter an id.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping

# Environment variables that change what SGLang admits or runs, as (id tag, SGLang default):
# the tag enters the id only when a cell sets a value other than the default.
ID_ENV_TAGS: Mapping[str, tuple[str, str]] = {
    "SGLANG_RAGGED_VERIFY_MODE": ("rv", "static"),  # environ.py: EnvStr("static")
    "SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION": ("coord", "0"),  # environ.py: EnvBool(False)
}


def model_slug(model: str) -> str:
    """``deepseek-ai/DeepSeek-V4-Flash`` -> ``deepseek-v4-flash`` (a matrix may set model_slug instead)."""
    base = model.rstrip("/").rsplit("/", 1)[-1].lower()
    return re.sub(r"[^a-z0-9._-]+", "-", base).strip("-._") or "model"


def _speculative(c: Mapping[str, Any]) -> str:
    algorithm = c.get("speculative_algorithm")
    if not algorithm:
        return ""
    block = c.get("speculative_block_size")
    return algorithm.lower() + (f"-b{block}" if block else "")


def _context_parallel(c: Mapping[str, Any]) -> str:
    if c["cp"] == 1:
        return ""
    strategy = c.get("cp_strategy") or "interleave"
    return f"cp{c['cp']}" + ("" if strategy == "interleave" else f"-{strategy}")


def _env_tags(c: Mapping[str, Any], env: Mapping[str, str]) -> str:
    tags = [f"{tag}-{env[name].lower()}" for name, (tag, default) in ID_ENV_TAGS.items()
            if name in env and env[name].lower() != default]
    return "-".join(tags)


# One function per id part, in id order; an empty string leaves the part out.
ID_PARTS: tuple[Callable[[Mapping[str, Any], Mapping[str, str]], str], ...] = (
    lambda c, env: c.get("model_slug") or model_slug(c["model"]),
    lambda c, env: f"{c['nnodes']}node" if c["nnodes"] > 1 else "",
    lambda c, env: f"tp{c['tp']}",
    lambda c, env: f"pp{c['pp']}" if c["pp"] > 1 else "",
    lambda c, env: f"dp{c['dp']}" if c["dp"] > 1 else "",
    lambda c, env: "dpattn" if c["enable_dp_attention"] else "",
    lambda c, env: "lmhead" if c["enable_dp_lm_head"] else "",
    lambda c, env: _context_parallel(c),
    lambda c, env: f"a2a-{c['moe_a2a_backend']}",
    lambda c, env: _speculative(c),
    _env_tags,
    lambda c, env: c["device"],
)


def cell_id(config: Mapping[str, Any], env: Mapping[str, str], prefix: str | None = None,
            suffix: str | None = None) -> str:
    parts = [prefix or "", *(part(config, env) for part in ID_PARTS), suffix or ""]
    return "-".join(p for p in parts if p)
