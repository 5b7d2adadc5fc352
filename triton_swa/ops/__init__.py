"""Triton kernels, one module per op."""

from .decode import swa_decode
from .extend import swa_extend
from .indices import (
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

__all__ = [
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
