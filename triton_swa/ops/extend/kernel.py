"""The kernel of paged extend (prefill, chunked prefill, draft extend, verify) and its tile loop.

Every program owns one query tile of one request and one group of query heads, and visits only the
key tiles that intersect its rows' windows, in up to five calls of :func:`_swa_extend_tiles`: new-key
tiles every row sees (no mask), prefix tiles every row sees (no mask), then the masked ones: prefix
tiles on the window's lower edge, new-key tiles on the lower edge (or, with ``EDGE_IN_LOOP``, inside
the first loop behind a branch), and the causal diagonal, in tiles as narrow as the query tile's own
tokens (16 keys at least). Index entries outside ``[max(0, P - W), P)`` are never read.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .._common.fp8 import fp8_decode, fp8_rescale
from .._common.softmax import LOG2E, fold_sink, soft_cap
from ..kv_store import store_slots, store_token_rows


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
    acc,
    m_i,
    l_i,
    b_q,
    s_begin,
    s_end,
    qk_scale,
    v_scale,
    logit_cap,
    k_src,
    v_src,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    kv_indices,
    kv_end,
    page_table,
    page_base,
    ws_page,
    custom_mask,
    mask_off,
    q_positions,
    q_start,
    i_kvh,
    P,
    E,
    lo,
    window_left,
    o_i,
    r_i,
    o_n,
    o_d,
    o_dv,
    m_d,
    m_dv,
    PREFIX: tl.constexpr,
    MASKED: tl.constexpr,
    PAGED: tl.constexpr,
    PAGE: tl.constexpr,
    WINDOW: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_QPOS: tl.constexpr,
    SOFTCAP: tl.constexpr,
    KV_SCALE: tl.constexpr,
    EVEN_D: tl.constexpr,
    EVEN_DV: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PREC: tl.constexpr,
    KV_FP8: tl.constexpr,
    EDGE: tl.constexpr = False,
    edge_end=0,
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
    ``KV_FP8`` (prefix calls over an fp8 pool read as bytes): K/V tiles decoded in the kernel
    (``triton_swa.ops._common.fp8``); their power of two rides on ``qk_scale`` and ``v_scale``.
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
                p_page = page_table + page_base + (pos // PAGE - ws_page)
                if MASKED:
                    b_page = tl.load(p_page, mask=m_key, other=0)
                else:
                    b_page = tl.load(p_page)
                b_slot = b_page.to(tl.int64) * PAGE + (pos % PAGE)
            else:
                if MASKED:
                    b_slot = tl.load(kv_indices + kv_end + o_j, mask=m_key, other=0).to(tl.int64)
                else:
                    b_slot = tl.load(kv_indices + kv_end + o_j).to(tl.int64)
            p_k = k_src + b_slot[:, None] * stride_kt + i_kvh * stride_kh + o_d[None, :]
            p_v = v_src + b_slot[:, None] * stride_vt + i_kvh * stride_vh + o_dv[None, :]
        else:
            m_key = o_j < E
            i_t = tl.cast(q_start + s, tl.int64)
            p_k = k_src + (i_t * stride_kt + i_kvh * stride_kh) + o_kt
            p_v = v_src + (i_t * stride_vt + i_kvh * stride_vh) + o_vt
        # [BLOCK_N, BLOCK_D]
        b_k = _load_2d(p_k, m_key, m_d, MASKED, not EVEN_D)
        if KV_FP8 != 0:
            b_k = fp8_decode(b_k, KV_FP8)
        # [BLOCK_M, BLOCK_N]
        b_s = tl.dot(b_q, tl.trans(b_k.to(b_q.dtype)), input_precision=DOT_PREC)
        if SOFTCAP:
            b_s = soft_cap(b_s, qk_scale, logit_cap)
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
                    r_j = tl.load(q_positions + q_start + o_j, mask=m_key, other=0).to(tl.int32) - P
                    m_s = m_s & (r_i[:, None] - r_j[None, :] <= window_left)
                else:
                    m_s = m_s & (o_j[None, :] >= b_lb[:, None])
            if HAS_MASK:
                p_cm = custom_mask + mask_off + o_i.to(tl.int64)[:, None] * E + o_j[None, :]
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
        # [BLOCK_N, the program's value columns]
        b_v = _load_2d(p_v, m_key, m_dv, MASKED, not EVEN_DV)
        if KV_FP8 != 0:
            b_v = fp8_decode(b_v, KV_FP8)
        if KV_SCALE:
            b_p = b_p * v_scale
        acc = tl.dot(b_p.to(b_q.dtype), b_v.to(b_q.dtype), acc, input_precision=DOT_PREC)
        m_i = m_ij
    return acc, m_i, l_i


# the fused store's slots and mapping are read one entry per token: their alignment does not matter
@triton.jit(do_not_specialize=["num_rows", "n_mapping", "rows_k", "rows_v"], do_not_specialize_on_alignment=["loc", "mapping"])
def _swa_extend_kernel(
    q,
    k,
    v,
    k_buffer,
    v_buffer,
    out,
    part,
    qo_indptr,
    prefix_lens,
    kv_indptr,
    kv_indices,
    page_table,
    window_starts,
    custom_mask,
    mask_indptr,
    q_positions,
    sinks,
    k_scale,
    v_scale,
    sm_scale,
    logit_cap,
    window_left,
    num_splits,
    lse_offset,
    HQ,
    num_rows,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_bkt,
    stride_bkh,
    stride_bvt,
    stride_bvh,
    stride_ot,
    stride_oh,
    stride_pt,
    k_store,
    v_store,
    loc,
    mapping,
    stride_loc,
    n_mapping,
    rows_k,
    rows_v,
    G: tl.constexpr,
    GP: tl.constexpr,
    D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_N_DIAG: tl.constexpr,
    PAGED: tl.constexpr,
    PAGE: tl.constexpr,
    WINDOW: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_QPOS: tl.constexpr,
    SOFTCAP: tl.constexpr,
    HAS_SINK: tl.constexpr,
    KV_SCALE: tl.constexpr,
    SCALE_PTR: tl.constexpr,
    KV_FP8: tl.constexpr,
    DOT_PREC: tl.constexpr,
    SPLIT: tl.constexpr,
    EDGE_IN_LOOP: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    STORE: tl.constexpr,
    STORE_MAPPING: tl.constexpr,
    STORE_K_SCALE: tl.constexpr,
    STORE_V_SCALE: tl.constexpr,
    K_ENC: tl.constexpr,
    V_ENC: tl.constexpr,
    DV_PARTS: tl.constexpr = 1,
):
    """One program: ``BLOCK_M // GP`` new tokens x ``GP`` query heads of request ``program_id(2)``.

    ``SPLIT``: ``program_id(0)`` is ``query tile * num_splits + split``. Split ``s`` takes its share of
    the cached-prefix tiles (``ceil(tiles / num_splits)`` whole tiles each, oldest first, so the last
    splits of a short prefix may be empty) and the last split also takes every new-key tile; each
    writes float32 partials to ``part`` in decode's layout: the output over its keys normalised by its
    own denominator at ``[T, HQ, num_splits, Dv]``, its log2-sum-exp2 at ``lse_offset + [T, HQ,
    num_splits]`` (zeros and ``-inf`` for an empty split). The sinks are then left to the merge.

    ``num_rows`` (``T``: the rows of ``q``, ``k``, ``v``, ``q_positions``, ``out`` and the partials)
    bounds every token row a program touches: request ``b``'s rows ``[qo_indptr[b], qo_indptr[b + 1])``
    are clipped to ``[0, T)`` (an identity for a valid ``qo_indptr``), so that no ``qo_indptr``
    (device contents, unchecked outside debug mode) makes it read or write past those tensors.

    ``DV_PARTS``: the value width is divided among that many programs (``program_id(0)`` is then
    ``(query tile [* num_splits + split]) * DV_PARTS + part``); each computes the tile's scores whole and
    accumulates ``BLOCK_DV // DV_PARTS`` output columns. It buys a wide head's fp32 accumulator out of
    the register file (D 512: 64 rows x 256 columns over one warpgroup) at the price of computing the
    scores ``DV_PARTS`` times.

    ``STORE``: the step's new K/V (``store_kv``'s job, fused) are written too, each token and KV head
    once: by the program of the token's tile that holds the first query-head group of the KV head
    (and split 0). The tiles read new keys from ``k``/``v``, never from the buffers, so no program
    waits for these writes; they go to ``k_store``/``v_store`` (the buffers as ``store_view`` gives
    them, the buffers' strides) at ``loc[row]`` (through ``mapping`` for a sliding layer).
    """
    TOK: tl.constexpr = BLOCK_M // GP
    EVEN_D: tl.constexpr = D == BLOCK_D
    EVEN_DV: tl.constexpr = DV == BLOCK_DV
    PART_DV: tl.constexpr = BLOCK_DV // DV_PARTS
    i_tile = tl.program_id(0)
    i_dv = 0
    if DV_PARTS > 1:
        i_dv = i_tile % DV_PARTS
        i_tile = i_tile // DV_PARTS
    if SPLIT:
        i_m = i_tile // num_splits
        i_s = i_tile % num_splits
    else:
        i_m = i_tile
    i_hg = tl.program_id(1)
    i_b = tl.program_id(2)

    # the request's rows clipped to [0, num_rows): an identity for every valid qo_indptr
    q_start = tl.minimum(tl.maximum(tl.load(qo_indptr + i_b).to(tl.int32), 0), num_rows)
    E = tl.minimum(tl.load(qo_indptr + i_b + 1).to(tl.int32), num_rows) - q_start
    m0 = i_m * TOK
    if m0 >= E:
        return
    P = tl.load(prefix_lens + i_b).to(tl.int32)
    m_last = tl.minimum(m0 + TOK, E) - 1

    i_kvh = (i_hg * GP) // G
    o_m = tl.arange(0, BLOCK_M)
    o_i = m0 + o_m // GP
    o_h = i_hg * GP + o_m % GP
    m_row = (o_i < E) & (o_m < TOK * GP)
    o_n = tl.arange(0, BLOCK_N)
    o_d = tl.arange(0, BLOCK_D)
    o_dv = i_dv * PART_DV + tl.arange(0, PART_DV)
    m_d = o_d < D
    m_dv = o_dv < DV

    # [BLOCK_M, BLOCK_D]
    o_qt = (q_start + o_i).to(tl.int64)
    p_q = q + o_qt[:, None] * stride_qt + o_h[:, None] * stride_qh + o_d[None, :]
    b_q = tl.load(p_q, mask=m_row[:, None] & m_d[None, :], other=0.0)
    if UPCAST_DOT:
        # The interpreter multiplies bf16 dot operands as raw bits (docs/contract.md §8): every dot takes b_q's
        # dtype, so float32 here makes them all float32 (interpreter only; compiled code never sets it).
        b_q = b_q.to(tl.float32)

    # Row positions relative to P (r_i), and the tile's first/last row positions.
    if HAS_QPOS:
        r_i = tl.load(q_positions + q_start + o_i, mask=m_row, other=0).to(tl.int32) - P
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
    # fp8 bytes decoded in the kernel come out scaled down by a power of two (KV_SCALE is set then)
    ks = fp8_rescale(ks, KV_FP8)
    vs = fp8_rescale(vs, KV_FP8)
    qk_scale = sm_scale * LOG2E
    if SOFTCAP:
        qk_scale = sm_scale

    acc = tl.zeros([BLOCK_M, PART_DV], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    # ---- cached prefix: keys j in [lo, 0), j = position - P ----
    if PAGED:
        first = tl.load(window_starts + i_b).to(tl.int32)
        ws_page = first // PAGE
        page_base = i_b.to(tl.int64) * stride_pt
        kv_end = 0
    else:
        kv_end = tl.load(kv_indptr + i_b + 1).to(tl.int32)
        first = P - (kv_end - tl.load(kv_indptr + i_b).to(tl.int32))
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
        n_mid = tl.where(
            aligned,
            m0 - (tl.maximum(m0 - y, 0) // BLOCK_N) * BLOCK_N,
            tl.minimum(tl.maximum(((y + BLOCK_N - 1) // BLOCK_N) * BLOCK_N, n_lo), n_diag),
        )
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
        mask_off = tl.load(mask_indptr + i_b).to(tl.int64)

    # Order of the loops: new keys unmasked, prefix unmasked, then the masked ones (prefix edge, new
    # edge, diagonal). The softmax does not care, but ptxas serialises every wgmma of the kernel
    # (C7515, about half the tensor-core throughput on Hopper) when a masked loop's accumulator flows
    # into an unmasked one, or a gathered fp8 prefix loop into the new-key loop. EDGE_IN_LOOP (causal
    # new keys only) streams the new-key lower edge inside the first loop instead.
    n_start = n_mid
    if EDGE_IN_LOOP:
        n_start = n_lo
    # The five calls differ in their key range, source (new keys or the cached prefix), scales and
    # masking; kept one argument group per line (fmt: off), so that the differences read at a glance.
    # fmt: off
    # new keys every row sees (with EDGE_IN_LOOP also the lower edge, masked by a branch)
    acc, m_i, l_i = _swa_extend_tiles(
        acc, m_i, l_i, b_q, n_start, n_diag, qk_scale, 1.0, logit_cap,
        k, v, stride_kt, stride_kh, stride_vt, stride_vh,
        kv_indices, kv_end, page_table, page_base, ws_page,
        custom_mask, mask_off, q_positions, q_start, i_kvh, P, E, lo, window_left,
        o_i, r_i, o_n, o_d, o_dv, m_d, m_dv,
        PREFIX=False, MASKED=False, KV_SCALE=False, KV_FP8=0, BLOCK_N=BLOCK_N,
        PAGED=PAGED, PAGE=PAGE, WINDOW=WINDOW, CAUSAL=CAUSAL, HAS_MASK=HAS_MASK, HAS_QPOS=HAS_QPOS,
        SOFTCAP=SOFTCAP, EVEN_D=EVEN_D, EVEN_DV=EVEN_DV, DOT_PREC=DOT_PREC,
        EDGE=EDGE_IN_LOOP, edge_end=n_mid,
    )
    # cached prefix tiles every row sees
    acc, m_i, l_i = _swa_extend_tiles(
        acc, m_i, l_i, b_q, pu_lo, pu_hi, pre_scale, vs, logit_cap,
        k_buffer, v_buffer, stride_bkt, stride_bkh, stride_bvt, stride_bvh,
        kv_indices, kv_end, page_table, page_base, ws_page,
        custom_mask, 0, q_positions, q_start, i_kvh, P, E, lo, window_left,
        o_i, r_i, o_n, o_d, o_dv, m_d, m_dv,
        PREFIX=True, MASKED=False, KV_SCALE=KV_SCALE, KV_FP8=KV_FP8, BLOCK_N=BLOCK_N,
        PAGED=PAGED, PAGE=PAGE, WINDOW=WINDOW, CAUSAL=CAUSAL, HAS_MASK=HAS_MASK, HAS_QPOS=HAS_QPOS,
        SOFTCAP=SOFTCAP, EVEN_D=EVEN_D, EVEN_DV=EVEN_DV, DOT_PREC=DOT_PREC,
    )
    # cached prefix tiles on the window's lower edge
    acc, m_i, l_i = _swa_extend_tiles(
        acc, m_i, l_i, b_q, pm_lo, pm_hi, pre_scale, vs, logit_cap,
        k_buffer, v_buffer, stride_bkt, stride_bkh, stride_bvt, stride_bvh,
        kv_indices, kv_end, page_table, page_base, ws_page,
        custom_mask, 0, q_positions, q_start, i_kvh, P, E, lo, window_left,
        o_i, r_i, o_n, o_d, o_dv, m_d, m_dv,
        PREFIX=True, MASKED=True, KV_SCALE=KV_SCALE, KV_FP8=KV_FP8, BLOCK_N=BLOCK_N,
        PAGED=PAGED, PAGE=PAGE, WINDOW=WINDOW, CAUSAL=CAUSAL, HAS_MASK=HAS_MASK, HAS_QPOS=HAS_QPOS,
        SOFTCAP=SOFTCAP, EVEN_D=EVEN_D, EVEN_DV=EVEN_DV, DOT_PREC=DOT_PREC,
    )
    if not EDGE_IN_LOOP:
        # new keys on the window's lower edge
        acc, m_i, l_i = _swa_extend_tiles(
            acc, m_i, l_i, b_q, n_lo, n_mid, qk_scale, 1.0, logit_cap,
            k, v, stride_kt, stride_kh, stride_vt, stride_vh,
            kv_indices, kv_end, page_table, page_base, ws_page,
            custom_mask, mask_off, q_positions, q_start, i_kvh, P, E, lo, window_left,
            o_i, r_i, o_n, o_d, o_dv, m_d, m_dv,
            PREFIX=False, MASKED=True, KV_SCALE=False, KV_FP8=0, BLOCK_N=BLOCK_N,
            PAGED=PAGED, PAGE=PAGE, WINDOW=WINDOW, CAUSAL=CAUSAL, HAS_MASK=HAS_MASK, HAS_QPOS=HAS_QPOS,
            SOFTCAP=SOFTCAP, EVEN_D=EVEN_D, EVEN_DV=EVEN_DV, DOT_PREC=DOT_PREC,
        )
    # the causal diagonal (or every new key, masked), in tiles of BLOCK_N_DIAG keys
    acc, m_i, l_i = _swa_extend_tiles(
        acc, m_i, l_i, b_q, n_diag, n_hi, qk_scale, 1.0, logit_cap,
        k, v, stride_kt, stride_kh, stride_vt, stride_vh,
        kv_indices, kv_end, page_table, page_base, ws_page,
        custom_mask, mask_off, q_positions, q_start, i_kvh, P, E, lo, window_left,
        o_i, r_i, tl.arange(0, BLOCK_N_DIAG), o_d, o_dv, m_d, m_dv,
        PREFIX=False, MASKED=True, KV_SCALE=False, KV_FP8=0, BLOCK_N=BLOCK_N_DIAG,
        PAGED=PAGED, PAGE=PAGE, WINDOW=WINDOW, CAUSAL=CAUSAL, HAS_MASK=HAS_MASK, HAS_QPOS=HAS_QPOS,
        SOFTCAP=SOFTCAP, EVEN_D=EVEN_D, EVEN_DV=EVEN_DV, DOT_PREC=DOT_PREC,
    )
    # fmt: on

    if SPLIT:
        # partial output over this split's keys (v_scale already in P) and its log2-sum-exp2
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        b_lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        # [BLOCK_M, PART_DV]
        b_o = acc / l_safe[:, None]
        o_row = (o_qt * HQ + o_h) * num_splits + i_s
        m_lse = m_row
        if DV_PARTS > 1:
            # every part computes the same sum: the first writes it
            m_lse = m_row & (i_dv == 0)
        tl.store(part + lse_offset + o_row, b_lse, mask=m_lse)
        tl.store(part + o_row[:, None] * DV + o_dv[None, :], b_o, mask=m_row[:, None] & m_dv[None, :])
    else:
        if HAS_SINK:
            # the sink joins the denominator only; a row with no visible key stays all zeros
            b_sink = tl.load(sinks + o_h).to(tl.float32) * LOG2E
            m_i, l_i, alpha = fold_sink(m_i, l_i, b_sink)
            acc = acc * alpha[:, None]
        b_o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        # [BLOCK_M, PART_DV]
        p_o = out + o_qt[:, None] * stride_ot + o_h[:, None] * stride_oh + o_dv[None, :]
        tl.store(p_o, b_o.to(out.dtype.element_ty), mask=m_row[:, None] & m_dv[None, :])

    # the fused store, last: its registers do not add to the tile loops' (255 against 194 on sm_90
    # for a D128 verify when it came first); the tile's tokens at once, one head
    if STORE:
        writes = (i_hg * GP) % G == 0
        if DV_PARTS > 1:
            writes = writes & (i_dv == 0)
        if SPLIT:
            writes = writes & (i_s == 0)
        if writes:
            o_t = m0 + tl.arange(0, TOK)
            rows = (q_start + o_t).to(tl.int64)
            slots = store_slots(loc, rows, o_t <= m_last, stride_loc, mapping, n_mapping, STORE_MAPPING)
            store_token_rows(
                k_store, stride_bkt, stride_bkh, slots, rows_k, k, stride_kt, stride_kh, rows, i_kvh, D,
                k_scale, k_scale, STORE_K_SCALE, K_ENC, TOK, BLOCK_D,
            )  # fmt: skip
            store_token_rows(
                v_store, stride_bvt, stride_bvh, slots, rows_v, v, stride_vt, stride_vh, rows, i_kvh, DV,
                v_scale, v_scale, STORE_V_SCALE, V_ENC, TOK, BLOCK_DV,
            )  # fmt: skip
