#!/usr/bin/env bash
# Bring up a small real Slurm cluster on this one machine for the Slurm tests. Idempotent: a cluster that
# already answers (sinfo with our slurm.conf, every node responding) is reused; missing daemons are started;
# a changed slurm.conf restarts everything.
#
#   munged      own socket /run/dspark-slurm/munge.sock (never the system munge)
#   slurmctld   127.0.0.1:6817, cluster "dspark"
#   slurmd -N nX  one per node (n1..n4: a two-node cell beside its two-node reference), NodeAddr 127.0.2.X,
#                 Port 6817+X, 4 CPUs and gpu:8 (declared, no devices)
#
# A second cluster beside it (e.g. 8 nodes for bench/cluster_makespan.py) takes its own directories, controller
# port and node network: DSPARK_SLURM_{CONF,STATE,RUN,LOG}_DIR, DSPARK_SLURM_CTLD_PORT (nodes on the ports after
# it), DSPARK_SLURM_NODE_NET (nodes at NET.X, default 127.0.2) and DSPARK_SLURM_NODES.
#
# Config: /etc/dspark-slurm   state: /var/lib/dspark-slurm   pids+socket: /run/dspark-slurm
# Logs:   /var/log/dspark-ci/slurm
# Prints export-able lines (stdout) for the caller:  eval "$(bash .ci/slurm-up.sh)"
# Stop it with .ci/slurm-down.sh.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"  # slurmctld, slurmd, munged live in sbin; a CI PATH may lack it

conf_dir=${DSPARK_SLURM_CONF_DIR:-/etc/dspark-slurm}
state_dir=${DSPARK_SLURM_STATE_DIR:-/var/lib/dspark-slurm}
run_dir=${DSPARK_SLURM_RUN_DIR:-/run/dspark-slurm}
log_dir=${DSPARK_SLURM_LOG_DIR:-/var/log/dspark-ci/slurm}
n_nodes=${DSPARK_SLURM_NODES:-4}
partition=dspark
ctld_port=${DSPARK_SLURM_CTLD_PORT:-6817}
node_net=${DSPARK_SLURM_NODE_NET:-127.0.2}
conf=$conf_dir/slurm.conf
munge_sock=$run_dir/munge.sock
nodes=$(seq -f 'n%g' 1 "$n_nodes")
export SLURM_CONF=$conf
say() { echo "slurm-up: $*" >&2; }
source "$(dirname "$0")/pidfile.sh"

install_missing() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurm-wlm)
    command -v munged >/dev/null || missing+=(munge)
    [ ${#missing[@]} -eq 0 ] && return
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Lock timeout: another apt (e.g. docker-up.sh in parallel) may hold the dpkg lock for a while.
    apt-get -o DPkg::Lock::Timeout=300 update -qq >&2
    apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends slurm-wlm munge >&2
}

write_slurm_conf() {  # FILE
    local i
    cat >"$1" <<EOF
# Written by dspark-ci .ci/slurm-up.sh; edits are overwritten (a changed file restarts the cluster).
ClusterName=dspark
# The name must be this host's short name (slurmctld refuses to start otherwise); the address is loopback.
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$munge_sock
StateSaveLocation=$state_dir/ctld
SlurmdSpoolDir=$state_dir/slurmd-%n
SlurmctldPidFile=$run_dir/slurmctld.pid
SlurmdPidFile=$run_dir/slurmd-%n.pid
SlurmctldLogFile=$log_dir/slurmctld.log
SlurmdLogFile=$log_dir/slurmd-%n.log
# An empty plugstack of our own: the system one's includes are not ours to load.
PlugStackConfig=$conf_dir/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/pgid
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
# Each slurmd must bind its own NodeAddr (NoInAddrAny would bind the host name's address and break launch).
CommunicationParameters=NoCtldInAddrAny
# Trust the declared CPUs=4 on a 2-core machine instead of draining the node for "Low CPUs".
SlurmdParameters=config_overrides
ReturnToService=2
# Finished jobs stay visible in scontrol show job (state, exit code) for 5 minutes.
MinJobAge=300
# scancel: SIGKILL 2 s after SIGTERM (default 30 s), so cancelled processes are gone within seconds.
KillWait=2
InactiveLimit=0
SlurmdTimeout=60
EOF
    for i in $(seq 1 "$n_nodes"); do
        echo "NodeName=n$i NodeAddr=$node_net.$i Port=$((ctld_port + i)) CPUs=4 Gres=gpu:8 State=UNKNOWN" >>"$1"
    done
    echo "PartitionName=$partition Nodes=n[1-$n_nodes] Default=YES MaxTime=INFINITE State=UP" >>"$1"
}

write_gres_conf() {  # FILE
    # gres/gpu silently drops a GPU line without File= (slurmd then reports gpu:0 and the node goes INVAL),
    # so each "GPU" is a /dev/null-like device of our own; nothing opens them. All nodes share the 8 files.
    printf 'AutoDetect=off\nNodeName=n[1-%s] Name=gpu Count=8 File=%s/dev/fakegpu[0-7]\n' \
        "$n_nodes" "$state_dir" >"$1"
}

make_fake_gpus() {
    local i dev
    mkdir -p "$state_dir/dev"
    for i in $(seq 0 7); do
        dev=$state_dir/dev/fakegpu$i
        # Same device numbers as /dev/null. Without CAP_MKNOD a plain file also counts (slurmd logs
        # "not a valid character or block device" and keeps it).
        [ -e "$dev" ] || mknod -m 0666 "$dev" c 1 3 2>/dev/null || : >"$dev"
    done
}

ensure_munge_key() {
    [ -s "$conf_dir/munge.key" ] && return
    if [ -s /etc/munge/munge.key ]; then
        install -m 0400 /etc/munge/munge.key "$conf_dir/munge.key"
    else
        mungekey --create --keyfile="$conf_dir/munge.key"
        chmod 0400 "$conf_dir/munge.key"
    fi
}

# Writes the config; returns 0 if it changed (or is new), 1 if identical to the running one.
update_config() {
    local new=$conf_dir/slurm.conf.new gnew=$conf_dir/gres.conf.new changed=1
    write_slurm_conf "$new"
    write_gres_conf "$gnew"
    : >"$conf_dir/plugstack.conf"
    cmp -s "$new" "$conf" && cmp -s "$gnew" "$conf_dir/gres.conf" || changed=0
    mv -f "$new" "$conf"
    mv -f "$gnew" "$conf_dir/gres.conf"
    return $changed
}

fail() {  # MESSAGE LOGFILE...
    local log
    say "$1"
    for log in "${@:2}"; do
        say "$log ends with:"
        tail -n 15 "$log" >&2 2>/dev/null || say "(no log at $log)"
    done
    exit 3
}

wait_for() {  # SECONDS WHAT "LOGFILE..." COMMAND...
    local secs=$1 what=$2 logs=$3 i; shift 3
    for ((i = 0; i < secs * 4; i++)); do
        "$@" && return 0
        sleep 0.25
    done
    # shellcheck disable=SC2086  # logs: a space-separated list of paths without spaces
    fail "$what did not come up within $secs s" $logs
}

# Daemons get no stdout (the caller's $(...) would wait for it to close) and not our lock fd 9.
start_munged() {
    pid_alive "$run_dir/munged.pid" munged && return
    say "starting munged on $munge_sock"
    munged --socket="$munge_sock" --key-file="$conf_dir/munge.key" --pid-file="$run_dir/munged.pid" \
        --log-file="$log_dir/munged.log" --seed-file="$state_dir/munged.seed" --force \
        </dev/null >>"$log_dir/munged.log" 2>&1 9>&- || fail "munged failed to start" "$log_dir/munged.log"
    wait_for 10 munged "$log_dir/munged.log" munge_answers
}
munge_answers() { munge --socket="$munge_sock" -n </dev/null | unmunge --socket="$munge_sock" >/dev/null 2>&1; }

start_slurmctld() {
    pid_alive "$run_dir/slurmctld.pid" slurmctld && return
    say "starting slurmctld on 127.0.0.1:$ctld_port"
    slurmctld </dev/null >>"$log_dir/slurmctld.log" 2>&1 9>&- \
        || fail "slurmctld failed to start" "$log_dir/slurmctld.log"
    wait_for 30 slurmctld "$log_dir/slurmctld.log" ctld_answers
}
ctld_answers() { timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP'; }

start_slurmd() {  # NODE
    pid_alive "$run_dir/slurmd-$1.pid" slurmd && return
    say "starting slurmd -N $1"
    local since
    since=$(date +%s)
    slurmd -N "$1" </dev/null >>"$log_dir/slurmd-$1.log" 2>&1 9>&- \
        || fail "slurmd -N $1 failed to start" "$log_dir/slurmd-$1.log"
    wait_for 30 "slurmd -N $1 (registered with slurmctld)" "$log_dir/slurmd-$1.log" node_registered "$1" "$since"
}

# NODE SINCE: slurmd runs and slurmctld got its registration at or after SINCE (epoch s). slurmd forks
# before binding its port, so "started" says nothing; and a dead node still looks idle for SlurmdTimeout.
node_registered() {
    local t
    pid_alive "$run_dir/slurmd-$1.pid" slurmd || return 1
    t=$(timeout 10 scontrol show node "$1" 2>/dev/null | grep -o 'SlurmdStartTime=[^ ]*' | cut -d= -f2)
    [ -n "$t" ] && [ "$t" != None ] && [ "$(date -d "$t" +%s)" -ge "$2" ]
}

node_states() { timeout 10 sinfo -h -N -p "$partition" -o '%N %t' 2>/dev/null; }

# Our pidfiles name live daemons: slurmctld notices a dead slurmd only after SlurmdTimeout, so sinfo alone
# would call a cluster with a just-killed node healthy.
daemons_alive() {
    local node
    pid_alive "$run_dir/munged.pid" munged && pid_alive "$run_dir/slurmctld.pid" slurmctld || return 1
    for node in $nodes; do pid_alive "$run_dir/slurmd-$node.pid" slurmd || return 1; done
}

# Every node responds (no "*") and is usable.
cluster_healthy() {
    local states
    states=$(node_states) || return 1
    [ "$(wc -l <<<"$states")" -eq "$n_nodes" ] || return 1
    ! grep -qvE ' (idle|mix|alloc|comp|plnd|resv)$' <<<"$states"
}

# A node drained or down from an earlier life (e.g. its slurmd was killed) but answering again: resume it.
resume_nodes() {
    local node state
    node_states | while read -r node state; do
        case $state in *'*') ;; drain* | drng* | down* | fail*)
            say "resuming $node ($state)"
            scontrol update NodeName="$node" State=RESUME >&2 || true ;;
        esac
    done
}
nodes_ready() { cluster_healthy || { resume_nodes; false; }; }

stop_all() {
    bash "$(dirname "$0")/slurm-down.sh" >&2
}

main() {
    local node
    install_missing
    mkdir -p "$conf_dir" "$state_dir/ctld" "$run_dir" "$log_dir"
    for node in $nodes; do mkdir -p "$state_dir/slurmd-$node"; done  # SlurmdSpoolDir: slurmd won't create it
    chmod 0755 "$run_dir"  # munged refuses a socket directory writable by others
    # One run at a time: two parallel runs must not both start daemons on the same ports.
    exec 9>"$run_dir/up.lock"
    flock -w 300 9 || { say "another slurm-up.sh held $run_dir/up.lock for 300 s"; exit 3; }
    ensure_munge_key
    make_fake_gpus
    if update_config; then
        say "config $conf is new or changed: (re)starting every daemon"
        stop_all
        # Saved jobs and nodes belong to the old config. Removed (not slurmctld -c) so that a start failing
        # after this point still starts clean next time, when the config no longer looks changed.
        rm -rf "${state_dir:?}/ctld"/*
    elif daemons_alive && cluster_healthy; then
        say "cluster already answers ($conf): reusing it"
        return
    fi
    local t0=$SECONDS
    start_munged
    start_slurmctld
    for node in $nodes; do start_slurmd "$node"; done
    local logs
    logs="$log_dir/slurmctld.log $(printf "$log_dir/slurmd-%s.log " $nodes)"
    wait_for 30 "nodes $(echo $nodes) (sinfo: all responding and idle)" "$logs" nodes_ready
    say "cluster up in $((SECONDS - t0)) s: $(node_states | tr '\n' ' ')"
}

main
# DSPARK_REQUIRE_SLURM: the cluster is up, so a Slurm test that cannot reach it fails instead of skipping.
cat <<EXPORTS
export SLURM_CONF=$conf
export DSPARK_REQUIRE_SLURM=1
export DSPARK_SLURM_PARTITION=$partition
EXPORTS
