#!/usr/bin/env bash
# Bring up the Docker engines the Docker tests use, and the simulator image in each. Idempotent:
# engines that already answer are reused, an image already built is rebuilt from cache in seconds.
#
#   engine 1: the default engine, unix:///var/run/docker.sock
#   engine 2: a second dockerd with its own socket, data-root, exec-root and pidfile, as a second "node"
#
# Both run with --bridge=none --iptables=false: containers use host networking, nothing is routed.
# Prints export-able lines (stdout) for the caller:  eval "$(.ci/docker-up.sh)"
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
engine1=unix:///var/run/docker.sock
engine2=unix:///run/dspark-docker2.sock
sim_image=${DSPARK_SIM_IMAGE:-dspark-ci/sglang-sim:latest}
log_dir=${DSPARK_DOCKER_LOG_DIR:-/var/log/dspark-ci}
say() { echo "docker-up: $*" >&2; }
source "$repo/.ci/pidfile.sh"

missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Another apt (an unattended upgrade, a parallel job) may hold the dpkg lock: wait for it, bounded.
    apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

answers() { docker -H "$1" version --format '{{.Server.Version}}' >/dev/null 2>&1; }

start_engine() {  # URL NAME PIDFILE EXEC_ROOT dockerd-args...
    local url=$1 name=$2 pidfile=$3 exec_root=$4; shift 4
    if answers "$url"; then
        say "$name already answers at $url"
        return
    fi
    # dockerd refuses to start while its pidfile names a live process, and adopts a live pid in its containerd's as
    # containerd; files left by daemons that died with the machine may name anyone by now (pids are reused)
    pid_forget_stale "$pidfile" dockerd
    pid_forget_stale "$exec_root/containerd/containerd.pid" containerd
    mkdir -p "$log_dir"
    say "starting $name at $url (log: $log_dir/$name.log)"
    setsid nohup dockerd --host "$url" --bridge=none --iptables=false --pidfile "$pidfile" --exec-root "$exec_root" \
        "$@" >"$log_dir/$name.log" 2>&1 < /dev/null &
    for _ in $(seq 1 120); do
        answers "$url" && return
        sleep 0.5
    done
    say "$name did not answer within 60 s; its log ends with:"
    tail -n 20 "$log_dir/$name.log" >&2
    exit 3
}

start_engine "$engine1" dockerd /var/run/docker.pid /var/run/docker
start_engine "$engine2" dockerd2 /run/dspark-docker2.pid /run/dspark-docker2 --data-root /var/lib/dspark-docker2

# Build once (offline: Debian packages + local wheels), then copy to the second engine if it differs.
"$repo/docker/build-sim-image.sh" --docker-host "$engine1"
id1=$(docker -H "$engine1" image inspect -f '{{.Id}}' "$sim_image")
id2=$(docker -H "$engine2" image inspect -f '{{.Id}}' "$sim_image" 2>/dev/null || true)
if [ "$id1" != "$id2" ]; then
    say "copying $sim_image to the second engine"
    docker -H "$engine1" save "$sim_image" | docker -H "$engine2" load >/dev/null
    docker -H "$engine2" image prune -f --filter "label=dspark-ci.image=sglang-sim" >/dev/null
fi

# DSPARK_REQUIRE_DOCKER: the engines are up, so a Docker test that cannot reach them fails instead of skipping.
cat <<EXPORTS
export DOCKER_HOST=$engine1
export DSPARK_DOCKER_HOST2=$engine2
export DSPARK_DOCKER_HOSTS="$engine1=127.0.0.1 $engine2=127.0.0.2"
export DSPARK_REQUIRE_DOCKER=1
EXPORTS
