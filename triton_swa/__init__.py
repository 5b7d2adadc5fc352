"""triton-swa: paged sliding-window attention for LLM serving, in Python and Triton only.

Glossary (SPEC.md is the contract):

- ``window_left = W``: a query at position ``p`` sees keys ``[max(0, p - W), p]``; ``-1`` is full
  attention. Hugging Face's ``sliding_window = S`` is ``W = S - 1``.
- ``req_to_token`` int32 `[num_reqs + 1, max_context_len]`: full-pool slot of each (request, token);
  row 0 is padding.
- ``full_to_swa_index_mapping`` int64 `[full_slots + 1]`: full slot -> SWA slot, 0 = none, last = -1.
- KV buffers `[slots, H, D]`, slot 0 a dummy; with ``page_size`` P also `[slots // P, P, H, D]`.
- ``kv_indptr`` `[B + 1]` / ``kv_indices``: a CSR list of the window's slots, oldest first.
- Shapes: ``q [B or T, HQ, D]``, ``k/v [slots, H, D or Dv]``, ``HQ % H == 0`` (GQA).

On a machine without a GPU, importing triton_swa turns on Triton's interpreter
(``TRITON_INTERPRET=1``, unless the variable is already set) so that the kernels run on the CPU; it
must happen before triton is first imported, which is why it sits here.
"""

import os as _os

import torch as _torch

if "TRITON_INTERPRET" not in _os.environ and not _torch.cuda.is_available() and "triton" not in __import__("sys").modules:
    _os.environ["TRITON_INTERPRET"] = "1"

from .mem import (  # noqa: E402
    BaseSWAKVPool,
    MHATokenToKVPool,
    PagedTokenToKVPoolAllocator,
    ReqToTokenPool,
    SWAKVPool,
    SWATokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
    evict_swa_window,
)
from .ops.decode import swa_decode  # noqa: E402
from .ops.extend import swa_extend  # noqa: E402
from .ops.indices import (  # noqa: E402
    WindowIndices,
    WindowPageTable,
    build_window_indices,
    build_window_page_table,
    max_window_len,
    max_window_pages,
    store_kv,
    swa_out_cache_loc,
    window_index_count,
)

__version__ = "0.1.0"

__all__ = [
    "BaseSWAKVPool",
    "MHATokenToKVPool",
    "PagedTokenToKVPoolAllocator",
    "ReqToTokenPool",
    "SWAKVPool",
    "SWATokenToKVPoolAllocator",
    "TokenToKVPoolAllocator",
    "evict_swa_window",
    "swa_decode",
    "swa_extend",
    "WindowIndices",
    "WindowPageTable",
    "build_window_indices",
    "build_window_page_table",
    "max_window_len",
    "max_window_pages",
    "store_kv",
    "swa_out_cache_loc",
    "window_index_count",
]
