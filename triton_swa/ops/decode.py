"""Paged sliding-window decode: one query per request over its window of cached K/V.

One kernel serves sliding and full layers (the window is already in the indices). Each program takes
every query head of one KV head (GQA packing: one ``tl.dot`` over the group, padded to 16 rows), so each
K/V byte is read once, and one split of the window. The number of splits comes from the longest
window (``max_window``, a host int) and the SM count, never from the context length, and is fixed for a
given batch shape, so a call is capturable in a CUDA graph. Splits write float32 partial outputs with
their log-sum-exp, which a second small kernel merges (and adds the sinks to); with one split the first
kernel writes the output directly.

Two ways to name the window's slots:

- CSR (page size 1): ``kv_indptr [B + 1]`` and ``kv_indices`` (token slots, oldest first), as built by
  ``reference.decode_window_indices`` or ``triton_swa.ops.indices``.
- Page table: ``page_table [B, max_pages]`` whose entry ``j`` is the pool page of the window's ``j``-th
  page (page 0 holds position ``window_starts[b]``), with the window covering positions
  ``[window_starts[b], seq_lens[b])``; position ``t`` sits at offset ``t % page_size`` of its page.

Names: ``_swa_decode_kernel`` (split attention) and ``_swa_decode_merge_kernel`` (log-sum-exp merge)
are launched by :func:`_launch_swa_decode`, which backs :func:`swa_decode`.
"""

from __future__ import annotations

import functools
import math
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .._checks import check_int, check_tensor

__all__ = ["DecodeConfig", "decode_block_config", "decode_num_splits", "swa_decode"]

LOG2E = tl.constexpr(1.4426950408889634)
# A split keeps at least this many tokens, so that its float32 partial output (G x Dv x 4 bytes per
# KV head, written once and read once by the merge) stays small against its own K/V reads: about
# 2 * G / 128 of them for D = Dv in 16 bits (6% at G = 4). Fewer, longer splits would lose parallelism.
MIN_SPLIT_TOKENS = 128
# Upper bound on splits (grid y, the merge's loop, and the partial buffers' size).
MAX_SPLITS = 64
# Aim for this many programs per SM: many short programs keep the tail of the last wave short.
PROGRAMS_PER_SM = 8

Q_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


@triton.jit
def _swa_decode_kernel(
    q, k_buffer, v_buffer, out, o_part, lse_part,
    kv_indptr, kv_indices, page_table, window_starts, seq_lens,
    sinks, k_scale_ptr, v_scale_ptr,
    sm_scale, v_scale, logit_cap,
    num_splits,
    stride_qb, stride_qh,
    stride_kn, stride_kh,
    stride_vn, stride_vh,
    stride_ob, stride_oh,
    stride_pt,
    H, G, NUM_GB,
    D: tl.constexpr, DV: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr, PAGED: tl.constexpr,
    K_SCALE_PTR: tl.constexpr, V_SCALE_PTR: tl.constexpr,
    SOFTCAP: tl.constexpr, HAS_SINK: tl.constexpr, SPLIT: tl.constexpr, UPCAST_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
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
        # The interpreter multiplies bf16 dot operands as raw bits (SPEC §8): use float32 there.
        b_q = b_q.to(tl.float32)

    if PAGED:
        w0 = tl.load(window_starts + i_b)
        kv_len = tl.maximum(tl.load(seq_lens + i_b) - w0, 0)
        first_page = w0 // PAGE
        p_pt = page_table + i_b * stride_pt
    else:
        kv_start = tl.load(kv_indptr + i_b)
        kv_len = tl.load(kv_indptr + i_b + 1) - kv_start

    # This split's tokens [n_lo, n_hi) of the window, whole blocks except at the window's end; a
    # split past the end runs no iteration and records an empty partial (lse = -inf).
    chunk = tl.cdiv(tl.cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N
    n_lo = i_s * chunk
    n_hi = tl.minimum(n_lo + chunk, kv_len)

    if K_SCALE_PTR:
        sm_scale = sm_scale * tl.load(k_scale_ptr).to(tl.float32)
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
        # [BLOCK_G, BLOCK_N]
        b_s = tl.dot(b_q, tl.trans(b_k.to(b_q.dtype)), input_precision=DOT_PRECISION) * sm_scale
        if SOFTCAP:
            # cap * tanh(s / cap), with tanh(x) = 2 sigmoid(2x) - 1 (no tanh in triton 3.6).
            b_s = logit_cap * (2.0 * tl.sigmoid((2.0 / logit_cap) * b_s) - 1.0)
        b_s = tl.where(m_n[None, :], b_s * LOG2E, float("-inf"))

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
        b_v = tl.load(p_vh + slot[:, None] * stride_vn + o_dv[None, :], mask=m_v, other=0.0).to(b_q.dtype)
        acc = acc * alpha[:, None] + tl.dot(b_p.to(b_q.dtype), b_v, input_precision=DOT_PRECISION)
        m_i = m_new

    if V_SCALE_PTR:
        v_scale = v_scale * tl.load(v_scale_ptr).to(tl.float32)

    if SPLIT:
        # Partial output normalised by its own denominator, and its log2-sum-exp2.
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        b_o = acc * (v_scale / l_safe)[:, None]
        b_lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        o_row = (i_b * HQ + o_hq) * num_splits + i_s
        tl.store(lse_part + o_row, b_lse, mask=m_g)
        tl.store(o_part + o_row[:, None] * DV + o_dv[None, :], b_o, mask=m_g[:, None] & m_dv[None, :])
    else:
        if HAS_SINK:
            # A sink is one more logit in the denominator, no value.
            b_sink = tl.load(sinks + o_hq, mask=m_g, other=0.0).to(tl.float32) * LOG2E
            m_new = tl.maximum(m_i, b_sink)
            alpha = tl.where(m_i == m_new, 1.0, tl.exp2(m_i - m_new))
            l_i = l_i * alpha + tl.exp2(b_sink - m_new)
            acc = acc * alpha[:, None]
        # An empty window (l = 0, acc = 0) gives zeros.
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        b_o = acc * (v_scale / l_safe)[:, None]
        p_o = out + i_b * stride_ob + o_hq[:, None] * stride_oh + o_dv[None, :]
        tl.store(p_o, b_o.to(out.dtype.element_ty), mask=m_g[:, None] & m_dv[None, :])


@triton.jit
def _swa_decode_merge_kernel(
    o_part, lse_part, sinks, out,
    num_splits,
    stride_ob, stride_oh,
    HQ,
    DV: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_SINK: tl.constexpr,
):
    # One program per (request, query head): out = sum_s w_s o_s / (sum_s w_s + sink), w_s = 2^(lse_s - M).
    i_bh = tl.program_id(0).to(tl.int64)
    i_b = i_bh // HQ
    i_hq = i_bh % HQ
    o_dv = tl.arange(0, BLOCK_DV)
    m_dv = o_dv < DV
    p_lse = lse_part + i_bh * num_splits
    p_o = o_part + i_bh * num_splits * DV

    b_m = tl.full([], float("-inf"), tl.float32)
    for s in range(0, num_splits, BLOCK_S):
        o_s = s + tl.arange(0, BLOCK_S)
        b_lse = tl.load(p_lse + o_s, mask=o_s < num_splits, other=float("-inf"))
        b_m = tl.maximum(b_m, tl.max(b_lse, 0))
    if HAS_SINK:
        b_sink = tl.load(sinks + i_hq).to(tl.float32) * LOG2E
        b_m = tl.maximum(b_m, b_sink)
    # No key and no sink: every weight is 0 and the output is 0.
    b_m = tl.where(b_m == float("-inf"), 0.0, b_m)

    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    b_l = tl.full([], 0.0, tl.float32)
    for s in range(0, num_splits, BLOCK_S):
        o_s = s + tl.arange(0, BLOCK_S)
        b_lse = tl.load(p_lse + o_s, mask=o_s < num_splits, other=float("-inf"))
        # [BLOCK_S]; empty splits weigh 0 and their rows are not read.
        b_w = tl.exp2(b_lse - b_m)
        m_s = b_lse > float("-inf")
        # [BLOCK_S, BLOCK_DV]
        b_o = tl.load(p_o + o_s[:, None] * DV + o_dv[None, :], mask=m_s[:, None] & m_dv[None, :], other=0.0)
        acc += tl.sum(b_o * b_w[:, None], 0)
        b_l += tl.sum(b_w, 0)
    if HAS_SINK:
        b_l += tl.exp2(b_sink - b_m)
    b_out = acc / tl.where(b_l > 0, b_l, 1.0)
    tl.store(out + i_b * stride_ob + i_hq * stride_oh + o_dv, b_out.to(out.dtype.element_ty), mask=m_dv)


class DecodeConfig(NamedTuple):
    """Tile sizes and launch shape of the split kernel."""

    block_g: int
    block_n: int
    num_warps: int
    num_stages: int


def decode_block_config(head_dim: int, v_head_dim: int, group: int, kv_itemsize: int,
                        interpret: bool = False) -> DecodeConfig:
    """Tiles for a head geometry.

    - ``block_g``: the query heads of one KV head form the M side of both dots, which needs at least 16
      rows; big groups with wide heads are cut into several programs (each re-reads the K/V tile from
      L2) to keep the `[block_g, Dv]` float32 accumulator and the query tile in registers.
    - ``block_n``: about 32 KB of K plus V per tile (one pipeline stage), enough bytes in flight per SM
      to cover memory latency with 2 or 3 stages, without spilling the `[block_g, block_n]` scores;
      at least 32 for 512-wide heads so that a loop iteration does enough work, at most 128.
    - ``num_warps``: 4, or 8 for 512-wide heads (the accumulator then holds 32 floats per thread).
    - ``num_stages``: 3 (software-pipelined gathers), 2 at 512 where a stage is 64 KB of shared memory.

    Under the interpreter, the smallest legal tiles (it pays per element, not per instruction).
    """
    width = max(triton.next_power_of_2(head_dim), triton.next_power_of_2(v_head_dim))
    g_cap = 64 if width <= 128 else (32 if width <= 256 else 16)
    block_g = min(max(16, triton.next_power_of_2(group)), g_cap)
    if interpret:
        return DecodeConfig(block_g, 16, 1, 1)
    row_bytes = (triton.next_power_of_2(head_dim) + triton.next_power_of_2(v_head_dim)) * kv_itemsize
    block_n = max(16, min(128, triton.next_power_of_2(32768 // row_bytes)))
    if width >= 512:
        return DecodeConfig(block_g, max(block_n, 32), 8, 2)
    return DecodeConfig(block_g, block_n, 4, 3)


def decode_num_splits(programs: int, max_window: int, block_n: int, num_sms: int) -> int:
    """Splits of each window, from the longest window and the SM count (never from context length).

    Enough splits that about ``PROGRAMS_PER_SM`` programs per SM exist (a lone request with a long
    window still fills the GPU, and many short programs keep the last wave's tail short), but each split
    keeps at least ``max(block_n, MIN_SPLIT_TOKENS)`` tokens of the longest window, and at most
    ``MAX_SPLITS``. A host-only function of shapes, so a CUDA graph sees a fixed count.
    """
    most = max(1, min(MAX_SPLITS, triton.cdiv(max(max_window, 0), max(block_n, MIN_SPLIT_TOKENS))))
    want = triton.cdiv(PROGRAMS_PER_SM * num_sms, max(programs, 1))
    return max(1, min(most, want))


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _check_scale(name: str, scale, device) -> tuple[float, torch.Tensor | None]:
    """A per-tensor scale as (host float, None) or (1.0, device tensor of one element)."""
    if scale is None:
        return 1.0, None
    if isinstance(scale, torch.Tensor):
        check_tensor(name, scale, device=device)
        if scale.numel() != 1 or not scale.dtype.is_floating_point:
            raise ValueError(f"{name} must be a float or a one-element float tensor, got {scale.dtype} "
                             f"of shape {tuple(scale.shape)}")
        return 1.0, scale.reshape(1)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"{name} must be a float or a one-element tensor, got {type(scale).__name__}")
    return float(scale), None


def _launch_swa_decode(
    q, k_buffer, v_buffer, out, *,
    kv_indptr, kv_indices, page_table, window_starts, seq_lens, page_size,
    sm_scale, logit_cap, sinks, k_scale, k_scale_t, v_scale, v_scale_t,
    max_window, num_splits=None, block_n=None, num_warps=None, num_stages=None,
) -> torch.Tensor:
    """Pick tiles, splits and grid for checked inputs, allocate the partials, launch one or two kernels.

    ``num_splits``, ``block_n``, ``num_warps`` and ``num_stages`` override the heuristics (tests walk
    the multi-block and split paths with tiny shapes; benchmarks sweep them).
    """
    B, HQ, D = q.shape
    H, DV = v_buffer.shape[1], v_buffer.shape[2]
    G = HQ // H
    interpret = _interpreting()
    cfg = decode_block_config(D, DV, G, k_buffer.element_size(), interpret)
    block_n = block_n or cfg.block_n
    num_gb = triton.cdiv(G, cfg.block_g)
    programs = B * H * num_gb
    if num_splits is None:
        num_splits = decode_num_splits(programs, max_window, block_n, _num_sms(q.device))
    split = num_splits > 1
    if split:
        o_part = torch.empty(B, HQ, num_splits, DV, dtype=torch.float32, device=q.device)
        lse_part = torch.empty(B, HQ, num_splits, dtype=torch.float32, device=q.device)
    else:
        o_part = lse_part = out
    paged = page_table is not None
    upcast = interpret and q.dtype == torch.bfloat16
    dummy = q
    _swa_decode_kernel[(programs, num_splits)](
        q, k_buffer, v_buffer, out, o_part, lse_part,
        kv_indptr if not paged else dummy, kv_indices if not paged else dummy,
        page_table if paged else dummy, window_starts if paged else dummy, seq_lens if paged else dummy,
        sinks if sinks is not None else dummy,
        k_scale_t if k_scale_t is not None else dummy, v_scale_t if v_scale_t is not None else dummy,
        float(sm_scale) * k_scale, v_scale, float(logit_cap),
        num_splits,
        q.stride(0), q.stride(1),
        k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1),
        out.stride(0), out.stride(1),
        page_table.stride(0) if paged else 0,
        H, G, num_gb,
        D=D, DV=DV,
        BLOCK_G=cfg.block_g, BLOCK_D=triton.next_power_of_2(D), BLOCK_DV=triton.next_power_of_2(DV),
        BLOCK_N=block_n,
        PAGE=page_size if paged else 1, PAGED=paged,
        K_SCALE_PTR=k_scale_t is not None, V_SCALE_PTR=v_scale_t is not None,
        SOFTCAP=logit_cap > 0, HAS_SINK=sinks is not None, SPLIT=split,
        UPCAST_DOT=upcast,
        # float32 dots are exact (not tf32); fp16/bf16 dots take the target's default.
        DOT_PRECISION="ieee" if q.dtype == torch.float32 or upcast else None,
        num_warps=num_warps or cfg.num_warps, num_stages=num_stages or cfg.num_stages,
    )
    if split:
        block_dv = triton.next_power_of_2(DV)
        block_s = max(1, min(triton.next_power_of_2(num_splits), 8192 // block_dv))
        _swa_decode_merge_kernel[(B * HQ,)](
            o_part, lse_part, sinks if sinks is not None else dummy, out,
            num_splits, out.stride(0), out.stride(1), HQ,
            DV=DV, BLOCK_S=block_s, BLOCK_DV=block_dv, HAS_SINK=sinks is not None,
            num_warps=4 if block_dv >= 256 else 2,
        )
    return out


def swa_decode(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    *,
    kv_indptr: torch.Tensor | None = None,
    kv_indices: torch.Tensor | None = None,
    page_table: torch.Tensor | None = None,
    window_starts: torch.Tensor | None = None,
    seq_lens: torch.Tensor | None = None,
    page_size: int = 1,
    sm_scale: float | None = None,
    logit_cap: float | None = 0.0,
    sinks: torch.Tensor | None = None,
    k_scale: float | torch.Tensor | None = None,
    v_scale: float | torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    max_window: int | None = None,
    num_splits: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Decode attention of one query per request over its window of a paged KV pool.

    Give the window either as a CSR list (``kv_indptr``, ``kv_indices``) or as a page table
    (``page_table``, ``window_starts``, ``seq_lens``, ``page_size``). The window was applied when the
    indices were built, so the same call serves sliding layers and full layers (``window_left = -1``).
    No host synchronisation: capturable in a CUDA graph (the split count depends on shapes and
    ``max_window`` only).

    Args:
        q (torch.Tensor): queries `[B, HQ, D]`, float16, bfloat16 or float32 (last stride 1).
        k_buffer (torch.Tensor): a layer's keys `[slots, H, D]`, in ``q``'s dtype or fp8 e4m3
            (``torch.float8_e4m3fn``, or its ``uint8`` storage); ``HQ % H == 0`` (GQA, MQA at ``H = 1``).
        v_buffer (torch.Tensor): the layer's values `[slots, H, Dv]`, same dtype as ``k_buffer``.
        kv_indptr (torch.Tensor | None): int32/int64 `[B + 1]` offsets into ``kv_indices``.
        kv_indices (torch.Tensor | None): int32/int64 token slots of each window, oldest first.
        page_table (torch.Tensor | None): int32/int64 `[B, max_pages]`; entry ``j`` is the pool page of
            the window's ``j``-th page, page 0 holding position ``window_starts[b]``.
        window_starts (torch.Tensor | None): int32/int64 `[B]`, first position of each window.
        seq_lens (torch.Tensor | None): int32/int64 `[B]`; the window is ``[window_starts, seq_lens)``
            (empty when ``seq_lens <= window_starts``: zeros, as for CUDA-graph padding rows).
        page_size (int): tokens per page of the pool (page-table form; must be 1 with CSR).
        sm_scale (float | None): score scale, ``1 / sqrt(D)`` by default.
        logit_cap (float | None): soft cap ``cap * tanh(s / cap)`` of the scores when ``> 0``.
        sinks (torch.Tensor | None): `[HQ]` float, one sink logit per query head.
        k_scale, v_scale (float | torch.Tensor | None): per-tensor dequantisation scales of fp8 K/V
            (a float, or a one-element tensor read on the device).
        out (torch.Tensor | None): `[B, HQ, Dv]` in ``q``'s dtype (last stride 1), written in place.
        max_window (int | None): most tokens in any window (``W + 1`` for a sliding layer), sizes the
            splits; defaults to ``kv_indices.numel()`` or ``max_pages * page_size``.
        num_splits (int | None): override the split count (at most 64).
        block_n (int | None): override the key tile (a power of two, at least 16).

    Returns:
        torch.Tensor: `[B, HQ, Dv]` in ``q``'s dtype (``out`` when given).

    Raises:
        TypeError, ValueError: naming the argument, before any launch, for wrong shapes, dtypes,
            devices, strides, head-count ratios, page sizes or index forms. Indices themselves are
            not read on the host: slots must lie inside the buffers and page-table rows must cover
            their windows.
    """
    check_tensor("q", q, dtype=Q_DTYPES, ndim=3)
    device = q.device
    B, HQ, D = q.shape
    check_tensor("k_buffer", k_buffer, device=device, ndim=3)
    check_tensor("v_buffer", v_buffer, device=device, ndim=3)
    kv_dtype = k_buffer.dtype
    if v_buffer.dtype != kv_dtype:
        raise TypeError(f"v_buffer must have k_buffer's dtype {kv_dtype}, got {v_buffer.dtype}")
    if kv_dtype == torch.uint8:
        k_buffer, v_buffer = k_buffer.view(torch.float8_e4m3fn), v_buffer.view(torch.float8_e4m3fn)
    elif kv_dtype not in (q.dtype, torch.float8_e4m3fn):
        raise TypeError(f"k_buffer must have q's dtype {q.dtype} or be fp8 e4m3 (float8_e4m3fn or uint8), "
                        f"got {kv_dtype}")
    slots, H, Dk = k_buffer.shape
    DV = v_buffer.shape[2]
    if Dk != D:
        raise ValueError(f"k_buffer head dim {Dk} != q head dim {D}")
    if v_buffer.shape[:2] != k_buffer.shape[:2]:
        raise ValueError(f"v_buffer must have k_buffer's [slots, H] = {list(k_buffer.shape[:2])}, "
                         f"got {list(v_buffer.shape[:2])}")
    if HQ % H != 0:
        raise ValueError(f"query heads ({HQ}) must be a multiple of KV heads ({H})")
    for name, dim in (("head dim D", D), ("v head dim Dv", DV)):
        if not 1 <= dim <= 512:
            raise ValueError(f"{name} must be between 1 and 512, got {dim}")
    for name, t in (("q", q), ("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension, got strides {t.stride()}")

    csr = kv_indptr is not None or kv_indices is not None
    paged = page_table is not None or window_starts is not None or seq_lens is not None
    if csr == paged:
        raise ValueError("give the window either as kv_indptr + kv_indices (CSR) or as page_table + "
                         "window_starts + seq_lens, not both and not neither")
    check_int("page_size", page_size, minimum=1)
    if csr:
        if kv_indptr is None or kv_indices is None:
            raise ValueError("CSR form needs both kv_indptr and kv_indices")
        check_tensor("kv_indptr", kv_indptr, dtype=INDEX_DTYPES, device=device, shape=(B + 1,), contiguous=True)
        check_tensor("kv_indices", kv_indices, dtype=INDEX_DTYPES, device=device, ndim=1, contiguous=True)
        if page_size != 1:
            raise ValueError(f"page_size must be 1 with CSR indices (they name token slots), got {page_size}; "
                             "pass a page_table for the paged form")
        default_window = kv_indices.numel()
    else:
        if page_table is None or window_starts is None or seq_lens is None:
            raise ValueError("page-table form needs page_table, window_starts and seq_lens")
        check_tensor("page_table", page_table, dtype=INDEX_DTYPES, device=device, ndim=2)
        if page_table.shape[0] != B:
            raise ValueError(f"page_table must have {B} rows (one per query), got {page_table.shape[0]}")
        if page_table.stride(1) != 1:
            raise ValueError(f"page_table must have a contiguous last dimension, got strides {page_table.stride()}")
        check_tensor("window_starts", window_starts, dtype=INDEX_DTYPES, device=device, shape=(B,), contiguous=True)
        check_tensor("seq_lens", seq_lens, dtype=INDEX_DTYPES, device=device, shape=(B,), contiguous=True)
        if slots % page_size != 0:
            raise ValueError(f"k_buffer has {slots} slots, not a whole number of pages of page_size={page_size}")
        default_window = page_table.shape[1] * page_size

    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(D)
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)) or not math.isfinite(sm_scale):
        raise TypeError(f"sm_scale must be a finite float, got {sm_scale!r}")
    logit_cap = 0.0 if logit_cap is None else logit_cap
    if isinstance(logit_cap, bool) or not isinstance(logit_cap, (int, float)) or not logit_cap >= 0:
        raise ValueError(f"logit_cap must be a float >= 0 (0 disables it), got {logit_cap!r}")
    if sinks is not None:
        check_tensor("sinks", sinks, device=device, shape=(HQ,), contiguous=True)
        if not sinks.dtype.is_floating_point:
            raise TypeError(f"sinks must be a float tensor, got {sinks.dtype}")
    k_scale_f, k_scale_t = _check_scale("k_scale", k_scale, device)
    v_scale_f, v_scale_t = _check_scale("v_scale", v_scale, device)
    if out is None:
        out = torch.empty(B, HQ, DV, dtype=q.dtype, device=device)
    else:
        check_tensor("out", out, dtype=q.dtype, device=device, shape=(B, HQ, DV))
        if out.stride(-1) != 1:
            raise ValueError(f"out must have a contiguous last dimension, got strides {out.stride()}")
    max_window = default_window if max_window is None else check_int("max_window", max_window, minimum=0)
    if num_splits is not None:
        check_int("num_splits", num_splits, minimum=1)
        if num_splits > MAX_SPLITS:
            raise ValueError(f"num_splits must be at most {MAX_SPLITS}, got {num_splits}")
    if block_n is not None:
        check_int("block_n", block_n, minimum=16)
        if block_n & (block_n - 1):
            raise ValueError(f"block_n must be a power of two, got {block_n}")
    if B == 0:
        return out
    return _launch_swa_decode(
        q, k_buffer, v_buffer, out,
        kv_indptr=kv_indptr, kv_indices=kv_indices, page_table=page_table, window_starts=window_starts,
        seq_lens=seq_lens, page_size=page_size, sm_scale=sm_scale, logit_cap=logit_cap, sinks=sinks,
        k_scale=k_scale_f, k_scale_t=k_scale_t, v_scale=v_scale_f, v_scale_t=v_scale_t,
        max_window=max_window, num_splits=num_splits, block_n=block_n,
    )
