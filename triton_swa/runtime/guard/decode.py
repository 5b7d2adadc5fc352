"""The debug check of ``swa_decode``: the window each request's one query reads.

Extends the op's own argument checks (``triton_swa/ops/decode/launcher.py``) with the values inside
its index tensors; the two index forms are checked by
:mod:`~triton_swa.runtime.guard.attention_indices`.

- CSR ``kv_indptr`` starts at 0, never decreases and ends within ``kv_indices``; every listed slot
  lies in ``[1, k_buffer rows)`` and appears once per window; no window holds more than
  ``max_window`` keys.
- Page-table form: ``0 <= window_starts <= seq_lens``, the table is wide enough for every window,
  and every page a window covers lies in ``[1, num_pages)``.
"""

from __future__ import annotations

from .attention_indices import _check_csr, _check_page_table
from .common import _buffer_rows, _check_count, _check_page_size, _defer, _fail, _first, _host


def check_swa_decode(
    q,
    k_buffer,
    v_buffer,
    *,
    kv_indptr=None,
    kv_indices=None,
    page_table=None,
    window_starts=None,
    seq_lens=None,
    page_size=1,
    max_window=None,
    **extra,
) -> None:
    """The debug check of :func:`~triton_swa.swa_decode` (module docstring); raises ValueError."""
    op = "swa_decode"
    _check_page_size(page_size)
    _check_count("max_window", max_window)
    B = _buffer_rows("q", q)
    rows = min(_buffer_rows("k_buffer", k_buffer), _buffer_rows("v_buffer", v_buffer))
    if kv_indptr is not None and kv_indices is not None:
        _check_csr(op, kv_indptr, kv_indices, rows, B, max_count=max_window)
    elif page_table is not None and window_starts is not None and seq_lens is not None:
        starts, ends = _host("window_starts", window_starts), _host("seq_lens", seq_lens)
        if starts.numel() != B or ends.numel() != B:
            _defer(f"window_starts and seq_lens must have B = {B} entries, got {starts.numel()} and {ends.numel()}")
        if max_window is not None:
            b = _first(ends - starts > max_window)
            if b is not None:
                _fail(
                    op, f"request {b} (batch index): window [{int(starts[b])}, {int(ends[b])}) holds more than max_window={max_window} keys"
                )
        _check_page_table(op, page_table, starts, ends, page_size, rows, ends_name="seq_lens")
