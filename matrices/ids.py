"""Cell ids: stable, readable, unique (CONTRACT.md), e.g. ``dsv4-flash-tp8-dp4-dpattn-a2a-none-cuda``.

An id is built only from what defines the deployment, in a fixed order, so the same config
always gets the same id and a reviewer can read the layout from it. Suites, images and
simulator knobs never enter an id.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dspark_ci.ground.sglang.settings import ID_PARTS as SETTING_ID_PARTS

# Environment variables that change what SGLang admits or runs, as (id tag, SGLang default):
# the tag enters the id only when a cell sets a value other than the default.
ID_ENV_TAGS: Mapping[str, tuple[str, str]] = {
    "SGLANG_RAGGED_VERIFY_MODE": ("rv", "static"),  # environ.py: EnvStr("static")
    "SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION": ("coord", "0"),  # environ.py: EnvBool(False)
}


def _env_tags(c: Mapping[str, Any], env: Mapping[str, str]) -> str:
    tags = [f"{tag}-{env[name].lower()}" for name, (tag, default) in ID_ENV_TAGS.items()
            if name in env and env[name].lower() != default]
    return "-".join(tags)


# The id's parts in order: each setting's own (its row's ``id``, ground/sglang/settings.py), and the environment
# tags, which no row holds, between speculation and the device.
ENV_TAGS_POSITION = 110
ID_PARTS: tuple[Callable[[Mapping[str, Any], Mapping[str, str]], str], ...] = tuple(
    render for _, render in sorted([*((part.position, (lambda c, env, part=part: part.render(c)))
                                      for part in SETTING_ID_PARTS),
                                    (ENV_TAGS_POSITION, _env_tags)], key=lambda item: item[0]))


def cell_id(config: Mapping[str, Any], env: Mapping[str, str], prefix: str | None = None,
            suffix: str | None = None) -> str:
    parts = [prefix or "", *(part(config, env) for part in ID_PARTS), suffix or ""]
    return "-".join(p for p in parts if p)
