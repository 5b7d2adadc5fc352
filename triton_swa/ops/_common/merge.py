"""Split-KV partials and their merge, shared by decode and extend.

A split of row ``r`` (a decode request, or an extend token) and query head ``h`` writes its output
over its keys, normalised by its own denominator, at ``part[((r * HQ + h) * num_splits + s) * Dv:]``
(float32), and its log2-sum-exp2 at ``part[lse_offset + (r * HQ + h) * num_splits + s]``; an empty
split writes zeros and ``-inf``. The merge weighs the splits by ``2^lse`` and adds the sink to the
denominator.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...runtime.launch import Launcher, launcher_for
from .softmax import LOG2E, fold_sink

__all__ = ["MAX_SPLITS", "MERGE_TILE", "merge_block_s", "merge_dv_chunks", "merge_launcher", "merge_partials"]

# Upper bound on splits (grid size, the merge's loop, and the partial buffers' size).
MAX_SPLITS = 64
# Elements of one merge tile `[heads, splits, Dv]` (float32 registers of one program).
MERGE_TILE = 8192


@triton.jit
def merge_partials(
    part,
    sinks,
    out,
    i_r,
    o_hq,
    m_h,
    dv0,
    num_splits,
    lse_offset,
    stride_or,
    stride_oh,
    HQ,
    DV: tl.constexpr,
    MERGE_G: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    HAS_SINK: tl.constexpr,
    CACHE: tl.constexpr,
):
    """``out[i_r, o_hq, dv0 : dv0 + BLOCK_DV] = sum_s 2^lse_s o_s / (sum_s 2^lse_s + 2^sink)`` over the
    splits of query heads ``o_hq`` (`[MERGE_G]`, int64, valid where ``m_h``) of row ``i_r``, online over
    chunks of ``BLOCK_S`` splits."""
    o_dv = dv0 + tl.arange(0, BLOCK_DV)
    m_dv = o_dv < DV
    o_row = (i_r * HQ + o_hq) * num_splits
    m_i = tl.full([MERGE_G], float("-inf"), tl.float32)
    l_i = tl.zeros([MERGE_G], dtype=tl.float32)
    acc = tl.zeros([MERGE_G, BLOCK_DV], dtype=tl.float32)
    for s in range(0, num_splits, BLOCK_S):
        o_s = s + tl.arange(0, BLOCK_S)
        # [MERGE_G, BLOCK_S]
        m_hs = m_h[:, None] & (o_s < num_splits)[None, :]
        o_hs = o_row[:, None] + o_s[None, :]
        b_lse = tl.load(part + lse_offset + o_hs, mask=m_hs, other=float("-inf"), cache_modifier=CACHE)
        # [MERGE_G, BLOCK_S, BLOCK_DV]; every split wrote its row (an empty one zeros), so these loads do
        # not wait for the lse.
        b_o = tl.load(
            part + o_hs[:, :, None] * DV + o_dv[None, None, :], mask=m_hs[:, :, None] & m_dv[None, None, :], other=0.0, cache_modifier=CACHE
        )
        m_new = tl.maximum(m_i, tl.max(b_lse, 1))
        # All splits so far empty: weights stay 0 (and no -inf - -inf).
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_ref)
        b_w = tl.exp2(b_lse - m_ref[:, None])
        acc = acc * alpha[:, None] + tl.sum(b_o * b_w[:, :, None], 1)
        l_i = l_i * alpha + tl.sum(b_w, 1)
        m_i = m_new
    if HAS_SINK:
        b_sink = tl.load(sinks + o_hq, mask=m_h, other=0.0).to(tl.float32) * LOG2E
        m_i, l_i, alpha = fold_sink(m_i, l_i, b_sink)
        acc = acc * alpha[:, None]
    # No key and no sink: zeros.
    b_out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    p_out = out + i_r * stride_or + o_hq[:, None] * stride_oh + o_dv[None, :]
    tl.store(p_out, b_out.to(out.dtype.element_ty), mask=m_h[:, None] & m_dv[None, :])


@triton.jit
def _swa_merge_kernel(
    part,
    sinks,
    out,
    qo_indptr,
    num_splits,
    lse_offset,
    stride_or,
    stride_oh,
    HQ,
    B,
    DV: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    HAS_SINK: tl.constexpr,
    SKIP_PADDING: tl.constexpr,
):
    """One program per (row, query head) and ``BLOCK_DV`` columns of the output (the grid's second axis).
    ``SKIP_PADDING`` (extend): rows outside ``[qo_indptr[0], qo_indptr[B])`` (CUDA-graph padding past the
    requests, whose partials nobody wrote) are left as they are, as without splits."""
    i_rh = tl.program_id(0)
    i_r = i_rh // HQ
    if SKIP_PADDING:
        if (i_r < tl.load(qo_indptr)) | (i_r >= tl.load(qo_indptr + B)):
            return
    # [1]
    o_hq = i_rh % HQ + tl.arange(0, 1)
    merge_partials(
        part,
        sinks,
        out,
        i_r.to(tl.int64),
        o_hq.to(tl.int64),
        o_hq < HQ,
        tl.program_id(1) * BLOCK_DV,
        num_splits,
        lse_offset,
        stride_or,
        stride_oh,
        HQ,
        DV=DV,
        MERGE_G=1,
        BLOCK_S=BLOCK_S,
        BLOCK_DV=BLOCK_DV,
        HAS_SINK=HAS_SINK,
        CACHE="",
    )


def merge_block_s(num_splits: int, block_dv: int, heads: int = 1) -> int:
    """Splits one merge step loads: all of them when ``[heads, splits, Dv]`` fits ``MERGE_TILE``."""
    return max(1, min(triton.next_power_of_2(num_splits), MERGE_TILE // (heads * block_dv)))


def merge_dv_chunks(programs: int, dv: int, num_sms: int) -> int:
    """Column chunks of the merge's output rows (each chunk a program): more than one only where the
    (row, head) programs leave most SMs idle and the rows are wide, down to chunks of 128 columns (the
    H200, 512-wide heads at B 1: 32 programs took about 5 us of a 24 us decode)."""
    block_dv = triton.next_power_of_2(dv)
    chunks = 1
    while block_dv // chunks > 128 and programs * chunks < num_sms:
        chunks *= 2
    return chunks


def merge_launcher(
    rows: int | None, heads: int, dv: int, num_splits: int, has_sink: bool, skip_padding: bool, dv_chunks: int = 1
) -> Launcher:
    """The merge of ``num_splits`` partials per (row, head), each row's ``dv`` columns in ``dv_chunks``
    programs: over a fixed grid of ``rows`` (decode's plans, arguments of fixed dtypes) or, with
    ``rows=None``, a grid ``(rows * heads, dv_chunks, 1)`` given per call (extend)."""
    block_dv = triton.next_power_of_2(dv) // dv_chunks
    constexprs = dict(DV=dv, BLOCK_S=merge_block_s(num_splits, block_dv), BLOCK_DV=block_dv, HAS_SINK=has_sink, SKIP_PADDING=skip_padding)
    num_warps = 4 if block_dv >= 256 else 2
    if rows is None:
        return launcher_for(_swa_merge_kernel, constexprs, num_warps)
    return Launcher(_swa_merge_kernel, (rows * heads, dv_chunks, 1), constexprs, 4, num_warps)
