"""The debug checks of a backend step: the batch before its index builds, the metadata after.

Extend the host checks of ``TritonSWAAttnBackend.init_forward_metadata`` (``triton_swa/backend/metadata.py``),
which calls both in debug mode, with the device contents of the batch and the step's metadata:

- :func:`check_forward_batch` checks, before the step's index builds launch, the device contents
  they read (rows of ``req_to_token``, lengths and their sums, host copies, window slots, with the
  window slot check of :mod:`~triton_swa.runtime.guard.window_builds`);
- :func:`check_forward_metadata` compares a step's ``backend.forward_metadata`` with the reference
  path's indices, index for index, and checks the windows' slots are live (not on an allocator's
  free list).
"""

from __future__ import annotations

import torch

from ..window import window_start
from .common import _check_cpu_copies, _check_indptr, _fail, _first, _flat, _host
from .window_builds import _check_window_slots


def _length_fields(forward_batch) -> dict:
    """A batch's device lengths beside their host copies (None where the batch has none)."""
    fields = {"seq_lens": forward_batch.seq_lens, "seq_lens_cpu": getattr(forward_batch, "seq_lens_cpu", None)}
    for name in ("extend_prefix_lens", "extend_seq_lens"):
        if getattr(forward_batch, name, None) is not None:
            fields[name] = getattr(forward_batch, name)
            fields[name + "_cpu"] = getattr(forward_batch, name + "_cpu", None)
    return fields


def _pool_rows(pool) -> int | None:
    """Rows of a KV pool's buffers (``k_buffer[0]``), when it exposes them."""
    bufs = getattr(pool, "k_buffer", None)
    if isinstance(bufs, (list, tuple)) and bufs and isinstance(bufs[0], torch.Tensor):
        return int(bufs[0].shape[0])
    return None


def _free_pages(allocator) -> torch.Tensor | None:
    pages = getattr(allocator, "free_pages", None)
    return pages.detach().to("cpu", torch.int64) if isinstance(pages, torch.Tensor) else None


def _compare(op: str, kind: str, what: str, got: torch.Tensor, want: torch.Tensor, describe) -> None:
    got, want = got.to("cpu", torch.int64).reshape(-1), want.to("cpu", torch.int64).reshape(-1)
    if got.numel() != want.numel():
        _fail(op, f"{kind} layers: {what} has {got.numel()} entries, the reference {want.numel()}")
    i = _first(got != want)
    if i is not None:
        _fail(op, f"{kind} layers: {describe(i)}: {what} holds {int(got[i])}, the reference path builds {int(want[i])}")


def _host_window_list(rtt, rows, starts, ends, mapping) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR ``(kv_indptr, kv_indices)`` of the windows ``[starts, ends)`` of ``req_to_token`` rows, SWA
    slots through ``mapping`` when given (host int64)."""
    counts = (ends - starts).clamp(min=0)
    req, off = _flat(counts)
    slots = _slots_at(rtt, rows[req], starts[req] + off, mapping)
    return torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(counts, 0)]), slots


def _host_page_table(op, kind, rtt, rows, starts, ends, page_size: int, mapping, width: int) -> torch.Tensor:
    """Page table ``[B, width]`` of the windows ``[starts, ends)``: entry ``j`` is the page of the
    slot of the ``j``-th page's first token (translated when ``mapping``), 0 past the last page."""
    first = starts // page_size
    num = torch.where(ends > starts, (ends - 1) // page_size + 1 - first, 0)
    b = _first(num > width)
    if b is not None:
        _fail(op, f"{kind} layers: request {b} (batch index) spans {int(num[b])} pages, more than the page_table's {width}")
    req, j = _flat(num)
    table = torch.zeros(len(starts), width, dtype=torch.int64)
    table[req, j] = _slots_at(rtt, rows[req], (first[req] + j) * page_size, mapping) // page_size
    return table


def _slots_at(rtt, rows, positions, mapping) -> torch.Tensor:
    """Host int64 slots of ``req_to_token[rows, positions]``, through ``mapping`` when given."""
    slots = rtt.detach()[rows.to(rtt.device), positions.to(rtt.device)].long()
    if mapping is not None:
        slots = mapping.detach()[slots.to(mapping.device)].long()
    return slots.cpu()


def check_forward_batch(backend, forward_batch) -> None:
    """Check, before any launch, the device contents a step's index builds will read.

    For ``TritonSWAAttnBackend.init_forward_metadata`` to call in debug mode after its host checks
    and before building anything (the builds read ``req_to_token`` at the batch's rows and the
    mapping at their slots: a bad row would be read, not reported). Checks:

    - the host copies (``seq_lens_cpu``, ``extend_prefix_lens_cpu``, ``extend_seq_lens_cpu``) equal
      their device tensors (named, with the request);
    - ``req_pool_indices`` are rows of ``req_to_token``; ``seq_lens`` lie in ``[0, max_context_len]``
      (verify: plus ``draft_token_num``); extend modes: ``extend_prefix_lens >= 0``,
      ``extend_seq_lens >= 0`` and ``extend_prefix_lens + extend_seq_lens == seq_lens``;
    - every in-window token of every layer kind (row 0, padding, exempt) has a full slot inside the
      full pool (or the mapping) and, for translated sliding layers, a live SWA slot.

    Raises:
        ValueError: naming the field, the request (batch index), the position and the slot.
    """
    op = "forward batch"
    mode = forward_batch.forward_mode
    if mode.is_idle():
        return
    rtt = backend.req_to_token
    R, C = rtt.shape
    _check_cpu_copies(op, _length_fields(forward_batch))
    rows = _host("req_pool_indices", forward_batch.req_pool_indices)
    b = _first((rows < 0) | (rows >= R))
    if b is not None:
        _fail(op, f"request {b} (batch index): req_pool_indices[{b}] = {int(rows[b])} is not a row of req_to_token [0, {R})")
    seq = _host("seq_lens", forward_batch.seq_lens)
    verify, extend = mode.is_target_verify(), not mode.is_decode()
    extra = int(forward_batch.spec_info.draft_token_num) if verify else 0
    b = _first((seq < 0) | (seq + extra > C))
    if b is not None:
        plus = f" (+ draft_token_num {extra})" if extra else ""
        _fail(op, f"request {b} (batch index): seq_lens[{b}] = {int(seq[b])}{plus} is outside [0, max_context_len={C}]")
    ends = seq
    if extend and not verify:
        P = _host("extend_prefix_lens", forward_batch.extend_prefix_lens)
        E = _host("extend_seq_lens", forward_batch.extend_seq_lens)
        for name, x in (("extend_prefix_lens", P), ("extend_seq_lens", E)):
            b = _first(x < 0)
            if b is not None:
                _fail(op, f"request {b} (batch index): {name}[{b}] = {int(x[b])} is negative")
        b = _first(P + E != seq)
        if b is not None:
            _fail(
                op,
                f"request {b} (batch index): extend_prefix_lens[{b}] + extend_seq_lens[{b}] = {int(P[b])} + {int(E[b])} "
                f"= {int(P[b] + E[b])}, but seq_lens[{b}] = {int(seq[b])} (cached prefix + new tokens must equal seq_lens)",
            )
        ends = P
    ps = int(backend.page_size)
    W = int(backend.sliding_window_size)
    pool = backend.kv_pool
    full_pool = getattr(pool, "full_kv_pool", None) or pool
    swa_pool = getattr(pool, "swa_kv_pool", None)
    kinds = [(-1, False)] + ([(W, bool(backend.use_sliding_window_kv_pool))] if W >= 0 else [])
    for w, translate in kinds:
        starts = window_start(ends, w, extend=extend)
        _check_window_slots(
            op,
            rtt,
            rows,
            starts,
            ends,
            backend.mapping if translate else None,
            ps if ps > 1 else None,
            slot_rows=_pool_rows(full_pool) if not translate else None,
            swa_rows=_pool_rows(swa_pool) if translate else None,
        )


def check_forward_metadata(backend, forward_batch, *, batch_checked: bool = False) -> None:
    """Check a step's metadata (``backend.forward_metadata``) against the reference path and the pools.

    For ``TritonSWAAttnBackend.init_forward_metadata`` to call last when :func:`debug_enabled`, and
    after a CUDA-graph replay refill (outside capture), with a batch-like object carrying
    ``forward_mode``, ``req_pool_indices`` and ``seq_lens`` of the padded batch (padding rows point
    at row 0), ``spec_info`` for verify, and optionally ``out_cache_loc`` and the ``*_cpu`` copies.
    Checks:

    - the host copies (``seq_lens_cpu``, ``extend_*_cpu``, ``prefix_lens_cpu``) equal their device
      tensors; ``qo_indptr`` and ``prefix_lens`` follow the batch (verify: ``seq_lens`` are the
      committed lengths and every request has ``draft_token_num`` queries);
    - sliding and full layers' indices (CSR lists or page tables, and ``window_starts``) equal the
      windows recomputed on the host from ``req_to_token`` and the mapping (the rule of
      ``triton_swa_reference``'s ``decode_window_indices`` / ``extend_window_indices`` /
      ``window_page_table``), index for index;
    - every in-window token of every request (``req_to_token`` row 0, padding, exempt) has a full slot
      inside the full pool, and for translated sliding layers a live SWA slot: not 0 (evicted or never
      allocated), inside the SWA pool, not on the SWA allocator's free list, not shared with another
      token; the same for full slots (full free list);
    - ``out_cache_loc`` (when given) are the new tokens' slots in ``req_to_token``, each with an SWA slot.

    The batch's own device contents are checked first (:func:`check_forward_batch`), so that a bad row
    or length is named rather than read; ``batch_checked=True`` skips that when the caller has just run
    it (``init_forward_metadata`` does, before building).

    Raises:
        ValueError: naming the layer kind, the request (batch index), the position and the slot.
    """
    op = "forward metadata"
    meta = backend.forward_metadata
    if meta is None:
        _fail(op, "backend.forward_metadata is None: init_forward_metadata has not run")
    mode = meta.forward_mode
    if mode.is_idle():
        return
    if not batch_checked:
        check_forward_batch(backend, forward_batch)
    rtt = backend.req_to_token
    ps = int(backend.page_size)
    W = int(backend.sliding_window_size)
    rows = _host("req_pool_indices", forward_batch.req_pool_indices)
    B = rows.numel()
    seq = _host("seq_lens", forward_batch.seq_lens)
    _check_cpu_copies(op, _length_fields(forward_batch))

    extend = not mode.is_decode()
    if extend:
        lens = _host("prefix_lens", meta.prefix_lens)
        if meta.prefix_lens_cpu is not None:
            _check_cpu_copies(op, {"prefix_lens": meta.prefix_lens, "prefix_lens_cpu": meta.prefix_lens_cpu})
        if mode.is_target_verify():
            want_prefix = seq
            n = int(forward_batch.spec_info.draft_token_num)
            want_e = torch.full((B,), n, dtype=torch.int64)
        else:
            want_prefix = _host("extend_prefix_lens", forward_batch.extend_prefix_lens)
            want_e = _host("extend_seq_lens", forward_batch.extend_seq_lens)
        b = _first(lens != want_prefix)
        if b is not None:
            _fail(op, f"request {b} (batch index): prefix_lens[{b}] = {int(lens[b])}, the batch says {int(want_prefix[b])}")
        qo = _host("qo_indptr", meta.qo_indptr)
        e = _check_indptr(op, "qo_indptr", qo, None, what="the batch")
        b = _first(e != want_e)
        if b is not None:
            _fail(op, f"request {b} (batch index): qo_indptr gives {int(e[b])} new tokens, the batch {int(want_e[b])}")
        b = _first(e > meta.max_extend_len) if B else None
        if b is not None:
            _fail(op, f"request {b} (batch index): {int(e[b])} new tokens, more than max_extend_len={meta.max_extend_len}")
        new_start, new_end = lens, lens + e
    else:
        lens = seq
        new_start, new_end = seq - 1, seq

    pool = backend.kv_pool
    swa_pool = getattr(pool, "swa_kv_pool", None)
    full_pool = getattr(pool, "full_kv_pool", None) or pool
    allocator = getattr(getattr(backend, "model_runner", None), "token_to_kv_pool_allocator", None)
    mapping = backend.mapping
    kinds = [("full", meta.full, -1, False)]
    if W >= 0:
        kinds.append(("sliding", meta.sliding, W, bool(backend.use_sliding_window_kv_pool)))
    for kind, li, w, translate in kinds:
        if li is None:
            _fail(op, f"{kind} layers have no indices in forward_metadata")
        if bool(li.translated) != translate:
            _fail(op, f"{kind} layers: indices are {'' if li.translated else 'not '}translated, expected the opposite")
        _compare(op, kind, "window_ends", li.window_ends, lens, lambda i: f"request {i} (batch index)")
        m = mapping if translate else None
        starts = window_start(lens, w, extend=extend)
        _compare(op, kind, "window_starts", li.window_starts, starts, lambda i: f"request {i} (batch index)")
        if li.page_table is None:
            ref_ptr, ref_idx = _host_window_list(rtt, rows, starts, lens, m)
            _compare(op, kind, "kv_indptr", li.kv_indptr, ref_ptr, lambda i: f"request {i - 1} (batch index)")
            total = int(ref_ptr[-1])
            if li.kv_indices.numel() < total:
                _fail(op, f"{kind} layers: kv_indices holds {li.kv_indices.numel()} entries, the windows {total}")
            req, off = _flat((lens - starts).clamp(min=0))
            _compare(
                op,
                kind,
                "kv_indices",
                li.kv_indices[:total],
                ref_idx,
                lambda i: f"request {int(req[i])} (batch index), position {int(starts[req[i]] + off[i])}, kv_indices[{i}]",
            )
        else:
            table = li.page_table
            want = _host_page_table(op, kind, rtt, rows, starts, lens, ps, m, table.shape[1])
            width = max(table.shape[1], 1)
            _compare(
                op,
                kind,
                "page_table",
                table,
                want,
                lambda i: (
                    f"request {i // width} (batch index), position "
                    f"{max(int(starts[i // width]), (int(starts[i // width]) // ps + i % width) * ps)}, "
                    f"page_table[{i // width}, {i % width}]"
                ),
            )
        sub = swa_pool if translate else full_pool
        sub_alloc = getattr(allocator, "swa_attn_allocator" if translate else "full_attn_allocator", None)
        if sub_alloc is None and not translate:
            sub_alloc = allocator  # a plain (full-only) allocator
        _check_window_slots(
            op,
            rtt,
            rows,
            starts,
            lens,
            m,
            ps if ps > 1 else None,
            slot_rows=_pool_rows(full_pool) if not translate else None,
            swa_rows=_pool_rows(sub) if translate else None,
        )
        free = _free_pages(sub_alloc)
        if free is not None and free.numel():
            _check_not_free(op, kind, rtt, rows, starts, lens, m, ps, free)

    loc = getattr(forward_batch, "out_cache_loc", None)
    if loc is not None:
        got = _host("out_cache_loc", loc)
        req, off = _flat((new_end - new_start).clamp(min=0))
        pos = new_start[req] + off
        want = rtt.detach()[rows[req].to(rtt.device), pos.to(rtt.device)].to("cpu", torch.int64)
        if got.numel() != want.numel():
            _fail(op, f"out_cache_loc has {got.numel()} entries, the step has {want.numel()} new tokens")
        i = _first(got != want)
        if i is not None:
            _fail(
                op,
                f"request {int(req[i])} (batch index), position {int(pos[i])}: out_cache_loc[{i}] = {int(got[i])}, "
                f"but req_to_token holds slot {int(want[i])}",
            )
        if mapping is not None and W >= 0 and backend.use_sliding_window_kv_pool:
            real = rows[req] != 0
            swa = mapping.detach()[got.clamp(min=0).to(mapping.device)].to("cpu", torch.int64)
            i = _first(real & (swa <= 0))
            if i is not None:
                _fail(
                    op,
                    f"request {int(req[i])} (batch index), position {int(pos[i])}: new token's full slot {int(got[i])} "
                    f"has SWA slot {int(swa[i])} (mapping[{int(got[i])}]): its sliding K/V would be lost",
                )


def _check_not_free(op, kind, rtt, rows, starts, ends, mapping, ps, free) -> None:
    """No in-window token's page (SWA page when translated) is on its allocator's free list."""
    req, off = _flat((ends - starts).clamp(min=0))
    pos = starts[req] + off
    real = rows[req] != 0
    req, pos = req[real], pos[real]
    if req.numel() == 0:
        return
    slot = rtt.detach()[rows[req].to(rtt.device), pos.to(rtt.device)].to("cpu", torch.int64)
    if mapping is not None:
        slot = mapping.detach()[slot.to(mapping.device)].to("cpu", torch.int64)
    i = _first(torch.isin(slot // ps, free))
    if i is not None:
        _fail(
            op,
            f"{kind} layers: request {int(req[i])} (batch index), position {int(pos[i])}: slot {int(slot[i])} is on a "
            f"free page ({int(slot[i] // ps)}) of the {'SWA' if mapping is not None else 'full'} allocator",
        )
