"""One cell, start to finish: plan → launch → measure → gate, reduced to a result record.

Every way a cell can end maps to one CONTRACT.md status and one exit-code contribution here,
so the run itself only collects records.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from dspark_ci.errors import ExitCode, InfraError
from dspark_ci.suite_runner import DEFAULT_SUITES, SuiteOutcome, SuiteRequest, run_suites, suite_of
from launchers.base import LaunchFailed, LaunchTimeout
from launchers.plan import plan_launch
from matrices.cell import REJECT, Cell


@dataclass(frozen=True)
class CellContext:
    launcher: Any  # LocalLauncher | DockerLauncher: .placement(nnodes), .launch(plan, logs_dir)
    run_dir: Path
    sglang_version: str  # the version under test, for expectations written for a version spec
    suites: tuple[str, ...] | None  # --suites override; None = the cell's own
    gate: Callable[[dict, dict], list]  # (cell dict, metrics) -> CONTRACT gate dicts
    stage: Callable[[str], None] = lambda _label: None
    suite_defaults: Callable[[dict], dict] = lambda options: options  # e.g. the simulator's dataset


@dataclass(frozen=True)
class CellOutcome:
    record: dict  # the cell's entry in results.json
    exit_code: ExitCode


def run_cell(cell: Cell, ctx: CellContext) -> CellOutcome:
    record = new_record(cell)
    if not _expectation_applies(cell, ctx.sglang_version):
        return _finish(record, "skipped", f"expectation written for SGLang {cell.expect.sglang}, "
                                          f"testing {ctx.sglang_version}", ExitCode.OK)
    logs_dir = ctx.run_dir / "logs" / cell.id
    plan = plan_launch(cell, ctx.launcher.placement(cell.nnodes))
    ctx.stage(f"{cell.id}: launching {len(plan.ranks)} rank(s)")
    try:
        with contextlib.ExitStack() as stack:
            deployment = stack.enter_context(ctx.launcher.launch(plan, logs_dir))
            record["boot_seconds"] = round(deployment.boot_seconds, 3)
            if cell.expect.outcome == REJECT:
                return _finish(record, "failed", f"expected SGLang to reject this cell "
                                                 f"(/{cell.expect.message}/) but it became healthy", ExitCode.FELL_SHORT)
            names = _suite_names(cell, ctx)
            reference_url = _launch_reference(cell, names, ctx, stack, logs_dir)
            ctx.stage(f"{cell.id}: measuring ({', '.join(names)})")
            outcome = run_suites(SuiteRequest(
                base_url=deployment.base_url, names=names, model=cell.config.get("model"),
                options=ctx.suite_defaults({n: dict(cell.suites.get(n, {})) for n in names}),
                work_dir=logs_dir, reference_url=reference_url))
            deployment.check()  # a rank that died while we measured invalidates the numbers
    except (LaunchTimeout, InfraError) as err:  # the machine's fault, not the cell's: record it and go on
        return _finish(record, "error", str(err), ExitCode.INFRA)
    except LaunchFailed as err:
        if cell.expect.outcome == REJECT:
            return _judge_rejection(record, cell, err)
        return _finish(record, "error", str(err), ExitCode.FELL_SHORT)
    return _judge_measurement(record, cell, names, outcome, ctx)


def new_record(cell: Cell) -> dict:
    """A cell's results.json entry before anything happened (CONTRACT.md keys, plus the cell's suite options
    so `dspark-ci report --baseline` can gate again exactly as the run did)."""
    return {"id": cell.id, "config": dict(cell.config), "expect": cell.expect.to_dict(), "runner": cell.runner,
            "suites": {name: dict(options) for name, options in cell.suites.items()}, "baseline": cell.baseline,
            "status": "error", "error": None, "boot_seconds": None, "metrics": {}, "gates": [], "warnings": []}


def _judge_rejection(record: dict, cell: Cell, err: LaunchFailed) -> CellOutcome:
    said = err.sglang_error or ""
    if cell.expect.message and re.search(cell.expect.message, said):
        return _finish(record, "rejected_as_expected", None, ExitCode.OK, detail=said)
    return _finish(record, "failed", f"expected a rejection matching /{cell.expect.message}/, but "
                   f"{'SGLang said: ' + said if said else 'no SGLang error line was found'}\n  {err}",
                   ExitCode.FELL_SHORT)


def _judge_measurement(record: dict, cell: Cell, names, outcome: SuiteOutcome, ctx: CellContext) -> CellOutcome:
    record["metrics"] = outcome.metrics
    record["warnings"] = list(outcome.warnings)
    record["tests"] = outcome.tests
    # A baseline gate on a suite this run did not select (--suites) is not applicable; one on a suite that ran
    # but did not produce its metric still fails.
    gates = ctx.gate(cell.to_dict(), outcome.metrics)
    record["gates"] = [g for g in gates if suite_of(g["metric"]) in names]
    record["warnings"] += sorted({f"{suite_of(g['metric'])} suite not run: gate on {g['metric']} not applied"
                                  for g in gates if suite_of(g["metric"]) not in names})
    if outcome.failures:  # failed gates are in record["gates"]; `error` is for everything else
        return _finish(record, "failed", "; ".join(outcome.failures), ExitCode.FELL_SHORT)
    if not all(gate["passed"] for gate in record["gates"]):
        return _finish(record, "failed", None, ExitCode.FELL_SHORT)
    return _finish(record, "passed", None, ExitCode.OK)


def _finish(record: dict, status: str, error: str | None, code: ExitCode, detail: str | None = None) -> CellOutcome:
    record["status"] = status
    record["error"] = error
    if detail:
        record["detail"] = detail
    return CellOutcome(record, code)


def _expectation_applies(cell: Cell, version: str) -> bool:
    if not cell.expect.sglang:
        return True
    try:
        return SpecifierSet(cell.expect.sglang).contains(version, prereleases=True)
    except InvalidSpecifier:
        return True  # validated where the matrix is loaded


def _suite_names(cell: Cell, ctx: CellContext) -> tuple[str, ...]:
    names = ctx.suites or tuple(cell.suites) or DEFAULT_SUITES
    if not cell.speculative:  # speculation-only measurements mean nothing on a plain deployment
        names = tuple(n for n in names if n not in ("accept", "parity"))
    return names


def _launch_reference(cell: Cell, names, ctx: CellContext, stack: contextlib.ExitStack, logs_dir: Path) -> str | None:
    """Parity compares against the same deployment without speculation, launched beside it."""
    if "parity" not in names:
        return None
    reference = without_speculation(cell)
    ctx.stage(f"{cell.id}: launching the non-speculative reference")
    plan = plan_launch(reference, ctx.launcher.placement(reference.nnodes))
    deployment = stack.enter_context(ctx.launcher.launch(plan, logs_dir / "reference"))
    return deployment.base_url


def without_speculation(cell: Cell) -> Cell:
    config = {k: v for k, v in cell.config.items() if not k.startswith("speculative") and k != "draft_model"}
    config["speculative_algorithm"] = None
    return replace(cell, id=f"{cell.id}-reference", config=config)
