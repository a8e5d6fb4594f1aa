"""`dspark-ci run --server sglang-engine`: the pinned SGLang release's real engine on this CPU
(matrices/cpu-engine-tiny.yaml: the tiny Llama, fast), as a user meets it: a node lost mid-measurement turns the cell
red naming that node, with SGLang's own line. Skipped, with the command, where the engine venv is not given
(DSPARK_SGLANG_ENGINE_PYTHON=$(bash .ci/sglang-engine.sh)).

Speculation on the engine (NGRAM and STANDALONE lossless up to ties, accepting more than one token a step by SGLang's
own counters) is CI's engine-matrix phase: `dspark-ci run matrices/cpu-engine.yaml --server sglang-engine` on the real
model, whose gates say more than a test on the tiny one did, so it is not booted a second time here."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.test_run_cli import REPO, Run

MATRIX = str(REPO / "matrices" / "cpu-engine-tiny.yaml")
TWO_NODES = "tiny-llama-2node-tp2-a2a-none-cpu"
TP2 = "tiny-llama-tp2-a2a-none-cpu"
ENGINE = os.environ.get("DSPARK_SGLANG_ENGINE_PYTHON")
pytestmark = pytest.mark.skipif(not ENGINE or not Path(ENGINE).exists(),
                                reason="SGLang's engine venv is not given: DSPARK_SGLANG_ENGINE_PYTHON=$(bash "
                                       ".ci/sglang-engine.sh)")
# gloo says either, by whether the survivor was reading or writing when its peer went (both seen on this machine)
PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "Scheduler hit an exception")
BOOTS_S = 900  # two engines boot in 20-200 s each on a busy 2-core machine


def _pid_of(out: Path, cell_id: str, rank: int) -> int:
    for line in (out / "launched.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if entry.get("cell") == cell_id and entry.get("rank") == rank:
            return entry["pid"]
    raise AssertionError(f"node rank {rank} of {cell_id} is not in the ledger")


def _signal_mid_measurement(tmp_path: Path, cell_id: str, victim, signum: int) -> tuple[Run, str, float | None]:
    """Run ``cell_id``'s speed suite, send ``signum`` to ``victim(out)``'s pid once it measures; the run's output
    and how long after the signal the cell's verdict (ERROR) was printed."""
    run = Run(tmp_path, MATRIX, "--server", "sglang-engine", "--cell", cell_id, "--suites", "speed", "-v")
    process = run.start()
    assert process.stdout is not None
    lines: list[str] = []
    for line in process.stdout:
        lines.append(line)
        if f"{cell_id}: measuring" in line:
            break
    else:
        raise AssertionError("".join(lines))
    os.kill(victim(run.out), signum)
    sent = time.monotonic()
    verdict_after = None
    for line in process.stdout:
        lines.append(line)
        if verdict_after is None and f"{cell_id}: ERROR" in line:
            verdict_after = time.monotonic() - sent
    process.wait(timeout=BOOTS_S)
    run.assert_nothing_left()
    return run, "".join(lines), verdict_after


def _signal_rank_1_mid_measurement(tmp_path: Path, signum: int) -> tuple[Run, str, float | None]:
    return _signal_mid_measurement(tmp_path, TWO_NODES, lambda out: _pid_of(out, TWO_NODES, 1), signum)


def _tp_rank_1_scheduler(out: Path) -> int:
    """SGLang names each tensor-parallel scheduler process (setproctitle ``sglang::scheduler_TP<r>``)."""
    server = psutil.Process(_pid_of(out, TP2, 0))
    found = [p.pid for p in server.children(recursive=True) if "scheduler_TP1" in " ".join(p.cmdline())]
    assert len(found) == 1, [" ".join(p.cmdline()) for p in server.children(recursive=True)]
    return found[0]


def test_killing_node_rank_1_mid_measurement_turns_the_cell_red_naming_it_with_sglangs_line(tmp_path):
    run, text, verdict_after = _signal_rank_1_mid_measurement(tmp_path, signal.SIGKILL)
    cell = run.cell(TWO_NODES)
    assert cell["status"] == "error", text
    assert "node rank 1 exited with code -9" in cell["error"], cell["error"]
    assert any(line in cell["error"] for line in PEER_LOST), cell["error"]
    assert verdict_after is not None and verdict_after < 30, text


def test_a_stopped_node_rank_1_is_caught(tmp_path):
    run, text, verdict_after = _signal_rank_1_mid_measurement(tmp_path, signal.SIGSTOP)
    cell = run.cell(TWO_NODES)
    assert cell["status"] == "error", text
    assert "node rank 1 stopped answering" in cell["error"] and "stopped (SIGSTOP" in cell["error"], cell["error"]
    assert verdict_after is not None, text


def test_killing_one_tensor_parallel_rank_turns_the_cell_red_with_sglangs_line(tmp_path):
    """One node, two TP ranks: SGLang's own scheduler processes under one launch_server. Killing TP rank 1 leaves
    TP rank 0 alone in its collectives; SGLang's parent then takes the whole server down, and the cell says so."""
    run, text, verdict_after = _signal_mid_measurement(tmp_path, TP2, _tp_rank_1_scheduler, signal.SIGKILL)
    cell = run.cell(TP2)
    assert cell["status"] == "error", text
    assert "node rank 0 exited" in cell["error"], cell["error"]
    # TP rank 0's gloo collective lost its peer (the line SGLang's scheduler raised), then its parent took the
    # server down (SIGQUIT from the child, kill_process_tree)
    assert any(line in cell["sglang_error"] for line in PEER_LOST), cell
    assert verdict_after is not None and verdict_after < 30, text
    log = (run.out / "logs" / TP2 / "0.log").read_text()
    # SGLang's own processes wrote it: each line names its module (the log format the engine kind sets)
    assert "sglang.srt.managers.scheduler" in log and "sglang.srt.model_executor.model_runner" in log
