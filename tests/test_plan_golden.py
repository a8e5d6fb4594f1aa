"""`dspark-ci plan` output for every shipped matrix, compared with reviewed golden files.

The json golden holds every cell's exact SGLang command lines, so any change to a matrix, the
planner or the id scheme shows up as a diff to review. Regenerate after an intended change:

    DSPARK_UPDATE_GOLDEN=1 python -m pytest tests/test_plan_golden.py -q
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dspark_ci.cli import main

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "golden" / "plan"
MATRICES = sorted(p.stem for p in (REPO / "matrices").glob("*.yaml"))
FORMATS = {"json": "json", "github": "github.json", "table": "table.txt"}
UPDATE = os.environ.get("DSPARK_UPDATE_GOLDEN") == "1"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("matrix", MATRICES)
def test_plan_output_matches_golden(matrix, fmt, monkeypatch, capsys):
    monkeypatch.chdir(REPO)  # cells name their matrix as given: matrices/<name>.yaml
    code = main(["plan", f"matrices/{matrix}.yaml", "--format", fmt])
    out, err = capsys.readouterr()
    assert code == 0, err
    golden = GOLDEN / f"{matrix}.{FORMATS[fmt]}"
    if UPDATE:
        golden.write_text(out)
    assert golden.exists(), f"no golden file {golden}: run DSPARK_UPDATE_GOLDEN=1 python -m pytest {__file__}"
    assert out == golden.read_text(), (
        f"`dspark-ci plan matrices/{matrix}.yaml --format {fmt}` changed; if intended, regenerate with "
        "DSPARK_UPDATE_GOLDEN=1 and review `git diff tests/golden/plan/`")


def test_every_shipped_matrix_has_goldens():
    """A new matrix without reviewed goldens would otherwise pass unnoticed."""
    expected = {f"{m}.{ext}" for m in MATRICES for ext in FORMATS.values()}
    present = {p.name for p in GOLDEN.iterdir() if p.name != "README.md"}
    assert present == expected
