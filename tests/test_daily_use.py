"""Daily use, as a user types it: no green run that tested nothing, errors by their real cause, input
bounds, the simulator's own help, suites that say what answered. Every test goes through the command line."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
from pathlib import Path

import pytest
from dspark_ci.ground.sglang.release import DEFAULT_VERSION

from dspark_ci.cli import VERBS
from tests.cli_under_test import DSPARK_CI
from tests.test_run_cli import FEW_BOOTS

REPO = Path(__file__).resolve().parent.parent
SMOKE = str(REPO / "matrices" / "smoke.yaml")


def dspark(*args: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*DSPARK_CI, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, **kwargs)


def assert_one_short_message(done: subprocess.CompletedProcess, code: int, says: str) -> None:
    assert done.returncode == code, done.stderr
    assert says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) <= 3, done.stderr


def test_version():
    done = dspark("--version")
    assert done.returncode == 0 and done.stdout.startswith("dspark-ci ") and f"SGLang {DEFAULT_VERSION}" in done.stdout


@pytest.mark.parametrize("flag, value", [("--boot-timeout", "-1"), ("--boot-timeout", "0"), ("--boot-timeout", "nan"),
                                         ("--boot-timeout", "soon"), ("--slurm-queue-timeout", "-5")])
def test_numeric_options_are_refused_before_anything_is_launched(tmp_path, flag, value):
    done = dspark("run", SMOKE, f"{flag}={value}", "--out", str(tmp_path / "run"))
    assert_one_short_message(done, 2, f"argument {flag}:")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("out, says", [
    ("/proc/dspark-ci-test/run", "cannot be written: No such file or directory"),
    ("README.md", "is an existing file, not a directory"),
    ("README.md/run", "cannot be written: Not a directory"),
], ids=["proc", "existing-file", "under-a-file"])
def test_an_unusable_out_is_named_by_its_real_cause(out, says):
    done = dspark("run", SMOKE, "--out", out)
    assert_one_short_message(done, 2, f"--out {out}: {says}")
    assert "disk" not in done.stderr


def test_an_existing_run_directory_is_refused_unless_forced(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text('{"schema": 1}')
    done = dspark("run", SMOKE, "--out", str(out))
    assert_one_short_message(done, 2, "already holds a previous run's results")
    assert "--force" in done.stderr
    assert (out / "results.json").read_text() == '{"schema": 1}'
    # --force is the clear choice to write over it (here refused later by another check: nothing launched)
    done = dspark("run", SMOKE, "--out", str(out), "--force", "--cell", "no-such-cell")
    assert_one_short_message(done, 2, "--cell no-such-cell: no such cell")


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="SGLang is installed: preflight passes")
def test_a_run_refused_at_preflight_leaves_no_directory_behind(tmp_path):
    done = dspark("run", SMOKE, "--out", str(tmp_path / "a" / "b"), "--server", "sglang")
    assert_one_short_message(done, 3, "SGLang is not installed")
    assert not (tmp_path / "a").exists()



def test_a_matrix_crossing_to_a_billion_cells_is_refused_at_once_with_the_count(tmp_path):
    axes = "\n".join(f"  {key}: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]" for key in (
        "tp", "dp", "cp", "pp", "gpus_per_node", "nnodes", "speculative_block_size", "speculative_num_steps",
        "speculative_eagle_topk"))
    matrix = tmp_path / "huge.yaml"
    matrix.write_text(f"hardware: {{cuda: h200}}\ndefaults:\n  model: m\n  model_slug: m\naxes:\n{axes}\n")
    for verb in ("plan", "run"):
        done = dspark(verb, str(matrix), timeout=20)
        assert_one_short_message(done, 2, f"{matrix}:6: this matrix expands to 1,000,000,000 cells")
        assert "more than the 10,000 a matrix may hold" in done.stderr


def test_sim_help_documents_the_simulator_first_then_sglangs_flags():
    done = dspark("sim", "--help")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    # SGLang's ~450 flags are listed wrapped, many to a line, after the simulator's own knobs and faults: the whole
    # help stays a few screens, not a line per flag (it grows by a line or two with each knob or fault).
    assert text.startswith("usage: dspark-ci sim --model-path PATH") and len(text.splitlines()) < 350
    for knob in ("DSPARK_SIM_ACCEPT_PROB", "DSPARK_SIM_BOOT_SECONDS", "DSPARK_SIM_FAULTS", "DSPARK_SIM_GPQA_PATH"):
        assert knob in text
    for fault in ("accept_collapse", "boot_reject=MESSAGE", "rank_exit=RANK:SECONDS", "malformed_stream"):
        assert fault in text
    assert text.index("DSPARK_SIM_FAULTS") < text.index("--speculative-algorithm")


def test_a_mistyped_sim_flag_is_sglangs_own_error_line():
    done = dspark("sim", "--model-path", "m", "--prot", "30000")
    assert done.returncode == 2
    # the pinned SGLang release's prepare_server_args: argparse.ArgumentParser(prog="sglang serve"), no suggestion
    # appended
    assert done.stderr.splitlines()[-1] == "sglang serve: error: unrecognized arguments: --prot 30000"
    assert len(done.stderr.splitlines()) == 2, done.stderr


def test_sim_on_a_busy_port_says_so_in_one_line(tmp_path):
    import socket

    with socket.socket() as taken:  # somebody else's server
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = dspark("sim", "--model-path", "m", "--port", str(port), env={**os.environ,
                                                                          "DSPARK_SIM_BOOT_SECONDS": "0"})
    assert done.returncode == 1  # as SGLang (uvicorn) exits on a bind error
    assert done.stderr.strip().splitlines() == [
        f"OSError: [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): address already in use"]


ONE_NODE = "dsv4-flash-tp8-a2a-none-dspark-b7-cuda"
REJECTED = "dsv4-flash-tp8-dp4-dpattn-a2a-none-dspark-b7-cuda"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def run_in_terminal(args: list[str], columns: int, timeout: float = 180) -> tuple[int, str]:
    """`dspark-ci ARGS` with stdout and stderr on a pseudo-terminal of ``columns`` columns, as in a tmux pane."""
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "COLUMNS", "GITHUB_ACTIONS")}
    process = subprocess.Popen([*DSPARK_CI, *args], stdin=follower, stdout=follower, stderr=follower, cwd=REPO,
                               env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed: every writer exited
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return process.wait(timeout=timeout), b"".join(chunks).decode(errors="replace")


def test_progress_in_an_80_column_terminal_fits_and_shows_elapsed_and_eta(tmp_path):
    # the display is under test, not the verdict: two boots at most, an undecided gate accepted
    code, screen = run_in_terminal(["run", SMOKE, "--cell", ONE_NODE, "--cell", REJECTED, "--suites", "accept",
                                    "--out", str(tmp_path / "run"), *FEW_BOOTS, "--accept-inconclusive"], columns=80)
    assert code == 0, screen
    drawn = [ANSI.sub("", piece) for piece in re.split(r"\r|\n", screen) if piece.strip()]
    # a wrapped live line would leave a stale copy of itself on every redraw; a cell's result is one line
    too_wide = [piece for piece in drawn if len(piece) >= 80 and not piece.startswith(("    ", "results in "))]
    assert not too_wide, too_wide
    # (stage time, run time[, ETA]), each as progress.duration writes it: 42s, 3m05s, 1h02m (a loaded machine's
    # first cell can take more than a minute)
    took = r"(?:\d+h)?(?:\d+m)?\d+[sm]"
    live = [piece for piece in drawn if re.search(rf"\({took}, run {took}", piece)]
    assert any(piece.startswith("[1/2] dsv4-flash") and "measuring (sanity, accept)" in piece for piece in live), live
    assert any(piece.startswith("[2/2] dsv4-flash") and "ETA " in piece for piece in live), live
    assert re.search(rf"\[1/2\] {ONE_NODE}: (PASSED|INCONCLUSIVE) in {took}", screen)


def test_progress_in_ci_is_plain_timestamped_lines(tmp_path):
    done = dspark("run", SMOKE, "--cell", REJECTED, "--out", str(tmp_path / "run"), timeout=120,
                  env={**os.environ, "CI": "true"})
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr and "\x1b" not in done.stderr
    lines = done.stderr.splitlines()
    assert all(re.match(r"\[dspark-ci \d\d:\d\d:\d\d \+\d+s\] ", line) for line in lines if line.strip()), lines
    assert any(f"[1/1] {REJECTED}: REJECTED_AS_EXPECTED in " in line for line in lines)
    quiet = dspark("run", SMOKE, "--cell", REJECTED, "--out", str(tmp_path / "quiet"), "--quiet", timeout=120,
                   env={**os.environ, "CI": "true"})
    assert quiet.returncode == 0 and len(quiet.stderr.splitlines()) == 1 and "results in" in quiet.stderr


@pytest.mark.parametrize("value", ["0", "-3", "x"])
def test_a_pull_request_number_is_checked_when_parsed(value):
    done = dspark("chatops", "--comment", "/rerun-test test_x.py", "--user", "someone", f"--pr={value}", "--dry-run")
    assert_one_short_message(done, 2, "argument --pr:")


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_verbs_help_prints_its_usage(verb):
    """`--help` is the first thing a newcomer types; an error here is the first thing they would see."""
    done = dspark(verb, "--help")
    assert done.returncode == 0 and done.stdout.startswith(f"usage: dspark-ci {verb}"), done.stderr[-2000:]
