"""Starting the simulated SGLang server as a real process on a free loopback port, as a user would.

Import from a test module::

    from tests.sim_fixtures import FAST_SIM_ENV, SimProcess, free_port, sim  # noqa: F401 (``sim`` is a fixture)

    def test_something(sim):
        server = sim(["--speculative-algorithm", "DSPARK", ...], env={"DSPARK_SIM_ACCEPT_PROB": "0.5"})
        requests.get(server.url("/health"))

``sim(...)`` starts ``python -m dspark_ci.sglang_sim --model-path sim/tiny --host H --port P [args]``, waits for
``/health`` to answer 200 (unless ``wait=False``) and stops every process it started at teardown.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from dspark_ci.ground.processes import free_port

# Fast and deterministic: no boot delay, no prefill time, 1 ms per decode step.
FAST_SIM_ENV = {"DSPARK_SIM_BOOT_SECONDS": "0", "DSPARK_SIM_PREFILL_MS_PER_TOKEN": "0",
                "DSPARK_SIM_DECODE_STEP_MS": "1", "DSPARK_SIM_SEED": "0"}
MODEL = "sim/tiny"
BOOT_TIMEOUT_S = 20.0


@dataclass
class SimProcess:
    process: subprocess.Popen
    host: str
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url(self, path: str) -> str:
        return self.base_url + path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def last_line(self) -> str:
        lines = [line for line in self.log().splitlines() if line.strip()]
        return lines[-1] if lines else ""

    def health(self) -> int | None:
        try:
            return requests.get(self.url("/health"), timeout=2).status_code
        except requests.ConnectionError:
            return None

    def wait_healthy(self, timeout_s: float = BOOT_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"simulator exited with {self.process.returncode}:\n{self.log()}")
            if self.health() == 200:
                return
            time.sleep(0.05)
        raise AssertionError(f"simulator not healthy after {timeout_s} s:\n{self.log()}")

    def wait_exit(self, timeout_s: float = 10.0) -> int:
        return self.process.wait(timeout=timeout_s)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def sim_command(args: list[str], host: str, port: int, model: str = MODEL) -> list[str]:
    return [sys.executable, "-m", "dspark_ci.sglang_sim", "--model-path", model, "--host", host, "--port", str(port),
            *args]


@contextlib.contextmanager
def running_sim(args: list[str], log_path: Path, env: dict | None = None, host: str = "127.0.0.1",
                port: int | None = None, wait: bool = True, model: str = MODEL) -> Iterator[SimProcess]:
    port = port or free_port(host)
    full_env = {**os.environ, **FAST_SIM_ENV, **(env or {})}
    with log_path.open("wb") as log:
        process = subprocess.Popen(sim_command(args, host, port, model), env=full_env, stdout=log,
                                   stderr=subprocess.STDOUT)
    server = SimProcess(process, host, port, log_path)
    try:
        if wait:
            server.wait_healthy()
        yield server
    finally:
        server.stop()


def run_sim_to_exit(args: list[str], env: dict | None = None, timeout_s: float = 20.0,
                    model: str = MODEL) -> subprocess.CompletedProcess:
    """Run the simulator for a launch that should stop by itself (rejections, bad flags)."""
    return subprocess.run(sim_command(args, "127.0.0.1", free_port(), model), env={**os.environ, **FAST_SIM_ENV,
                                                                                   **(env or {})},
                          capture_output=True, text=True, timeout=timeout_s)


@pytest.fixture
def sim(tmp_path):
    """A factory: ``sim(args, env=None, host=..., port=..., wait=True, model=...) -> SimProcess``;
    every process it started is stopped at teardown."""
    with contextlib.ExitStack() as stack:
        counter = iter(range(1000))

        def start(args: list[str] = (), env: dict | None = None, **kwargs) -> SimProcess:
            log_path = tmp_path / f"sim-{next(counter)}.log"
            return stack.enter_context(running_sim(list(args), log_path, env, **kwargs))

        yield start


@pytest.fixture(scope="module")
def module_sim(tmp_path_factory):
    """Like ``sim``, for servers shared by the tests of one module."""
    with contextlib.ExitStack() as stack:
        def start(args: list[str] = (), env: dict | None = None, **kwargs) -> SimProcess:
            log_path = tmp_path_factory.mktemp("sim") / "sim.log"
            return stack.enter_context(running_sim(list(args), log_path, env, **kwargs))

        yield start
