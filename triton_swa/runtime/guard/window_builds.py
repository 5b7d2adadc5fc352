"""The debug checks of ``build_window_indices`` and ``build_window_page_table``: the rows, lengths
and slots the index builds read.

Extend the ops' own argument checks (``triton_swa/ops/indices.py``) with the values they read:

- ``req_pool_indices`` are rows of ``req_to_token``, ``0 <= prefix_lens <= seq_lens <=
  max_context_len``;
- every token of every window has a full slot in ``[1, mapping size - 1)`` and, with a mapping, a
  live SWA slot (not 0: not evicted or unmapped); no two windows share a slot;
- page tables: slots keep their in-page offset and a page's tokens share its page;
- ``num_indices`` equals the true count, ``out`` buffers and ``max_pages`` are large enough (the ops
  would truncate silently).

CUDA-graph padding rows (``req_to_token`` row 0) are exempt. The window slot check is also the
backend step's (:mod:`~triton_swa.runtime.guard.backend_step`).
"""

from __future__ import annotations

import torch

from ..window import window_start
from .common import _check_count, _check_page_size, _check_window_left, _defer, _duplicates, _fail, _first, _flat, _host, _tensor


def _host_lens(op, name, lens, B, upper, bound):
    """``lens`` on the host, checked: ``B`` entries, entry ``b`` in ``[0, upper[b]]`` (``upper`` a tensor
    or an int; ``bound(b)`` names the upper end in the message)."""
    h = _host(name, lens)
    if h.numel() != B:
        _defer(f"{name} must have B = {B} entries, got {h.numel()}")
    b = _first((h < 0) | (h > upper))
    if b is not None:
        _fail(op, f"request {b} (batch index): {name}[{b}] = {int(h[b])} is outside [0, {bound(b)}]")
    return h


def _window_bounds(op, req_to_token, req_pool_indices, seq_lens, window_left, prefix_lens):
    """Host (rows, starts, ends) of every request's window after range checks of rows and lengths."""
    _check_window_left(window_left)
    _tensor("req_to_token", req_to_token, 2)
    R, C = req_to_token.shape
    rows = _host("req_pool_indices", req_pool_indices)
    B = rows.numel()
    b = _first((rows < 0) | (rows >= R))
    if b is not None:
        _fail(op, f"request {b} (batch index): req_pool_indices[{b}] = {int(rows[b])} is not a row of req_to_token [0, {R})")
    L = _host_lens(op, "seq_lens", seq_lens, B, C, lambda b: f"max_context_len={C}")
    ends = L
    if prefix_lens is not None:
        ends = _host_lens(op, "prefix_lens", prefix_lens, B, L, lambda b: f"seq_lens[{b}] = {int(L[b])}")
    starts = window_start(ends, window_left, extend=prefix_lens is not None)
    return rows, starts, ends


def _first_bad_slot(slots, upper, zero_why, past_why):
    """The first slot below 1 (0 is ``zero_why``) or, with ``upper``, at or past it (``past_why``):
    (its index, the slot, why), or None when all are in range."""
    i = _first(slots < 1 if upper is None else (slots < 1) | (slots >= upper))
    if i is None:
        return None
    s = int(slots[i])
    return i, s, zero_why if s == 0 else "is negative" if s < 0 else past_why


def _check_window_slots(op, req_to_token, rows, starts, ends, mapping=None, page_size=None, *, slot_rows=None, swa_rows=None) -> None:
    """Every in-window token of every request (row 0, padding, exempt) has a full slot in range, and with a
    mapping a live SWA slot; no slot is shared between two tokens; paged: offsets and pages agree."""
    dev = req_to_token.device
    counts = ends - starts
    req, off = _flat(counts)
    pos = starts[req] + off
    real = rows[req] != 0
    req, pos = req[real], pos[real]
    if req.numel() == 0:
        return
    row = rows[req]
    full = req_to_token.detach()[row.to(dev), pos.to(dev)].to("cpu", torch.int64)
    upper = slot_rows if slot_rows is not None else (mapping.numel() - 1 if mapping is not None else None)

    def name(i):
        return f"request {int(req[i])} (batch index) position {int(pos[i])}"

    bad = _first_bad_slot(full, upper, "is 0, the dummy slot (an unwritten req_to_token entry)", f"is past the {upper} full slots")
    if bad is not None:
        i, s, why = bad
        _fail(op, f"{name(i)} (req_to_token[{int(row[i])}, {int(pos[i])}]): full slot {s} {why}")
    # Requests may share full slots (a cached common prefix), one request's positions may not; two
    # different full slots never share an SWA slot.
    _duplicates(op, row * (int(full.max()) + 1) + full, pos, lambda i: f"{name(i)} (full slot {int(full[i])})")
    swa = None
    if mapping is not None:
        _tensor("mapping", mapping, 1)
        swa = mapping.detach()[full.to(mapping.device)].to("cpu", torch.int64)
        bad = _first_bad_slot(
            swa, swa_rows, "is 0: evicted or never allocated, though inside the window", f"is past the SWA buffer's {swa_rows} rows"
        )
        if bad is not None:
            i, s, why = bad
            _fail(op, f"{name(i)}: SWA slot {s} (mapping[{int(full[i])}]) {why}")
        _duplicates(op, swa, full, lambda i: f"{name(i)} (full slot {int(full[i])}, SWA slot {int(swa[i])})")
    if page_size is not None and page_size > 1:
        ps = page_size
        # the kernels read each page through the slot of its first token, which may lie before the window
        head_pos = pos // ps * ps
        head = req_to_token.detach()[row.to(dev), head_pos.to(dev)].to("cpu", torch.int64)
        for kind, slot, head_slot in (("full", full, head), ("SWA", swa, None)):
            if slot is None:
                continue
            if head_slot is None:
                head_slot = mapping.detach()[head.clamp(0, mapping.numel() - 1).to(mapping.device)].to("cpu", torch.int64)
            i = _first(slot % ps != pos % ps)
            if i is not None:
                _fail(
                    op,
                    f"{name(i)}: {kind} slot {int(slot[i])} sits at offset {int(slot[i] % ps)} of its page, not at "
                    f"the position's offset {int(pos[i] % ps)} (page_size {ps})",
                )
            i = _first(slot // ps != head_slot // ps)
            if i is not None:
                _fail(
                    op,
                    f"{name(i)}: {kind} slot {int(slot[i])} is on page {int(slot[i] // ps)}, but its page's first "
                    f"token (position {int(head_pos[i])}) is on page {int(head_slot[i] // ps)}",
                )


def check_build_window_indices(
    req_to_token,
    req_pool_indices,
    seq_lens,
    *,
    window_left,
    prefix_lens=None,
    mapping=None,
    page_size=None,
    num_indices=None,
    out=None,
    **extra,
) -> None:
    """The debug check of :func:`~triton_swa.build_window_indices` (module docstring); raises ValueError."""
    op = "build_window_indices"
    _check_count("num_indices", num_indices)
    if page_size is not None:
        _check_page_size(page_size, mapping)
    rows, starts, ends = _window_bounds(op, req_to_token, req_pool_indices, seq_lens, window_left, prefix_lens)
    total = int((ends - starts).sum())
    if num_indices is not None and num_indices != total:
        lens = "prefix_lens" if prefix_lens is not None else "seq_lens"
        _fail(
            op,
            f"num_indices={num_indices}, but the windows hold {total} indices (window_index_count of the device "
            f"{lens}): num_indices was computed from other lengths, e.g. a host copy that disagrees with {lens}",
        )
    if out is not None and getattr(out, "kv_indices", None) is not None and out.kv_indices.numel() < total:
        _fail(op, f"out.kv_indices holds {out.kv_indices.numel()} entries, fewer than the windows' {total} (it would be truncated)")
    _check_window_slots(op, req_to_token, rows, starts, ends, mapping)


def check_build_window_page_table(
    req_to_token, req_pool_indices, seq_lens, *, window_left, page_size, prefix_lens=None, mapping=None, max_pages=None, out=None, **extra
) -> None:
    """The debug check of :func:`~triton_swa.build_window_page_table` (module docstring); raises ValueError."""
    op = "build_window_page_table"
    _check_count("max_pages", max_pages)
    _check_page_size(page_size, mapping)
    rows, starts, ends = _window_bounds(op, req_to_token, req_pool_indices, seq_lens, window_left, prefix_lens)
    width, source = max_pages, f"max_pages={max_pages}"
    if width is None and out is not None and getattr(out, "page_table", None) is not None:
        width = out.page_table.shape[1]
        source = f"out.page_table's width ({width} columns)"
    if width is not None and isinstance(page_size, int) and page_size >= 1:
        first = starts // page_size
        pages = torch.where(ends > starts, (ends - 1) // page_size + 1 - first, torch.zeros_like(ends))
        b = _first(pages > width)
        if b is not None:
            _fail(
                op,
                f"request {b} (batch index): window [{int(starts[b])}, {int(ends[b])}) spans {int(pages[b])} pages "
                f"of page_size {page_size}, more than {source}: the pages past it would be dropped (give "
                f"max_pages >= {int(pages.max())}, e.g. max_window_pages(...))",
            )
    _check_window_slots(op, req_to_token, rows, starts, ends, mapping, page_size)
