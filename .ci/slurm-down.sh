#!/usr/bin/env bash
# Stop the Slurm cluster .ci/slurm-up.sh started: exactly the daemons named by its pidfiles (slurmd per
# node, slurmctld, munged), never a system slurm or munge. Config, state and logs are kept.
set -euo pipefail

run_dir=${DSPARK_SLURM_RUN_DIR:-/run/dspark-slurm}

source "$(dirname "$0")/pidfile.sh"

# Nodes first (all at once: each takes ~2 s), munged last: slurmd and slurmctld still talk to munge while
# shutting down.
for f in "$run_dir"/slurmd-*.pid; do
    [ -e "$f" ] && pid_stop "$f" slurmd &
done
wait
pid_stop "$run_dir/slurmctld.pid" slurmctld
pid_stop "$run_dir/munged.pid" munged
