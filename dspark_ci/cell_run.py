"""One cell, start to finish: plan → launch → measure (watching every rank) → gate, reduced to a ``CellResult``.

Every way a cell can end maps to one ``Status`` and one exit-code contribution here, including the ways
nobody planned for: an unexpected exception in any stage becomes this cell's ``error`` (traceback kept in
``logs/<cell>/dspark-ci-error.log``) and the run goes on to the next cell.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from dspark_ci.evidence import Sampling, more_evidence
from dspark_ci.ground.errors import BadInput, DsparkError, ExitCode, InfraError
from dspark_ci.ground.identity import CellIdentity, cell_identity
from dspark_ci.ground.ledger import Ledger
from dspark_ci.ground.records import CellResult, CellTiming, GateResult, Status
from dspark_ci.ground.suites import ALWAYS_SUITES, DEFAULT_SUITES, SPECULATIVE_SUITES, suite_of
from dspark_ci.launchers.contract import Launcher, LaunchFailed, LaunchTimeout, LocalProcesses
from dspark_ci.launchers.launch_plan import plan_launch
from dspark_ci.launchers.pd.pd_group import launch_pd
from dspark_ci.launchers.pd.pd_plan import template_plans
from dspark_ci.matrices.cell import Cell
from dspark_ci.pd_accept import PD_BOOT_TIMEOUT_S, equivalence_gates, with_colocated_accept
from dspark_ci.reference_boot import colocated, compares_layout, reference_boot
from dspark_ci.reports.gates import status_of
from dspark_ci.suite_runner import (
    SuiteOutcome,
    SuiteRequest,
    Watch,
    acceptance_note,
    envelope_note,
    gpqa_note,
    mc_note,
    run_suites,
    written_outcome,
)

ERROR_LOG = "dspark-ci-error.log"


@dataclass(frozen=True)
class CellContext:
    launcher: Launcher
    run_dir: Path
    sglang_version: str  # the version under test, for expectations written for a version spec
    suites: tuple[str, ...] | None  # --suites override; None = the cell's own
    gate: Callable[[CellResult, Mapping], tuple[GateResult, ...]]
    stage: Callable[[str], None] = lambda _label: None
    detail: Callable[[str], None] = lambda _text: None  # how far the stage is, e.g. "gpqa 37/198 requests"
    suite_defaults: Callable[[dict], dict] = lambda options: options  # e.g. the simulator's dataset
    watch: Watch = Watch()
    server: str = "sim"  # the kind of server under test (dspark_ci.launchers.contract.SERVERS)
    build: str = ""  # the build under test, e.g. "sglang X.Y.Z" (a cell's identity keeps it apart from its setup)
    forwarded_env: Mapping[str, str] = field(default_factory=dict)  # caller variables every rank gets (DSPARK_SIM_*)
    ledger: Ledger | None = None  # where the suites' process group is recorded before it can start anything
    sampling: Sampling = Sampling()  # more boots for inconclusive gates, retries for failed cells
    measuring: Callable[[], None] = lambda: None  # a cell's suites have started: the run waits on them from here


def pending_result(cell: Cell) -> CellResult:
    """A cell's result before anything happened (with its suite options and baseline, so that
    `dspark-ci report --baseline` can gate again exactly as the run did)."""
    return CellResult(id=cell.id, config=cell.config, expect=cell.expect, runner=cell.runner,
                      suites=cell.suites, baseline=cell.baseline)


@dataclass
class CellClock:
    """Marks a cell's start, the moment rank 0 was ready and its end, on the wall clock (for the record) and the
    monotonic one (for the durations)."""

    wall: Callable[[], float] = time.time
    mono: Callable[[], float] = time.monotonic
    started: tuple[float, float] = field(init=False)
    ready: tuple[float, float] | None = field(init=False, default=None)

    def __post_init__(self):
        self.started = (self.wall(), self.mono())

    def mark_ready(self) -> None:
        self.ready = (self.wall(), self.mono())

    def timed(self, result: CellResult) -> CellResult:
        """``result`` with its timing, the cell finishing now."""
        finished = (self.wall(), self.mono())
        ready = self.ready
        to_ready = ready[1] - self.started[1] if ready else None
        queue = max(0.0, to_ready - result.boot_seconds) if to_ready is not None and result.boot_seconds is not None \
            else None
        return replace(result, timing=CellTiming(
            started_at=_iso(self.started[0]), ready_at=_iso(ready[0]) if ready else None, finished_at=_iso(finished[0]),
            queue_seconds=_rounded(queue), measure_seconds=_rounded(finished[1] - ready[1]) if ready else None,
            seconds=_rounded(finished[1] - self.started[1])))


def _iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).isoformat(timespec="milliseconds")


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def run_cell(cell: Cell, ctx: CellContext, clock: CellClock | None = None) -> CellResult:
    """Never raises except KeyboardInterrupt (Ctrl-C / SIGTERM): every other ending is a result, with its timing."""
    clock = clock or CellClock()
    return clock.timed(_decided(cell, ctx, clock))


def _decided(cell: Cell, ctx: CellContext, clock: CellClock) -> CellResult:
    result = pending_result(cell)
    try:
        result = replace(result, identity=identify(cell, ctx))
        return _run_cell(cell, ctx, result, clock)
    except (LaunchTimeout, InfraError) as err:  # the machine's fault, not the cell's: record it and go on
        return result.finished(Status.ERROR, str(err), ExitCode.INFRA, sglang_error=_sglang_error(err))
    except BadInput as err:
        return result.finished(Status.ERROR, str(err), ExitCode.BAD_INPUT)
    except DsparkError as err:
        return result.finished(Status.ERROR, str(err), ExitCode.FELL_SHORT, sglang_error=_sglang_error(err))
    except Exception as err:  # a bug of ours or a library's: red, with the traceback kept, and the run goes on
        return result.finished(Status.ERROR, _unexpected(err, ctx.run_dir / "logs" / cell.id), ExitCode.FELL_SHORT)


def _run_cell(cell: Cell, ctx: CellContext, result: CellResult, clock: CellClock) -> CellResult:
    if not expectation_applies(cell, ctx.sglang_version):
        return result.finished(Status.SKIPPED, f"expectation written for SGLang {cell.expect.sglang}, "
                                               f"testing {ctx.sglang_version}", ExitCode.OK)
    logs_dir = ctx.run_dir / "logs" / cell.id
    names = suite_names(cell, ctx.suites)
    first = _boot_and_measure(cell, ctx, result, clock, logs_dir, names)

    def measure(attempt: int, suites: tuple[str, ...]) -> CellResult:
        ctx.stage(f"{cell.id}: more evidence, boot {attempt}")
        # every boot is a new server: the sanity check runs again beside the suites still undecided
        return _boot_and_measure(cell, ctx, result, clock, logs_dir / f"boot-{attempt}", with_always_suites(suites))

    return more_evidence(first, names, ctx.sampling, measure, lambda pooled, suites: _judge(pooled, suites, ctx))


def _boot_and_measure(cell: Cell, ctx: CellContext, result: CellResult, clock: CellClock, logs_dir: Path,
                      names: tuple[str, ...]) -> CellResult:
    """One boot of the cell: launch, measure ``names``, tear down, judge."""
    try:
        with contextlib.ExitStack() as stack:
            booting = stack.enter_context(reference_boot(cell, names, ctx.launcher, logs_dir, ctx.stage))
            deployment = _launch(cell, ctx, stack, logs_dir)
            if clock.ready is None:
                clock.mark_ready()
            result = replace(result, boot_seconds=result.boot_seconds or round(deployment.boot_seconds, 3))
            if cell.expect.rejects:
                return result.finished(Status.FAILED, f"expected SGLang to reject this cell "
                                       f"(/{cell.expect.message}/) but it became healthy", ExitCode.FELL_SHORT)
            reference = booting.deployment() if booting else None
            ctx.stage(f"{cell.id}: measuring ({', '.join(names)})")
            outcome = run_suites(SuiteRequest(
                base_url=deployment.base_url, names=names, model=cell.config.model,
                options=ctx.suite_defaults({n: dict(cell.suites.get(n, {})) for n in names}),
                work_dir=logs_dir, reference_url=reference.base_url if reference else None, on_progress=ctx.detail,
                on_started=ctx.measuring,
                ledger=ctx.ledger, cell_id=cell.id, roles=deployment.endpoints if cell.disaggregated else (),
                server_pids=deployment.rank_pids if isinstance(deployment, LocalProcesses) else ()),
                watched=[d for d in (deployment, reference) if d is not None],
                watch=ctx.watch.for_device(cell.config.device))
            deployment.check()  # a rank that died while we measured invalidates the numbers
            if booting:  # measured: the reference goes down beside the cell's own teardown, not after it
                booting.release()
        # after the PD group is gone, so the baseline never waits for nodes the group holds (a small cluster)
        if cell.disaggregated and "accept" in names and outcome.stopped_by is None:
            outcome = with_colocated_accept(outcome, _colocated_accept(cell, ctx, logs_dir))
    except LaunchFailed as err:
        if isinstance(err, LaunchTimeout):
            raise
        if cell.expect.rejects:
            return _judge_rejection(result, cell, err)
        failed = result.finished(Status.ERROR, str(err), ExitCode.FELL_SHORT, sglang_error=err.sglang_error)
        return kept_from_failed_cell(failed, written_outcome(logs_dir))
    return _judge_measurement(result, names, outcome, ctx)


# A failing cell's label when its metrics are what its suites finished before it failed: kept (results.json,
# results.jsonl, history), never gated (a rank that died may have skewed them).
FAILED_CELL_METRICS = "metrics_from_failed_cell"


def kept_from_failed_cell(failed: CellResult, outcome: SuiteOutcome) -> CellResult:
    """``failed`` with the metrics its suites finished, marked FAILED_CELL_METRICS and without gates."""
    metrics = {name: value for name, value in outcome.metrics.items() if value is not None}
    if not metrics:
        return failed
    return replace(failed, metrics=metrics, gates=(), gpqa=failed.gpqa or gpqa_note(outcome.records),
                   labels=tuple(dict.fromkeys((*failed.labels, FAILED_CELL_METRICS))),
                   warnings=(*failed.warnings, f"{len(metrics)} metric(s) measured before the cell failed: kept, "
                                               "not gated"))


def identify(cell: Cell, ctx: CellContext) -> CellIdentity:
    """The cell's identity as this run measures it: the argv as `dspark-ci plan` prints it (free ports and
    addresses differ from launch to launch, not the measurement), the suites with their resolved options."""
    ranks = [rank for plan in template_plans(cell) for rank in plan.ranks]  # every role instance's, for PD
    # the sanity check measures nothing
    measuring = [n for n in suite_names(cell, ctx.suites) if n not in ALWAYS_SUITES]
    options = ctx.suite_defaults({n: dict(cell.suites.get(n, {})) for n in measuring})
    dataset = options.get("gpqa", {}).pop("dataset", None)
    image = cell.image if ctx.server != "sim" and ctx.launcher.name != "local" else None
    return cell_identity(server=f"{ctx.server} via {ctx.launcher.name}",
                         build=" image ".join(filter(None, [ctx.build, image])),
                         argv=[list(rank.argv) for rank in ranks],
                         env={**ctx.forwarded_env, **ranks[0].env}, model=cell.config.get("model"),
                         suites=options, dataset=dataset, hardware=cell.runner)


def _judge_rejection(result: CellResult, cell: Cell, err: LaunchFailed) -> CellResult:
    said = err.sglang_error or ""
    if cell.expect.message and re.search(cell.expect.message, said):
        return result.finished(Status.REJECTED_AS_EXPECTED, None, ExitCode.OK, sglang_error=said)
    return result.finished(Status.FAILED, f"expected a rejection matching /{cell.expect.message}/, but "
                           f"{'SGLang said: ' + said if said else 'no SGLang error line was found'}\n  {err}",
                           ExitCode.FELL_SHORT, sglang_error=err.sglang_error)


def _judge_measurement(result: CellResult, names: tuple[str, ...], outcome: SuiteOutcome,
                       ctx: CellContext) -> CellResult:
    measured = replace(result, metrics=outcome.metrics, warnings=tuple(outcome.warnings), tests=tuple(outcome.tests),
                       gpqa=gpqa_note(outcome.records), mc=mc_note(outcome.records),
                       acceptance=acceptance_note(outcome.records), envelope=envelope_note(outcome.records))
    return _judge(measured, names, ctx, outcome.stopped_by, equivalence_gates(outcome.records))


def _judge(measured: CellResult, names: tuple[str, ...], ctx: CellContext,
           stopped_by: DsparkError | None = None, extra_gates: tuple[GateResult, ...] = ()) -> CellResult:
    """Gate what was measured (one boot, or several pooled) and decide the cell's status."""
    # A baseline gate on a suite this run did not select (--suites) is not applicable; one on a suite that ran
    # but did not produce its metric still fails.
    gates = ctx.gate(measured, measured.metrics)
    applied = tuple(g for g in gates if suite_of(g.metric) in names) + extra_gates  # PD vs colocated
    warnings = tuple(dict.fromkeys(measured.warnings + tuple(sorted(
        {f"{suite_of(g.metric)} suite not run: gate on {g.metric} not applied"
         for g in gates if suite_of(g.metric) not in names}))))
    measured = replace(measured, gates=applied, warnings=warnings)
    if stopped_by is not None:  # a rank died or hung while the suites ran: the numbers are kept, not gated
        err = stopped_by
        failed = replace(measured, metrics={}, gates=()).finished(Status.ERROR, str(err), _exit_code_of(err),
                                                                 sglang_error=getattr(err, "sglang_error", None))
        return kept_from_failed_cell(failed, SuiteOutcome(metrics=dict(measured.metrics)))
    if measured.failed_tests:  # failed gates are in `gates`; `error` is for everything else
        return measured.finished(Status.FAILED, "; ".join(measured.failed_tests), ExitCode.FELL_SHORT)
    return measured.finished(status_of(applied))  # passed, failed (a gate regressed) or inconclusive


def _exit_code_of(err: DsparkError) -> ExitCode:
    return ExitCode.INFRA if isinstance(err, InfraError) else ExitCode.FELL_SHORT


def _sglang_error(err: Exception) -> str | None:
    return getattr(err, "sglang_error", None)


def _unexpected(err: Exception, logs_dir: Path) -> str:
    """The one-line error for an exception nobody planned for; the traceback goes to the cell's logs."""
    where = logs_dir / ERROR_LOG
    try:
        logs_dir.mkdir(parents=True, exist_ok=True)
        where.write_text("".join(traceback.format_exception(err)))
        kept = f"traceback in {where}"
    except OSError as write_err:
        kept = f"traceback could not be written ({write_err.strerror})"
    return f"unexpected {type(err).__name__}: {err} (a dspark-ci bug or an environment problem; {kept})"


def expectation_applies(cell: Cell, version: str) -> bool:
    if not cell.expect.sglang:
        return True
    try:
        return SpecifierSet(cell.expect.sglang).contains(version, prereleases=True)
    except InvalidSpecifier:
        return True  # validated where the matrix is loaded


def suite_names(cell: Cell, selected: tuple[str, ...] | None) -> tuple[str, ...]:
    """The suites a serving cell runs: ``selected`` (--suites), else its own, else the defaults; always the
    sanity check first."""
    names = selected or tuple(cell.suites) or DEFAULT_SUITES
    if not cell.speculative:  # speculation-only measurements mean nothing on a plain deployment (but for parity
        # against one rank: a layout's own numerics)
        names = tuple(n for n in names if n not in SPECULATIVE_SUITES or (n == "parity" and compares_layout(cell)))
    return with_always_suites(names)


def with_always_suites(names: tuple[str, ...]) -> tuple[str, ...]:
    return ALWAYS_SUITES + tuple(n for n in names if n not in ALWAYS_SUITES)


def _launch(cell: Cell, ctx: CellContext, stack: contextlib.ExitStack, logs_dir: Path):
    """The cell's deployment: its ranks, or for a disaggregated cell every role instance and the router."""
    if cell.disaggregated:
        ctx.stage(f"{cell.id}: launching {sum(r.count for r in cell.roles)} role instance(s) and the router")
        return stack.enter_context(launch_pd(ctx.launcher, cell, logs_dir, ctx.forwarded_env, ctx.ledger,
                                             PD_BOOT_TIMEOUT_S))
    plan = plan_launch(cell, ctx.launcher.placement(cell.nnodes, cell.config.gpus_per_node))
    ctx.stage(f"{cell.id}: launching {len(plan.ranks)} rank(s)")
    return stack.enter_context(ctx.launcher.launch(plan, logs_dir))


def _colocated_accept(cell: Cell, ctx: CellContext, logs_dir: Path) -> SuiteOutcome:
    """Acceptance under PD is judged against the same decode configuration served colocated: booted once the PD
    group is down, measured with the same accept options, torn down."""
    ctx.stage(f"{cell.id}: launching the colocated decode baseline")
    base = colocated(cell)
    plan = plan_launch(base, ctx.launcher.placement(base.nnodes, base.config.gpus_per_node))
    with ctx.launcher.launch(plan, logs_dir / "colocated") as deployment:
        return _measure_colocated(cell, deployment, ctx, logs_dir)


def _measure_colocated(cell: Cell, deployment, ctx: CellContext, logs_dir: Path) -> SuiteOutcome:
    ctx.stage(f"{cell.id}: measuring acceptance on the colocated baseline")
    options = ctx.suite_defaults({"accept": dict(cell.suites.get("accept", {}))})
    return run_suites(SuiteRequest(base_url=deployment.base_url, names=("accept",), model=cell.config.model,
                                   options=options, work_dir=logs_dir / "colocated-suites", on_progress=ctx.detail,
                                   ledger=ctx.ledger, cell_id=f"{cell.id}-colocated"),
                      watched=[deployment], watch=ctx.watch.for_device(cell.config.device))
