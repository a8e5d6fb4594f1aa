"""The non-speculative reference boots beside the cell's own launch (dspark_ci.reference_boot): it is up when the
cell is, its failure is the cell's, and a cell whose own launch fails does not wait for the reference's boot. A
launcher stand-in records what was started and torn down; no server runs."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path

import pytest
from dspark_ci.ground import interrupts
from dspark_ci.launchers.contract import LaunchFailed
from dspark_ci.launchers.plan_types import Placement
from dspark_ci.matrices import load_cells

from dspark_ci.reference_boot import ReferenceBoot, launches_reference, reference_boot

REPO = Path(__file__).resolve().parent.parent
BOOT_FOREVER_S = 600.0  # a real model's boot: what a failed cell must not wait out


def speculative_cell():
    return next(cell for cell in load_cells([str(REPO / "matrices" / "smoke.yaml")])
                if cell.speculative and cell.nnodes == 1 and not cell.expect.rejects)


class StandIn:
    """Launches that boot for ``boot_s`` (polling the run's interrupt flag, as every launcher's wait does), or fail."""

    name = "stand-in"

    def __init__(self, boot_s: float = 0.0, fails: bool = False):
        self.boot_s, self.fails = boot_s, fails
        self.started: list[str] = []
        self.torn_down: list[str] = []
        self.booting = threading.Event()

    def placement(self, nnodes: int, gpus_per_node: int | None = None) -> Placement:
        return Placement.loopback(nnodes, port=30000, dist_port=20000)

    @contextlib.contextmanager
    def launch(self, plan, logs_dir):
        self.started.append(plan.cell_id)
        try:
            self.booting.set()
            deadline = time.monotonic() + self.boot_s
            while time.monotonic() < deadline:
                interrupts.check()
                time.sleep(0.02)
            if self.fails:
                raise LaunchFailed(cell_id=plan.cell_id, reason="exited", node_rank=0, rank_exit_code=1,
                                   sglang_error="ValueError: the reference refused to start")
            yield f"deployment of {plan.cell_id}"
        finally:
            self.torn_down.append(plan.cell_id)


def test_the_reference_is_up_beside_the_cell_and_torn_down_with_it(tmp_path):
    cell, launcher = speculative_cell(), StandIn(boot_s=0.2)
    with ReferenceBoot(cell, launcher, tmp_path, lambda _: None) as booting:
        assert launcher.booting.wait(30)  # booting before the cell's thread asked for it: beside the cell's launch
        assert booting.deployment() == f"deployment of {cell.id}-reference"
        assert launcher.torn_down == []
    assert launcher.started == launcher.torn_down == [f"{cell.id}-reference"]


def test_a_reference_that_fails_to_boot_fails_the_cell_with_its_own_line(tmp_path):
    cell, launcher = speculative_cell(), StandIn(fails=True)
    with pytest.raises(LaunchFailed) as failed:
        with ReferenceBoot(cell, launcher, tmp_path, lambda _: None) as booting:
            booting.deployment()
    assert failed.value.sglang_error == "ValueError: the reference refused to start"
    assert launcher.torn_down == [f"{cell.id}-reference"]


def test_a_cell_whose_own_launch_fails_does_not_wait_for_the_reference_to_boot(tmp_path):
    cell, launcher = speculative_cell(), StandIn(boot_s=BOOT_FOREVER_S)
    started = time.monotonic()
    with pytest.raises(LaunchFailed):
        with ReferenceBoot(cell, launcher, tmp_path, lambda _: None):
            assert launcher.booting.wait(30)
            raise LaunchFailed(cell_id=cell.id, reason="exited", node_rank=0, rank_exit_code=1)
    assert time.monotonic() - started < BOOT_FOREVER_S / 10  # cut short, not waited out
    assert launcher.torn_down == [f"{cell.id}-reference"]  # and what it started is gone


def test_ctrl_c_while_waiting_for_the_reference_stops_it_and_tears_it_down(tmp_path):
    cell, launcher = speculative_cell(), StandIn(boot_s=BOOT_FOREVER_S)
    interrupts.reset()
    try:
        with pytest.raises(KeyboardInterrupt):
            with ReferenceBoot(cell, launcher, tmp_path, lambda _: None) as booting:
                assert launcher.booting.wait(30)
                interrupts.on_signal(signal.SIGINT, None)  # the run's handler: a flag, acted on at the next wait
                booting.deployment()
    finally:
        interrupts.reset()
    assert launcher.torn_down == [f"{cell.id}-reference"]


def test_no_reference_is_booted_for_suites_that_compare_with_none(tmp_path):
    cell, launcher = speculative_cell(), StandIn()
    assert not launches_reference(cell, ("sanity", "gpqa"))
    with reference_boot(cell, ("sanity", "gpqa"), launcher, tmp_path, lambda _: None) as booting:
        assert booting is None
    assert launcher.started == []


def test_a_reference_started_in_its_own_thread_keeps_serving_until_the_cell_is_done(tmp_path):
    """A real simulated server through the local launcher. Its ranks die with the thread that started them
    (PR_SET_PDEATHSIG follows the creating thread): a thread that only booted the reference and ended would have
    taken it down the moment it was up."""
    import os
    import uuid

    import requests
    from dspark_ci.ground.processes import remove_run_temp_dir
    from dspark_ci.launchers.contract import LaunchContext
    from dspark_ci.launchers.local.lifecycle import LocalLauncher
    from dspark_ci.launchers.local.options import LocalOptions

    from tests.sim_plans import FAST_SIM

    run_id = f"reference-{uuid.uuid4().hex[:8]}"
    context = LaunchContext(run_id=run_id, run_dir=tmp_path / "run", server="sim", boot_timeout_s=60,
                            caller_env={**os.environ, **FAST_SIM})
    cell = speculative_cell()
    try:
        with ReferenceBoot(cell, LocalLauncher(LocalOptions(), context), tmp_path / "logs", lambda _: None) as booting:
            deployment = booting.deployment()
            for _ in range(10):  # the booting thread has long returned from the launcher's wait by now
                assert requests.get(f"{deployment.base_url}/health", timeout=10).status_code == 200
                deployment.check()
                time.sleep(0.2)
    finally:
        remove_run_temp_dir(run_id)
