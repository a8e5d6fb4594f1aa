"""``python -m sglang_sim.frontend [SGLang launch_server flags]`` (or this file's path) with the SGLang venv's
Python (``.ci/sglang-frontend.sh``): SGLang 0.5.23's own HTTP server, tokenizer and detokenizer in front of the
simulated engine. Exit codes as the simulator's (``sglang_sim.main``)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path


def main() -> int:
    argv = sys.argv[1:]
    if os.environ.get("DSPARK_FRONTEND_BOOTED") != "1":
        # Run by path from a Python that does not have this tree: find it, then start again as a module in
        # the environment SGLang's spawned processes need (sglang_sim.frontend.frontend_env).
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from sglang_sim.frontend import frontend_env

        env = frontend_env(os.environ, Path(tempfile.mkdtemp(prefix="dspark-frontend-")))
        os.execve(sys.executable, [sys.executable, "-m", "sglang_sim.frontend", *argv], env)
    from sglang_sim.frontend import launch
    from sglang_sim.main import main as simulator_main

    launch.remember_argv(argv)
    return simulator_main(argv, serve_rank0=launch.serve)


if __name__ == "__main__":
    sys.exit(main())
