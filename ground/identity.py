"""A cell's identity: what makes two of its measurements comparable, as a hash per part and in all.

Two results of one cell id are comparable only when they were measured the same way: the same SGLang argv
on every rank, the same launch environment (simulator knobs included), the same model, suites, options and
dataset, on the same hardware label, against the same kind of server. That is the *setup*. The *build* (SGLang
version, image) is kept apart: comparing builds on one setup is what ``compare``, ``history`` and ``bisect``
are for, while two setups are unlike things. ``hash`` covers both: "flaky" means one hash both passed and failed.

Secrets stay ``${NAME}`` references (the planned env), never values. Paths that only say where a file lives on
this machine (a dataset, an emission log) count by their content or not at all.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

HASH_CHARS = 16
SETUP_PARTS = ("server", "argv", "env", "model", "suites", "dataset", "hardware")
# Simulator knobs that say where things are or which build it pretends to be, not how it measures.
NOT_IDENTITY_ENV = ("DSPARK_SIM_EMISSION_LOG", "DSPARK_SIM_GPQA_PATH", "DSPARK_SIM_MC_PATH", "DSPARK_SIM_VERSION")


def digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_CHARS]


def file_digest(path: str | Path | None) -> str | None:
    """The content hash of a dataset file (its path when it cannot be read: comparable only to itself)."""
    if not path:
        return None
    try:
        return hashlib.sha256(Path(path).expanduser().read_bytes()).hexdigest()[:HASH_CHARS]
    except OSError:
        return f"unread:{path}"


@dataclass(frozen=True)
class CellIdentity:
    """results.json per cell ``identity``: {"hash", "setup", "build", "parts": {part: hash}}."""

    build: str  # "sglang X.Y.Z", "sglang X.Y.Z image lmsysorg/sglang:vX.Y.Z", "sim X.Y.Z"
    parts: Mapping[str, str] = field(default_factory=dict)  # SETUP_PARTS -> hash

    def __post_init__(self):
        object.__setattr__(self, "parts", MappingProxyType(dict(self.parts)))

    @property
    def setup(self) -> str:
        return digest(dict(self.parts))

    @property
    def hash(self) -> str:
        return digest([self.setup, self.build])

    def differences(self, other: CellIdentity) -> list[str]:
        """The setup parts that differ ("argv", "dataset", ...); empty when the setups are comparable."""
        return [name for name in sorted(set(self.parts) | set(other.parts))
                if self.parts.get(name) != other.parts.get(name)]

    def to_dict(self) -> dict:
        return {"hash": self.hash, "setup": self.setup, "build": self.build, "parts": dict(self.parts)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> CellIdentity | None:
        if not isinstance(data, Mapping) or not isinstance(data.get("parts"), Mapping):
            return None  # results.json written before identities existed
        return cls(build=str(data.get("build") or ""), parts=data["parts"])


def cell_identity(*, server: str, build: str, argv: list[list[str]], env: Mapping[str, str], model: Any,
                  suites: Mapping[str, Any], dataset: str | Path | None, hardware: str | None) -> CellIdentity:
    """Hash each part of a measurement's setup. ``argv`` is every rank's planned SGLang argv; ``env`` the planned
    launch env plus the simulator knobs the run forwards (locations and the build left out)."""
    kept_env = {k: v for k, v in env.items() if k not in NOT_IDENTITY_ENV}
    values = {"server": server, "argv": argv, "env": kept_env, "model": model, "suites": suites,
              "dataset": file_digest(dataset), "hardware": hardware}
    return CellIdentity(build=build, parts={name: digest(values[name]) for name in SETUP_PARTS})


def unlike(a: CellIdentity | None, b: CellIdentity | None) -> str | None:
    """Why two results are not comparable ("measured differently: argv, dataset"), or None when they are (or one
    predates identities: then nothing can be said, and the caller says that instead)."""
    if a is None or b is None:
        return None
    differing = a.differences(b)
    return f"measured differently: {', '.join(differing)}" if differing else None
