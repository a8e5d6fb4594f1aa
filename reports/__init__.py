"""Reports: gates and every output format of a run (CONTRACT.md results.json, junit.xml, report.md, report.html).

Public surface (docs/ARCHITECTURE.md "Reports"):
- ``reports.results``: ``write_results(path, results)``, ``load_results(path)``
- ``reports.baseline_file``: ``load_baseline(path) -> Baseline``
- ``reports.gates``: ``evaluate(cell, metrics, baseline) -> list[gate dict]``
- ``reports.write_reports(run_dir, results, baseline=None)`` and ``reports.step_summary(results)``
"""

from reports.markdown import step_summary
from reports.writers import write_reports

__all__ = ["step_summary", "write_reports"]
