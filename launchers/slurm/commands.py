"""Talking to Slurm: its client commands (sbatch, scontrol, sinfo, squeue, scancel) and the job states they report."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil
from dspark_ci.ground.errors import InfraError

# Job states (squeue/scontrol JOB STATE CODES). Anything not listed as waiting or running is over.
WAITING_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
RUNNING_STATES = frozenset({"RUNNING"})
ENDING_STATES = frozenset({"COMPLETING", "STAGE_OUT", "SIGNALING", "SUSPENDED", "STOPPED", "RESIZING"})
NODES_OUT_OF_SERVICE = ("down", "drain", "drng", "fail", "maint", "unk", "no_resp", "futr", "inval")  # sinfo %t states
GONE = "GONE"  # scontrol no longer knows the job (purged after MinJobAge)

_GPU_GRES = re.compile(r"(?:^|,)gpu(?::[^:,()]+)?:(\d+)")


def conf_hint(env: Mapping[str, str]) -> str:
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
                         f"{conf_hint(env)}") from None


def last_line(text: str) -> str:
    """What a Slurm command said: its last non-empty line (the error itself; earlier ones are retries)."""
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no message"


def checked_output(args: Sequence[str], env: Mapping[str, str], timeout_s: float) -> str:
    done = slurm(args, env, timeout_s)
    if done.returncode != 0:
        raise InfraError(f"Slurm does not answer: `{' '.join(args)}` failed ({last_line(done.stderr)}); "
                         f"{conf_hint(env)}")
    return done.stdout


def key_values(line: str) -> dict[str, str]:
    """``Key=Value Key=Value`` (scontrol -o) into a dict; values are single words in what is read here."""
    return dict(re.findall(r"(?:^|\s)([A-Za-z][\w:/]*)=(\S*)", line))


def job_info(job_id: str, env: Mapping[str, str], timeout_s: float) -> dict[str, str]:
    """``scontrol show job -o J`` as a dict; ``{"JobState": GONE}`` once Slurm has forgotten the job."""
    done = slurm(["scontrol", "show", "job", "-o", job_id], env, timeout_s)
    if done.returncode != 0:
        if "invalid job id" in (done.stderr + done.stdout).lower():
            return {"JobState": GONE}
        raise InfraError(f"Slurm does not answer: `scontrol show job {job_id}` failed "
                         f"({last_line(done.stderr)}); {conf_hint(env)}")
    info = key_values(done.stdout.strip().splitlines()[0] if done.stdout.strip() else "")
    info.setdefault("JobState", GONE)
    return info


def is_over(state: str) -> bool:
    return state not in WAITING_STATES | RUNNING_STATES | ENDING_STATES


def hostnames(nodelist: str, env: Mapping[str, str], timeout_s: float) -> list[str]:
    return checked_output(["scontrol", "show", "hostnames", nodelist], env, timeout_s).split()


def node_address(node: str, env: Mapping[str, str], timeout_s: float) -> str:
    """A node's NodeAddr (node names need not resolve from here; its address does)."""
    lines = checked_output(["sinfo", "-h", "-N", "-n", node, "-o", "%o"], env, timeout_s).split()
    if not lines:
        raise InfraError(f"Slurm does not know node {node} (`sinfo -n {node}` printed nothing); {conf_hint(env)}")
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
        print(f"dspark-ci: `scancel {job_id}` failed: {last_line(done.stderr)}", file=sys.stderr)


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

