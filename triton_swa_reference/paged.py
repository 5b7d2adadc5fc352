"""Paged views: how a request's window of K/V is found in a pool.

A pool buffer is `[slots, H, D]`; with ``page_size > 1`` slot ``s = page * page_size + offset``, so
the same buffer is also `[num_pages, page_size, H, D]`. A window is given either as an index list
(one slot per token, oldest first) or as a page table row plus the window's first position.
"""

from __future__ import annotations

import torch


def gather_kv(buffer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Rows ``buffer[slots]``: `[n, H, D]` for ``n`` slots."""
    return buffer[slots.to(buffer.device).long()]


def page_table_slots(page_table_row: torch.Tensor, page_size: int, window_start: int, count: int) -> torch.Tensor:
    """Slots of ``count`` tokens from position ``window_start`` through one request's page table row.

    ``page_table_row[j]`` is the pool page holding the window's ``j``-th page, page 0 being the page of
    position ``window_start``; position ``t`` sits at offset ``t % page_size`` of its page (allocators
    keep tokens page-aligned, docs/contract.md §2).
    """
    pos = window_start + torch.arange(count)
    first_page = window_start // page_size
    pages = page_table_row.cpu().long()[pos // page_size - first_page]
    return pages * page_size + pos % page_size
