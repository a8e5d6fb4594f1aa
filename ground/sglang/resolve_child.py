"""Runs INSIDE the Python that has SGLang installed (a venv, or an image): SGLang's own argument resolution.

Standalone on purpose (standard library + sglang, nothing of ours), so ``dspark_ci.ground.sglang.resolver`` can hand it
to any interpreter or ``docker run ... python3 /dspark/resolve_child.py``. Reads
``{"cases": [{"argv": [...], "env": {...}}, ...], "resolved_fields": [...]}`` on stdin (the fields reported for
an admitted launch: ``dspark_ci.ground.sglang.settings.RESOLVED_FIELDS``, from the settings' rows); for each case it
sets exactly that SGLang environment, calls ``prepare_server_args(argv)`` then ``.resolve_once()`` (what
``launch_server`` does before it touches a GPU), and prints one JSON line:
``{"verdict": "admitted"|"rejected"|"hardware"|"environment", "error", "message", "resolved", "where"}``.
A first line ``{"sglang": VERSION, "stubs": [...]}`` says what ran.

Stubs: modules that cannot work on a CPU-only machine are replaced by empty modules, only here, and every one
is named in the first line. ``torchvision``: SGLang's config package imports ``torchvision.transforms`` at
module level (``sglang/srt/multimodal/internvl_utils.py``) and no torchvision build matches torch 2.13's CPU
build here; argument resolution never calls it.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import io
import json
import os
import sys
import traceback
import types

STUBBED = ("torchvision",)

# An exception raised while SGLang probes the machine rather than the arguments: not SGLang's verdict on
# the launch. Matched against the message and the files of the traceback.
HARDWARE_MESSAGE_MARKERS = ("torch_npu", "No accelerator", "Torch not compiled with CUDA", "NVIDIA driver",
                            "CUDA driver", "get_device_capability", "cuda.is_available", "device memory",
                            "No CUDA GPUs", "nvidia-smi", "libcuda", "compute capability")
HARDWARE_FRAME_MARKERS = ("/torch/cuda/", "/torch_npu/", "get_device_capability", "get_device_memory",
                          "get_nvgpu_memory", "get_npu_memory", "is_sm90", "is_sm100", "/pynvml", "device_properties",
                          "check_mega_moe_compat")


class _AnyMeta(type):
    """A stub class: every attribute is another stub class, every call returns a stub instance."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _any(name)


def _any(name: str) -> type:
    return _AnyMeta(name, (), {"__init__": lambda self, *a, **k: None, "__call__": lambda self, *a, **k: None,
                               "__getattr__": lambda self, attr: _any(attr)})


class _Stub(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _any(name)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Stub(spec.name)
        module.__path__ = []
        module.__version__ = "0.0"  # transformers asks; the oldest version keeps its optional paths off
        return module

    def exec_module(self, module):
        return None


def _verdict(err: BaseException) -> str:
    """"hardware" for a probe of the machine, "environment" for a module this environment lacks, else "rejected"."""
    text = f"{type(err).__name__}: {err}"
    frames = traceback.extract_tb(err.__traceback__)
    if any(m in text for m in HARDWARE_MESSAGE_MARKERS) or any(
            marker in f"{frame.filename}:{frame.name}" for frame in frames for marker in HARDWARE_FRAME_MARKERS):
        return "hardware"
    if isinstance(err, ImportError):
        return "environment"
    return "rejected"


def _where(err: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(err.__traceback__) if "/sglang/" in f.filename]
    if not frames:
        return ""
    last = frames[-1]
    return f"{last.filename.split('/sglang/', 1)[1]}:{last.lineno} ({last.name})"


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)


def resolve_one(argv: list[str], env: dict, base_env: dict, fields: list[str]) -> dict:
    from sglang.srt.server_args import prepare_server_args

    os.environ.clear()
    os.environ.update(base_env)
    os.environ.update(env)
    parse_errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(parse_errors):  # argparse prints its refusal, then exits 2
            args = prepare_server_args(argv)
        args.resolve_once()
    except SystemExit as exit_:
        lines = [line for line in parse_errors.getvalue().splitlines() if line.strip()]
        message = lines[-1] if lines else f"argparse exited {exit_.code}"
        return {"verdict": "rejected", "error": "SystemExit", "message": message, "resolved": {}, "where": "argparse"}
    except BaseException as err:  # SGLang's own verdict, whatever it raised
        if isinstance(err, KeyboardInterrupt):
            raise
        return {"verdict": _verdict(err), "error": type(err).__name__, "message": str(err), "resolved": {},
                "where": _where(err)}
    resolved_all = args.resolved_dict()
    resolved = {name: _jsonable(resolved_all.get(name)) for name in fields}
    return {"verdict": "admitted", "error": None, "message": None, "resolved": resolved, "where": ""}


def main() -> int:
    request = json.load(sys.stdin)
    out = sys.stdout
    sys.stdout = sys.stderr  # SGLang's prints and logs never mix with the JSON lines
    sys.meta_path.insert(0, _StubFinder())
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    base_env.setdefault("HF_HUB_OFFLINE", "1")  # configs come from local directories; never the network
    base_env.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import sglang
        import sglang.srt.server_args  # noqa: F401
    except BaseException as err:  # the environment cannot resolve anything: the caller says how to fix it
        print(json.dumps({"sglang": None, "import_error": f"{type(err).__name__}: {err}"}), file=out, flush=True)
        return 3
    version = getattr(sglang, "__version__", None)
    print(json.dumps({"sglang": version, "stubs": list(STUBBED), "python": sys.executable}), file=out, flush=True)
    for case in request["cases"]:
        result = resolve_one(list(case["argv"]), dict(case.get("env") or {}), base_env,
                             list(request.get("resolved_fields") or ()))
        print(json.dumps(result), file=out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
