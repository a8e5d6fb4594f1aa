"""Imported first by every Python process of an SGLang engine launch whose PYTHONPATH leads with this directory
(SGLang's spawned scheduler, detokenizer and TP ranks inherit the environment, not our sys.path):

- the torchvision stub of ``ground/sglang/resolve_child.py``: no torchvision build loads beside torch 2.13's CPU
  build, and transformers imports ``torchvision.io`` (nothing the engine runs calls it);
- the platform told it has AMX, for the attention backend's sake only. Without AMX SGLang swaps ``intel_amx`` for
  ``torch_native``, which has no speculative verify path. SGLang's own platform override is installed the moment
  ``sglang.srt.runtime_context`` is first imported, in each process, so argument re-validation in a child agrees.
  The layers keep their native paths: they ask ``cpu_has_amx_support()``, which stays False here (it needs
  ``torch.cpu._is_amx_tile_supported()``); see ../README.md."""

import importlib.abc
import importlib.machinery
import sys

from dspark_ci.ground.sglang.resolve_child import _StubFinder

_PLATFORM_MODULE = "sglang.srt.runtime_context"


class _TellAmxOnImport(importlib.abc.MetaPathFinder):
    """Finds ``sglang.srt.runtime_context`` as the path finder does, and installs the override after it runs."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _PLATFORM_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.override_platform(has_amx=True).install()

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _StubFinder())
sys.meta_path.insert(0, _TellAmxOnImport())
