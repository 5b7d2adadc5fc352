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
"""

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+triton-swa-test-stub"
IS_STUB = True


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
