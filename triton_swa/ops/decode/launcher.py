"""Paged sliding-window decode: one query per request over its window of cached K/V.

One kernel serves sliding and full layers (the window is already in the indices). The number of
splits comes from the longest window (``max_window``, a host int) and the SM count, never from the
context length, and is fixed for a given batch shape, so a call is capturable in a CUDA graph. Splits
write float32 partial outputs with their log-sum-exp, which are merged (and the sinks added); with one
split the kernel writes the output directly. Eager calls with head dims up to 256 merge in place: the
last split of each group merges, counted by self-resetting per-stream counters, into a per-stream
workspace (one launch per call; the same GPU time as the merge kernel on the H200, B 1: 8.9 us at
D 128, 12.5 at D 256). Inside a CUDA-graph capture, and for 512-wide heads (where merging in place
doubled the GPU time: 39 against 18 us at B 1), the merge kernel runs after the splits.

Two ways to name the window's slots:

- CSR (page size 1): ``kv_indptr [B + 1]`` and ``kv_indices`` (token slots, oldest first), as built by
  :func:`triton_swa.build_window_indices`.
- Page table: ``page_table [B, max_pages]`` whose entry ``j`` is the pool page of the window's ``j``-th
  page (page 0 holds position ``window_starts[b]``), with the window covering positions
  ``[window_starts[b], seq_lens[b])``; position ``t`` sits at offset ``t % page_size`` of its page.

Check -> plan -> launch: :func:`_check_and_plan` checks a signature of inputs (dtypes, shapes,
strides, devices, options) once and plans tiles, splits, grid and kernel arguments; the plan is
cached by that signature, so a repeated call checks its scalars, builds the signature and launches
the compiled kernels directly (:class:`triton_swa.runtime.launch.Launcher`).
"""

from __future__ import annotations

import math
from functools import reduce
from operator import or_
from typing import NamedTuple

import torch
import triton

from ...runtime import poison
from ...runtime.checks import (
    FLOAT_DTYPES,
    FP8_DTYPES,
    INDEX_DTYPES,
    check_grid,
    check_int,
    check_kv_scale,
    check_logit_cap,
    check_pow2,
    check_sinks,
    check_sm_scale,
    check_tensor,
    split_kv_scale,
)
from ...runtime.device import device_facts, interpreting, kv_fp8_mode
from ...runtime.guard import check_swa_decode, guarded
from ...runtime.launch import Launcher
from ...runtime.plans import PlanCache, scale_key, tensor_key
from .._common.merge import MAX_SPLITS, merge_block_s, merge_dv_chunks, merge_launcher
from .._common.workspace import eager_workspace
from ..kv_store import NO_STORE_CONSTEXPRS, check_store_kv_args, store_view
from .config import decode_block_config, decode_fit_block_n, decode_min_split_tokens, decode_num_splits, decode_resident_programs
from .kernel import _swa_decode_kernel

__all__ = ["DecodePlan", "swa_decode", "swa_decode_plan"]


class _Tune(NamedTuple):
    """Launcher overrides beyond the public ``num_splits``/``block_n`` (benchmarks sweep them).

    ``fused_merge``: the group's last split merges the partials in place (eager calls; inside a CUDA-graph
    capture the merge kernel runs instead, compiled at the first direct launch of the eager kernel, or
    inside the capture where no call launched directly before it). None: a direct call's default
    (:func:`_direct_tune`).
    ``f16_dot``: over an fp8 pool, bfloat16 queries run both dots in float16 (the default) or, with
    False, in bfloat16.
    """

    num_warps: int | None = None
    num_stages: int | None = None
    fused_merge: bool | None = None
    f16_dot: bool | None = None


class _Plan:
    """Everything a checked signature of inputs decides: kernels, grids, integer arguments, buffers."""

    __slots__ = (
        "out_shape",
        "default_scale",
        "kv_view",
        "split",
        "fused",
        "programs",
        "part_numel",
        "ints",
        "main",
        "merge",
        "merge_ints",
        "fallback",
        "bound",
        "direct",
    )


_PLANS = PlanCache()


def _signature(
    q,
    k_buffer,
    v_buffer,
    kv_indptr,
    kv_indices,
    page_table,
    window_starts,
    seq_lens,
    page_size,
    sinks,
    k_scale,
    v_scale,
    out,
    max_window,
    num_splits,
    block_n,
    softcap,
    tune,
    new_kv=None,
) -> tuple:
    """What the checks and the plan depend on: dtypes, shapes, strides and devices of the tensors, the
    types and values of the options. CSR indices enter by dtype, device and contiguity only (their length
    changes every step), unless their length is the default ``max_window``."""
    if kv_indices is None:
        indices = None
    elif max_window is None:
        indices = tensor_key(kv_indices)
    else:
        indices = (kv_indices.dtype, kv_indices.dim(), kv_indices.is_contiguous(), kv_indices.device)
    if page_table is None and window_starts is None and seq_lens is None:
        paged = None
    else:
        paged = (tensor_key(page_table), tensor_key(window_starts), tensor_key(seq_lens))
    # one flat tuple, the three tensors every call has inline: the key is built and hashed per call
    return (
        q.dtype,
        q.shape,
        q.stride(),
        q.device,
        k_buffer.dtype,
        k_buffer.shape,
        k_buffer.stride(),
        k_buffer.device,
        v_buffer.dtype,
        v_buffer.shape,
        v_buffer.stride(),
        v_buffer.device,
        None if kv_indptr is None else tensor_key(kv_indptr),
        indices,
        paged,
        None if sinks is None else tensor_key(sinks),
        None if out is None else tensor_key(out),
        None if k_scale is None else scale_key(k_scale),
        None if v_scale is None else scale_key(v_scale),
        softcap,
        None if new_kv is None else tuple(map(tensor_key, new_kv)),
        type(page_size),
        page_size,
        type(max_window),
        max_window,
        type(num_splits),
        num_splits,
        type(block_n),
        block_n,
        tune,
    )


class _Store(NamedTuple):
    """The fused K/V store's part of a plan: its integer arguments and constexprs (off: zeros)."""

    ints: tuple = (0,) * 10
    constexprs: dict = NO_STORE_CONSTEXPRS


def _check_store(new_kv, k_buffer, v_buffer, k_scale, v_scale, B: int) -> _Store:
    """Check the fused store's ``(store_loc, store_mapping, k_new, v_new)`` as :func:`store_kv` checks
    its arguments (one new row per request), and plan its part of the kernel."""
    if new_kv is None:
        return _Store()
    loc, mapping, k_new, v_new = new_kv
    if loc is None or k_new is None or v_new is None:
        raise ValueError("a fused K/V store needs store_loc, k_new and v_new together")
    names = ("store_loc", "k_new", "v_new", "store_mapping")
    check_store_kv_args(k_buffer, v_buffer, loc, k_new, v_new, mapping, k_scale, v_scale, names=names)
    if loc.shape[0] != B:
        raise ValueError(f"store_loc must hold one slot per request ({B}), got {loc.shape[0]}")
    modes = tuple(0 if s is None else 2 if isinstance(s, torch.Tensor) else 1 for s in (k_scale, v_scale))
    _, k_enc = store_view(k_buffer)
    _, v_enc = store_view(v_buffer)
    n_mapping = 0 if mapping is None else mapping.numel()
    ints = (*k_new.stride(), *v_new.stride(), loc.stride(0), n_mapping, k_buffer.shape[0], v_buffer.shape[0])
    constexprs = dict(STORE=True, STORE_MAPPING=mapping is not None, K_ENC=k_enc, V_ENC=v_enc)
    constexprs.update(STORE_K_SCALE=modes[0], STORE_V_SCALE=modes[1])
    return _Store(ints, constexprs)


def _check_and_plan(
    q,
    k_buffer,
    v_buffer,
    kv_indptr,
    kv_indices,
    page_table,
    window_starts,
    seq_lens,
    page_size,
    sinks,
    k_scale,
    v_scale,
    out,
    max_window,
    num_splits,
    block_n,
    softcap,
    tune,
    new_kv=None,
) -> _Plan:
    """Check the inputs (raising TypeError/ValueError naming the argument) and plan the launch."""
    check_tensor("q", q, dtype=FLOAT_DTYPES, ndim=3)
    device = q.device
    B, HQ, D = q.shape
    check_tensor("k_buffer", k_buffer, device=device, ndim=3)
    check_tensor("v_buffer", v_buffer, device=device, ndim=3)
    kv_dtype = k_buffer.dtype
    if kv_dtype not in (q.dtype, *FP8_DTYPES):
        raise TypeError(
            f"k_buffer must have q's dtype {q.dtype} or be fp8 e4m3 (float8_e4m3fn, its uint8 storage, or float8_e4m3fnuz), got {kv_dtype}"
        )
    if v_buffer.dtype != kv_dtype:
        raise TypeError(f"v_buffer must have k_buffer's dtype {kv_dtype}, got {v_buffer.dtype}")
    slots, H, Dk = k_buffer.shape
    DV = v_buffer.shape[2]
    if Dk != D:
        raise ValueError(f"k_buffer head dim {Dk} != q head dim {D}")
    if v_buffer.shape[:2] != k_buffer.shape[:2]:
        raise ValueError(f"v_buffer must have k_buffer's [slots, H] = {list(k_buffer.shape[:2])}, got {list(v_buffer.shape[:2])}")
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
        raise ValueError(
            "give the window either as kv_indptr + kv_indices (CSR) or as page_table + window_starts + seq_lens, not both and not neither"
        )
    check_int("page_size", page_size, minimum=1)
    if csr:
        if kv_indptr is None or kv_indices is None:
            raise ValueError("CSR form needs both kv_indptr and kv_indices")
        check_tensor("kv_indptr", kv_indptr, dtype=INDEX_DTYPES, device=device, shape=(B + 1,), contiguous=True)
        check_tensor("kv_indices", kv_indices, dtype=INDEX_DTYPES, device=device, ndim=1, contiguous=True)
        if page_size != 1:
            raise ValueError(
                f"page_size must be 1 with CSR indices (they name token slots), got {page_size}; pass a page_table for the paged form"
            )
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

    check_sinks("sinks", sinks, HQ, device)
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
        check_pow2("block_n", block_n, 16)
    store = _check_store(new_kv, k_buffer, v_buffer, k_scale, v_scale, B)

    G = HQ // H
    interpret = interpreting()
    itemsize = k_buffer.element_size()
    facts = device_facts(device)
    kv_fp8, kv_view = kv_fp8_mode(facts, kv_dtype)
    rdna = facts.backend == "hip" and facts.warp_size == 32
    cfg = decode_block_config(D, DV, G, itemsize, interpret, facts.smem_per_program, wide_fp8_tiles=not rdna)
    if tune is _DIRECT_DEFAULT:
        tune = _direct_tune(k_buffer, v_buffer)
    tune = tune or _Tune()
    num_gb = triton.cdiv(G, cfg.block_g)
    programs = B * H * num_gb
    num_sms = facts.num_sms
    resident = decode_resident_programs(
        block_n or cfg.block_n, D, DV, itemsize, facts.smem_per_sm, tune.num_warps or cfg.num_warps, facts.warp_size, facts.regs_per_sm
    )
    if block_n is None:
        block_n = cfg.block_n
        if programs >= num_sms * resident and not interpret and max(D, DV) <= 256:
            # A full GPU without splits streams long loops: 64-token tiles (one program per SM at D 256)
            # beat 32 there (H200, D 256, B 64: 256 against 270 us).
            block_n = max(block_n, decode_fit_block_n(64, D, DV, itemsize, facts.smem_per_program))
    if num_splits is None:
        min_tokens = decode_min_split_tokens(G, D, DV, itemsize)
        num_splits = decode_num_splits(programs, max_window, block_n, num_sms, min_tokens, resident)
    split = num_splits > 1
    check_grid("swa_decode", (programs, num_splits, 1), ("batch x KV heads x query-head blocks", "splits", ""))
    check_grid("swa_decode", (B * HQ, 1, 1), ("batch x query heads (merge)", "", ""))
    block_dv = triton.next_power_of_2(DV)
    merge_g = min(cfg.block_g, triton.next_power_of_2(G))
    fused = split and bool(tune.fused_merge)
    # bf16 queries over an fp8 pool dot in float16: fp8 converts to float16 in one instruction per two
    # elements on the H200 where bf16 takes more, and byte decoding yields float16 (H200, B 64, W 1023,
    # D 256: 236 against 325 us native; bench/results/fp8-decode-41f93e2-*). The interpreter multiplies
    # float16 right; its other bf16 dots run in float32 (docs/contract.md §8: its bf16 tl.dot is wrong).
    f16_dot = kv_view is not None and q.dtype == torch.bfloat16 and tune.f16_dot is not False
    upcast = interpret and q.dtype == torch.bfloat16 and not f16_dot

    plan = _Plan()
    plan.out_shape = (B, HQ, DV)
    plan.default_scale = 1.0 / math.sqrt(D)
    plan.kv_view = kv_view
    plan.split, plan.fused, plan.programs = split, fused, programs
    lse_offset = B * HQ * num_splits * DV
    plan.part_numel = lse_offset + B * HQ * num_splits if split else 0
    plan.ints = (
        num_splits,
        lse_offset,
        q.stride(0),
        q.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        stride_ob,
        stride_oh,
        page_table.stride(0) if paged else 0,
        *store.ints,
        H,
        G,
        num_gb,
    )
    num_warps = tune.num_warps or cfg.num_warps
    num_stages = tune.num_stages or cfg.num_stages

    def main(fused_merge: bool) -> Launcher:
        merge_s = merge_block_s(num_splits, block_dv, merge_g)
        constexprs = dict(
            D=D,
            DV=DV,
            BLOCK_G=cfg.block_g,
            BLOCK_D=max(16, triton.next_power_of_2(D)),
            BLOCK_DV=block_dv,
            BLOCK_N=block_n,
            PAGE=page_size if paged else 1,
            PAGED=paged,
            K_SCALE_PTR=k_scale_t is not None,
            V_SCALE_PTR=v_scale_t is not None,
            KV_FP8=kv_fp8,
            SOFTCAP=softcap,
            HAS_SINK=sinks is not None,
            SPLIT=split,
            FUSED_MERGE=fused_merge,
            MERGE_G=merge_g,
            MERGE_S=merge_s,
            UPCAST_DOT=upcast,
            F16_DOT=f16_dot,
            # float32 dots are exact (not tf32); fp16/bf16 dots take the target's default.
            DOT_PRECISION="ieee" if q.dtype == torch.float32 or upcast else None,
            **store.constexprs,
        )
        return Launcher(_swa_decode_kernel, (programs, num_splits, 1), constexprs, 20, num_warps, num_stages)

    def merge() -> Launcher:
        chunks = merge_dv_chunks(B * HQ, DV, num_sms)
        return merge_launcher(B, HQ, DV, num_splits, sinks is not None, skip_padding=False, dv_chunks=chunks)

    plan.main = main(fused)
    plan.merge = merge() if split and not fused else None
    plan.merge_ints = (num_splits, lse_offset, stride_ob, stride_oh, HQ, B)
    # Without counters (inside a CUDA-graph capture): the two-kernel merge.
    plan.fallback = (main(False), merge()) if fused else None
    plan.bound = None  # (main, merge) compiled for plans' runs, bound at the first aligned one (DecodePlan)
    plan.direct = None  # the same for swa_decode's own calls (whose unread pointers are q)
    return plan


def _window_args(dummy, kv_indptr, kv_indices, page_table, window_starts, seq_lens) -> tuple:
    """The kernel's five window pointers, ``dummy`` for those not given."""
    return tuple(dummy if t is None else t for t in (kv_indptr, kv_indices, page_table, window_starts, seq_lens))


def _swa_decode_impl(
    q,
    k_buffer,
    v_buffer,
    kv_indptr=None,
    kv_indices=None,
    page_table=None,
    window_starts=None,
    seq_lens=None,
    page_size=1,
    sm_scale=None,
    logit_cap=0.0,
    sinks=None,
    k_scale=None,
    v_scale=None,
    out=None,
    max_window=None,
    num_splits=None,
    block_n=None,
    tune: _Tune | None = None,
) -> torch.Tensor:
    """:func:`swa_decode` with launcher overrides (``tune``)."""
    # Scalars are checked on every call (the plan cache keys on their types, not their values);
    # scale tensors by the plan (their dtype, shape and device are part of the signature).
    logit_cap = check_logit_cap(logit_cap)
    sm_scale = check_sm_scale(sm_scale, None)
    if tune is None:
        tune = _DIRECT_DEFAULT  # the plan resolves it by the head dims (part of its signature)
    k_scale_f, k_scale_t = split_kv_scale("k_scale", k_scale)
    v_scale_f, v_scale_t = split_kv_scale("v_scale", v_scale)
    args = (
        q,
        k_buffer,
        v_buffer,
        kv_indptr,
        kv_indices,
        page_table,
        window_starts,
        seq_lens,
        page_size,
        sinks,
        k_scale,
        v_scale,
        out,
        max_window,
        num_splits,
        block_n,
        logit_cap > 0,
        tune,
    )
    plan = _PLANS.get_or_make(_signature, _check_and_plan, args)

    if out is None:
        out = poison.empty(plan.out_shape, dtype=q.dtype, device=q.device)
    if plan.out_shape[0] == 0:
        return out
    if plan.kv_view is not None:
        k_buffer, v_buffer = k_buffer.view(plan.kv_view), v_buffer.view(plan.kv_view)
    scalars = (plan.default_scale * k_scale_f if sm_scale is None else sm_scale * k_scale_f, v_scale_f, float(logit_cap), k_scale_f)

    main, merge = plan.main, plan.merge
    part = sem = q
    workspace = None
    if plan.fused:
        workspace = eager_workspace(q.device, plan.programs, plan.part_numel)
        if workspace is None:  # inside a CUDA-graph capture: the merge kernel (compiled at the first bind)
            main, merge = plan.fallback
            part = poison.empty(plan.part_numel, dtype=torch.float32, device=q.device)
        else:
            sem, part = workspace[0], workspace[1]
    elif plan.split:
        part = poison.empty(plan.part_numel, dtype=torch.float32, device=q.device)
    direct = plan.direct
    if direct is not False and (workspace is not None or not plan.fused):
        # the signature's compiled kernels, for calls whose pointers are all 16-byte aligned, launched
        # with addresses (the checks vouch for their devices); q stands in for the pointers the kernel
        # does not read (absent windows, sinks, scales, the fused store's six)
        qp = q.data_ptr()
        ptrs = (
            qp,
            k_buffer.data_ptr(),
            v_buffer.data_ptr(),
            out.data_ptr(),
            qp if part is q else workspace[3] if workspace is not None else part.data_ptr(),
            qp if workspace is None else workspace[2],
            qp if kv_indptr is None else kv_indptr.data_ptr(),
            qp if kv_indices is None else kv_indices.data_ptr(),
            qp if page_table is None else page_table.data_ptr(),
            qp if window_starts is None else window_starts.data_ptr(),
            qp if seq_lens is None else seq_lens.data_ptr(),
            qp if sinks is None else sinks.data_ptr(),
            qp if k_scale_t is None else k_scale_t.data_ptr(),
            qp if v_scale_t is None else v_scale_t.data_ptr(),
        )
        if reduce(or_, ptrs) & 15 == 0:
            if direct is None:
                direct = _bind_direct(plan, q, k_buffer, v_buffer, out, part, sem, k_scale_t, v_scale_t, scalars, args)
            if direct:
                direct[0]((*ptrs, qp, qp, qp, qp, qp, qp, *scalars, *plan.ints))
                if direct[1] is not None:
                    direct[1]((ptrs[4], ptrs[11], ptrs[3], ptrs[4], *plan.merge_ints))
                return out
    tensors = _kernel_tensors(q, k_buffer, v_buffer, out, part, sem, k_scale_t, v_scale_t, args)
    main((*tensors, *scalars, *plan.ints))
    if merge is not None:
        merge((part, tensors[11], out, part, *plan.merge_ints))
    return out


def _kernel_tensors(q, k_buffer, v_buffer, out, part, sem, k_scale_t, v_scale_t, args) -> tuple:
    """The decode kernel's pointer arguments as tensors (``args``: the call's, for its windows and
    sinks), ``q`` standing in for those it does not read (the fused store's six among them)."""
    kv_indptr, kv_indices, page_table, window_starts, seq_lens, sinks = (*args[3:8], args[9])
    windows = _window_args(q, kv_indptr, kv_indices, page_table, window_starts, seq_lens)
    pick = lambda t: q if t is None else t
    return (q, k_buffer, v_buffer, out, part, sem, *windows, pick(sinks), pick(k_scale_t), pick(v_scale_t), q, q, q, q, q, q)


def _bind_direct(plan: _Plan, q, k_buffer, v_buffer, out, part, sem, k_scale_t, v_scale_t, scalars, args):
    """A plan's kernels for ``swa_decode``'s own calls, compiled at its first aligned eager call (and,
    where it merges in place, the kernels a later capture takes, so nothing compiles inside one)."""
    tensors = _kernel_tensors(q, k_buffer, v_buffer, out, part, sem, k_scale_t, v_scale_t, args)
    merge_args = (part, tensors[11], out, part, *plan.merge_ints)
    direct = plan.direct = _bind_pair(plan, (*tensors, *scalars, *plan.ints), merge_args)
    if direct and plan.fallback is not None:
        plan.fallback[0].bind((*tensors, *scalars, *plan.ints))
        plan.fallback[1].bind(merge_args)
    return direct


_IN_PLACE = _Tune(fused_merge=True)
# a direct call without overrides: :func:`_direct_tune` of its buffers, decided by the plan
_DIRECT_DEFAULT = object()
_DUMMIES: dict = {}


def _dummy(device: torch.device) -> torch.Tensor:
    """A zeroed word on ``device`` that stands in for the pointers a kernel does not read (shared)."""
    dummy = _DUMMIES.get(device)
    if dummy is None:
        dummy = _DUMMIES[device] = torch.zeros(4, dtype=torch.int32, device=device)
    return dummy


def _in_place_dims(k_buffer, v_buffer) -> bool | None:
    """Whether the head dims take the in-place merge by default: up to 256 (the H200's GPU time is the
    same either way there, B 1: 8.9 us at D 128, 12.5 at D 256, and eager runs are bound by the host's
    launches); the merge kernel for wider heads (in place cost 512-wide heads twice the GPU time: 39
    against 18 us at B 1). None where the buffers are not tensors (the checks name them)."""
    try:
        return max(k_buffer.shape[-1], v_buffer.shape[-1]) <= 256
    except (AttributeError, IndexError, TypeError):
        return None


def _merges_in_place(in_place_merge: bool | None, q, k_buffer, v_buffer) -> bool:
    """A plan's merge of its splits: in place (by each group's last split: one launch per run) when
    asked, or by default where :func:`_in_place_dims` allows it outside a CUDA-graph capture; the
    merge kernel otherwise."""
    if in_place_merge is not None:
        if not isinstance(in_place_merge, bool):
            raise TypeError(f"in_place_merge must be a bool or None, got {type(in_place_merge).__name__}")
        return in_place_merge
    if not isinstance(q, torch.Tensor) or not _in_place_dims(k_buffer, v_buffer):
        return False
    return not (q.is_cuda and torch.cuda.is_current_stream_capturing())


def _direct_tune(k_buffer, v_buffer) -> _Tune | None:
    """A direct call's default merge of its splits, the rule :func:`swa_decode_plan` defaults to: in
    place where :func:`_in_place_dims` allows it (one launch per eager call, the partials in a
    per-stream workspace; inside a CUDA-graph capture the merge kernel runs instead), else the merge
    kernel."""
    return _IN_PLACE if _in_place_dims(k_buffer, v_buffer) else None


def _bind_pair(plan: _Plan, main_args: tuple, merge_args: tuple):
    """(main, merge) of a plan compiled for these arguments' specialisation, or False (no direct launch)."""
    main = plan.main.bind(main_args)
    merge = plan.merge.bind(merge_args) if main is not None and plan.merge is not None else None
    return (main, merge) if main is not None and (merge is not None or plan.merge is None) else False


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
            (``torch.float8_e4m3fn`` or its ``uint8`` storage, or ``torch.float8_e4m3fnuz``);
            ``HQ % H == 0`` (GQA, MQA at ``H = 1``). Over fp8, bfloat16 queries are rounded to
            float16 (clamped at ±65504) and both dots run in float16, where fp8 converts exactly.
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
            (see :mod:`triton_swa.runtime.guard`).

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
        q, k_buffer, v_buffer, kv_indptr, kv_indices, page_table, window_starts, seq_lens, page_size, sm_scale, logit_cap, sinks,
        k_scale, v_scale, out, max_window, num_splits, block_n,
    )  # fmt: skip


class DecodePlan:
    """:func:`swa_decode` checked and planned once for a step's windows; :meth:`run` launches it.

    Made by :func:`swa_decode_plan`. The plan holds the window (its index tensors, read at each run:
    refill them in place between runs if you like), the split count, grid, compiled kernels and the
    split-KV workspace; a run checks that its tensors are the planned kind in O(1) and launches the
    compiled kernels directly: one launch per run, or two where splits merge in the merge kernel (see
    ``in_place_merge``). With ``store_loc`` the launch also writes the layer's new K/V. Runs of one
    plan share its workspace and counters: issue them in order on one stream (as a model's layers
    run), not concurrently on several.
    """

    __slots__ = (
        "_plan",
        "_keys",
        "_new_keys",
        "_sinks",
        "_scales",
        "_scale_kinds",
        "_sm_scale",
        "_cap",
        "_tensors",
        "_ptrs",
        "_store",
        "_store_ptrs",
        "_bound",
        "_retired",
        "_step",
        "__weakref__",
    )

    def __init__(
        self,
        plan: _Plan,
        q,
        k_buffer,
        v_buffer,
        windows: tuple,
        sinks,
        k_scale,
        v_scale,
        sm_scale: float,
        cap: float,
        new_kv=None,
        reuse: DecodePlan | None = None,
    ):
        self._plan = plan
        self._keys = (tensor_key(q), tensor_key(k_buffer), tensor_key(v_buffer))
        # the fused store: the step's slots (and mapping), and the kind of the new rows each run brings
        self._new_keys = None if new_kv is None else (tensor_key(new_kv[2]), tensor_key(new_kv[3]))
        self._sinks = sinks
        self._scale_kinds = (scale_key(k_scale), scale_key(v_scale))
        self._scales = (k_scale, v_scale)
        self._sm_scale, self._cap = sm_scale, cap
        self._step = None  # what _next_step compares (set by swa_decode_plan)
        device = q.device
        dummy = _dummy(device)
        if isinstance(reuse, DecodePlan) and reuse._plan is plan:
            # the workspace of a finished plan of the same signature: no allocation
            part, counters = reuse._tensors[:2]
            reuse._retired = True
        else:
            part = poison.empty(plan.part_numel, dtype=torch.float32, device=device) if plan.split else dummy
            # the in-place merge's counters, zero between runs (each run's last splits put them back)
            counters = torch.zeros(plan.programs, dtype=torch.int32, device=device) if plan.fused else dummy
        self._own(part, counters, tuple(dummy if w is q else w for w in windows), new_kv, dummy)

    def _own(self, part, counters, windows: tuple, new_kv, dummy) -> None:
        """Take the workspace, the windows and the store's slots (and mapping) that runs point at."""
        self._retired = False
        self._tensors = (part, counters, *windows)  # the plan's own pointers, in the kernel's order
        self._ptrs = tuple(t.data_ptr() for t in self._tensors)
        loc, mapping = (dummy, dummy) if new_kv is None else (new_kv[0], dummy if new_kv[1] is None else new_kv[1])
        self._store = (loc, mapping)
        self._store_ptrs = (loc.data_ptr(), mapping.data_ptr())
        # runs launch the compiled kernels that the plan's signature shares (bound once, at the first
        # aligned run of any plan of it), when this plan's own pointers are aligned too (the store's
        # slots and mapping at any alignment: the kernel does not specialise on theirs)
        aligned = all(p & 15 == 0 for p in self._ptrs)
        self._bound = None if aligned else False

    def _next_step(self, *, page_size=1, max_window=None, store_loc=None, store_mapping=None, **windows) -> DecodePlan | None:
        """This plan for the next step: the same plan over other windows (and store slots) of exactly
        the kinds it was made for, with the rest of :func:`swa_decode_plan`'s arguments unchanged.
        Returns a new plan that takes over this one's workspace (this one retires, as with
        ``reuse``), or None, having changed nothing, where any of them is of another kind or this
        plan retired. The backend's steps after the first of a kind: no checks or plan beside these
        keys (the window tensors' contents are not read on the host either way)."""
        if self._retired:
            return None
        unknown = set(windows) - set(_WINDOW_NAMES)
        if unknown:
            raise TypeError(f"_next_step takes the window tensors {_WINDOW_NAMES}, got {sorted(unknown)}")
        kv_indptr, kv_indices, page_table, window_starts, seq_lens = (windows.get(n) for n in _WINDOW_NAMES)
        step = _step_key(kv_indptr, kv_indices, page_table, window_starts, seq_lens, page_size, max_window, store_loc, store_mapping)
        if step != self._step:
            return None
        nxt = DecodePlan.__new__(DecodePlan)
        for name in ("_plan", "_keys", "_new_keys", "_sinks", "_scales", "_scale_kinds", "_sm_scale", "_cap", "_step"):
            setattr(nxt, name, getattr(self, name))
        part, counters = self._tensors[:2]
        self._retired = True
        dummy = _dummy(part.device)
        windows = _window_args(dummy, kv_indptr, kv_indices, page_table, window_starts, seq_lens)
        nxt._own(part, counters, windows, None if store_loc is None else (store_loc, store_mapping), dummy)
        return nxt

    @property
    def out_shape(self) -> tuple:
        """``[B, HQ, Dv]``: the shape of a run's output."""
        return self._plan.out_shape

    def _check(self, name: str, x, key) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        got = tensor_key(x)
        if got != key:
            raise ValueError(f"{name} must be what the plan was made for (dtype, shape, strides, device {key}), got {got}: make a new plan")

    def run(self, q, k_buffer, v_buffer, out=None, *, k_new=None, v_new=None, sinks=None, k_scale=None, v_scale=None) -> torch.Tensor:
        """Decode ``q`` over the planned windows of ``k_buffer``/``v_buffer`` (another layer's buffers
        of the planned kind are fine); returns ``out`` (a new ``[B, HQ, Dv]`` tensor when None).

        A plan made with ``store_loc`` first writes ``k_new``/``v_new`` (this layer's new rows, of the
        planned kind; required) at the planned slots, as :func:`~triton_swa.store_kv` would, in the
        same launch.

        ``sinks``, ``k_scale`` and ``v_scale`` default to the planned ones and must be of their kind
        (a tensor where the plan had a tensor of that dtype, shape and device; a number where it had
        a number; None where it had none).

        Raises:
            TypeError, ValueError: a tensor or scale not of the planned kind, before any launch.
        """
        if self._retired:
            raise ValueError("this plan's workspace went to a later plan (swa_decode_plan(..., reuse=this)): run that one")
        q_key, k_key, v_key = self._keys
        self._check("q", q, q_key)
        self._check("k_buffer", k_buffer, k_key)
        self._check("v_buffer", v_buffer, v_key)
        new = None
        if self._new_keys is not None:
            self._check("k_new", k_new, self._new_keys[0])
            self._check("v_new", v_new, self._new_keys[1])
            new = (k_new, v_new, store_view(k_buffer)[0], store_view(v_buffer)[0])
        elif k_new is not None or v_new is not None:
            raise ValueError("k_new and v_new need a plan made with store_loc (a fused K/V store)")
        if out is not None:
            B, HQ, DV = self._plan.out_shape
            self._check("out", out, (q.dtype, torch.Size((B, HQ, DV)), (HQ * DV, DV, 1), q.device))
        if sinks is None:
            sinks = self._sinks
        elif tensor_key(sinks) != tensor_key(self._sinks):
            raise ValueError("sinks must be of the planned kind (dtype, shape, strides and device of the plan's sinks)")
        k_scale = self._scales[0] if k_scale is None else k_scale
        v_scale = self._scales[1] if v_scale is None else v_scale
        if (scale_key(k_scale), scale_key(v_scale)) != self._scale_kinds:
            raise ValueError("k_scale and v_scale must be of the planned kinds (a number, or a tensor of the plan's dtype, shape, device)")
        k_scale_f, k_scale_t = split_kv_scale("k_scale", k_scale)
        v_scale_f, v_scale_t = split_kv_scale("v_scale", v_scale)
        return self._launch(q, k_buffer, v_buffer, out, sinks, k_scale_f, k_scale_t, v_scale_f, v_scale_t, new)

    def _launch(self, q, k_buffer, v_buffer, out, sinks, k_scale_f, k_scale_t, v_scale_f, v_scale_t, new=None) -> torch.Tensor:
        """:meth:`run` after its checks (the backend checks a layer's kind once per step): scales split
        by ``split_kv_scale``; ``out`` None allocates; ``new``: the fused store's ``(k_new, v_new,
        k_store, v_store)`` (the buffers as ``store_view`` gives them), or None without one. ``q``, ``out``
        and the new rows are read by pointer with the planned strides: a ``[B, HQ * D]`` view of a
        planned ``[B, HQ, D]`` is the same call."""
        plan = self._plan
        if out is None:
            out = poison.empty(plan.out_shape, dtype=q.dtype, device=q.device)
        if plan.out_shape[0] == 0:
            return out
        if plan.kv_view is not None:
            k_buffer, v_buffer = k_buffer.view(plan.kv_view), v_buffer.view(plan.kv_view)
        scalars = (self._sm_scale * k_scale_f, v_scale_f, self._cap, k_scale_f)
        bound = False if self._bound is False else plan.bound
        if bound is not False:
            # the compiled kernel, for runs whose own pointers are 16-byte aligned (as the plan's
            # pointers are), launched with addresses: the checks above vouch for their devices
            qp, kp, vp, op = q.data_ptr(), k_buffer.data_ptr(), v_buffer.data_ptr(), out.data_ptr()
            sp = qp if sinks is None else sinks.data_ptr()
            ksp = qp if k_scale_t is None else k_scale_t.data_ptr()
            vsp = qp if v_scale_t is None else v_scale_t.data_ptr()
            if new is None:  # no fused store: q stands in for its four pointers
                nkp = nvp = nksp = nvsp = qp
            else:
                nkp, nvp, nksp, nvsp = new[0].data_ptr(), new[1].data_ptr(), new[2].data_ptr(), new[3].data_ptr()
            if (qp | kp | vp | op | sp | ksp | vsp | nkp | nvp | nksp | nvsp) & 15 == 0:
                if bound is None:
                    bound = self._bind(q, k_buffer, v_buffer, out, sinks, k_scale_t, v_scale_t, new, scalars)
                if bound:
                    self._fire(bound, qp, op, (kp, vp, sp, ksp, vsp, nksp, nvsp), nkp, nvp, scalars)
                    return out
        plan.main(self._args(q, k_buffer, v_buffer, out, sinks, k_scale_t, v_scale_t, new, scalars))
        if plan.merge is not None:
            part = self._tensors[0]
            plan.merge((part, q if sinks is None else sinks, out, part, *plan.merge_ints))
        return out

    def _run_layer(self, q, out, ptrs: tuple, k_scale_f, v_scale_f, k_new=None, v_new=None) -> bool:
        """The backend's launch of a layer whose own pointers it keeps: ``ptrs`` is ``(k_buffer,
        v_buffer, sinks, k_scale, v_scale, k_store, v_store)`` as 16-byte-aligned addresses (a valid
        address such as the K buffer's standing in for an absent tensor), ``k_new``/``v_new`` the
        fused store's rows (or None). Launches the bound kernels and returns True, or returns False
        having done nothing where :meth:`_launch` must take the call (nothing bound yet, or a pointer
        of this call not aligned)."""
        plan = self._plan
        bound = plan.bound
        if not bound or self._bound is False:
            return False
        qp, op = q.data_ptr(), out.data_ptr()
        nkp, nvp = (qp, qp) if k_new is None else (k_new.data_ptr(), v_new.data_ptr())
        if (qp | op | nkp | nvp) & 15 or plan.out_shape[0] == 0:
            return False
        self._fire(bound, qp, op, ptrs, nkp, nvp, (self._sm_scale * k_scale_f, v_scale_f, self._cap, k_scale_f))
        return True

    def _fire(self, bound, qp, op, own: tuple, nkp, nvp, scalars) -> None:
        """Launch the bound ``(main, merge)`` with addresses: q's, out's, the layer's ``own`` (``k_buffer,
        v_buffer, sinks, k_scale, v_scale, k_store, v_store``) and the new rows' (``nkp``, ``nvp``)."""
        kp, vp, sp, ksp, vsp, nksp, nvsp = own
        main, merge = bound
        plan = self._plan
        main((qp, kp, vp, op, *self._ptrs, sp, ksp, vsp, nkp, nvp, nksp, nvsp, *self._store_ptrs, *scalars, *plan.ints))
        if merge is not None:
            part = self._ptrs[0]
            merge((part, sp, op, part, *plan.merge_ints))

    def _bind(self, q, k_buffer, v_buffer, out, sinks, k_scale_t, v_scale_t, new, scalars):
        """(main, merge) compiled for these arguments' specialisation, or False (no direct launch)."""
        plan, part = self._plan, self._tensors[0]
        merge_args = (part, q if sinks is None else sinks, out, part, *plan.merge_ints)
        plan.bound = _bind_pair(plan, self._args(q, k_buffer, v_buffer, out, sinks, k_scale_t, v_scale_t, new, scalars), merge_args)
        return plan.bound

    def _args(self, q, k_buffer, v_buffer, out, sinks, k_scale_t, v_scale_t, new, scalars) -> tuple:
        """The kernel's arguments as tensors (the JIT's launch, and the binding)."""
        pick = lambda t: q if t is None else t
        new = (q, q, q, q) if new is None else new  # no fused store: q stands in for its pointers
        tensors = (*self._tensors, pick(sinks), pick(k_scale_t), pick(v_scale_t), *new, *self._store)
        return (q, k_buffer, v_buffer, out, *tensors, *scalars, *self._plan.ints)


@guarded(check_swa_decode)
def swa_decode_plan(
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
    max_window: int | None = None,
    num_splits: int | None = None,
    block_n: int | None = None,
    store_loc: torch.Tensor | None = None,
    store_mapping: torch.Tensor | None = None,
    k_new: torch.Tensor | None = None,
    v_new: torch.Tensor | None = None,
    in_place_merge: bool | None = None,
    reuse: DecodePlan | None = None,
) -> DecodePlan:
    """Check and plan :func:`swa_decode` once, for the pattern "plan once per step, run per layer".

    Takes :func:`swa_decode`'s arguments but ``out`` (the same rules and errors) and returns a
    :class:`DecodePlan`: ``plan.run(q, k_buffer, v_buffer, out=None, *, k_new=None, v_new=None,
    sinks=None, k_scale=None, v_scale=None)`` then decodes any ``q`` and buffers of the planned dtypes, shapes and strides over
    the planned windows, with the checks of that kind alone (O(1)) and the compiled kernels launched
    directly. Its output equals :func:`swa_decode`'s with the same arguments, bit for bit. ``q``'s
    values are not read here, only its kind; ``debug`` checks the windows against the buffers once,
    here.

        plan = swa_decode_plan(q, k_buffers[0], v_buffers[0], page_table=pt, window_starts=ws,
                               seq_lens=lens, page_size=16, sm_scale=scale, max_window=W + 1)
        for layer in range(num_layers):
            out = plan.run(q[layer], k_buffers[layer], v_buffers[layer])

    Two options only a plan has:

    - ``store_loc`` (int32/int64 `[B]` full slots, the step's ``out_cache_loc``), with
      ``store_mapping`` (``full_to_swa_index_mapping`` for a sliding layer, else None) and the kind of
      the new rows ``k_new`` `[B, H, D]` / ``v_new`` `[B, H, Dv]` (floating, any strides; their values
      are not read here): each run then writes its ``k_new`` / ``v_new`` into its buffers at those
      slots, as :func:`~triton_swa.store_kv` with the same arguments and the run's scales would, bit
      for bit, inside the decode launch, before the window is read (one launch per layer fewer). The
      window's last token must be the one written, as it is when the store runs first: request
      ``b``'s window ends at ``store_loc[b]``'s slot.
    - ``in_place_merge`` (bool | None): where the window is split, the group's last split merges the
      partials (one launch per run) instead of the merge kernel (two). None chooses in place for head
      dims up to 256 when the plan is made outside a CUDA-graph capture (eager runs, bound by their
      launches; the same GPU time there) and the merge kernel otherwise (in place cost 512-wide heads
      twice the GPU time on the H200).
    - ``reuse`` (DecodePlan | None): a plan whose runs are done, typically the previous step's on the
      same stream. Where the new plan has its signature (same kinds, sizes and options), the new plan
      takes over its split workspace and counters instead of allocating them, and ``reuse`` can no
      longer run (ValueError).

    Raises:
        TypeError, ValueError: as :func:`swa_decode`, before anything is launched.
    """
    logit_cap = check_logit_cap(logit_cap)
    sm_scale = check_sm_scale(sm_scale, None)
    split_kv_scale("k_scale", k_scale)
    split_kv_scale("v_scale", v_scale)
    args = (
        q,
        k_buffer,
        v_buffer,
        kv_indptr,
        kv_indices,
        page_table,
        window_starts,
        seq_lens,
        page_size,
        sinks,
        k_scale,
        v_scale,
        None,
        max_window,
        num_splits,
        block_n,
        logit_cap > 0,
        _IN_PLACE if _merges_in_place(in_place_merge, q, k_buffer, v_buffer) else None,
    )
    given = (store_loc, store_mapping, k_new, v_new)
    new_kv = None if all(t is None for t in given) else given
    plan = _PLANS.get_or_make(_signature, _check_and_plan, (*args, new_kv))
    windows = _window_args(q, kv_indptr, kv_indices, page_table, window_starts, seq_lens)
    scale = plan.default_scale if sm_scale is None else sm_scale
    made = DecodePlan(plan, q, k_buffer, v_buffer, windows, sinks, k_scale, v_scale, scale, float(logit_cap), new_kv, reuse)
    made._step = _step_key(kv_indptr, kv_indices, page_table, window_starts, seq_lens, page_size, max_window, store_loc, store_mapping)
    return made


_WINDOW_NAMES = ("kv_indptr", "kv_indices", "page_table", "window_starts", "seq_lens")


def _step_key(kv_indptr, kv_indices, page_table, window_starts, seq_lens, page_size, max_window, store_loc, store_mapping) -> tuple:
    """What of a decode plan's arguments changes from step to step, by kind: the windows (CSR
    indices by dtype, device and contiguity when ``max_window`` is given, as the plan's signature
    keys them) and the fused store's slots and mapping."""
    if kv_indices is None or max_window is None:
        indices = tensor_key(kv_indices)
    else:
        indices = (kv_indices.dtype, kv_indices.dim(), kv_indices.is_contiguous(), kv_indices.device)
    return (
        tensor_key(kv_indptr),
        indices,
        tensor_key(page_table),
        tensor_key(window_starts),
        tensor_key(seq_lens),
        type(page_size),
        page_size,
        type(max_window),
        max_window,
        tensor_key(store_loc),
        tensor_key(store_mapping),
    )
