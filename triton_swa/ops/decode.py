"""Paged sliding-window decode: one query per request over its window of cached K/V.

One kernel serves sliding and full layers (the window is already in the indices). Each program takes
every query head of one KV head (GQA packing: one ``tl.dot`` over the group, padded to 16 rows), so each
K/V byte is read once, and one split of the window. The number of splits comes from the longest
window (``max_window``, a host int) and the SM count, never from the context length, and is fixed for a
given batch shape, so a call is capturable in a CUDA graph. Splits write float32 partial outputs with
their log-sum-exp, which a second small kernel merges (and adds the sinks to); with one split the kernel
writes the output directly. A launcher option (``_Tune(fused_merge=True)``) has the last split of each
group merge in place instead, counted by self-resetting per-stream counters: one launch fewer for eager
calls, no faster on the GPU (H200, B 1: 8.9 us either way at D 128, 12.5 at D 256), so not the default.

Two ways to name the window's slots:

- CSR (page size 1): ``kv_indptr [B + 1]`` and ``kv_indices`` (token slots, oldest first), as built by
  ``reference.decode_window_indices`` or ``triton_swa.ops.indices``.
- Page table: ``page_table [B, max_pages]`` whose entry ``j`` is the pool page of the window's ``j``-th
  page (page 0 holds position ``window_starts[b]``), with the window covering positions
  ``[window_starts[b], seq_lens[b])``; position ``t`` sits at offset ``t % page_size`` of its page.

Host cost: the launcher caches, per input signature (dtypes, shapes, strides, devices, options), the
checked plan (tiles, splits, grid, kernel arguments) and the compiled kernels, so a repeated call only
builds that signature, reads the pointers' alignment and launches the compiled kernel directly.

Names: ``_swa_decode_kernel`` (split attention, and the fused merge) and ``_swa_decode_merge_kernel``
(the separate merge), both through ``_swa_decode_merge``, are launched by :func:`_swa_decode_impl`,
which backs :func:`swa_decode`.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton import knobs

from .._checks import check_grid, check_int, check_kv_scale, check_logit_cap, check_sm_scale, check_tensor
from . import _poison
from ..guard import check_swa_decode, guarded

__all__ = ["DecodeConfig", "decode_block_config", "decode_min_split_tokens", "decode_num_splits",
           "decode_resident_programs", "swa_decode"]

LOG2E = tl.constexpr(1.4426950408889634)
# A split reads at least this many times the bytes of the float32 partial output it writes (and the
# merge reads back): G x Dv x 4 bytes per KV head against split_len x (D + Dv) x itemsize.
SPLIT_READ_RATIO = 16
# Upper bound on splits (grid y, the merge's loop, and the partial buffers' size).
MAX_SPLITS = 64
# Long windows may take up to this many waves of splits, each split still this many key blocks long:
# more programs per SM leave fewer idle SMs in the last wave once each program's loop is long.
MAX_WAVES = 8
LONG_SPLIT_BLOCKS = 32
# Elements of one merge tile `[heads, splits, Dv]` (float32 registers of one program).
MERGE_TILE = 8192

Q_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


@triton.jit
def _fold_sink(m_i, l_i, b_sink):
    """Fold one sink logit per row into an online softmax: ``(m, l, alpha)``, scale the accumulator
    by ``alpha``. All in log2 units: ``m_i`` the running max (``-inf`` for a row without keys), ``l_i``
    the sum of ``exp2(s - m_i)``, ``b_sink`` the sink (any of ``-inf``, finite, ``+inf``).

    A sink is one more logit in the denominator and brings no value. Every path (decode's direct
    output, decode's and extend's merge, extend's direct output) folds it here, guarded so that no
    ``-inf - -inf`` or ``inf - inf`` reaches an exponent: a row without keys gives ``l = 0`` (no
    sink, or a ``-inf`` one) or ``alpha = 0`` (a finite sink), a ``+inf`` sink takes all the weight;
    the output is zeros in each of these cases (SPEC §5), never NaN.
    """
    m_new = tl.maximum(m_i, b_sink)
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_ref)
    p_sink = tl.where(b_sink == m_ref, 1.0, tl.exp2(b_sink - m_ref))
    return m_new, l_i * alpha + p_sink, alpha


@triton.jit
def _swa_decode_merge(
    part, sinks, out, i_b, o_hq, m_h, num_splits, lse_offset, stride_ob, stride_oh, HQ,
    DV: tl.constexpr, MERGE_G: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_SINK: tl.constexpr, CACHE: tl.constexpr,
):
    # out = sum_s 2^lse_s o_s / (sum_s 2^lse_s + 2^sink) over the splits of query heads o_hq (`[MERGE_G]`,
    # int64, valid where m_h) of request i_b, online over chunks of BLOCK_S splits.
    o_dv = tl.arange(0, BLOCK_DV)
    m_dv = o_dv < DV
    o_row = (i_b * HQ + o_hq) * num_splits
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
        b_o = tl.load(part + o_hs[:, :, None] * DV + o_dv[None, None, :],
                      mask=m_hs[:, :, None] & m_dv[None, None, :], other=0.0, cache_modifier=CACHE)
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
        m_i, l_i, alpha = _fold_sink(m_i, l_i, b_sink)
        acc = acc * alpha[:, None]
    # No key and no sink: zeros.
    b_out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    p_out = out + i_b * stride_ob + o_hq[:, None] * stride_oh + o_dv[None, :]
    tl.store(p_out, b_out.to(out.dtype.element_ty), mask=m_h[:, None] & m_dv[None, :])


@triton.jit
def _swa_decode_kernel(
    q, k_buffer, v_buffer, out, part, semaphores,
    kv_indptr, kv_indices, page_table, window_starts, seq_lens,
    sinks, k_scale_ptr, v_scale_ptr,
    sm_scale, v_scale, logit_cap,
    num_splits, lse_offset,
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
    SOFTCAP: tl.constexpr, HAS_SINK: tl.constexpr,
    SPLIT: tl.constexpr, FUSED_MERGE: tl.constexpr, MERGE_G: tl.constexpr, MERGE_S: tl.constexpr,
    UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
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
    # split past the end runs no iteration and records an empty partial (lse = -inf, zeros).
    chunk = tl.cdiv(tl.cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N
    n_lo = i_s * chunk
    n_hi = tl.minimum(n_lo + chunk, kv_len)

    if K_SCALE_PTR:
        sm_scale = sm_scale * tl.load(k_scale_ptr).to(tl.float32)
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
        # [BLOCK_G, BLOCK_N]
        b_s = tl.dot(b_q, tl.trans(b_k.to(b_q.dtype)), input_precision=DOT_PRECISION) * qk_scale
        if SOFTCAP:
            # cap * tanh(s / cap), with tanh(x) = 2 sigmoid(2x) - 1 (no tanh in triton 3.6).
            b_s = (logit_cap * LOG2E) * (2.0 * tl.sigmoid((2.0 / logit_cap) * b_s) - 1.0)
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
                _swa_decode_merge(part, sinks, out, i_b, (i_h * G + o_mg).to(tl.int64), o_mg < G, num_splits,
                                  lse_offset, stride_ob, stride_oh, HQ, DV, MERGE_G, MERGE_S, BLOCK_DV, HAS_SINK,
                                  ".cg")
                tl.atomic_xchg(p_sem, 0, sem="relaxed", scope="gpu")
    else:
        if HAS_SINK:
            b_sink = tl.load(sinks + o_hq, mask=m_g, other=0.0).to(tl.float32) * LOG2E
            m_i, l_i, alpha = _fold_sink(m_i, l_i, b_sink)
            acc = acc * alpha[:, None]
        # An empty window (l = 0, acc = 0) gives zeros.
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        b_o = acc * (v_scale / l_safe)[:, None]
        p_o = out + i_b * stride_ob + o_hq[:, None] * stride_oh + o_dv[None, :]
        tl.store(p_o, b_o.to(out.dtype.element_ty), mask=m_g[:, None] & m_dv[None, :])


@triton.jit
def _swa_decode_merge_kernel(
    part, sinks, out,
    num_splits, lse_offset,
    stride_ob, stride_oh,
    HQ,
    DV: tl.constexpr, MERGE_G: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_SINK: tl.constexpr,
):
    # One program per (request, MERGE_G query heads).
    i_bh = tl.program_id(0)
    n_hb = tl.cdiv(HQ, MERGE_G)
    i_b = (i_bh // n_hb).to(tl.int64)
    o_hq = (i_bh % n_hb) * MERGE_G + tl.arange(0, MERGE_G)
    _swa_decode_merge(part, sinks, out, i_b, o_hq.to(tl.int64), o_hq < HQ, num_splits, lse_offset,
                      stride_ob, stride_oh, HQ, DV, MERGE_G, BLOCK_S, BLOCK_DV, HAS_SINK, "")


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
      to cover memory latency, without spilling the `[block_g, block_n]` scores; at least 32 for
      512-wide heads so that a loop iteration does enough work, at most 128.
    - ``num_warps``: 4 at every width. At 512-wide heads 4 warps carry the `[16, 512]` accumulator in 64
      registers per thread without spills, and stream at the copy ceiling where 8 warps did not (H200,
      B 64, L 4k, 32-token tiles, CSR list: 497 against 707 us; page table: 498 against 537 us;
      ``bench/probe_decode.py d512``).
    - ``num_stages``: 3. Triton's pipeliner gives the slot loads and the K/V gathers they feed
      ``(num_stages - 1) // 2`` iterations of lead each: one here, two K/V buffers. 2 would leave the
      slot loads unpipelined (565 against 548 us at D 512, B 8, L 32k on the H200); 5 (two iterations of
      lead, three buffers) measured no better (136 against 131 us at D 128, B 64).

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
        block_n = max(block_n, 32)
    return DecodeConfig(block_g, block_n, 4, 3)


def decode_min_split_tokens(group: int, head_dim: int, v_head_dim: int, kv_itemsize: int) -> int:
    """Fewest window tokens per split: a split's K/V reads are at least ``SPLIT_READ_RATIO`` times the
    float32 partial output it writes (`[G, Dv]` per KV head, read back once by the merge), so the
    partials cost at most about ``2 / SPLIT_READ_RATIO`` of the traffic. Small groups split finer."""
    partial = group * v_head_dim * 4
    return max(1, triton.cdiv(SPLIT_READ_RATIO * partial, (head_dim + v_head_dim) * kv_itemsize))


def decode_resident_programs(block_n: int, head_dim: int, v_head_dim: int, kv_itemsize: int,
                             smem_per_sm: int = 228 * 1024, num_warps: int = 4) -> int:
    """Split-kernel programs one SM holds at once (at most 8), bounded by shared memory and registers.

    Both bounds are fitted to what Triton 3.6 compiles for sm_90 (``bench/probe_decode.py stats``,
    H200, 4 warps; shared bytes and registers per thread):

    - shared memory: one K plus V tile, and a layout-conversion scratch that grows with the head width,
      ``block_n * (D + Dv) * itemsize + 4 KB + 32 * width`` (D 128 at 64 keys: 39 KB; D 256 at 64:
      76 KB; D 512 at 32: 83 KB);
    - registers: about ``80 + 1.25 e``, with ``e`` the elements of the K tile per thread, out of 64K
      per SM (D 128 at 64 keys, e = 64: 128 registers; D 256 at 32: 148; D 256 at 64 and D 512 at 32,
      e = 128: 238-252, two programs).

    Under-counting costs splits: at D 512, B 8, L 4k, 8 splits (two programs per SM) take 76 us where
    the earlier estimate of one program per SM chose 4 and took 95 us.
    """
    width = max(triton.next_power_of_2(head_dim), triton.next_power_of_2(v_head_dim))
    threads = 32 * num_warps
    shared = block_n * (head_dim + v_head_dim) * kv_itemsize + 4 * 1024 + 32 * width
    registers = min(255, 80 + (5 * block_n * width) // (4 * threads))
    return max(1, min(8, smem_per_sm // shared, 65536 // (threads * registers)))


def decode_num_splits(programs: int, max_window: int, block_n: int, num_sms: int, min_tokens: int = 128,
                      resident: int = 2) -> int:
    """Splits of each window, from the longest window and the GPU's size (never from context length).

    With ``slots = num_sms * resident`` programs running at once (:func:`decode_resident_programs`):

    - ``programs >= slots``: no split. The GPU is full anyway, and splits only add partials, the merge and
      one more pipeline fill per program (H200, B 64, D 128, window 1k: 131 us unsplit
      against 152 us in 2 splits; window 4k: 251 against 256-261 us in 2 to 4).
    - fewer programs (small batches, latency-bound): split so that one wave holds them all, and never
      into two waves of short splits (D 256, B 1: 16 splits 12.5 us, 32 splits over two waves 15 us).
      Long windows may take up to ``MAX_WAVES`` waves of splits of at least ``LONG_SPLIT_BLOCKS``
      blocks, which leaves fewer SMs idle in the last wave (D 512, B 1, L 32k: 64 splits 83 us, 32
      splits 97 us).

    Each split keeps at least ``max(block_n, min_tokens)`` tokens of the longest window (see
    :func:`decode_min_split_tokens`), at most ``MAX_SPLITS`` splits, and splits that the longest window
    would leave empty (splits are whole blocks) are dropped. A host-only function of shapes, so a CUDA
    graph sees a fixed count.
    """
    slots = num_sms * max(1, resident)
    if programs >= slots or max_window <= 0:
        return 1
    most = max(1, min(MAX_SPLITS, triton.cdiv(max_window, max(block_n, min_tokens))))
    fill = slots // max(programs, 1)
    long = max_window // (LONG_SPLIT_BLOCKS * block_n)
    splits = min(most, max(1, fill, min(long, MAX_WAVES * fill)))
    chunk = triton.cdiv(triton.cdiv(max_window, splits), block_n) * block_n
    return max(1, min(splits, triton.cdiv(max_window, chunk)))


_DEVICE_SIZES: dict = {}


def _device_sizes(device: torch.device) -> tuple[int, int]:
    """(SM count, shared memory bytes per SM) of a device; a small GPU's under the interpreter."""
    if device.type != "cuda":
        return 4, 228 * 1024
    if device not in _DEVICE_SIZES:
        props = torch.cuda.get_device_properties(device)
        smem = getattr(props, "shared_memory_per_multiprocessor", 0) or 228 * 1024
        _DEVICE_SIZES[device] = (props.multi_processor_count, smem)
    return _DEVICE_SIZES[device]


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# Launch compiled kernels directly once Triton has compiled them (False: always through the JIT's
# binder, as benchmarks do to compare). The direct call uses the compiled kernel's launcher signature
# of triton 3.6 (on CUDA and HIP alike); other Triton versions go through the JIT every time.
_FAST_LAUNCH = triton.__version__.startswith("3.6.")
try:  # Triton's argument specialisation, for _Launch keys over varying integers (3.6's native binder)
    from triton._C.libtriton import native_specialize_impl as _SPECIALIZE
except ImportError:  # pragma: no cover - other Triton versions take the JIT path
    _SPECIALIZE = None
_DRIVER: list = []


def _driver_fns():
    if not _DRIVER:
        from triton.runtime import driver

        _DRIVER.extend([driver.active.get_current_device, driver.active.get_current_stream])
    return _DRIVER


class _Launch:
    """One kernel with fixed constexprs and options. The first call per device and specialisation key
    goes through Triton's JIT (which compiles, or finds the compiled kernel); later calls with the same
    key launch that compiled kernel directly, skipping the JIT's per-call argument binding.

    The key is what Triton specialises a kernel on beyond the constexprs and options. With ``n_ptr``
    (decode's plans, whose argument dtypes and integers are fixed per plan) it is the 16-byte alignment
    of the first ``n_ptr`` arguments (pointers); with ``n_ptr=None`` (extend, whose integers vary from
    call to call) it is Triton's own specialisation of every argument (dtype, 16-divisibility, an
    integer's width and whether it is 1). The grid is fixed (``grid``) or given per call.
    """

    __slots__ = ("fn", "grid", "constexprs", "tail", "options", "n_ptr", "compiled", "interpret")

    def __init__(self, fn, grid, constexprs: dict, n_ptr: int | None, num_warps: int, num_stages: int | None = None):
        self.fn, self.grid, self.constexprs, self.n_ptr = fn, grid, constexprs, n_ptr
        self.interpret = _interpreting()
        self.tail = ()
        self.options = {"num_warps": num_warps}
        if num_stages is not None:
            self.options["num_stages"] = num_stages
        self.compiled: dict = {}

    def __call__(self, args: tuple, grid: tuple | None = None) -> None:
        grid = self.grid if grid is None else grid
        if not _FAST_LAUNCH or self.interpret or (self.n_ptr is None and _SPECIALIZE is None):
            self.fn[grid](*args, **self.constexprs, **self.options)
            return
        get_device, get_stream = _driver_fns()
        device = get_device()
        if self.n_ptr is None:
            # the JIT's own backend for this device, as its binder uses (device_caches: 3.6's layout)
            backend = self.fn.device_caches[device][3]
            key = (device, *[_SPECIALIZE(backend, a, False, True, True) for a in args])
        else:
            key = (device, *[a.data_ptr() & 15 == 0 for a in args[: self.n_ptr]])
        kernel = self.compiled.get(key)
        if kernel is None:
            kernel = self.fn[grid](*args, **self.constexprs, **self.options)
            if all(hasattr(kernel, name) for name in ("run", "function", "packed_metadata", "launch_metadata")):
                # The launcher takes every parameter in order, the constexprs (the last ones) included.
                self.tail = tuple(self.constexprs[name] for name in self.fn.arg_names[len(args):])
                self.compiled[key] = kernel
            return
        stream = get_stream(device)
        full = (*args, *self.tail)
        enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        if enter is None or not getattr(enter, "calls", True):
            # No launch hooks (profilers) registered: the launcher skips them and their metadata.
            meta = enter = leave = None
        else:
            meta = kernel.launch_metadata(grid, stream, *full)
        kernel.run(grid[0], grid[1], grid[2], stream, kernel.function, kernel.packed_metadata, meta, enter, leave,
                   *full)


# The in-place merge's counters: one zeroed int32 per split-kernel program, per (device, stream), so
# that calls on concurrent streams never share them; each call leaves them zero. Eager calls only.
_SEMAPHORES: dict = {}


def _semaphores(device: torch.device, n: int) -> torch.Tensor | None:
    """Counters for an eager call on the current stream, or None inside a CUDA-graph capture (a graph
    uses the merge kernel: counters shared by graphs replayed on several streams could collide)."""
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return None
        key = (device, _driver_fns()[1](device.index))
    else:
        key = (device, 0)
    buf = _SEMAPHORES.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(1024, triton.next_power_of_2(n)), dtype=torch.int32, device=device)
        _SEMAPHORES[key] = buf
    return buf


class _Tune(NamedTuple):
    """Launcher overrides beyond the public ``num_splits``/``block_n`` (benchmarks sweep them).

    ``fused_merge``: the group's last split merges the partials in place (eager calls; inside a CUDA-graph
    capture the merge kernel runs instead, so warm up such a call inside the capture's stream context).
    """

    num_warps: int | None = None
    num_stages: int | None = None
    fused_merge: bool | None = None


class _Plan:
    """Everything a checked signature of inputs decides: kernels, grids, integer arguments, buffers."""

    __slots__ = ("out_shape", "default_scale", "fp8_view", "split", "fused", "programs", "part_numel",
                 "ints", "main", "merge", "merge_ints", "fallback")


_PLANS: dict = {}
_PLANS_MAX = 4096


def _tensor_key(t):
    return None if t is None else (t.dtype, t.shape, t.stride(), t.device)


def _scale_key(s):
    return (s.dtype, s.shape, s.device) if isinstance(s, torch.Tensor) else type(s)


def _signature(q, k_buffer, v_buffer, kv_indptr, kv_indices, page_table, window_starts, seq_lens, page_size,
               sinks, k_scale, v_scale, out, max_window, num_splits, block_n, softcap, tune) -> tuple:
    """What the checks and the plan depend on: dtypes, shapes, strides and devices of the tensors, the
    types and values of the options. CSR indices enter by dtype, device and contiguity only (their length
    changes every step), unless their length is the default ``max_window``."""
    if kv_indices is None:
        indices = None
    elif max_window is None:
        indices = _tensor_key(kv_indices)
    else:
        indices = (kv_indices.dtype, kv_indices.dim(), kv_indices.is_contiguous(), kv_indices.device)
    return (
        _tensor_key(q), _tensor_key(k_buffer), _tensor_key(v_buffer), _tensor_key(kv_indptr), indices,
        _tensor_key(page_table), _tensor_key(window_starts), _tensor_key(seq_lens), _tensor_key(sinks),
        _tensor_key(out), _scale_key(k_scale), _scale_key(v_scale), softcap,
        type(page_size), page_size, type(max_window), max_window, type(num_splits), num_splits,
        type(block_n), block_n, tune,
    )


def _make_plan(q, k_buffer, v_buffer, kv_indptr, kv_indices, page_table, window_starts, seq_lens, page_size,
               sinks, k_scale, v_scale, out, max_window, num_splits, block_n, softcap, tune) -> _Plan:
    """Check the inputs (raising TypeError/ValueError naming the argument) and plan the launch."""
    check_tensor("q", q, dtype=Q_DTYPES, ndim=3)
    device = q.device
    B, HQ, D = q.shape
    check_tensor("k_buffer", k_buffer, device=device, ndim=3)
    check_tensor("v_buffer", v_buffer, device=device, ndim=3)
    kv_dtype = k_buffer.dtype
    if kv_dtype not in (q.dtype, torch.float8_e4m3fn, torch.uint8):
        raise TypeError(f"k_buffer must have q's dtype {q.dtype} or be fp8 e4m3 (float8_e4m3fn or uint8), "
                        f"got {kv_dtype}")
    if v_buffer.dtype != kv_dtype:
        raise TypeError(f"v_buffer must have k_buffer's dtype {kv_dtype}, got {v_buffer.dtype}")
    fp8_view = kv_dtype == torch.uint8
    if fp8_view:
        k_buffer, v_buffer = k_buffer.view(torch.float8_e4m3fn), v_buffer.view(torch.float8_e4m3fn)
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

    if sinks is not None:
        check_tensor("sinks", sinks, device=device, shape=(HQ,), contiguous=True)
        if not sinks.dtype.is_floating_point:
            raise TypeError(f"sinks must be a float tensor, got {sinks.dtype}")
    k_scale_t = check_kv_scale("k_scale", k_scale, device)[1]
    v_scale_t = check_kv_scale("v_scale", v_scale, device)[1]
    if out is not None:
        check_tensor("out", out, dtype=q.dtype, device=device, shape=(B, HQ, DV))
        if out.stride(-1) != 1:
            raise ValueError(f"out must have a contiguous last dimension, got strides {out.stride()}")
        stride_ob, stride_oh = out.stride(0), out.stride(1)
    else:
        stride_ob, stride_oh = HQ * DV, DV
    max_window = default_window if max_window is None else check_int("max_window", max_window, minimum=0)
    if num_splits is not None:
        check_int("num_splits", num_splits, minimum=1)
        if num_splits > MAX_SPLITS:
            raise ValueError(f"num_splits must be at most {MAX_SPLITS}, got {num_splits}")
    if block_n is not None:
        check_int("block_n", block_n, minimum=16)
        if block_n & (block_n - 1):
            raise ValueError(f"block_n must be a power of two, got {block_n}")

    G = HQ // H
    interpret = _interpreting()
    itemsize = k_buffer.element_size()
    cfg = decode_block_config(D, DV, G, itemsize, interpret)
    tune = tune or _Tune()
    num_gb = triton.cdiv(G, cfg.block_g)
    programs = B * H * num_gb
    num_sms, smem = _device_sizes(device)
    resident = decode_resident_programs(block_n or cfg.block_n, D, DV, itemsize, smem)
    if block_n is None:
        block_n = cfg.block_n
        if programs >= num_sms * resident and not interpret and max(D, DV) <= 256:
            # A full GPU without splits streams long loops: 64-token tiles (one program per SM at D 256)
            # beat 32 there (H200, D 256, B 64: 256 against 270 us).
            block_n = max(block_n, 64)
    if num_splits is None:
        min_tokens = decode_min_split_tokens(G, D, DV, itemsize)
        num_splits = decode_num_splits(programs, max_window, block_n, num_sms, min_tokens, resident)
    split = num_splits > 1
    check_grid("swa_decode", (programs, num_splits, 1), ("batch x KV heads x query-head blocks", "splits", ""))
    check_grid("swa_decode", (B * HQ, 1, 1), ("batch x query heads (merge)", "", ""))
    block_dv = triton.next_power_of_2(DV)
    merge_g = min(cfg.block_g, triton.next_power_of_2(G))
    fused = split and bool(tune.fused_merge)
    upcast = interpret and q.dtype == torch.bfloat16

    plan = _Plan()
    plan.out_shape = (B, HQ, DV)
    plan.default_scale = 1.0 / math.sqrt(D)
    plan.fp8_view = fp8_view
    plan.split, plan.fused, plan.programs = split, fused, programs
    lse_offset = B * HQ * num_splits * DV
    plan.part_numel = lse_offset + B * HQ * num_splits if split else 0
    plan.ints = (
        num_splits, lse_offset,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        stride_ob, stride_oh, page_table.stride(0) if paged else 0, H, G, num_gb,
    )
    num_warps = tune.num_warps or cfg.num_warps
    num_stages = tune.num_stages or cfg.num_stages

    def main(fused_merge: bool) -> _Launch:
        merge_s = max(1, min(triton.next_power_of_2(num_splits), MERGE_TILE // (merge_g * block_dv)))
        constexprs = dict(
            D=D, DV=DV, BLOCK_G=cfg.block_g, BLOCK_D=max(16, triton.next_power_of_2(D)), BLOCK_DV=block_dv,
            BLOCK_N=block_n, PAGE=page_size if paged else 1, PAGED=paged,
            K_SCALE_PTR=k_scale_t is not None, V_SCALE_PTR=v_scale_t is not None,
            SOFTCAP=softcap, HAS_SINK=sinks is not None,
            SPLIT=split, FUSED_MERGE=fused_merge, MERGE_G=merge_g, MERGE_S=merge_s,
            UPCAST_DOT=upcast,
            # float32 dots are exact (not tf32); fp16/bf16 dots take the target's default.
            DOT_PRECISION="ieee" if q.dtype == torch.float32 or upcast else None,
        )
        return _Launch(_swa_decode_kernel, (programs, num_splits, 1), constexprs, 14, num_warps, num_stages)

    def merge() -> _Launch:
        block_s = max(1, min(triton.next_power_of_2(num_splits), MERGE_TILE // block_dv))
        constexprs = dict(DV=DV, MERGE_G=1, BLOCK_S=block_s, BLOCK_DV=block_dv, HAS_SINK=sinks is not None)
        return _Launch(_swa_decode_merge_kernel, (B * HQ, 1, 1), constexprs, 3, 4 if block_dv >= 256 else 2)

    plan.main = main(fused)
    plan.merge = merge() if split and not fused else None
    plan.merge_ints = (num_splits, lse_offset, stride_ob, stride_oh, HQ)
    # Without counters (inside a CUDA-graph capture): the two-kernel merge.
    plan.fallback = (main(False), merge()) if fused else None
    return plan


def _swa_decode_impl(q, k_buffer, v_buffer, *, kv_indptr=None, kv_indices=None, page_table=None,
                     window_starts=None, seq_lens=None, page_size=1, sm_scale=None, logit_cap=0.0, sinks=None,
                     k_scale=None, v_scale=None, out=None, max_window=None, num_splits=None, block_n=None,
                     tune: _Tune | None = None) -> torch.Tensor:
    """:func:`swa_decode` with launcher overrides (``tune``)."""
    # Scalars are checked on every call (the plan cache keys on their types, not their values);
    # scale tensors by the plan (their dtype, shape and device are part of the signature).
    logit_cap = check_logit_cap(logit_cap)
    sm_scale = check_sm_scale(sm_scale, None)
    if isinstance(k_scale, torch.Tensor):
        k_scale_f, k_scale_t = 1.0, k_scale
    else:
        k_scale_f, k_scale_t = check_kv_scale("k_scale", k_scale, None)[0], q
    if isinstance(v_scale, torch.Tensor):
        v_scale_f, v_scale_t = 1.0, v_scale
    else:
        v_scale_f, v_scale_t = check_kv_scale("v_scale", v_scale, None)[0], q
    args = (q, k_buffer, v_buffer, kv_indptr, kv_indices, page_table, window_starts, seq_lens, page_size, sinks,
            k_scale, v_scale, out, max_window, num_splits, block_n, logit_cap > 0, tune)
    try:
        key = _signature(*args)
        plan = _PLANS.get(key)
    except (AttributeError, TypeError):
        # Not tensors, or unhashable options: the checks below name the culprit.
        key, plan = None, None
    if plan is None:
        plan = _make_plan(*args)
        if key is not None:
            if len(_PLANS) >= _PLANS_MAX:
                _PLANS.clear()
            _PLANS[key] = plan

    if out is None:
        out = _poison.empty(plan.out_shape, dtype=q.dtype, device=q.device)
    if plan.out_shape[0] == 0:
        return out
    if plan.fp8_view:
        k_buffer, v_buffer = k_buffer.view(torch.float8_e4m3fn), v_buffer.view(torch.float8_e4m3fn)
    scale = plan.default_scale if sm_scale is None else sm_scale

    main, merge = plan.main, plan.merge
    part = sem = q
    if plan.split:
        part = _poison.empty(plan.part_numel, dtype=torch.float32, device=q.device)
    if plan.fused:
        sem = _semaphores(q.device, plan.programs)
        if sem is None:
            main, merge = plan.fallback
            sem = q
    dummy = q
    main((q, k_buffer, v_buffer, out, part, sem,
          dummy if kv_indptr is None else kv_indptr, dummy if kv_indices is None else kv_indices,
          dummy if page_table is None else page_table, dummy if window_starts is None else window_starts,
          dummy if seq_lens is None else seq_lens, dummy if sinks is None else sinks, k_scale_t, v_scale_t,
          scale * k_scale_f, v_scale_f, float(logit_cap), *plan.ints))
    if merge is not None:
        merge((part, dummy if sinks is None else sinks, out, *plan.merge_ints))
    return out


@guarded(check_swa_decode)
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
        sm_scale (float | None): score scale, finite and ``> 0``; ``1 / sqrt(D)`` by default.
        logit_cap (float | None): soft cap ``cap * tanh(s / cap)`` of the scores when ``> 0``
            (finite; 0 or None: off).
        sinks (torch.Tensor | None): `[HQ]` float (contiguous), one sink logit per query head; ``-inf``
            is no sink, and a window without keys gives zeros whatever its sink.
        k_scale, v_scale (float | torch.Tensor | None): per-tensor dequantisation scales of fp8 K/V:
            a finite float ``> 0``, or a one-element float tensor on ``q``'s device, read in the kernel
            (its value is checked only by the debug guard).
        out (torch.Tensor | None): `[B, HQ, Dv]` in ``q``'s dtype (last stride 1), written in place.
        max_window (int | None): most tokens in any window (``W + 1`` for a sliding layer), sizes the
            splits; defaults to ``kv_indices.numel()`` or ``max_pages * page_size``.
        num_splits (int | None): override the split count (at most 64).
        block_n (int | None): override the key tile (a power of two, at least 16).
        debug (bool | None): check every index this call reads or writes before launching (a host
            sync; ValueError naming request, position and slot); None follows ``TRITON_SWA_DEBUG``
            (see :mod:`triton_swa.guard`).

    Returns:
        torch.Tensor: `[B, HQ, Dv]` in ``q``'s dtype (``out`` when given).

    Raises:
        TypeError: naming the argument, before any launch, for a wrong type or dtype.
        ValueError: naming the argument, before any launch, for wrong shapes, devices, strides,
            head-count ratios, page sizes, index forms or scalar values (scales, caps, sizes), or a
            grid past CUDA's limits. Indices themselves are not read on the host (the debug guard
            does that): slots must lie inside the buffers and page-table rows must cover their
            windows.
    """
    return _swa_decode_impl(
        q, k_buffer, v_buffer, kv_indptr=kv_indptr, kv_indices=kv_indices, page_table=page_table,
        window_starts=window_starts, seq_lens=seq_lens, page_size=page_size, sm_scale=sm_scale, logit_cap=logit_cap,
        sinks=sinks, k_scale=k_scale, v_scale=v_scale, out=out, max_window=max_window, num_splits=num_splits,
        block_n=block_n,
    )
