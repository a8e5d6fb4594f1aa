"""The matrices shipped with dspark-ci, by name: ``dspark-ci run smoke`` runs this dspark-ci's ``matrices/smoke.yaml``,
from a clone or from an installed wheel (whose matrices live in site-packages, beside their baselines).
``dspark-ci matrices`` lists them."""

from __future__ import annotations

from pathlib import Path

SHIPPED_DIR = Path(__file__).resolve().parent


def shipped() -> dict[str, Path]:
    """Name -> file of every shipped matrix (``matrices/*.yaml``)."""
    return {path.stem: path for path in sorted(SHIPPED_DIR.glob("*.yaml"))}


def matrix_path(argument: str) -> str:
    """A MATRIX argument: a file as given when it exists; else the shipped matrix of that name; else as given
    (loading it says the file is missing)."""
    if Path(argument).exists():
        return argument
    found = shipped().get(argument)
    return str(found) if found is not None else argument
