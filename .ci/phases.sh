# Phases of .ci/run, each timed, with a table of where the time went. Sourced by a script under `set -euo pipefail`:
#
#   phase NAME CMD...        run CMD (a command or a shell function, in this shell: what it exports stays) and time it
#   phase_bg NAME CMD...     start CMD in the background (output in $PHASE_LOGS/NAME.log) while other phases run
#   phase_join NAME          wait for it: its own start-to-end time is recorded, and a failure fails the script
#   phase_summary            print the table so far
#
# Any failure, a background phase's included, fails the script with its exit code; the table is then printed to
# stderr with the failing phase marked, and background phases still running are stopped (their whole process tree).
# A background phase never joined is a failure too: nothing the script started may be left behind or ignored.

PHASE_LOGS=${PHASE_LOGS:-$PWD/.cache/ci-phases}
mkdir -p "$PHASE_LOGS"
declare -a _phase_rows=()
declare -A _phase_bg_pid=()
_phase_current="" _phase_current_start=0 _phase_t0=$SECONDS

_phase_slug() { local s=${1//[^A-Za-z0-9._-]/-}; echo "$s"; }
_phase_row() { _phase_rows+=("$(printf '%-34s %6s s  %s' "$1" "$2" "$3")"); }

phase() {
    local name=$1 start=$SECONDS
    shift
    echo "== $name"
    _phase_current=$name _phase_current_start=$start
    "$@"
    _phase_current=""
    _phase_row "$name" $((SECONDS - start)) ok
}

phase_bg() {
    local name=$1 file
    shift
    file=$PHASE_LOGS/$(_phase_slug "$name")
    rm -f "$file.done"
    echo "== $name: started in the background (log: $file.log)"
    # The inner subshell runs CMD under errexit; the outer one records its status and time whatever happens.
    (
        set +e
        start=$SECONDS
        (set -e; "$@") >"$file.log" 2>&1
        rc=$?
        echo "$rc $((SECONDS - start))" >"$file.done"
        exit "$rc"
    ) &
    _phase_bg_pid[$name]=$!
}

phase_join() {
    local name=$1 file rc=0 waited=$SECONDS took="?" status
    file=$PHASE_LOGS/$(_phase_slug "$name")
    echo "== $name: waiting for it"
    wait "${_phase_bg_pid[$name]}" || rc=$?
    unset "_phase_bg_pid[$name]"
    waited=$((SECONDS - waited))
    [ -f "$file.done" ] && read -r _ took <"$file.done"
    if [ "$rc" != 0 ]; then
        echo "== $name failed (exit $rc); the end of $file.log:" >&2
        tail -n 40 "$file.log" >&2 || true
        _phase_row "$name (background)" "$took" "FAILED (exit $rc)"
        exit "$rc"
    fi
    status=ok
    [ "$waited" -gt 0 ] && status="ok (the run waited $waited s for it)"
    _phase_row "$name (background)" "$took" "$status"
}

phase_summary() {
    echo "== time per phase (wall clock; background phases ran beside the others)"
    printf '  %s\n' "${_phase_rows[@]}"
    echo "  total so far: $((SECONDS - _phase_t0)) s"
}

_phase_kill_tree() {
    local child
    for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do _phase_kill_tree "$child"; done
    kill "$1" 2>/dev/null || true
}

_phase_exit() {
    local rc=$? name
    if [ "$rc" = 0 ] && [ "${#_phase_bg_pid[@]}" -gt 0 ]; then
        echo "== background phases never joined: ${!_phase_bg_pid[*]}" >&2
        rc=1
    fi
    [ "$rc" = 0 ] && return 0
    [ -n "$_phase_current" ] && _phase_row "$_phase_current" $((SECONDS - _phase_current_start)) "FAILED (exit $rc)"
    for name in "${!_phase_bg_pid[@]}"; do
        _phase_kill_tree "${_phase_bg_pid[$name]}"
        _phase_row "$name (background)" "-" "stopped: the run failed"
    done
    phase_summary >&2
    exit "$rc"
}
trap _phase_exit EXIT
