"""The suite output JSON (docs/ARCHITECTURE.md, "Suite output"): collected during the session, written once.

Like pytest's junitxml: measurements and test outcomes accumulate in one ``SuiteOutput`` that
conftest.py keeps on the pytest config, and the file is written at session end (atomically, so a
reader never sees half a file).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dspark_ci.ground.measurements import TEST_OUTCOMES, SuiteTestOutcome
from dspark_ci.ground.suites import METRIC_NAMES

# Beside the output file: every GPQA sample, appended as it is scored (suites/test_gpqa.py), read by the run's
# progress line (dspark_ci/suite_runner.py) and by `dspark-ci rescore` when the output file was never written.
GPQA_SAMPLES_FILE = "gpqa-samples.jsonl"


@dataclass
class SuiteOutput:
    metrics: dict[str, float] = field(default_factory=dict)
    records: dict[str, list[dict]] = field(default_factory=dict)
    tests: list[SuiteTestOutcome] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def add_metrics(self, metrics: dict[str, float | None]) -> None:
        """Record metrics; None or NaN (nothing to measure) are left out rather than written as null."""
        unknown = set(metrics) - METRIC_NAMES
        if unknown:
            raise ValueError(f"not CONTRACT.md metric names: {sorted(unknown)}")
        for name, value in metrics.items():
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                self.metrics[name] = value

    def add_records(self, kind: str, records: list[dict]) -> None:
        self.records.setdefault(kind, []).extend(records)

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def add_test(self, nodeid: str, outcome: str, duration: float, message: str | None) -> None:
        assert outcome in TEST_OUTCOMES, outcome
        self.tests.append(SuiteTestOutcome(nodeid, outcome, round(duration, 3), message))

    def to_dict(self) -> dict[str, Any]:
        return {"metrics": self.metrics, "records": self.records, "tests": [test.to_dict() for test in self.tests],
                "warnings": self.warnings}

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as handle:
            json.dump(self.to_dict(), handle, indent=1, default=_jsonable)
            handle.write("\n")
        os.replace(tmp, path)


def _jsonable(value: Any) -> Any:
    # Tuples are lists already; this catches Paths and other small objects in records.
    return str(value)
