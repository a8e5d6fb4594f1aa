"""Running the measurement suites against a deployment: pytest in a subprocess, results as plain data.

The suites are the same files a user runs standalone (``pytest suites/ --base-url URL``); the run
hands them a base URL and options and reads back the JSON they write (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from dspark_ci import suites as suites_package
from dspark_ci.ground import interrupts
from dspark_ci.ground.errors import DsparkError, InfraError
from dspark_ci.ground.install_root import IMPORT_ROOT
from dspark_ci.ground.ledger import Ledger
from dspark_ci.ground.measurements import Acceptance, Envelope, GpqaSummary, McSummary, SuiteTestOutcome
from dspark_ci.ground.processes import die_with_parent, group_members, kill_group, run_env, signal_group, started_at
from dspark_ci.ground.suites import effective_options
from dspark_ci.launchers.contract import Deployment, LaunchFailed
from dspark_ci.launchers.pd.pd_group import RoleEndpoint
from dspark_ci.suites.output import GPQA_SAMPLES_FILE
from dspark_ci.suites.progress_file import read_progress
from dspark_ci.warm_worker import WarmChild, WarmPytest, warm_worker

SUITES_DIR = Path(suites_package.__file__).parent
SYNTHETIC_GPQA = SUITES_DIR / "data" / "gpqa_synthetic.csv"
MC_ITEMS = SUITES_DIR / "data" / "mc_countries.json"  # the mc suite's built-in items (suites/mc.py BUILTIN)


# A request may take this long before its first token (queueing, a long prefill) plus this long per token it
# may generate, times the requests sharing the server with it: far above any healthy server (a 4 tok/s decode of
# each of its concurrent requests), so only a server that stopped answering hits it. The concurrency counts because a
# compute-bound server (SGLang's engine on 2 CPU cores) steps a batch of 4 about as slowly as 4 single requests: 96
# tokens at concurrency 4 under speculation took over 84 s there, and a timeout is no verdict on a healthy server.
REQUEST_BASE_S = 60.0
REQUEST_PER_TOKEN_S = 0.25
UNCAPPED_TOKENS = 65536  # a request without max_tokens: as long as a long thinking trace

# The run's pytest loads no plugin the environment happens to have installed (hypothesis, xdist, benchmark, anyio's):
# the suites use none, each cost seconds per cell to import (hypothesis at every session's end), and a measurement
# must not depend on what else is installed. Standalone `pytest suites/` loads them as usual.
SUITE_RUN_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


@dataclass(frozen=True)
class Watch:
    """How the deployment is watched while the suites run (the hang and death detection bounds).

    Stated bounds, from the moment it happens to the suites being stopped: a rank that exits or is stopped
    (SIGSTOP, a debugger) within ``poll_s`` (plus the launcher's check, e.g. its settle time); a rank 0 whose
    /health stops answering within ``unresponsive_after_s + poll_s``. Stopping the suites then takes until
    pytest has written what it measured (at most ``stop_grace_s``). /health is probed beside the loop, so a
    probe hanging on a stopped server never delays the rank checks.
    """

    poll_s: float = 1.0  # every rank's state is checked this often
    unresponsive_after_s: float = 30.0  # rank 0's /health silent this long: the cell fails as unresponsive
    probe_timeout_s: float = 5.0
    suites_timeout_s: float = 3 * 3600.0  # the whole suite run, a last resort behind the two above
    stop_grace_s: float = 10.0  # SIGINT lets pytest write what it measured so far; then SIGKILL

    def for_device(self, device: str) -> Watch:
        """The bounds for a deployment on ``device``: a CPU's rank 0 may be silent longer (SILENT_WORKING_S)."""
        longest = SILENT_WORKING_S.get(device, 0.0)
        return replace(self, unresponsive_after_s=max(self.unresponsive_after_s, longest))


# SGLang's /health answers 503 once no token came out for 20 s. On a CPU of 2 shared cores one speculative batch step
# took longer than that at load 12 (STANDALONE, whose draft runs 27 layers three times a step): a working server,
# only slow. There a hang is caught after this long, and by every request's own timeout before the suites end.
SILENT_WORKING_S = {"cpu": 180.0}


@dataclass(frozen=True)
class SuiteOutcome:
    metrics: dict = field(default_factory=dict)
    tests: tuple[SuiteTestOutcome, ...] = ()
    warnings: list = field(default_factory=list)
    records: dict = field(default_factory=dict)
    exit_code: int | None = 0
    stopped_by: DsparkError | None = None  # the rank death or hang that stopped the suites early


@dataclass(frozen=True)
class SuiteRequest:
    base_url: str
    names: tuple[str, ...]
    options: Mapping[str, Mapping]  # suite name -> options
    work_dir: Path  # where the options file, the output JSON and suites.log go
    model: str | None = None
    reference_url: str | None = None
    extra_args: tuple[str, ...] = ()
    ledger: Ledger | None = None  # pytest's process group is recorded there (`cleanup --run` finds its workers)
    cell_id: str = ""
    roles: tuple[RoleEndpoint, ...] = ()  # a disaggregated deployment's servers behind base_url (the router)
    server_pids: tuple[int, ...] = ()  # each rank's root process on this machine (suites/offcpu.py reads them)
    # "gpqa 37/198 requests, accuracy 62.2%" (dspark_ci.suites.progress_file)
    on_progress: Callable[[str], None] = field(default=lambda _text: None, compare=False)
    on_started: Callable[[], None] = field(default=lambda: None, compare=False)  # pytest is running

    @property
    def request_timeout_s(self) -> float:
        """Per request: derived from the most tokens any selected suite asks for, times its concurrency (never an hour
        by default); a suite that sends no max_tokens (sgl-eval's GPQA) may generate UNCAPPED_TOKENS."""
        budgets = []
        for name in self.names:
            options = effective_options(name, self.options.get(name, {}))
            sharing = max(1, int(options.get("concurrency") or 1))
            for key in ("max_tokens", "output_len"):
                if key in options:
                    budgets.append(UNCAPPED_TOKENS if options[key] is None else int(options[key]) * sharing)
        return REQUEST_BASE_S + REQUEST_PER_TOKEN_S * max(budgets, default=0)


def run_suites(request: SuiteRequest, watched: Sequence[Deployment] = (), watch: Watch = Watch()) -> SuiteOutcome:
    """pytest over the selected suites in a subprocess that dies with us, while every rank of ``watched`` is
    checked: a rank that dies or stops answering stops the suites at once (what they measured is kept).
    ``request.on_progress`` hears how far a suite got ("gpqa 45/198 requests, accuracy 71.1%") each poll."""
    # pytest runs from the folder that holds dspark_ci (the warm worker's directory: a clone's top, or site-packages;
    # never the package's own folder, where suites/ and reports/ would import as top-level packages): every path it
    # is given must be absolute, or a relative --out would send its options, results and log elsewhere.
    work_dir = request.work_dir.resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    options_path = work_dir / "suite-options.json"
    out_path = work_dir / "suites.json"
    options_path.write_text(json.dumps({k: dict(v) for k, v in request.options.items()}, indent=1))
    out_path.unlink(missing_ok=True)
    (work_dir / GPQA_SAMPLES_FILE).unlink(missing_ok=True)  # never keep an earlier run's samples
    progress_path = work_dir / "suites.progress_file"
    progress_path.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "pytest", *(str(SUITES_DIR / f"test_{name}.py") for name in request.names),
            "--base-url", request.base_url, "--suite-options", str(options_path), "--dspark-out", str(out_path),
            "--dspark-progress", str(progress_path),
            "--request-timeout", f"{request.request_timeout_s:g}", "-p", "no:cacheprovider", "-q", "-rfEs",
            *request.extra_args]
    if request.model:
        argv += ["--model", request.model]
    if request.reference_url:
        argv += ["--reference-url", request.reference_url]
    for endpoint in request.roles:
        argv += ["--role-url", f"{endpoint.role}={endpoint.base_url}"]
    for pid in request.server_pids:
        argv += ["--server-pid", str(pid)]
    with open(work_dir / "suites.log", "w") as log:
        log.write("# " + " ".join(argv) + "\n")
        log.flush()
        process = _start(argv, log, request)
        try:
            request.on_started()
            def report() -> None:
                _report_progress(progress_path, request.on_progress)

            stopped_by = _watch(process, watched, watch, report)
            report()  # the last state (e.g. gpqa 20/20 and its accuracy), even of a suite faster than one poll
        finally:
            # a no-op when it finished; on Ctrl-C it must not outlive us
            _stop(process, watch.stop_grace_s, out_path, request.ledger.run_id if request.ledger else None)
    return _outcome(out_path, process.returncode, work_dir / "suites.log", stopped_by)


def prestart(ledger: Ledger | None) -> None:
    """Start the run's warm pytest worker now, so that its imports overlap the first cell's boot."""
    _run_worker(ledger, "")


def _run_worker(ledger: Ledger | None, cell_id: str) -> WarmPytest | None:
    """The run's warm worker (dspark_ci.warm_worker), recorded in the run's ledger once; None: start pytest cold."""
    run_id = ledger.run_id if ledger else None
    worker = warm_worker(run_id or "", sys.executable, str(IMPORT_ROOT), run_env(os.environ, run_id))
    if worker is not None and ledger and worker.recorded_in != ledger.run_dir:
        ledger.record("local", cell_id, None, pid=worker.process.pid, pgid=worker.process.pid,
                      pid_started=started_at(worker.process.pid), what="suites worker")
        worker.recorded_in = ledger.run_dir
    return worker


def _start(argv: list[str], log, request: SuiteRequest) -> subprocess.Popen | WarmChild:
    """pytest in a process group of its own that carries the run's mark, recorded in the ledger at once (it dies
    with us until then: PDEATHSIG, long before it could start a worker of its own). It is forked by the run's
    warm worker (dspark_ci.warm_worker: the imports paid once per run, not per cell), or, without one, started as
    an interpreter of its own."""
    run_id = request.ledger.run_id if request.ledger else None
    env, cwd = {**run_env(os.environ, run_id), **SUITE_RUN_ENV}, str(IMPORT_ROOT)
    worker = _run_worker(request.ledger, request.cell_id)
    process: subprocess.Popen | WarmChild | None = None
    if worker is not None:
        log.flush()
        with contextlib.suppress(InfraError):
            process = worker.spawn(argv[3:], cwd, env, log.name)  # argv without "python -m pytest"
    if process is None:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                                   env=env, start_new_session=True, preexec_fn=die_with_parent())
    if request.ledger:
        request.ledger.record("local", request.cell_id, None, pid=process.pid, pgid=process.pid,
                              pid_started=started_at(process.pid), what="suites")
    return process


def _report_progress(path: Path, on_progress: Callable[[str], None]) -> None:
    text = read_progress(path)
    if text:
        on_progress(text)


def _watch(process: subprocess.Popen | WarmChild, watched: Sequence[Deployment], watch: Watch,
           every_poll: Callable[[], None] = lambda: None) -> DsparkError | None:
    """Until pytest exits: the first rank death, hang or overrun, or None. ``every_poll`` runs at each check."""
    started = time.monotonic()
    probes = [_HealthProbe(d.base_url, watch) for d in watched]
    try:
        while process.poll() is None:
            if time.monotonic() - started > watch.suites_timeout_s:
                return InfraError(f"the suites did not finish within {watch.suites_timeout_s:g} s (every rank still "
                                  "alive and answering); see suites.log")
            for deployment, probe in zip(watched, probes, strict=False):
                try:
                    deployment.check()
                except LaunchFailed as err:
                    return err
                if probe.silent_for() > watch.unresponsive_after_s:
                    return LaunchFailed(cell_id=deployment.cell_id, reason="unresponsive", node_rank=0,
                                        hint=f"{deployment.base_url}/health has not answered for "
                                             f"{watch.unresponsive_after_s:g} s while the suites ran; the suites "
                                             "were stopped")
            every_poll()
            interrupts.check()  # a Ctrl-C Python dropped still stops the suites
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=watch.poll_s)
        return None
    finally:
        for probe in probes:
            probe.stop()


class _HealthProbe:
    """Probes ``base_url``/health every poll in its own thread and remembers when it last answered 200."""

    def __init__(self, base_url: str, watch: Watch):
        self._url, self._watch = f"{base_url}/health", watch
        self._answered_at = time.monotonic()
        self._done = threading.Event()
        threading.Thread(target=self._run, name=f"probe {self._url}", daemon=True).start()

    def silent_for(self) -> float:
        return time.monotonic() - self._answered_at

    def stop(self) -> None:
        self._done.set()

    def _run(self) -> None:
        while not self._done.is_set():
            if _answers(self._url, self._watch.probe_timeout_s):
                self._answered_at = time.monotonic()
            self._done.wait(self._watch.poll_s)


def _answers(url: str, timeout_s: float) -> bool:
    import requests  # on use: `dspark-ci run` reaches its first launch without paying for its import

    try:
        return requests.get(url, timeout=timeout_s).status_code == 200
    except requests.RequestException:
        return False


# SIGINTs sent to stop the suites, this far apart: the first ends the test in progress, a later one a wait that
# swallowed it (a thread pool's shutdown waiting on requests to a server that will not answer).
STOP_INTERRUPTS = 3
STOP_INTERRUPT_EVERY_S = 1.0
GROUP_DRAIN_S = 2.0  # after pytest exited by itself, what is left of its group may take this long to exit


def _stop(process: subprocess.Popen | WarmChild, grace_s: float, out_path: Path, run_id: str | None) -> None:
    """SIGINT (pytest ends the session and writes what it has so far), then SIGKILL the whole group once pytest
    exited, or wrote its results (its request threads may still hang on a dead server), or after ``grace_s``;
    the shared memory its workers held goes with them. With ``run_id``, only processes marked with it are killed
    (pytest may be reaped already, and its group id then no longer reserved for us)."""
    if process.poll() is None:
        written_before = out_path.exists()
        deadline = time.monotonic() + grace_s
        interrupts, next_interrupt = 0, time.monotonic()
        while process.poll() is None and time.monotonic() < deadline:
            if not written_before and out_path.exists():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=0.5)  # the summary it prints after; then it is only waiting on threads
                break
            if interrupts < STOP_INTERRUPTS and time.monotonic() >= next_interrupt:
                signal_group(process.pid, signal.SIGINT)
                interrupts, next_interrupt = interrupts + 1, time.monotonic() + STOP_INTERRUPT_EVERY_S
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=0.1)
    else:  # finished on its own: let its helpers (multiprocessing's resource tracker) tidy up and leave first
        deadline = time.monotonic() + GROUP_DRAIN_S
        while group_members(process.pid, run_id) and time.monotonic() < deadline:
            time.sleep(0.05)
    kill_group(process.pid, run_id)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)


def gpqa_note(records: Mapping[str, list]) -> GpqaSummary | None:
    """How the GPQA figure was produced (CellResult.gpqa), from the suite's summary record; None without one."""
    summaries = records.get("gpqa_summary") or []
    if not summaries:
        return None
    summary = summaries[-1]
    partial = bool(summary.get("partial"))
    return GpqaSummary(summary.get("scorer", "sglang"), partial, summary.get("samples"),
                       summary.get("planned_samples"), summary.get("accuracy"),
                       tuple(sorted(summary.get("cli_differences") or {})),
                       # a partial figure is never gated, so neither are its questions
                       {} if partial else summary.get("per_question") or {})


def mc_note(records: Mapping[str, list]) -> McSummary | None:
    """How the multiple-choice figure was produced (CellResult.mc), from the mc suite's summary record; None without
    one."""
    summaries = records.get("mc_summary") or []
    if not summaries:
        return None
    summary = summaries[-1]
    partial = bool(summary.get("partial"))
    per_category = {name: (tally["right"], tally["items"])
                    for name, tally in (summary.get("per_category") or {}).items()}
    return McSummary(partial, summary.get("items"), summary.get("planned_items"), summary.get("accuracy"), per_category,
                     # a partial figure is never gated, so neither are its items
                     {} if partial else summary.get("per_item") or {})


def acceptance_note(records: Mapping[str, list]) -> Acceptance | None:
    """Acceptance per position and category, drift and losslessness (CellResult.acceptance), from the accept suite's
    accept_detail record; None without one."""
    details = records.get("accept_detail") or []
    return Acceptance.from_dict(details[-1]) if details and details[-1] else None


def envelope_note(records: Mapping[str, list]) -> Envelope | None:
    """Where speculation pays (CellResult.envelope), from the speed suite's speed_envelope record; None without one."""
    envelopes = records.get("speed_envelope") or []
    return Envelope.from_dict(envelopes[-1]) if envelopes and envelopes[-1] else None


def written_outcome(work_dir: Path) -> SuiteOutcome:
    """What the suites wrote in ``work_dir`` (e.g. before an interrupted run tore the cell down)."""
    return _outcome(work_dir / "suites.json", None, work_dir / "suites.log", None)


def _outcome(out_path: Path, returncode: int | None, log_path: Path, stopped_by: DsparkError | None) -> SuiteOutcome:
    try:
        data = json.loads(out_path.read_text())
    except (OSError, ValueError):
        return SuiteOutcome(exit_code=returncode, stopped_by=stopped_by, tests=(SuiteTestOutcome(
            "suites", "error", 0.0, f"pytest exited {returncode} without results; see {log_path}"),))
    return SuiteOutcome(metrics=data.get("metrics", {}),
                        tests=tuple(SuiteTestOutcome.from_dict(t) for t in data.get("tests") or ()),
                        warnings=data.get("warnings", []), records=data.get("records", {}),
                        exit_code=returncode, stopped_by=stopped_by)
