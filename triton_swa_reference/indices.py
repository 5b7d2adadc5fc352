"""Index metadata of a forward step: window indices, full-to-SWA translation, page tables.

The fused Triton kernels of ``triton_swa.ops.indices`` must equal these bit for bit.

- ``req_to_token [num_reqs + 1, max_context_len]`` (int32) maps (request row, token position) to a
  **full-pool slot**. Row 0 is padding.
- ``mapping`` (``full_to_swa_index_mapping``, int64 ``[full_slots + 1]``) maps a full slot to its SWA
  slot; 0 means none (evicted or never allocated), and the last element is -1 so that -1 maps to -1.
- A sliding layer reads ``mapping[req_to_token[r, t]]``; a full layer reads ``req_to_token[r, t]``.
"""

from __future__ import annotations

import torch

from .window import check_window_left, decode_window_start, extend_window_start


def translate_full_to_swa(loc: torch.Tensor, mapping: torch.Tensor) -> torch.Tensor:
    """SWA slots of full slots ``loc``: ``mapping[loc]`` as int32 (-1 stays -1, evicted gives 0)."""
    return mapping[loc.long()].to(torch.int32)


def window_index_list(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    mapping: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR list of the slots of positions ``[starts[b], ends[b])`` of each request, oldest first.

    Returns:
        tuple: ``kv_indptr`` int32 `[B + 1]` and ``kv_indices`` int32 `[kv_indptr[-1]]`, translated
        through ``mapping`` when one is given.
    """
    counts = (ends.long() - starts.long()).clamp(min=0)
    kv_indptr = torch.zeros(len(counts) + 1, dtype=torch.int32, device=req_to_token.device)
    kv_indptr[1:] = torch.cumsum(counts, 0).to(torch.int32)
    pieces = [
        req_to_token[int(r), int(s) : int(s) + int(n)].long()
        for r, s, n in zip(req_pool_indices.tolist(), starts.tolist(), counts.tolist())
    ]
    full = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64, device=req_to_token.device)
    kv_indices = translate_full_to_swa(full, mapping) if mapping is not None else full.to(torch.int32)
    return kv_indptr, kv_indices


def decode_window_indices(req_to_token, req_pool_indices, seq_lens, window_left: int, mapping=None):
    """Decode: each request's last ``min(L, W + 1)`` tokens (``W = -1``: all ``L``).

    Returns:
        tuple: ``kv_indptr`` int32 `[B + 1]`, ``kv_indices`` int32, ``window_starts`` int32 `[B]`.
    """
    check_window_left(window_left)
    starts = decode_window_start(seq_lens.long(), window_left)
    kv_indptr, kv_indices = window_index_list(req_to_token, req_pool_indices, starts, seq_lens, mapping)
    return kv_indptr, kv_indices, starts.to(torch.int32)


def extend_window_indices(req_to_token, req_pool_indices, prefix_lens, window_left: int, mapping=None):
    """Extend, chunked prefill and verify: the cached prefix window ``[max(0, P - W), P)``.

    For verify, ``P`` is the committed length and the draft tokens follow it.

    Returns:
        tuple: ``kv_indptr`` int32 `[B + 1]`, ``kv_indices`` int32, ``window_starts`` int32 `[B]`.
    """
    check_window_left(window_left)
    starts = extend_window_start(prefix_lens.long(), window_left)
    kv_indptr, kv_indices = window_index_list(req_to_token, req_pool_indices, starts, prefix_lens, mapping)
    return kv_indptr, kv_indices, starts.to(torch.int32)


def window_page_table(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    page_size: int,
    mapping: torch.Tensor | None = None,
    max_pages: int | None = None,
) -> torch.Tensor:
    """Page table of the windows ``[starts[b], ends[b])``: int32 `[B, max_pages]`.

    Entry ``[b, j]`` is the pool page of the window's ``j``-th page, where page 0 is the page of
    position ``starts[b]`` (so the window begins at offset ``starts[b] % page_size`` of entry 0).
    The page is read from the slot of the page's first token: ``req_to_token[r, p * page_size]``,
    translated through ``mapping`` for sliding layers (full and SWA slots share their in-page offset,
    docs/contract.md §2), then ``// page_size``. Entries past a request's last page are 0 (the dummy page).
    ``max_pages`` defaults to the most pages any window spans.
    """
    starts, ends = starts.long().cpu(), ends.long().cpu()
    first = starts // page_size
    last = torch.where(ends > starts, (ends - 1) // page_size + 1, first)
    num_pages = last - first
    width = int(num_pages.max()) if max_pages is None and len(num_pages) else (max_pages or 0)
    table = torch.zeros(len(starts), width, dtype=torch.int32, device=req_to_token.device)
    for b, r in enumerate(req_pool_indices.tolist()):
        n = int(num_pages[b])
        if n > width:
            raise ValueError(f"request {b} spans {n} pages, more than max_pages={width}")
        first_tokens = (first[b] + torch.arange(n)) * page_size
        slots = req_to_token[r, first_tokens.to(req_to_token.device)].long()
        if mapping is not None:
            slots = mapping[slots]
        table[b, :n] = (slots // page_size).to(torch.int32)
    return table


def swa_out_cache_loc(out_cache_loc: torch.Tensor, mapping: torch.Tensor, buffer_size: int | None = None):
    """The new tokens' SWA slots, ``mapping[out_cache_loc]`` as int32.

    With ``buffer_size`` (a CUDA-graph buffer), the result has that length and its tail is zero.
    """
    swa = translate_full_to_swa(out_cache_loc, mapping)
    if buffer_size is None:
        return swa
    out = torch.zeros(buffer_size, dtype=torch.int32, device=swa.device)
    out[: len(swa)] = swa
    return out


def store_kv(k_buffer, v_buffer, loc, k, v, *, mapping=None, k_scale=None, v_scale=None):
    """Write new K/V rows at ``loc`` (translated through ``mapping`` for a sliding layer), in place.

    Values are divided by the scale when one is given (fp8 storage), then cast to the buffer's dtype.
    fp8 e4m3 saturates: values beyond the format's range (``inf`` included) become ``±448`` (e4m3fn) or
    ``±240`` (e4m3fnuz); only NaN stays NaN. (torch's own cast saturates in some versions and gives NaN
    in others, so the rule is applied here explicitly.) Pass fp8 buffers as their typed views (``pool.get_key_buffer``), not as
    uint8 storage.
    """
    slots = mapping[loc.long()] if mapping is not None else loc.long()
    for buf, x, scale in ((k_buffer, k, k_scale), (v_buffer, v, v_scale)):
        x = x.to(torch.float32)
        if scale is not None:
            x = x / float(scale)
        if buf.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
            e4m3_max = torch.finfo(buf.dtype).max
            x = torch.where(torch.isnan(x), x, x.clamp(-e4m3_max, e4m3_max))
        buf[slots] = x.to(buf.dtype)
