"""sglang-router as a process of the run (local, Docker and Slurm launchers: it runs where dspark-ci runs), recorded
in the ledger, watched like a rank, stopped with the group; and ``Router``, what a PD group needs of its router
wherever it runs (on Kubernetes: launchers/pd/k8s_router.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from dspark_ci.ground.errors import InfraError
from dspark_ci.ground.ledger import Ledger
from dspark_ci.ground.processes import die_with_parent, run_env, started_at, stop_all
from dspark_ci.ground.sglang.router import ROUTER_ENTRYPOINT, ROUTER_PACKAGE, ROUTER_VERSION
from dspark_ci.launchers.contract import LOG_LINES_KEPT, LaunchFailed, LaunchTimeout
from dspark_ci.launchers.logs import tail
from dspark_ci.launchers.pd.pd_plan import RouterCommand

ROUTER_PYTHON_ENV = "DSPARK_ROUTER_PYTHON"  # the Python that has sglang-router (default: dspark-ci's own)
INSTALL_HINT = f"pip install 'dspark-ci[pd]' (or {ROUTER_PACKAGE}=={ROUTER_VERSION}), or set {ROUTER_PYTHON_ENV}"


def router_python(env: Mapping[str, str]) -> str:
    return env.get(ROUTER_PYTHON_ENV) or sys.executable


def check_installed(env: Mapping[str, str]) -> None:
    python = router_python(env)
    probe = subprocess.run([python, "-c", "import sglang_router.launch_router"], capture_output=True, timeout=60)
    if probe.returncode != 0:
        raise InfraError(f"sglang-router is not importable by {python}: {INSTALL_HINT}")


class Router:
    """A PD group's router wherever it runs: where it answers, its log, ``check()`` (raises when it died) and the
    wait until it lists every worker healthy."""

    base_url: str
    log_path: Path

    def check(self, cell_id: str) -> None:
        raise NotImplementedError

    def wait_ready(self, cell_id: str, workers: int, timeout_s: float, also_check) -> float:
        """Until the router answers /health and lists every worker healthy (it registers them as it checks them)."""
        import requests  # on use: `dspark-ci run` reaches its first launch without paying for its import

        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            self.check(cell_id)
            also_check()
            with contextlib.suppress(requests.RequestException, ValueError):
                if requests.get(f"{self.base_url}/health", timeout=5).status_code == 200:
                    listed = requests.get(f"{self.base_url}/workers", timeout=5).json().get("workers", [])
                    if sum(1 for w in listed if w.get("is_healthy")) >= workers:
                        return time.monotonic() - started
            time.sleep(0.5)
        raise LaunchTimeout(cell_id=cell_id, reason="timeout", role="router",
                            last_lines=tail(self.log_path, LOG_LINES_KEPT),
                            hint=f"the router did not list {workers} healthy workers within {timeout_s:g} s")


class RouterProcess(Router):
    def __init__(self, command: RouterCommand, process: subprocess.Popen, log_path: Path):
        self.command, self.process, self.log_path = command, process, log_path
        self.base_url = command.base_url

    def check(self, cell_id: str) -> None:
        code = self.process.poll()
        if code is not None:
            raise LaunchFailed(cell_id=cell_id, reason="exited", node_rank=0, rank_exit_code=code,
                               last_lines=tail(self.log_path, LOG_LINES_KEPT), role="router",
                               hint=f"full log: {self.log_path}")


@contextlib.contextmanager
def local_router(command: RouterCommand, cell_id: str, logs_dir: Path, env: Mapping[str, str],
                 ledger: Ledger | None) -> Iterator[RouterProcess]:
    argv = [router_python(env), *command.argv[len(ROUTER_ENTRYPOINT) - 2:]]  # "python3" -> the router's Python
    logs_dir.mkdir(parents=True, exist_ok=True)
    log_path = logs_dir / "router.log"
    with open(log_path, "w") as log:
        log.write(f"# router: {' '.join(argv)}\n")
        log.flush()
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=run_env({**os.environ, **env}, ledger.run_id if ledger else None),
                                   start_new_session=True, preexec_fn=die_with_parent())
    if ledger:
        ledger.record("local", cell_id, None, pid=process.pid, pgid=process.pid, pid_started=started_at(process.pid),
                      log=str(log_path), what="router")
    try:
        yield RouterProcess(command, process, log_path)
    finally:
        stop_all([process], 10.0)
