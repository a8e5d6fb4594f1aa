"""``python -m sglang_sim.frontend [SGLang launch_server flags]``, with the SGLang venv's Python
(``.ci/sglang-frontend.sh``): SGLang 0.5.23's own HTTP server, tokenizer and detokenizer in front of the
simulated engine. Exit codes as the simulator's (``sglang_sim.main``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

BOOTED_ENV = "DSPARK_FRONTEND_BOOTED"
BOOT_DIR = Path(__file__).resolve().parent / "boot"
REPO = Path(__file__).resolve().parents[2]


def main() -> int:
    argv = sys.argv[1:]
    if os.environ.get(BOOTED_ENV) != "1":
        # Once more with the stub's sitecustomize and this tree first on PYTHONPATH: SGLang spawns its scheduler
        # and detokenizer as fresh interpreters, which inherit the environment, not our sys.path.
        paths = [str(BOOT_DIR), str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        env = {**os.environ, BOOTED_ENV: "1", "PYTHONPATH": os.pathsep.join(paths)}
        os.execve(sys.executable, [sys.executable, "-m", "sglang_sim.frontend", *argv], env)
    from sglang_sim.frontend import launch
    from sglang_sim.main import main as simulator_main

    launch.remember_argv(argv)
    return simulator_main(argv, serve_rank0=launch.serve)


if __name__ == "__main__":
    sys.exit(main())
