"""Comparing generated text with a golden file under tests/golden/.

After an intended change, regenerate with ``DSPARK_UPDATE_GOLDEN=1 python -m pytest tests/...`` (the one
switch docs/DEVELOPMENT.md names for every golden file) and review the diff before committing.
"""

from __future__ import annotations

import os
from pathlib import Path

GOLDEN_DIR = Path(__file__).parent / "golden"


def assert_golden(path: Path, text: str) -> None:
    """``text`` equals the golden file at ``path``; with DSPARK_UPDATE_GOLDEN=1, (re)writes it first."""
    if os.environ.get("DSPARK_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"{path} missing: run with DSPARK_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(encoding="utf-8"), (
        f"{path.name} differs from its golden file (DSPARK_UPDATE_GOLDEN=1 to accept, then review the diff)")
