"""Test-only stand-in for ``sgl_kernel`` for the real-engine tier: ``sglang.Engine`` on a CPU.

SGLang 0.5.23 imports names from ``sgl_kernel`` (its compiled kernel wheel) at module level in about
ten modules it reaches while starting an engine. On a CPU with ``SGLANG_USE_CPU_ENGINE=1`` none of
those kernels is called: ``cpu_has_amx_support()`` asks ``torch.ops.sgl_kernel`` for an op this stub
never registers, so layers take their ``forward_native`` paths. Hence:

- ``import sgl_kernel`` and ``from sgl_kernel[.sub] import name`` succeed for any name;
- calling (or indexing into) such a name raises ``RuntimeError`` naming it, so an unexpected use is
  loud rather than silently wrong;
- ``sgl_kernel.scalar_type`` raises ``ImportError``: SGLang's quantization utilities then take their
  own fallback instead of binding placeholder scalar types.

It reaches the engine's subprocesses through ``PYTHONPATH`` (triton_swa.testing.sglang_engine puts
``tests/engine/stubs`` there); nothing else in the repository imports it.
"""

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+triton-swa-engine-stub"
IS_STUB = True
_MISSING_SUBMODULES = ("scalar_type",)


class _Placeholder:
    """A name SGLang binds at import time; any use needs the real sgl_kernel."""

    __slots__ = ("_name",)

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} was called, but sgl_kernel is the engine tier's stub (tests/engine/stubs)")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self._name}.{attr}")

    def __repr__(self):
        return f"<sgl_kernel stub {self._name}>"


def _getattr_for(module_name: str):
    def __getattr__(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{module_name}.{attr}")

    return __getattr__


class _StubSubmodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``sgl_kernel.<anything>`` is a module of placeholders, except the ones SGLang must miss."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(__name__ + "."):
            return None
        if fullname.split(".", 1)[1].split(".")[0] in _MISSING_SUBMODULES:
            raise ImportError(f"{fullname} is not provided by the sgl_kernel stub", name=fullname)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _getattr_for(spec.name)
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _StubSubmodules())
__getattr__ = _getattr_for(__name__)
