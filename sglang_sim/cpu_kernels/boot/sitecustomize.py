"""Imported first by every Python process of an SGLang engine launch whose PYTHONPATH leads with this directory
(SGLang's spawned scheduler, detokenizer and TP ranks inherit the environment, not our sys.path):

- the torchvision stub of ``ground/sglang/resolve_child.py``: no torchvision build loads beside torch 2.13's CPU
  build, and transformers imports ``torchvision.io`` (nothing the engine runs calls it);
- the platform told it has AMX, for two paths only, each the moment its module is first imported (in each process,
  so argument re-validation in a child agrees):
  - the attention backend: without AMX SGLang swaps ``intel_amx`` for ``torch_native``, which has no speculative
    verify path (SGLang's own platform override, ``sglang.srt.runtime_context``);
  - the linear layers: their weights are packed once and multiplied by ``sgl_kernel.weight_packed_linear``
    (``layers/quantization/unquant.py``), SGLang's CPU GEMM path, which ../linear.py plays in float32.
  The other layers keep their native paths: they ask ``cpu_has_amx_support()``, which stays False here (it needs
  ``torch.cpu._is_amx_tile_supported()``); see ../README.md."""

import importlib.abc
import importlib.machinery
import sys

from dspark_ci.ground.sglang.resolve_child import _StubFinder


def _attention_backend(module):
    module.override_platform(has_amx=True).install()


def _packed_linear_weights(module):
    module._is_cpu_amx_available = True  # read by UnquantizedLinearMethod.process_weights_after_loading


def _packing_allowed(module):
    module.cpu_has_amx_support = lambda: True  # asked again by _amx_process_weight_after_loading


# SGLang module -> what is done to it right after it first runs
AFTER_IMPORT = {"sglang.srt.runtime_context": _attention_backend,
                "sglang.srt.layers.quantization.unquant": _packed_linear_weights,
                "sglang.srt.layers.amx_utils": _packing_allowed}


class _TellAmxOnImport(importlib.abc.MetaPathFinder):
    """Finds the modules of ``AFTER_IMPORT`` as the path finder does, and changes each after it runs."""

    def find_spec(self, fullname, path=None, target=None):
        change = AFTER_IMPORT.get(fullname)
        if change is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            change(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _StubFinder())
sys.meta_path.insert(0, _TellAmxOnImport())
