"""`dspark-ci run --server sglang-frontend`: the pinned SGLang release's own front end in front of the simulated
engine, as a user runs it. Faults come out as they do on the simulator (tests/test_run_cli.py has the same cases
there), with SGLang's error line and no process left behind. The runs are skipped, with the command, where the
front-end venv is not installed (``bash .ci/sglang-frontend.sh``); the refusals need nothing."""

from __future__ import annotations

import pytest

from tests.simulator_process import FRONTEND_MISSING, frontend_venv
from tests.test_run_cli import ONE_NODE, SMOKE, TWO_NODES, Run


def test_other_launchers_are_refused_before_anything_starts(tmp_path):
    run = Run(tmp_path, SMOKE, "--server", "sglang-frontend", "--launcher", "docker")
    done = run()
    assert done.returncode == 2, done.stderr
    assert "--launcher local" in done.stderr and not run.out.exists()


def test_a_missing_venv_fails_preflight_with_the_command_that_makes_it(tmp_path):
    run = Run(tmp_path, SMOKE, "--server", "sglang-frontend")
    run.env["DSPARK_SGLANG_PYTHON"] = str(tmp_path / "no-venv" / "bin" / "python")
    done = run()
    assert done.returncode == 3, done.stderr
    assert "bash .ci/sglang-frontend.sh" in done.stderr and not run.out.exists()


@pytest.mark.skipif(frontend_venv() is None, reason=FRONTEND_MISSING)
@pytest.mark.parametrize(
    "faults, cell_id, timeout, code, status, says",
    [
        ("crash_first_prefill", ONE_NODE, 600, 1, "error", "AssertionError: [sglang_sim fault crash_first_prefill]"),
        ("rank_exit=1:3", TWO_NODES, 600, 1, "error", "node rank 1 exited"),
        ("hang_boot", ONE_NODE, 30, 3, "error", "did not become healthy"),
    ],
    ids=["crash-on-first-prefill", "node-loss", "hung-boot-times-out"],
)
def test_faults_come_out_as_on_the_simulator(tmp_path, faults, cell_id, timeout, code, status, says):
    # The sanity suite's first request is the first prefill; the accept suite would boot a reference beside the cell
    run = Run(tmp_path, SMOKE, "--server", "sglang-frontend", "--cell", cell_id, "--suites", "sanity",
              "--boot-timeout", str(timeout), faults=faults)
    done = run(timeout=timeout + 300)  # and nothing of it is left (Run checks the process table)
    assert done.returncode == code, done.stderr
    cell = run.cell(cell_id)
    assert cell["status"] == status and says in cell["error"]
