"""Running the measurement suites against a deployment: pytest in a subprocess, results as plain data.

The suites are the same files a user runs standalone (``pytest suites/ --base-url URL``); the run
hands them a base URL and options and reads back the JSON they write (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import suites as suites_package

SUITES_DIR = Path(suites_package.__file__).parent
KNOWN_SUITES = ("gpqa", "accept", "speed", "parity")
DEFAULT_SUITES = ("accept", "speed")
SYNTHETIC_GPQA = SUITES_DIR / "data" / "gpqa_synthetic.csv"
# Which suite measures a metric (CONTRACT.md names), by prefix; the rest are the speed suite's.
_METRIC_PREFIX_SUITE = {"gpqa_": "gpqa", "accept_": "accept", "parity_": "parity"}


def suite_of(metric: str) -> str:
    return next((suite for prefix, suite in _METRIC_PREFIX_SUITE.items() if metric.startswith(prefix)), "speed")


@dataclass(frozen=True)
class SuiteOutcome:
    metrics: dict = field(default_factory=dict)
    tests: list = field(default_factory=list)  # [{"nodeid", "outcome", "duration", "message"}]
    warnings: list = field(default_factory=list)
    records: dict = field(default_factory=dict)
    exit_code: int = 0

    @property
    def failures(self) -> list[str]:
        return [f"{t['nodeid']}: {t.get('message') or t['outcome']}"
                for t in self.tests if t["outcome"] in ("failed", "error")]


@dataclass(frozen=True)
class SuiteRequest:
    base_url: str
    names: tuple[str, ...]
    options: Mapping[str, Mapping]  # suite name -> options
    work_dir: Path  # where the options file, the output JSON and suites.log go
    model: str | None = None
    reference_url: str | None = None
    extra_args: tuple[str, ...] = ()
    timeout_s: float = 3600.0


def run_suites(request: SuiteRequest) -> SuiteOutcome:
    request.work_dir.mkdir(parents=True, exist_ok=True)
    options_path = request.work_dir / "suite-options.json"
    out_path = request.work_dir / "suites.json"
    options_path.write_text(json.dumps({k: dict(v) for k, v in request.options.items()}, indent=1))
    out_path.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "pytest", *(str(SUITES_DIR / f"test_{name}.py") for name in request.names),
            "--base-url", request.base_url, "--suite-options", str(options_path), "--dspark-out", str(out_path),
            "-p", "no:cacheprovider", "-q", "-rfEs", *request.extra_args]
    if request.model:
        argv += ["--model", request.model]
    if request.reference_url:
        argv += ["--reference-url", request.reference_url]
    with open(request.work_dir / "suites.log", "w") as log:
        log.write("# " + " ".join(argv) + "\n")
        log.flush()
        completed = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   timeout=request.timeout_s, cwd=SUITES_DIR.parent)
    if not out_path.exists():
        return SuiteOutcome(exit_code=completed.returncode, tests=[{
            "nodeid": "suites", "outcome": "error", "duration": 0.0,
            "message": f"pytest exited {completed.returncode} without results; see {request.work_dir / 'suites.log'}"}])
    data = json.loads(out_path.read_text())
    return SuiteOutcome(metrics=data.get("metrics", {}), tests=data.get("tests", []),
                        warnings=data.get("warnings", []), records=data.get("records", {}),
                        exit_code=completed.returncode)
