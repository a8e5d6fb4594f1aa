"""``PYTHON sglang_sim/cpu_engine/__main__.py [the cell's launch_server flags]`` with the SGLang venv's Python
(``.ci/sglang-engine.sh``): SGLang's real ``launch_server`` on this CPU (``dspark_ci.sglang_sim.cpu_engine``).

Refuses (exit 2) a speculative algorithm without a CPU branch (or without a draft for the model), and a real model
not installed (``real_model.py``); otherwise writes or converts the model's weights once (cached), then
replaces itself with ``python -m sglang.launch_server`` so that the process the launcher started, signals and
watches is SGLang's own."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def _kernel_ops(boot: Path) -> list[str]:
    """The ops the CPU kernels register as torch.ops.sgl_kernel.* (importing them is what registers them)."""
    if not (boot / "sgl_kernel").is_dir():
        return []
    sys.path.insert(0, str(boot))
    import sgl_kernel  # noqa: F401
    import torch

    return [name for name in dir(torch.ops.sgl_kernel) if not name.startswith("_")]


def main() -> int:
    # Run by path from a Python without dspark-ci: the folder holding the dspark_ci package (a clone's top, or the
    # site-packages of a wheel) is the nearest one above this file that has it.
    sys.path.insert(0, str(next(p for p in Path(__file__).resolve().parents
                                if (p / "dspark_ci" / "__init__.py").is_file())))
    from dspark_ci.sglang_sim import cpu_engine
    from dspark_ci.sglang_sim.cpu_engine import checkpoint, real_model

    argv = sys.argv[1:]
    reason = cpu_engine.refusal(argv)
    if reason:
        print(f"ValueError: {reason}", file=sys.stderr, flush=True)
        return 2
    cache = cpu_engine.cache_root(os.environ)
    if cpu_engine.engine_model(argv).checkpoint == "gguf":
        try:
            target, draft = real_model.ensure(cache)
        except real_model.ModelMissing as err:
            print(f"ValueError: {err}", file=sys.stderr, flush=True)
            return 2
    else:
        target = checkpoint.ensure(cpu_engine.MODEL_DIR / "target", cache)
        draft = checkpoint.ensure(cpu_engine.MODEL_DIR / "draft", cache, target_source=cpu_engine.MODEL_DIR / "target")
    command = [sys.executable, "-m", "sglang.launch_server",
               *cpu_engine.engine_argv(argv, target, draft, _kernel_ops(cpu_engine.KERNELS_BOOT))]
    env = cpu_engine.engine_env(os.environ, argv)
    env[cpu_engine.ORIGINAL_ARGV_ENV] = json.dumps(argv)
    os.chdir(cpu_engine.workdir(argv, target))
    print(f"[dspark-ci sglang-engine] in {os.getcwd()}: {' '.join(command)}", file=sys.stderr, flush=True)
    os.execve(sys.executable, command, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
