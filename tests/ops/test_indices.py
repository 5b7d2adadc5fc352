"""Fused index kernels (triton_swa.ops.indices) against the reference, exactly.

States come from the real allocators (``make_pool_state``: permuted free lists, window eviction); a
padding request on row 0 (as in a CUDA-graph padded batch) rides along. Outputs are pre-filled with a
sentinel so that an entry the kernel fails to write shows up. Tiny shapes with block/split overrides
on the CPU interpreter; wider grids, B = 4096, a 1M-token context and CUDA-graph capture on a GPU.
"""

from __future__ import annotations

import pytest
import torch

import triton_swa_reference as ref
from triton_swa import (
    WindowIndices,
    WindowPageTable,
    build_window_indices,
    build_window_page_table,
    max_window_len,
    max_window_pages,
    store_kv,
    swa_out_cache_loc,
    window_index_count,
    window_page_table_from_block_table,
)
from triton_swa.ops.indices import window_count_of
from triton_swa.testing import assert_close, make_pool_state

pytestmark = [
    pytest.mark.interpreter,
    # triton 3.6's interpreter converts 1-element arrays to loop bounds; numpy 2.3 warns each time.
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
]

HAS_CUDA = torch.cuda.is_available()
SENTINEL = -7777


def _state(seq_lens, window_left, page_size, new_tokens=1, chunk=5, seed=0):
    """A pool state built on the CPU (fast), plus its tensors on the test device."""
    g = torch.Generator().manual_seed(seed)
    return make_pool_state(seq_lens=seq_lens, window_left=window_left, page_size=page_size, new_tokens=new_tokens, chunk=chunk, generator=g)


def _batch(state, device, *, pad: int = 1):
    """(req_to_token, mapping, req_pool_indices, seq_lens, prefix_lens) on ``device``, with ``pad``
    padding requests on row 0 (seq_len 1, prefix 0) appended, as a CUDA-graph padded batch has."""
    rpi = torch.cat([state.req_pool_indices(), torch.zeros(pad, dtype=torch.int64)])
    seq = torch.cat([state.seq_lens(), torch.ones(pad, dtype=torch.int64)])
    pre = torch.cat([state.prefix_lens(), torch.zeros(pad, dtype=torch.int64)])
    return (state.req_to_token.to(device), state.mapping.to(device), rpi.to(device), seq.to(device), pre.to(device))


def _reference(rt, rpi, seq, pre, window_left, mapping, *, extend):
    """The reference on the tensors' own device (index gathers are exact anywhere; a 1M-context
    req_to_token is better not copied to the host)."""
    f = ref.extend_window_indices if extend else ref.decode_window_indices
    return f(rt, rpi, pre if extend else seq, window_left, mapping)


def _check_csr(got: WindowIndices, expected, num_real: int, *, sliding: bool):
    indptr, indices, starts = expected
    assert_close(got.kv_indptr, indptr, name="kv_indptr")
    assert_close(got.window_starts, starts, name="window_starts")
    n = int(indptr[-1])
    assert_close(got.kv_indices[:n], indices, name="kv_indices")
    if sliding:
        # The states keep every window slot alive: a 0 here would mean the window slid too far.
        real = got.kv_indices[: int(indptr[num_real])].cpu()
        assert bool((real > 0).all()), "a real request's window translated to an evicted slot"


# (seq_lens, new_tokens, window_left, page_size, state_window) -- state_window: the W the state
# evicts for (defaults to window_left); building a window wider than that reads evicted slots.
def csr_cases():
    small = [
        pytest.param([1, 7, 37, 20], 1, 5, 1, None, id="B4-L37-W5-P1"),
        pytest.param([1, 7, 37, 20], 1, 0, 1, None, id="B4-L37-W0-P1"),
        pytest.param([3, 9, 12], 1, 40, 1, None, id="B3-L12-W40-P1-cover"),
        pytest.param([30, 77, 50, 1], 1, 20, 16, None, id="B4-L77-W20-P16"),
        pytest.param([150, 65, 3], 1, 70, 64, None, id="B3-L150-W70-P64"),
        pytest.param([1], 1, 3, 1, None, id="B1-L1-W3-P1"),
    ]
    if not HAS_CUDA:
        return small
    g = torch.Generator().manual_seed(1)
    wide = []
    for ps in (1, 16, 64):
        for W in (0, 1, 15, 63, 200):
            lens = torch.randint(1, 300, (13,), generator=g).tolist()
            wide.append(pytest.param(lens, 1, W, ps, None, id=f"B13-L{max(lens)}-W{W}-P{ps}"))
    return small + wide


@pytest.mark.parametrize("seq_lens, new_tokens, window_left, page_size, _", csr_cases())
@pytest.mark.parametrize(
    "overrides", [pytest.param({}, id="heuristic"), pytest.param({"block": 4, "num_splits": 2, "block_reqs": 2}, id="blk4-split2-reqs2")]
)
def test_decode_window_indices(device, seq_lens, new_tokens, window_left, page_size, _, overrides):
    state = _state(seq_lens, window_left, page_size, new_tokens)
    rt, mapping, rpi, seq, pre = _batch(state, device)
    for w, m in ((window_left, mapping), (-1, None)):  # sliding layer, then full layer
        got = build_window_indices(rt, rpi, seq, window_left=w, mapping=m, page_size=page_size, **overrides)
        _check_csr(got, _reference(rt, rpi, seq, pre, w, m, extend=False), len(seq_lens), sliding=m is not None)


def extend_cases():
    small = [
        pytest.param([12, 30, 9], [3, 0, 5], 6, 1, id="B3-E3.0.5-W6-P1-empty"),
        pytest.param([12, 30, 9], [12, 4, 1], 0, 1, id="B3-E12.4.1-W0-P1-fresh"),
        pytest.param([40, 90, 33], [4, 4, 4], 20, 16, id="B3-verify4-W20-P16"),
        pytest.param([40, 130], [0, 7], 100, 64, id="B2-E0.7-W100-P64-cover"),
    ]
    if not HAS_CUDA:
        return small
    g = torch.Generator().manual_seed(2)
    wide = []
    for ps in (1, 16, 64):
        for W in (0, 3, 31, 127):
            lens = torch.randint(1, 250, (11,), generator=g)
            new = torch.minimum(lens, torch.randint(0, 9, (11,), generator=g))
            wide.append(pytest.param(lens.tolist(), new.tolist(), W, ps, id=f"B11-L{int(lens.max())}-W{W}-P{ps}"))
    return small + wide


@pytest.mark.parametrize("seq_lens, new_tokens, window_left, page_size", extend_cases())
@pytest.mark.parametrize(
    "overrides", [pytest.param({}, id="heuristic"), pytest.param({"block": 2, "num_splits": 3, "block_reqs": 1}, id="blk2-split3-reqs1")]
)
def test_extend_window_indices(device, seq_lens, new_tokens, window_left, page_size, overrides):
    """Extend, chunked prefill and verify: the cached prefix window ahead of the new/draft tokens."""
    state = _state(seq_lens, window_left, page_size, new_tokens)
    rt, mapping, rpi, seq, pre = _batch(state, device, pad=2)
    for w, m in ((window_left, mapping), (-1, None)):
        got = build_window_indices(rt, rpi, seq, window_left=w, prefix_lens=pre, mapping=m, **overrides)
        _check_csr(got, _reference(rt, rpi, seq, pre, w, m, extend=True), len(seq_lens), sliding=m is not None)


@pytest.mark.parametrize("overrides", [{}, dict(block=16, num_splits=2)], ids=["auto", "multi-block"])
def test_window_lists_plan_builds_steps_of_its_kind(device, overrides):
    """The backend's per-step window builds (checked once per kind of step; the full list and the
    window's in one launch): each step of the kind equals the reference for both lists (decode and
    extend, translated or not, full layers alone, padding rows included), and the window's list is
    written apart from the full one; inputs of another kind (batch size, lengths' dtype, mapping) get
    None and nothing launched."""
    from triton_swa.ops.indices import _window_lists_plan

    for extend, window_left, mapped in ((False, 5, True), (True, 5, True), (False, 5, False), (False, -1, False), (True, -1, False)):
        plans = {}
        for step, seq_lens in enumerate(([3, 7, 37, 20], [4, 8, 38, 21], [9, 30, 3, 4])):
            state = _state(seq_lens, 5, 1, new_tokens=3 if extend else 1, seed=step)
            rt, mapping, rpi, seq, pre = _batch(state, device)
            # the pool's tensors keep their kinds from step to step (as a backend's do): zero-padded
            rt = torch.nn.functional.pad(rt, (0, 64 - rt.shape[1], 0, 16 - rt.shape[0]))
            mapping = torch.nn.functional.pad(mapping, (0, 512 - mapping.shape[0]))
            m = mapping if mapped else None
            lens = pre if extend else seq
            plan = plans.get("plan") or plans.setdefault(
                "plan", _window_lists_plan(rt, rpi, lens, window_left=window_left, extend=extend, mapping=m, **overrides)
            )
            host_pre = pre.cpu() if extend else None
            n_full = window_index_count(seq.cpu(), -1, host_pre)
            n_window = window_index_count(seq.cpu(), window_left, host_pre) if window_left >= 0 else None
            full, window = plan.run(rt, rpi, lens, m, n_full, n_window)
            _check_csr(full, _reference(rt, rpi, seq, pre, -1, None, extend=extend), len(seq_lens), sliding=False)
            if window_left < 0:
                assert window is None
                continue
            _check_csr(window, _reference(rt, rpi, seq, pre, window_left, m, extend=extend), len(seq_lens), sliding=mapped)
            full_end = full.kv_indices.storage_offset() + full.kv_indices.numel()
            assert window.kv_indptr.storage_offset() >= full_end, "the window's list overlaps the full one"
        assert plan.run(rt, rpi[:2], lens[:2], m, 3, 3) is None, "another batch size"
        assert plan.run(rt, rpi, lens.int(), m, n_full, n_window) is None, "lengths of another dtype"
        other = mapping if m is None else None
        assert plan.run(rt, rpi, lens, other, n_full, n_window) is None, "a mapping where the plan had none, or none where it had one"
    with pytest.raises(ValueError, match="window_left >= 0"):
        _window_lists_plan(rt, rpi, seq, window_left=-1, extend=False, mapping=mapping)


def test_evicted_slots_translate_to_zero(device):
    """A window wider than the one the state evicted for reads evicted tokens: mapping 0, kept as 0."""
    state = _state([40, 23, 31], 4, 1)
    rt, mapping, rpi, seq, pre = _batch(state, device)
    got = build_window_indices(rt, rpi, seq, window_left=30, mapping=mapping, block=8, num_splits=2)
    expected = _reference(rt, rpi, seq, pre, 30, mapping, extend=False)
    _check_csr(got, expected, 0, sliding=False)
    assert int((expected[1] == 0).sum()) > 10  # the case really holds evicted slots
    table = build_window_page_table(rt, rpi, seq, window_left=-1, page_size=1, mapping=mapping, block=16)
    assert_close(
        table.page_table, ref.window_page_table(rt.cpu(), rpi.cpu(), seq.cpu() * 0, seq.cpu(), 1, mapping.cpu()), name="page_table"
    )


def test_out_buffers_csr(device):
    """Fixed buffers (the CUDA-graph path): indptr and starts fully written, the tail left alone."""
    state = _state([9, 17, 4], 5, 1)
    rt, mapping, rpi, seq, pre = _batch(state, device)
    B = rpi.shape[0]
    cap = B * max_window_len(5, rt.shape[1])
    out = WindowIndices(*(torch.full((n,), SENTINEL, dtype=torch.int32, device=device) for n in (B + 1, cap, B)))
    got = build_window_indices(rt, rpi, seq, window_left=5, mapping=mapping, out=out, block=4)
    assert got.kv_indices.data_ptr() == out.kv_indices.data_ptr()
    expected = _reference(rt, rpi, seq, pre, 5, mapping, extend=False)
    _check_csr(got, expected, 3, sliding=True)
    assert bool((got.kv_indices[int(expected[0][-1]) :] == SENTINEL).all())
    # An undersized buffer truncates and never writes past its end.
    backing = torch.full((14,), SENTINEL, dtype=torch.int32, device=device)
    out = WindowIndices(torch.empty(B + 1, dtype=torch.int32, device=device), backing[:7], torch.empty(B, dtype=torch.int32, device=device))
    build_window_indices(rt, rpi, seq, window_left=5, mapping=mapping, out=out, block=4)
    assert_close(backing[:7], expected[1][:7], name="truncated kv_indices")
    assert bool((backing[7:] == SENTINEL).all())


def page_table_cases():
    small = [
        pytest.param([30, 77, 50, 1], [1, 1, 1, 1], 20, 16, False, id="B4-L77-W20-P16-decode"),
        pytest.param([30, 77, 50], [3, 0, 5], 20, 16, True, id="B3-L77-W20-P16-extend"),
        pytest.param([150, 65, 3], [1, 1, 1], 70, 64, False, id="B3-L150-W70-P64-decode"),
        pytest.param([9, 14], [2, 0], 0, 1, True, id="B2-W0-P1-extend"),
        pytest.param([7, 33], [1, 1], 5, 1, False, id="B2-L33-W5-P1-decode"),
    ]
    if not HAS_CUDA:
        return small
    g = torch.Generator().manual_seed(3)
    wide = []
    for ps in (1, 16, 64):
        for W in (0, 17, 100):
            for extend in (False, True):
                lens = torch.randint(1, 400, (9,), generator=g)
                new = torch.minimum(lens, torch.randint(0, 6, (9,), generator=g)) if extend else torch.ones(9).long()
                wide.append(
                    pytest.param(
                        lens.tolist(),
                        new.tolist(),
                        W,
                        ps,
                        extend,
                        id=f"B9-L{int(lens.max())}-W{W}-P{ps}-{'extend' if extend else 'decode'}",
                    )
                )
    return small + wide


@pytest.mark.parametrize("seq_lens, new_tokens, window_left, page_size, extend", page_table_cases())
def test_window_page_table(device, seq_lens, new_tokens, window_left, page_size, extend):
    state = _state(seq_lens, window_left, page_size, new_tokens)
    rt, mapping, rpi, seq, pre = _batch(state, device)
    lens = pre if extend else seq
    start_fn = ref.extend_window_start if extend else ref.decode_window_start
    kw = dict(prefix_lens=pre) if extend else {}
    for w, m in ((window_left, mapping), (-1, None)):
        starts = start_fn(lens.cpu(), w)
        # Default width (the widest window), then a wider fixed buffer with a row stride.
        expected = ref.window_page_table(rt.cpu(), rpi.cpu(), starts, lens.cpu(), page_size, m.cpu() if m is not None else None)
        got = build_window_page_table(rt, rpi, seq, window_left=w, page_size=page_size, mapping=m, **kw)
        assert_close(got.page_table, expected, name="page_table")
        assert_close(got.window_starts, starts.int(), name="window_starts")
        width = expected.shape[1] + 3
        backing = torch.full((rpi.shape[0], width + 2), SENTINEL, dtype=torch.int32, device=device)
        out = WindowPageTable(backing[:, :width], torch.full_like(rpi, SENTINEL, dtype=torch.int32))
        build_window_page_table(rt, rpi, seq, window_left=w, page_size=page_size, mapping=m, out=out, block=2, num_splits=2, **kw)
        expected = ref.window_page_table(
            rt.cpu(), rpi.cpu(), starts, lens.cpu(), page_size, m.cpu() if m is not None else None, max_pages=width
        )
        assert_close(backing[:, :width], expected, name="page_table (out)")
        assert bool((backing[:, width:] == SENTINEL).all())
        assert_close(out.window_starts, starts.int(), name="window_starts (out)")


@pytest.mark.parametrize("loc_dtype", [torch.int64, torch.int32])
def test_swa_out_cache_loc(device, loc_dtype):
    state = _state([12, 30, 9], 6, 16, [3, 1, 5])
    mapping = state.mapping.to(device)
    old = state.req_to_token[state.requests[1].req_pool_index, :2].long()  # evicted: mapping 0
    loc = torch.cat([state.new_slots(), old, torch.tensor([-1, 0])]).to(loc_dtype).to(device)
    expected = ref.swa_out_cache_loc(loc.cpu(), state.mapping)
    assert int((expected == 0).sum()) >= 3 and int((expected == -1).sum()) == 1
    assert_close(swa_out_cache_loc(loc, mapping, block=4), expected, name="swa_out_cache_loc")
    buf = torch.full((loc.shape[0] + 9,), SENTINEL, dtype=torch.int32, device=device)
    got = swa_out_cache_loc(loc, mapping, out=buf, block=4)
    assert got.data_ptr() == buf.data_ptr()
    assert_close(buf, ref.swa_out_cache_loc(loc.cpu(), state.mapping, buf.shape[0]), name="graph buffer")
    assert_close(swa_out_cache_loc(loc[:0], mapping, out=buf), torch.zeros_like(buf), name="empty -> zeros")


def store_cases():
    f8 = torch.float8_e4m3fn
    cases = [
        pytest.param(torch.float32, torch.float32, None, "swa", id="f32-swa"),
        pytest.param(torch.float16, torch.float32, 1.7, "full", id="f16-from-f32-scale-full"),
        pytest.param(torch.bfloat16, torch.bfloat16, None, "swa", id="bf16-swa"),
        pytest.param(torch.bfloat16, torch.float32, 0.77, "swa", id="bf16-from-f32-scale"),
        pytest.param(f8, torch.float32, 0.37, "swa", id="fp8-typed-scale"),
        pytest.param(f8, torch.bfloat16, "tensor", "swa-uint8", id="fp8-uint8-storage-tensor-scale"),
        pytest.param(f8, torch.float16, None, "full-uint8", id="fp8-uint8-noscale-full"),
        pytest.param(torch.float8_e4m3fnuz, torch.float32, 0.37, "swa", id="fp8nuz-typed-scale"),
        pytest.param(torch.float8_e4m3fnuz, torch.bfloat16, "tensor", "full", id="fp8nuz-tensor-scale-full"),
    ]
    return cases


@pytest.mark.parametrize("dtype, x_dtype, scale, layer", store_cases())
def test_store_kv(device, dtype, x_dtype, scale, layer):
    """Sliding layers write at mapping[loc] in the same kernel; values bit-equal to the reference."""
    sliding = layer.startswith("swa")
    state = make_pool_state(
        seq_lens=[12, 30, 9],
        window_left=6,
        page_size=16,
        new_tokens=[3, 1, 5],
        dtype=dtype,
        swa_head_num=3,
        swa_head_dim=20,
        full_head_num=2,
        full_head_dim=16,
        generator=torch.Generator().manual_seed(4),
    )
    pool = state.kv_pool.swa_kv_pool if sliding else state.kv_pool.full_kv_pool
    layer_in_pool = 0
    loc = state.new_slots()
    n, H, D = loc.shape[0], pool.head_num, pool.head_dim
    g = torch.Generator().manual_seed(5)
    # K from a fused qkv-like tensor: non-contiguous rows.
    qkv = (torch.randn(n, 3, H, D, generator=g) * 3).to(x_dtype)
    k, v = qkv[:, 1], qkv[:, 2]
    k_scale = v_scale = None
    if scale == "tensor":
        k_scale, v_scale = torch.tensor([0.41]), torch.tensor(2.3)
    elif scale is not None:
        k_scale, v_scale = scale, scale * 2
    typed = (pool.get_key_buffer(layer_in_pool), pool.get_value_buffer(layer_in_pool))
    expected = [b.clone() for b in typed]
    ref.store_kv(*expected, loc, k, v, mapping=state.mapping if sliding else None, k_scale=k_scale, v_scale=v_scale)
    bufs = (pool.k_buffer[layer_in_pool], pool.v_buffer[layer_in_pool]) if "uint8" in layer else typed
    dev_bufs = [b.to(device) for b in bufs]
    to_dev = lambda s: s.to(device) if isinstance(s, torch.Tensor) else s
    store_kv(
        *dev_bufs,
        loc.to(device),
        k.to(device),
        v.to(device),
        mapping=state.mapping.to(device) if sliding else None,
        k_scale=to_dev(k_scale),
        v_scale=to_dev(v_scale),
    )
    for got, exp, name in zip(dev_bufs, expected, ("k_buffer", "v_buffer")):
        got, exp = got.cpu(), exp
        if dtype != torch.float32:
            # Bit patterns: NaN-poisoned untouched slots must stay NaN, written ones must be exact.
            view = torch.uint8 if dtype.itemsize == 1 else torch.int16
            assert_close(got.view(view), exp.view(view), name=name)
        else:
            assert_close(got, exp, atol=0, rtol=0, name=name)
        assert bool(torch.isnan(exp.view(dtype).float()).any()), "the pool holds no poisoned slot: the check above proves less"


def test_store_kv_plan_runs_layers(device):
    """``store_kv_plan`` once per step, ``run`` per layer: each layer's buffers equal ``store_kv``'s bit
    for bit; rows, buffers or scales of another kind raise before anything is written."""
    from triton_swa import store_kv_plan

    g = torch.Generator().manual_seed(7)
    loc = torch.tensor([5, 1, 9], device=device)
    mapping = torch.tensor([0, 3, 0, 0, 0, 2, 0, 0, 0, 7, -1], device=device)
    layers = []
    for _ in range(2):
        bufs = [torch.full((8, 2, 16), float("nan"), dtype=torch.bfloat16, device=device) for _ in range(2)]
        qkv = torch.randn(3, 3, 2, 16, generator=g).to(device)
        layers.append((bufs, qkv[:, 1], qkv[:, 2]))
    (kb0, vb0), k0, v0 = layers[0]
    plan = store_kv_plan(kb0, vb0, loc, k0, v0, mapping=mapping, k_scale=0.5, v_scale=2.0)
    for (kb, vb), k, v in layers:
        want = [b.clone() for b in (kb, vb)]
        store_kv(*want, loc, k, v, mapping=mapping, k_scale=0.5, v_scale=2.0)
        plan.run(kb, vb, k, v, k_scale=0.5, v_scale=2.0)
        for got, exp in zip((kb, vb), want):
            assert torch.equal(got.view(torch.int16), exp.view(torch.int16))
    before = [b.clone() for b in (kb0, vb0)]
    with pytest.raises(ValueError, match="k must be what the plan was made for"):
        plan.run(kb0, vb0, k0.contiguous(), v0, k_scale=0.5, v_scale=2.0)
    with pytest.raises(ValueError, match="k_buffer must be"):
        plan.run(kb0.float(), vb0, k0, v0, k_scale=0.5, v_scale=2.0)
    with pytest.raises(ValueError, match="planned kinds"):
        plan.run(kb0, vb0, k0, v0)
    with pytest.raises(ValueError, match="k_scale"):
        plan.run(kb0, vb0, k0, v0, k_scale=-1.0, v_scale=2.0)
    for got, exp in zip((kb0, vb0), before):
        assert torch.equal(got.view(torch.int16), exp.view(torch.int16)), "a refused run wrote"
    assert store_kv_plan(kb0, vb0, loc[:0], k0[:0], v0[:0]) is None


def test_store_kv_python_negative_slot(device):
    """loc = -1 translates to -1 and writes the last row, as the reference's torch indexing does."""
    mapping = torch.tensor([0, 4, 2, 0, 0, 0, -1], device=device)  # no two locs share a row
    kb = torch.full((6, 1, 4), float("nan"), device=device)
    vb = torch.full((6, 2, 3), float("nan"), device=device)
    loc = torch.tensor([1, -1, 2], device=device)
    k, v = torch.randn(3, 1, 4, device=device), torch.randn(3, 2, 3, device=device)
    exp_k, exp_v = kb.cpu().clone(), vb.cpu().clone()
    ref.store_kv(exp_k, exp_v, loc.cpu(), k.cpu(), v.cpu(), mapping=mapping.cpu())
    store_kv(kb, vb, loc, k, v, mapping=mapping)
    assert_close(kb, exp_k, atol=0, rtol=0, name="k_buffer")
    assert_close(vb, exp_v, atol=0, rtol=0, name="v_buffer")


@pytest.mark.parametrize("sliding", [False, True])
def test_store_kv_skip_negative_writes_nothing_for_padding(sliding, device):
    """``skip_negative=True`` (vLLM's -1 padding): negative locs write nothing, the others as without
    it; the plan reads its loc at every run (refilled in place); a bad flag is refused before any write."""
    from triton_swa import store_kv_plan

    mapping = torch.tensor([0, 4, 2, 5, 0, 0, -1], device=device) if sliding else None
    kb = torch.full((6, 1, 4), float("nan"), device=device)
    vb = torch.full((6, 2, 3), float("nan"), device=device)
    loc = torch.tensor([1, -1, 3, -2], device=device)
    k, v = torch.randn(4, 1, 4, device=device), torch.randn(4, 2, 3, device=device)
    keep = loc >= 0
    exp_k, exp_v = kb.cpu().clone(), vb.cpu().clone()
    ref.store_kv(exp_k, exp_v, loc[keep].cpu(), k[keep].cpu(), v[keep].cpu(), mapping=None if mapping is None else mapping.cpu())
    store_kv(kb, vb, loc, k, v, mapping=mapping, skip_negative=True)
    assert_close(kb, exp_k, atol=0, rtol=0, name="k_buffer")
    assert_close(vb, exp_v, atol=0, rtol=0, name="v_buffer")
    plan = store_kv_plan(kb, vb, loc, k, v, mapping=mapping, skip_negative=True)
    loc.copy_(torch.tensor([-1, 2, -1, 1], device=device))  # the next step's slots, in place
    plan.run(kb, vb, k, v)
    keep = loc >= 0
    ref.store_kv(exp_k, exp_v, loc[keep].cpu(), k[keep].cpu(), v[keep].cpu(), mapping=None if mapping is None else mapping.cpu())
    assert_close(kb, exp_k, atol=0, rtol=0, name="k_buffer after the plan's run")
    with pytest.raises(TypeError, match="skip_negative must be a bool"):
        store_kv(kb, vb, loc, k, v, skip_negative=1)


def test_negative_slots_follow_torch_indexing(device):
    """-1 in req_to_token translates through mapping[-1] = -1 and floors to page -1, as torch does."""
    ps = 4
    mapping = torch.tensor([0, 9, 10, 11, 12, 0, 0, 0, -1], device=device)  # size 4 + page 4 + 1
    rt = torch.tensor([[0] * 8, [1, 2, 3, 4, -1, 2, 3, 4]], dtype=torch.int32, device=device)
    rpi, seq = torch.tensor([1, 0], device=device), torch.tensor([8, 1], device=device)
    for m in (mapping, None):
        got = build_window_page_table(rt, rpi, seq, window_left=-1, page_size=ps, mapping=m)
        expected = ref.window_page_table(rt.cpu(), rpi.cpu(), seq.cpu() * 0, seq.cpu(), ps, m.cpu() if m is not None else None)
        assert int(expected[0, 1]) == -1
        assert_close(got.page_table, expected, name="page_table")
        got = build_window_indices(rt, rpi, seq, window_left=-1, mapping=m)
        _check_csr(got, _reference(rt, rpi, seq, seq, -1, m, extend=False), 0, sliding=False)


def test_host_helpers():
    """Sizing helpers agree with the reference's windows for every start offset."""
    for W in (-1, 0, 1, 5, 16, 31):
        for ps in (1, 4, 16):
            C = 70
            for extend in (False, True):
                lens = torch.arange(0, C + 1)
                start_fn = ref.extend_window_start if extend else ref.decode_window_start
                starts = start_fn(lens, W)
                assert int((lens - starts).max()) == max_window_len(W, C, extend=extend)
                first = starts // ps
                spans = torch.where(lens > starts, (lens - 1) // ps + 1 - first, 0)
                assert int(spans.max()) <= max_window_pages(W, ps, C, extend=extend)
                assert window_index_count(lens, W, lens if extend else None) == int((lens - starts).sum())
                # the backend's count of its host lists: the same number
                assert window_count_of(lens.tolist(), W, extend) == int((lens - starts).sum())


def test_bad_input_raises_before_launch(device):
    state = _state([9, 17], 5, 16)
    rt, mapping, rpi, seq, pre = _batch(state, device)
    ok = dict(window_left=5, mapping=mapping)
    with pytest.raises(TypeError, match="req_to_token"):
        build_window_indices(rt.long(), rpi, seq, **ok)
    with pytest.raises(ValueError, match="seq_lens"):
        build_window_indices(rt, rpi, seq[:-1], **ok)
    with pytest.raises(ValueError, match="prefix_lens"):
        build_window_indices(rt, rpi, seq, prefix_lens=pre[1:], **ok)
    with pytest.raises(ValueError, match="window_left"):
        build_window_indices(rt, rpi, seq, window_left=-2, mapping=mapping)
    with pytest.raises(TypeError, match="window_left"):
        build_window_indices(rt, rpi, seq, window_left=5.0, mapping=mapping)
    # The pool's page size is 16; a wrong one that does not divide the pool size shows in the mapping.
    build_window_indices(rt, rpi, seq, page_size=16, **ok)
    bad_ps = next(p for p in (64, 32, 48, 128) if (mapping.numel() - 1) % p)
    with pytest.raises(ValueError, match=f"page_size={bad_ps} disagrees"):
        build_window_indices(rt, rpi, seq, page_size=bad_ps, **ok)
    with pytest.raises(ValueError, match=f"page_size={bad_ps} disagrees"):
        build_window_page_table(rt, rpi, seq, page_size=bad_ps, **ok)
    with pytest.raises(TypeError, match="mapping"):
        build_window_indices(rt, rpi, seq, window_left=5, mapping=mapping.float())
    B = rpi.shape[0]
    bad = WindowIndices(
        torch.zeros(B + 1, dtype=torch.int64, device=device),
        torch.zeros(64, dtype=torch.int32, device=device),
        torch.zeros(B, dtype=torch.int32, device=device),
    )
    with pytest.raises(TypeError, match="kv_indptr"):
        build_window_indices(rt, rpi, seq, out=bad, **ok)
    with pytest.raises(ValueError, match="power of two"):
        build_window_indices(rt, rpi, seq, block=6, **ok)
    with pytest.raises(ValueError, match="page_table"):
        build_window_page_table(
            rt,
            rpi,
            seq,
            page_size=16,
            out=WindowPageTable(torch.zeros(B + 1, 4, dtype=torch.int32, device=device), torch.zeros(B, dtype=torch.int32, device=device)),
            **ok,
        )
    with pytest.raises(TypeError, match="out_cache_loc"):
        swa_out_cache_loc(seq.float(), mapping)
    with pytest.raises(ValueError, match="fewer"):
        swa_out_cache_loc(seq, mapping, out=torch.zeros(1, dtype=torch.int32, device=device))
    kb = torch.zeros(8, 2, 4, device=device)
    with pytest.raises(ValueError, match="k must have shape"):
        store_kv(kb, kb, seq, torch.zeros(B, 2, 5, device=device), torch.zeros(B, 2, 4, device=device))
    with pytest.raises(ValueError, match="k_scale"):
        store_kv(
            kb, kb, seq, torch.zeros(B, 2, 4, device=device), torch.zeros(B, 2, 4, device=device), k_scale=torch.ones(2, device=device)
        )


# GPU tier: big batches, 1M-token contexts (int64 address math), CUDA-graph capture.


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [1, 16])
def test_large_batch_gpu(page_size):
    g = torch.Generator().manual_seed(6)
    lens = torch.randint(1, 60, (4096,), generator=g).tolist()
    state = make_pool_state(
        seq_lens=lens,
        window_left=9,
        page_size=page_size,
        chunk=64,
        swa_head_num=1,
        swa_head_dim=1,
        full_head_num=1,
        full_head_dim=1,
        generator=g,
    )
    rt, mapping, rpi, seq, pre = _batch(state, "cuda", pad=0)
    got = build_window_indices(rt, rpi, seq, window_left=9, mapping=mapping, page_size=page_size)
    _check_csr(got, _reference(rt, rpi, seq, pre, 9, mapping, extend=False), len(lens), sliding=True)
    got = build_window_indices(rt, rpi, seq, window_left=-1, num_indices=sum(lens))
    _check_csr(got, _reference(rt, rpi, seq, pre, -1, None, extend=False), len(lens), sliding=False)
    starts = ref.decode_window_start(seq.cpu(), 9)
    table = build_window_page_table(
        rt, rpi, seq, window_left=9, page_size=page_size, mapping=mapping, max_pages=max_window_pages(9, page_size, rt.shape[1])
    )
    assert_close(
        table.page_table,
        ref.window_page_table(rt.cpu(), rpi.cpu(), starts, seq.cpu(), page_size, mapping.cpu(), max_pages=table.page_table.shape[1]),
    )


@pytest.mark.gpu
def test_million_token_context_gpu():
    """Row offsets past 2**31 elements and 1M-token windows: int32 address math would read garbage."""
    C = 1 << 20
    rows = 2100  # row 2099 starts at element 2099 * 2**20 > 2**31
    rt = torch.empty(rows, C, dtype=torch.int32, device="cuda")  # never-read rows stay garbage
    n_slots = 3 << 20
    g = torch.Generator(device="cuda").manual_seed(7)
    used = (2099, 0, 1500)
    for r in used:
        rt[r] = (torch.randperm(n_slots, device="cuda", generator=g)[:C] + 1).int() if r else 0
    mapping = torch.randint(1, 1 << 22, (n_slots + 16 + 1,), device="cuda", generator=g)  # page size 16
    mapping[torch.randint(0, n_slots, (n_slots // 3,), device="cuda", generator=g)] = 0  # evicted
    mapping[0], mapping[-1] = 0, -1
    rpi = torch.tensor(used, device="cuda")
    seq = torch.tensor([C, 1, 700_001], device="cuda")
    pre = torch.tensor([C - 5, 0, 699_000], device="cuda")
    for W, m in ((4095, mapping), (1 << 20, mapping), (-1, None), (-1, mapping)):
        got = build_window_indices(rt, rpi, seq, window_left=W, mapping=m)
        _check_csr(got, _reference(rt, rpi, seq, pre, W, m, extend=False), 0, sliding=False)
        got = build_window_indices(rt, rpi, seq, window_left=W, mapping=m, prefix_lens=pre)
        _check_csr(got, _reference(rt, rpi, seq, pre, W, m, extend=True), 0, sliding=False)
        starts = ref.decode_window_start(seq.cpu(), W)
        table = build_window_page_table(rt, rpi, seq, window_left=W, page_size=16, mapping=m)
        expected = ref.window_page_table(rt, rpi, starts, seq.cpu(), 16, m)
        assert_close(table.page_table, expected, name=f"page_table W={W}")


@pytest.mark.gpu
def test_cuda_graph_capture_gpu():
    """Build + page table + swa_out_cache_loc + store_kv captured once with fixed buffers; replays after
    the inputs change equal the eager reference."""
    W, ps, max_bs = 11, 16, 8
    state = make_pool_state(
        seq_lens=[5, 40, 77, 23, 61, 9, 100],
        window_left=W,
        page_size=ps,
        swa_head_num=2,
        swa_head_dim=8,
        generator=torch.Generator().manual_seed(8),
    )
    rt, mapping = state.req_to_token.cuda(), state.mapping.cuda()
    C = rt.shape[1]
    rpi = torch.zeros(max_bs, dtype=torch.int64, device="cuda")
    seq = torch.ones(max_bs, dtype=torch.int64, device="cuda")
    loc = torch.zeros(max_bs, dtype=torch.int64, device="cuda")
    k = torch.zeros(max_bs, 2, 8, device="cuda")
    k_scale = torch.ones(1, device="cuda")
    kb = torch.full((state.kv_pool.swa_kv_pool.size + ps, 2, 8), float("nan"), device="cuda")
    vb = kb.clone()
    csr = WindowIndices(
        torch.empty(max_bs + 1, dtype=torch.int32, device="cuda"),
        torch.full((max_bs * max_window_len(W, C),), SENTINEL, dtype=torch.int32, device="cuda"),
        torch.empty(max_bs, dtype=torch.int32, device="cuda"),
    )
    table = WindowPageTable(
        torch.empty(max_bs, max_window_pages(W, ps, C), dtype=torch.int32, device="cuda"),
        torch.empty(max_bs, dtype=torch.int32, device="cuda"),
    )
    swa_loc = torch.empty(max_bs + 4, dtype=torch.int32, device="cuda")

    def step():
        build_window_indices(rt, rpi, seq, window_left=W, mapping=mapping, out=csr)
        build_window_page_table(rt, rpi, seq, window_left=W, page_size=ps, mapping=mapping, out=table)
        swa_out_cache_loc(loc, mapping, out=swa_loc)
        store_kv(kb, vb, loc, k, k, mapping=mapping, k_scale=k_scale, v_scale=k_scale)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    for picks, scale in (([0, 1, 2, 3, 4], 0.5), ([6, 2, 5, 1, 0, 3, 4], 3.0)):
        reqs = [state.requests[i] for i in picks]
        n = len(reqs)
        rpi.zero_()
        seq.fill_(1)
        loc.zero_()
        rpi[:n] = torch.tensor([r.req_pool_index for r in reqs])
        seq[:n] = torch.tensor([r.seq_len for r in reqs])
        loc[:n] = torch.stack([state.req_to_token[r.req_pool_index, r.seq_len - 1].long() for r in reqs])
        k.copy_(torch.randn_like(k))
        k_scale.fill_(scale)
        kb.fill_(float("nan"))
        vb.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        expected = _reference(rt, rpi, seq, seq, W, mapping, extend=False)
        _check_csr(csr, expected, n, sliding=True)
        starts = ref.decode_window_start(seq.cpu(), W)
        assert_close(
            table.page_table,
            ref.window_page_table(rt.cpu(), rpi.cpu(), starts, seq.cpu(), ps, mapping.cpu(), max_pages=table.page_table.shape[1]),
        )
        assert_close(swa_loc, ref.swa_out_cache_loc(loc.cpu(), mapping.cpu(), swa_loc.shape[0]), name="swa_loc")
        exp_k = torch.full_like(kb, float("nan")).cpu()
        exp_v = exp_k.clone()
        # Padding tokens all write the dummy slot 0; compare the real rows only.
        ref.store_kv(exp_k, exp_v, loc[:n].cpu(), k[:n].cpu(), k[:n].cpu(), mapping=mapping.cpu(), k_scale=scale, v_scale=scale)
        assert_close(kb[1:], exp_k[1:].cuda(), atol=0, rtol=0, name="k_buffer")


# ---- store_kv never writes outside its buffers (issue 11, defect 7) ----


def _canaried(rows: int, heads: int, dim: int, extra: int, device, dtype=torch.float32):
    """A buffer of ``rows`` rows and the ``extra`` rows right after it in the same storage (what a
    store past the buffer would hit), both NaN."""
    whole = torch.full((rows + extra, heads, dim), float("nan"), dtype=dtype, device=device)
    return whole[:rows], whole[rows:]


@pytest.mark.parametrize("sliding", [False, True], ids=["full-layer", "sliding-layer"])
def test_store_kv_drops_out_of_range_slots(sliding, device):
    """Slots past the buffer (just past it, beyond -rows, through a mapping entry past the buffer or
    a loc past the mapping) are dropped: the neighbouring rows stay NaN, the in-range rows are
    written exactly as the reference writes them."""
    rows, H, D, DV = 8, 2, 4, 3
    kb, k_canary = _canaried(rows, H, D, 6, device)
    vb, v_canary = _canaried(rows, H, DV, 6, device)
    if sliding:
        # mapping[full] = swa slot: 3 -> 8 (one past), 4 -> 12 (further), 6 -> -9 (before -rows)
        mapping = torch.tensor([0, 2, 5, 8, 12, 7, -9, 1, 0, 0, -1], dtype=torch.int64, device=device)
        loc = torch.tensor([1, 3, 2, 4, 6, 11, 7, -1 - 11], device=device)  # 11, -12: past the mapping
        good = torch.tensor([True, False, True, False, False, False, True, False])
        slots = mapping.cpu()[loc.cpu()[good]]
    else:
        mapping = None
        loc = torch.tensor([2, 8, 5, 9, -9, 13, 7, -4], device=device)  # -4 wraps to 4 (no slot written twice)
        good = torch.tensor([True, False, True, False, False, False, True, True])
        slots = loc.cpu()[good]
    n = loc.shape[0]
    k = torch.randn(n, H, D, device=device)
    v = torch.randn(n, H, DV, device=device)
    store_kv(kb, vb, loc, k, v, mapping=mapping)
    assert bool(k_canary.isnan().all()) and bool(v_canary.isnan().all()), "a store landed past the buffer"
    exp_k = torch.full((rows, H, D), float("nan"))
    exp_v = torch.full((rows, H, DV), float("nan"))
    exp_k[slots] = k.cpu()[good]
    exp_v[slots] = v.cpu()[good]
    assert_close(kb, exp_k, atol=0, rtol=0, name="k_buffer")
    assert_close(vb, exp_v, atol=0, rtol=0, name="v_buffer")


def test_store_kv_drops_far_slots_per_buffer(device):
    """K and V buffers of different sizes each keep their own bound; far-away slots are dropped too."""
    kb, k_canary = _canaried(6, 1, 4, 4, device)
    vb, v_canary = _canaried(10, 1, 4, 4, device)
    loc = torch.tensor([3, 7, 2**40, -(2**40), 2**31 - 1], device=device)
    x = torch.randn(5, 1, 4, device=device)
    store_kv(kb, vb, loc, x, x + 1)
    assert bool(k_canary.isnan().all()) and bool(v_canary.isnan().all())
    assert torch.equal(kb[3], x[0]) and bool(kb[torch.arange(6, device=device) != 3].isnan().all())
    assert torch.equal(vb[3], x[0] + 1) and torch.equal(vb[7], x[1] + 1)
    assert int((~vb.isnan()).any(-1).any(-1).sum()) == 2


def test_strided_views_where_strides_are_passed(device):
    """store_kv's loc, swa_out_cache_loc's out_cache_loc and req_to_token's rows are read through
    their strides: strided views give the reference's result."""
    state = _state([9, 17, 4], 5, 4)
    rt, mapping, rpi, seq, pre = _batch(state, device)
    wide_rt = torch.zeros(rt.shape[0], 2 * rt.shape[1], dtype=rt.dtype, device=device)
    wide_rt[:, ::2] = rt
    got = build_window_indices(wide_rt[:, ::2], rpi, seq, window_left=5, mapping=mapping)
    want = build_window_indices(rt, rpi, seq, window_left=5, mapping=mapping)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    loc = state.new_slots().to(device)
    wide_loc = torch.zeros(2 * loc.shape[0], dtype=loc.dtype, device=device)
    wide_loc[::2] = loc
    assert torch.equal(swa_out_cache_loc(wide_loc[::2], mapping), ref.swa_out_cache_loc(loc, mapping))
    n = loc.shape[0]
    kb = torch.full((int(mapping.max()) + 1, 2, 4), float("nan"), device=device)
    vb = kb.clone()
    k, v = torch.randn(n, 2, 4, device=device), torch.randn(n, 2, 4, device=device)
    exp_k, exp_v = kb.cpu().clone(), vb.cpu().clone()
    ref.store_kv(exp_k, exp_v, loc.cpu(), k.cpu(), v.cpu(), mapping=mapping.cpu())
    store_kv(kb, vb, wide_loc[::2], k, v, mapping=mapping)
    assert_close(kb, exp_k, atol=0, rtol=0, name="k_buffer")
    assert_close(vb, exp_v, atol=0, rtol=0, name="v_buffer")


def test_poisoned_index_buffers(device, monkeypatch):
    """Under TRITON_SWA_POISON=1 (the suite's default) the index buffers an op allocates start as the
    int32 minimum: entries past kv_indptr[B] (documented as untouched) keep it, every other entry is
    the reference's; with the switch off, the same call gives the same written entries."""
    from triton_swa.runtime import poison
    from triton_swa.runtime.poison import INT_POISON, empty, poison_enabled

    state = _state([9, 17], 5, 4)
    rt, mapping, rpi, seq, pre = _batch(state, device)
    exact = window_index_count(seq.cpu(), 5)
    assert poison_enabled()
    got = build_window_indices(rt, rpi, seq, window_left=5, mapping=mapping, num_indices=exact + 3)
    assert bool((got.kv_indices[exact:] == INT_POISON).all())
    want = build_window_indices(rt, rpi, seq, window_left=5, mapping=mapping, num_indices=exact)
    assert torch.equal(got.kv_indices[:exact], want.kv_indices) and torch.equal(got.kv_indptr, want.kv_indptr)
    assert bool(empty(4, dtype=torch.float32, device=device).isnan().all())
    monkeypatch.setattr(poison, "_ENABLED", False)
    assert not poison_enabled()
    again = build_window_indices(rt, rpi, seq, window_left=5, mapping=mapping, num_indices=exact)
    assert torch.equal(again.kv_indices, want.kv_indices)


def test_poison_switch_is_read_from_the_environment_on_refresh(monkeypatch):
    from triton_swa.runtime import poison

    monkeypatch.setattr(poison, "_ENABLED", poison._ENABLED)  # restored after the test
    monkeypatch.setenv("TRITON_SWA_POISON", "0")
    assert poison.refresh_poison_env() is False and not poison.poison_enabled()
    monkeypatch.setenv("TRITON_SWA_POISON", "1")
    assert poison.refresh_poison_env() is True and poison.poison_enabled()


@pytest.mark.interpreter
@pytest.mark.parametrize("window_left", [-1, 0, 5, 19], ids=lambda w: f"W{w}")
def test_window_page_table_from_block_table(device, window_left):
    """vLLM's absolute block tables cut to each window: equal to the reference's window page table
    over the same tokens, with every block outside the windows a poisoned entry that is never read
    (a read would copy it), an empty row (CUDA-graph padding) all zero, and the columns past the
    window's pages zero."""
    g = torch.Generator().manual_seed(5)
    bs, cols = 4, 12
    lens = torch.tensor([1, 7, 21, 44, 0, 16])
    B = len(lens)
    table = torch.randperm(B * cols, generator=g).view(B, cols).to(torch.int32) + 1
    starts = (lens - window_left - 1).clamp(min=0) if window_left >= 0 else lens * 0
    poisoned = table.clone()
    for b in range(B):
        first, last = int(starts[b]) // bs, (int(lens[b]) - 1) // bs + 1 if lens[b] > 0 else 0
        poisoned[b, :first] = -999
        poisoned[b, max(last, first) :] = -999
    width = max_window_pages(window_left, bs, cols * bs) + 1  # one spare column: zero
    out = WindowPageTable(torch.full((B, width), -5, dtype=torch.int32), torch.full((B,), -5, dtype=torch.int32))
    got = window_page_table_from_block_table(
        poisoned.to(device), lens.to(device), window_left=window_left, block_size=bs, out=WindowPageTable(*(x.to(device) for x in out))
    )
    rtt = (table.long()[:, :, None] * bs + torch.arange(bs)).view(B, -1).to(torch.int32)
    want = ref.window_page_table(rtt, torch.arange(B), starts, lens, bs, max_pages=width)
    assert torch.equal(got.page_table.cpu(), want), (got.page_table, want)
    assert torch.equal(got.window_starts.cpu(), starts.to(torch.int32))
    with pytest.raises(ValueError, match="block_table must have at least"):
        window_page_table_from_block_table(poisoned[:2].to(device), lens.to(device), window_left=window_left, block_size=bs, out=got)
