"""The ``/metrics`` families SGLang's own front end sends, as the simulator must send them.

``metric_families-<version>.json`` holds each family SGLang's HTTP server, TokenizerManager and scheduler
collectors (observability/metrics_collector.py, http_request_metrics.py, cpu_monitor.py) expose with
``--enable-metrics``: its name (a counter's without ``_total``, as prometheus_client names it), type, help
text, label names, histogram buckets, and the series a family always has (its fixed label values: a stage, a
phase, a gauge-histogram's ``gt``/``le``). It was taken from the real front end (``--server sglang-frontend``)
after the requests of tests/test_frontend_conformance.py, which holds the simulator to it on every run;
regenerate it from a running front end with ``python -m dspark_ci.sglang_sim.metric_families http://HOST:PORT``.

Labels fall in three kinds: who sends the series (``IDENTITY``: the model, the engine type, the scheduler's
ranks and pid), what one observation is about (``PER_OBSERVATION``: streaming or not, the HTTP endpoint), and
the rest, whose values are fixed and listed in ``series``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from dspark_ci.ground.sglang.release import DEFAULT_VERSION

SNAPSHOT = Path(__file__).with_name(f"metric_families-{DEFAULT_VERSION}.json")
IDENTITY = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank", "pid")
PER_OBSERVATION = ("is_streaming", "endpoint", "method", "status_code")
SCHEDULER_LABEL = "tp_rank"  # a scheduler's family (one series per DP rank): the tokenizer's carry no ranks


@dataclass(frozen=True)
class Family:
    name: str  # as prometheus_client declares it: a counter without its "_total"
    kind: str  # counter, gauge, histogram
    help: str
    labels: tuple[str, ...]  # every label name its series carry (a histogram's "le" aside)
    series: tuple[tuple[tuple[str, str], ...], ...]  # the fixed label values of each series it always has
    buckets: tuple[float, ...]  # a histogram's upper bounds (+Inf aside)

    @property
    def per_scheduler(self) -> bool:
        return SCHEDULER_LABEL in self.labels

    @classmethod
    def of(cls, entry: dict) -> Family:
        return cls(entry["name"], entry["type"], entry["help"], tuple(entry["labels"]),
                   tuple(tuple(sorted(series.items())) for series in entry["series"]),
                   tuple(float(bound) for bound in entry["buckets"]))


def load(path: Path = SNAPSHOT) -> tuple[Family, ...]:
    return tuple(Family.of(entry) for entry in json.loads(path.read_text(encoding="utf-8"))["families"])


def families_of(text: str) -> list[dict]:
    """The snapshot's entries, from one ``/metrics`` page of SGLang's front end."""
    from prometheus_client.parser import text_string_to_metric_families

    entries = []
    for family in text_string_to_metric_families(text):
        labels: set[str] = set()
        fixed: list[dict] = []
        buckets: set[float] = set()
        for sample in family.samples:
            names = dict(sample.labels)
            if family.type == "histogram" and "le" in names:
                bound = float(names.pop("le"))
                if bound != float("inf"):
                    buckets.add(bound)
            labels.update(names)
            series = {k: v for k, v in names.items() if k not in IDENTITY + PER_OBSERVATION}
            if series and series not in fixed:
                fixed.append(series)
        entries.append({"name": family.name, "type": family.type, "help": family.documentation,
                        "labels": sorted(labels), "series": fixed, "buckets": sorted(buckets)})
    return sorted(entries, key=lambda entry: entry["name"])


def main(argv: list[str]) -> int:
    import requests

    if len(argv) != 1:
        print("usage: python -m dspark_ci.sglang_sim.metric_families http://HOST:PORT "
              "(a running --server sglang-frontend)",
              file=sys.stderr)
        return 2
    text = requests.get(argv[0].rstrip("/") + "/metrics", timeout=30).text
    SNAPSHOT.write_text(json.dumps({"sglang": DEFAULT_VERSION, "families": families_of(text)}, indent=1) + "\n",
                        encoding="utf-8")
    print(f"wrote {SNAPSHOT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
