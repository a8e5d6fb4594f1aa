"""The local launcher's options: none of its own (the record keeps every launcher's ``build`` alike)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LocalOptions:
    pass
