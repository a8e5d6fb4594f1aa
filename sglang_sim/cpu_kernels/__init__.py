"""SGLang's ``sgl_kernel`` CPU operators played in torch (attention's inner loops compiled once from
``attention.cpp``), so SGLang's real engine (scheduler, model runner, KV pool, NGRAM and EAGLE workers,
``IntelAMXAttnBackend``) runs on a CPU without AMX and without a CPU ``sgl-kernel`` wheel (none exists on
PyPI). See README.md here for what each op does and where this departs from real hardware.

The ops import torch and register themselves as ``torch.ops.sgl_kernel.*`` (``registry.py``); they load only inside
an SGLang server process, through ``boot/`` leading its PYTHONPATH (``boot/sgl_kernel`` answers ``import
sgl_kernel``; ``boot/sitecustomize.py`` prepares the interpreter). This module itself imports nothing heavy."""

from __future__ import annotations

from pathlib import Path

BOOT_DIR = Path(__file__).resolve().parent / "boot"
