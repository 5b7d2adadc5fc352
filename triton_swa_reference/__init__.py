"""triton-swa's reference path (imported as ``triton_swa_reference``): plain PyTorch, no Triton.

It defines what every op of triton-swa means; every kernel is checked against it, and users can
check their own kernels against it too. Everything computes in float64 for attention and exactly
for indices.
"""

from .attention import attention, decode_attention, decode_attention_paged, dequantize, extend_attention
from .indices import (
    decode_window_indices,
    extend_window_indices,
    store_kv,
    swa_out_cache_loc,
    translate_full_to_swa,
    window_index_list,
    window_page_table,
)
from .paged import gather_kv, page_table_slots
from .policy import has_swa_sub_pool, resolve_swa_kv_pool
from .window import check_window_left, decode_window_start, extend_window_start, window_mask

__all__ = [
    "attention",
    "check_window_left",
    "decode_attention",
    "decode_attention_paged",
    "decode_window_indices",
    "decode_window_start",
    "dequantize",
    "extend_attention",
    "extend_window_indices",
    "extend_window_start",
    "gather_kv",
    "has_swa_sub_pool",
    "page_table_slots",
    "resolve_swa_kv_pool",
    "store_kv",
    "swa_out_cache_loc",
    "translate_full_to_swa",
    "window_index_list",
    "window_mask",
    "window_page_table",
]
