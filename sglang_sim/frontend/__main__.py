"""``python -m dspark_ci.sglang_sim.frontend [SGLang launch_server flags]`` (or this file's path) with the SGLang venv's
Python (``.ci/sglang-frontend.sh``): SGLang's own HTTP server, tokenizer and detokenizer in front of the
simulated engine. Exit codes as the simulator's (``dspark_ci.sglang_sim.main``); a server SGLang kills ends by that
signal.

The first process only prepares: a scratch directory and the environment SGLang's spawned processes need
(``dspark_ci.sglang_sim.frontend.frontend_env``). It runs the front end as its child, passes SIGTERM and SIGINT on, and
removes the scratch directory however the child ended (SGLang's own shutdown ends in SIGKILL to itself)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

SCRATCH_PREFIX = "dspark-frontend-"  # + the supervising process's pid + "-"


def _remove_orphans() -> None:
    """Scratch directories of supervisors that are gone: a SIGKILL (a launcher's grace period running out during
    SGLang's slow shutdown) leaves no time to remove them."""
    for directory in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*-*"):
        pid = directory.name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(directory, ignore_errors=True)


def _supervise(argv: list[str]) -> int:
    # Run by path from a Python without dspark-ci: the folder holding the dspark_ci package (a clone's top, or the
    # site-packages of a wheel) is the nearest one above this file that has it.
    sys.path.insert(0, str(next(p for p in Path(__file__).resolve().parents
                                if (p / "dspark_ci" / "__init__.py").is_file())))
    from dspark_ci.sglang_sim.frontend import frontend_env

    _remove_orphans()
    root = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-"))
    try:
        child = subprocess.Popen([sys.executable, "-m", "dspark_ci.sglang_sim.frontend", *argv],
                                 env=frontend_env(os.environ, root))
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda received, frame: child.send_signal(received))
        code = child.wait()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if code < 0:  # end as the child did, so the launcher sees SGLang's own ending
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def main() -> int:
    argv = sys.argv[1:]
    if os.environ.get("DSPARK_FRONTEND_BOOTED") != "1":
        return _supervise(argv)
    from dspark_ci.sglang_sim.frontend import launch
    from dspark_ci.sglang_sim.main import main as simulator_main

    launch.remember_argv(argv)
    return simulator_main(argv, serve_rank0=launch.serve)


if __name__ == "__main__":
    sys.exit(main())
