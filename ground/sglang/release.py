"""Every fact of the SGLang release under test that more than one stage needs, in one place.

A version bump touches ``ground/sglang/`` only: this file, and a new ``flags-<version>.json`` snapshot
(``python -m dspark_ci.ground.sglang.extract_flags``). Sources are named per fact so they can be checked again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

# The release the flag snapshot, the admission messages in matrices and the simulator were taken from.
DEFAULT_VERSION = "0.5.23"

# How every node starts SGLang (docs/basic_usage, multi-node guide); launchers may swap it for the simulator.
SGLANG_ENTRYPOINT = ("python3", "-m", "sglang.launch_server")

# SpeculativeAlgorithm members and reserved aliases in sglang/srt/speculative/spec_info.py.
SPECULATIVE_ALGORITHMS = ("DSPARK", "DFLASH", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM",
                          "FROZEN_KV_MTP", "UNO")

# The algorithms that take a block size, and the flag carrying it (arg_groups/fields/spec.py).
BLOCK_SIZE_FLAGS: Mapping[str, str] = MappingProxyType({
    "DSPARK": "--speculative-dspark-block-size",  # gamma; num_draft_tokens = gamma + 1
    "DFLASH": "--speculative-dflash-block-size",
})

# The speculative algorithms with a CPU branch in this release (speculative_hook.py: _handle_ngram "supports CUDA,
# CPU, or XPU"; the EAGLE family's draft workers). DSPARK, DFLASH, UNO and FROZEN_KV_MTP have none.
CPU_SPECULATIVE_ALGORITHMS = ("NGRAM", "STANDALONE", "EAGLE", "EAGLE3")

# Devices launch_server's --device accepts that a matrix may name (arg_groups/fields/device.py).
DEVICES = ("cuda", "npu", "xpu", "hpu", "cpu", "mps", "musa")

# Released images per device (lmsysorg/sglang on Docker Hub; Ascend's on quay.io); a matrix's `image:` overrides.
DEVICE_IMAGES: Mapping[str, str] = MappingProxyType({
    "cuda": f"lmsysorg/sglang:v{DEFAULT_VERSION}",
    "npu": f"quay.io/ascend/sglang:v{DEFAULT_VERSION}-cann8.5.0-a3",
})

# Whose accelerator a cell runs on. SGLang says `--device cuda` on NVIDIA and on AMD (ROCm) alike, so the cell's
# hardware decides: AMD Instinct names (mi300x, mi325x, mi355, ...) are ROCm; everything else follows the device.
NVIDIA, AMD, ASCEND = "nvidia", "amd", "ascend"
_AMD_HARDWARE = re.compile(r"^mi\d", re.IGNORECASE)
_DEVICE_ACCELERATOR: Mapping[str, str] = MappingProxyType({"cuda": NVIDIA, "npu": ASCEND})

# SGLang's ROCm release images, one per GPU family (docker/rocm.Dockerfile: GPU_ARCH gfx942 is tagged
# -rocm700-mi30x, gfx950 -rocm700-mi35x; docs/platforms/amd_gpu.md runs them with /dev/kfd, /dev/dri, video).
ROCM_IMAGES: Mapping[str, str] = MappingProxyType({
    **{name: f"lmsysorg/sglang:v{DEFAULT_VERSION}-rocm700-mi30x" for name in ("mi300", "mi300x", "mi308x", "mi325",
                                                                            "mi325x")},
    **{name: f"lmsysorg/sglang:v{DEFAULT_VERSION}-rocm700-mi35x" for name in ("mi350", "mi350x", "mi355", "mi355x")},
})


def accelerator(device: str, hardware: str | None) -> str:
    """``nvidia``, ``amd``, ``ascend``, or the device itself (xpu, cpu, ...)."""
    if device == "cuda" and hardware and _AMD_HARDWARE.match(hardware):
        return AMD
    return _DEVICE_ACCELERATOR.get(device, device)


def release_image(device: str, hardware: str | None) -> str | None:
    """SGLang's released image for this device and hardware; None when the release publishes none for it."""
    if accelerator(device, hardware) == AMD:
        return ROCM_IMAGES.get((hardware or "").lower())
    return DEVICE_IMAGES.get(device)

# SGLang prints the exception that stopped it as "<Type>: <message>" on one line; these are the ones it dies
# of (admission ValueErrors, the CP-v2 AssertionError, NotImplementedError for unsupported combinations,
# NCCL RuntimeErrors, OOM, missing kernels) plus OSError for a port already in use.
SGLANG_FATAL_ERRORS = ("ValueError", "AssertionError", "NotImplementedError", "RuntimeError", "TypeError", "KeyError",
                       "ModuleNotFoundError", "ImportError", "torch.OutOfMemoryError", "OutOfMemoryError", "OSError")
_ERROR_LINE = re.compile(r"^\s*(?:[\w.]+\.)?(" + "|".join(map(re.escape, SGLANG_FATAL_ERRORS)) + r")\b:?\s*(.*)$")


# What a rank prints when it dies because ANOTHER rank died (NCCL/gloo noticing a lost peer, the multi-node
# rendezvous losing a node): a consequence, never the culprit, when another rank died of its own error.
PEER_LOSS_PATTERNS = re.compile(
    r"NCCL communicator was aborted|lost node rank|remote process exited|Connection closed by (remote )?peer|"
    r"Connection reset by peer|ProcessGroupNCCL.*(watchdog|timeout)|NCCL error.*(unhandled system error|remote)",
    re.IGNORECASE)


def is_peer_loss(error_line: str | None) -> bool:
    """True when an error line says the rank died of losing another rank."""
    return bool(error_line and PEER_LOSS_PATTERNS.search(error_line))


def sglang_error_line(log_lines: list[str]) -> str | None:
    """The last ``SomeError: message`` line of a log, which is what SGLang died of."""
    for line in reversed(log_lines):
        if _ERROR_LINE.match(line):
            return line.strip()
    return None
