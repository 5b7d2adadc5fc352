"""The window indices the attention kernels read, in either form, for the checks of ``swa_decode``
and ``swa_extend``: a CSR slot list (``kv_indptr``, ``kv_indices``) or a page table with its
``window_starts``. Every slot or page read lies in ``[1, rows)`` (or ``[1, num_pages)``) and appears
once per window; a window of exactly one dummy entry (slot 0 or page 0) is a CUDA-graph padding entry
and passes."""

from __future__ import annotations

import torch

from .common import _check_indptr, _defer, _duplicates, _fail, _first, _flat, _host, _tensor


def _slot_problem(slot: int, rows: int) -> str:
    if slot == 0:
        return "is the dummy slot 0 (an evicted or unmapped SWA slot translates to 0)"
    if slot < 0:
        return "is negative"
    return f"is past the buffer's {rows} rows"


def _check_slots(op: str, slots, req, pos, at, rows: int, counts, *, pos_is_offset: bool = False) -> None:
    """Every slot in ``[1, rows)``; a window of one dummy slot is a CUDA-graph padding entry."""
    bad = (slots < 1) | (slots >= rows)
    if bad.any():
        bad &= ~((slots == 0) & (counts[req] == 1))
    i = _first(bad)
    if i is not None:
        b, s = int(req[i]), int(slots[i])
        where = f"window entry {int(pos[i])}" if pos_is_offset else f"position {int(pos[i])}"
        _fail(op, f"request {b} (batch index), {where}: slot {s} (kv_indices[{int(at[i])}]) {_slot_problem(s, rows)}")


def _check_csr(op: str, kv_indptr, kv_indices, rows: int, B: int, *, need=None, prefix=None, max_count=None) -> None:
    """A CSR window list. Decode (``need`` None) reads every entry. Extend reads the last ``need[b]``
    entries of request ``b``'s list, which ends at position ``prefix[b] - 1``: the list must hold at
    least those and no more than the prefix has; earlier entries are never read, so not checked."""
    ptr = _host("kv_indptr", kv_indptr)
    if ptr.numel() != B + 1:
        _defer(f"kv_indptr must have B + 1 = {B + 1} entries, got {ptr.numel()}")
    _tensor("kv_indices", kv_indices, 1)
    counts = _check_indptr(op, "kv_indptr", ptr, kv_indices.numel(), what="kv_indices")
    if need is not None:
        b = _first(counts < need)
        if b is not None:
            _fail(
                op,
                f"request {b} (batch index): its cached prefix list holds {int(counts[b])} keys in kv_indices, "
                f"fewer than the window's {int(need[b])} (positions [{int(prefix[b] - need[b])}, {int(prefix[b])}))",
            )
        b = _first(counts > prefix)
        if b is not None:
            _fail(
                op,
                f"request {b} (batch index): its cached prefix list holds {int(counts[b])} keys in kv_indices, more "
                f"than its {int(prefix[b])} prefix tokens (a list that ends at position prefix_lens - 1)",
            )
    if max_count is not None:
        b = _first(counts > max_count)
        if b is not None:
            _fail(op, f"request {b} (batch index): its window holds {int(counts[b])} keys, more than max_window={max_count}")
    read = counts if need is None else need
    req, off = _flat(read)
    # entry index in kv_indices: decode reads from each list's start, extend its last `need` entries
    at = ptr[:-1][req] + off if need is None else ptr[1:][req] - read[req] + off
    slots = kv_indices.detach()[at.to(kv_indices.device)].to("cpu", torch.int64)
    pos = off if need is None else prefix[req] - read[req] + off
    _check_slots(op, slots, req, pos, at, rows, read, pos_is_offset=need is None)
    where = "window entry" if need is None else "position"
    _duplicates(
        op,
        req * rows + slots,
        off,
        lambda i: f"request {int(req[i])} (batch index) {where} {int(pos[i])} (slot {int(slots[i])}, kv_indices[{int(at[i])}])",
    )


def _check_page_table(
    op: str,
    page_table,
    starts: torch.Tensor,
    ends: torch.Tensor,
    page_size: int,
    rows: int,
    *,
    ends_name: str,
    read_from: torch.Tensor | None = None,
) -> None:
    """A page table whose row ``b`` starts at the page of position ``starts[b]``: the columns of every
    position the kernel reads, ``[read_from, ends)`` (default ``[starts, ends)``), exist and hold pages
    in ``[1, num_pages)``."""
    _tensor("page_table", page_table, 2)
    B, width = page_table.shape
    if B != starts.numel() or (width > 1 and page_table.stride(1) != 1) or rows % page_size:
        _defer("page_table rows, its strides or the buffer's whole pages are wrong")
    b = _first(starts < 0)
    if b is not None:
        _fail(op, f"request {b} (batch index): window_starts[{b}] = {int(starts[b])} is negative")
    read_from = starts if read_from is None else read_from
    b = _first(read_from < starts)
    if b is not None:
        _fail(
            op,
            f"request {b} (batch index): window_starts[{b}] = {int(starts[b])} is past the first position the "
            f"window reads, {int(read_from[b])}",
        )
    b = _first(ends < read_from)
    if b is not None:
        _fail(op, f"request {b} (batch index): window_starts[{b}] = {int(read_from[b])} is past {ends_name}[{b}] = {int(ends[b])}")
    base = starts // page_size
    lo = read_from // page_size - base
    pages = torch.where(ends > read_from, (ends - 1) // page_size + 1 - base, torch.zeros_like(starts))
    b = _first(pages > width)
    if b is not None:
        _fail(
            op,
            f"request {b} (batch index): window [{int(read_from[b])}, {int(ends[b])}) needs {int(pages[b])} "
            f"page_table columns from window_starts {int(starts[b])}, more than the page_table's {width}",
        )
    used = torch.where(ends > read_from, pages - lo, torch.zeros_like(pages))
    req, off = _flat(used)
    j = lo[req] + off
    entries = page_table.detach()[req.to(page_table.device), j.to(page_table.device)].to("cpu", torch.int64)
    num_pages = rows // page_size
    bad = (entries < 1) | (entries >= num_pages)
    if bad.any():
        # a padding entry: a one-token window on the dummy page
        bad &= ~((entries == 0) & ((ends - read_from)[req] == 1))
    i = _first(bad)
    if i is not None:
        b, p = int(req[i]), int(entries[i])
        pos = max(int(read_from[b]), (int(base[b]) + int(j[i])) * page_size)
        slot = p * page_size + pos % page_size
        why = (
            "is the dummy page 0 (an evicted or unmapped SWA page translates to 0)"
            if p == 0
            else "is negative"
            if p < 0
            else f"is past the buffer's {num_pages} pages"
        )
        _fail(op, f"request {b} (batch index), position {pos}: slot {slot} on page {p} (page_table[{b}, {int(j[i])}]) {why}")
    _duplicates(
        op,
        req * num_pages + entries,
        j,
        lambda i: f"request {int(req[i])} (batch index) page_table[{int(req[i])}, {int(j[i])}] (page {int(entries[i])})",
    )
