"""Imported by every Python process of a ``--server sglang-frontend`` launch (this directory leads PYTHONPATH,
set by ``dspark_ci.sglang_sim.frontend.__main__``), SGLang's spawned scheduler and detokenizer included, before anything
imports sglang: the torchvision stub of ``ground/sglang/resolve_child.py`` (no torchvision build loads beside
torch 2.13's CPU build; transformers imports ``torchvision.io``, nothing the front end runs calls it)."""

import sys

from dspark_ci.ground.sglang.resolve_child import _StubFinder

sys.meta_path.insert(0, _StubFinder())
