"""The non-speculative reference a cell is compared with (parity, sampled losslessness, the speed sweep), booted
beside the cell's own launch rather than after it.

Booting them one after the other cost every such cell a whole extra boot of wall time: seconds on the simulator,
minutes for a real model. The reference boots in a thread of its own while the cell's thread launches the cell;
the scheduler has already placed both (``dspark_ci.cell_queue.Need.deployments``). If the cell's own launch fails,
the reference's boot is cut short (a KeyboardInterrupt in its thread, which unwinds its launcher's teardown exactly
as Ctrl-C does) rather than waited for.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from dspark_ci.ground import interrupts
from dspark_ci.ground.processes import signals_deferred
from dspark_ci.ground.suites import SUITE_DEFAULTS
from dspark_ci.launchers.contract import Launcher
from dspark_ci.launchers.launch_plan import plan_launch
from dspark_ci.matrices.cell import Cell

JOIN_POLL_S = 0.5  # how often a waiting thread looks at the run's interrupt flag


def launches_reference(cell: Cell, names: tuple[str, ...]) -> bool:
    """Parity, the accept suite's sampled losslessness and the speed suite's sweep compare against the same deployment
    without speculation, launched beside it: the cell then holds twice its nodes (``accept.sampled_temperature: 0``
    measures greedy acceptance alone, without one)."""
    sweep = "speed" in names and (cell.suites.get("speed") or {}).get("sweep_concurrency")
    accept = cell.suites.get("accept") or {}
    lossless = "accept" in names and accept.get("sampled_temperature",
                                                 SUITE_DEFAULTS["accept"]["sampled_temperature"]) > 0
    return bool("parity" in names or lossless or sweep) and not cell.expect.rejects


def colocated(cell: Cell) -> Cell:
    """A disaggregated cell's decode configuration served colocated (one server, no router)."""
    return replace(cell, id=f"{cell.id}-colocated", config=cell.role("decode").config.colocated(), roles=(),
                   router=None)


def without_speculation(cell: Cell) -> Cell:
    """Parity's reference: the same deployment without speculation (for a disaggregated cell, its decode
    configuration colocated: greedy text must hold through PD)."""
    base = colocated(cell) if cell.disaggregated else cell
    return replace(base, id=f"{cell.id}-reference", config=base.config.without_speculation())


def compares_layout(cell: Cell) -> bool:
    """Whether the cell's parity compares it with the same model on one rank (``parity.reference: one_rank``)."""
    options = cell.suites.get("parity") or {}
    return options.get("reference", SUITE_DEFAULTS["parity"]["reference"]) == "one_rank"


def one_rank(cell: Cell) -> Cell:
    """A layout's reference: the same model without speculation on one node at tp, dp, pp and cp 1. Greedy tokens
    must be the same at any layout up to bf16 ties; a numerics bug of tensor parallelism (an all-reduce skipped)
    leaves every rank healthy, and only this comparison shows it."""
    base = without_speculation(cell)
    config = replace(base.config, nnodes=1, tp=1, dp=1, pp=1, cp=1, cp_strategy=None, enable_dp_attention=False,
                     enable_dp_lm_head=False)
    return replace(base, config=config)


def reference_of(cell: Cell) -> Cell:
    """The deployment a cell is compared with: ``one_rank`` for a layout parity, else ``without_speculation``."""
    return one_rank(cell) if compares_layout(cell) else without_speculation(cell)


class ReferenceBoot:
    """One reference deployment in a thread of its own, from its launch to its teardown; ``deployment()`` waits
    until it is up, ``close()`` cuts a boot still under way short, or lets the thread tear the deployment down.

    The thread holds the deployment for its whole life, not just its boot: a local rank dies with the thread that
    started it (PR_SET_PDEATHSIG, which the local launcher sets so that no rank outlives a killed run, follows the
    creating thread, not the process)."""

    def __init__(self, cell: Cell, launcher: Launcher, logs_dir: Path, stage: Callable[[str], None]):
        self._deployment: Any = None
        self._error: BaseException | None = None
        self._up = threading.Event()  # booted, or failed to
        self._release = threading.Event()  # the cell is done with it
        self._thread = threading.Thread(target=self._run, args=(cell, launcher, logs_dir, stage),
                                        name=f"reference-{cell.id}", daemon=True)

    def _run(self, cell: Cell, launcher: Launcher, logs_dir: Path, stage: Callable[[str], None]) -> None:
        try:
            reference = reference_of(cell)
            stage(f"{cell.id}: launching the non-speculative reference"
                  + (" on one rank" if compares_layout(cell) else ""))
            plan = plan_launch(reference, launcher.placement(reference.nnodes, reference.config.gpus_per_node))
            with launcher.launch(plan, logs_dir / "reference") as deployment:
                self._deployment = deployment
                self._up.set()
                # Up: it lives until the cell releases it, Ctrl-C included. The cell's thread acts on a Ctrl-C and
                # then releases it; torn down from here on its own, it would read to the cell as a rank that exited.
                while not self._release.wait(JOIN_POLL_S):
                    pass
        except BaseException as err:  # noqa: BLE001 - handed to the cell's thread, which raises it
            self._error = err
        finally:
            self._up.set()

    def __enter__(self) -> ReferenceBoot:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def deployment(self) -> Any:
        """The reference, once healthy; its launch's error (LaunchFailed, a timeout, an interrupt) raised here."""
        # A blocking wait would not see the run's Ctrl-C, nor a KeyboardInterrupt raised into this thread by
        # interrupts.interrupt: poll, and look at the flag between polls.
        while not self._up.wait(JOIN_POLL_S):
            interrupts.check()
        if self._error is not None:
            raise self._error
        return self._deployment

    def release(self) -> None:
        """The cell is done with it: its thread starts tearing it down now, beside the cell's own teardown
        (``close`` then waits for it)."""
        self._release.set()

    def close(self) -> None:
        """Cut a boot still under way short (its launcher tears down what it started, as on Ctrl-C), or let the
        thread tear the deployment down; wait for the thread whatever else happens."""
        with signals_deferred():  # a Ctrl-C now waits until the reference is gone
            if not self._up.is_set():
                interrupts.interrupt(self._thread)
            self._release.set()
            self._thread.join()


def reference_boot(cell: Cell, names: tuple[str, ...], launcher: Launcher, logs_dir: Path,
                   stage: Callable[[str], None]) -> contextlib.AbstractContextManager[ReferenceBoot | None]:
    """The cell's reference booting beside it, or nothing when none of ``names`` compares against one."""
    if not launches_reference(cell, names):
        return contextlib.nullcontext()
    return ReferenceBoot(cell, launcher, logs_dir, stage)
