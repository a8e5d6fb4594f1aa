"""The Slurm launcher: every cell as one Slurm job, one task per node, submitted with ``sbatch``.

Used like every launcher (``launchers.contract``)::

    launcher = SlurmLauncher(SlurmSettings(partition="gpu", caller_env=os.environ))
    launcher.preflight(plans)                       # Slurm answers; the partition exists and can hold every cell
    with launcher.launch(plan, logs_dir) as deployment:
        ...  # deployment.base_url (rank 0's address, known once the job runs); check() raises if a task ended

One job per cell: a batch script written into the cell's log folder (kept, so a person can resubmit it),
``--nodes=N --ntasks-per-node=1``, and one ``srun --kill-on-bad-exit=1`` step whose task on each node computes
its own node rank (``$SLURM_NODEID``, expanded inside the task, never in the batch shell: SGLang's own sbatch
example gets this wrong and gives every node rank 0) and its own address, then runs the rank's argv. Per-node
logs are ``logs/<cell>/<node index>.log`` (``%n``); each task writes ``<rank>.exit`` (its exit code and the time)
when its server exits, which is how the first rank to fail is named.

Time: the queue wait has its own limit (``queue_timeout_s``, Slurm's pending reason shown meanwhile); the boot
timeout starts when the job is RUNNING. Teardown (success, failure, Ctrl-C, SIGTERM): ``scancel``, then wait
until the job has reached a final state and no process of it is left. Job names and comments carry the run id,
and the job is in the run's ledger, so ``dspark-ci cleanup`` cancels what a killed run left. docs/SLURM.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import re
import shlex
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence
from urllib.parse import urlparse

import psutil

from ground.errors import BadInput, InfraError
from ground.run_id import new_run_id
from ground.sglang.release import is_peer_loss
from launchers.contract import (LOG_LINES_KEPT, Capacity, LOG_LINES_SEARCHED, LaunchContext, LaunchTimeout, RankExit,
                                culprit, group_failed)
from launchers.ledger import Ledger
from launchers.logs import rank_log_path, tail
from launchers.plan_types import LaunchPlan, Placement
from launchers.processes import free_port, signals_deferred, sigterm_as_interrupt
from launchers.resolve import redact, resolve_env, secret_values, server_argv
from launchers.wait import Deadline, OurServer, wait_until_ready

REPO_ROOT = Path(__file__).resolve().parent.parent  # holds the sglang_sim package (--server sim)
GPU_MODES = ("gpus-per-node", "gres")
CONTAINER_KINDS = ("pyxis", "apptainer")
DEFAULT_QUEUE_TIMEOUT_S = {"sim": 600.0, "sglang": 3600.0}

# Job states (squeue/scontrol JOB STATE CODES). Anything not listed as waiting or running is over.
WAITING_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
RUNNING_STATES = frozenset({"RUNNING"})
ENDING_STATES = frozenset({"COMPLETING", "STAGE_OUT", "SIGNALING", "SUSPENDED", "STOPPED", "RESIZING"})
NODES_OUT_OF_SERVICE = ("down", "drain", "drng", "fail", "maint", "unk", "no_resp", "futr", "inval")  # sinfo %t states
GONE = "GONE"  # scontrol no longer knows the job (purged after MinJobAge)

SETTLE_S = 0.5  # after one task's exit marker, let the tasks dying of losing it write theirs
MARKER_GRACE_S = 3.0  # a job seen ended: how long its exit markers may lag (shared file systems)
INFO_MAX_AGE_S = 1.0  # Deployment.check() runs every second: one scontrol call per second at most
JOB_END_WAIT_S = 10.0  # a job ended from outside: how long to wait for its final state (CANCELLED, TIMEOUT...)
_EXIT_MARKER = re.compile(r"rank (\d+) exited (-?\d+) at ([0-9.]+)( after SIGTERM)?")
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::[^:,()]+)?:(\d+)")


def _stderr_progress(message: str) -> None:
    print(f"dspark-ci: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class SlurmSettings:
    server: str = "sim"  # "sim": the simulated server from this checkout; "sglang": python3 -m sglang.launch_server
    partition: str | None = None  # None: the cluster's default partition
    account: str | None = None
    time: str | None = None  # job time limit, e.g. "02:00:00"
    extra: tuple[str, ...] = ()  # more sbatch options, written as #SBATCH lines
    gpus: str = "gpus-per-node"  # how GPUs are requested: --gpus-per-node=N, or "gres": --gres=gpu:N
    container: str | None = None  # None: plain processes; "pyxis:IMAGE" or "apptainer:IMAGE"
    container_mounts: tuple[str, ...] = ("/root/.cache/huggingface:/root/.cache/huggingface",)  # SRC:DST (+ logs)
    queue_timeout_s: float = 600.0  # PENDING until this: LaunchTimeout naming Slurm's reason
    boot_timeout_s: float = 600.0  # from RUNNING until rank 0's /health answers 200
    poll_s: float = 0.5
    cancel_wait_s: float = 30.0  # after scancel: until the job is over and its processes are gone
    command_timeout_s: float = 30.0  # every Slurm client command (sbatch, scontrol, sinfo, squeue, scancel)
    port_range: tuple[int, int] | None = None  # None: ports free on this machine (one-host clusters)
    python: str = sys.executable  # the simulator's interpreter (absolute: slurmd's PATH is not ours)
    caller_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    forward_env_prefixes: tuple[str, ...] = ("DSPARK_SIM_",)  # caller variables written into the script
    run_id: str = field(default_factory=new_run_id)
    ledger: Ledger | None = None  # where every job is recorded (None: not recorded)
    progress: Callable[[str], None] | None = _stderr_progress  # pending reasons while the job waits

    def __post_init__(self):
        if self.server not in DEFAULT_QUEUE_TIMEOUT_S:
            raise BadInput("--server", f"unknown server {self.server!r}", "choose sim or sglang")
        if self.gpus not in GPU_MODES:
            raise BadInput("--slurm-gpus", f"unknown GPU request style {self.gpus!r}",
                           f"choose {' or '.join(GPU_MODES)}")
        if self.container is not None:
            kind, _, image = self.container.partition(":")
            if kind not in CONTAINER_KINDS or not image:
                raise BadInput("--slurm-container", f"{self.container!r} is not KIND:IMAGE",
                               "write pyxis:IMAGE (srun --container-image) or apptainer:IMAGE (apptainer exec)")
        for arg in self.extra:
            if not arg.startswith("-") or "\n" in arg:
                raise BadInput("--slurm-extra", f"{arg!r} is not an sbatch option",
                               "give one option per --slurm-extra, e.g. --slurm-extra=--qos=high")
        if self.queue_timeout_s <= 0:
            raise BadInput("--slurm-queue-timeout", f"{self.queue_timeout_s:g} is not a positive number of seconds")

    @property
    def container_kind(self) -> str | None:
        return self.container.partition(":")[0] if self.container else None

    @property
    def container_image(self) -> str | None:
        return self.container.partition(":")[2] if self.container else None


def build(context: LaunchContext, options: Mapping[str, Any]) -> "SlurmLauncher":
    """The registry's constructor (launchers.registry): the --slurm-* options arrive in ``options``."""
    env = dict(context.caller_env)
    queue_timeout = options.get("slurm_queue_timeout") or DEFAULT_QUEUE_TIMEOUT_S.get(context.server, 600.0)
    try:
        queue_timeout = float(queue_timeout)  # the CLI gives the option as text
    except (TypeError, ValueError):
        raise BadInput("--slurm-queue-timeout", f"{queue_timeout!r} is not a number of seconds", "e.g. 600") from None
    return SlurmLauncher(SlurmSettings(
        server=context.server,
        partition=options.get("slurm_partition") or env.get("DSPARK_SLURM_PARTITION") or None,
        account=options.get("slurm_account"), time=options.get("slurm_time"),
        extra=tuple(options.get("slurm_extra") or ()), gpus=options.get("slurm_gpus") or "gpus-per-node",
        container=options.get("slurm_container"), queue_timeout_s=queue_timeout,
        boot_timeout_s=context.boot_timeout_s, caller_env=env, run_id=context.run_id,
        ledger=Ledger(context.run_id, context.run_dir)))


# --- talking to Slurm ----------------------------------------------------------------------------------

def _conf_hint(env: Mapping[str, str]) -> str:
    conf = env.get("SLURM_CONF")
    where = f"SLURM_CONF={conf}" if conf else "SLURM_CONF is unset (so /etc/slurm/slurm.conf)"
    return f"check SLURM_CONF ({where}) and that slurmctld runs (`scontrol ping`)"


def slurm(args: Sequence[str], env: Mapping[str, str], timeout_s: float,
          cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run one Slurm client command; InfraError if it is missing or hangs (its exit status is the caller's)."""
    try:
        return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout_s, env=dict(env),
                              stdin=subprocess.DEVNULL, cwd=cwd)
    except FileNotFoundError:
        raise InfraError(f"`{args[0]}` is not installed on this machine: the Slurm launcher needs Slurm's client "
                         "commands (sbatch, srun, scontrol, sinfo, squeue, scancel) on PATH") from None
    except subprocess.TimeoutExpired:
        raise InfraError(f"Slurm does not answer: `{' '.join(args)}` took more than {timeout_s:g}s; "
                         f"{_conf_hint(env)}") from None


def _last_line(text: str) -> str:
    """What a Slurm command said: its last non-empty line (the error itself; earlier ones are retries)."""
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no message"


def _must(args: Sequence[str], env: Mapping[str, str], timeout_s: float) -> str:
    done = slurm(args, env, timeout_s)
    if done.returncode != 0:
        raise InfraError(f"Slurm does not answer: `{' '.join(args)}` failed ({_last_line(done.stderr)}); "
                         f"{_conf_hint(env)}")
    return done.stdout


def _fields(line: str) -> dict[str, str]:
    """``Key=Value Key=Value`` (scontrol -o) into a dict; values are single words in what is read here."""
    return dict(re.findall(r"(?:^|\s)([A-Za-z][\w:/]*)=(\S*)", line))


def job_info(job_id: str, env: Mapping[str, str], timeout_s: float) -> dict[str, str]:
    """``scontrol show job -o J`` as a dict; ``{"JobState": GONE}`` once Slurm has forgotten the job."""
    done = slurm(["scontrol", "show", "job", "-o", job_id], env, timeout_s)
    if done.returncode != 0:
        if "invalid job id" in (done.stderr + done.stdout).lower():
            return {"JobState": GONE}
        raise InfraError(f"Slurm does not answer: `scontrol show job {job_id}` failed "
                         f"({_last_line(done.stderr)}); {_conf_hint(env)}")
    info = _fields(done.stdout.strip().splitlines()[0] if done.stdout.strip() else "")
    info.setdefault("JobState", GONE)
    return info


def is_over(state: str) -> bool:
    return state not in WAITING_STATES | RUNNING_STATES | ENDING_STATES


def hostnames(nodelist: str, env: Mapping[str, str], timeout_s: float) -> list[str]:
    return _must(["scontrol", "show", "hostnames", nodelist], env, timeout_s).split()


def node_address(node: str, env: Mapping[str, str], timeout_s: float) -> str:
    """A node's NodeAddr (node names need not resolve from here; its address does)."""
    lines = _must(["sinfo", "-h", "-N", "-n", node, "-o", "%o"], env, timeout_s).split()
    if not lines:
        raise InfraError(f"Slurm does not know node {node} (`sinfo -n {node}` printed nothing); {_conf_hint(env)}")
    return lines[0]


def gpus_of(gres: str) -> int:
    """GPUs in a node's Gres (``gpu:8``, ``gpu:h100:4(S:0-1),gpu:a100:2``, ``(null)``)."""
    return sum(int(count) for count in _GPU_GRES.findall(gres or ""))


def cancel(job_id: str, env: Mapping[str, str], timeout_s: float) -> None:
    """``scancel J``; a job already over is not an error. Never raises: teardown goes on."""
    try:
        done = slurm(["scancel", job_id], env, timeout_s)
    except InfraError as err:
        print(f"dspark-ci: could not cancel Slurm job {job_id}: {err}", file=sys.stderr)
        return
    text = (done.stderr + done.stdout).lower()
    if done.returncode != 0 and "already completing or completed" not in text and "invalid job id" not in text:
        print(f"dspark-ci: `scancel {job_id}` failed: {_last_line(done.stderr)}", file=sys.stderr)


def job_processes(job_id: str) -> list[psutil.Process]:
    """Processes on this machine that belong to job J (slurmstepd gives each task SLURM_JOB_ID=J)."""
    found = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and proc.environ().get("SLURM_JOB_ID") == job_id:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def wait_gone(job_id: str, env: Mapping[str, str], timeout_s: float, command_timeout_s: float) -> str | None:
    """Wait until job J is over in Slurm and none of its processes is left here; None, or what is still there."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            state = job_info(job_id, env, command_timeout_s)["JobState"]
        except InfraError as err:
            state = f"unknown ({err})"
        left = job_processes(job_id)
        if is_over(state) and not left:
            return None
        if time.monotonic() >= deadline:
            what = [f"state {state}"] if not is_over(state) else []
            what += [f"{len(left)} process(es) here ({', '.join(str(p.pid) for p in left[:5])})"] if left else []
            return " and ".join(what)
        time.sleep(0.25)


class QueueTimeout(LaunchTimeout):
    """The job never left the queue: its message is Slurm's reason, not a health check's."""

    def __str__(self) -> str:
        return f"{self.cell_id}: {self.hint}"


# --- the batch script ----------------------------------------------------------------------------------

def job_name(run_id: str, cell_id: str) -> str:
    return f"dspark-{run_id}-{re.sub(r'[^A-Za-z0-9_.-]', '-', cell_id)[:60]}"


def job_comment(run_id: str, cell_id: str, launch: str) -> str:
    return f"dspark-ci:run={run_id}:cell={re.sub(r'[^A-Za-z0-9_.=-]', '-', cell_id)}:launch={launch}"


def gpus_per_node(plan: LaunchPlan) -> int | None:
    return plan.gpus_per_node


# Each rank's --host, --node-rank and --dist-init-addr are only known inside its task: shell words the task expands.
_OWN_ADDR, _NODE_RANK = '"$addr"', '"$rank"'


def task_words(argv: Sequence[str]) -> tuple[list[str], int | None, int | None]:
    """A rank's argv as shell words with its node-specific values replaced by the task's own variables, and
    the ports it binds (--port, and --dist-init-addr's on the leader)."""
    words: list[str] = []
    port = dist_port = None
    items = list(argv)
    index = 0
    while index < len(items):
        token = items[index]
        flag, eq, inline = token.partition("=")
        if flag in ("--host", "--node-rank", "--dist-init-addr", "--port") and (eq or index + 1 < len(items)):
            value = inline if eq else items[index + 1]
            if flag == "--host":
                word = _OWN_ADDR
            elif flag == "--node-rank":
                word = _NODE_RANK
            elif flag == "--dist-init-addr":
                dist_port = int(value.rpartition(":")[2])
                word = f'"$DSPARK_LEADER_ADDR:{dist_port}"'
            else:
                port = int(value)
                word = shlex.quote(value)
            words += [f"{flag}={word}"] if eq else [flag, word]
            index += 1 if eq else 2
            continue
        words.append(shlex.quote(token))
        index += 1
    return words, port, dist_port


@dataclass(frozen=True)
class JobSpec:
    """Everything one job is: its script, and the environment sbatch gets (the only place secrets live)."""

    name: str
    comment: str
    script: str
    env: dict[str, str]
    secrets: list[str]


def render_job(plan: LaunchPlan, logs_dir: Path, settings: SlurmSettings, launch: str) -> JobSpec:
    s = settings
    name, comment = job_name(s.run_id, plan.cell_id), job_comment(s.run_id, plan.cell_id, launch)
    nnodes = len(plan.ranks)
    container = s.container_kind
    python = s.python if container is None else "python3"
    planned_env: dict[str, str] = {}
    for command in plan.ranks:
        planned_env.update(command.env)
    resolved = resolve_env(planned_env, s.caller_env)
    secret_keys = {key for key, value in planned_env.items() if "${" in value}
    secrets = secret_values(planned_env, s.caller_env)
    forwarded = {k: v for k, v in s.caller_env.items() if k.startswith(s.forward_env_prefixes) and k not in planned_env}
    pythonpath = s.caller_env.get("PYTHONPATH", "")
    job_env = {**s.caller_env, **resolved}
    if s.server == "sim":
        job_env["PYTHONPATH"] = f"{REPO_ROOT}{os.pathsep + pythonpath if pythonpath else ''}"

    sbatch = [f"--job-name={name}", f"--comment={comment}", f"--nodes={nnodes}", "--ntasks-per-node=1",
              f"--output={logs_dir}/slurm-%j.out", "--export=ALL", "--chdir=" + str(logs_dir)]
    gpus = gpus_per_node(plan)
    if gpus:
        sbatch.append(f"--gpus-per-node={gpus}" if s.gpus == "gpus-per-node" else f"--gres=gpu:{gpus}")
    sbatch += [f"--partition={s.partition}"] if s.partition else []
    sbatch += [f"--account={s.account}"] if s.account else []
    sbatch += [f"--time={s.time}"] if s.time else []
    sbatch += list(s.extra)

    lines = [
        "#!/bin/bash",
        f"# dspark-ci: Slurm job for cell {plan.cell_id} of run {s.run_id}, written by launchers/slurm.py",
        "# (docs/SLURM.md). Kept on purpose: to run this cell again by hand, `sbatch " + f"{logs_dir}/job.sbatch`;",
        "# its options are the #SBATCH lines below. Secrets (" + (", ".join(sorted(secret_keys)) or "none here") +
        ") are never written here:",
        "# sbatch exports them from the submitting environment (--export=ALL), so set them there first.",
        *[f"#SBATCH {option}" for option in sbatch],
        "set -u",
        f"DSPARK_LOGS={shlex.quote(str(logs_dir))}",
        "export DSPARK_LOGS",
    ]
    if s.server == "sim":
        lines += ["# The simulated SGLang server (--server sim) is imported from this checkout.",
                  f"export PYTHONPATH={shlex.quote(str(REPO_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}"]
    plain = {k: v for k, v in resolved.items() if k not in secret_keys}
    if plain or secret_keys:
        lines.append("# The cell's environment.")
        lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(plain.items())]
        lines += [f"# {k}: planned as {planned_env[k]}, taken from the submitting environment"
                  for k in sorted(secret_keys)]
    if forwarded:
        lines.append("# Simulator knobs of the run that wrote this script.")
        lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(forwarded.items())]
    lines += [
        "",
        "# Every node's address by Slurm node name (NodeAddr: node names need not resolve), and the leader: the",
        "# first host of the job's node list, which is node index 0 of the step below. The same for every task.",
        'DSPARK_LEADER=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'DSPARK_NODE_ADDRS=""',
        'for node in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do',
        '    DSPARK_NODE_ADDRS+="$node=$(sinfo -h -N -n "$node" -o %o | head -n 1) "',
        "done",
        'DSPARK_LEADER_ADDR=$(sinfo -h -N -n "$DSPARK_LEADER" -o %o | head -n 1)',
        "export DSPARK_LEADER DSPARK_LEADER_ADDR DSPARK_NODE_ADDRS",
        'echo "job $SLURM_JOB_ID: nodes $DSPARK_NODE_ADDRS, leader $DSPARK_LEADER ($DSPARK_LEADER_ADDR)"',
        "",
        "dspark_exit() {  # RANK CODE [LINE]: the marker dspark-ci reads to name the first rank that failed",
        '    [ $# -gt 2 ] && echo "$3"',
        '    local line="rank $1 exited $2 at $(date +%s.%N)${signalled:-}"  # written whole, or not at all',
        '    echo "$line" > "$DSPARK_LOGS/$1.exit.tmp" && mv -f "$DSPARK_LOGS/$1.exit.tmp" "$DSPARK_LOGS/$1.exit"',
        '    exit "$2"',
        "}",
        "dspark_port_free() {  # RANK ADDR PORT: chosen before the job ran, so checked on the node itself",
        '    if timeout 2 bash -c ": </dev/tcp/$2/$3" 2>/dev/null; then',
        '        dspark_exit "$1" 98 "dspark-ci: port $3 on $2 is already in use on this node; run the cell again"',
        "    fi",
        "}",
        "dspark_task() {",
        "    # Runs once per node inside the srun step: everything here is expanded by the task itself, so each",
        "    # node gets its own rank (SGLang's sbatch example expands $SLURM_NODEID in the batch shell: all rank 0).",
        '    local rank=$SLURM_NODEID own=${SLURMD_NODENAME:-$(hostname -s)} addr="" entry signalled=""',
        '    for entry in $DSPARK_NODE_ADDRS; do [ "${entry%%=*}" = "$own" ] && addr=${entry#*=}; done',
        '    echo "# node rank $rank on $own (${addr:-?}), leader $DSPARK_LEADER ($DSPARK_LEADER_ADDR), '
        'job $SLURM_JOB_ID"',
        '    if [ -z "$addr" ] || [ -z "$DSPARK_LEADER_ADDR" ]; then',
        '        dspark_exit "$rank" 97 "dspark-ci: no NodeAddr for $own or $DSPARK_LEADER from sinfo"',
        "    fi",
        '    case "$rank" in',
    ]
    for command in plan.ranks:
        words, port, dist_port = task_words(server_argv(command, s.server, python))
        checks = [f'dspark_port_free "$rank" "$addr" {p}' for p in (port, dist_port if command.node_rank == 0 else None)
                  if p is not None]
        lines.append(f"    {command.node_rank})")
        lines += [f"        {check}" for check in checks]
        lines.append(f"        set -- {' '.join(words)} ;;")
    lines += ['    *) dspark_exit "$rank" 97 "dspark-ci: no command for node rank $rank" ;;', "    esac"]
    if container == "apptainer":
        binds = ",".join([str(logs_dir), *s.container_mounts])
        image = shlex.quote(s.container_image or '')
        lines.append(f'    set -- apptainer exec --nv --bind {shlex.quote(binds)} {image} "$@"')
    lines += [
        "    # Slurm stopping the step (scancel, time limit, another task's bad exit) is not this rank's own failure:",
        "    # the marker says so. The server gets the signal itself (same process group); bash notes it afterwards.",
        """    trap 'signalled=" after SIGTERM"' TERM""",
        '    echo "# $*"',
        '    "$@"',
        '    dspark_exit "$rank" "$?"',
        "}",
        "export -f dspark_exit dspark_port_free dspark_task",
        "",
        "# One task per node; one task ending badly ends the step (and so the job). Logs by node index = node rank.",
    ]
    srun = ["srun", "--kill-on-bad-exit=1", f"--nodes={nnodes}", "--ntasks-per-node=1", "--export=ALL",
            '--output="$DSPARK_LOGS/%n.log"']
    if container == "pyxis":
        mounts = ",".join([f"{logs_dir}:{logs_dir}", *s.container_mounts])
        srun += [f"--container-image={shlex.quote(s.container_image or '')}", f"--container-mounts={shlex.quote(mounts)}"]
    lines.append(" ".join(srun) + " bash -c 'dspark_task'")
    return JobSpec(name=name, comment=comment, script="\n".join(lines) + "\n", env=job_env, secrets=secrets)


# --- the launcher -------------------------------------------------------------------------------------

class SlurmLauncher:
    name = "slurm"

    def __init__(self, settings: SlurmSettings | None = None):
        self.settings = settings or SlurmSettings()

    def placement(self, nnodes: int) -> Placement:
        """Nodes are only known once the job runs, so --host, --node-rank and --dist-init-addr are placeholders
        the script replaces (each task binds its own NodeAddr; the leader is the job's first node). Ports: free
        on this machine (right for a cluster on this machine), or drawn from ``port_range``; either way each
        task checks them on its own node before starting its server."""
        if self.settings.port_range:
            low, high = self.settings.port_range
            port, dist_port = random.sample(range(low, high + 1), 2)
        else:
            port, dist_port = free_port(), free_port()
        return Placement(bind_hosts=("0.0.0.0",) * nnodes, leader_addr="${NODE0_ADDR}", port=port,
                         dist_port=dist_port)

    def preflight(self, plans: Sequence[LaunchPlan]) -> None:
        """Slurm answers, the partition exists, and it has enough nodes with enough GPUs for every cell."""
        env, timeout = self.settings.caller_env, self.settings.command_timeout_s
        conf = env.get("SLURM_CONF")
        if conf and not Path(conf).is_file():
            raise InfraError(f"Slurm does not answer: SLURM_CONF={conf} does not exist; {_conf_hint(env)}")
        listing = _must(["scontrol", "show", "partition", "-o"], env, timeout)
        partitions = [_fields(line) for line in listing.splitlines() if line.strip()]
        names = [p.get("PartitionName", "") for p in partitions]
        wanted = self.settings.partition or next((p.get("PartitionName") for p in partitions
                                                  if p.get("Default") == "YES"), None)
        if wanted is None:
            raise InfraError("Slurm has no default partition: pass --slurm-partition "
                             f"(known: {', '.join(names) or 'none'})")
        partition = next((p for p in partitions if p.get("PartitionName") == wanted), None)
        if partition is None:
            raise InfraError(f"Slurm partition {wanted!r} does not exist on this cluster (known: "
                             f"{', '.join(names) or 'none'}); pass --slurm-partition with one of those")
        gpus_by_node: dict[str, int] = {}
        for line in _must(["sinfo", "-h", "-N", "-p", wanted, "-o", "%N|%G"], env, timeout).splitlines():
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
        env, timeout = self.settings.caller_env, self.settings.command_timeout_s
        args = ["sinfo", "-h", "-N", "-o", "%N|%t"] + ([f"--partition={self.settings.partition}"]
                                                       if self.settings.partition else [])
        states = dict(line.strip().split("|", 1) for line in _must(args, env, timeout).splitlines() if "|" in line)
        usable = sorted(node for node, state in states.items() if not state.rstrip("*~#!%$@^-").startswith(
            NODES_OUT_OF_SERVICE))
        where = f"partition {self.settings.partition}" if self.settings.partition else "the default partition"
        return Capacity(max(1, len(usable)), len(usable) or None,
                        f"{len(usable)} node(s) in service in Slurm {where}")

    @contextlib.contextmanager
    def launch(self, plan: LaunchPlan, logs_dir: Path) -> Iterator["SlurmDeployment"]:
        logs_dir = logs_dir.resolve()
        logs_dir.mkdir(parents=True, exist_ok=True)
        job = _Job(plan, logs_dir, self.settings)
        with sigterm_as_interrupt():
            try:
                job.submit()
                job.wait_running()
                deployment = SlurmDeployment(plan.cell_id, job.leader_url(), job)
                health = urlparse(plan.health_url).path or "/health"
                leader_plan = dataclasses.replace(plan, base_url=deployment.base_url,
                                                  health_url=deployment.base_url + health)
                wait_until_ready(OurServer(leader_plan),
                                 Deadline(self.settings.boot_timeout_s, self.settings.poll_s),
                                 deployment.check, cell_id=plan.cell_id, last_lines=job.rank0_tail)
                deployment.boot_seconds = time.monotonic() - job.running_since
                yield deployment
            finally:
                with signals_deferred():  # a second Ctrl-C must not leave the job behind
                    job.teardown()


class SlurmDeployment:
    def __init__(self, cell_id: str, base_url: str, job: "_Job"):
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

    def __init__(self, plan: LaunchPlan, logs_dir: Path, settings: SlurmSettings):
        self.plan, self.logs_dir, self.settings = plan, logs_dir, settings
        self.env = dict(settings.caller_env)
        self.launch_token = uuid.uuid4().hex[:8]
        self.spec = render_job(plan, logs_dir, settings, self.launch_token)
        self.script_path = logs_dir / "job.sbatch"
        self.job_id: str | None = None
        self.submitting = False
        self.running_since = time.monotonic()
        self._info: dict[str, str] = {}
        self._info_at = float("-inf")
        self._signalled: set[int] = set()  # ranks whose marker says Slurm had sent them SIGTERM

    # submission ---------------------------------------------------------------------------------------
    def submit(self) -> None:
        s = self.settings
        # Exit markers of an earlier launch into the same folder would read as this job's ranks failing.
        for old in [*self.logs_dir.glob("*.exit"), *self.logs_dir.glob("*.exit.tmp")]:
            old.unlink(missing_ok=True)
        self.script_path.write_text(self.spec.script)
        record = {"job_name": self.spec.name, "comment": self.spec.comment, "cluster_conf": self.env.get("SLURM_CONF"),
                  "script": str(self.script_path)}
        if s.ledger:  # before sbatch: a kill while it runs still leaves a record that finds the job by name
            s.ledger.record("slurm", self.plan.cell_id, None, job_id=None, **record)
        self.submitting = True
        done = slurm(["sbatch", "--parsable", str(self.script_path)], self.spec.env, s.command_timeout_s,
                     cwd=self.logs_dir)
        if done.returncode != 0:
            self.submitting = False
            raise InfraError(f"{self.plan.cell_id}: sbatch refused the job "
                             f"({redact(_last_line(done.stderr), self.spec.secrets)}); script: {self.script_path}")
        self.job_id = done.stdout.strip().split(";")[0]
        if s.ledger:
            s.ledger.record("slurm", self.plan.cell_id, None, job_id=self.job_id, **record)

    def info(self, max_age_s: float = INFO_MAX_AGE_S) -> dict[str, str]:
        if self.job_id is None:
            return {}
        if time.monotonic() - self._info_at > max_age_s:
            self._info = job_info(self.job_id, self.env, self.settings.command_timeout_s)
            self._info_at = time.monotonic()
        return self._info

    def wait_running(self) -> None:
        """Until the job is RUNNING (queue time, its own limit), showing Slurm's reason while it is pending."""
        s = self.settings
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
            reason, partition = info.get("Reason", "None"), info.get("Partition", s.partition or "?")
            if s.progress and reason != shown and reason not in ("None", ""):  # None: not yet looked at
                s.progress(f"{self.plan.cell_id}: Slurm job {self.job_id} {state.lower()} ({reason}) "
                           f"in partition {partition}")
                shown = reason
            if waited >= s.queue_timeout_s:
                raise QueueTimeout(cell_id=self.plan.cell_id, reason="timeout", hint=(
                    f"Slurm job {self.job_id} pending ({reason}) for {waited:.0f}s in partition {partition}; the queue "
                    f"limit is {s.queue_timeout_s:g}s (--slurm-queue-timeout). `squeue -j {self.job_id}` and "
                    f"`scontrol show job {self.job_id}` say more; the boot timeout had not started"))
            time.sleep(s.poll_s)

    def leader_url(self) -> str:
        """Rank 0's API root: the first node of the job's node list, by its NodeAddr, on the planned port."""
        nodelist = self.info(max_age_s=0).get("NodeList", "")
        nodes = hostnames(nodelist, self.env, self.settings.command_timeout_s) if nodelist else []
        if not nodes:
            raise InfraError(f"{self.plan.cell_id}: Slurm job {self.job_id} runs but has no node list")
        port = urlparse(self.plan.base_url).port
        return f"http://{node_address(nodes[0], self.env, self.settings.command_timeout_s)}:{port}"

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
            time.sleep(SETTLE_S)  # the ranks that die of losing this one are a moment behind
            self._judge(self.exits())
        if self.info()["JobState"] in RUNNING_STATES:
            return
        deadline = time.monotonic() + MARKER_GRACE_S
        while time.monotonic() < deadline:  # the job ended: its tasks' markers may still be on their way
            if self.exits():
                time.sleep(SETTLE_S)
                self._judge(self.exits())
            time.sleep(0.2)
        self._raise_job_ended([])

    def _judge(self, exits: list[RankExit]) -> None:
        """A rank that failed of its own accord is the culprit (launchers.contract.culprit). Ranks that Slurm
        stopped, and ranks that died only of losing those, mean the job was ended from outside."""
        own = [e for e in exits if e.node_rank not in self._signalled and not is_peer_loss(e.sglang_error)]
        if own or not any(e.node_rank in self._signalled for e in exits):
            blamed = culprit(exits)  # what group_failed names
            where = self._header(blamed.node_rank)
            hints = [f"Slurm job {self.job_id}"] + ([where] if where else [])
            hints.append(f"full log: {rank_log_path(self.logs_dir, blamed.node_rank)}")
            raise group_failed(self.plan.cell_id, exits, hints)
        self._raise_job_ended(exits)

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
        s = self.settings
        ids = [self.job_id] if self.job_id else (self._submitted_by_name() if self.submitting else [])
        for job_id in ids:
            cancel(job_id, self.env, s.command_timeout_s)
        for job_id in ids:
            left = wait_gone(job_id, self.env, s.cancel_wait_s, s.command_timeout_s)
            if left:
                print(f"dspark-ci: Slurm job {job_id} (cell {self.plan.cell_id}) still has {left} "
                      f"{s.cancel_wait_s:g}s after scancel: check `squeue -j {job_id}`; "
                      f"`dspark-ci cleanup --run {s.run_id}` cancels it again", file=sys.stderr)
        self._redact_logs()

    def _submitted_by_name(self) -> list[str]:
        """sbatch was interrupted before it printed an id: find the job by its name and this launch's comment."""
        with contextlib.suppress(InfraError):
            return jobs_named(self.spec.name, self.spec.comment, self.env, self.settings.command_timeout_s)
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
    out = _must(["squeue", "-h", f"--name={name}", "-o", "%i|%k"], env, timeout_s)
    return [job for job, _, found in (line.strip().partition("|") for line in out.splitlines())
            if job and found == comment]


def remove_started(entry: dict) -> str | None:
    """Cancel the job a dead run recorded in its ledger (registry contract), if it is still there and still
    carries that run's id in its name or comment; None if it was already over or gone."""
    env = dict(os.environ)
    if entry.get("cluster_conf"):
        env["SLURM_CONF"] = entry["cluster_conf"]
    timeout, run_id = 30.0, str(entry.get("run_id") or "")
    if not run_id:
        return None
    if entry.get("job_id"):
        info = job_info(str(entry["job_id"]), env, timeout)
        ours = run_id in info.get("JobName", "") or f"run={run_id}:" in info.get("Comment", "")
        ids = [str(entry["job_id"])] if ours and not is_over(info["JobState"]) else []
    elif entry.get("job_name") and entry.get("comment"):
        ids = jobs_named(entry["job_name"], entry["comment"], env, timeout)
    else:
        return None
    for job_id in ids:
        cancel(job_id, env, timeout)
    problems = [f"{job_id}: {left}" for job_id in ids if (left := wait_gone(job_id, env, 30.0, timeout))]
    if problems:
        raise InfraError(f"Slurm job(s) still there after scancel: {'; '.join(problems)}")
    if not ids:
        return None
    return (f"Slurm job {', '.join(ids)} (cell {entry.get('cell')}, {entry.get('job_name')}) on "
            f"{entry.get('cluster_conf') or 'the default cluster'}")
