# Sourced by .ci/{slurm,kube}-{up,down}.sh and .ci/docker-up.sh. A pidfile names our daemon only while its
# pid still runs the program we started: pids get reused (pid_max is 32768 on small machines and one engine
# matrix wraps it), so a stale pidfile must neither stop us from starting the daemon nor make us signal a stranger.

# PIDFILE PROGRAM (a name on PATH or a path): the pid runs and is that program. Compared through readlink -f:
# Debian's /usr/sbin/slurmd is an alternatives symlink to slurmd-wlm.
pid_alive() {
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null \
        && [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$(readlink -f "$(command -v "$2")")" ]
}

# PIDFILE PROGRAM: remove the pidfile unless it names a live PROGRAM (a daemon that reads its own pidfile at start,
# as dockerd and the containerd it supervises do, takes any live pid there for itself still running).
pid_forget_stale() {
    if [ -f "$1" ] && ! pid_alive "$1" "$2"; then
        echo "$(basename "$0" .sh): removing $1: its pid is no $(basename "$2") any more" >&2
        rm -f "$1"
    fi
}

# PIDFILE PROGRAM: TERM, up to 10 s, then KILL; only while pid_alive. The pidfile goes either way.
pid_stop() {
    local pid i
    if ! pid_alive "$1" "$2"; then
        rm -f "$1"  # stale: its process is gone (or the pid now belongs to someone else)
        return 0
    fi
    pid=$(cat "$1")
    echo "$(basename "$0" .sh): stopping $(basename "$2") pid $pid ($(basename "$1"))" >&2
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 40; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.25
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "$(basename "$0" .sh): pid $pid ignored SIGTERM for 10 s: SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$1"
}
