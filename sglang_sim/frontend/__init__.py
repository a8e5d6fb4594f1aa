"""SGLang's own front end (HTTP server, TokenizerManager, OpenAI serving layer, DetokenizerManager) in front
of the simulated engine, which plays SGLang's scheduler behind SGLang's own IPC: ``--server sglang-frontend``.

Only this module and ``vocab.py`` import without SGLang; ``launch.py``, ``scheduler.py`` and ``io_schema.py`` import
sglang and run inside the venv ``.ci/sglang-frontend.sh`` builds, in an environment ``frontend_env`` made
(``python -m dspark_ci.sglang_sim.frontend ARGV`` from that venv sets it up itself)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from dspark_ci.ground.install_root import IMPORT_ROOT, alone_on_path

BOOTED_ENV = "DSPARK_FRONTEND_BOOTED"
ROOT_ENV = "DSPARK_FRONTEND_ROOT"  # this launch's scratch directory: the model directory, Prometheus' files
BOOT_DIR = Path(__file__).resolve().parent / "boot"


def frontend_env(environ: Mapping[str, str], root: Path | None = None) -> dict[str, str]:
    """``environ`` with the torchvision stub's sitecustomize (``boot/``) and this tree first on PYTHONPATH:
    SGLang spawns its scheduler and detokenizer as fresh interpreters, which inherit the environment, not
    our sys.path, and must have the stub before they import sglang. With ``root`` (a launch's scratch
    directory), Prometheus' multiprocess directory is set there before anything imports prometheus_client:
    the simulator's modules do, earlier than SGLang would set it, and metrics recorded in a process that imported
    it first would never reach /metrics."""
    # A launch's scratch directory holds the link when dspark-ci is a wheel (its site-packages stays off the path).
    importable = alone_on_path(root) if root is not None else IMPORT_ROOT
    paths = [str(BOOT_DIR), str(importable), *filter(None, environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**environ, BOOTED_ENV: "1", "PYTHONPATH": os.pathsep.join(paths)}
    if root is not None:
        (root / "prometheus").mkdir(parents=True, exist_ok=True)
        env.update({ROOT_ENV: str(root), "PROMETHEUS_MULTIPROC_DIR": str(root / "prometheus")})
    return env
