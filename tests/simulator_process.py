"""Start the simulated SGLang server on a free loopback port, for our tests of the suites and for bench/.

Only the public command line is used (``python -m dspark_ci.sglang_sim`` + SGLang's launch flags, knobs in
``DSPARK_SIM_*``), exactly as a user would start it by hand.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import requests
from dspark_ci.ground.processes import free_port, signal_group
from dspark_ci.launchers.materialize import FRONTEND_ENTRY, frontend_python

SPECULATIVE_ARGS = ("--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", "sim/draft",
                    "--speculative-dspark-block-size", "3")


@contextmanager
def running_simulator(env: Mapping[str, str] | None = None, args: Sequence[str] = (), *,
                      model: str = "sim/model", log_path: Path | None = None,
                      boot_timeout: float = 60.0, frontend_python: str | None = None,
                      entry: Path = FRONTEND_ENTRY) -> Iterator[str]:
    """Yield the base URL ("http://127.0.0.1:PORT") of a healthy simulator; stop it afterwards (its whole
    process group). ``frontend_python``: SGLang's own front end in front of it, run by that venv's Python
    (``--server sglang-frontend``; expect a minute or two of boot); ``entry``: what that Python runs (the engine's
    wrapper for ``--server sglang-engine``)."""
    port = free_port()
    command = [frontend_python, str(entry)] if frontend_python else [sys.executable, "-m", "dspark_ci.sglang_sim"]
    argv = [*command, "--model-path", model, "--host", "127.0.0.1", "--port", str(port), *args]
    full_env = {**os.environ, "DSPARK_SIM_BOOT_SECONDS": "0", **(env or {})}
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL
    process = subprocess.Popen(argv, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(base_url, process, boot_timeout, log_path)
        yield base_url
    finally:
        signal_group(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            signal_group(process.pid, signal.SIGKILL)
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
            if requests.get(f"{base_url}/health", timeout=5).status_code == 200:
                return
        except requests.RequestException:  # not up yet, or (SGLang's /health generates a token) slow to answer
            pass
        time.sleep(0.1)
    raise RuntimeError(f"simulator at {base_url} not healthy after {timeout} s")


FRONTEND_MISSING = ("SGLang's front-end venv is not installed: bash .ci/sglang-frontend.sh "
                    "(DSPARK_SGLANG_PYTHON names its Python)")


def frontend_venv() -> str | None:
    """The Python that runs SGLang's own front end (--server sglang-frontend), or None where it is not installed."""
    python = frontend_python(os.environ)
    ready = Path(python).exists() and subprocess.run(
        [python, "-c", "import fastapi, uvicorn, sglang"], capture_output=True, timeout=120).returncode == 0
    return python if ready else None
