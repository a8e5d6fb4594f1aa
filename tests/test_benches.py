"""Every bench a person runs has a smoke mode, so that CI (.ci/run) runs it in seconds and a change that breaks a
bench fails CI instead of being found when someone next needs the figure."""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def runnable_benches() -> list[Path]:
    """The scripts (a ``__main__`` block); the rest of bench/ are modules they import, and ``*_child.py`` a
    process a bench starts."""
    return sorted(path for path in BENCH.glob("*.py") if not path.stem.endswith("_child") and
                  any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
                      for node in ast.parse(path.read_text()).body))


def test_every_runnable_bench_declares_a_smoke_flag():
    scripts = runnable_benches()
    assert len(scripts) >= 10, scripts  # the glob found the benches
    missing = [path.name for path in scripts if '"--smoke"' not in path.read_text()]
    assert not missing, f"benches without --smoke (CI runs every bench with it): {missing}"


def test_ci_runs_every_bench_in_its_smoke_mode():
    ci = (BENCH.parent / ".ci" / "run").read_text()
    assert 'bench/*.py' in ci and "--smoke" in ci, "the .ci/run phase that runs each bench with --smoke is gone"
