"""Fused index metadata of a forward step: window indices, SWA page tables, SWA slots.

A step builds its index metadata once and every sliding layer reuses it. Engines usually do it in two
passes (gather the window's full slots from ``req_to_token``, then gather them through
``full_to_swa_index_mapping``); here each product is one launch that reads ``req_to_token`` and the
mapping in the same kernel. ``triton_swa_reference.indices`` is the meaning; outputs equal it exactly.

Public functions (all launch one kernel, never synchronise with the host when sizes are given, and
so run inside CUDA-graph capture with fixed buffers):

- :func:`build_window_indices`: CSR ``kv_indptr`` / ``kv_indices`` / ``window_starts`` of each
  request's window (decode, extend/chunked prefill, verify, or full layers).
- :func:`build_window_page_table`: the same windows as a ``[B, max_pages]`` page table.
- :func:`swa_out_cache_loc`: the new tokens' SWA slots (optionally into a fixed buffer, tail zeroed).

K/V stores at translated slots are :mod:`triton_swa.ops.kv_store`.

Host helpers for sizing buffers without touching the device: :func:`window_index_count`,
:func:`max_window_len`, :func:`max_window_pages`.

Windows (docs/contract.md §1): decode at length ``L`` reads positions ``[max(0, L - W - 1), L)``; extend,
chunked prefill and verify with a cached prefix ``P`` read ``[max(0, P - W), P)``; ``W = -1`` (full
layers) reads ``[0, L)`` or ``[0, P)``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..runtime import poison
from ..runtime.checks import INDEX_DTYPES, check_contiguous, check_int, check_pow2, check_tensor, check_window_left
from ..runtime.device import device_facts
from ..runtime.guard import check_build_window_indices, check_build_window_page_table, check_swa_out_cache_loc, guarded
from ..runtime.launch import launcher_for
from ..runtime.plans import PlanCache, tensor_key
from ..runtime.window import window_keys

# checked input signatures -> batch size; window-kernel launches by batch size, extent and options
_CHECKED = PlanCache()
_LAUNCHES = PlanCache()


class WindowIndices(NamedTuple):
    """The CSR list of every request's window, oldest token first.

    Attributes:
        kv_indptr (torch.Tensor): int32 `[B + 1]`; request ``b`` owns
            ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]``.
        kv_indices (torch.Tensor): int32 `[capacity]`; SWA slots when a mapping was given, else full
            slots. Entries past ``kv_indptr[B]`` are left untouched (readers never go past it).
        window_starts (torch.Tensor): int32 `[B]`; position of each window's first token.
    """

    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    window_starts: torch.Tensor


class WindowPageTable(NamedTuple):
    """Every request's window as a row of pool pages.

    Attributes:
        page_table (torch.Tensor): int32 `[B, max_pages]`; entry ``[b, j]`` is the page holding window
            positions ``[(first + j) * page_size, (first + j + 1) * page_size)`` where
            ``first = window_starts[b] // page_size``; SWA pages when a mapping was given. Entries past
            a request's last page are 0 (the dummy page).
        window_starts (torch.Tensor): int32 `[B]`; the window begins at in-page offset
            ``window_starts[b] % page_size`` of ``page_table[b, 0]``.
    """

    page_table: torch.Tensor
    window_starts: torch.Tensor


@triton.jit(do_not_specialize=["shift", "capacity", "num_splits", "n_mapping", "pair_offset", "capacity2"])
def _swa_window_indices_kernel(
    req_to_token,
    stride_rt_r,
    stride_rt_t,
    req_pool_indices,
    lens,
    mapping,
    n_mapping,
    out,
    stride_out_b,
    indptr,
    starts,
    shift,
    capacity,
    num_splits,
    pair_offset,
    capacity2,
    HAS_WINDOW: tl.constexpr,
    HAS_MAPPING: tl.constexpr,
    PAGE_TABLE: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_B: tl.constexpr,
    PAIRED: tl.constexpr,
):
    """One program per (request, split); split ``s`` walks blocks ``s, s + num_splits, ...``.

    Window of request ``b`` with length ``len`` (``seq_lens`` for decode, ``prefix_lens`` for extend):
    ``[max(0, len - shift), len)`` (``shift`` = W + 1 for decode, W for extend), or ``[0, len)``.
    CSR mode writes the window's slots at ``kv_indices[offset:]``, where ``offset`` is the sum of the
    earlier requests' window lengths (computed here, so that no cumsum launch is needed).
    PAGE_TABLE mode writes the pages of the window's pages' first slots to row ``b`` and 0 after them.
    PAIRED (CSR mode, with a window) builds two lists of the same requests in one launch, by the grid's
    third axis: list 0 the full ``[0, len)`` of untranslated slots at ``out`` / ``indptr`` / ``starts``
    (``capacity`` entries), list 1 the window (translated when HAS_MAPPING) ``pair_offset`` entries
    after each of them (``capacity2`` entries).
    """
    i_b = tl.program_id(0)
    i_s = tl.program_id(1)
    row = tl.load(req_pool_indices + i_b).to(tl.int64)
    length = tl.maximum(tl.load(lens + i_b).to(tl.int64), 0)
    if PAIRED:
        windowed = tl.program_id(2) == 1
        skip = tl.where(windowed, pair_offset, 0).to(tl.int64)
        out += skip
        indptr += skip
        starts += skip
        capacity = tl.where(windowed, capacity2, capacity)
    if HAS_WINDOW:
        start = tl.maximum(length - shift, 0)
        if PAIRED:
            start = tl.where(windowed, start, 0)
    else:
        start = length * 0
    count = length - start
    p_row = req_to_token + row * stride_rt_r

    if PAGE_TABLE:
        first = start // PAGE_SIZE
        num = tl.where(count > 0, (length - 1) // PAGE_SIZE + 1 - first, 0)
        extent = capacity
        p_dst = out + i_b.to(tl.int64) * stride_out_b
        offset = start * 0
    else:
        # Exclusive prefix sum of window lengths min(len, shift) (or len) over requests < b.
        # [BLOCK_B]
        b_acc = tl.zeros([BLOCK_B], dtype=tl.int64)
        for b0 in range(0, i_b, BLOCK_B):
            o_b = b0 + tl.arange(0, BLOCK_B)
            b_len = tl.maximum(tl.load(lens + o_b, mask=o_b < i_b, other=0).to(tl.int64), 0)
            if HAS_WINDOW:
                if PAIRED:
                    b_len = tl.where(windowed, tl.minimum(b_len, shift), b_len)
                else:
                    b_len = tl.minimum(b_len, shift)
            b_acc += b_len
        offset = tl.sum(b_acc, axis=0)
        extent = count
        p_dst = out + offset

    if i_s == 0:
        tl.store(starts + i_b, start.to(tl.int32))
        if not PAGE_TABLE:
            tl.store(indptr + i_b + 1, (offset + count).to(tl.int32))
            if i_b == 0:
                tl.store(indptr, 0)

    for e0 in range(i_s * BLOCK, extent, num_splits * BLOCK):
        o_e = e0 + tl.arange(0, BLOCK).to(tl.int64)
        if PAGE_TABLE:
            m_e = o_e < num
            o_pos = (first + o_e) * PAGE_SIZE
            m_store = o_e < extent
        else:
            m_e = o_e < count
            o_pos = start + o_e
            # Never write past the buffer, even when the caller undersized it.
            m_store = m_e & (offset + o_e < capacity)
        # [BLOCK]
        b_slot = tl.load(p_row + o_pos * stride_rt_t, mask=m_e, other=0).to(tl.int64)
        if HAS_MAPPING:
            # Python indexing semantics of mapping[loc]: -1 is the last element (which holds -1).
            b_loc = tl.where(b_slot < 0, b_slot + n_mapping, b_slot)
            if PAIRED:
                b_slot = tl.where(windowed, tl.load(mapping + b_loc, mask=m_e & windowed, other=0).to(tl.int64), b_slot)
            else:
                b_slot = tl.load(mapping + b_loc, mask=m_e, other=0).to(tl.int64)
        # Lanes past the window loaded 0, so unused table entries get page 0 (the dummy page).
        if PAGE_TABLE and PAGE_SIZE > 1:
            b_page = b_slot // PAGE_SIZE
            # Floor, not C truncation, for negative slots (torch's //).
            b_slot = tl.where((b_slot < 0) & (b_page * PAGE_SIZE != b_slot), b_page - 1, b_page)
        tl.store(p_dst + o_e, b_slot.to(tl.int32), mask=m_store)


@triton.jit(do_not_specialize=["n", "capacity", "n_mapping"])
def _swa_translate_kernel(loc, stride_loc, mapping, n_mapping, out, n, capacity, BLOCK: tl.constexpr):
    """``out[i] = mapping[loc[i]]`` for ``i < n`` and ``out[i] = 0`` for ``n <= i < capacity``."""
    i_p = tl.program_id(0)
    o_i = i_p.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m_i = o_i < n
    # [BLOCK]
    b_loc = tl.load(loc + o_i * stride_loc, mask=m_i, other=0).to(tl.int64)
    b_loc = tl.where(b_loc < 0, b_loc + n_mapping, b_loc)
    b_swa = tl.load(mapping + b_loc, mask=m_i, other=0)
    tl.store(out + o_i, tl.where(m_i, b_swa, 0).to(tl.int32), mask=o_i < capacity)


@triton.jit(do_not_specialize=["n_cols", "shift", "n_pages", "block_size"])
def _block_table_window_kernel(
    block_table,
    stride_bt,
    n_cols,
    seq_lens,
    page_table,
    stride_pt,
    window_starts,
    shift,
    n_pages,
    block_size,
    HAS_WINDOW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Row ``i_b`` of a window page table cut from an absolute block table: entry ``j`` is the block
    holding positions ``[(first + j) * block_size, ...)``, ``first = start // block_size``, ``start =
    max(0, seq_len - shift)`` (0 without a window); entries past the window's last block are 0. Only
    the window's entries of the block table are read, and only its ``n_cols`` columns."""
    i_b = tl.program_id(0)
    length = tl.maximum(tl.load(seq_lens + i_b).to(tl.int64), 0)
    if HAS_WINDOW:
        start = tl.maximum(length - shift, 0)
    else:
        start = length * 0
    first = start // block_size
    # blocks in the window (none for an empty row: CUDA-graph padding)
    count = tl.where(length > 0, (length - 1) // block_size + 1 - first, 0)
    tl.store(window_starts + i_b, start.to(tl.int32))
    for j0 in range(0, n_pages, BLOCK):
        o_j = j0 + tl.arange(0, BLOCK)
        m_read = (o_j < count) & (first + o_j < n_cols)
        # [BLOCK]
        b_pages = tl.load(block_table + i_b.to(tl.int64) * stride_bt + first + o_j, mask=m_read, other=0)
        tl.store(page_table + i_b.to(tl.int64) * stride_pt + o_j, b_pages.to(tl.int32), mask=o_j < n_pages)


def _index_block(max_extent: int) -> int:
    """Indices per program iteration: 1024 (4 KB of int32 written, 8 per thread at 4 warps) keeps
    enough independent gathers in flight to hide DRAM latency, while a 4k window still spreads over
    four programs; short windows get a block no wider than needed (at least 16)."""
    return max(16, min(1024, triton.next_power_of_2(max(max_extent, 1))))


def _index_splits(num_requests: int, max_extent: int, block: int, device: torch.device) -> int:
    """Programs per request: enough for about 8 programs per SM over the whole batch (a gather is
    latency-bound), but never more than the longest window has blocks, and within the grid's y-limit."""
    blocks = max(1, triton.cdiv(max_extent, block))
    want = max(1, triton.cdiv(8 * device_facts(device).num_sms, max(num_requests, 1)))
    return int(min(blocks, want, 65535))


def _reqs_block(num_requests: int) -> int:
    """Requests summed per step of the in-kernel prefix sum: the whole batch up to 1024 (one vector
    load); bigger batches loop. At least 16 so that small batches share one compiled variant."""
    return max(16, min(1024, triton.next_power_of_2(max(num_requests, 1))))


def max_window_len(window_left: int, max_context_len: int, *, extend: bool = False) -> int:
    """Most positions one request's window can hold: the per-request size of a CUDA-graph buffer.

    Args:
        window_left (int): ``W`` (``-1``: full attention).
        max_context_len (int): columns of ``req_to_token``.
        extend (bool): the cached prefix window of extend/verify (``W`` keys) instead of decode's
            ``W + 1``.

    Returns:
        int: ``min(W + 1, max_context_len)`` (decode), ``min(W, max_context_len)`` (extend), or
        ``max_context_len`` for ``W = -1``.
    """
    check_window_left(window_left)
    check_int("max_context_len", max_context_len, minimum=0)
    if window_left < 0:
        return max_context_len
    return min(window_keys(window_left, extend=extend), max_context_len)


def max_window_pages(window_left: int, page_size: int, max_context_len: int, *, extend: bool = False) -> int:
    """Most pages one window can span (a window may start anywhere in its first page): a safe
    ``max_pages`` for :func:`build_window_page_table` under CUDA graphs."""
    check_int("page_size", page_size, minimum=1)
    n = max_window_len(window_left, max_context_len, extend=extend)
    if n == 0:
        return 0
    if window_left < 0:
        return triton.cdiv(n, page_size)
    return min((n + page_size - 2) // page_size + 1, triton.cdiv(max_context_len, page_size))


def window_index_count(seq_lens, window_left: int, prefix_lens=None) -> int:
    """Total ``kv_indices`` of :func:`build_window_indices` for these lengths, computed on the host.

    Pass the engine's CPU copies (``seq_lens_cpu``); device tensors work too but synchronise.

    Args:
        seq_lens (torch.Tensor | list[int]): `[B]` decode lengths.
        window_left (int): ``W`` (``-1``: full attention).
        prefix_lens (torch.Tensor | list[int] | None): `[B]`; when given, the extend/verify window of
            the cached prefix is counted instead.

    Returns:
        int: ``sum(min(len, W + 1))`` (decode), ``sum(min(P, W))`` (extend), or the sum of lengths.
    """
    check_window_left(window_left)
    lens = _host_lens("seq_lens", seq_lens, prefix_lens is None)
    if prefix_lens is not None:
        lens = _host_lens("prefix_lens", prefix_lens, True)
        if lens.shape[0] != _host_len_count(seq_lens):
            raise ValueError(f"prefix_lens must have one entry per request ({_host_len_count(seq_lens)}), got {lens.shape[0]}")
    return window_count_of(lens.tolist(), window_left, extend=prefix_lens is not None)


def window_count_of(lens: list, window_left: int, extend: bool) -> int:
    """:func:`window_index_count` of lengths already on the host (ints, each >= 0; decode lengths, or
    with ``extend`` the cached prefixes): a backend's step counts its own lists with it."""
    if window_left < 0:
        return sum(lens)
    keys = window_keys(window_left, extend=extend)
    return sum(n if n < keys else keys for n in lens)


def _host_len_count(x) -> int:
    return x.shape[0] if isinstance(x, torch.Tensor) else len(x)


def _host_lens(name: str, x, read: bool) -> torch.Tensor | None:
    """Lengths given as a 1-D int tensor or a list of ints, as a CPU int64 tensor (``read``: values
    read and checked >= 0; a device tensor synchronises), or raise naming ``name``."""
    if isinstance(x, torch.Tensor):
        if x.dtype not in INDEX_DTYPES:
            raise TypeError(f"{name} must be an int32/int64 tensor or a list of ints, got {x.dtype}")
        if x.dim() != 1:
            raise ValueError(f"{name} must be 1-D ([B]), got shape {list(x.shape)}")
        lens = x.long().cpu() if read else None
    elif isinstance(x, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in x):
        lens = torch.tensor(list(x), dtype=torch.int64) if read else None
    else:
        raise TypeError(f"{name} must be an int32/int64 tensor or a list of ints, got {type(x).__name__}")
    if lens is not None and lens.numel() and int(lens.min()) < 0:
        raise ValueError(f"{name} must be >= 0, got {int(lens.min())}")
    return lens


def check_mapping(mapping, device, page_size: int | None, name: str = "mapping") -> None:
    check_tensor(name, mapping, dtype=INDEX_DTYPES, device=device, ndim=1)
    if mapping.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous, got stride {mapping.stride(0)}")
    # The allocator's mapping has size + page_size + 1 entries with size a multiple of page_size.
    if page_size is not None and (mapping.numel() - 1) % page_size:
        raise ValueError(
            f"page_size={page_size} disagrees with the pool: full_to_swa_index_mapping has "
            f"{mapping.numel()} entries, which is not size + page_size + 1 for a size that is a multiple "
            f"of page_size"
        )


def _check_window_inputs(req_to_token, req_pool_indices, seq_lens, prefix_lens, window_left, mapping, page_size) -> int:
    """The batch size, once the inputs' kinds are checked (cached by signature: a step of the same kinds
    as an earlier one skips the checks)."""
    args = (req_to_token, req_pool_indices, seq_lens, prefix_lens, window_left, mapping, page_size)
    return _CHECKED.get_or_make(_window_signature, _checked_window_inputs, args)


def _window_signature(req_to_token, req_pool_indices, seq_lens, prefix_lens, window_left, mapping, page_size) -> tuple:
    return (
        tensor_key(req_to_token),
        tensor_key(req_pool_indices),
        tensor_key(seq_lens),
        tensor_key(prefix_lens),
        tensor_key(mapping),
        type(window_left),
        window_left,
        type(page_size),
        page_size,
    )


def _checked_window_inputs(req_to_token, req_pool_indices, seq_lens, prefix_lens, window_left, mapping, page_size) -> int:
    check_tensor("req_to_token", req_to_token, dtype=torch.int32, ndim=2)
    device = req_to_token.device
    check_tensor("req_pool_indices", req_pool_indices, dtype=INDEX_DTYPES, device=device, ndim=1)
    B = req_pool_indices.shape[0]
    check_tensor("seq_lens", seq_lens, dtype=INDEX_DTYPES, device=device, shape=(B,))
    if prefix_lens is not None:
        check_tensor("prefix_lens", prefix_lens, dtype=INDEX_DTYPES, device=device, shape=(B,))
    check_window_left(window_left)
    if page_size is not None:
        check_int("page_size", page_size, minimum=1)
    if mapping is not None:
        check_mapping(mapping, device, page_size)
    for name, t in (("req_pool_indices", req_pool_indices), ("seq_lens", seq_lens), ("prefix_lens", prefix_lens)):
        check_contiguous(name, t)  # read with unit strides
    return B


def _launch_window_kernel(
    req_to_token,
    req_pool_indices,
    lens,
    shift,
    has_window,
    mapping,
    out,
    stride_out_b,
    indptr,
    starts,
    capacity,
    page_table,
    page_size,
    max_extent,
    block,
    num_splits,
    block_reqs,
):
    B = req_pool_indices.shape[0]
    has_mapping = mapping is not None
    planned = _window_launch(
        B, max_extent, block, num_splits, block_reqs, has_window, has_mapping, page_table, page_size, req_to_token.device
    )
    if B == 0:
        return
    _fire_window(planned, req_to_token, req_pool_indices, lens, shift, mapping, out, stride_out_b, indptr, starts, capacity)


def _window_launch(
    B, max_extent, block, num_splits, block_reqs, has_window, has_mapping, page_table, page_size, device, paired=False
) -> tuple:
    """``(launcher, grid, compiled kernels bound by specialisation)`` of the window kernel for a batch
    size, window extent and options (planned once, checked)."""
    key = (B, max_extent, block, num_splits, block_reqs, has_window, has_mapping, page_table, page_size, device, paired)
    planned = _LAUNCHES.get(key)
    if planned is None:
        planned = _plan_window_launch(*key)
        _LAUNCHES.put(key, planned)
    return planned


def _int_class(n: int) -> tuple:
    """What Triton specialises an unspecialised integer argument on: 1, and its width."""
    return n == 1, n >= 2**31


def _fire_window(
    planned, req_to_token, req_pool_indices, lens, shift, mapping, out, stride_out_b, indptr, starts, capacity, pair_offset=0, capacity2=0
) -> None:
    """Launch a planned window kernel on a non-empty batch (``pair_offset`` and ``capacity2``: the
    second list of a paired plan)."""
    launch, grid, bound = planned
    tensors = (req_to_token, req_pool_indices, lens, mapping if mapping is not None else req_to_token, out, indptr, starts)
    ptrs = [t.data_ptr() for t in tensors]
    ints = (req_to_token.stride(0), req_to_token.stride(1), mapping.numel() if mapping is not None else 0, stride_out_b, shift)
    sizes = (capacity, pair_offset, capacity2)
    # the compiled kernel for this specialisation (the tensors' dtypes, every pointer 16-byte aligned,
    # the fixed integers, the sizes' classes), launched with addresses: the checks vouch for the
    # tensors' devices
    if (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4] | ptrs[5] | ptrs[6]) & 15 == 0:
        key = (*[t.dtype for t in tensors], ints, *map(_int_class, sizes))
        direct = bound.get(key)
        if direct is None:
            direct = bound[key] = launch.bind(_window_args(tensors, ints, sizes, grid), grid) or False
        if direct:
            r2t, rpi, lens_p, mapping_p, out_p, indptr_p, starts_p = ptrs
            stride_r, stride_c, n_mapping, stride_out_b, shift = ints
            direct(
                (
                    r2t,
                    stride_r,
                    stride_c,
                    rpi,
                    lens_p,
                    mapping_p,
                    n_mapping,
                    out_p,
                    stride_out_b,
                    indptr_p,
                    starts_p,
                    shift,
                    capacity,
                    grid[1],
                    pair_offset,
                    capacity2,
                )
            )
            return
    launch(_window_args(tensors, ints, sizes, grid), grid)


def _window_args(tensors, ints, sizes, grid) -> tuple:
    """The window kernel's arguments in order, from :func:`_fire_window`'s tensors and integers."""
    req_to_token, req_pool_indices, lens, mapping, out, indptr, starts = tensors
    stride_r, stride_c, n_mapping, stride_out_b, shift = ints
    capacity, pair_offset, capacity2 = sizes
    return (
        req_to_token,
        stride_r,
        stride_c,
        req_pool_indices,
        lens,
        mapping,
        n_mapping,
        out,
        stride_out_b,
        indptr,
        starts,
        shift,
        capacity,
        grid[1],
        pair_offset,
        capacity2,
    )


def _plan_window_launch(B, max_extent, block, num_splits, block_reqs, has_window, has_mapping, page_table, page_size, device, paired):
    """(launcher, grid, compiled kernels bound by specialisation) of the window kernel for a batch
    size, window extent and options (checked)."""
    block = _index_block(max_extent) if block is None else block
    num_splits = _index_splits(B, max_extent, block, device) if num_splits is None else num_splits
    block_reqs = _reqs_block(B) if block_reqs is None else block_reqs
    for name, v in (("block", block), ("block_reqs", block_reqs)):
        check_pow2(name, v)
    check_int("num_splits", num_splits, minimum=1)
    if num_splits > 65535:
        raise ValueError(f"num_splits must be <= 65535 (grid y-limit), got {num_splits}")
    constexprs = dict(
        HAS_WINDOW=has_window,
        HAS_MAPPING=has_mapping,
        PAGE_TABLE=page_table,
        PAGE_SIZE=page_size,
        BLOCK=block,
        BLOCK_B=block_reqs,
        PAIRED=paired,
    )
    return launcher_for(_swa_window_indices_kernel, constexprs), (B, num_splits, 2 if paired else 1), {}


def _part_words(n: int) -> int:
    """The int32 words one of :func:`_int32_parts`' parts of ``n`` entries takes: a 16-byte multiple."""
    return -(-n // 4) * 4


def _int32_parts(sizes: tuple, device) -> list:
    """Contiguous int32 tensors of ``sizes``, views of one allocation (one allocator call per build
    instead of one per tensor), each starting 16-byte aligned as the kernels' direct launches want."""
    starts, total = [], 0
    for n in sizes:
        starts.append(total)
        total += _part_words(n)
    buf = poison.empty(max(total, 1), dtype=torch.int32, device=device)
    # as_strided: one view each at about half the host cost of slicing
    return [buf.as_strided((n,), (1,), a) for a, n in zip(starts, sizes)]


def _new_window_lists(B: int, num_indices: int, num_window: int | None, device) -> tuple:
    """``(full, window, skip)``: new WindowIndices of ``B`` requests, ``full`` of ``num_indices``
    entries and, unless ``num_window`` is None, ``window`` of ``num_window`` (else None), in one
    allocation: ``[indptr, starts, indices]`` of each list, the window's ``skip`` words after the full
    list's (a paired launch writes the second list at that offset)."""
    if num_window is None:
        indptr, starts, indices = _int32_parts((B + 1, B, num_indices), device)
        return WindowIndices(indptr, indices, starts), None, 0
    parts = _int32_parts((B + 1, B, num_indices, B + 1, B, num_window), device)
    skip = _part_words(B + 1) + _part_words(B) + _part_words(num_indices)  # where parts[3] starts
    return WindowIndices(parts[0], parts[2], parts[1]), WindowIndices(parts[3], parts[5], parts[4]), skip


def _fill_window_lists(planned, full, window, skip, req_to_token, req_pool_indices, lens, shift, mapping) -> None:
    """Build the CSR lists ``full`` and, for a paired launch, ``window`` (``skip`` words after it) by
    the planned window kernel; ``planned`` None (an empty batch) zeroes their ``kv_indptr`` and launches
    nothing."""
    if planned is None:
        full.kv_indptr.zero_()
        if window is not None:
            window.kv_indptr.zero_()
        return
    num_window = 0 if window is None else window.kv_indices.numel()
    _fire_window(
        planned, req_to_token, req_pool_indices, lens, shift, mapping, full.kv_indices, 0, full.kv_indptr, full.window_starts,
        full.kv_indices.numel(), skip, num_window,
    )  # fmt: skip


def _mode(seq_lens, prefix_lens, window_left):
    """(lens the window ends at, shift, has_window) of decode or extend/verify."""
    extend = prefix_lens is not None
    return (prefix_lens if extend else seq_lens), window_keys(window_left, extend=extend), window_left >= 0


@guarded(check_build_window_indices)
def build_window_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    window_left: int,
    prefix_lens: torch.Tensor | None = None,
    mapping: torch.Tensor | None = None,
    page_size: int | None = None,
    num_indices: int | None = None,
    out: WindowIndices | None = None,
    block: int | None = None,
    num_splits: int | None = None,
    block_reqs: int | None = None,
) -> WindowIndices:
    """Every request's window slots as a CSR list, translated to SWA slots, in one launch.

    Modes: decode (``prefix_lens`` None) reads positions ``[max(0, L - W - 1), L)`` of each request;
    extend, chunked prefill and verify (``prefix_lens`` given; for verify ``P`` is the committed length
    ahead of the draft tokens) read the cached prefix window ``[max(0, P - W), P)``; ``window_left=-1``
    with ``mapping=None`` gives a full layer's ``[0, L)`` (or ``[0, P)``). Equals
    ``triton_swa_reference.decode_window_indices`` / ``extend_window_indices`` exactly.

    Output size: give ``num_indices`` (the exact total, e.g. :func:`window_index_count` of the
    engine's ``seq_lens_cpu``), or ``out`` buffers (the CUDA-graph path: ``kv_indices`` of a maximum
    size such as ``max_bs * max_window_len(...)``). With neither, the total is read back from the
    device (a host synchronisation, not allowed under graph capture). Writes never go past
    ``kv_indices``; an undersized buffer truncates the list.

    Args:
        req_to_token (torch.Tensor): int32 `[num_rows, max_context_len]`, full slots; row 0 padding.
        req_pool_indices (torch.Tensor): int32/int64 `[B]`, rows of ``req_to_token``.
        seq_lens (torch.Tensor): int32/int64 `[B]`, lengths including the current token (decode).
        window_left (int): ``W >= 0``, or ``-1`` for full attention.
        prefix_lens (torch.Tensor | None): int32/int64 `[B]`; selects the extend/verify window.
        mapping (torch.Tensor | None): ``full_to_swa_index_mapping`` int64/int32 `[size + page_size + 1]`;
            when given, ``kv_indices`` are SWA slots (0 where evicted).
        page_size (int | None): the pool's page size, only checked against ``mapping`` (the list is per
            token whatever the page size).
        num_indices (int | None): length of the returned ``kv_indices``.
        out (WindowIndices | None): preallocated int32 buffers ``kv_indptr [B + 1]``,
            ``kv_indices [capacity]``, ``window_starts [B]``; filled in place and returned.
        block, num_splits, block_reqs (int | None): overrides of the heuristics (indices per program
            iteration, programs per request, requests per prefix-sum step; powers of two for blocks).
        debug (bool | None): check every index this call reads or writes before launching (a host
            sync; ValueError naming request, position and slot); None follows ``TRITON_SWA_DEBUG``
            (see :mod:`triton_swa.runtime.guard`).

    Returns:
        WindowIndices: ``(kv_indptr, kv_indices, window_starts)``.

    Raises:
        TypeError, ValueError: on a wrong dtype, device or shape, ``window_left < -1``, or a page size
            that disagrees with the mapping; raised before any launch.
    """
    B = _check_window_inputs(req_to_token, req_pool_indices, seq_lens, prefix_lens, window_left, mapping, page_size)
    device = req_to_token.device
    lens, shift, has_window = _mode(seq_lens, prefix_lens, window_left)
    if out is None:
        if num_indices is None:
            num_indices = window_index_count(seq_lens, window_left, prefix_lens)
        check_int("num_indices", num_indices, minimum=0)
        out = _new_window_lists(B, num_indices, None, device)[0]
    else:
        if num_indices is not None:
            raise ValueError("give num_indices or out, not both (out's kv_indices length is the capacity)")
        if not isinstance(out, WindowIndices):
            raise TypeError(f"out must be a WindowIndices of buffers, got {type(out).__name__}")
        check_tensor("out.kv_indptr", out.kv_indptr, dtype=torch.int32, device=device, shape=(B + 1,), contiguous=True)
        check_tensor("out.kv_indices", out.kv_indices, dtype=torch.int32, device=device, ndim=1, contiguous=True)
        check_tensor("out.window_starts", out.window_starts, dtype=torch.int32, device=device, shape=(B,), contiguous=True)
    planned = None  # an empty batch launches nothing
    if B:
        max_extent = max_window_len(window_left, req_to_token.shape[1], extend=prefix_lens is not None)
        planned = _window_launch(B, max_extent, block, num_splits, block_reqs, has_window, mapping is not None, False, 1, device)
    _fill_window_lists(planned, out, None, 0, req_to_token, req_pool_indices, lens, shift, mapping)
    return out


class _WindowListsPlan:
    """A step's full and sliding CSR lists (:func:`build_window_indices` of ``window_left=-1`` without a
    mapping, and of the window with the mapping) in one allocation and one launch, checked and
    planned once for a kind of inputs (the tensors' dtypes, shapes, strides and devices, the window,
    the mapping's presence): :meth:`run` builds the lists of a step of that kind comparing only those
    kinds (a backend's per-step metadata). Made by :func:`_window_lists_plan`."""

    __slots__ = ("_keys", "_shift", "_B", "_device", "_planned", "_paired")

    def run(self, req_to_token, req_pool_indices, lens, mapping, num_full: int, num_window: int | None):
        """``(full, window)`` WindowIndices of the step (``num_full`` / ``num_window`` entries, ints >= 0
        the caller computed from the host lengths; ``window`` None for a plan without a window), or None,
        having launched nothing, where a tensor is not of the planned kind."""
        if (tensor_key(req_pool_indices), tensor_key(lens), tensor_key(req_to_token), tensor_key(mapping)) != self._keys:
            return None
        B = self._B
        full, window, skip = _new_window_lists(B, num_full, num_window if self._paired else None, self._device)
        _fill_window_lists(self._planned if B else None, full, window, skip, req_to_token, req_pool_indices, lens, self._shift, mapping)
        return full, window


def _window_lists_plan(
    req_to_token, req_pool_indices, lens, *, window_left: int, extend: bool, mapping, block: int | None = None, num_splits=None
) -> _WindowListsPlan:
    """Check :func:`build_window_indices`'s inputs (``lens``: the decode lengths, or with ``extend`` the
    prefix lengths) as it does, raising as it would, and plan the launch building the full list and,
    for ``window_left >= 0``, the window's (translated by ``mapping`` when given); ``block`` and
    ``num_splits`` override the heuristics as there."""
    prefix = lens if extend else None
    B = _check_window_inputs(req_to_token, req_pool_indices, lens, prefix, window_left, mapping, None)
    if window_left < 0 and mapping is not None:
        raise ValueError("a mapping translates the window's list: give window_left >= 0 with it")
    _, shift, has_window = _mode(lens, prefix, window_left)
    device = req_to_token.device
    plan = _WindowListsPlan()
    plan._keys = (tensor_key(req_pool_indices), tensor_key(lens), tensor_key(req_to_token), tensor_key(mapping))
    plan._shift, plan._B, plan._device, plan._paired = shift, B, device, has_window
    # the full list is the longer: its extent sizes the blocks and splits of both
    max_extent = max_window_len(-1, req_to_token.shape[1], extend=extend)
    plan._planned = _window_launch(B, max_extent, block, num_splits, None, has_window, mapping is not None, False, 1, device, has_window)
    return plan


def _check_out_table(out, B: int, device) -> None:
    """``out`` of the page-table builders: a WindowPageTable of int32 buffers for ``B`` requests."""
    if not isinstance(out, WindowPageTable):
        raise TypeError(f"out must be a WindowPageTable of buffers, got {type(out).__name__}")
    check_tensor("out.page_table", out.page_table, dtype=torch.int32, device=device, shape=(B, None))
    if out.page_table.shape[1] > 1 and out.page_table.stride(1) != 1:
        raise ValueError("out.page_table rows must be contiguous")
    check_tensor("out.window_starts", out.window_starts, dtype=torch.int32, device=device, shape=(B,), contiguous=True)


@guarded(check_build_window_page_table)
def build_window_page_table(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    window_left: int,
    page_size: int,
    prefix_lens: torch.Tensor | None = None,
    mapping: torch.Tensor | None = None,
    max_pages: int | None = None,
    out: WindowPageTable | None = None,
    block: int | None = None,
    num_splits: int | None = None,
) -> WindowPageTable:
    """Every request's window as a page table of (SWA) pool pages, in one launch.

    Windows as in :func:`build_window_indices`. Entry ``[b, j]`` is ``mapping[slot] // page_size``
    (or ``slot // page_size`` without a mapping) for ``slot = req_to_token[r, (first + j) * page_size]``,
    the slot of the first token of the window's ``j``-th page, ``first = window_starts[b] // page_size``.
    Full and SWA slots share their in-page offset (docs/contract.md §2), so the window starts at offset
    ``window_starts[b] % page_size`` of page ``[b, 0]``. Entries past a request's last page are 0 (the
    dummy page); every entry of the table is written. Equals ``triton_swa_reference.window_page_table``.

    Args:
        req_to_token, req_pool_indices, seq_lens, window_left, prefix_lens, mapping: as in
            :func:`build_window_indices`.
        page_size (int): the pool's page size (checked against ``mapping``'s length).
        max_pages (int | None): table width; must be at least the pages any window spans (for CUDA
            graphs: :func:`max_window_pages`). Pages past it are dropped. None: the widest window, read
            back from the device (a host synchronisation).
        out (WindowPageTable | None): preallocated int32 ``page_table [B, width]`` (may be a view with a
            row stride) and ``window_starts [B]``; filled in place and returned.
        block, num_splits (int | None): overrides (table entries per program iteration, programs per
            request).
        debug (bool | None): check every index this call reads or writes before launching (a host
            sync; ValueError naming request, position and slot); None follows ``TRITON_SWA_DEBUG``
            (see :mod:`triton_swa.runtime.guard`).

    Returns:
        WindowPageTable: ``(page_table, window_starts)``.

    Raises:
        TypeError, ValueError: as :func:`build_window_indices`, before any launch.
    """
    B = _check_window_inputs(req_to_token, req_pool_indices, seq_lens, prefix_lens, window_left, mapping, page_size)
    device = req_to_token.device
    lens, shift, has_window = _mode(seq_lens, prefix_lens, window_left)
    if out is None:
        if max_pages is None:
            ends = lens.long().cpu().clamp(min=0)
            starts = (ends - shift).clamp(min=0) if has_window else ends * 0
            first = starts // page_size
            spans = torch.where(ends > starts, (ends - 1) // page_size + 1 - first, 0)
            max_pages = int(spans.max()) if B else 0
        check_int("max_pages", max_pages, minimum=0)
        table, starts = _int32_parts((B * max_pages, B), device)
        out = WindowPageTable(table.view(B, max_pages), starts)
    else:
        if max_pages is not None:
            raise ValueError("give max_pages or out, not both (out's page_table width is max_pages)")
        _check_out_table(out, B, device)
    width = out.page_table.shape[1]
    _launch_window_kernel(
        req_to_token,
        req_pool_indices,
        lens,
        shift,
        has_window,
        mapping,
        out.page_table,
        out.page_table.stride(0),
        out.window_starts,
        out.window_starts,
        width,
        True,
        page_size,
        width,
        block,
        num_splits,
        16,
    )  # block_reqs: no prefix sum in table mode
    return out


def window_page_table_from_block_table(
    block_table: torch.Tensor, seq_lens: torch.Tensor, *, window_left: int, block_size: int, out: WindowPageTable
) -> WindowPageTable:
    """Each request's window as a page table, cut from an absolute block table (vLLM's layout:
    column ``j`` of row ``b`` is the block of tokens ``[j * block_size, (j + 1) * block_size)``), in
    one launch and without a host synchronisation.

    The window of request ``b`` is the last ``min(seq_lens[b], W + 1)`` tokens (``W = window_left``;
    ``-1``: every token, the table a copy of the used columns). Entry ``[b, j]`` is the block of the
    window's ``j``-th page; ``window_starts[b]`` its first position; entries past the window's last
    block are 0. Only the window's entries of ``block_table`` are read, so blocks an engine has
    freed outside the window (their entries pointing at a null block) are never looked at.

    Args:
        block_table (torch.Tensor): int32/int64 ``[B', max_blocks]``, ``B' >= B``, rows contiguous.
        seq_lens (torch.Tensor): int32/int64 ``[B]``, each request's tokens (device contents; a
            negative length is an empty row).
        window_left (int): ``W`` (``-1``: full attention).
        block_size (int): tokens per block.
        out (WindowPageTable): int32 ``page_table [B, width]`` (rows contiguous, may be a view with a
            row stride) and ``window_starts [B]``, filled in place (fixed addresses: CUDA graphs);
            ``width`` at least :func:`max_window_pages` of the window. Pages past it are dropped.

    Returns:
        WindowPageTable: ``out``.

    Raises:
        TypeError, ValueError: naming the argument, before any launch.
    """
    check_window_left(window_left)
    check_int("block_size", block_size, minimum=1)
    check_tensor("seq_lens", seq_lens, dtype=INDEX_DTYPES, ndim=1, contiguous=True)
    device = seq_lens.device
    B = seq_lens.shape[0]
    check_tensor("block_table", block_table, dtype=INDEX_DTYPES, device=device, ndim=2)
    if block_table.shape[0] < B or (block_table.shape[1] > 1 and block_table.stride(1) != 1):
        raise ValueError(f"block_table must have at least {B} rows (seq_lens') with contiguous rows, got {list(block_table.shape)}")
    _check_out_table(out, B, device)
    width = out.page_table.shape[1]
    if B == 0:
        return out
    launch = launcher_for(
        _block_table_window_kernel, {"HAS_WINDOW": window_left >= 0, "BLOCK": min(1024, triton.next_power_of_2(max(width, 1)))}, num_warps=1
    )
    shift = window_left + 1 if window_left >= 0 else 0
    args = (block_table, block_table.stride(0), block_table.shape[1], seq_lens, out.page_table, out.page_table.stride(0), out.window_starts)
    launch((*args, shift, width, block_size), (B, 1, 1))
    return out


@guarded(check_swa_out_cache_loc)
def swa_out_cache_loc(
    out_cache_loc: torch.Tensor, mapping: torch.Tensor, *, out: torch.Tensor | None = None, block: int | None = None
) -> torch.Tensor:
    """The new tokens' SWA slots ``mapping[out_cache_loc]`` as int32, in one launch.

    Args:
        out_cache_loc (torch.Tensor): int32/int64 `[n]`, full slots of the step's new tokens (-1 gives -1,
            an evicted or unallocated slot gives 0).
        mapping (torch.Tensor): ``full_to_swa_index_mapping`` int64/int32 `[size + page_size + 1]`.
        out (torch.Tensor | None): a fixed int32 `[capacity >= n]` buffer (CUDA graphs): ``[:n]`` is
            written and ``[n:]`` zeroed, in place.
        block (int | None): override of the elements per program (a power of two).
        debug (bool | None): check every index this call reads or writes before launching (a host
            sync; ValueError naming request, position and slot); None follows ``TRITON_SWA_DEBUG``
            (see :mod:`triton_swa.runtime.guard`).

    Returns:
        torch.Tensor: int32 `[n]`, or ``out``.

    Raises:
        TypeError, ValueError: on a wrong dtype, device or shape, before any launch.
    """
    check_tensor("out_cache_loc", out_cache_loc, dtype=INDEX_DTYPES, ndim=1)
    device = out_cache_loc.device
    check_mapping(mapping, device, None)
    n = out_cache_loc.shape[0]
    if out is None:
        out = poison.empty(n, dtype=torch.int32, device=device)
    else:
        check_tensor("out", out, dtype=torch.int32, device=device, ndim=1, contiguous=True)
        if out.shape[0] < n:
            raise ValueError(f"out holds {out.shape[0]} entries, fewer than the {n} of out_cache_loc")
    capacity = out.shape[0]
    block = 1024 if block is None else check_pow2("block", block)
    if capacity:
        args = (out_cache_loc, out_cache_loc.stride(0), mapping, mapping.numel(), out, n, capacity)
        launcher_for(_swa_translate_kernel, dict(BLOCK=block))(args, (triton.cdiv(capacity, block), 1, 1))
    return out
