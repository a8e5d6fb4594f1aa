"""Are two runs' results.json, junit.xml and report.md the same, timings aside? (A refactoring must not change
what a run writes.)

    python3 -m tests.smoke_identity BEFORE_RUN_DIR AFTER_RUN_DIR     # exit 0: identical; 1: the diff is printed

results.json is compared field by field with only what a clock decides masked: the run id, every time stamp
(`*_at`) and span (`*seconds`), the dspark-ci commit, test durations, and the speed suite's timed metrics (TTFT,
TPOT, ITL, end-to-end latency, throughput, the client's own timings) with the value, effect and interval of gates
on them. Everything else (cells, ids, config, expectations, statuses, errors, accept length, GPQA, gate thresholds
and verdicts) must be equal. In junit.xml and report.md, which render the same numbers as text, the run id, times,
and every number with a fractional part (and its sign) are masked; the rest must be equal line for line.
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from pathlib import Path
from typing import Any

TIMED = re.compile(r"^(ttft|tpot|itl|e2e|client_|output_throughput|input_throughput|total_throughput|request_"
                   r"throughput|.*seconds$|duration$|.*_at$|run_id$|dspark_ci_commit$)")
TIMED_GATE_FIELDS = ("value", "effect", "interval")  # of a gate on a timed metric: measured, so noisy
MASK = "<timing>"
# Warnings a clock decides (the speed suite's note that this machine's event loop lagged): dropped on both sides.
TIMED_WARNING = re.compile(r"event loop ran [0-9.]+ ms late")


def masked_results(data: Any, key: str = "") -> Any:
    if isinstance(data, dict):
        timed_gate = "metric" in data and TIMED.match(str(data["metric"]))
        return {k: MASK if TIMED.match(k) or (timed_gate and k in TIMED_GATE_FIELDS) else masked_results(v, k)
                for k, v in data.items()}
    if isinstance(data, list):
        return [masked_results(item, key) for item in data
                if not (key == "warnings" and isinstance(item, str) and TIMED_WARNING.search(item))]
    return data


def masked_text(text: str) -> str:
    text = "\n".join(line for line in text.splitlines() if not TIMED_WARNING.search(line)).replace("\n\n\n", "\n\n")
    text = re.sub(r"\b\d{8}-\d{6}-[0-9a-f]{4}\b", "<run-id>", text)
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d:\d\d)?", "<time>", text)
    text = re.sub(r"\b\d+m \d+s\b", "<duration>", text)
    text = re.sub(r"dspark-ci `[0-9a-f]{12}`", "dspark-ci `<commit>`", text)  # the code under comparison
    return re.sub(r"[-+]?\d+\.\d+(e-?\d+)?", "#", text)  # with its sign: a timed effect may fall either side


def normalized(run_dir: Path) -> dict[str, list[str]]:
    results = masked_results(json.loads((run_dir / "results.json").read_text()))
    return {"results.json": json.dumps(results, indent=1, sort_keys=True).splitlines(),
            **{name: masked_text((run_dir / name).read_text()).splitlines() for name in ("junit.xml", "report.md")}}


def differences(before: Path, after: Path) -> list[str]:
    old, new = normalized(before), normalized(after)
    return [line for name in old for line in difflib.unified_diff(old[name], new[name], f"{before}/{name}",
                                                                  f"{after}/{name}", lineterm="")]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    diff = differences(Path(argv[0]), Path(argv[1]))
    print("\n".join(diff) if diff else "identical (timings aside): results.json, junit.xml, report.md")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
