"""Which runner a registered SGLang test needs, read from its ``register_*_ci(...)`` calls.

SGLang marks each file in ``test/registered/`` with module-level calls such as
``register_cuda_ci(est_time=120, stage="stage-c", runner_config="4-gpu-h100")`` (or the older
``suite="stage-c-test-4-gpu-h100"``). They are read here with ``ast`` only: the file is never
imported or run, because it comes from a PR that nobody has reviewed yet. For the same reason the
read is bounded: at most ``MAX_TEST_BYTES``, never through a symlink, never from anything but a
regular file (a FIFO would block), and a file the parser cannot hold (nesting too deep) is refused.
"""

from __future__ import annotations

import ast
import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

# call name -> backend; the order is the preference when a file registers for several
# (SGLang's own /rerun-test tries CUDA first, then CPU).
REGISTER_CALLS = {
    "register_cuda_ci": "cuda",
    "register_cpu_ci": "cpu",
    "register_amd_ci": "amd",
    "register_npu_ci": "npu",
}

CPU_RUNNER = "ubuntu-latest"
MAX_TEST_BYTES = 256 * 1024  # SGLang's largest registered test is ~60 kB

# SGLang's scripts/ci/runner_configs.yml: runner_config -> runner label (CUDA).
CUDA_RUNNER_CONFIGS = {
    "1-gpu-small": "1-gpu-5090",
    "1-gpu-large": "1-gpu-h100",
    "2-gpu-large": "2-gpu-h100",
    "4-gpu-b200": "4-gpu-b200",
    "4-gpu-gb300": "4-gpu-gb300",
    "4-gpu-h100": "4-gpu-h100",
    "deepep-4-gpu-h100": "4-gpu-h100",
    "8-gpu-h200": "8-gpu-h200",
    "deepep-8-gpu-h200": "8-gpu-h200",
    "8-gpu-b200": "8-gpu-b200",
    "8-gpu-b300": "8-gpu-b300",
    "8-gpu-h20": "8-gpu-h20",
}

# Legacy suite names whose runner is not spelled inside the name (SGLang's CUDA_SUITE_TO_RUNNER).
CUDA_LEGACY_SUITES = {
    "stage-a-test-small-1-gpu": "1-gpu-5090",
    "stage-a-cpu-only": CPU_RUNNER,
    "stage-b-test-small-1-gpu": "1-gpu-5090",
    "stage-b-test-large-1-gpu": "1-gpu-h100",
    "stage-b-test-large-2-gpu": "2-gpu-h100",
    "stage-c-test-deepep-4-gpu": "4-gpu-h100",
    "nightly-1-gpu": "1-gpu-h100",
    "nightly-4-gpu": "4-gpu-h100",
    "nightly-8-gpu-common": "8-gpu-h200",
}


@dataclass(frozen=True)
class LabelRule:
    unit: str  # "gpu" | "npu"
    chips: str  # regex alternation of the chips this backend's labels name
    default_chip: str


# backend -> how a runner label is spelled; the device count and chip are read from the
# runner_config or suite name, so an 8-GPU test never lands on a 1-GPU runner.
LABEL_RULES = {
    "cuda": LabelRule("gpu", "gb300|gb200|b300|b200|h200|h100|h20|5090", "h100"),
    "amd": LabelRule("gpu", r"mi\d+x?", "mi325"),
    "npu": LabelRule("npu", "a2|a3", "a3"),
}


class RegistrationError(Exception):
    """A file under test/registered that has no usable registration (message says why)."""


@dataclass(frozen=True)
class Registration:
    backend: str  # cuda | cpu | amd | npu
    est_time: float | None
    stage: str | None
    runner_config: str | None
    suite: str | None
    disabled: str | None  # reason, when the registration is switched off
    line: int

    @property
    def runner(self) -> str:
        return runner_label(self.backend, self.runner_config, self.suite)


def runner_label(backend: str, runner_config: str | None, suite: str | None) -> str:
    if backend == "cuda" and runner_config in CUDA_RUNNER_CONFIGS:
        return CUDA_RUNNER_CONFIGS[runner_config]
    if backend == "cuda" and suite in CUDA_LEGACY_SUITES:
        return CUDA_LEGACY_SUITES[suite]
    rule = LABEL_RULES.get(backend)
    if rule is None:
        return CPU_RUNNER
    name = runner_config or suite or ""
    count = re.search(rf"(\d+)-{rule.unit}", name)
    chip = re.search(rf"(?<![a-z0-9])({rule.chips})(?![a-z0-9])", name)
    return f"{count.group(1) if count else 1}-{rule.unit}-{chip.group(1) if chip else rule.default_chip}"


def read_registrations(path: Path, shown_as: str) -> list[Registration]:
    """Every module-level ``register_*_ci(...)`` call in ``path`` (``shown_as`` names it in errors)."""
    source = _bounded_read(path, shown_as)
    try:
        tree = ast.parse(source, filename=shown_as)
    except SyntaxError as err:
        raise RegistrationError(f"{shown_as}:{err.lineno}: cannot be parsed ({err.msg})") from None
    except (RecursionError, MemoryError, ValueError):
        raise RegistrationError(f"{shown_as}: cannot be parsed (nested too deeply, or holds a NUL byte)") from None
    return [_registration(stmt.value) for stmt in tree.body
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and _register_call_name(stmt.value)]


def _bounded_read(path: Path, shown_as: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        why = "is a symlink" if err.errno == errno.ELOOP else f"cannot be read ({err.strerror})"
        raise RegistrationError(f"{shown_as} {why}") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RegistrationError(f"{shown_as} is not a regular file")
        data = handle.read(MAX_TEST_BYTES + 1)
    if len(data) > MAX_TEST_BYTES:
        raise RegistrationError(f"{shown_as} is larger than {MAX_TEST_BYTES // 1024} kB: not read")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise RegistrationError(f"{shown_as} is not UTF-8 text") from None


def chosen_registration(path: Path, shown_as: str) -> Registration:
    """The registration a rerun uses: the first enabled one, in REGISTER_CALLS order."""
    registrations = read_registrations(path, shown_as)
    if not registrations:
        raise RegistrationError(f"No register_cuda_ci() / register_npu_ci() / register_amd_ci() / "
                                f"register_cpu_ci() call found in {shown_as}: this file may not be "
                                "a registered CI test")
    enabled = [r for r in registrations if r.disabled is None]
    if not enabled:
        raise RegistrationError(f"{shown_as} is registered but disabled ({registrations[0].disabled})")
    order = list(REGISTER_CALLS.values())
    return min(enabled, key=lambda r: (order.index(r.backend), r.line))


def _register_call_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in REGISTER_CALLS:
        return node.func.id
    return None


def _registration(call: ast.Call) -> Registration:
    # Positional order of SGLang's register_*_ci(est_time, suite, nightly, disabled, *, stage, runner_config).
    values = dict(zip(("est_time", "suite", "nightly", "disabled"), (_constant(a) for a in call.args), strict=False))
    values.update({kw.arg: _constant(kw.value) for kw in call.keywords if kw.arg})
    text = {key: value if isinstance(value, str) else None for key, value in values.items()}
    est_time = values.get("est_time")
    return Registration(
        backend=REGISTER_CALLS[_register_call_name(call) or ""],
        est_time=float(est_time) if isinstance(est_time, (int, float)) and 0 <= est_time < 1e7 else None,
        stage=text.get("stage"), runner_config=text.get("runner_config"), suite=text.get("suite"),
        disabled=text.get("disabled"), line=call.lineno,
    )


def _constant(node: ast.AST):
    return node.value if isinstance(node, ast.Constant) else None
