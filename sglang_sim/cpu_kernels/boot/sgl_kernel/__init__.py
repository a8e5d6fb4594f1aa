"""``import sgl_kernel`` inside an SGLang engine process on CPU: the CPU ops of ``dspark_ci.sglang_sim.cpu_kernels``
(torch, attention's loops compiled), registered as ``torch.ops.sgl_kernel.*``, and the Python names SGLang imports
from here."""

import torch
from dspark_ci.sglang_sim.cpu_kernels import registry

registry.register()

__version__ = "0.0.0+dspark.cpu"


def _python_name(name):
    """``sgl_kernel.<name>``: calls the registered op (keywords as SGLang passes them, e.g. ``retrive_index=``)."""

    def call(*args, **kwargs):
        return getattr(torch.ops.sgl_kernel, name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


for _name in registry.OPS:
    globals()[_name] = _python_name(_name)
del _name
