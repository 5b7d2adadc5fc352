"""Test-only stand-in for ``sgl_kernel`` (SGLang's CUDA kernel wheel), for the SGLang tier on a GPU.

Why it exists: on a CUDA torch, SGLang 0.5.23's layer and quantization modules import names from
``sgl_kernel`` at module level (``layers/layernorm.py``, ``quantization/utils.py``, the fused-MoE
runner, ...), and ``layers/attention/triton_backend.py`` asks ``sgl_kernel.utils`` whether the GPU
supports programmatic dependent launch. None of those kernels is used by the attention paths this
project compares against (SGLang's Triton attention kernels are Triton code in the ``sglang``
wheel), and the real wheel is several hundred MiB. So every name imported from here exists, using
any of them raises, and ``sgl_kernel.utils.is_arch_support_pdl`` answers with SGLang's own JIT-side
answer to the same question (``sglang.kernels.jit.utils.is_arch_support_pdl``).

It is put on ``sys.path`` only where SGLang is installed, torch has CUDA and the real
``sgl_kernel`` does not import (``tests/integration/sglang_stubs.py``).

The GPU engine tier (``scripts/gpu.sh engine``: SGLang's own ``Engine`` on the H200, where the real
wheel is built for another torch and does not load) uses it too. There SGLang runs with
``SGLANG_FORCE_FUSED_OP_BACKEND=torch``, so its fused layers (norms, activations, rotary) take their
plain-torch ``forward_native`` paths instead of calling into this module, for every attention backend
alike. The ops such an engine still calls are implemented below, in plain torch (the list is
:data:`STOOD_IN`); any other name still raises when used.
"""

import importlib.abc
import importlib.machinery
import sys
import types

import torch

__version__ = "0.0.0+triton-swa-test-stub"
IS_STUB = True
# the ops implemented here (the GPU engine tier's stand-ins), each the same for every attention backend
STOOD_IN = ("weak_ref_tensor",)


def weak_ref_tensor(tensor):
    """SGLang's CUDA-graph runners keep graph outputs through ``weak_ref_tensor`` (a tensor over the
    same memory that does not own it). This stand-in returns a view, which does keep the storage
    alive: the same values and addresses, at the cost of holding the last captured outputs."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"weak_ref_tensor: expected a torch.Tensor, got {type(tensor).__name__}")
    return tensor.view(tensor.shape)


class _Unavailable:
    """A name bound at import time whose use needs the real sgl_kernel."""

    def __init__(self, qualname):
        self._qualname = qualname

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._qualname}: sgl_kernel is a test stub here (tests/integration/stubs_cuda); install the real one")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unavailable(f"{self._qualname}.{name}")

    def __repr__(self):
        return f"<sgl_kernel stub {self._qualname}>"


def _module_getattr(module_name):
    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unavailable(f"{module_name}.{name}")

    return __getattr__


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any ``sgl_kernel.<name>`` without a file here is a module of unavailable names."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + ".") and importlib.machinery.PathFinder.find_spec(fullname, path) is None:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr(spec.name)
        return module

    def exec_module(self, module):
        pass


sys.meta_path.append(_SubmoduleFinder())
__getattr__ = _module_getattr(__name__)
