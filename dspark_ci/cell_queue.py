"""Cells side by side: up to ``max_parallel`` cells in flight, within the nodes the launcher has, longest first.

    order (longest first, from the history's cell times) → start every queued cell that fits → wait for one to
    finish → hand its result to the run (main thread) → start what fits now → ... until none is left

Each cell in flight runs ``run_one`` (``dspark_ci.cell_run.run_cell``) in a thread of its own and stays isolated:
its own ports, ledger lines, logs and result; one cell's failure, timeout or rejection is its own result and never
touches another. Results are handed over in the main thread only, so the results files have one writer.

Ctrl-C and SIGTERM reach the main thread; it interrupts every cell in flight (``dspark_ci.ground.interrupts``: the same
unwinding, hence the same teardown, as a one-at-a-time run), waits for their teardowns, and raises ``Interrupted``
naming the cells that finished, were cut short, and never started. With ``max_parallel`` 1 everything happens in
the main thread, exactly as a one-at-a-time run always did.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from dspark_ci.ci.nightly.shards import estimate_seconds
from dspark_ci.ground import interrupts
from dspark_ci.ground.processes import signals_deferred
from dspark_ci.ground.records import CellResult
from dspark_ci.launchers.contract import Capacity, Need
from dspark_ci.matrices.cell import Cell

TEARDOWN_WAIT_S = 300.0  # after an interrupt: how long the cells in flight may take to tear down


def expected_seconds(cell: Cell, known: Mapping[str, float]) -> float:
    """The cell's last measured time, else an estimate from what it does (an expected rejection is over once SGLang
    refuses; a served cell boots and measures; a reference for parity is a second boot; every extra node adds a
    pull and a rendezvous)."""
    if cell.id in known:
        return known[cell.id]
    # what the nightly assumes
    return estimate_seconds({"expect": cell.expect.outcome, "nnodes": cell.nnodes, "suites": cell.suites})


def longest_first(cells: Sequence[Cell], known: Mapping[str, float]) -> list[Cell]:
    """Longest expected time first (LPT), ties in matrix order: the longest cell never starts last."""
    position = {cell.id: index for index, cell in enumerate(cells)}
    return sorted(cells, key=lambda c: (-expected_seconds(c, known), position[c.id]))


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM: every cell in flight was torn down; what each cell got to."""

    def __init__(self, finished: Sequence[tuple[Cell, CellResult]], cut_short: Sequence[Cell],
                 not_started: Sequence[Cell]):
        super().__init__("interrupted")
        self.finished, self.cut_short, self.not_started = tuple(finished), tuple(cut_short), tuple(not_started)


@dataclass
class Scheduler:
    cells: Sequence[Cell]  # in the order to start them
    run_one: Callable[[Cell], CellResult]  # never raises but KeyboardInterrupt
    capacity: Capacity
    on_start: Callable[[Cell], None] = lambda cell: None  # main thread
    on_result: Callable[[Cell, CellResult], None] = lambda cell, result: None  # main thread
    need: Callable[[Cell], Need] = lambda cell: need_of(cell)  # what a cell holds in flight, its reference included
    _done: queue.Queue = field(default_factory=queue.Queue)

    def run(self) -> None:
        if self.capacity.max_parallel <= 1:
            self._one_at_a_time()
        else:
            self._side_by_side()

    def _one_at_a_time(self) -> None:
        for index, cell in enumerate(self.cells):
            try:
                interrupts.check()  # one Python dropped while the last cell ran
            except KeyboardInterrupt:
                raise Interrupted((), (), self.cells[index:]) from None
            self.on_start(cell)
            try:
                result = self.run_one(cell)
            except KeyboardInterrupt:
                raise Interrupted((), (cell,), self.cells[index + 1:]) from None
            self.on_result(cell, result)

    def _side_by_side(self) -> None:
        waiting = list(self.cells)
        flying: dict[str, tuple[Cell, threading.Thread]] = {}
        try:
            while waiting or flying:
                for cell in list(waiting):
                    if self.capacity.fits(self.need(cell), [self.need(c) for c, _ in flying.values()]):
                        waiting.remove(cell)
                        flying[cell.id] = (cell, self._start(cell))
                cell, outcome = self._next_done()
                if isinstance(outcome, BaseException):
                    # Still in flight for the teardown: a cell whose own thread saw the interrupt first (every
                    # wait checks it) is recorded as cut short, not lost.
                    raise outcome
                flying.pop(cell.id)
                self.on_result(cell, outcome)
        except KeyboardInterrupt:
            raise self._tear_down(flying, waiting) from None
        except BaseException:  # a bug, or the results cannot be written: the other cells go down too
            self._tear_down(flying, waiting)
            raise

    def _start(self, cell: Cell) -> threading.Thread:
        self.on_start(cell)

        def work() -> None:
            try:
                outcome: CellResult | BaseException = self.run_one(cell)
            except BaseException as err:  # KeyboardInterrupt (interrupted), or a bug: the main thread decides
                outcome = err
            self._done.put((cell, outcome))

        thread = threading.Thread(target=work, name=f"cell {cell.id}", daemon=True)
        thread.start()
        return thread

    def _next_done(self) -> tuple[Cell, CellResult | BaseException]:
        while True:  # a bounded wait, so Ctrl-C is seen at once whatever the platform does with blocking waits
            interrupts.check()
            try:
                return self._done.get(timeout=0.5)
            except queue.Empty:
                continue

    def _tear_down(self, flying: dict[str, tuple[Cell, threading.Thread]], waiting: list[Cell]) -> Interrupted:
        """Interrupt every cell in flight and wait for its teardown (a second Ctrl-C waits too)."""
        with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C, held until here: the run is stopping anyway
            with signals_deferred():
                for _, thread in flying.values():
                    interrupts.interrupt(thread)
                for _, thread in flying.values():
                    thread.join(TEARDOWN_WAIT_S)
        finished, cut_short = [], []
        while True:
            try:
                cell, outcome = self._done.get_nowait()
            except queue.Empty:
                break
            if isinstance(outcome, CellResult):
                finished.append((cell, outcome))
            else:
                cut_short.append(cell)
        ended = {c.id for c, _ in finished} | {c.id for c in cut_short}
        cut_short += [cell for cell, _ in flying.values() if cell.id not in ended]  # still tearing down
        return Interrupted(finished, cut_short, waiting)


def need_of(cell: Cell, with_reference: bool = False) -> Need:
    """What a cell holds while in flight: its nodes and each node's accelerators; twice the nodes when it launches
    its non-speculative reference beside it (two cells each waiting for its reference on nodes the other holds
    would wait for ever)."""
    return Need(cell.nnodes, cell.config.gpus_per_node, deployments=2 if with_reference else 1)
