"""Reports: gates and every output format of a run (CONTRACT.md results.json, junit.xml, report.md, report.html).

Public surface (docs/ARCHITECTURE.md "Reports"):
- ``dspark_ci.reports.results``: ``write_results(path, results)``, ``load_results(path)``
- ``dspark_ci.reports.baseline_file``: ``load_baseline(path) -> Baseline``
- ``dspark_ci.reports.gates``: ``evaluate(cell, metrics, baseline) -> list[gate dict]``
- ``reports.write_reports(run_dir, results, baseline=None)`` and ``reports.step_summary(results)``
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dspark_ci.reports.markdown import step_summary
    from dspark_ci.reports.writers import write_reports

__all__ = ["step_summary", "write_reports"]

# Imported on first use (PEP 562): ``dspark_ci.reports.gates``, which every run needs before its first launch, must not
# pay for the writers' plotting and change-point stack (matplotlib, ruptures, scipy.spatial) seconds before it is used.
_LAZY = {"step_summary": "dspark_ci.reports.markdown", "write_reports": "dspark_ci.reports.writers"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'reports' has no attribute {name!r}")
