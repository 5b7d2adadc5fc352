"""triton-swa: paged sliding-window attention for LLM serving, in Python and Triton only.

Glossary (docs/contract.md is the contract):

- ``window_left = W``: a query at position ``p`` sees keys ``[max(0, p - W), p]``; ``-1`` is full
  attention. Hugging Face's ``sliding_window = S`` is ``W = S - 1``.
- ``req_to_token`` int32 `[num_reqs + 1, max_context_len]`: full-pool slot of each (request, token);
  row 0 is padding.
- ``full_to_swa_index_mapping`` int64 `[full_slots + 1]`: full slot -> SWA slot, 0 = none, last = -1.
- KV buffers `[slots, H, D]`, slot 0 a dummy; with ``page_size`` P also `[slots // P, P, H, D]`.
- ``kv_indptr`` `[B + 1]` / ``kv_indices``: a CSR list of the window's slots, oldest first.
- Shapes: ``q [B or T, HQ, D]``, ``k/v [slots, H, D or Dv]``, ``HQ % H == 0`` (GQA).

Importing triton_swa changes no environment variable, queries no device and imports neither triton
nor a submodule: each name below loads its module on first use. To run the kernels on a CPU through
Triton's interpreter, set ``TRITON_INTERPRET=1`` before triton is first imported (in the shell, or
with :func:`triton_swa.testing.use_interpreter` first thing in a script).
"""

from __future__ import annotations

import importlib

__version__ = "0.2.0"

# Public name -> the module that defines it.
_EXPORTS = {
    "BaseSWAKVPool": ".mem",
    "MHATokenToKVPool": ".mem",
    "PagedTokenToKVPoolAllocator": ".mem",
    "ReqToTokenPool": ".mem",
    "SWAKVPool": ".mem",
    "SWATokenToKVPoolAllocator": ".mem",
    "TokenToKVPoolAllocator": ".mem",
    "evict_swa_window": ".mem",
    "DecodePlan": ".ops.decode",
    "swa_decode": ".ops.decode",
    "swa_decode_plan": ".ops.decode",
    "ExtendPlan": ".ops.extend",
    "swa_extend": ".ops.extend",
    "swa_extend_plan": ".ops.extend",
    "KVStorePlan": ".ops.kv_store",
    "store_kv": ".ops.kv_store",
    "store_kv_plan": ".ops.kv_store",
    "WindowIndices": ".ops.indices",
    "WindowPageTable": ".ops.indices",
    "build_window_indices": ".ops.indices",
    "build_window_page_table": ".ops.indices",
    "max_window_len": ".ops.indices",
    "max_window_pages": ".ops.indices",
    "swa_out_cache_loc": ".ops.indices",
    "window_index_count": ".ops.indices",
    "window_page_table_from_block_table": ".ops.indices",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'triton_swa' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
