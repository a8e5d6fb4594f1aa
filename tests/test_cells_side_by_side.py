"""Cells side by side (`run --max-parallel N`) and per-cell timing, end to end on the simulated server, as a user
runs it: cells overlap in time, a cell that crashes while others measure fails alone with its own culprit, each
cell's timing adds up, SIGTERM tears every cell in flight down, and the history orders the next run longest first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from datetime import datetime
from pathlib import Path
from xml.etree import ElementTree

import pytest

from dspark_ci.scheduler import longest_first
from launchers.contract import Capacity
from matrices import load_cells
from reports.history import cell_seconds
from tests.cli import DSPARK_CI
from tests.process_table import assert_no_process_with_env

REPO = Path(__file__).resolve().parent.parent
MATRIX = """\
description: three one-node cells side by side; the b5 cell crashes on its first prefill
sglang: ">=0.5.23"
hardware: {{cuda: h200}}
defaults:
  model: deepseek-ai/DeepSeek-V4-Flash
  model_slug: dsv4-flash
  device: cuda
  gpus_per_node: 8
  tp: 8
  moe_a2a_backend: none
  speculative_algorithm: DSPARK
  env:
    DSPARK_SIM_BOOT_SECONDS: "1"
    DSPARK_SIM_DECODE_STEP_MS: "{decode_ms}"
  suites:
    accept: {{num_requests: {requests}}}
include:
  - {{speculative_block_size: 3}}
  - {{speculative_block_size: 5, env: {{DSPARK_SIM_BOOT_SECONDS: "1", DSPARK_SIM_DECODE_STEP_MS: "{decode_ms}",
                                      DSPARK_SIM_FAULTS: crash_first_prefill}}}}
  - {{speculative_block_size: 7}}
"""
CRASHING = "dsv4-flash-tp8-a2a-none-dspark-b5-cuda"
HEALTHY = ("dsv4-flash-tp8-a2a-none-dspark-b3-cuda", "dsv4-flash-tp8-a2a-none-dspark-b7-cuda")


class SideBySide:
    def __init__(self, tmp_path: Path, decode_ms: int = 5, requests: int = 8):
        self.matrix = tmp_path / "side_by_side.yaml"
        self.matrix.write_text(MATRIX.format(decode_ms=decode_ms, requests=requests))
        self.out = tmp_path / "run"
        self.tag = uuid.uuid4().hex
        self.env = {**os.environ, "CI": "true", "DSPARK_TEST_RUN": self.tag,
                    "DSPARK_STATE_DIR": str(tmp_path / "state"), "DSPARK_HISTORY": str(tmp_path / "history.sqlite")}
        self.argv = [*DSPARK_CI, "run", str(self.matrix), "--max-parallel", "3", "--out", str(self.out)]

    def results(self) -> dict:
        return json.loads((self.out / "results.json").read_text())

    def cells(self) -> dict[str, dict]:
        return {cell["id"]: cell for cell in self.results()["cells"]}


def _at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_a_cell_that_crashes_while_others_measure_fails_alone_and_every_cell_is_timed(tmp_path):
    run = SideBySide(tmp_path)
    done = subprocess.run(run.argv, env=run.env, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert_no_process_with_env("DSPARK_TEST_RUN", run.tag)
    assert done.returncode == 1, done.stderr[-3000:]
    cells = run.cells()
    assert {cell_id: cells[cell_id]["status"] for cell_id in (*HEALTHY, CRASHING)} == {
        HEALTHY[0]: "passed", HEALTHY[1]: "passed", CRASHING: "error"}
    assert "crash_first_prefill" in cells[CRASHING]["sglang_error"]  # its own culprit, SGLang's line
    assert all(cells[c]["error"] is None and cells[c]["metrics"]["accept_length"] > 1 for c in HEALTHY)
    # side by side: every cell started before any finished
    assert max(_at(c["started_at"]) for c in cells.values()) < min(_at(c["finished_at"]) for c in cells.values())
    for cell in cells.values():  # the timing adds up: queue + boot + measure = start to finish
        assert _at(cell["started_at"]) <= _at(cell["ready_at"]) <= _at(cell["finished_at"])
        parts = cell["queue_seconds"] + cell["boot_seconds"] + cell["measure_seconds"]
        assert abs(parts - cell["seconds"]) < 0.05, cell
    suites = {s.get("name"): s for s in ElementTree.parse(run.out / "junit.xml").getroot().iter("testsuite")}
    assert {name: float(s.get("time")) for name, s in suites.items()} == pytest.approx(
        {cell_id: cell["seconds"] for cell_id, cell in cells.items()}, abs=0.002)
    assert "## Time" in (run.out / "report.md").read_text()
    remembered = cell_seconds(Path(run.env["DSPARK_HISTORY"]), list(cells))
    assert remembered == pytest.approx({cell_id: cell["seconds"] for cell_id, cell in cells.items()})


def test_sigterm_tears_down_every_cell_in_flight(tmp_path):
    run = SideBySide(tmp_path, decode_ms=200, requests=400)  # measuring takes minutes: still in flight at SIGTERM
    process = subprocess.Popen(run.argv, env=run.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               cwd=REPO)
    measuring: set[str] = set()
    deadline = time.monotonic() + 120
    while len(measuring) < 2 and time.monotonic() < deadline:  # both healthy cells measure (the third has crashed)
        line = process.stderr.readline()
        measuring |= {cell for cell in HEALTHY if f"{cell}: measuring" in line}
    assert len(measuring) == 2, "the cells never got to measuring"
    process.send_signal(signal.SIGTERM)
    _, rest = process.communicate(timeout=120)
    assert process.returncode == 130, rest[-3000:]
    assert_no_process_with_env("DSPARK_TEST_RUN", run.tag)
    results = run.results()
    assert results["interrupted"] is True and results["finished_at"] is not None
    cells = run.cells()
    assert all(cells[c]["status"] == "error" and "interrupted" in cells[c]["error"] for c in HEALTHY)


def test_cells_start_longest_first_within_the_nodes_there_are():
    cells = load_cells([str(REPO / "matrices" / "smoke.yaml")])
    by_id = {cell.id: cell for cell in cells}
    known = {cell.id: seconds for cell, seconds in zip(cells, (10.0, 30.0, 20.0))}
    assert [c.id for c in longest_first(cells, known)] == sorted(by_id, key=lambda i: -known[i])
    untimed = longest_first(cells, {})  # an expected rejection is short; more nodes take longer
    assert [c.nnodes for c in untimed] == [2, 1, 1] and untimed[-1].expect.outcome == "reject"
    three_nodes = Capacity(max_parallel=3, nodes=3)
    assert three_nodes.fits(1, [2]) and not three_nodes.fits(2, [2]) and not three_nodes.fits(1, [1, 1, 1])
    assert Capacity(max_parallel=2, nodes=1).fits(4, [])  # a cell larger than the fleet still runs, alone
