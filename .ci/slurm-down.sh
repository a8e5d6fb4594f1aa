#!/usr/bin/env bash
# Stop the Slurm cluster .ci/slurm-up.sh started: exactly the daemons named by its pidfiles (slurmd per
# node, slurmctld, munged), never a system slurm or munge. Config, state and logs are kept.
set -euo pipefail

run_dir=${DSPARK_SLURM_RUN_DIR:-/run/dspark-slurm}
say() { echo "slurm-down: $*" >&2; }

# PIDFILE PROGRAM: TERM, up to 10 s, then KILL; only if the pid still is that program (compared through
# readlink -f: Debian's /usr/sbin/slurmd is an alternatives symlink to slurmd-wlm).
stop() {
    local pid i
    pid=$(cat "$1" 2>/dev/null) || return 0
    if [ -z "$pid" ] || [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" != "$(readlink -f "$(command -v "$2")")" ]; then
        rm -f "$1"  # stale: its process is gone (or the pid now belongs to someone else)
        return 0
    fi
    say "stopping $2 pid $pid ($(basename "$1"))"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 40; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.25
    done
    kill -0 "$pid" 2>/dev/null && { say "pid $pid ignored SIGTERM for 10 s: SIGKILL"; kill -KILL "$pid" || true; }
    rm -f "$1"
}

# Nodes first (all at once: each takes ~2 s), munged last: slurmd and slurmctld still talk to munge while
# shutting down.
for f in "$run_dir"/slurmd-*.pid; do
    [ -e "$f" ] && stop "$f" slurmd &
done
wait
stop "$run_dir/slurmctld.pid" slurmctld
stop "$run_dir/munged.pid" munged
