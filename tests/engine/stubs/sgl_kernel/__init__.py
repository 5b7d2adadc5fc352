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

Two ops that speculative decoding reaches on a CPU are implemented rather than stubbed, in plain
Python (each from the contract of the Triton kernel SGLang runs for the same job on GPUs):

- ``assign_req_to_token_pool_cpu`` (SGLang's ``assign_req_to_token_pool`` kernel in
  ``mem_cache/allocation.py``): request ``i`` gets ``out_cache_loc``'s next ``end[i] - start[i]``
  slot ids at ``req_to_token[req_pool_indices[i], start[i]:end[i]]``;
- ``copy_all_layer_kv_cache_cpu``, which
SGLang's KV pools call (at construction, as a warm-up, and when speculative decoding moves accepted
tokens' KV) whenever speculative decoding is on (``enable_kv_cache_copy``). Its contract, read from
the Triton kernel SGLang uses for the same copy on GPUs (``copy_all_layer_kv_cache_tiled``): for every
buffer ``i`` (``data_ptrs[i]``, a raw address, row stride ``strides[i]`` bytes), copy row ``src_loc[j]``
onto row ``tgt_loc[j]`` for each ``j``. Without it, no speculative algorithm starts on a CPU with
this stub.

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


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len=None):
    """``req_to_token[req_pool_indices[i], start[i]:end[i]] = out_cache_loc[o_i : o_i + end[i] - start[i]]``,
    ``o_i`` the lengths of the requests before ``i`` (see the module docstring)."""
    offset = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        n = int(end) - int(start)
        if n > 0:
            req_to_token[int(row), int(start) : int(end)] = out_cache_loc[offset : offset + n].to(req_to_token.dtype)
        offset += n


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """Row copies ``src_loc -> tgt_loc`` in every KV buffer (see the module docstring)."""
    import ctypes

    ptrs = [int(p) for p in data_ptrs.reshape(-1).tolist()]
    row_bytes = [int(s) for s in strides.reshape(-1).tolist()]
    pairs = list(zip(tgt_loc.reshape(-1).tolist(), src_loc.reshape(-1).tolist()))
    for ptr, stride in zip(ptrs, row_bytes):
        # all reads before any write, as the kernel's tiles do for disjoint rows
        rows = [(int(t), ctypes.string_at(ptr + int(s) * stride, stride)) for t, s in pairs if int(t) != int(s)]
        for t, data in rows:
            ctypes.memmove(ptr + t * stride, data, stride)


sys.meta_path.insert(0, _StubSubmodules())
__getattr__ = _getattr_for(__name__)
