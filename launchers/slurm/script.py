"""The batch script of one cell's Slurm job (``render_job``), like Docker's and Kubernetes' ``spec``."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dspark_ci.ground.install_root import IMPORT_ROOT
from dspark_ci.ground.sglang.release import AMD, NVIDIA
from dspark_ci.launchers.contract import LaunchContext
from dspark_ci.launchers.materialize import resolve_env, secret_values, server_command, server_python
from dspark_ci.launchers.plan_types import LaunchPlan, RankCommand
from dspark_ci.launchers.slurm.options import SlurmOptions
from dspark_ci.launchers.slurm.tuning import SlurmTuning

# How a container reaches the node's accelerators: apptainer's GPU flag per vendor (--nv binds NVIDIA's driver,
# --rocm AMD's); pyxis/enroot bind device files, which ROCm needs mounted (SGLang's AMD docs: /dev/kfd, /dev/dri).
APPTAINER_GPU_FLAGS: Mapping[str, tuple[str, ...]] = {NVIDIA: ("--nv",), AMD: ("--rocm",)}
PYXIS_DEVICE_MOUNTS: Mapping[str, tuple[str, ...]] = {AMD: ("/dev/kfd:/dev/kfd", "/dev/dri:/dev/dri")}


def apptainer_reference(image: str) -> str:
    """apptainer pulls registry images by URI; a bare `repo:tag` is Docker Hub's, a path (.sif) is used as is."""
    return image if "://" in image or image.endswith(".sif") or image.startswith("/") else f"docker://{image}"

def job_name(run_id: str, cell_id: str) -> str:
    return f"dspark-{run_id}-{re.sub(r'[^A-Za-z0-9_.-]', '-', cell_id)[:60]}"


def job_comment(run_id: str, cell_id: str, launch: str) -> str:
    return f"dspark-ci:run={run_id}:cell={re.sub(r'[^A-Za-z0-9_.=-]', '-', cell_id)}:launch={launch}"


def gpus_per_node(plan: LaunchPlan) -> int | None:
    return plan.gpus_per_node


# Each rank's --host, --node-rank and --dist-init-addr are only known inside its task: shell words the task expands.
_TASK_VALUES = {"host": '"$addr"', "node_rank": '"$rank"', "leader_addr": '"$DSPARK_LEADER_ADDR"'}


def task_words(command: RankCommand) -> tuple[list[str], int | None, int | None]:
    """A rank's command as shell words with its node-specific values replaced by the task's own variables, and
    the ports it binds (--port, and --dist-init-addr's on the leader)."""
    quoted = [shlex.quote(word) for word in command.head], [shlex.quote(word) for word in command.tail]
    node = command.node
    if node is None:
        return [*quoted[0], *quoted[1]], None, None
    dist_port = node.dist_port if node.nnodes > 1 else None
    return [*quoted[0], *node.words(**_TASK_VALUES), *quoted[1]], node.port, dist_port


@dataclass(frozen=True)
class JobSpec:
    """Everything one job is: its script, and the environment sbatch gets (the only place secrets live)."""

    name: str
    comment: str
    script: str
    env: dict[str, str]
    secrets: list[str]


def render_job(plan: LaunchPlan, logs_dir: Path, options: SlurmOptions, context: LaunchContext, tuning: SlurmTuning,
               launch: str) -> JobSpec:
    o, c, t = options, context, tuning
    name, comment = job_name(c.run_id, plan.cell_id), job_comment(c.run_id, plan.cell_id, launch)
    nnodes = len(plan.ranks)
    container = o.container_kind
    # slurmd's PATH is not ours: an absolute interpreter (the engine's venv for --server sglang-engine)
    python = (t.python if c.server != "sglang-engine" else server_python(c.server, c.caller_env)) \
        if container is None else "python3"
    planned_env: dict[str, str] = {}
    for command in plan.ranks:
        planned_env.update(command.env)
    resolved = resolve_env(planned_env, c.caller_env)
    secret_keys = {key for key, value in planned_env.items() if "${" in value}
    secrets = secret_values(planned_env, c.caller_env)
    forwarded = {k: v for k, v in c.caller_env.items() if k.startswith(t.forward_env_prefixes) and k not in planned_env}
    pythonpath = c.caller_env.get("PYTHONPATH", "")
    job_env = {**c.caller_env, **resolved}
    if c.server == "sim":
        job_env["PYTHONPATH"] = f"{IMPORT_ROOT}{os.pathsep + pythonpath if pythonpath else ''}"

    sbatch = [f"--job-name={name}", f"--comment={comment}", f"--nodes={nnodes}", "--ntasks-per-node=1",
              f"--output={logs_dir}/slurm-%j.out", "--export=ALL", "--chdir=" + str(logs_dir)]
    gpus = gpus_per_node(plan)
    if gpus:
        sbatch.append(f"--gpus-per-node={gpus}" if o.gpus == "gpus-per-node" else f"--gres=gpu:{gpus}")
    sbatch += [f"--partition={o.partition}"] if o.partition else []
    sbatch += [f"--account={o.account}"] if o.account else []
    sbatch += [f"--time={o.time}"] if o.time else []
    sbatch += list(o.extra)

    lines = [
        "#!/bin/bash",
        f"# dspark-ci: Slurm job for cell {plan.cell_id} of run {c.run_id}, written by launchers/slurm/script.py",
        "# (docs/SLURM.md). Kept on purpose: to run this cell again by hand, `sbatch " + f"{logs_dir}/job.sbatch`;",
        "# its options are the #SBATCH lines below. Secrets (" + (", ".join(sorted(secret_keys)) or "none here") +
        ") are never written here:",
        "# sbatch exports them from the submitting environment (--export=ALL), so set them there first.",
        *[f"#SBATCH {option}" for option in sbatch],
        "set -u",
        f"DSPARK_LOGS={shlex.quote(str(logs_dir))}",
        "export DSPARK_LOGS",
    ]
    if c.server == "sim":
        lines += ["# The simulated SGLang server (--server sim) is imported from this dspark-ci.",
                  f"export PYTHONPATH={shlex.quote(str(IMPORT_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}"]
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
        words, port, dist_port = task_words(server_command(command, c.server, python))
        checks = [f'dspark_port_free "$rank" "$addr" {p}' for p in (port, dist_port if command.node_rank == 0 else None)
                  if p is not None]
        lines.append(f"    {command.node_rank})")
        lines += [f"        {check}" for check in checks]
        lines.append(f"        set -- {' '.join(words)} ;;")
    lines += ['    *) dspark_exit "$rank" 97 "dspark-ci: no command for node rank $rank" ;;', "    esac"]
    if container == "apptainer":
        binds = ",".join([str(logs_dir), *t.container_mounts])
        image = shlex.quote(apptainer_reference(o.image_for(plan)))
        gpu = " ".join(APPTAINER_GPU_FLAGS.get(plan.accelerator, ()))
        lines.append(f'    set -- apptainer exec {gpu + " " if gpu else ""}--bind {shlex.quote(binds)} {image} "$@"')
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
        mounts = ",".join([f"{logs_dir}:{logs_dir}", *t.container_mounts,
                           *PYXIS_DEVICE_MOUNTS.get(plan.accelerator, ())])
        srun += [f"--container-image={shlex.quote(o.image_for(plan))}", f"--container-mounts={shlex.quote(mounts)}"]
    lines.append(" ".join(srun) + " bash -c 'dspark_task'")
    return JobSpec(name=name, comment=comment, script="\n".join(lines) + "\n", env=job_env, secrets=secrets)
