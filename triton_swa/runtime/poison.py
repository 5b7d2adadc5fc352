"""Poisoned allocations for tests: every buffer an op allocates can start as NaN.

With ``TRITON_SWA_POISON=1`` in the environment (read once, at import, as the guard reads
``TRITON_SWA_DEBUG``: reading it on every allocation cost about 4 us per eager decode call on the
H200's host; ``refresh_poison_env()`` re-reads it; ``tests/conftest.py`` turns it on for the whole
suite), the buffers the
launchers allocate themselves start filled with a value no kernel writes: NaN for float buffers
(outputs, split-KV partials and their log-sum-exps), ``INT_POISON`` for integer ones (window
indices, page tables, SWA slots). A split, a tile or a row that a kernel forgets to write then shows
as NaN or as a wild index in the result, instead of whatever ``torch.empty`` happened to return.

What the ops promise to write (so what may legitimately stay poisoned):

- ``swa_decode``: every element of its output (an empty window gives zeros).
- ``swa_extend``: the rows of tokens inside ``[qo_indptr[0], qo_indptr[B])``; rows outside (CUDA-graph
  padding past the last request) are never written, so with ``out=None`` they hold NaN here and
  arbitrary values otherwise. Split partials of those rows are neither written nor read.
- ``build_window_indices``: ``kv_indptr``, ``window_starts`` and ``kv_indices[:kv_indptr[B]]``
  (entries past the total are untouched); ``build_window_page_table``, ``swa_out_cache_loc``: every
  entry.

Buffers whose contents matter before the kernel runs (the fused merge's zeroed counters) are never
poisoned. Off by default: a plain ``torch.empty`` then, at no cost beyond reading the variable.
"""

from __future__ import annotations

import os

import torch

__all__ = ["INT_POISON", "empty", "poison_enabled", "refresh_poison_env"]

# What int32 buffers start as (other integer dtypes: their minimum): no slot, page, offset or
# position is ever this negative.
INT_POISON = -(2**31)


def _read_env() -> bool:
    return os.environ.get("TRITON_SWA_POISON") == "1"


_ENABLED = _read_env()


def refresh_poison_env() -> bool:
    """Re-read ``TRITON_SWA_POISON`` (it is cached at import); returns the new setting."""
    global _ENABLED
    _ENABLED = _read_env()
    return _ENABLED


def poison_enabled() -> bool:
    """Whether poisoning is on (``TRITON_SWA_POISON=1`` at import or at the last refresh)."""
    return _ENABLED


def empty(*shape, dtype: torch.dtype, device) -> torch.Tensor:
    """``torch.empty``, filled with NaN (floats) or ``INT_POISON`` (integers) when poisoning is on."""
    x = torch.empty(*shape, dtype=dtype, device=device)
    if _ENABLED:
        x.fill_(float("nan") if x.dtype.is_floating_point else torch.iinfo(x.dtype).min)
    return x
