"""The debug check of ``swa_extend``: the new tokens, the cached prefix they see, their positions
and their masks.

Extends the op's own argument checks (``triton_swa/ops/extend/launcher.py``) with the values inside
its index tensors; the prefix's index forms are checked by
:mod:`~triton_swa.runtime.guard.attention_indices`.

- ``qo_indptr`` starts at 0, never decreases and ends within ``q``'s tokens, no request has more than
  ``max_extend_len`` tokens, ``prefix_lens >= 0``.
- The cached prefix covers the keys the new tokens see, ``[max(0, P - W), P)`` (``[0, P)`` at
  ``W = -1``): a CSR list (which ends at position ``P - 1``) holds at least those and at most ``P``
  entries, a page table has ``0 <= window_starts <= max(0, P - W)`` and columns for every page up to
  ``P - 1``; every slot or page read is in range and not the dummy (entries the kernel never reads
  are not checked).
- ``q_positions`` of request ``b`` lie in ``[P, P + E)``; each custom-mask block ``[E, E]`` fits in
  ``custom_mask`` (and ``mask_indptr [B + 1]`` steps by ``E * E``).
"""

from __future__ import annotations

import torch

from ..window import window_start
from .attention_indices import _check_csr, _check_page_table
from .common import _buffer_rows, _check_count, _check_indptr, _check_page_size, _check_window_left, _defer, _fail, _first, _host, _tensor


def check_swa_extend(
    q,
    k,
    v,
    k_buffer,
    v_buffer,
    qo_indptr,
    prefix_lens,
    *,
    window_left,
    kv_indptr=None,
    kv_indices=None,
    page_table=None,
    window_starts=None,
    page_size=1,
    custom_mask=None,
    mask_indptr=None,
    q_positions=None,
    max_extend_len=None,
    max_window=None,
    **extra,
) -> None:
    """The debug check of :func:`~triton_swa.swa_extend` (module docstring); raises ValueError."""
    op = "swa_extend"
    _check_window_left(window_left)
    _check_page_size(page_size)
    _check_count("max_extend_len", max_extend_len)
    T = _buffer_rows("q", q)
    _tensor("k_buffer", k_buffer, integer=False)
    _tensor("v_buffer", v_buffer, integer=False)
    rows = k_buffer.shape[0] * (k_buffer.shape[1] if k_buffer.dim() == 4 else 1)
    rows = min(rows, v_buffer.shape[0] * (v_buffer.shape[1] if v_buffer.dim() == 4 else 1))
    P = _host("prefix_lens", prefix_lens)
    B = P.numel()
    qo = _host("qo_indptr", qo_indptr)
    if qo.numel() != B + 1:
        _defer(f"qo_indptr must have B + 1 = {B + 1} entries, got {qo.numel()}")
    # rows of q past the last request are allowed (never read, never written)
    E = _check_indptr(op, "qo_indptr", qo, T, what="q")
    b = _first(P < 0)
    if b is not None:
        _fail(op, f"request {b} (batch index): prefix_lens[{b}] = {int(P[b])} is negative")
    if max_extend_len is not None and B:
        b = _first(E > max_extend_len)
        if b is not None:
            _fail(
                op,
                f"request {b} (batch index): {int(E[b])} new tokens, more than max_extend_len={max_extend_len} "
                "(the grid would skip the rest)",
            )
    # The cached keys a request's new tokens see: [max(0, P - W), P) ([0, P) at W = -1). (max_window
    # only sizes the split count; the kernel covers the whole window whatever it says.)
    start = window_start(P, window_left, extend=True)
    need = P - start
    if kv_indptr is not None and kv_indices is not None:
        _check_csr(op, kv_indptr, kv_indices, rows, B, need=need, prefix=P)
    elif page_table is not None and window_starts is not None:
        ws = _host("window_starts", window_starts)
        if ws.numel() != B:
            _defer(f"window_starts must have B = {B} entries, got {ws.numel()}")
        _check_page_table(op, page_table, ws, P, page_size, rows, ends_name="prefix_lens", read_from=start)
    if q_positions is not None:
        pos = _host("q_positions", q_positions)
        if pos.numel() != T:
            _defer(f"q_positions must have T = {T} entries, got {pos.numel()}")
        req = torch.repeat_interleave(torch.arange(B), E, output_size=T)
        t = _first((pos < P[req]) | (pos >= (P + E)[req]))
        if t is not None:
            b = int(req[t])
            _fail(
                op,
                f"request {b} (batch index), new token {t - int(qo[b])}: q_positions[{t}] = {int(pos[t])} is "
                f"outside its new tokens' positions [{int(P[b])}, {int(P[b] + E[b])})",
            )
    if custom_mask is not None and mask_indptr is not None:
        _tensor("custom_mask", custom_mask, 1, integer=False)
        mi = _host("mask_indptr", mask_indptr)
        if mi.numel() < B:
            _defer(f"mask_indptr must have at least B = {B} entries, got {mi.numel()}")
        size = E * E
        b = _first(mi[:B] < 0)
        if b is not None:
            _fail(op, f"request {b} (batch index): mask_indptr[{b}] = {int(mi[b])} is negative")
        b = _first(mi[:B] + size > custom_mask.numel())
        if b is not None:
            _fail(
                op,
                f"request {b} (batch index): its [{int(E[b])}, {int(E[b])}] mask block at mask_indptr[{b}] = "
                f"{int(mi[b])} runs past custom_mask's {custom_mask.numel()} entries",
            )
        if mi.numel() == B + 1:
            b = _first(mi[1:] - mi[:-1] != size)
            if b is not None:
                _fail(
                    op,
                    f"request {b} (batch index): mask_indptr steps by {int(mi[b + 1] - mi[b])}, but its mask block "
                    f"is [{int(E[b])}, {int(E[b])}] = {int(size[b])} entries",
                )
