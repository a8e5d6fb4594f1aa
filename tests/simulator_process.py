"""Start the simulated SGLang server on a free loopback port, for our tests of the suites and for bench/.

Only the public command line is used (``python -m sglang_sim`` + SGLang's launch flags, knobs in
``DSPARK_SIM_*``), exactly as a user would start it by hand.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import requests

from launchers.processes import free_port

SPECULATIVE_ARGS = ("--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", "sim/draft",
                    "--speculative-dspark-block-size", "3")


@contextmanager
def running_simulator(env: Mapping[str, str] | None = None, args: Sequence[str] = (), *,
                      model: str = "sim/model", log_path: Path | None = None,
                      boot_timeout: float = 60.0) -> Iterator[str]:
    """Yield the base URL ("http://127.0.0.1:PORT") of a healthy simulator; stop it afterwards."""
    port = free_port()
    argv = [sys.executable, "-m", "sglang_sim", "--model-path", model, "--host", "127.0.0.1",
            "--port", str(port), *args]
    full_env = {**os.environ, "DSPARK_SIM_BOOT_SECONDS": "0", **(env or {})}
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL
    process = subprocess.Popen(argv, env=full_env, stdout=log, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(base_url, process, boot_timeout, log_path)
        yield base_url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if log_path:
            log.close()


def _wait_healthy(base_url: str, process: subprocess.Popen, timeout: float, log_path: Path | None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text()[-2000:] if log_path else "(no log kept)"
            raise RuntimeError(f"simulator exited with code {process.returncode}:\n{tail}")
        try:
            if requests.get(f"{base_url}/health", timeout=1).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"simulator at {base_url} not healthy after {timeout} s")
