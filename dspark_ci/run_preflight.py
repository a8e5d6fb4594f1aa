"""Checks before the first launch, so a run fails in seconds with the reason instead of after an hour.

Each check is one small function of plain values; the launcher adds its own (engines answer,
images present or pulled, SGLang importable). Any failure is an InfraError (exit 3) or BadInput (2).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from dspark_ci.ground.errors import InfraError
from dspark_ci.launchers.contract import Launcher
from dspark_ci.launchers.pd.pd_plan import template_plans
from dspark_ci.matrices.cell import Cell

MIN_FREE_DISK_MB = 200  # logs and reports of a run; real SGLang logs grow, but never this fast


def check_disk(run_dir: Path) -> None:
    existing = next(p for p in (run_dir, *run_dir.resolve().parents) if p.exists())
    free_mb = shutil.disk_usage(existing).free / 2**20
    if free_mb < MIN_FREE_DISK_MB:
        raise InfraError(f"only {free_mb:.0f} MB free under {existing} (need {MIN_FREE_DISK_MB} MB for logs and "
                         "reports): free some space or pass --out on another disk")


def preflight(cells: list[Cell], launcher: Launcher, run_dir: Path) -> None:
    check_disk(run_dir)
    launcher.preflight([plan for cell in cells for plan in template_plans(cell)])
