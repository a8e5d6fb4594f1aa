"""The compiled part of the attention ops: ``attention.cpp``, built once per source into the engine's cache.

Written in Python, per-query attention cost 36-64 % of an engine step (py-spy) in ~20 torch calls a query; the same
loops compiled take a few microseconds. One build serves every process of every launch: torch's extension builder
(ninja, g++) writes it under ``<cache>/kernels/<name>/`` and holds a lock while it does, so ranks that boot
together build it once. ``.ci/sglang-engine.sh`` builds it ahead (``PYTHON sglang_sim/cpu_kernels/native.py``), so a
boot finds it ready; a boot without it builds it first (about a minute on two cores).

``-ffp-contract=off``: no multiply-add fused into one rounding, whatever the CPU offers, so the bits are the
source's on every machine."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).resolve().with_name("attention.cpp")
FLAGS = ("-O3", "-ffp-contract=off")
# the module's name carries the source and flags: an edit builds a new module beside the old
NAME = "dspark_attention_" + hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()).hexdigest()[:12]


def build_dir(environ: Mapping[str, str]) -> Path:
    from dspark_ci.sglang_sim.cpu_engine import cache_root

    return cache_root(environ) / "kernels" / NAME


@cache
def module() -> ModuleType:
    """The built module (its ``attend``), built first when the cache has none."""
    import torch  # noqa: F401 - the module links against libtorch, which importing torch loads

    directory = build_dir(os.environ)
    built = directory / f"{NAME}.so"
    if built.is_file():  # torch's builder would import half of torch.utils to find there is nothing to do
        loader = importlib.machinery.ExtensionFileLoader(NAME, str(built))
        spec = importlib.util.spec_from_file_location(NAME, built, loader=loader)
        assert spec is not None
        loaded = importlib.util.module_from_spec(spec)
        loader.exec_module(loaded)
        return loaded
    from torch.utils.cpp_extension import load

    directory.mkdir(parents=True, exist_ok=True)
    # the venv's ninja (.ci/sglang-engine.txt) is on no PATH when its python is run by path
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return load(name=NAME, sources=[str(SOURCE)], extra_cflags=list(FLAGS), build_directory=str(directory))


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path from a Python without this tree
    print(Path(module().__file__ or build_dir(os.environ)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
