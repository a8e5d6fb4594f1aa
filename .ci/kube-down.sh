#!/usr/bin/env bash
# Stop what .ci/kube-up.sh started (its own pid files only). The built binary and etcd's data stay.
run=${DSPARK_KUBE_RUN_DIR:-/run/dspark-kube}
for name in kube-apiserver etcd; do
    if [ -f "$run/$name.pid" ] && kill -0 "$(cat "$run/$name.pid")" 2>/dev/null; then
        kill "$(cat "$run/$name.pid")"
    fi
    rm -f "$run/$name.pid"
done
