"""After a SIGKILL of `dspark-ci run` while the speed suite measures on worker processes (a multiprocessing manager,
resource tracker and workers, their semaphores in /dev/shm, a pymp-* directory), `cleanup --run ID` leaves no
process, port, /dev/shm file or temp directory of the run. bench/kill_runs.py does it at random moments."""

from __future__ import annotations

import socket
import tempfile
import time
from pathlib import Path

import psutil
import yaml

from tests.test_run_cli import ONE_NODE, REPO
from tests.test_verdicts import VerdictRun, sigkill_when


def workers_matrix(where: Path) -> str:
    matrix = yaml.safe_load((REPO / "matrices" / "smoke.yaml").read_text())
    matrix["defaults"].pop("baseline", None)
    matrix["defaults"]["suites"]["speed"] = {"num_requests": 64, "concurrency": 4, "output_len": 128, "workers": 2}
    path = where / "workers.yaml"
    path.write_text(yaml.safe_dump(matrix))
    return str(path)


def shared_memory_of(tag: str) -> set[Path]:
    found = set()
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("DSPARK_TEST_RUN") == tag:
                found |= {Path(m.path.removesuffix(" (deleted)")) for m in proc.memory_maps()
                          if m.path.startswith("/dev/shm/")}
        except psutil.Error:
            continue
    return found


def workers_of(tag: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("DSPARK_TEST_RUN") == tag and "multiprocessing" in " ".join(proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_sigkill_while_speed_workers_measure_then_cleanup_leaves_nothing(tmp_path):
    run = VerdictRun(tmp_path, workers_matrix(tmp_path), "--cell", ONE_NODE, "--suites", "speed",
                     faults="slow_decode=20")
    shared = sigkill_when(run, lambda: len(workers_of(run.tag)) >= 3, "the speed suite's workers", settle_s=1.0,
                          before=lambda: shared_memory_of(run.tag))
    assert shared, "the workers map multiprocessing semaphores in /dev/shm"
    time.sleep(1.0)
    assert workers_of(run.tag), "the workers outlive a SIGKILL of dspark-ci: cleanup has something to do"
    run_id = run.results()["run_id"]
    cleaned = run.cleanup("--run", run_id)
    assert cleaned.returncode == 0, cleaned.stderr
    assert "the suites' pytest" in cleaned.stdout
    run.assert_nothing_left()
    assert not [path for path in shared if path.exists()]
    assert not (Path(tempfile.gettempdir()) / f"dspark-ci-{run_id}").exists()
    port = int((run.out / "logs" / ONE_NODE / "0.log").read_text().split("--port ")[1].split()[0])
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0
