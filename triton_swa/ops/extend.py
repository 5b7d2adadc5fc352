"""Paged sliding-window extend: prefill, chunked prefill, draft extend and speculative verify.

Request ``b`` brings ``E = qo_indptr[b+1] - qo_indptr[b]`` new tokens at positions ``P + i`` after a
committed prefix of ``P = prefix_lens[b]`` tokens. The new tokens attend

- the cached window prefix, positions ``[max(0, P - W), P)``, read from the KV pool through either a
  CSR index list (``kv_indptr``/``kv_indices``, as built by ``extend_window_indices``) or a page table
  (``page_table``/``window_starts``, as built by ``window_page_table``); a cached key at position ``k``
  is seen by new token ``i`` when ``P + i - k <= W``;
- each other, from the contiguous ``k``/``v`` of the step: causally (a prompt chunk, a draft chain),
  all at once (``causal=False``: a draft block proposed together), or through a per-request ``[E, E]``
  ``custom_mask`` (tree verify), always within the window by position.

``reference.extend_attention`` is the meaning of this op.

Work is proportional to ``tokens x min(W + 1, context)``: every program owns one query tile of one
request and one group of query heads, and visits only the key tiles that intersect its rows' windows,
in up to five loops: new-key tiles every row sees (no mask), prefix tiles every row sees (no mask),
then the masked ones: prefix tiles on the window's lower edge, new-key tiles on the lower edge (or,
with ``edge_in_loop``, inside the first loop behind a branch), and the causal diagonal, in tiles as
narrow as the query tile's own tokens (16 keys at least). Index entries outside ``[max(0, P - W), P)``
are never read.

Split-KV (``num_splits``, chosen by ``extend_num_splits`` from host ints): where the programs alone
leave most SMs idle (verify and short extends at small batch), each query tile's cached-prefix tiles
are divided among ``num_splits`` programs (the split index rides on grid axis 0 with the query tile);
the last split also takes the new keys. Splits write float32 partials with their log2-sum-exp2 in
decode's layout and decode's merge (``_swa_decode_merge``) combines them and adds the sinks.
Prefill and large batches keep one program per tile, which streams its whole window.

GQA packing: a tile's rows are ``BLOCK_M // GP`` tokens times ``GP`` query heads of one KV head
(``GP`` divides the group size), so each K/V tile loaded serves ``GP`` heads, as in decode; with one
token per request (decode-like extend) or a few drafts (verify) a single tile holds the whole request
and its window is streamed once per KV head.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .._checks import (
    check_grid,
    check_int,
    check_kv_scale,
    check_logit_cap,
    check_sm_scale,
    check_tensor,
    check_window_left,
)
from . import _poison
from .decode import MAX_SPLITS, MERGE_TILE, _device_sizes, _fold_sink, _Launch, _swa_decode_merge
from ..guard import check_swa_extend, guarded

__all__ = ["ExtendConfig", "extend_config", "extend_grid", "extend_num_splits", "extend_resident_programs",
           "swa_extend"]

_Q_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_INDEX_DTYPES = (torch.int32, torch.int64)
_MAX_HEAD_DIM = 512
# Split-KV (extend_num_splits): fewest cached-prefix key tiles per split, and most programs counted as
# running at once on one SM. Estimates to tune on the GPU (bench_extend.py --verify-splits).
SPLIT_MIN_TILES = 1
SPLIT_RESIDENT = 2


@triton.jit
def _load_2d(ptrs, m_rows, m_cols, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Load a tile, masking rows and/or columns only where the constexpr flags ask for it."""
    if ROWS:
        if COLS:
            x = tl.load(ptrs, mask=m_rows[:, None] & m_cols[None, :], other=0.0)
        else:
            x = tl.load(ptrs, mask=m_rows[:, None], other=0.0)
    else:
        if COLS:
            x = tl.load(ptrs, mask=m_cols[None, :], other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def _swa_extend_tiles(
    acc, m_i, l_i, b_q,
    s_begin, s_end, qk_scale, v_scale, logit_cap,
    K_SRC, V_SRC, stride_kt, stride_kh, stride_vt, stride_vh,
    KV_INDICES, kv_end, PAGE_TABLE, page_base, ws_page,
    CUSTOM_MASK, mask_off, Q_POS, q_start,
    i_kvh, P, E, lo, window_left,
    o_i, r_i, o_n, o_d, o_dv, m_d, m_dv,
    PREFIX: tl.constexpr, MASKED: tl.constexpr, PAGED: tl.constexpr, PAGE: tl.constexpr,
    WINDOW: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_QPOS: tl.constexpr,
    SOFTCAP: tl.constexpr, KV_SCALE: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
    BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr, EDGE: tl.constexpr = False, edge_end=0,
):
    """Online-softmax update of one query tile with the key tiles ``[s_begin, s_end)``.

    Key indices ``j`` are relative to the first new token: the cached prefix is ``j < 0`` (position
    ``P + j``, read through the index list or page table), the new keys are ``0 <= j < E`` (read from
    the step's contiguous ``k``/``v``). Scores are in log2 units (``qk_scale`` holds ``log2(e)``,
    and must be positive: it is applied to the row max before the exponent).
    Unmasked calls (``MASKED=False``) must only cover tiles that every row of the tile fully sees.
    ``EDGE`` (an unmasked call over causal new keys): the tiles below ``edge_end`` are the window's
    lower edge and get its mask by a branch inside the loop, so that one pipelined loop streams the
    edge and the tiles every row sees (a separate one-tile loop restarts the load pipeline).
    """
    if not PREFIX:
        # new keys are contiguous rows: a scalar base pointer per tile plus fixed in-tile offsets
        o_kt = o_n[:, None] * stride_kt + o_d[None, :]
        o_vt = o_n[:, None] * stride_vt + o_dv[None, :]
    # Masks by position as per-row bounds on j ([BLOCK_M]), hoisted out of the loop: inside, a tile
    # compares its column offsets o_n against the bounds shifted by the tile start (two compares per
    # score instead of the differences of positions).
    SIMPLE: tl.constexpr = PREFIX or not (HAS_MASK or HAS_QPOS)
    if PREFIX:
        b_lb = tl.zeros_like(r_i) + lo
        if WINDOW:
            b_lb = tl.maximum(b_lb, r_i - window_left)
        b_ub = tl.zeros_like(r_i) - 1
    else:
        b_lb = tl.zeros_like(o_i)
        if WINDOW:
            b_lb = o_i - window_left
        b_ub = tl.zeros_like(o_i) + E - 1
        if CAUSAL:
            b_ub = tl.minimum(o_i, E - 1)
    for s in range(s_begin, s_end, BLOCK_N):
        o_j = s + o_n
        # [BLOCK_N]
        if PREFIX:
            m_key = o_j >= lo
            if PAGED:
                pos = P + o_j
                if MASKED:
                    pos = tl.where(m_key, pos, P - 1)
                p_page = PAGE_TABLE + page_base + (pos // PAGE - ws_page)
                if MASKED:
                    b_page = tl.load(p_page, mask=m_key, other=0)
                else:
                    b_page = tl.load(p_page)
                b_slot = b_page.to(tl.int64) * PAGE + (pos % PAGE)
            else:
                if MASKED:
                    b_slot = tl.load(KV_INDICES + kv_end + o_j, mask=m_key, other=0).to(tl.int64)
                else:
                    b_slot = tl.load(KV_INDICES + kv_end + o_j).to(tl.int64)
            p_k = K_SRC + b_slot[:, None] * stride_kt + i_kvh * stride_kh + o_d[None, :]
            p_v = V_SRC + b_slot[:, None] * stride_vt + i_kvh * stride_vh + o_dv[None, :]
        else:
            m_key = o_j < E
            i_t = tl.cast(q_start + s, tl.int64)
            p_k = K_SRC + (i_t * stride_kt + i_kvh * stride_kh) + o_kt
            p_v = V_SRC + (i_t * stride_vt + i_kvh * stride_vh) + o_vt
        # [BLOCK_N, BLOCK_D]
        b_k = _load_2d(p_k, m_key, m_d, MASKED, not EVEN_D)
        # [BLOCK_M, BLOCK_N]
        b_s = tl.dot(b_q, tl.trans(b_k.to(b_q.dtype)), input_precision=DOT_PREC)
        if SOFTCAP:
            # cap * tanh(s / cap), with tanh(x) = 2 * sigmoid(2x) - 1 (no tanh in the interpreter)
            b_s = logit_cap * (2.0 * tl.sigmoid(b_s * (2.0 * qk_scale / logit_cap)) - 1.0) * 1.4426950408889634
            s_scale = 1.0
        else:
            # the scale is applied to the row max and fused into the exponent's FFMA below
            s_scale = qk_scale
        if MASKED and SIMPLE:
            # lb <= j <= ub, with j = s + o_n; the prefix's ub (-1) holds by the tile range
            m_s = o_n[None, :] >= (b_lb - s)[:, None]
            if not PREFIX:
                m_s = m_s & (o_n[None, :] <= (b_ub - s)[:, None])
            b_s = tl.where(m_s, b_s, float("-inf"))
        elif MASKED:
            # new keys of a tree (positions of their own) or under a custom mask
            m_s = m_key[None, :]
            if WINDOW:
                if HAS_QPOS:
                    r_j = tl.load(Q_POS + q_start + o_j, mask=m_key, other=0).to(tl.int32) - P
                    m_s = m_s & (r_i[:, None] - r_j[None, :] <= window_left)
                else:
                    m_s = m_s & (o_j[None, :] >= b_lb[:, None])
            if HAS_MASK:
                p_cm = CUSTOM_MASK + mask_off + o_i.to(tl.int64)[:, None] * E + o_j[None, :]
                b_cm = tl.load(p_cm, mask=(o_i < E)[:, None] & m_key[None, :], other=0)
                m_s = m_s & (b_cm != 0)
            elif CAUSAL:
                m_s = m_s & (o_j[None, :] <= o_i[:, None])
            b_s = tl.where(m_s, b_s, float("-inf"))
        if EDGE:
            if s < edge_end:
                b_s = tl.where(o_n[None, :] >= (b_lb - s)[:, None], b_s, float("-inf"))
        # [BLOCK_M]
        m_ij = tl.maximum(m_i, tl.max(b_s, 1) * s_scale)
        if MASKED or EDGE:
            # a row with no visible key yet keeps m = -inf; subtract 0 instead so that exp2 gives 0, not NaN
            m_ij_safe = tl.where(m_ij == float("-inf"), 0.0, m_ij)
        else:
            m_ij_safe = m_ij
        if SOFTCAP:
            b_p = tl.math.exp2(b_s - m_ij_safe[:, None])
        else:
            # One FFMA of the unrounded b_s * s_scale against the rounded row max: past |s| ~ 2^31 (log2
            # units) the row's own maximum can come out a few hundred million above 0, beyond exp2's
            # range (inf, then NaN); the min keeps it at 0, where it belongs.
            b_p = tl.math.exp2(tl.minimum(b_s * s_scale - m_ij_safe[:, None], 0.0))
        alpha = tl.math.exp2(m_i - m_ij_safe)
        l_i = l_i * alpha + tl.sum(b_p, 1)
        acc = acc * alpha[:, None]
        # [BLOCK_N, BLOCK_DV]
        b_v = _load_2d(p_v, m_key, m_dv, MASKED, not EVEN_DV)
        if KV_SCALE:
            b_p = b_p * v_scale
        acc = tl.dot(b_p.to(b_q.dtype), b_v.to(b_q.dtype), acc, input_precision=DOT_PREC)
        m_i = m_ij
    return acc, m_i, l_i


@triton.jit
def _swa_extend_kernel(
    Q, K, V, K_BUF, V_BUF, O, PART,
    QO_INDPTR, PREFIX_LENS,
    KV_INDPTR, KV_INDICES, PAGE_TABLE, WINDOW_STARTS,
    CUSTOM_MASK, MASK_INDPTR, Q_POS, SINKS,
    k_scale, v_scale, sm_scale, logit_cap, window_left, num_splits, lse_offset, HQ,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_bkt, stride_bkh, stride_bvt, stride_bvh, stride_ot, stride_oh, stride_pt,
    G: tl.constexpr, GP: tl.constexpr,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_N_DIAG: tl.constexpr,
    PAGED: tl.constexpr, PAGE: tl.constexpr,
    WINDOW: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_QPOS: tl.constexpr,
    SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr, KV_SCALE: tl.constexpr, SCALE_PTR: tl.constexpr,
    DOT_PREC: tl.constexpr, SPLIT: tl.constexpr, EDGE_IN_LOOP: tl.constexpr, UPCAST_DOT: tl.constexpr,
):
    """One program: ``BLOCK_M // GP`` new tokens x ``GP`` query heads of request ``program_id(2)``.

    ``SPLIT``: ``program_id(0)`` is ``query tile * num_splits + split``. Split ``s`` takes its share of
    the cached-prefix tiles (``ceil(tiles / num_splits)`` whole tiles each, oldest first, so the last
    splits of a short prefix may be empty) and the last split also takes every new-key tile; each
    writes float32 partials to ``PART`` in decode's layout: the output over its keys normalised by its
    own denominator at ``[T, HQ, num_splits, Dv]``, its log2-sum-exp2 at ``lse_offset + [T, HQ,
    num_splits]`` (zeros and ``-inf`` for an empty split). The sinks are then left to the merge.
    """
    TOK: tl.constexpr = BLOCK_M // GP
    EVEN_D: tl.constexpr = D == BLOCK_D
    EVEN_DV: tl.constexpr = DV == BLOCK_DV
    if SPLIT:
        i_m = tl.program_id(0) // num_splits
        i_s = tl.program_id(0) % num_splits
    else:
        i_m = tl.program_id(0)
    i_hg = tl.program_id(1)
    i_b = tl.program_id(2)

    q_start = tl.load(QO_INDPTR + i_b).to(tl.int32)
    E = tl.load(QO_INDPTR + i_b + 1).to(tl.int32) - q_start
    m0 = i_m * TOK
    if m0 >= E:
        return
    P = tl.load(PREFIX_LENS + i_b).to(tl.int32)
    m_last = tl.minimum(m0 + TOK, E) - 1

    o_m = tl.arange(0, BLOCK_M)
    o_i = m0 + o_m // GP
    o_h = i_hg * GP + o_m % GP
    i_kvh = (i_hg * GP) // G
    m_row = (o_i < E) & (o_m < TOK * GP)
    o_n = tl.arange(0, BLOCK_N)
    o_d = tl.arange(0, BLOCK_D)
    o_dv = tl.arange(0, BLOCK_DV)
    m_d = o_d < D
    m_dv = o_dv < DV

    # [BLOCK_M, BLOCK_D]
    o_qt = (q_start + o_i).to(tl.int64)
    p_q = Q + o_qt[:, None] * stride_qt + o_h[:, None] * stride_qh + o_d[None, :]
    b_q = tl.load(p_q, mask=m_row[:, None] & m_d[None, :], other=0.0)
    if UPCAST_DOT:
        # The interpreter multiplies bf16 dot operands as raw bits (SPEC §8): every dot takes b_q's
        # dtype, so float32 here makes them all float32 (interpreter only; compiled code never sets it).
        b_q = b_q.to(tl.float32)

    # Row positions relative to P (r_i), and the tile's first/last row positions.
    if HAS_QPOS:
        r_i = tl.load(Q_POS + q_start + o_i, mask=m_row, other=0).to(tl.int32) - P
        r_min = tl.min(tl.where(m_row, r_i, 2147483647), 0)
        r_max = tl.max(tl.where(m_row, r_i, -2147483647), 0)
    else:
        r_i = o_i
        r_min = m0
        r_max = m_last

    if SCALE_PTR:
        ks = tl.load(k_scale).to(tl.float32)
        vs = tl.load(v_scale).to(tl.float32)
    else:
        ks = k_scale
        vs = v_scale
    qk_scale = sm_scale * 1.4426950408889634
    if SOFTCAP:
        qk_scale = sm_scale

    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    # ---- cached prefix: keys j in [lo, 0), j = position - P ----
    if PAGED:
        first = tl.load(WINDOW_STARTS + i_b).to(tl.int32)
        ws_page = first // PAGE
        page_base = i_b.to(tl.int64) * stride_pt
        kv_end = 0
    else:
        kv_end = tl.load(KV_INDPTR + i_b + 1).to(tl.int32)
        first = P - (kv_end - tl.load(KV_INDPTR + i_b).to(tl.int32))
        ws_page = 0
        page_base = 0
    lo = tl.maximum(first, 0) - P
    if WINDOW:
        lo = tl.maximum(lo, r_min - window_left)
    lo = tl.minimum(lo, 0)
    # prefix tiles end at j = 0; the lowest one starts at -ceil(-lo / BLOCK_N) * BLOCK_N
    s_lo = -((-lo + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
    # first tile that every row sees whole: all its keys at or after both lo and r_max - W
    x = lo
    if WINDOW:
        x = tl.maximum(x, r_max - window_left)
    s_mid = tl.where(x >= 0, 0, -((-x) // BLOCK_N) * BLOCK_N)
    s_mid = tl.maximum(s_mid, s_lo)
    # prefix tiles every row sees [pu_lo, pu_hi) and edge tiles [pm_lo, pm_hi)
    pu_lo = s_mid
    pu_hi = 0
    pm_lo = s_lo
    pm_hi = s_mid
    if SPLIT:
        # this split's whole tiles [p_lo, p_hi) of [s_lo, 0), from the oldest; past the end it is empty
        per = (((0 - s_lo) // BLOCK_N + num_splits - 1) // num_splits) * BLOCK_N
        p_lo = s_lo + i_s * per
        p_hi = tl.minimum(p_lo + per, 0)
        pu_lo = tl.maximum(s_mid, p_lo)
        pu_hi = p_hi
        pm_lo = p_lo
        pm_hi = tl.minimum(s_mid, p_hi)
    pre_scale = qk_scale
    if KV_SCALE:
        pre_scale = qk_scale * ks

    # ---- new keys j in [0, E) from the step's contiguous k/v ----
    if CAUSAL and not HAS_MASK and not HAS_QPOS:
        # The diagonal keys from n_diag to m_last in tiles of BLOCK_N_DIAG (masked); below them BLOCK_N
        # tiles: the lower edge (masked) from n_lo, then from n_mid those every row sees (no mask).
        # The tiles are aligned on m0 where the lowest one stays at or above key 0, so that a tile of
        # TOK tokens computes about TOK + W + 1 keys per row, not up to TOK + W + 2 * BLOCK_N with
        # 0-aligned tiles (1040 keys, not 1088, for 16 tokens at W 1023). Near the start of a prompt
        # they are aligned on 0, and the diagonal loop covers [m0 rounded down, m_last].
        n_first = 0
        y = 0
        if WINDOW:
            n_first = tl.maximum(m0 - window_left, 0)
            y = tl.maximum(m_last - window_left, 0)
        n_lo = m0 - ((m0 - n_first + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
        aligned = n_lo >= 0
        n_diag = tl.where(aligned, m0, (m0 // BLOCK_N) * BLOCK_N)
        n_lo = tl.where(aligned, n_lo, (n_first // BLOCK_N) * BLOCK_N)
        n_mid = tl.where(aligned, m0 - (tl.maximum(m0 - y, 0) // BLOCK_N) * BLOCK_N,
                         tl.minimum(tl.maximum(((y + BLOCK_N - 1) // BLOCK_N) * BLOCK_N, n_lo), n_diag))
        n_hi = m_last + 1
    else:
        # one masked loop from the tile holding the earliest key any row sees
        n_lo = 0
        if WINDOW:
            if not HAS_QPOS:
                n_lo = (tl.maximum(m0 - window_left, 0) // BLOCK_N) * BLOCK_N
        n_mid = n_lo
        n_diag = n_lo
        n_hi = E
        if CAUSAL and not HAS_MASK:
            n_hi = m_last + 1
    if SPLIT:
        # the new keys belong to the last split (the one with the fewest prefix tiles); others skip them
        own = i_s == num_splits - 1
        n_lo = tl.where(own, n_lo, 0)
        n_mid = tl.where(own, n_mid, 0)
        n_diag = tl.where(own, n_diag, 0)
        n_hi = tl.where(own, n_hi, 0)
    mask_off = 0
    if HAS_MASK:
        mask_off = tl.load(MASK_INDPTR + i_b).to(tl.int64)

    # Order of the loops: new keys unmasked, prefix unmasked, then the masked ones (prefix edge, new
    # edge, diagonal). The softmax does not care, but ptxas serialises every wgmma of the kernel
    # (C7515, about half the tensor-core throughput on Hopper) when a masked loop's accumulator flows
    # into an unmasked one, or a gathered fp8 prefix loop into the new-key loop. EDGE_IN_LOOP (causal
    # new keys only) streams the new-key lower edge inside the first loop instead.
    n_start = n_mid
    if EDGE_IN_LOOP:
        n_start = n_lo
    acc, m_i, l_i = _swa_extend_tiles(
        acc, m_i, l_i, b_q, n_start, n_diag, qk_scale, 1.0, logit_cap,
        K, V, stride_kt, stride_kh, stride_vt, stride_vh,
        KV_INDICES, kv_end, PAGE_TABLE, page_base, ws_page,
        CUSTOM_MASK, mask_off, Q_POS, q_start, i_kvh, P, E, lo, window_left,
        o_i, r_i, o_n, o_d, o_dv, m_d, m_dv,
        False, False, PAGED, PAGE, WINDOW, CAUSAL, HAS_MASK, HAS_QPOS,
        SOFTCAP, False, EVEN_D, EVEN_DV, BLOCK_N, DOT_PREC, EDGE_IN_LOOP, n_mid,
    )
    acc, m_i, l_i = _swa_extend_tiles(
        acc, m_i, l_i, b_q, pu_lo, pu_hi, pre_scale, vs, logit_cap,
        K_BUF, V_BUF, stride_bkt, stride_bkh, stride_bvt, stride_bvh,
        KV_INDICES, kv_end, PAGE_TABLE, page_base, ws_page,
        CUSTOM_MASK, 0, Q_POS, q_start, i_kvh, P, E, lo, window_left,
        o_i, r_i, o_n, o_d, o_dv, m_d, m_dv,
        True, False, PAGED, PAGE, WINDOW, CAUSAL, HAS_MASK, HAS_QPOS,
        SOFTCAP, KV_SCALE, EVEN_D, EVEN_DV, BLOCK_N, DOT_PREC,
    )
    acc, m_i, l_i = _swa_extend_tiles(
        acc, m_i, l_i, b_q, pm_lo, pm_hi, pre_scale, vs, logit_cap,
        K_BUF, V_BUF, stride_bkt, stride_bkh, stride_bvt, stride_bvh,
        KV_INDICES, kv_end, PAGE_TABLE, page_base, ws_page,
        CUSTOM_MASK, 0, Q_POS, q_start, i_kvh, P, E, lo, window_left,
        o_i, r_i, o_n, o_d, o_dv, m_d, m_dv,
        True, True, PAGED, PAGE, WINDOW, CAUSAL, HAS_MASK, HAS_QPOS,
        SOFTCAP, KV_SCALE, EVEN_D, EVEN_DV, BLOCK_N, DOT_PREC,
    )
    if not EDGE_IN_LOOP:
        acc, m_i, l_i = _swa_extend_tiles(
            acc, m_i, l_i, b_q, n_lo, n_mid, qk_scale, 1.0, logit_cap,
            K, V, stride_kt, stride_kh, stride_vt, stride_vh,
            KV_INDICES, kv_end, PAGE_TABLE, page_base, ws_page,
            CUSTOM_MASK, mask_off, Q_POS, q_start, i_kvh, P, E, lo, window_left,
            o_i, r_i, o_n, o_d, o_dv, m_d, m_dv,
            False, True, PAGED, PAGE, WINDOW, CAUSAL, HAS_MASK, HAS_QPOS,
            SOFTCAP, False, EVEN_D, EVEN_DV, BLOCK_N, DOT_PREC,
        )
    acc, m_i, l_i = _swa_extend_tiles(
        acc, m_i, l_i, b_q, n_diag, n_hi, qk_scale, 1.0, logit_cap,
        K, V, stride_kt, stride_kh, stride_vt, stride_vh,
        KV_INDICES, kv_end, PAGE_TABLE, page_base, ws_page,
        CUSTOM_MASK, mask_off, Q_POS, q_start, i_kvh, P, E, lo, window_left,
        o_i, r_i, tl.arange(0, BLOCK_N_DIAG), o_d, o_dv, m_d, m_dv,
        False, True, PAGED, PAGE, WINDOW, CAUSAL, HAS_MASK, HAS_QPOS,
        SOFTCAP, False, EVEN_D, EVEN_DV, BLOCK_N_DIAG, DOT_PREC,
    )

    if SPLIT:
        # partial output over this split's keys (v_scale already in P) and its log2-sum-exp2
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        b_lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        # [BLOCK_M, BLOCK_DV]
        b_o = acc / l_safe[:, None]
        o_row = (o_qt * HQ + o_h) * num_splits + i_s
        tl.store(PART + lse_offset + o_row, b_lse, mask=m_row)
        tl.store(PART + o_row[:, None] * DV + o_dv[None, :], b_o, mask=m_row[:, None] & m_dv[None, :])
    else:
        if HAS_SINKS:
            # the sink joins the denominator only; a row with no visible key stays all zeros
            b_sink = tl.load(SINKS + o_h).to(tl.float32) * 1.4426950408889634
            m_i, l_i, alpha = _fold_sink(m_i, l_i, b_sink)
            acc = acc * alpha[:, None]
        b_o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        # [BLOCK_M, BLOCK_DV]
        p_o = O + o_qt[:, None] * stride_ot + o_h[:, None] * stride_oh + o_dv[None, :]
        tl.store(p_o, b_o.to(O.dtype.element_ty), mask=m_row[:, None] & m_dv[None, :])


@triton.jit
def _swa_extend_merge_kernel(
    PART, SINKS, O, QO_INDPTR,
    num_splits, lse_offset, stride_ot, stride_oh, HQ, B,
    DV: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_SINKS: tl.constexpr,
):
    """One program per (token, query head): decode's merge of the split partials (plus the sink).

    Decode's merge kernel writes every row it is launched over; this one first drops tokens outside
    ``[qo_indptr[0], qo_indptr[B])`` (CUDA-graph padding past the requests, whose partials nobody
    wrote), so that those rows of ``O`` keep what they held, as without splits.
    """
    i_th = tl.program_id(0)
    i_t = i_th // HQ
    if (i_t < tl.load(QO_INDPTR)) | (i_t >= tl.load(QO_INDPTR + B)):
        return
    # [1]
    o_hq = i_th % HQ + tl.arange(0, 1)
    _swa_decode_merge(PART, SINKS, O, i_t.to(tl.int64), o_hq.to(tl.int64), o_hq < HQ, num_splits, lse_offset,
                      stride_ot, stride_oh, HQ, DV, 1, BLOCK_S, BLOCK_DV, HAS_SINKS, "")


@dataclass(frozen=True)
class ExtendConfig:
    """Tile shape and launch knobs of one extend launch.

    ``block_m`` rows per program (``block_m // pack`` tokens x ``pack`` query heads of one KV head),
    ``block_n`` keys per inner step, ``pack`` query heads per tile (divides the GQA group size),
    ``edge_in_loop``: causal launches stream the window's lower-edge key tiles inside the main loop
    (masked by a branch) rather than in a loop of their own.
    """

    block_m: int
    block_n: int
    pack: int
    num_warps: int
    num_stages: int
    edge_in_loop: bool = False


def _pow2_divisor(n: int) -> int:
    return n & -n


def extend_config(head_dim: int, v_head_dim: int, group: int, max_extend_len: int,
                  dtype: torch.dtype = torch.bfloat16, interpret: bool = False) -> ExtendConfig:
    """Default tile shape for an extend launch, from the head dims, GQA group and longest request.

    Why these numbers (Hopper-class budget: 227 KB shared memory, 255 registers per thread; every
    default below compiles for sm_90 without register spills and with asynchronous wgmma, checked
    with ptxas; ``bench/bench_extend.py --sweep`` times the alternatives):

    - ``pack``: all query heads of a KV head that a power of two can hold share one tile, so a K/V
      tile loaded from the pool serves the whole group (decode's GQA packing) and a tile spans fewer
      tokens, which trims the masked diagonal and window-edge work of long prompts.
    - Long prompts are compute bound. ``D <= 128``: 64 rows over 4 warps with 64-key tiles (the
      H200 sweep of 2026-11-29 at N = 8192, W = 1023, 32/8 heads: 308 TFLOP/s against 287 for 128
      rows over 8 warps; ``bench/results/extend-sweep-*``). ``D = 256``: ``block_m`` 128 rows over 8
      warps (two warpgroups of 64 rows for wgmma) keeps the tensor cores fed; ``block_n`` halves so
      that the fp32 accumulator (``block_m x Dv``) and the score tile stay in registers, with two
      K/V stages in shared memory. ``D = 512`` drops to 32-row tiles: a 64-row wgmma tile spills.
    - ``edge_in_loop`` on at ``D = 256`` only: streaming the window's lower edge inside the main
      loop took the D 256 prefill from 316-317 to 341-348 TFLOP/s, and changed nothing measurable
      at D 128 (283-291 against 272-290, alternated in one run;
      ``bench/results/extend-sweep-edge-2026-11-29-NVIDIA_H200.log``), where it costs registers.
    - Verify and short extends (few tokens per request): ``block_m`` shrinks to the request's rows
      (tokens x packed heads) so that no program streams the window for padding rows; the window
      is then read once per KV head, as in decode, with 4 warps (8 at ``D = 512``).
    - fp32 inputs (tests, reference-grade runs) use smaller tiles: fp32 tiles take twice the space.
    - Pointer loads, not TMA: loading the new-key tiles through Hopper tensor descriptors freed
      address registers (ptxas for sm_90 at the D = 128 tiles: 244 instead of 255) but ran slower on
      the H200 (N = 8192, W = 1023, D = 128: 194-210 TFLOP/s against 269-301; commit c5a2bd1 and
      its sweep), so that path was removed again.
    - Under Triton's interpreter, which pays per element rather than per instruction, the smallest
      legal tiles.
    """
    d = max(head_dim, v_head_dim)
    if interpret:
        pack = min(_pow2_divisor(group), 16)
        return ExtendConfig(16, 16, pack, 1, 1)
    edge = False
    if d <= 128:
        block_m, block_n, warps, stages = 64, 64, 4, 3
    elif d <= 256:
        block_m, block_n, warps, stages, edge = 128, 32, 8, 2, True
    else:
        block_m, block_n, warps, stages = 32, 32, 8, 2
    if dtype == torch.float32:
        block_m, block_n, stages = max(16, block_m // 2), max(16, block_n // 2), min(stages, 2)
    pack = min(_pow2_divisor(group), block_m)
    rows = max(1, max_extend_len) * pack
    if rows < block_m:
        # a short request: one tile holds it whole; tiles below 16 rows do not map to tensor cores
        block_m = max(16, triton.next_power_of_2(rows))
        block_n = 64 if d <= 128 else 32
        warps = 4 if d <= 256 else 8
        stages = 3 if d <= 128 else 2
    return ExtendConfig(block_m, block_n, pack, warps, stages, edge)


def extend_num_splits(programs: int, max_window: int, block_n: int, num_sms: int,
                      resident: int = SPLIT_RESIDENT) -> int:
    """Splits of each program's cached-prefix window, from host ints only (CUDA-graph capturable).

    ``programs`` is the launch's unsplit grid (query tiles of the longest request x query-head groups
    x requests), ``max_window`` a host bound on the cached prefix keys any request reads, ``block_n``
    the key tile, ``num_sms`` the GPU's SM count and ``resident`` the programs one SM runs at once
    (the launcher passes ``min(SPLIT_RESIDENT, what shared memory holds)``: one at 512-wide heads).

    - Split only where the programs alone leave at least half the SMs idle (``2 * programs <=
      num_sms``): speculative verify and short extends at small batch, which are latency bound (one
      program streams its whole window serially: B 1, 8 drafts, W 1023, 32/8 heads, D 128 is 8
      programs on 132 SMs, 30-38 us on the H200 against 7.2 us for decode over the same window).
      Prefills and large batches keep the unsplit kernel, untouched.
    - Then fill about ``resident`` programs per SM (two verify-sized tiles fit one SM's shared
      memory and registers up to 256-wide heads), down to ``SPLIT_MIN_TILES`` (one) key tile per
      split, at most ``MAX_SPLITS``. On 132 SMs, W 1023, D 128 (1024 keys, 16 tiles of 64): 16
      splits at B 1 (8 programs), 4 at B 8 (64 programs), none at B 64.

    Measured on the H200 (``bench/bench_extend.py --verify-splits 1,2,4,8,16 --quick``; B 1 and 8,
    8 drafts, W 1023, 32/8 heads, D 128, CSR): B 1 takes 37.8 us unsplit, 25.0 / 17.4 / 14.2 / 12.3
    us in 2 / 4 / 8 / 16 splits (one tile each is best: the call is latency bound); B 8 takes 40.2
    us unsplit, 25.5 in 4 splits, 32.0 and 44.0 in 8 and 16 (two and four waves). A prefix-less
    launch (a whole prompt) gains nothing from splits: pass ``max_window=0`` there.
    """
    if programs <= 0 or 2 * programs > num_sms or max_window <= 0:
        return 1
    most = triton.cdiv(max_window, block_n) // SPLIT_MIN_TILES
    return max(1, min(MAX_SPLITS, most, (num_sms * max(1, resident)) // programs))


def extend_resident_programs(block_m: int, block_n: int, num_stages: int, head_dim: int, v_head_dim: int,
                             itemsize: int, smem_per_sm: int) -> int:
    """Programs one SM holds for :func:`extend_num_splits`: as many as shared memory fits (the K/V
    pipeline stages and the query tile), at most ``SPLIT_RESIDENT``."""
    tile_bytes = itemsize * (num_stages * block_n * (head_dim + v_head_dim) + block_m * head_dim)
    return max(1, min(SPLIT_RESIDENT, smem_per_sm // tile_bytes))


def extend_grid(m_tiles: int, num_splits: int, head_groups: int, batch: int, merge_programs: int = 0) -> tuple:
    """The main kernel's grid ``(query tiles x splits, query-head groups, requests)``, checked against
    CUDA's limits (axis 0: 2**31 - 1, axes 1 and 2: 65535) before anything is launched: a batch of
    more than 65535 requests raises ``ValueError`` (split it into several calls). ``merge_programs``
    (tokens x query heads of the split path's merge, one axis) is checked too."""
    check_grid("swa_extend", (merge_programs, 1, 1), ("tokens x query heads (split merge)", "", ""))
    return check_grid("swa_extend", (m_tiles * num_splits, head_groups, batch),
                      ("query tiles x splits", "query-head groups", "the batch (requests)"))


def _check_pow2(name: str, value: int, minimum: int) -> int:
    check_int(name, value, minimum=minimum)
    if value & (value - 1):
        raise ValueError(f"{name} must be a power of two, got {value}")
    return value


@guarded(check_swa_extend)
def swa_extend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    prefix_lens: torch.Tensor,
    *,
    window_left: int,
    kv_indptr: torch.Tensor | None = None,
    kv_indices: torch.Tensor | None = None,
    page_table: torch.Tensor | None = None,
    window_starts: torch.Tensor | None = None,
    page_size: int = 1,
    causal: bool = True,
    custom_mask: torch.Tensor | None = None,
    mask_indptr: torch.Tensor | None = None,
    q_positions: torch.Tensor | None = None,
    sm_scale: float | None = None,
    logit_cap: float = 0.0,
    sinks: torch.Tensor | None = None,
    k_scale: float | torch.Tensor | None = None,
    v_scale: float | torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    max_extend_len: int | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    pack: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    edge_in_loop: bool | None = None,
    max_window: int | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Sliding-window attention of new tokens over their cached window prefix and each other.

    Semantics are those of ``reference.extend_attention``: request ``b`` has ``E`` new tokens at
    positions ``P + i`` (``P = prefix_lens[b]``); new token ``i`` sees cached position ``k`` when
    ``P + i - k <= W`` and new token ``j`` when ``j <= i`` (``causal``), always (``causal=False``) or
    where ``custom_mask`` says (which then replaces ``causal``), within the window by position. A
    row that sees no key (and no sink) is all zeros.

    Args:
        q (torch.Tensor): new queries `[T, HQ, D]`, fp16, bf16 or fp32, packed by ``qo_indptr``.
        k (torch.Tensor): new keys `[T, H, D]` in ``q``'s dtype (``HQ % H == 0``).
        v (torch.Tensor): new values `[T, H, Dv]` in ``q``'s dtype.
        k_buffer (torch.Tensor): the layer's key pool `[slots, H, D]` (or `[pages, page_size, H, D]`),
            ``q``'s dtype or fp8 e4m3 (``float8_e4m3fn`` or its ``uint8`` storage).
        v_buffer (torch.Tensor): the layer's value pool `[slots, H, Dv]`, same dtype as ``k_buffer``.
        qo_indptr (torch.Tensor): int `[B + 1]`, request ``b``'s tokens are ``[qo_indptr[b], qo_indptr[b+1])``.
        prefix_lens (torch.Tensor): int `[B]`, committed tokens before the new ones.
        window_left (int): ``W``; ``-1`` is full attention.
        kv_indptr, kv_indices (torch.Tensor): CSR form of the cached window: request ``b``'s slots
            ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` hold positions ending at ``P - 1``, oldest first
            (``extend_window_indices``); only the last ``min(len, W)`` entries are read.
        page_table, window_starts (torch.Tensor): paged form instead: int32 `[B, max_pages]` and int
            `[B]`; ``page_table[b, j]`` is the pool page of the ``j``-th page of a window that begins at
            position ``window_starts[b]`` (``window_page_table``), so position ``t`` sits at slot
            ``page_table[b, t // page_size - window_starts[b] // page_size] * page_size + t % page_size``.
        page_size (int): tokens per page of the paged form.
        causal (bool): new tokens see earlier new tokens only (prefill, chunk, chain verify);
            ``False`` lets a draft block see all of itself.
        custom_mask (torch.Tensor | None): flat bool/uint8, request ``b``'s row-major `[E, E]` block
            (query row, new-key column) at ``mask_indptr[b]`` (tree verify).
        mask_indptr (torch.Tensor | None): int `[B]` (or `[B + 1]`) offsets into ``custom_mask``.
        q_positions (torch.Tensor | None): int `[T]` absolute positions of the new tokens for the
            window test (tree drafts sit at ``P + depth``); default ``P + i``.
        sm_scale (float | None): score scale, finite and ``> 0``; default ``1 / sqrt(D)``.
        logit_cap (float): soft cap ``cap * tanh(s / cap)`` when ``> 0`` (finite; 0 or None: off).
        sinks (torch.Tensor | None): `[HQ]` one logit per query head, joins the softmax denominator
            (``-inf``: no sink; a row without visible keys gives zeros whatever its sink).
        k_scale, v_scale (float | torch.Tensor | None): per-tensor scales of the cached K/V (fp8
            pools store ``value / scale``): a finite number ``> 0``, or a one-element float device
            tensor read in the kernel (CUDA-graph friendly; its value is checked only by the debug
            guard). The step's new ``k``/``v`` are never scaled.
        out (torch.Tensor | None): `[T, HQ, Dv]` in ``q``'s dtype, written in place; rows of
            requests (tokens ``[qo_indptr[0], qo_indptr[B])``) are written, nothing else. Without
            ``out`` the other rows of the returned tensor are unset (NaN under
            ``TRITON_SWA_POISON=1``).

    The 1-D index tensors (``qo_indptr``, ``prefix_lens``, ``kv_indptr``, ``kv_indices``,
    ``window_starts``, ``q_positions``, ``mask_indptr``, ``custom_mask``) must be contiguous: the
    kernel reads them with unit strides. At most 65535 requests per call (CUDA's grid axis 2).
        max_extend_len (int | None): host bound on ``E`` that sizes the grid. Without it the bound is
            computed from ``qo_indptr`` (one device sync), or is ``T`` while a CUDA graph is captured.
        block_m, block_n, pack, num_warps, num_stages (int | None): override ``extend_config``
            (tests use small blocks to walk multi-tile paths).
        edge_in_loop (bool | None): override ``extend_config``'s choice of streaming a causal
            window's lower edge inside the main key loop.
        max_window (int | None): host bound on the cached prefix keys any request reads, which sizes
            the splits (never read from the device). Default: ``W + 1`` for a sliding window, capped by
            ``kv_indices.numel()`` or ``page_table.shape[1] * page_size``, which alone bound it at
            ``W = -1``. ``0`` (no request has a cached prefix) turns the automatic splits off.
        num_splits (int | None): splits of each query tile's cached prefix (split-KV, at most 64):
            each split streams its share of the prefix tiles and writes float32 partials that a
            second kernel merges (adding the sinks). ``None``: ``extend_num_splits``, which splits
            only launches that leave most SMs idle (verify and short extends at small batch); ``1``
            disables; tests force more to walk the split path on tiny shapes.
        debug (bool | None): check every index this call reads or writes before launching (a host
            sync; ValueError naming request, position and slot); None follows ``TRITON_SWA_DEBUG``
            (see :mod:`triton_swa.guard`).

    Returns:
        torch.Tensor: `[T, HQ, Dv]` in ``q``'s dtype (``out`` when given).

    Raises:
        TypeError: naming the argument, before anything is launched, for a wrong type or dtype.
        ValueError: naming the argument, before anything is launched, for a wrong shape, device,
            stride, window, page size, head ratio or scalar value, or a grid past CUDA's limits.
    """
    _check_tensor_args(q, k, v, k_buffer, v_buffer, qo_indptr, prefix_lens)
    T, HQ, D = q.shape
    H, DV = k.shape[1], v.shape[2]
    dev = q.device
    B = prefix_lens.shape[0]
    if k_buffer.dim() == 4:
        k_buffer = k_buffer.view(-1, *k_buffer.shape[2:])
        v_buffer = v_buffer.view(-1, *v_buffer.shape[2:])
    if k_buffer.dtype == torch.uint8:
        k_buffer = k_buffer.view(torch.float8_e4m3fn)
        v_buffer = v_buffer.view(torch.float8_e4m3fn)
    check_window_left(window_left)
    # Scalars: one rule for every op (_checks); before any tensor is allocated or launched on.
    sm_scale = check_sm_scale(sm_scale, 1.0 / math.sqrt(D))
    logit_cap = check_logit_cap(logit_cap)
    ks, ks_t = check_kv_scale("k_scale", k_scale, dev)
    vs, vs_t = check_kv_scale("v_scale", v_scale, dev)

    paged = page_table is not None or window_starts is not None
    if paged:
        if kv_indptr is not None or kv_indices is not None:
            raise ValueError("give either kv_indptr/kv_indices or page_table/window_starts, not both")
        if page_table is None or window_starts is None:
            raise ValueError("the page-table form needs both page_table and window_starts")
        check_tensor("page_table", page_table, dtype=_INDEX_DTYPES, device=dev, ndim=2)
        if page_table.shape[0] != B:
            raise ValueError(f"page_table must have {B} rows (one per request), got {page_table.shape[0]}")
        if page_table.stride(1) != 1 and page_table.shape[1] > 1:
            raise ValueError("page_table rows must be contiguous (stride 1 along pages)")
        check_tensor("window_starts", window_starts, dtype=_INDEX_DTYPES, device=dev, shape=(B,), contiguous=True)
        check_int("page_size", page_size, minimum=1)
        if k_buffer.shape[0] % page_size:
            raise ValueError(f"k_buffer has {k_buffer.shape[0]} slots, not a whole number of pages of "
                             f"page_size={page_size}")
        kv_indptr_arg, kv_indices_arg = prefix_lens, prefix_lens
        page_table_arg, window_starts_arg, stride_pt = page_table, window_starts, page_table.stride(0)
    else:
        if kv_indptr is None or kv_indices is None:
            raise ValueError("the cached window is missing: give kv_indptr and kv_indices, or page_table and window_starts")
        check_tensor("kv_indptr", kv_indptr, dtype=_INDEX_DTYPES, device=dev, shape=(B + 1,), contiguous=True)
        if isinstance(page_size, bool) or page_size != 1:
            check_int("page_size", page_size, minimum=1)
            raise ValueError(f"page_size must be 1 with CSR indices (they name token slots), got {page_size}; "
                             "pass a page_table for the paged form")
        check_tensor("kv_indices", kv_indices, dtype=_INDEX_DTYPES, device=dev, ndim=1, contiguous=True)
        kv_indptr_arg, kv_indices_arg = kv_indptr, kv_indices
        page_table_arg, window_starts_arg, stride_pt = prefix_lens, prefix_lens, 0
        page_size = 1

    if isinstance(causal, torch.Tensor) or not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    has_mask = custom_mask is not None
    if has_mask:
        check_tensor("custom_mask", custom_mask, dtype=(torch.bool, torch.uint8, torch.int8), device=dev,
                     ndim=1, contiguous=True)
        if mask_indptr is None:
            raise ValueError("custom_mask needs mask_indptr (each request's offset into it)")
        check_tensor("mask_indptr", mask_indptr, dtype=_INDEX_DTYPES, device=dev, ndim=1, contiguous=True)
        if mask_indptr.shape[0] < B:
            raise ValueError(f"mask_indptr must have at least {B} entries, got {mask_indptr.shape[0]}")
        mask_arg = custom_mask.view(torch.uint8) if custom_mask.dtype == torch.bool else custom_mask
        mask_indptr_arg = mask_indptr
    elif mask_indptr is not None:
        raise ValueError("mask_indptr given without custom_mask")
    else:
        mask_arg, mask_indptr_arg = prefix_lens, prefix_lens
    if q_positions is not None:
        check_tensor("q_positions", q_positions, dtype=_INDEX_DTYPES, device=dev, shape=(T,), contiguous=True)
    qpos_arg = q_positions if q_positions is not None else prefix_lens

    if sinks is not None:
        check_tensor("sinks", sinks, dtype=(torch.float32, torch.float16, torch.bfloat16), device=dev,
                     shape=(HQ,), contiguous=True)
    kv_scaled = k_scale is not None or v_scale is not None

    if out is not None:
        check_tensor("out", out, dtype=q.dtype, device=dev, shape=(T, HQ, DV))
        if out.stride(2) != 1:
            raise ValueError("out must be contiguous along its last dimension")

    if max_extend_len is None:
        max_extend_len = _max_extend_len(qo_indptr, T)
    check_int("max_extend_len", max_extend_len, minimum=0)
    if max_window is None:
        max_window = page_table.shape[1] * page_size if paged else kv_indices.numel()
        if window_left >= 0:
            max_window = min(max_window, window_left + 1)
    check_int("max_window", max_window, minimum=0)
    if num_splits is not None:
        check_int("num_splits", num_splits, minimum=1)
        if num_splits > MAX_SPLITS:
            raise ValueError(f"num_splits must be at most {MAX_SPLITS}, got {num_splits}")

    interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"
    # bf16 dots in float32 under the interpreter only (SPEC §8: its bf16 tl.dot is wrong)
    upcast = interpret and q.dtype == torch.bfloat16
    cfg = extend_config(D, DV, HQ // H, max_extend_len, q.dtype, interpret)
    bm = cfg.block_m if block_m is None else _check_pow2("block_m", block_m, 16)
    bn = cfg.block_n if block_n is None else _check_pow2("block_n", block_n, 16)
    gp = min(cfg.pack, bm) if pack is None else check_int("pack", pack, minimum=1)
    if (HQ // H) % gp or bm % gp:
        raise ValueError(f"pack ({gp}) must divide the GQA group size ({HQ // H}) and block_m ({bm})")
    warps = cfg.num_warps if num_warps is None else check_int("num_warps", num_warps, minimum=1)
    stages = cfg.num_stages if num_stages is None else check_int("num_stages", num_stages, minimum=1)
    if edge_in_loop is None:
        edge_in_loop = cfg.edge_in_loop
    elif not isinstance(edge_in_loop, bool):
        raise TypeError(f"edge_in_loop must be a bool, got {type(edge_in_loop).__name__}")
    block_d, block_dv = max(16, triton.next_power_of_2(D)), max(16, triton.next_power_of_2(DV))
    # a causal tile's diagonal spans its own bm // gp tokens: narrower key tiles there (16 keys at
    # least, tensor cores' smallest); the other loops keep bn
    bn_diag = bn
    if causal and not has_mask and q_positions is None:
        bn_diag = max(16, min(bn, bm // gp))

    m_tiles = triton.cdiv(max_extend_len, bm // gp)
    if num_splits is None:
        num_sms, smem = _device_sizes(dev)
        resident = extend_resident_programs(bm, bn, stages, D, DV, q.element_size(), smem)
        num_splits = extend_num_splits(m_tiles * (HQ // gp) * B, max_window, bn, num_sms, resident)
    split = num_splits > 1
    grid = extend_grid(m_tiles, num_splits, HQ // gp, B, T * HQ if split else 0)

    if out is None:
        out = _poison.empty(T, HQ, DV, dtype=q.dtype, device=dev)
    if T == 0 or B == 0 or max_extend_len == 0:
        return out
    scale_ptr = ks_t is not None or vs_t is not None
    if scale_ptr:
        # both scales through pointers (one constexpr): a number becomes a one-element tensor
        ks = ks_t if ks_t is not None else torch.full((1,), ks, dtype=torch.float32, device=dev)
        vs = vs_t if vs_t is not None else torch.full((1,), vs, dtype=torch.float32, device=dev)
    # split-KV: partials [T, HQ, splits, Dv] then their log2-sum-exp2 [T, HQ, splits], as decode's
    lse_offset = T * HQ * num_splits * DV if split else 0
    part = _poison.empty(lse_offset + T * HQ * num_splits, dtype=torch.float32, device=dev) if split else out
    args = (
        q, k, v, k_buffer, v_buffer, out, part,
        qo_indptr, prefix_lens,
        kv_indptr_arg, kv_indices_arg, page_table_arg, window_starts_arg,
        mask_arg, mask_indptr_arg, qpos_arg, sinks if sinks is not None else q,
        ks, vs, sm_scale, logit_cap, window_left, num_splits, lse_offset, HQ,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        out.stride(0), out.stride(1), stride_pt,
    )
    constexprs = dict(
        G=HQ // H, GP=gp, D=D, DV=DV,
        BLOCK_D=block_d, BLOCK_DV=block_dv,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_N_DIAG=bn_diag, PAGED=paged, PAGE=page_size,
        WINDOW=window_left >= 0, CAUSAL=causal and not has_mask, HAS_MASK=has_mask,
        HAS_QPOS=q_positions is not None, SOFTCAP=logit_cap > 0, HAS_SINKS=sinks is not None,
        KV_SCALE=kv_scaled, SCALE_PTR=scale_ptr, DOT_PREC="ieee" if q.dtype == torch.float32 or upcast else "tf32",
        SPLIT=split, EDGE_IN_LOOP=edge_in_loop and causal and not has_mask and q_positions is None,
        UPCAST_DOT=upcast,
    )
    _extend_launch(constexprs, warps, stages)(args, grid)
    if split:
        block_s = max(1, min(triton.next_power_of_2(num_splits), MERGE_TILE // block_dv))
        _swa_extend_merge_kernel[(T * HQ,)](
            part, sinks if sinks is not None else q, out, qo_indptr,
            num_splits, lse_offset, out.stride(0), out.stride(1), HQ, B,
            DV=DV, BLOCK_S=block_s, BLOCK_DV=block_dv, HAS_SINKS=sinks is not None,
            num_warps=4 if block_dv >= 256 else 2,
        )
    return out


# One _Launch per constexpr set and options: repeated calls skip Triton's per-call argument binding
# (about half of a short prefill's host time on the H200's host: bench/probe_extend_launch.py).
_LAUNCHES: dict = {}


def _extend_launch(constexprs: dict, num_warps: int, num_stages: int):
    kernel = _swa_extend_kernel
    if not isinstance(kernel, triton.runtime.JITFunction):  # a test's stand-in: launch it as it is
        return lambda args, grid: kernel[grid](*args, **constexprs, num_warps=num_warps, num_stages=num_stages)
    key = (*constexprs.values(), num_warps, num_stages)
    launch = _LAUNCHES.get(key)
    if launch is None:
        launch = _LAUNCHES[key] = _Launch(kernel, None, constexprs, None, num_warps, num_stages)
    return launch


def _max_extend_len(qo_indptr: torch.Tensor, total: int) -> int:
    """Longest request of the batch: read from the host copy, or ``T`` while a CUDA graph captures."""
    if qo_indptr.shape[0] < 2:
        return 0
    if qo_indptr.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return total
    return int((qo_indptr[1:] - qo_indptr[:-1]).max())


def _check_tensor_args(q, k, v, k_buffer, v_buffer, qo_indptr, prefix_lens) -> None:
    check_tensor("q", q, dtype=_Q_DTYPES, ndim=3)
    dev = q.device
    T, HQ, D = q.shape
    check_tensor("k", k, dtype=q.dtype, device=dev, ndim=3)
    if k.shape[0] != T or k.shape[2] != D:
        raise ValueError(f"k must have shape [{T}, H, {D}] (q is {list(q.shape)}), got {list(k.shape)}")
    H = k.shape[1]
    if H < 1 or HQ % H:
        raise ValueError(f"query heads ({HQ}) must be a multiple of KV heads ({H})")
    check_tensor("v", v, dtype=q.dtype, device=dev, ndim=3)
    if v.shape[0] != T or v.shape[1] != H:
        raise ValueError(f"v must have shape [{T}, {H}, Dv], got {list(v.shape)}")
    DV = v.shape[2]
    for name, d in (("head_dim", D), ("v head_dim", DV)):
        if not 1 <= d <= _MAX_HEAD_DIM:
            raise ValueError(f"{name} must be in [1, {_MAX_HEAD_DIM}], got {d}")
    kv_dtypes = (q.dtype, torch.float8_e4m3fn, torch.uint8)
    check_tensor("k_buffer", k_buffer, dtype=kv_dtypes, device=dev)
    if k_buffer.dim() not in (3, 4) or k_buffer.shape[-2:] != (H, D):
        raise ValueError(f"k_buffer must have shape [slots, {H}, {D}] or [pages, page_size, {H}, {D}], "
                         f"got {list(k_buffer.shape)}")
    check_tensor("v_buffer", v_buffer, dtype=k_buffer.dtype, device=dev, ndim=k_buffer.dim())
    if v_buffer.shape[:-1] != k_buffer.shape[:-1] or v_buffer.shape[-1] != DV:
        raise ValueError(f"v_buffer must have shape {list(k_buffer.shape[:-1]) + [DV]}, got {list(v_buffer.shape)}")
    for name, x in (("q", q), ("k", k), ("v", v), ("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous along its last dimension (strides {x.stride()})")
    for name, buf in (("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        if buf.dim() == 4 and buf.stride(0) != buf.shape[1] * buf.stride(1):
            raise ValueError(f"a 4-D {name} must have its pages and in-page slots contiguous")
    check_tensor("prefix_lens", prefix_lens, dtype=_INDEX_DTYPES, device=dev, ndim=1, contiguous=True)
    B = prefix_lens.shape[0]
    check_tensor("qo_indptr", qo_indptr, dtype=_INDEX_DTYPES, device=dev, shape=(B + 1,), contiguous=True)
