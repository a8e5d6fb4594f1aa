""".ci/phases.sh, the phase timing of .ci/run, run in isolation: every phase is timed and tabled, exports of a phase
stay, and any failure fails the script: a foreground phase, a background phase at its join, a background phase
never joined. A failed run stops what it started in the background."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def ci_script(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    script = tmp_path / "run"
    script.write_text(f"set -euo pipefail\nsource {REPO / '.ci' / 'phases.sh'}\n{body}\n")
    env = {**os.environ, "PHASE_LOGS": str(tmp_path / "logs")}
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def alive(proc: Path) -> bool:
    try:
        return "zombie" not in proc.joinpath("status").read_text(errors="replace").lower()
    except FileNotFoundError:
        return False


def test_phases_are_timed_and_tabled_and_keep_their_exports(tmp_path):
    done = ci_script(tmp_path, """
set_it() { export CHOSEN=yes; }
phase_bg "slow build" bash -c 'echo building; sleep 2'
phase "quick" set_it
phase "uses the export" test "$CHOSEN" = yes
phase_join "slow build"
phase_summary
phase "last" echo the last line""")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "the last line" and done.stderr == ""  # nothing printed after the last phase's output
    table = done.stdout[done.stdout.index("== time per phase"):]
    assert "quick" in table and "uses the export" in table and "slow build (background)" in table
    row = next(line for line in table.splitlines() if "slow build" in line)
    assert int(row.split()[3]) >= 2, row  # its own start to end, whole seconds
    assert (tmp_path / "logs" / "slow-build.log").read_text() == "building\n"


def test_a_failing_foreground_phase_fails_the_script_and_is_marked(tmp_path):
    done = ci_script(tmp_path, """
phase "fine" true
phase "broken" bash -c 'exit 3'
phase "never reached" touch reached""")
    assert done.returncode == 3
    assert "FAILED (exit 3)" in next(line for line in done.stderr.splitlines() if "broken" in line)
    assert not (tmp_path / "reached").exists()


def test_a_failing_background_phase_fails_the_script_at_its_join(tmp_path):
    done = ci_script(tmp_path, """
phase_bg "build" bash -c 'echo compiler says no >&2; exit 5'
phase "meanwhile" true
phase_join "build"
phase "never reached" touch reached""")
    assert done.returncode == 5
    assert "compiler says no" in done.stderr  # the end of its log, where CI shows it
    assert "FAILED (exit 5)" in next(line for line in done.stderr.splitlines() if "build (background)" in line)
    assert not (tmp_path / "reached").exists()


def test_a_failure_elsewhere_stops_the_background_phases_it_started(tmp_path):
    done = ci_script(tmp_path, """
phase_bg "long build" bash -c 'sleep 300 & echo $! > child.pid; wait'
until [ -s child.pid ]; do sleep 0.1; done
phase "broken" false""")
    assert done.returncode == 1
    assert "stopped: the run failed" in done.stderr
    child = Path(f"/proc/{int((tmp_path / 'child.pid').read_text())}")
    deadline = time.monotonic() + 60  # a signal is delivered asynchronously: wait for it to act (a loaded machine)
    while alive(child):
        assert time.monotonic() < deadline, "the background phase's child outlived the failed run"
        time.sleep(0.1)


def test_a_background_phase_never_joined_fails_the_script(tmp_path):
    done = ci_script(tmp_path, """
phase_bg "forgotten" true
phase "the rest" true""")
    assert done.returncode == 1 and "never joined: forgotten" in done.stderr
