"""The split kernel of paged decode: one query per request over a split of its window.

One program takes request ``i_b``, KV head ``i_h``, query heads ``[i_gb * BLOCK_G, +BLOCK_G)`` of its
group (GQA packing: one ``tl.dot`` over the group, padded to 16 rows, so each K/V byte is read once)
and split ``i_s`` of the window. With one split it writes the output; with several, float32 partials
(``triton_swa.ops._common.merge``), merged by the merge kernel or, with ``FUSED_MERGE``, by the group's
last split in place. With ``STORE`` it first writes the step's new K/V (``store_kv``'s job, fused:
one launch per layer fewer).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .._common.fp8 import fp8_decode, fp8_rescale
from .._common.merge import merge_partials
from .._common.softmax import LOG2E, fold_sink, soft_cap
from ..kv_store import store_rows, store_slot


# the fused store's slots and mapping are read one entry per program: their alignment does not matter,
# and an engine's out_cache_loc is often a slice at any 8-byte offset
@triton.jit(do_not_specialize=["n_mapping", "rows_k", "rows_v"], do_not_specialize_on_alignment=["loc", "mapping"])
def _swa_decode_kernel(
    q,
    k_buffer,
    v_buffer,
    out,
    part,
    semaphores,
    kv_indptr,
    kv_indices,
    page_table,
    window_starts,
    seq_lens,
    sinks,
    k_scale_ptr,
    v_scale_ptr,
    k_new,
    v_new,
    k_store,
    v_store,
    loc,
    mapping,
    sm_scale,
    v_scale,
    logit_cap,
    k_scale,
    num_splits,
    lse_offset,
    stride_qb,
    stride_qh,
    stride_kn,
    stride_kh,
    stride_vn,
    stride_vh,
    stride_ob,
    stride_oh,
    stride_pt,
    stride_knb,
    stride_knh,
    stride_knd,
    stride_vnb,
    stride_vnh,
    stride_vnd,
    stride_loc,
    n_mapping,
    rows_k,
    rows_v,
    H,
    G,
    NUM_GB,
    D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr,
    PAGED: tl.constexpr,
    K_SCALE_PTR: tl.constexpr,
    V_SCALE_PTR: tl.constexpr,
    KV_FP8: tl.constexpr,
    SOFTCAP: tl.constexpr,
    HAS_SINK: tl.constexpr,
    SPLIT: tl.constexpr,
    FUSED_MERGE: tl.constexpr,
    MERGE_G: tl.constexpr,
    MERGE_S: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    F16_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    STORE: tl.constexpr,
    STORE_MAPPING: tl.constexpr,
    STORE_K_SCALE: tl.constexpr,
    STORE_V_SCALE: tl.constexpr,
    K_ENC: tl.constexpr,
    V_ENC: tl.constexpr,
):
    # One program: request i_b, KV head i_h, query heads [i_gb * BLOCK_G, +BLOCK_G) of its group, and
    # split i_s of the window. Scores live in the log2 domain (exp2 is the cheap exponential).
    i_bhg = tl.program_id(0)
    i_s = tl.program_id(1)
    i_b = (i_bhg // (H * NUM_GB)).to(tl.int64)
    i_h = (i_bhg // NUM_GB) % H
    i_gb = i_bhg % NUM_GB
    HQ = H * G

    o_g = i_gb * BLOCK_G + tl.arange(0, BLOCK_G)
    m_g = o_g < G
    o_hq = (i_h * G + o_g).to(tl.int64)
    o_d = tl.arange(0, BLOCK_D)
    o_dv = tl.arange(0, BLOCK_DV)
    m_d = o_d < D
    m_dv = o_dv < DV

    # [BLOCK_G, BLOCK_D]
    p_q = q + i_b * stride_qb + o_hq[:, None] * stride_qh + o_d[None, :]
    b_q = tl.load(p_q, mask=m_g[:, None] & m_d[None, :], other=0.0)
    if UPCAST_DOT:
        # The interpreter multiplies bf16 dot operands as raw bits (docs/contract.md §8): use float32 there.
        b_q = b_q.to(tl.float32)
    if F16_DOT:
        # fp8 K/V convert to float16 exactly and cheaply: bf16 queries join them there rather than every
        # element going on to bf16 (float16 holds bf16's 8 bits of precision and more, up to |q| = 65504,
        # where the query is clamped).
        b_q = tl.minimum(tl.maximum(b_q.to(tl.float32), -65504.0), 65504.0).to(tl.float16)

    if PAGED:
        w0 = tl.load(window_starts + i_b)
        kv_len = tl.maximum(tl.load(seq_lens + i_b) - w0, 0)
        first_page = w0 // PAGE
        p_pt = page_table + i_b * stride_pt
    else:
        kv_start = tl.load(kv_indptr + i_b)
        kv_len = tl.load(kv_indptr + i_b + 1) - kv_start

    # This split's tokens [n_lo, n_hi) of the window, whole blocks except at the window's end; a
    # split past the end runs no iteration and records an empty partial (lse = -inf, zeros).
    chunk = tl.cdiv(tl.cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N
    n_lo = i_s * chunk
    n_hi = tl.minimum(n_lo + chunk, kv_len)

    if STORE:
        # The step's new K/V (``store_kv`` fused): written at the request's slot by the programs whose
        # split holds the window's last token (every query-head block of the KV head writes the same
        # bytes), then read back by the loop like any other token once the barrier has ordered this
        # program's stores before its loads. A request with an empty window stores from split 0, as
        # the store kernel would.
        last = kv_len - 1
        mine = ((last >= n_lo) & (last < n_hi)) | ((kv_len == 0) & (i_s == 0))
        slot_new = store_slot(loc, i_b, stride_loc, mapping, n_mapping, STORE_MAPPING, False)
        slot_new = tl.where(mine, slot_new, -4611686018427387904)
        store_rows(
            k_store,
            stride_kn,
            stride_kh,
            1,
            slot_new,
            rows_k,
            k_new,
            stride_knb,
            stride_knh,
            stride_knd,
            i_b,
            k_scale,
            k_scale_ptr,
            H,
            D,
            i_h,
            STORE_K_SCALE,
            K_ENC,
            1,
            BLOCK_D,
        )
        store_rows(
            v_store,
            stride_vn,
            stride_vh,
            1,
            slot_new,
            rows_v,
            v_new,
            stride_vnb,
            stride_vnh,
            stride_vnd,
            i_b,
            v_scale,
            v_scale_ptr,
            H,
            DV,
            i_h,
            STORE_V_SCALE,
            V_ENC,
            1,
            BLOCK_DV,
        )
        tl.debug_barrier()

    if K_SCALE_PTR:
        sm_scale = sm_scale * tl.load(k_scale_ptr).to(tl.float32)
    # fp8 bytes decoded in the kernel come out scaled down by a power of two: put it back here
    sm_scale = fp8_rescale(sm_scale, KV_FP8)
    # The log2 factor rides on the score scale, unless the cap needs the natural-log scores.
    if SOFTCAP:
        qk_scale = sm_scale
    else:
        qk_scale = sm_scale * LOG2E
    p_kh = k_buffer + i_h.to(tl.int64) * stride_kh
    p_vh = v_buffer + i_h.to(tl.int64) * stride_vh

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_DV], dtype=tl.float32)
    for n in range(n_lo, n_hi, BLOCK_N):
        o_n = n + tl.arange(0, BLOCK_N)
        m_n = o_n < n_hi
        # [BLOCK_N] slots of the window's tokens; masked lanes point at the dummy slot and load nothing.
        if PAGED:
            pos = w0 + o_n
            page = tl.load(p_pt + (pos // PAGE - first_page), mask=m_n, other=0).to(tl.int64)
            slot = page * PAGE + pos % PAGE
        else:
            slot = tl.load(kv_indices + kv_start + o_n, mask=m_n, other=0).to(tl.int64)

        # [BLOCK_N, BLOCK_D]
        if BLOCK_D == D:
            m_k = m_n[:, None]
        else:
            m_k = m_n[:, None] & m_d[None, :]
        b_k = tl.load(p_kh + slot[:, None] * stride_kn + o_d[None, :], mask=m_k, other=0.0)
        if KV_FP8 != 0:
            b_k = fp8_decode(b_k, KV_FP8)
        # [BLOCK_G, BLOCK_N]
        b_s = tl.dot(b_q, tl.trans(b_k.to(b_q.dtype)), input_precision=DOT_PRECISION)
        if SOFTCAP:
            b_s = soft_cap(b_s, qk_scale, logit_cap)
        else:
            b_s = b_s * qk_scale
        b_s = tl.where(m_n[None, :], b_s, float("-inf"))

        # Every block holds at least one valid key, so m_new is finite.
        m_new = tl.maximum(m_i, tl.max(b_s, 1))
        alpha = tl.exp2(m_i - m_new)
        b_p = tl.exp2(b_s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(b_p, 1)

        # [BLOCK_N, BLOCK_DV]; masked rows are 0 so that 0-weight lanes never meet a NaN.
        if BLOCK_DV == DV:
            m_v = m_n[:, None]
        else:
            m_v = m_n[:, None] & m_dv[None, :]
        b_v = tl.load(p_vh + slot[:, None] * stride_vn + o_dv[None, :], mask=m_v, other=0.0)
        if KV_FP8 != 0:
            b_v = fp8_decode(b_v, KV_FP8)
        b_v = b_v.to(b_q.dtype)
        acc = acc * alpha[:, None] + tl.dot(b_p.to(b_q.dtype), b_v, input_precision=DOT_PRECISION)
        m_i = m_new

    if V_SCALE_PTR:
        v_scale = v_scale * tl.load(v_scale_ptr).to(tl.float32)
    v_scale = fp8_rescale(v_scale, KV_FP8)

    if SPLIT:
        # Partial output normalised by its own denominator, and its log2-sum-exp2.
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        b_o = acc * (v_scale / l_safe)[:, None]
        b_lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        o_row = (i_b * HQ + o_hq) * num_splits + i_s
        tl.store(part + lse_offset + o_row, b_lse, mask=m_g)
        tl.store(part + o_row[:, None] * DV + o_dv[None, :], b_o, mask=m_g[:, None] & m_dv[None, :])
        if FUSED_MERGE:
            # Publish this split (every thread's stores, then one release), count it; the group's last
            # split merges them all and puts the counter back to 0 for the next call.
            tl.debug_barrier()
            p_sem = semaphores + i_bhg
            n_done = tl.atomic_add(p_sem, 1, sem="acq_rel", scope="gpu")
            if n_done == num_splits - 1:
                o_mg = i_gb * BLOCK_G + tl.arange(0, MERGE_G)
                merge_partials(
                    part,
                    sinks,
                    out,
                    i_b,
                    (i_h * G + o_mg).to(tl.int64),
                    o_mg < G,
                    0,
                    num_splits,
                    lse_offset,
                    stride_ob,
                    stride_oh,
                    HQ,
                    DV=DV,
                    MERGE_G=MERGE_G,
                    BLOCK_S=MERGE_S,
                    BLOCK_DV=BLOCK_DV,
                    HAS_SINK=HAS_SINK,
                    CACHE=".cg",
                )
                tl.atomic_xchg(p_sem, 0, sem="relaxed", scope="gpu")
    else:
        if HAS_SINK:
            b_sink = tl.load(sinks + o_hq, mask=m_g, other=0.0).to(tl.float32) * LOG2E
            m_i, l_i, alpha = fold_sink(m_i, l_i, b_sink)
            acc = acc * alpha[:, None]
        # An empty window (l = 0, acc = 0) gives zeros.
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        b_o = acc * (v_scale / l_safe)[:, None]
        p_o = out + i_b * stride_ob + o_hq[:, None] * stride_oh + o_dv[None, :]
        tl.store(p_o, b_o.to(out.dtype.element_ty), mask=m_g[:, None] & m_dv[None, :])
