"""``python -m dspark_ci.ci.nightly.shards PLAN_JSON [--durations FILE] [--fleet FILE]``: nightly cells -> shards \
per runner.

A GPU runner is the scarce thing; one job per cell in matrix order leaves the slowest runner group
finishing last by luck. Here cells are grouped per runner label and packed into as many shards as
that label has runners (``--fleet``, ``{"8-gpu-h200": 4, ...}``; ``DEFAULT_RUNNERS`` otherwise),
longest cell first onto the least-loaded shard (LPT: within 4/3 of the optimal makespan), so each
label's last shard ends as early as possible. A shard is one job running its cells one after the
other, one boot per cell with all its suites (``python -m dspark_ci.ci.nightly.shard_run``).

Within a shard, cells run in the order that brings the first red verdict soonest: highest chance of red per
second of GPU time first (``signal_order``; Smith's rule, which minimises the expected time to the first failure
of independent tests). The chance of red is the cell's recent record (``--red-rates``: ``{cell_id: rate}``,
kept by the report job, ``dspark_ci.ci.nightly.merge_runs --red-rates``), ``PRIOR_RED_RATE`` for a cell with none; the
packing across shards (LPT) is untouched, so the makespan is too.

Cell times: the measured duration of the cell's last nightly (``--durations``: ``{cell_id: seconds}``,
written by the report job) when there is one, else an estimate from what the cell does
(``estimate_seconds``). Prints the same job outputs as ``dspark_ci.ci.nightly.matrix_outputs`` (one ``include`` entry
per shard: ``{"shard", "runner", "matrix", "cells", "est_minutes", "rejections"}``). Expected rejections the plan
marks ``"decided_by": "resolver"`` (``dspark-ci plan --rejections resolver``) take no GPU runner: they form one
shard on a hosted CPU runner whose run decides them with SGLang's resolver (``"rejections": "resolver"``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from dspark_ci.ci.nightly.matrix_outputs import github_outputs, read_plan
from dspark_ci.ci.tool import run_tool
from dspark_ci.ground.errors import BadInput
from dspark_ci.ground.records import REJECT

DEFAULT_RUNNERS = 2
RESOLVER_RUNNER = "ubuntu-latest"  # expected rejections SGLang's resolver decides: one CPU job, no GPU runner
RESOLVER_SECONDS = 3 * 60  # that job: install the resolver environment (~80 s), resolve every rank
REJECT_SECONDS = 6 * 60  # an expected rejection: pull/boot until SGLang refuses
SERVE_SECONDS = 45 * 60  # boot + accept + speed + GPQA with thinking
MULTI_NODE_EXTRA = 10 * 60  # per extra node: image pull, rendezvous
REFERENCE_EXTRA = 10 * 60  # parity boots the non-speculative reference beside the cell and asks both
PRIOR_RED_RATE = 0.1  # a cell no nightly has judged yet: about what a new configuration shows in its first weeks
RED_RATE_MEMORY = 0.3  # the weight of tonight in a cell's red rate (an exponentially weighted mean of nights)


@dataclass(frozen=True)
class Shard:
    runner: str
    index: int  # 1-based within its runner label
    cells: tuple[str, ...]
    seconds: float
    rejections: str = "launch"  # "resolver": every cell is an expected rejection SGLang's resolver decides

    @property
    def name(self) -> str:
        return f"{self.runner}-{self.index}"


def estimate_seconds(entry: dict) -> float:
    """A cell's time when no nightly has measured it yet (from the plan entry's expectation, nodes and suites)."""
    if entry.get("expect") == REJECT:
        return REJECT_SECONDS
    reference = REFERENCE_EXTRA if "parity" in (entry.get("suites") or {}) else 0
    return SERVE_SECONDS + reference + MULTI_NODE_EXTRA * max(0, int(entry.get("nnodes") or 1) - 1)


def schedule(entries: list[dict], durations: dict[str, float], fleet: dict[str, int],
             red_rates: dict[str, float] | None = None) -> list[Shard]:
    """LPT per runner label: shards in label order of first appearance, cells placed longest first and run in
    ``signal_order``; the expected rejections the plan marks ``"decided_by": "resolver"`` go to one CPU shard
    of their own, first."""
    decided = tuple(e["cell"] for e in entries if e.get("decided_by") == "resolver")
    shards = [Shard(RESOLVER_RUNNER, 1, decided, RESOLVER_SECONDS, "resolver")] if decided else []
    by_runner: dict[str, list[tuple[float, str]]] = {}
    for entry in entries:
        if entry["cell"] in decided:
            continue
        seconds = durations.get(entry["cell"]) or estimate_seconds(entry)
        by_runner.setdefault(entry["runner"], []).append((float(seconds), entry["cell"]))
    for runner, cells in by_runner.items():
        count = max(1, min(len(cells), fleet.get(runner, DEFAULT_RUNNERS)))
        loads = [0.0] * count
        members: list[list[str]] = [[] for _ in range(count)]
        for seconds, cell in sorted(cells, key=lambda c: (-c[0], c[1])):
            target = min(range(count), key=lambda i: (loads[i], i))
            loads[target] += seconds
            members[target].append(cell)
        seconds_of = {cell: seconds for seconds, cell in cells}
        shards += [Shard(runner, i + 1, signal_order(members[i], seconds_of, red_rates or {}), loads[i])
                   for i in range(count)]
    return shards


def signal_order(cells: list[str], seconds: dict[str, float], red_rates: dict[str, float]) -> tuple[str, ...]:
    """The cells of one shard, highest chance of red per second first (ties: the order LPT placed them)."""
    def rate(cell: str) -> float:
        return red_rates.get(cell, PRIOR_RED_RATE) / max(seconds[cell], 1.0)

    return tuple(sorted(cells, key=rate, reverse=True))


def updated_red_rates(before: dict[str, float], red_tonight: dict[str, bool]) -> dict[str, float]:
    """Each judged cell's red rate moved towards tonight's verdict; cells not run tonight keep theirs."""
    rates = dict(before)
    for cell, red in red_tonight.items():
        rates[cell] = round((1 - RED_RATE_MEMORY) * before.get(cell, PRIOR_RED_RATE) + RED_RATE_MEMORY * red, 4)
    return rates


def lower_bound(entries: list[dict], durations: dict[str, float], fleet: dict[str, int]) -> float:
    """No schedule on this fleet ends earlier: per label, max(total / runners, longest cell)."""
    bound = 0.0
    by_runner: dict[str, list[float]] = {}
    for entry in entries:
        by_runner.setdefault(entry["runner"], []).append(durations.get(entry["cell"]) or estimate_seconds(entry))
    for runner, times in by_runner.items():
        bound = max(bound, sum(times) / fleet.get(runner, DEFAULT_RUNNERS), max(times))
    return bound


def shard_matrix(shards: list[Shard], matrix_of: dict[str, str]) -> dict:
    return {"include": [{"shard": s.name, "runner": s.runner, "matrix": matrix_of[s.cells[0]],
                         "cells": " ".join(s.cells), "est_minutes": round(s.seconds / 60), "rejections": s.rejections}
                        for s in shards]}


def read_json_numbers(path: Path | None, what: str) -> dict:
    if path is None or not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise BadInput(str(path), f"cannot read the {what} ({err})",
                       "delete it; it is rebuilt by the next nightly") from err
    if not isinstance(data, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                             for v in data.values()):
        raise BadInput(str(path), f"the {what} must be a JSON object of numbers", '{"8-gpu-h200": 4}')
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dspark_ci.ci.nightly.shards", description=__doc__.splitlines()[0])
    parser.add_argument("plan_json", type=Path, help="`dspark-ci plan --format github` output")
    parser.add_argument("--durations", type=Path, help="{cell_id: seconds} measured by the last nightly")
    parser.add_argument("--fleet", type=Path, help="{runner_label: runners}; default 2 per label")
    parser.add_argument("--red-rates", type=Path, help="{cell_id: recent red rate} kept by the last nightly")
    args = parser.parse_args(argv)

    def body() -> int:
        entries = read_plan(args.plan_json)
        durations = read_json_numbers(args.durations, "durations file")
        fleet = {k: int(v) for k, v in read_json_numbers(args.fleet, "fleet file").items()}
        red_rates = read_json_numbers(args.red_rates, "red rates file")
        shards = schedule(entries, durations, fleet, red_rates)
        matrix = shard_matrix(shards, {e["cell"]: e["matrix"] for e in entries})
        print("\n".join(github_outputs(matrix, str(args.plan_json))))
        return 0

    return run_tool("dspark_ci.ci.nightly.shards", body)


if __name__ == "__main__":
    sys.exit(main())
