"""SGLang's own argument resolution, run in the Python (or image) that has SGLang installed.

``prepare_server_args(argv).resolve_once()`` runs every admission hook of a release without a GPU; this module
finds an environment able to run it (``locate``), hands it launches (``resolve``) and reads back SGLang's verdicts.
The code that runs there is ``resolve_child.py`` (standard library + sglang only).

Model configs: the resolver reads the model's ``config.json``. Hub ids the matrices use map to config-only stubs
shipped in ``model_configs/`` (no weights; ``MODEL_CONFIGS``); a ``--model-path`` that is a local directory (a real
checkpoint) is used as it is. Nothing reaches the network (``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dspark_ci.ground.errors import BadInput, InfraError
from dspark_ci.ground.sglang.settings import RESOLVED_FIELDS

_HERE = Path(__file__).resolve().parent
REPO = _HERE.parent.parent
CHILD = _HERE / "resolve_child.py"
MODEL_CONFIG_DIR = _HERE / "model_configs"
INSTALL_HINT = ("install the resolver environment with `bash .ci/sglang-resolver.sh` (about 80 s, 2.5 GB: "
                "sglang 0.5.23 --no-deps, CPU torch 2.13.0 and what its argument code imports) and pass its "
                "python, or set DSPARK_SGLANG_PYTHON")
DEFAULT_VENV_PYTHON = REPO / ".cache" / "sglang-venv" / "bin" / "python"
TIMEOUT_S = 60  # per launch, and once more for importing SGLang (about 8 s on 2 cores)

# Hub id (lower case) -> stub directory under model_configs/ (config.json only, shaped like the real one).
MODEL_CONFIGS = {
    "deepseek-ai/deepseek-v4-flash": "deepseek-v4-flash",
    "deepseek-ai/deepseek-v4-pro": "deepseek-v4-pro",
    "meta-llama/llama-3.1-8b-instruct": "llama-3.1-8b-instruct",
    "z-lab/llama3.1-8b-instruct-dflash-ultrachat": "llama-3.1-8b-dflash",
    # as the CPU engine serves it: heads padded to 12 and 4 KV for tp 2 and 4 (tests/test_real_model.py holds the
    # converted checkpoint's config to this copy)
    "huggingfacetb/smollm2-135m-instruct": "smollm2-135m-instruct",
}
MODEL_FLAGS = ("--model-path", "--model", "--speculative-draft-model-path")
_PLACEHOLDER = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}")


@dataclass(frozen=True)
class Resolution:
    """SGLang's verdict on one launch: admitted (with resolved values), rejected (its message), or neither:
    ``hardware`` (a probe of the machine decided, e.g. megamoe's SM90 check, torch_npu, device memory) or
    ``environment`` (the resolver environment lacks a module)."""

    verdict: str  # "admitted" | "rejected" | "hardware" | "environment"
    error: str | None = None
    message: str | None = None
    resolved: Mapping = field(default_factory=dict)
    where: str = ""

    @property
    def line(self) -> str:
        """The last line of SGLang's traceback (``ValueError: ...``)."""
        return f"{self.error}: {self.message}" if self.message else (self.error or "")


@dataclass(frozen=True)
class Resolver:
    label: str  # what the user asked for: "local", a path, an image
    command: tuple[str, ...]  # runs resolve_child.py, reading the request on stdin
    config_root: str  # where model_configs/ is seen by that command
    version: str | None = None
    stubs: tuple[str, ...] = ()
    python: str | None = None


def _probe(python: str) -> bool:
    try:
        done = subprocess.run([python, "-c", "import importlib.util as u, sys; "
                               "sys.exit(0 if u.find_spec('sglang') and u.find_spec('torch') else 1)"],
                              capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def local_candidates() -> list[str]:
    found = [os.environ.get("DSPARK_SGLANG_PYTHON", ""), str(DEFAULT_VENV_PYTHON), sys.executable]
    return [p for p in found if p]


def locate(spec: str) -> Resolver:
    """``local`` (DSPARK_SGLANG_PYTHON, the repo's .cache/sglang-venv, then this Python), an interpreter path,
    or a Docker image (run with ``docker run --rm``, no GPU, no network)."""
    if spec == "local":
        for python in local_candidates():
            if Path(python).exists() and _probe(python):
                return Resolver("local", (python, str(CHILD)), str(MODEL_CONFIG_DIR), python=python)
        raise InfraError(f"--sglang local: no Python with sglang and torch importable (tried "
                         f"{', '.join(local_candidates())}): {INSTALL_HINT}")
    path = Path(spec)
    if path.exists():
        if not _probe(str(path)):
            raise InfraError(f"--sglang {spec}: this Python cannot import sglang and torch: {INSTALL_HINT}")
        return Resolver(spec, (str(path), str(CHILD)), str(MODEL_CONFIG_DIR), python=str(path))
    if spec.startswith(("/", ".", "~")):
        raise BadInput(f"--sglang {spec}", "no such interpreter",
                       "give `local`, the path of a Python that has sglang, or a Docker image such as "
                       "lmsysorg/sglang:v0.5.23")
    docker = shutil.which("docker")
    if docker is None:
        raise InfraError(f"--sglang {spec}: the docker command is not installed: install Docker, or use a local "
                         f"Python instead: {INSTALL_HINT}")
    command = (docker, "run", "--rm", "-i", "--network", "none",
               "-v", f"{MODEL_CONFIG_DIR}:/dspark/model_configs:ro", "-v", f"{CHILD}:/dspark/resolve_child.py:ro",
               spec, "python3", "/dspark/resolve_child.py")
    return Resolver(spec, command, "/dspark/model_configs")


def config_path(model: str, config_root: str) -> str:
    """The directory whose config.json SGLang should read for ``model``."""
    if Path(model).expanduser().is_dir():
        return model
    stub = MODEL_CONFIGS.get(model.lower())
    if stub is None:
        raise BadInput(f"model {model}", "no config.json to resolve against (a Hub id without a shipped stub)",
                       f"point the matrix's model at a local checkpoint directory, or add a config-only stub to "
                       f"{MODEL_CONFIG_DIR.relative_to(REPO)}/ and dspark_ci.ground.sglang.resolver.MODEL_CONFIGS")
    return f"{config_root}/{stub}"


def prepare_argv(argv: Sequence[str], config_root: str) -> list[str]:
    """SGLang's argv with model paths pointed at configs and ``${NAME}`` placeholders made concrete."""
    out = [_PLACEHOLDER.sub("127.0.0.1", a) for a in argv]
    for i, arg in enumerate(out[:-1]):
        if arg in MODEL_FLAGS:
            out[i + 1] = config_path(out[i + 1], config_root)
    return out


def prepare_env(env: Mapping[str, str]) -> dict[str, str]:
    """The rank's environment without secrets (``${NAME}`` values are never resolved here)."""
    return {k: v for k, v in env.items() if not _PLACEHOLDER.search(v)}


def resolve(resolver: Resolver, launches: Sequence[tuple[Sequence[str], Mapping[str, str]]]) -> tuple[Resolver,
                                                                                                    list[Resolution]]:
    """SGLang's verdict on each (argv without the entrypoint, env); one process for all of them."""
    cases = [{"argv": prepare_argv(argv, resolver.config_root), "env": prepare_env(env)} for argv, env in launches]
    try:
        request = {"cases": cases, "resolved_fields": RESOLVED_FIELDS}
        done = subprocess.run(list(resolver.command), input=json.dumps(request), capture_output=True,
                              text=True, timeout=TIMEOUT_S * (len(cases) + 1))
    except subprocess.TimeoutExpired:
        raise InfraError(f"--sglang {resolver.label}: SGLang's resolver did not answer within "
                         f"{TIMEOUT_S * (len(cases) + 1)} s: check the machine's load") from None
    except OSError as err:
        raise InfraError(f"--sglang {resolver.label}: cannot run {resolver.command[0]}: {err}: {INSTALL_HINT}") \
            from None
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines or lines[0].get("sglang") is None:
        why = lines[0].get("import_error") if lines else (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise InfraError(f"--sglang {resolver.label}: SGLang's resolver could not start ({why}): {INSTALL_HINT}")
    head, results = lines[0], lines[1:]
    if len(results) != len(cases):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise InfraError(f"--sglang {resolver.label}: the resolver stopped after {len(results)} of {len(cases)} "
                         f"launches ({last})")
    described = Resolver(resolver.label, resolver.command, resolver.config_root, head.get("sglang"),
                         tuple(head.get("stubs") or ()), head.get("python") or resolver.python)
    return described, [Resolution(r["verdict"], r.get("error"), r.get("message"), r.get("resolved") or {},
                                  r.get("where") or "") for r in results]
