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
the shared layout of ``triton_swa.ops._common.merge``, whose merge kernel combines them and adds the
sinks.
Prefill and large batches keep one program per tile, which streams its whole window.

GQA packing: a tile's rows are ``BLOCK_M // GP`` tokens times ``GP`` query heads of one KV head
(``GP`` divides the group size), so each K/V tile loaded serves ``GP`` heads, as in decode; with one
token per request (decode-like extend) or a few drafts (verify) a single tile holds the whole request
and its window is streamed once per KV head.

Check -> plan -> launch: :func:`_check_inputs` checks a signature of inputs (dtypes, shapes, strides,
devices, options) once, :func:`_plan` picks tiles, splits and grids for it and the longest request;
both are cached, so a repeated call checks its scalars, builds the signature and launches the
compiled kernels directly (:class:`triton_swa.runtime.launch.Launcher`).
"""

from __future__ import annotations

import math
from functools import reduce
from operator import or_

import torch
import triton

from ...runtime import poison
from ...runtime.checks import (
    FLOAT_DTYPES,
    FP8_DTYPES,
    INDEX_DTYPES,
    check_int,
    check_kv_scale,
    check_logit_cap,
    check_pow2,
    check_sinks,
    check_sm_scale,
    check_tensor,
    check_window_left,
    split_kv_scale,
)
from ...runtime.device import KV_NATIVE, device_facts, interpreting, kv_fp8_mode
from ...runtime.guard import check_swa_extend, guarded
from ...runtime.launch import launcher_for
from ...runtime.plans import PlanCache, scale_key, tensor_key
from .._common.merge import MAX_SPLITS, merge_launcher
from .._common.workspace import eager_workspace
from ..kv_store import NO_STORE_CONSTEXPRS, check_store_kv_args, store_view
from .config import extend_config, extend_grid, extend_num_splits, extend_resident_programs
from .kernel import _swa_extend_kernel

__all__ = ["ExtendPlan", "swa_extend", "swa_extend_plan"]

_MAX_HEAD_DIM = 512
_MASK_DTYPES = (torch.bool, torch.uint8, torch.int8)


class _Inputs:
    """What the checks of one input signature found: sizes, forms and flags, and the plans made for it
    (one per longest-request length)."""

    __slots__ = (
        "T",
        "kv_dtype",
        "HQ",
        "H",
        "D",
        "DV",
        "B",
        "flatten_pages",
        "paged",
        "page_size",
        "has_mask",
        "bool_mask",
        "has_qpos",
        "has_sink",
        "softcap",
        "kv_scaled",
        "scale_ptr",
        "window_left",
        "causal",
        "max_window",
        "overrides",
        "stride_pt",
        "plans",
    )


class _Plan:
    """Tiles, splits, grids and launchers of one checked signature and longest request."""

    __slots__ = (
        "empty",
        "launch",
        "grid",
        "split",
        "num_splits",
        "lse_offset",
        "part_numel",
        "merge",
        "merge_grid",
        "default_scale",
        "kv_view",
        "bound",
        "direct",
        "constexprs",
        "config",
        "stores",
    )


class _StoreVariant:
    """A plan's kernel with the fused K/V store of one kind (its constexprs): launcher and binding."""

    __slots__ = ("launch", "bound")

    def __init__(self, launch):
        self.launch, self.bound = launch, None


_CHECKED = PlanCache()
_DATA_PTR = torch.Tensor.data_ptr


def _signature(
    q,
    k,
    v,
    k_buffer,
    v_buffer,
    qo_indptr,
    prefix_lens,
    kv_indptr,
    kv_indices,
    page_table,
    window_starts,
    page_size,
    causal,
    custom_mask,
    mask_indptr,
    q_positions,
    sinks,
    k_scale,
    v_scale,
    out,
    window_left,
    max_window,
    overrides,
    softcap,
) -> tuple:
    """What the checks depend on: every tensor's dtype, shape, strides and device, and the options'
    types and values. (Scalars' values are checked on every call; scale tensors enter by kind.) One
    flat tuple, the seven tensors every call has inline: the key is built and hashed per call."""
    if custom_mask is None and mask_indptr is None and q_positions is None:
        draft = None
    else:
        draft = (tensor_key(custom_mask), tensor_key(mask_indptr), tensor_key(q_positions))
    return (
        q.dtype,
        q.shape,
        q.stride(),
        q.device,
        k.dtype,
        k.shape,
        k.stride(),
        k.device,
        v.dtype,
        v.shape,
        v.stride(),
        v.device,
        k_buffer.dtype,
        k_buffer.shape,
        k_buffer.stride(),
        k_buffer.device,
        v_buffer.dtype,
        v_buffer.shape,
        v_buffer.stride(),
        v_buffer.device,
        qo_indptr.dtype,
        qo_indptr.shape,
        qo_indptr.stride(),
        qo_indptr.device,
        prefix_lens.dtype,
        prefix_lens.shape,
        prefix_lens.stride(),
        prefix_lens.device,
        None if kv_indptr is None else tensor_key(kv_indptr),
        None if kv_indices is None else tensor_key(kv_indices),
        None if page_table is None and window_starts is None else (tensor_key(page_table), tensor_key(window_starts)),
        draft,
        None if sinks is None else tensor_key(sinks),
        None if out is None else tensor_key(out),
        None if k_scale is None else scale_key(k_scale),
        None if v_scale is None else scale_key(v_scale),
        type(page_size),
        page_size,
        type(causal),
        causal,
        type(window_left),
        window_left,
        type(max_window),
        max_window,
        overrides,
        softcap,
    )


def _check_inputs(
    q,
    k,
    v,
    k_buffer,
    v_buffer,
    qo_indptr,
    prefix_lens,
    kv_indptr,
    kv_indices,
    page_table,
    window_starts,
    page_size,
    causal,
    custom_mask,
    mask_indptr,
    q_positions,
    sinks,
    k_scale,
    v_scale,
    out,
    window_left,
    max_window,
    overrides,
    softcap,
) -> _Inputs:
    """Check every tensor and option of a call (TypeError/ValueError naming the argument)."""
    check_tensor("q", q, dtype=FLOAT_DTYPES, ndim=3)
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
    check_tensor("k_buffer", k_buffer, dtype=(q.dtype, *FP8_DTYPES), device=dev)
    if k_buffer.dim() not in (3, 4) or k_buffer.shape[-2:] != (H, D):
        raise ValueError(f"k_buffer must have shape [slots, {H}, {D}] or [pages, page_size, {H}, {D}], got {list(k_buffer.shape)}")
    check_tensor("v_buffer", v_buffer, dtype=k_buffer.dtype, device=dev, ndim=k_buffer.dim())
    if v_buffer.shape[:-1] != k_buffer.shape[:-1] or v_buffer.shape[-1] != DV:
        raise ValueError(f"v_buffer must have shape {list(k_buffer.shape[:-1]) + [DV]}, got {list(v_buffer.shape)}")
    for name, x in (("q", q), ("k", k), ("v", v), ("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous along its last dimension (strides {x.stride()})")
    for name, buf in (("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        if buf.dim() == 4 and buf.stride(0) != buf.shape[1] * buf.stride(1):
            raise ValueError(f"a 4-D {name} must have its pages and in-page slots contiguous")
    check_tensor("prefix_lens", prefix_lens, dtype=INDEX_DTYPES, device=dev, ndim=1, contiguous=True)
    B = prefix_lens.shape[0]
    check_tensor("qo_indptr", qo_indptr, dtype=INDEX_DTYPES, device=dev, shape=(B + 1,), contiguous=True)
    check_window_left(window_left)
    slots = k_buffer.shape[0] * (k_buffer.shape[1] if k_buffer.dim() == 4 else 1)

    paged = page_table is not None or window_starts is not None
    if paged:
        if kv_indptr is not None or kv_indices is not None:
            raise ValueError("give either kv_indptr/kv_indices or page_table/window_starts, not both")
        if page_table is None or window_starts is None:
            raise ValueError("the page-table form needs both page_table and window_starts")
        check_tensor("page_table", page_table, dtype=INDEX_DTYPES, device=dev, ndim=2)
        if page_table.shape[0] != B:
            raise ValueError(f"page_table must have {B} rows (one per request), got {page_table.shape[0]}")
        if page_table.stride(1) != 1 and page_table.shape[1] > 1:
            raise ValueError("page_table rows must be contiguous (stride 1 along pages)")
        check_tensor("window_starts", window_starts, dtype=INDEX_DTYPES, device=dev, shape=(B,), contiguous=True)
        check_int("page_size", page_size, minimum=1)
        if slots % page_size:
            raise ValueError(f"k_buffer has {slots} slots, not a whole number of pages of page_size={page_size}")
    else:
        if kv_indptr is None or kv_indices is None:
            raise ValueError("the cached window is missing: give kv_indptr and kv_indices, or page_table and window_starts")
        check_tensor("kv_indptr", kv_indptr, dtype=INDEX_DTYPES, device=dev, shape=(B + 1,), contiguous=True)
        if isinstance(page_size, bool) or page_size != 1:
            check_int("page_size", page_size, minimum=1)
            raise ValueError(
                f"page_size must be 1 with CSR indices (they name token slots), got {page_size}; pass a page_table for the paged form"
            )
        check_tensor("kv_indices", kv_indices, dtype=INDEX_DTYPES, device=dev, ndim=1, contiguous=True)

    if isinstance(causal, torch.Tensor) or not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if custom_mask is not None:
        check_tensor("custom_mask", custom_mask, dtype=_MASK_DTYPES, device=dev, ndim=1, contiguous=True)
        if mask_indptr is None:
            raise ValueError("custom_mask needs mask_indptr (each request's offset into it)")
        check_tensor("mask_indptr", mask_indptr, dtype=INDEX_DTYPES, device=dev, ndim=1, contiguous=True)
        if mask_indptr.shape[0] < B:
            raise ValueError(f"mask_indptr must have at least {B} entries, got {mask_indptr.shape[0]}")
    elif mask_indptr is not None:
        raise ValueError("mask_indptr given without custom_mask")
    if q_positions is not None:
        check_tensor("q_positions", q_positions, dtype=INDEX_DTYPES, device=dev, shape=(T,), contiguous=True)
    check_sinks("sinks", sinks, HQ, dev)
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if isinstance(scale, torch.Tensor):
            check_kv_scale(name, scale, dev)
    if out is not None:
        check_tensor("out", out, dtype=q.dtype, device=dev, shape=(T, HQ, DV))
        if out.stride(2) != 1:
            raise ValueError("out must be contiguous along its last dimension")

    if max_window is None:
        max_window = page_table.shape[1] * page_size if paged else kv_indices.numel()
        if window_left >= 0:
            max_window = min(max_window, window_left + 1)
    check_int("max_window", max_window, minimum=0)
    block_m, block_n, pack, num_warps, num_stages, edge_in_loop, num_splits, dv_parts = overrides
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        if value is not None:
            check_pow2(name, value, 16)
    for name, value in (("pack", pack), ("num_warps", num_warps), ("num_stages", num_stages)):
        if value is not None:
            check_int(name, value, minimum=1)
    if edge_in_loop is not None and not isinstance(edge_in_loop, bool):
        raise TypeError(f"edge_in_loop must be a bool, got {type(edge_in_loop).__name__}")
    if num_splits is not None:
        check_int("num_splits", num_splits, minimum=1)
        if num_splits > MAX_SPLITS:
            raise ValueError(f"num_splits must be at most {MAX_SPLITS}, got {num_splits}")
    if dv_parts is not None:
        check_pow2("dv_parts", dv_parts, 1)
        width = max(16, triton.next_power_of_2(DV)) // dv_parts  # columns a part, the last one masked
        if dv_parts > 1 and (width < 16 or (dv_parts - 1) * width >= DV):
            raise ValueError(f"dv_parts must leave every part 16 value columns or more, some of them real (Dv = {DV}), got {dv_parts}")

    inputs = _Inputs()
    inputs.T, inputs.HQ, inputs.H, inputs.D, inputs.DV, inputs.B = T, HQ, H, D, DV, B
    inputs.flatten_pages = k_buffer.dim() == 4
    inputs.kv_dtype = k_buffer.dtype
    inputs.paged, inputs.page_size = paged, page_size if paged else 1
    inputs.has_mask, inputs.bool_mask = custom_mask is not None, custom_mask is not None and custom_mask.dtype == torch.bool
    inputs.has_qpos, inputs.has_sink = q_positions is not None, sinks is not None
    inputs.softcap, inputs.kv_scaled = softcap, k_scale is not None or v_scale is not None
    inputs.scale_ptr = isinstance(k_scale, torch.Tensor) or isinstance(v_scale, torch.Tensor)
    inputs.window_left, inputs.causal, inputs.max_window, inputs.overrides = window_left, causal, max_window, overrides
    inputs.stride_pt = page_table.stride(0) if paged else 0
    inputs.plans = {}
    return inputs


def _plan(inputs: _Inputs, max_extend_len: int, dtype: torch.dtype, itemsize: int, device: torch.device) -> _Plan:
    """Tiles (``extend_config`` unless overridden), splits (``extend_num_splits``), grids and launchers."""
    T, HQ, H, D, DV, B = inputs.T, inputs.HQ, inputs.H, inputs.D, inputs.DV, inputs.B
    block_m, block_n, pack, num_warps, num_stages, edge_in_loop, num_splits, dv_parts = inputs.overrides
    interpret = interpreting()
    # bf16 dots in float32 under the interpreter only (docs/contract.md §8: its bf16 tl.dot is wrong)
    upcast = interpret and dtype == torch.bfloat16
    facts = device_facts(device)
    kv_fp8, kv_view = kv_fp8_mode(facts, inputs.kv_dtype)
    wgmma = facts.backend == "cuda" and facts.arch == 90  # Hopper's warpgroup MMA (Triton emits it from 64-row tiles)
    cfg = extend_config(D, DV, HQ // H, max_extend_len, dtype, interpret, facts.smem_per_program, kv_fp8 != KV_NATIVE, wgmma)
    bm = cfg.block_m if block_m is None else block_m
    bn = cfg.block_n if block_n is None else block_n
    gp = min(cfg.pack, bm) if pack is None else pack
    if (HQ // H) % gp or bm % gp:
        raise ValueError(f"pack ({gp}) must divide the GQA group size ({HQ // H}) and block_m ({bm})")
    warps = cfg.num_warps if num_warps is None else num_warps
    stages = cfg.num_stages if num_stages is None else num_stages
    if edge_in_loop is None:
        edge_in_loop = cfg.edge_in_loop
    parts = cfg.dv_parts if dv_parts is None else dv_parts
    causal = inputs.causal and not inputs.has_mask
    plain_causal = causal and not inputs.has_qpos
    # a causal tile's diagonal spans its own bm // gp tokens: narrower key tiles there (16 keys at
    # least, tensor cores' smallest); the other loops keep bn
    bn_diag = max(16, min(bn, bm // gp)) if plain_causal else bn

    m_tiles = triton.cdiv(max_extend_len, bm // gp)
    if num_splits is None:
        resident = extend_resident_programs(bm, bn, stages, D, DV, itemsize, facts.smem_per_sm)
        num_splits = extend_num_splits(m_tiles * parts * (HQ // gp) * B, inputs.max_window, bn, facts.num_sms, resident, m_tiles == 1)
    plan = _Plan()
    plan.split = num_splits > 1
    plan.num_splits = num_splits
    plan.grid = extend_grid(m_tiles * parts, num_splits, HQ // gp, B, T * HQ if plan.split else 0)
    plan.empty = T == 0 or B == 0 or max_extend_len == 0
    # split-KV partials [T, HQ, splits, Dv], then their log2-sum-exp2 [T, HQ, splits]
    plan.lse_offset = T * HQ * num_splits * DV if plan.split else 0
    plan.part_numel = plan.lse_offset + T * HQ * num_splits if plan.split else 0
    constexprs = dict(
        G=HQ // H,
        GP=gp,
        D=D,
        DV=DV,
        BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_DV=max(16, triton.next_power_of_2(DV)),
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_N_DIAG=bn_diag,
        PAGED=inputs.paged,
        PAGE=inputs.page_size,
        WINDOW=inputs.window_left >= 0,
        CAUSAL=causal,
        HAS_MASK=inputs.has_mask,
        HAS_QPOS=inputs.has_qpos,
        SOFTCAP=inputs.softcap,
        HAS_SINK=inputs.has_sink,
        # bytes decoded in the kernel need their power of two back: through the K/V scales
        KV_SCALE=inputs.kv_scaled or kv_fp8 != KV_NATIVE,
        SCALE_PTR=inputs.scale_ptr,
        KV_FP8=kv_fp8,
        # float32 dots are exact (not tf32)
        # 16-bit dots: the target's default (tf32 applies to float32 inputs only, and AMD targets
        # other than gfx942 have no tf32 at all)
        DOT_PREC="ieee" if dtype == torch.float32 or upcast else None,
        SPLIT=plan.split,
        EDGE_IN_LOOP=edge_in_loop and plain_causal,
        UPCAST_DOT=upcast,
        DV_PARTS=parts,
        # the fused K/V store: off here (a plan with store_loc launches a variant, _store_variant)
        **NO_STORE_CONSTEXPRS,
    )
    plan.launch = launcher_for(_swa_extend_kernel, constexprs, warps, stages)
    plan.constexprs, plan.config, plan.stores = constexprs, (warps, stages), {}
    plan.default_scale = 1.0 / math.sqrt(D)
    plan.kv_view = kv_view
    plan.merge = merge_launcher(None, HQ, DV, num_splits, inputs.has_sink, skip_padding=True) if plan.split else None
    plan.merge_grid = (T * HQ, 1, 1)
    plan.bound = None  # (main, merge) compiled for plans' runs, bound at the first aligned one (ExtendPlan)
    plan.direct = None  # the same for swa_extend's own calls (whose unread pointers are its own)
    return plan


def _max_extend_len(qo_indptr: torch.Tensor, total: int) -> int:
    """Longest request of the batch: read from the device (one sync), or ``T`` while a CUDA graph
    captures."""
    if qo_indptr.shape[0] < 2:
        return 0
    if qo_indptr.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return total
    return int((qo_indptr[1:] - qo_indptr[:-1]).max())


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
    dv_parts: int | None = None,
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
            ``q``'s dtype or fp8 e4m3 (``float8_e4m3fn`` or its ``uint8`` storage, or
            ``float8_e4m3fnuz``).
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
            ``TRITON_SWA_POISON=1``). Whatever ``qo_indptr`` holds (device contents are checked only
            in debug mode), the kernels clip each request's rows to ``[0, T)``: no row of ``q``,
            ``k``, ``v`` or ``q_positions`` past ``T`` is read, none of ``out`` (or the split
            partials) is written.

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
        dv_parts (int | None): programs a query tile's value width is divided among (a power of
            two, at least 16 value columns each; each computes the scores whole): override
            ``extend_config``'s choice, which divides only where a wide head's accumulator would not
            fit the registers otherwise.
        debug (bool | None): check every index this call reads or writes before launching (a host
            sync; ValueError naming request, position and slot); None follows ``TRITON_SWA_DEBUG``
            (see :mod:`triton_swa.runtime.guard`).

    Returns:
        torch.Tensor: `[T, HQ, Dv]` in ``q``'s dtype (``out`` when given).

    Raises:
        TypeError: naming the argument, before anything is launched, for a wrong type or dtype.
        ValueError: naming the argument, before anything is launched, for a wrong shape, device,
            stride, window, page size, head ratio or scalar value, or a grid past CUDA's limits.
    """
    # Scalars: checked on every call (the signature holds their types, not their values), before any
    # tensor is allocated or launched on.
    check_window_left(window_left)
    logit_cap = check_logit_cap(logit_cap)
    sm_scale = check_sm_scale(sm_scale, None)
    ks, ks_t = split_kv_scale("k_scale", k_scale)
    vs, vs_t = split_kv_scale("v_scale", v_scale)
    overrides = (block_m, block_n, pack, num_warps, num_stages, edge_in_loop, num_splits, dv_parts)
    args = (
        q,
        k,
        v,
        k_buffer,
        v_buffer,
        qo_indptr,
        prefix_lens,
        kv_indptr,
        kv_indices,
        page_table,
        window_starts,
        page_size,
        causal,
        custom_mask,
        mask_indptr,
        q_positions,
        sinks,
        k_scale,
        v_scale,
        out,
        window_left,
        max_window,
        overrides,
        logit_cap > 0,
    )
    inputs, plan = _checked_plan(args, max_extend_len)

    if out is None:
        out = poison.empty(inputs.T, inputs.HQ, inputs.DV, dtype=q.dtype, device=q.device)
    if plan.empty:
        return out
    if inputs.flatten_pages or plan.kv_view is not None:
        k_buffer, v_buffer = _kv_views(inputs, plan, k_buffer, v_buffer)
    if inputs.scale_ptr:
        ks, vs = _scale_tensors(ks, ks_t, vs, vs_t, q.device)
    workspace = None
    if not plan.split:
        part = out
    else:
        workspace = eager_workspace(q.device, 0, plan.part_numel)
        part = poison.empty(plan.part_numel, dtype=torch.float32, device=q.device) if workspace is None else workspace[1]
    scale = plan.default_scale if sm_scale is None else sm_scale
    direct = plan.direct
    if direct is not False:
        # the signature's compiled kernels, for calls whose pointers are all 16-byte aligned, launched
        # with addresses (the checks vouch for their devices); prefix_lens and q stand in for the
        # pointers the kernel does not read, as _index_args and _no_store give them
        qp, op, pl = q.data_ptr(), out.data_ptr(), prefix_lens.data_ptr()
        paged, mask = inputs.paged, inputs.has_mask
        ptrs = (
            qp,
            k.data_ptr(),
            v.data_ptr(),
            k_buffer.data_ptr(),
            v_buffer.data_ptr(),
            op,
            op if part is out else workspace[3] if workspace is not None else part.data_ptr(),
            qo_indptr.data_ptr(),
            pl,
            pl if paged else kv_indptr.data_ptr(),
            pl if paged else kv_indices.data_ptr(),
            page_table.data_ptr() if paged else pl,
            window_starts.data_ptr() if paged else pl,
            custom_mask.data_ptr() if mask else pl,
            mask_indptr.data_ptr() if mask else pl,
            pl if q_positions is None else q_positions.data_ptr(),
            qp if sinks is None else sinks.data_ptr(),
            *((ks.data_ptr(), vs.data_ptr()) if inputs.scale_ptr else (ks, vs)),
        )
        if reduce(or_, ptrs[: 19 if inputs.scale_ptr else 17]) & 15 == 0:
            if direct is None:
                direct = _bind_direct(inputs, plan, args, (k_buffer, v_buffer, out, part), (ks, vs, scale, logit_cap))
            if direct:
                main, merge, ints, merge_ints = direct
                main((*ptrs, scale, logit_cap, *ints, qp, qp, qp, qp, 0, 0, 0, 0))
                if merge is not None:
                    merge((ptrs[6], ptrs[16], op, ptrs[7], *merge_ints))
                return out
    args, merge_args = _launch_args(inputs, plan, args, (k_buffer, v_buffer, out, part), (ks, vs, scale, logit_cap))
    plan.launch(args, plan.grid)
    if merge_args is not None:
        plan.merge(merge_args, plan.merge_grid)
    return out


def _launch_args(inputs: _Inputs, plan: _Plan, call: tuple, buffers: tuple, numbers: tuple) -> tuple:
    """The kernel's and the merge's arguments as tensors and numbers (the merge's None without
    splits): ``call`` the call's signature arguments, ``buffers`` ``(k_buffer, v_buffer, out, part)``
    as launched (:func:`_kv_views`), ``numbers`` ``(k_scale, v_scale, sm_scale, logit_cap)``."""
    q, k, v, _, _, qo_indptr, prefix_lens, kv_indptr, kv_indices, page_table, window_starts = call[:11]
    custom_mask, mask_indptr, q_positions, sinks = call[13:17]
    k_buffer, v_buffer, out, part = buffers
    indices = _index_args(
        inputs, qo_indptr, prefix_lens, kv_indptr, kv_indices, page_table, window_starts, custom_mask, mask_indptr, q_positions
    )
    sinks_arg = sinks if sinks is not None else q
    strides = _strides(q, k, v, k_buffer, v_buffer, out)
    args = _kernel_args(inputs, plan, q, k, v, k_buffer, v_buffer, out, part, indices, sinks_arg, *numbers, call[20], strides)
    merge_args = _merge_args(inputs, plan, part, sinks_arg, out, qo_indptr, strides) if plan.split else None
    return args, merge_args


def _bind_direct(inputs: _Inputs, plan: _Plan, call: tuple, buffers: tuple, numbers: tuple):
    """``swa_extend``'s own kernels for a plan, compiled at its first aligned call (arguments as
    :func:`_launch_args` takes them): ``(main, merge, the kernel's integers after the scale and cap,
    the merge's integers)``, all fixed by the signature and the plan, or False (no direct launch)."""
    args, merge_args = _launch_args(inputs, plan, call, buffers, numbers)
    pair = _bind_pair(plan, args, merge_args)
    # the kernel's arguments: 17 pointers, the two scales (pointers or numbers), scale, cap, then
    # window_left ... stride_pt, then the fused store's eight (_no_store)
    plan.direct = pair and (*pair, args[21:-8], merge_args[4:] if merge_args is not None else ())
    return plan.direct


def _bind_pair(plan: _Plan, args: tuple, merge_args: tuple | None, launch=None):
    """(main, merge) of a plan compiled for these arguments' specialisation, or False (no direct
    launch); ``launch``: a store variant's launcher instead of the plan's."""
    main = (launch or plan.launch).bind(args, plan.grid)
    merge = plan.merge.bind(merge_args, plan.merge_grid) if main is not None and plan.split else None
    return (main, merge) if main is not None and (merge is not None or not plan.split) else False


def _checked_plan(args: tuple, max_extend_len) -> tuple[_Inputs, _Plan]:
    """The checks of a signature (cached) and its plan for the longest request (cached per length)."""
    inputs = _CHECKED.get_or_make(_signature, _check_inputs, args)
    if max_extend_len is None:
        max_extend_len = _max_extend_len(args[5], inputs.T)
    check_int("max_extend_len", max_extend_len, minimum=0)
    plan = inputs.plans.get(max_extend_len)
    if plan is None:
        q = args[0]
        plan = inputs.plans[max_extend_len] = _plan(inputs, max_extend_len, q.dtype, q.element_size(), q.device)
    return inputs, plan


def _kv_views(inputs: _Inputs, plan: _Plan, k_buffer, v_buffer) -> tuple:
    """The pools as the kernel reads them: pages flattened to slots, fp8 storage viewed as fp8."""
    if inputs.flatten_pages:
        k_buffer = k_buffer.view(-1, *k_buffer.shape[2:])
        v_buffer = v_buffer.view(-1, *v_buffer.shape[2:])
    if plan.kv_view is not None:
        k_buffer, v_buffer = k_buffer.view(plan.kv_view), v_buffer.view(plan.kv_view)
    return k_buffer, v_buffer


def _scale_tensors(ks, ks_t, vs, vs_t, dev) -> tuple:
    """Both scales through pointers (one constexpr): a number becomes a one-element tensor."""
    ks = ks_t if ks_t is not None else torch.full((1,), ks, dtype=torch.float32, device=dev)
    vs = vs_t if vs_t is not None else torch.full((1,), vs, dtype=torch.float32, device=dev)
    return ks, vs


def _index_args(
    inputs: _Inputs, qo_indptr, prefix_lens, kv_indptr, kv_indices, page_table, window_starts, custom_mask, mask_indptr, q_positions
):
    """The kernel's nine index pointers in order, ``prefix_lens`` standing in for those not given."""
    if inputs.has_mask:
        mask_arg = custom_mask.view(torch.uint8) if inputs.bool_mask else custom_mask
    else:
        mask_arg = mask_indptr = prefix_lens
    if not inputs.paged:
        page_table = window_starts = prefix_lens
    else:
        kv_indptr = kv_indices = prefix_lens
    q_positions = q_positions if q_positions is not None else prefix_lens
    return (qo_indptr, prefix_lens, kv_indptr, kv_indices, page_table, window_starts, mask_arg, mask_indptr, q_positions)


def _strides(q, k, v, k_buffer, v_buffer, out) -> tuple:
    """The row and head strides the kernel takes, in its order (buffers as :func:`_kv_views` gives them)."""
    return (*q.stride()[:2], *k.stride()[:2], *v.stride()[:2], *k_buffer.stride()[:2], *v_buffer.stride()[:2], *out.stride()[:2])


def _no_store(q) -> tuple:
    """The fused store's arguments of a launch without one: ``q`` standing in for its pointers."""
    return (q, q, q, q, 0, 0, 0, 0)


def _store_variant(plan: _Plan, constexprs: dict) -> _StoreVariant:
    key = tuple(sorted(constexprs.items()))
    variant = plan.stores.get(key)
    if variant is None:
        variant = plan.stores[key] = _StoreVariant(launcher_for(_swa_extend_kernel, {**plan.constexprs, **constexprs}, *plan.config))
    return variant


def _plan_store(inputs: _Inputs, k, v, k_buffer, v_buffer, store_loc, store_mapping, k_scale, v_scale) -> tuple:
    """Check a fused K/V store of an extend plan (``store_loc``: one slot per new token, ``k``/``v`` the
    rows written) as :func:`store_kv` checks its arguments; returns ``(constexprs, stride_loc,
    n_mapping)``."""
    if inputs.flatten_pages:
        raise ValueError("store_loc needs [slots, H, D] KV buffers (a fused store does not write paged [pages, page, H, D] ones)")
    if isinstance(store_loc, torch.Tensor) and store_loc.dim() == 1 and store_loc.shape[0] != inputs.T:
        raise ValueError(f"store_loc must hold one slot per new token ({inputs.T}), got {store_loc.shape[0]}")
    names = ("store_loc", "k", "v", "store_mapping")
    check_store_kv_args(k_buffer, v_buffer, store_loc, k, v, store_mapping, k_scale, v_scale, names=names)
    # the kernel takes both scales as numbers or both through pointers (scale_ptr)
    modes = tuple(0 if x is None else 2 if inputs.scale_ptr else 1 for x in (k_scale, v_scale))
    constexprs = dict(
        STORE=True,
        STORE_MAPPING=store_mapping is not None,
        STORE_K_SCALE=modes[0],
        STORE_V_SCALE=modes[1],
        K_ENC=store_view(k_buffer)[1],
        V_ENC=store_view(v_buffer)[1],
    )
    return constexprs, store_loc.stride(0), 0 if store_mapping is None else store_mapping.numel()


def _kernel_args(
    inputs: _Inputs, plan: _Plan, q, k, v, k_buffer, v_buffer, out, part, indices, sinks_arg, ks, vs, scale, cap, window_left, strides,
    store=None,
):  # fmt: skip
    return (
        q,
        k,
        v,
        k_buffer,
        v_buffer,
        out,
        part,
        *indices,
        sinks_arg,
        ks,
        vs,
        scale,
        cap,
        window_left,
        plan.num_splits,
        plan.lse_offset,
        inputs.HQ,
        inputs.T,
        *strides,
        inputs.stride_pt,
        *(_no_store(q) if store is None else store),
    )


def _merge_args(inputs: _Inputs, plan: _Plan, part, sinks_arg, out, qo_indptr, strides) -> tuple:
    return (part, sinks_arg, out, qo_indptr, plan.num_splits, plan.lse_offset, strides[-2], strides[-1], inputs.HQ, inputs.B)


class ExtendPlan:
    """:func:`swa_extend` checked and planned once for a step's requests; :meth:`run` launches it.

    Made by :func:`swa_extend_plan`. The plan holds the step's layout and windows (``qo_indptr``,
    ``prefix_lens``, the window indices or page table, the draft mask and positions: read at each
    run), tiles, splits, grids, compiled kernels and the split-KV workspace; a run checks that its
    tensors are the planned kind in O(1) and launches the compiled kernels directly. Runs of one
    plan share its workspace: issue them in order on one stream, not concurrently.
    """

    __slots__ = (
        "_inputs",
        "_plan",
        "_keys",
        "_indices",
        "_sinks",
        "_scales",
        "_scale_kinds",
        "_floats",
        "_strides",
        "_part",
        "_part_ptr",
        "_index_ptrs",
        "_bound",
        "_store",
        "__weakref__",
    )

    def __init__(self, inputs: _Inputs, plan: _Plan, tensors: tuple, indices: tuple, sinks, k_scale, v_scale, floats: tuple, store=None):
        self._inputs, self._plan = inputs, plan
        # the fused store: (variant, slots, mapping, their addresses, stride_loc, n_mapping), or None
        self._store = None
        if store is not None:
            constexprs, loc, mapping, stride_loc, n_mapping = store
            mapping = loc if mapping is None else mapping  # a stand-in where STORE_MAPPING is off
            self._store = (_store_variant(plan, constexprs), loc, mapping, loc.data_ptr(), mapping.data_ptr(), stride_loc, n_mapping)
        self._keys = tuple(tensor_key(t) for t in tensors)  # q, k, v, k_buffer, v_buffer
        self._indices, self._sinks = indices, sinks
        self._scales = (k_scale, v_scale)
        self._scale_kinds = (scale_key(k_scale), scale_key(v_scale))
        self._floats = floats  # sm_scale, logit_cap, window_left
        q = tensors[0]
        self._part = poison.empty(plan.part_numel, dtype=torch.float32, device=q.device) if plan.split and not plan.empty else None
        self._part_ptr = None if self._part is None else self._part.data_ptr()
        self._index_ptrs = tuple(t.data_ptr() for t in indices)
        # runs launch the compiled kernels that the plan shares (see DecodePlan), when this plan's own
        # pointers are aligned too
        own = (*self._index_ptrs, self._part_ptr or 0)
        self._bound = None if all(p & 15 == 0 for p in own) else False
        # the kernel's strides: the planned tensors', a contiguous output's
        HQ, DV = inputs.HQ, inputs.DV
        out = torch.empty_strided((inputs.T, HQ, DV), (HQ * DV, DV, 1), dtype=q.dtype, device="meta")
        self._strides = _strides(*tensors[:3], *_kv_views(inputs, plan, *tensors[3:]), out)

    @property
    def out_shape(self) -> tuple:
        """``[T, HQ, Dv]``: the shape of a run's output."""
        i = self._inputs
        return (i.T, i.HQ, i.DV)

    def run(self, q, k, v, k_buffer, v_buffer, out=None, *, sinks=None, k_scale=None, v_scale=None) -> torch.Tensor:
        """Attend ``q`` (new tokens ``k``, ``v``) over the planned windows of ``k_buffer``/``v_buffer``
        (any layer's buffers of the planned kind); returns ``out`` (new when None; only the rows of
        requests are written). ``sinks``, ``k_scale``, ``v_scale`` default to the planned ones and
        must be of their kind.

        Raises:
            TypeError, ValueError: a tensor or scale not of the planned kind, before any launch.
        """
        names = ("q", "k", "v", "k_buffer", "v_buffer")
        for name, x, key in zip(names, (q, k, v, k_buffer, v_buffer), self._keys):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
            if tensor_key(x) != key:
                raise ValueError(f"{name} must be what the plan was made for ({key}), got {tensor_key(x)}: make a new plan")
        if out is not None:
            T, HQ, DV = self.out_shape
            want = (q.dtype, torch.Size((T, HQ, DV)), (HQ * DV, DV, 1), q.device)
            if not isinstance(out, torch.Tensor) or tensor_key(out) != want:
                raise ValueError(f"out must be a contiguous [{T}, {HQ}, {DV}] tensor of q's dtype and device")
        if sinks is None:
            sinks = self._sinks
        elif tensor_key(sinks) != tensor_key(self._sinks):
            raise ValueError("sinks must be of the planned kind (dtype, shape, strides and device of the plan's sinks)")
        k_scale = self._scales[0] if k_scale is None else k_scale
        v_scale = self._scales[1] if v_scale is None else v_scale
        if (scale_key(k_scale), scale_key(v_scale)) != self._scale_kinds:
            raise ValueError("k_scale and v_scale must be of the planned kinds (a number, or a tensor of the plan's dtype, shape, device)")
        ks, ks_t = split_kv_scale("k_scale", k_scale)
        vs, vs_t = split_kv_scale("v_scale", v_scale)
        stores = None if self._store is None else (store_view(k_buffer)[0], store_view(v_buffer)[0])
        return self._launch(q, k, v, k_buffer, v_buffer, out, sinks, ks, ks_t, vs, vs_t, stores)

    def _launch(self, q, k, v, k_buffer, v_buffer, out, sinks, ks, ks_t, vs, vs_t, stores=None) -> torch.Tensor:
        """:meth:`run` after its checks (scales split by ``split_kv_scale``; ``out`` None allocates;
        ``stores``: the buffers as ``store_view`` gives them, for a plan with a fused store). Tensors
        are read by pointer with the planned strides: a ``[T, HQ * D]`` view of a planned ``[T, HQ,
        D]`` ``q`` (likewise ``k``, ``v``, ``out``) is the same call."""
        inputs, plan = self._inputs, self._plan
        if out is None:
            out = poison.empty(inputs.T, inputs.HQ, inputs.DV, dtype=q.dtype, device=q.device)
        if plan.empty:
            return out
        store = self._store
        k_buffer, v_buffer = _kv_views(inputs, plan, k_buffer, v_buffer)
        if inputs.scale_ptr:
            ks, vs = _scale_tensors(ks, ks_t, vs, vs_t, q.device)
        sinks_arg = sinks if sinks is not None else q
        scale, cap, window_left = self._floats
        strides = self._strides
        bound = False if self._bound is False else plan.bound if store is None else store[0].bound
        if bound is not False:
            # the compiled kernels, for runs whose own pointers are 16-byte aligned (as the plan's
            # stay), launched with addresses: the checks vouch for their devices
            ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), k_buffer.data_ptr(), v_buffer.data_ptr(), out.data_ptr())
            sp = sinks_arg.data_ptr()
            scales = (ks.data_ptr(), vs.data_ptr()) if inputs.scale_ptr else (ks, vs)
            bits = sp
            for p in ptrs:
                bits |= p
            if inputs.scale_ptr:
                bits |= scales[0] | scales[1]
            if store is None:
                qp = ptrs[0]
                store_args = (qp, qp, qp, qp, 0, 0, 0, 0)
            else:
                kst, vst = stores[0].data_ptr(), stores[1].data_ptr()
                bits |= kst | vst
                store_args = (kst, vst, store[3], store[4], store[5], store[6], stores[0].shape[0], stores[1].shape[0])
            if bits & 15 == 0:
                if bound is None:
                    bound = self._bind(q, k, v, k_buffer, v_buffer, out, sinks_arg, ks, vs, stores)
                if bound:
                    main, merge = bound
                    part = self._part_ptr if self._part is not None else ptrs[5]
                    tail = (scale, cap, window_left, plan.num_splits, plan.lse_offset, inputs.HQ, inputs.T, *strides, inputs.stride_pt)
                    main((*ptrs, part, *self._index_ptrs, sp, *scales, *tail, *store_args))
                    if merge is not None:
                        qo_indptr = self._index_ptrs[0]
                        merge((part, sp, ptrs[5], qo_indptr, plan.num_splits, plan.lse_offset, *strides[-2:], inputs.HQ, inputs.B))
                    return out
        part = out if self._part is None else self._part
        args = _kernel_args(
            inputs, plan, q, k, v, k_buffer, v_buffer, out, part, self._indices, sinks_arg, ks, vs, scale, cap, window_left, strides,
            self._store_args(stores),
        )  # fmt: skip
        (plan.launch if store is None else store[0].launch)(args, plan.grid)
        if plan.split:
            plan.merge(_merge_args(inputs, plan, part, sinks_arg, out, self._indices[0], strides), plan.merge_grid)
        return out

    def _store_args(self, stores) -> tuple | None:
        """The kernel's store arguments as tensors and integers (None without a fused store)."""
        store = self._store
        if store is None:
            return None
        return (*stores, store[1], store[2], store[5], store[6], stores[0].shape[0], stores[1].shape[0])

    def _bind(self, q, k, v, k_buffer, v_buffer, out, sinks_arg, ks, vs, stores=None):
        """(main, merge) compiled for these arguments' specialisation, or False (no direct launch)."""
        inputs, plan, store = self._inputs, self._plan, self._store
        scale, cap, window_left = self._floats
        part = out if self._part is None else self._part
        args = _kernel_args(
            inputs, plan, q, k, v, k_buffer, v_buffer, out, part, self._indices, sinks_arg, ks, vs, scale, cap, window_left, self._strides,
            self._store_args(stores),
        )  # fmt: skip
        merge_args = _merge_args(inputs, plan, part, sinks_arg, out, self._indices[0], self._strides) if plan.split else None
        if store is None:
            plan.bound = _bind_pair(plan, args, merge_args)
            return plan.bound
        store[0].bound = _bind_pair(plan, args, merge_args, store[0].launch)
        return store[0].bound


@guarded(check_swa_extend)
def swa_extend_plan(
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
    max_extend_len: int | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    pack: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    edge_in_loop: bool | None = None,
    max_window: int | None = None,
    num_splits: int | None = None,
    dv_parts: int | None = None,
    store_loc: torch.Tensor | None = None,
    store_mapping: torch.Tensor | None = None,
) -> ExtendPlan:
    """Check and plan :func:`swa_extend` once, for "plan once per step, run per layer".

    Takes :func:`swa_extend`'s arguments but ``out`` (the same rules and errors) and returns an
    :class:`ExtendPlan`: ``plan.run(q, k, v, k_buffer, v_buffer, out=None, *, sinks=None,
    k_scale=None, v_scale=None)`` then attends any layer's tensors of the planned dtypes, shapes and
    strides over the planned requests and windows, with O(1) checks and the compiled kernels
    launched directly; equal to :func:`swa_extend` with the same arguments, bit for bit. Give
    ``max_extend_len`` (else it is read from ``qo_indptr``: one device sync, here only).

    ``store_loc`` (int32/int64 `[T]`, one slot per new token) and ``store_mapping`` (a sliding
    layer's ``full_to_swa_index_mapping``, or None) make each run also write the run's ``k``/``v``
    into ``k_buffer``/``v_buffer`` at those slots, as :func:`~triton_swa.store_kv` with the same
    arguments and scales would (the same bytes), in the same launch: the tiles read the new keys from
    ``k``/``v``, so nothing orders the writes before the reads. The window must not read a slot being
    written (no live window holds a step's new slots; padding rows write a dummy slot no window
    reads). Needs ``[slots, H, D]`` buffers.

    Raises:
        TypeError, ValueError: as :func:`swa_extend`, and as :func:`~triton_swa.store_kv` for the
            store's arguments, before anything is launched.
    """
    check_window_left(window_left)
    logit_cap = check_logit_cap(logit_cap)
    sm_scale = check_sm_scale(sm_scale, None)
    split_kv_scale("k_scale", k_scale)
    split_kv_scale("v_scale", v_scale)
    overrides = (block_m, block_n, pack, num_warps, num_stages, edge_in_loop, num_splits, dv_parts)
    args = (
        q,
        k,
        v,
        k_buffer,
        v_buffer,
        qo_indptr,
        prefix_lens,
        kv_indptr,
        kv_indices,
        page_table,
        window_starts,
        page_size,
        causal,
        custom_mask,
        mask_indptr,
        q_positions,
        sinks,
        k_scale,
        v_scale,
        None,
        window_left,
        max_window,
        overrides,
        logit_cap > 0,
    )
    inputs, plan = _checked_plan(args, max_extend_len)
    indices = _index_args(
        inputs, qo_indptr, prefix_lens, kv_indptr, kv_indices, page_table, window_starts, custom_mask, mask_indptr, q_positions
    )
    scale = plan.default_scale if sm_scale is None else sm_scale
    store = None
    if store_loc is not None:
        constexprs, stride_loc, n_mapping = _plan_store(inputs, k, v, k_buffer, v_buffer, store_loc, store_mapping, k_scale, v_scale)
        store = (constexprs, store_loc, store_mapping, stride_loc, n_mapping)
    elif store_mapping is not None:
        raise ValueError("store_mapping needs store_loc (a fused K/V store)")
    floats = (scale, logit_cap, window_left)
    return ExtendPlan(inputs, plan, (q, k, v, k_buffer, v_buffer), indices, sinks, k_scale, v_scale, floats, store)
