"""The Slurm launcher's lifecycle: submit one job per cell, wait for it to run and serve, watch it, cancel it
(the package docstring, ``dspark_ci.launchers.slurm``, says how)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import re
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from urllib.parse import urlparse

from dspark_ci.ground import interrupts
from dspark_ci.ground.errors import BadInput, InfraError
from dspark_ci.ground.ledger import Ledger, LedgerEntry
from dspark_ci.ground.processes import free_port, signals_deferred, sigterm_as_interrupt
from dspark_ci.ground.sglang.release import is_peer_loss
from dspark_ci.launchers.contract import (
    LOG_LINES_KEPT,
    LOG_LINES_SEARCHED,
    Capacity,
    LaunchContext,
    LaunchTimeout,
    RankExit,
    culprit,
    group_failed,
)
from dspark_ci.launchers.logs import rank_log_path, tail
from dspark_ci.launchers.materialize import redact
from dspark_ci.launchers.plan_types import LaunchPlan, Placement
from dspark_ci.launchers.readiness import Deadline, OurServer, wait_until_ready
from dspark_ci.launchers.slurm.commands import (
    NODES_OUT_OF_SERVICE,
    RUNNING_STATES,
    WAITING_STATES,
    cancel,
    checked_output,
    conf_hint,
    gpus_of,
    hostnames,
    is_over,
    job_info,
    key_values,
    last_line,
    node_address,
    slurm,
    wait_gone,
)
from dspark_ci.launchers.slurm.options import DEFAULT_QUEUE_TIMEOUT_S, SlurmOptions
from dspark_ci.launchers.slurm.script import gpus_per_node, render_job
from dspark_ci.launchers.slurm.tuning import SlurmTuning

SETTLE_S = 0.5  # after one task's exit marker, let the tasks dying of losing it write theirs
MARKER_GRACE_S = 3.0  # a job seen ended: how long its exit markers may lag (shared file systems)
# Every exit seen so far died of losing a peer: how long to wait for the lost rank's own marker. On a busy node
# the survivor's marker can land first, and judged alone it would be blamed for what it only noticed.
LOST_RANK_WAIT_S = 10.0
INFO_MAX_AGE_S = 1.0  # Deployment.check() runs every second: one scontrol call per second at most
JOB_END_WAIT_S = 10.0  # a job ended from outside: how long to wait for its final state (CANCELLED, TIMEOUT...)
_EXIT_MARKER = re.compile(r"rank (\d+) exited (-?\d+) at ([0-9.]+)( after SIGTERM)?")


def build(context: LaunchContext, options: SlurmOptions) -> SlurmLauncher:
    """The catalog's constructor (dspark_ci.launchers.catalog): the --slurm-* options, checked, in ``options``."""
    return SlurmLauncher(options, context)


class QueueTimeout(LaunchTimeout):
    """The job never left the queue: its message is Slurm's reason, not a health check's."""

    def __str__(self) -> str:
        return f"{self.cell_id}: {self.hint}"



# --- the launcher -------------------------------------------------------------------------------------

class SlurmLauncher:
    name = "slurm"

    def __init__(self, options: SlurmOptions, context: LaunchContext, tuning: SlurmTuning = SlurmTuning()):
        """The user's options as declared (one record), the run's context, and what no user sets."""
        # The --slurm-* values are checked once, as options (launchers/slurm/options.py); the server by the CLI.
        if context.server not in DEFAULT_QUEUE_TIMEOUT_S:
            raise BadInput("--server", f"unknown server {context.server!r}",
                           f"choose from {', '.join(DEFAULT_QUEUE_TIMEOUT_S)}")
        self.options, self.context, self.tuning = options, context, tuning
        self.ledger = Ledger(context.run_id, context.run_dir)  # where every job is recorded, before sbatch

    @property
    def queue_timeout_s(self) -> float:
        """PENDING until this: LaunchTimeout naming Slurm's reason (--slurm-queue-timeout, else the server's)."""
        return self.options.queue_timeout_for(self.context.server)

    def placement(self, nnodes: int, gpus_per_node: int | None = None) -> Placement:
        """Nodes are only known once the job runs, so --host, --node-rank and --dist-init-addr are placeholders
        the script replaces (each task binds its own NodeAddr; the leader is the job's first node). Ports: free
        on this machine (right for a cluster on this machine), or drawn from ``port_range``; either way each
        task checks them on its own node before starting its server."""
        if self.tuning.port_range:
            low, high = self.tuning.port_range
            port, dist_port = random.sample(range(low, high + 1), 2)
        else:
            port, dist_port = free_port(), free_port()
        return Placement(bind_hosts=("0.0.0.0",) * nnodes, leader_addr="${NODE0_ADDR}", port=port,
                         dist_port=dist_port)

    def preflight(self, plans: Sequence[LaunchPlan]) -> None:
        """Slurm answers, the partition exists, and it has enough nodes with enough GPUs for every cell."""
        env, timeout = self.context.caller_env, self.tuning.command_timeout_s
        conf = env.get("SLURM_CONF")
        if conf and not Path(conf).is_file():
            raise InfraError(f"Slurm does not answer: SLURM_CONF={conf} does not exist; {conf_hint(env)}")
        listing = checked_output(["scontrol", "show", "partition", "-o"], env, timeout)
        partitions = [key_values(line) for line in listing.splitlines() if line.strip()]
        names = [p.get("PartitionName", "") for p in partitions]
        wanted = self.options.partition or next((p.get("PartitionName") for p in partitions
                                                  if p.get("Default") == "YES"), None)
        if wanted is None:
            raise InfraError("Slurm has no default partition: pass --slurm-partition "
                             f"(known: {', '.join(names) or 'none'})")
        partition = next((p for p in partitions if p.get("PartitionName") == wanted), None)
        if partition is None:
            raise InfraError(f"Slurm partition {wanted!r} does not exist on this cluster (known: "
                             f"{', '.join(names) or 'none'}); pass --slurm-partition with one of those")
        gpus_by_node: dict[str, int] = {}
        for line in checked_output(["sinfo", "-h", "-N", "-p", wanted, "-o", "%N|%G"], env, timeout).splitlines():
            node, _, gres = line.strip().partition("|")
            if node:
                gpus_by_node[node] = max(gpus_by_node.get(node, 0), gpus_of(gres))
        max_nodes = partition.get("MaxNodes", "UNLIMITED")
        for plan in plans:
            nnodes, gpus = len(plan.ranks), gpus_per_node(plan)
            where = f"cell {plan.cell_id}"
            fix = "deselect the cell (--cell), or choose another partition (--slurm-partition)"
            if nnodes > len(gpus_by_node):
                raise BadInput(where, f"needs {nnodes} nodes; partition {wanted} has {len(gpus_by_node)}", fix)
            if max_nodes.isdigit() and nnodes > int(max_nodes):
                raise BadInput(where, f"needs {nnodes} nodes; partition {wanted} allows at most {max_nodes} per job",
                               fix)
            if gpus:
                most = max(gpus_by_node.values(), default=0)
                if gpus > most:
                    raise BadInput(where, f"asks for {gpus} GPUs per node; partition {wanted}'s nodes have at most "
                                          f"{most}", fix)
                fitting = sum(1 for count in gpus_by_node.values() if count >= gpus)
                if fitting < nnodes:
                    raise BadInput(where, f"needs {nnodes} nodes with {gpus} GPUs each; partition {wanted} has "
                                          f"{fitting} such node(s) of {len(gpus_by_node)}", fix)

    def capacity(self) -> Capacity:
        """As many cells side by side as the partition has nodes in service (down, drained and failing nodes
        left out); Slurm places the jobs, and a job that must wait anyway shows Slurm's reason while it does."""
        env, timeout = self.context.caller_env, self.tuning.command_timeout_s
        args = ["sinfo", "-h", "-N", "-o", "%N|%t"] + ([f"--partition={self.options.partition}"]
                                                       if self.options.partition else [])
        states = dict(line.strip().split("|", 1) for line in checked_output(args, env, timeout).splitlines()
                      if "|" in line)
        usable = sorted(node for node, state in states.items() if not state.rstrip("*~#!%$@^-").startswith(
            NODES_OUT_OF_SERVICE))
        where = f"partition {self.options.partition}" if self.options.partition else "the default partition"
        return Capacity(max(1, len(usable)), len(usable) or None,
                        f"{len(usable)} node(s) in service in Slurm {where}")

    @contextlib.contextmanager
    def launch(self, plan: LaunchPlan, logs_dir: Path) -> Iterator[SlurmDeployment]:
        logs_dir = logs_dir.resolve()
        logs_dir.mkdir(parents=True, exist_ok=True)
        job = _Job(plan, logs_dir, self)
        with sigterm_as_interrupt():
            try:
                job.submit()
                job.wait_running()
                deployment = SlurmDeployment(plan.cell_id, job.leader_url(), job)
                health = urlparse(plan.health_url).path or "/health"
                leader_plan = dataclasses.replace(plan, base_url=deployment.base_url,
                                                  health_url=deployment.base_url + health)
                wait_until_ready(OurServer(leader_plan),
                                 Deadline(self.context.boot_timeout_s, self.tuning.poll_s),
                                 deployment.check, cell_id=plan.cell_id, last_lines=job.rank0_tail)
                deployment.boot_seconds = time.monotonic() - job.running_since
                yield deployment
            finally:
                with signals_deferred():  # a second Ctrl-C must not leave the job behind
                    job.teardown()


class SlurmDeployment:
    def __init__(self, cell_id: str, base_url: str, job: _Job):
        self.cell_id, self.base_url, self._job = cell_id, base_url, job
        self.boot_seconds = 0.0

    @property
    def job_id(self) -> str | None:
        return self._job.job_id

    def check(self) -> None:
        """Raise LaunchFailed naming the first rank whose task ended, or InfraError if the job ended without one
        (cancelled, time limit, node failure). Cheap: exit markers are files; scontrol at most once a second."""
        self._job.check()


class _Job:
    """One cell's Slurm job: submitted, watched, cancelled."""

    def __init__(self, plan: LaunchPlan, logs_dir: Path, launcher: SlurmLauncher):
        self.plan, self.logs_dir, self.launcher = plan, logs_dir, launcher
        self.tuning = launcher.tuning
        self.env = dict(launcher.context.caller_env)
        self.launch_token = uuid.uuid4().hex[:8]
        self.spec = render_job(plan, logs_dir, launcher.options, launcher.context, launcher.tuning, self.launch_token)
        self.script_path = logs_dir / "job.sbatch"
        self.job_id: str | None = None
        self.submitting = False
        self.running_since = time.monotonic()
        self._info: dict[str, str] = {}
        self._info_at = float("-inf")
        self._signalled: set[int] = set()  # ranks whose marker says Slurm had sent them SIGTERM

    # submission ---------------------------------------------------------------------------------------
    def submit(self) -> None:
        s, t = self.launcher, self.tuning
        # Exit markers of an earlier launch into the same folder would read as this job's ranks failing.
        for old in [*self.logs_dir.glob("*.exit"), *self.logs_dir.glob("*.exit.tmp")]:
            old.unlink(missing_ok=True)
        self.script_path.write_text(self.spec.script)
        record = {"job_name": self.spec.name, "comment": self.spec.comment, "cluster_conf": self.env.get("SLURM_CONF"),
                  "script": str(self.script_path)}
        # Before sbatch: a kill while it runs still leaves a record that finds the job by name.
        s.ledger.record("slurm", self.plan.cell_id, None, job_id=None, **record)
        self.submitting = True
        done = slurm(["sbatch", "--parsable", str(self.script_path)], self.spec.env, t.command_timeout_s,
                     cwd=self.logs_dir)
        if done.returncode != 0:
            self.submitting = False
            raise InfraError(f"{self.plan.cell_id}: sbatch refused the job "
                             f"({redact(last_line(done.stderr), self.spec.secrets)}); script: {self.script_path}")
        self.job_id = done.stdout.strip().split(";")[0]
        s.ledger.record("slurm", self.plan.cell_id, None, job_id=self.job_id, **record)

    def info(self, max_age_s: float = INFO_MAX_AGE_S) -> dict[str, str]:
        if self.job_id is None:
            return {}
        if time.monotonic() - self._info_at > max_age_s:
            self._info = job_info(self.job_id, self.env, self.tuning.command_timeout_s)
            self._info_at = time.monotonic()
        return self._info

    def wait_running(self) -> None:
        """Until the job is RUNNING (queue time, its own limit), showing Slurm's reason while it is pending."""
        s, t = self.launcher, self.tuning
        started, shown = time.monotonic(), None
        while True:
            info = self.info(max_age_s=0)
            state = info["JobState"]
            if state in RUNNING_STATES:
                self.running_since = time.monotonic()
                return
            if state not in WAITING_STATES:
                self.check()  # over already: name the rank (or the job's fate)
                self.running_since = time.monotonic()
                return
            waited = time.monotonic() - started
            reason, partition = info.get("Reason", "None"), info.get("Partition", s.options.partition or "?")
            if t.progress and reason != shown and reason not in ("None", ""):  # None: not yet looked at
                t.progress(f"{self.plan.cell_id}: Slurm job {self.job_id} {state.lower()} ({reason}) "
                           f"in partition {partition}")
                shown = reason
            if waited >= s.queue_timeout_s:
                raise QueueTimeout(cell_id=self.plan.cell_id, reason="timeout", hint=(
                    f"Slurm job {self.job_id} pending ({reason}) for {waited:.0f}s in partition {partition}; the queue "
                    f"limit is {s.queue_timeout_s:g}s (--slurm-queue-timeout). `squeue -j {self.job_id}` and "
                    f"`scontrol show job {self.job_id}` say more; the boot timeout had not started"))
            interrupts.check()  # a Ctrl-C or SIGTERM is a flag: acted on here
            time.sleep(t.poll_s)

    def leader_url(self) -> str:
        """Rank 0's API root: the first node of the job's node list, by its NodeAddr, on the planned port."""
        nodelist = self.info(max_age_s=0).get("NodeList", "")
        nodes = hostnames(nodelist, self.env, self.tuning.command_timeout_s) if nodelist else []
        if not nodes:
            raise InfraError(f"{self.plan.cell_id}: Slurm job {self.job_id} runs but has no node list")
        port = urlparse(self.plan.base_url).port
        return f"http://{node_address(nodes[0], self.env, self.tuning.command_timeout_s)}:{port}"

    # watching -----------------------------------------------------------------------------------------
    def exits(self) -> list[RankExit]:
        """Every task that wrote its exit marker, earliest first (and which of them Slurm had sent SIGTERM)."""
        found = []
        for marker in self.logs_dir.glob("*.exit"):
            match = _EXIT_MARKER.search(marker.read_text(errors="replace"))
            if match:  # a marker being written is seen on the next check
                rank = int(match.group(1))
                if match.group(4):
                    self._signalled.add(rank)
                found.append(RankExit(rank, int(match.group(2)), float(match.group(3)), self.log_tail(rank)))
        return sorted(found, key=lambda e: e.at)

    def log_tail(self, rank: int, lines: int = LOG_LINES_SEARCHED) -> list[str]:
        return [redact(line, self.spec.secrets) for line in tail(rank_log_path(self.logs_dir, rank), lines)]

    def rank0_tail(self) -> list[str]:
        return self.log_tail(0, LOG_LINES_KEPT)

    def check(self) -> None:
        if self.exits():
            self._judge(self._settled_exits())
        if self.info()["JobState"] in RUNNING_STATES:
            return
        deadline = time.monotonic() + MARKER_GRACE_S
        while time.monotonic() < deadline:  # the job ended: its tasks' markers may still be on their way
            if self.exits():
                self._judge(self._settled_exits())
            time.sleep(0.2)
        self._raise_job_ended([])

    def _settled_exits(self) -> list[RankExit]:
        """The exits seen once the ranks dying of losing one have written theirs, and, while every exit seen says
        it lost a peer, once the rank it lost has (bounded by LOST_RANK_WAIT_S: a node that vanished writes none)."""
        time.sleep(SETTLE_S)  # the ranks that die of losing this one are a moment behind
        exits = self.exits()
        deadline = time.monotonic() + LOST_RANK_WAIT_S
        while (len(exits) < len(self.plan.ranks) and all(is_peer_loss(e.sglang_error) for e in exits)
               and time.monotonic() < deadline):
            time.sleep(0.2)
            exits = self.exits()
        return exits

    def _judge(self, exits: list[RankExit]) -> None:
        """A rank that failed of its own accord is the culprit (dspark_ci.launchers.contract.culprit). Ranks that Slurm
        stopped, and ranks that died only of losing those, mean the job was ended from outside."""
        exits = self._failed_before_the_signal(exits)
        own = [e for e in exits if e.node_rank not in self._signalled and not is_peer_loss(e.sglang_error)]
        if own or not any(e.node_rank in self._signalled for e in exits):
            blamed = culprit(exits)  # what group_failed names
            where = self._header(blamed.node_rank)
            hints = [f"Slurm job {self.job_id}"] + ([where] if where else [])
            hints.append(f"full log: {rank_log_path(self.logs_dir, blamed.node_rank)}")
            raise group_failed(self.plan.cell_id, exits, hints)
        self._raise_job_ended(exits)

    def _failed_before_the_signal(self, exits: list[RankExit]) -> list[RankExit]:
        """A rank whose marker says Slurm's SIGTERM came, but whose server died of an error of its own (not a lost
        peer), failed before the signal: its wrapper woke late (at load 7 another task's exit ended the step first)
        and the signal came while it wrote its marker. It failed no later than the first other rank's exit."""
        late = {e.node_rank for e in exits if e.node_rank in self._signalled
                and e.sglang_error is not None and not is_peer_loss(e.sglang_error)}
        if not late:
            return exits
        self._signalled -= late
        first_other = min((e.at for e in exits if e.node_rank not in late), default=math.inf)
        return sorted((dataclasses.replace(e, at=min(e.at, first_other)) if e.node_rank in late else e for e in exits),
                      key=lambda e: e.at)

    def _raise_job_ended(self, exits: list[RankExit]) -> None:
        """The job ended without a rank failing of its own: say how Slurm ended it (its final state)."""
        deadline = time.monotonic() + JOB_END_WAIT_S
        info = self.info(max_age_s=0)
        while not is_over(info["JobState"]) and time.monotonic() < deadline:
            time.sleep(0.25)  # COMPLETING first; the final state (CANCELLED, TIMEOUT, NODE_FAIL) says why
            info = self.info(max_age_s=0)
        stopped = [f"node rank {e.node_rank} exited with code {e.exit_code}"
                   + (" after Slurm's SIGTERM" if e.node_rank in self._signalled else f" ({e.sglang_error})")
                   for e in exits]
        batch_log = self.logs_dir / f"slurm-{self.job_id}.out"
        raise InfraError("\n  ".join([
            f"{self.plan.cell_id}: Slurm job {self.job_id} ended ({info.get('JobState')}"
            + (f", reason {info['Reason']}" if info.get("Reason", "None") != "None" else "")
            + f", exit code {info.get('ExitCode', '?')}) without any rank failing on its "
            "own: cancelled, time limit (--slurm-time), node failure, or the step could not start",
            *stopped,
            "last lines of the job's output:\n    " + "\n    ".join(
                redact(line, self.spec.secrets) for line in tail(batch_log, 10)),
            f"logs: {self.logs_dir}"]))

    def _header(self, rank: int) -> str | None:
        """The task's own first line: '# node rank R on NODE (ADDR), leader ..., job J'."""
        with contextlib.suppress(OSError):
            with open(rank_log_path(self.logs_dir, rank), errors="replace") as handle:
                first = handle.readline().strip()
                if first.startswith("# node rank"):
                    return first.lstrip("# ").split(", leader")[0]
        return None

    # teardown -----------------------------------------------------------------------------------------
    def teardown(self) -> None:
        """scancel, then wait (bounded) until the job is over and its processes are gone; never raises."""
        s, t = self.launcher, self.tuning
        ids = [self.job_id] if self.job_id else (self._submitted_by_name() if self.submitting else [])
        for job_id in ids:
            cancel(job_id, self.env, t.command_timeout_s)
        for job_id in ids:
            left = wait_gone(job_id, self.env, t.cancel_wait_s, t.command_timeout_s)
            if left:
                print(f"dspark-ci: Slurm job {job_id} (cell {self.plan.cell_id}) still has {left} "
                      f"{t.cancel_wait_s:g}s after scancel: check `squeue -j {job_id}`; "
                      f"`dspark-ci cleanup --run {s.context.run_id}` cancels it again", file=sys.stderr)
        self._redact_logs()

    def _submitted_by_name(self) -> list[str]:
        """sbatch was interrupted before it printed an id: find the job by its name and this launch's comment."""
        with contextlib.suppress(InfraError):
            return jobs_named(self.spec.name, self.spec.comment, self.env, self.tuning.command_timeout_s)
        return []

    def _redact_logs(self) -> None:
        if not self.spec.secrets:
            return
        for path in [*self.logs_dir.glob("*.log"), *self.logs_dir.glob("slurm-*.out")]:
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace")
                clean = redact(text, self.spec.secrets)
                if clean != text:
                    path.write_text(clean)


def jobs_named(name: str, comment: str, env: Mapping[str, str], timeout_s: float) -> list[str]:
    """Ids of the jobs in the queue with this name and exactly this comment."""
    out = checked_output(["squeue", "-h", f"--name={name}", "-o", "%i|%k"], env, timeout_s)
    return [job for job, _, found in (line.strip().partition("|") for line in out.splitlines())
            if job and found == comment]


def remove_started(entry: LedgerEntry, dry_run: bool = False) -> str | None:
    """Cancel the job a dead run recorded in its ledger (catalog contract), if it is still there and still
    carries that run's id in its name or comment; None if it was already over or gone. ``dry_run``: only say
    so."""
    env = dict(os.environ)
    if entry.cluster_conf:
        env["SLURM_CONF"] = entry.cluster_conf
    timeout, run_id = 30.0, entry.run_id
    if not run_id:
        return None
    if entry.job_id:
        info = job_info(entry.job_id, env, timeout)
        ours = run_id in info.get("JobName", "") or f"run={run_id}:" in info.get("Comment", "")
        ids = [entry.job_id] if ours and not is_over(info["JobState"]) else []
    elif entry.job_name and entry.comment:
        ids = jobs_named(entry.job_name, entry.comment, env, timeout)
    else:
        return None
    for job_id in ids if not dry_run else ():
        cancel(job_id, env, timeout)
    problems = [f"{job_id}: {left}" for job_id in ids
                if not dry_run and (left := wait_gone(job_id, env, 30.0, timeout))]
    if problems:
        raise InfraError(f"Slurm job(s) still there after scancel: {'; '.join(problems)}")
    if not ids:
        return None
    return (f"Slurm job {', '.join(ids)} (cell {entry.cell}, {entry.job_name}) on "
            f"{entry.cluster_conf or 'the default cluster'}")
