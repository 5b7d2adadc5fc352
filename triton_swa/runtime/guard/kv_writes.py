"""The debug checks of ``swa_out_cache_loc`` and ``store_kv``: the slots a step's new K/V goes to.

Extend the ops' own argument checks (``triton_swa/ops/indices.py`` and ``triton_swa/ops/kv_store.py``)
with the values of ``loc`` / ``out_cache_loc`` and the mapping:

- every ``loc`` lies in ``[0, mapping size - 1)`` (or the buffers' rows), a real token (``loc > 0``)
  has an SWA slot, translated slots lie in ``[0, rows)`` of both buffers, and no two tokens write the
  same slot;
- ``loc = 0`` is padding (it writes the dummy slot) and is allowed; ``swa_out_cache_loc`` also passes
  the mapping's ``-1`` sentinel through; every other negative slot is refused.
"""

from __future__ import annotations

import torch

from .common import _buffer_rows, _defer, _duplicates, _fail, _first, _host, _tensor


def _check_write_slots(op, loc, mapping, rows: int | None, rows_name: str) -> None:
    locs = _host("loc" if op == "store_kv" else "out_cache_loc", loc)
    source = "loc" if op == "store_kv" else "out_cache_loc"
    # swa_out_cache_loc passes the mapping's -1 sentinel through (docs/contract.md §2); a store never takes it
    sentinel_ok = rows is None
    if mapping is not None:
        _tensor("mapping", mapping, 1)
        n_map = mapping.numel()
        i = _first(((locs < 0) & ~((locs == -1) & sentinel_ok)) | (locs >= n_map - 1))
        if i is not None:
            s = int(locs[i])
            why = "is negative" if s < 0 else f"is past the {n_map - 1} full slots of the mapping"
            _fail(op, f"token {i}: full slot {s} ({source}[{i}]) {why}")
        slots = mapping.detach()[locs.to(mapping.device)].to("cpu", torch.int64)
        i = _first((locs > 0) & (slots <= 0))
        if i is not None:
            _fail(
                op,
                f"token {i}: full slot {int(locs[i])} ({source}[{i}]) has SWA slot {int(slots[i])} "
                f"(mapping[{int(locs[i])}]: evicted or never allocated); its K/V would be lost",
            )
    else:
        slots = locs
    if rows is not None:
        i = _first((slots < 0) | (slots >= rows))
        if i is not None:
            s = int(slots[i])
            via = f" (mapping[{int(locs[i])}])" if mapping is not None else f" ({source}[{i}])"
            why = "is negative" if s < 0 else f"is past the {rows} rows of {rows_name}"
            _fail(op, f"token {i}: slot {s}{via} {why}")
    real = slots > 0
    idx = torch.arange(slots.numel())[real]
    _duplicates(op, slots[real], idx, lambda i: f"token {int(idx[i])}")


def check_swa_out_cache_loc(out_cache_loc, mapping, *, out=None, **extra) -> None:
    """The debug check of :func:`~triton_swa.swa_out_cache_loc` (module docstring); raises ValueError."""
    if isinstance(out, torch.Tensor) and isinstance(out_cache_loc, torch.Tensor) and out.numel() < out_cache_loc.numel():
        _defer("out is smaller than out_cache_loc")
    _check_write_slots("swa_out_cache_loc", out_cache_loc, mapping, None, "")


def check_store_kv(k_buffer, v_buffer, loc, k, v, *, mapping=None, k_scale=None, v_scale=None, skip_negative=False, **extra) -> None:
    """The debug check of :func:`~triton_swa.store_kv` (module docstring); raises ValueError."""
    rows_k, rows_v = _buffer_rows("k_buffer", k_buffer), _buffer_rows("v_buffer", v_buffer)
    n = _tensor("loc", loc, 1).numel()
    for x, buf in ((k, k_buffer), (v, v_buffer)):
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != (n, *buf.shape[1:]):
            _defer("k or v does not match loc and the buffers")
    for scale in (k_scale, v_scale):
        if isinstance(scale, torch.Tensor) and scale.numel() != 1:
            _defer("a scale tensor must hold one value")
    rows, name = (rows_k, "k_buffer") if rows_k <= rows_v else (rows_v, "v_buffer")
    if skip_negative is True:
        loc = loc[loc >= 0]  # padding: written nowhere, so nothing to check
    _check_write_slots("store_kv", loc, mapping, rows, name)
