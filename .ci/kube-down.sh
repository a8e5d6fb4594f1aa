#!/usr/bin/env bash
# Stop what .ci/kube-up.sh started (its own pid files, while they still name its programs). The built binary
# and etcd's data stay.
set -uo pipefail
source "$(dirname "$0")/pidfile.sh"
run=${DSPARK_KUBE_RUN_DIR:-/run/dspark-kube}
pid_stop "$run/kube-apiserver.pid" "${DSPARK_KUBE_CACHE:-/var/cache/dspark-kube}/bin/kube-apiserver"
pid_stop "$run/etcd.pid" etcd
