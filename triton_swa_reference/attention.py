"""Dense masked attention in float64: what every attention kernel of triton-swa must compute.

Shapes: ``q [Tq, HQ, D]``, ``k [Tk, H, D]``, ``v [Tk, H, Dv]`` with ``HQ % H == 0`` (GQA; ``H == 1`` is
MQA). Query head ``h`` reads KV head ``h // (HQ // H)``.

Scores are ``s = (q . k) * sm_scale``; with ``logit_cap > 0`` they become ``cap * tanh(s / cap)``
(Gemma 2). A sink (gpt-oss) is one extra logit per query head that joins the softmax denominator and
contributes no value. A row whose keys are all masked gives zeros, never NaN.
"""

from __future__ import annotations

import torch

from .paged import gather_kv, page_table_slots
from .window import check_window_left, extend_window_start, window_mask


def dequantize(x: torch.Tensor, scale: float | torch.Tensor | None) -> torch.Tensor:
    """``x`` in float64, times ``scale`` when one is given (fp8 KV stores ``value / scale``)."""
    out = x.to(torch.float64)
    if scale is not None:
        out = out * (scale.double() if isinstance(scale, torch.Tensor) else float(scale))
    return out


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    sm_scale: float,
    logit_cap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Masked softmax attention of one sequence, in float64.

    Args:
        q (torch.Tensor): queries `[Tq, HQ, D]`.
        k (torch.Tensor): keys `[Tk, H, D]` (already dequantised if they were fp8).
        v (torch.Tensor): values `[Tk, H, Dv]`.
        mask (torch.Tensor | None): boolean `[Tq, Tk]` (True = attend) shared by all heads, or
            `[HQ, Tq, Tk]`; None attends everything.
        sm_scale (float): multiplies the dot products.
        logit_cap (float): soft cap ``cap * tanh(s / cap)`` when ``> 0``.
        sinks (torch.Tensor | None): one logit per query head `[HQ]`.

    Returns:
        torch.Tensor: `[Tq, HQ, Dv]` in float64.
    """
    tq, hq, _ = q.shape
    tk, h, dv = v.shape
    if hq % h != 0:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({h})")
    group = hq // h
    if tk == 0:
        return torch.zeros(tq, hq, dv, dtype=torch.float64, device=q.device)
    qf = q.to(torch.float64)
    kf = k.to(torch.float64).repeat_interleave(group, dim=1)  # [Tk, HQ, D]
    vf = v.to(torch.float64).repeat_interleave(group, dim=1)  # [Tk, HQ, Dv]
    scores = torch.einsum("qhd,khd->hqk", qf, kf) * sm_scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    if mask is None:
        mask = torch.ones(tq, tk, dtype=torch.bool, device=q.device)
    mask = mask.to(q.device).expand(hq, tq, tk)
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        sink = sinks.to(torch.float64).reshape(hq, 1, 1).expand(hq, tq, 1)
        scores = torch.cat([scores, sink], dim=-1)
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    weights = torch.exp(scores - row_max)
    denom = weights.sum(dim=-1, keepdim=True)
    if sinks is not None:
        weights = weights[..., :tk]
    probs = torch.where(denom > 0, weights / torch.where(denom > 0, denom, 1.0), torch.zeros_like(weights))
    return torch.einsum("hqk,khd->qhd", probs, vf)


def decode_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    *,
    sm_scale: float,
    logit_cap: float = 0.0,
    sinks: torch.Tensor | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
) -> torch.Tensor:
    """Decode over a CSR index list: request ``b`` attends every slot in its list.

    The window was applied when the list was built (see ``reference.indices``), so nothing is masked
    here. An empty list gives zeros.

    Args:
        q (torch.Tensor): `[B, HQ, D]`, one query per request.
        k_buffer (torch.Tensor): a layer's keys `[slots, H, D]` (fp8 storage dequantised with ``k_scale``).
        v_buffer (torch.Tensor): a layer's values `[slots, H, Dv]`.
        kv_indptr (torch.Tensor): `[B + 1]` offsets into ``kv_indices``.
        kv_indices (torch.Tensor): slots of the window's keys, oldest first.

    Returns:
        torch.Tensor: `[B, HQ, Dv]` in float64.
    """
    out = []
    for b in range(q.shape[0]):
        slots = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])]
        k = dequantize(gather_kv(k_buffer, slots), k_scale)
        v = dequantize(gather_kv(v_buffer, slots), v_scale)
        out.append(attention(q[b : b + 1], k, v, None, sm_scale=sm_scale, logit_cap=logit_cap, sinks=sinks)[0])
    return torch.stack(out) if out else q.new_zeros(0, q.shape[1], v_buffer.shape[-1], dtype=torch.float64)


def decode_attention_paged(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    page_table: torch.Tensor,
    window_starts: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    **kwargs,
) -> torch.Tensor:
    """Decode over a page table: request ``b`` attends tokens ``[window_starts[b], seq_lens[b])``.

    ``page_table[b, j]`` is the pool page of the window's ``j``-th page (``window_starts[b] // page_size``
    is page 0). Keyword arguments are those of :func:`decode_attention`.
    """
    counts = (seq_lens.long() - window_starts.long()).clamp(min=0)
    slots = [page_table_slots(page_table[b], page_size, int(window_starts[b]), int(counts[b])) for b in range(q.shape[0])]
    kv_indptr = torch.zeros(q.shape[0] + 1, dtype=torch.int64)
    kv_indptr[1:] = torch.cumsum(counts.cpu(), 0)
    kv_indices = torch.cat(slots) if slots else torch.zeros(0, dtype=torch.int64)
    return decode_attention(q, k_buffer, v_buffer, kv_indptr, kv_indices, **kwargs)


def extend_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    *,
    window_left: int,
    sm_scale: float,
    causal: bool = True,
    custom_mask: torch.Tensor | None = None,
    mask_indptr: torch.Tensor | None = None,
    q_positions: torch.Tensor | None = None,
    logit_cap: float = 0.0,
    sinks: torch.Tensor | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
) -> torch.Tensor:
    """Extend (prefill, chunked prefill, verify): new tokens attend a cached window prefix and each other.

    Request ``b`` has ``E = qo_indptr[b+1] - qo_indptr[b]`` new tokens at positions ``P + i`` after a
    prefix of length ``P = prefix_lens[b]``. Its cached keys are the slots
    ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``, which hold positions ``[max(0, P - W), P)`` (built by
    ``reference.indices.extend_window_indices``). New token ``i`` then attends:

    - cached key at position ``k`` when ``P + i - k <= W`` (all of them for ``W = -1``);
    - new key ``j``: ``j <= i`` when ``causal`` (a chain), every ``j`` when not (a draft block that is
      proposed at once), or ``custom_mask`` when given (tree verify); always within the window by
      position.

    ``custom_mask`` is flat and covers the new tokens only: request ``b``'s ``[E, E]`` boolean block
    (row = query, column = new key) starts at ``mask_indptr[b]``; the cached prefix is committed and
    visible to every draft, subject to the window. (SGLang's masks also span the whole prefix; the
    backend keeps their last ``E`` columns.) ``q_positions`` (flat `[T]`) overrides ``P + i``
    for the window test (tree drafts sit at ``P + depth``).

    Args:
        q (torch.Tensor): new queries `[T, HQ, D]`, packed by ``qo_indptr`` `[B + 1]`.
        k (torch.Tensor): new keys `[T, H, D]`; ``v`` new values `[T, H, Dv]`.
        k_buffer (torch.Tensor): the layer's key pool `[slots, H, D]`; ``v_buffer`` likewise.

    Returns:
        torch.Tensor: `[T, HQ, Dv]` in float64.
    """
    window_left = check_window_left(window_left)
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.float64, device=q.device)
    for b in range(len(qo_indptr) - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        if q1 == q0:
            continue
        slots = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])]
        prefix = int(prefix_lens[b])
        start = extend_window_start(prefix, window_left)
        if len(slots) != prefix - start:
            raise ValueError(f"request {b}: {len(slots)} cached indices for the window [{start}, {prefix})")
        k_pos = torch.cat([torch.arange(start, prefix), prefix + torch.arange(q1 - q0)]).to(q.device)
        q_pos = prefix + torch.arange(q1 - q0, device=q.device)
        if q_positions is not None:
            q_pos = q_positions[q0:q1].to(q.device).long()
            k_pos[len(slots) :] = q_pos
        mask = window_mask(q_pos, k_pos, window_left, causal=False)
        n_new = q1 - q0
        if custom_mask is not None:
            m0 = int(mask_indptr[b])
            block = custom_mask[m0 : m0 + n_new * n_new].reshape(n_new, n_new)
            mask[:, len(slots) :] &= block.to(q.device).bool()
        elif causal:
            mask[:, len(slots) :] &= torch.ones(n_new, n_new, dtype=torch.bool, device=q.device).tril()
        kk = torch.cat([dequantize(gather_kv(k_buffer, slots), k_scale), dequantize(k[q0:q1], None)])
        vv = torch.cat([dequantize(gather_kv(v_buffer, slots), v_scale), dequantize(v[q0:q1], None)])
        out[q0:q1] = attention(q[q0:q1], kk, vv, mask, sm_scale=sm_scale, logit_cap=logit_cap, sinks=sinks)
    return out
