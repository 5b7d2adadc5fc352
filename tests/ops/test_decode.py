"""swa_decode against the reference decode over realistic pool states.

States come from ``make_pool_state`` (real allocators, permuted free lists, window eviction, NaN in every
slot no window may read, the dummy slot included); outputs are pre-filled with NaN. So a kernel that
reads one slot outside a window, or leaves one output element unwritten, fails.

CPU tier (interpreter): tiny shapes with forced splits and 16-token blocks, so that multi-block,
multi-page, split and merge paths all run. GPU tier: the issue's feature grid (head dims 64 to 512,
Dv != D, GQA 1 to 16 and MQA, fp16/bf16, fp8 KV, softcap, sinks, pages 1/16/64), the default
heuristics, and CUDA-graph capture with fixed buffers.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace

import pytest
import torch

import triton_swa_reference as ref
from triton_swa.ops._common.merge import MAX_SPLITS
from triton_swa.ops.decode.launcher import _swa_decode_impl, _Tune, swa_decode
from triton_swa.testing import assert_close, make_pool_state, without_native_fp8

HAS_CUDA = torch.cuda.is_available()
FP8 = torch.float8_e4m3fn
SHORT = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class Case:
    seq_lens: tuple[int, ...]
    window_left: int
    hq: int
    h: int
    d: int
    dv: int | None = None
    page: int = 1
    form: str = "csr"  # or "paged" (page table)
    dtype: torch.dtype = torch.float32
    fp8: bool = False
    fp8_dtype: torch.dtype = FP8  # or float8_e4m3fnuz (MI300's format)
    softcap: float = 0.0
    sinks: bool = False
    num_splits: int | None = None
    block_n: int | None = None
    merge: str | None = None  # "fused" (the last split merges in place: direct calls' default up to D 256) or "kernel"

    @property
    def id(self) -> str:
        parts = [f"B{len(self.seq_lens)}", f"L{max(self.seq_lens)}", f"W{self.window_left}", f"HQ{self.hq}", f"H{self.h}", f"D{self.d}"]
        if self.dv is not None:
            parts.append(f"DV{self.dv}")
        parts += [f"P{self.page}", self.form, SHORT[self.dtype]]
        if self.fp8:
            parts.append("fp8" if self.fp8_dtype == FP8 else "fp8nuz")
        if self.softcap:
            parts.append("cap")
        if self.sinks:
            parts.append("sink")
        parts.append(f"S{self.num_splits or 'auto'}")
        if self.block_n:
            parts.append(f"N{self.block_n}")
        if self.merge:
            parts.append(f"M{self.merge}")
        return "-".join(parts)


def _cpu_cases() -> list[Case]:
    f16, bf16 = torch.float16, torch.bfloat16
    return [
        # W = 5 over odd lengths, a 1-token request, split into 2.
        Case((37, 1, 12), 5, 2, 2, 16, num_splits=2, block_n=16),
        # Several 16-token blocks per split, non-power-of-two D, Dv != D, GQA 4.
        Case((50, 7, 45), 40, 8, 2, 24, dv=40, dtype=f16, num_splits=3, block_n=16),
        # One split, several blocks (no merge), over a paged pool read through CSR slots.
        Case((61, 33), 44, 4, 1, 16, page=4, dtype=f16, num_splits=1, block_n=16),
        # Page tables: window not page-aligned, pages of 4 and 16, W = 0, W + 1 >= L.
        Case((37, 20, 3), 19, 8, 2, 16, page=4, form="paged", num_splits=2, block_n=16),
        Case((70, 18), 33, 4, 2, 32, page=16, form="paged", dtype=f16, num_splits=3, block_n=16),
        Case((9, 1, 4), 0, 4, 2, 16, page=4, form="paged", num_splits=2, block_n=16),
        Case((13, 6), 40, 2, 1, 16, page=4, form="paged", dtype=f16, num_splits=4, block_n=16),
        # A full layer (window_left = -1), direct and split.
        Case((33, 17), -1, 4, 2, 32, page=16, form="paged", dtype=f16, num_splits=1, block_n=16),
        Case((41, 5), -1, 4, 1, 16, dtype=f16, num_splits=3, block_n=16),
        # Softcap and sinks, through both merges (the merge kernel's and the last split's) and the direct path.
        Case((45, 2, 30), 29, 8, 2, 16, dtype=f16, softcap=2.0, sinks=True, num_splits=3, block_n=16),
        Case((45, 2, 30), 29, 8, 2, 16, dtype=f16, softcap=2.0, sinks=True, num_splits=3, block_n=16, merge="fused"),
        Case((45, 2), 29, 8, 2, 16, page=4, form="paged", softcap=2.0, sinks=True, num_splits=1, block_n=16),
        # fp8 KV with scales (a float and a device tensor), Dv != D.
        Case((40, 11), 27, 4, 2, 16, dv=32, dtype=f16, fp8=True, num_splits=2, block_n=16),
        Case((40, 11), 27, 4, 2, 16, page=4, form="paged", dtype=f16, fp8=True, sinks=True, num_splits=1, block_n=16),
        # bf16 through the interpreter's dot shim (docs/contract.md §8).
        Case((29, 8), 17, 4, 2, 16, dtype=bf16, num_splits=2, block_n=16),
        # MQA with a group wider than one program's 64 rows; each program merges its own heads.
        Case((23, 4), 9, 72, 1, 16, dtype=f16, num_splits=2, block_n=16),
        # Empty windows and more splits than blocks, merged in place, over a page table.
        Case((0, 37, 5), 30, 6, 2, 16, page=4, form="paged", sinks=True, num_splits=5, block_n=16, merge="fused"),
        # Default tiles and splits.
        Case((38, 3), 20, 4, 2, 16, page=4, form="paged", dtype=f16),
        Case((38, 3), 20, 4, 2, 16, dtype=f16),
    ]


def _gpu_cases() -> list[Case]:
    f16, bf16 = torch.float16, torch.bfloat16
    lens = (1, 77, 1300, 611)
    cases = []
    # Every head dim, each with its own GQA ratio, page size, index form and dtype.
    grid = [
        (64, None, 64, 8, 1, "csr", bf16),
        (64, None, 32, 32, 16, "paged", f16),  # G = 1
        (80, None, 16, 4, 16, "paged", bf16),
        (80, None, 32, 2, 1, "csr", f16),  # G = 16
        (96, None, 24, 8, 64, "paged", f16),  # G = 3
        (96, 64, 32, 1, 1, "csr", bf16),  # MQA, Dv != D
        (128, None, 32, 16, 1, "csr", bf16),
        (128, None, 32, 8, 16, "paged", f16),
        (128, 96, 12, 2, 64, "paged", bf16),  # G = 6
        (256, None, 32, 16, 16, "paged", bf16),
        (256, 128, 16, 1, 1, "csr", f16),  # MQA G = 16
        (512, None, 32, 4, 16, "paged", bf16),
        (512, None, 16, 16, 1, "csr", f16),
        (512, 256, 8, 1, 64, "paged", bf16),
        (512, None, 32, 1, 16, "paged", f16),  # MQA G = 32 at D 512: two programs per KV head
    ]
    for d, dv, hq, h, page, form, dtype in grid:
        for w in (127, 1023):
            cases.append(Case(lens, w, hq, h, d, dv, page, form, dtype))
        cases.append(Case(lens, -1, hq, h, d, dv, page, form, dtype))
    # Features on two geometries: softcap, sinks, fp8 KV (with both scale kinds), forced splits.
    for d, hq, h, page, form in ((128, 32, 8, 16, "paged"), (64, 64, 8, 1, "csr"), (256, 32, 16, 64, "paged")):
        for dtype in (f16, bf16):
            cases.append(Case(lens, 127, hq, h, d, None, page, form, dtype, softcap=30.0, sinks=True))
            cases.append(Case(lens, 1023, hq, h, d, None, page, form, dtype, fp8=True))
            cases.append(Case(lens, 1023, hq, h, d, None, page, form, dtype, fp8=True, softcap=30.0, sinks=True, num_splits=7))
    cases.append(Case((0, 900, 0, 5), 511, 16, 4, 128, None, 16, "paged", bf16, sinks=True))
    # Both merges at many splits, wide heads (the fused merge loops over split chunks at D 512).
    for merge in ("fused", "kernel"):
        cases.append(Case((0, 2900, 1, 777), 2047, 32, 4, 512, None, 16, "paged", bf16, sinks=True, num_splits=37, merge=merge))
        cases.append(Case((3, 1500, 64), 1023, 24, 8, 96, 64, 1, "csr", f16, softcap=30.0, num_splits=MAX_SPLITS, merge=merge))
    cases.append(Case((0, 900, 0, 5), 511, 16, 4, 128, None, 1, "csr", bf16, num_splits=MAX_SPLITS))
    cases.append(Case((3000,), 2047, 32, 8, 128, None, 16, "paged", f16, num_splits=1))
    cases.append(Case((45, 700), 300, 8, 2, 128, None, 16, "paged", torch.float32))
    return cases


def cases() -> list:
    chosen = _gpu_cases() if HAS_CUDA else _cpu_cases()
    return [pytest.param(c, id=c.id) for c in chosen]


@dataclass
class Built:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    page_table: torch.Tensor
    window_starts: torch.Tensor
    seq_lens: torch.Tensor
    sinks: torch.Tensor | None
    k_scale: float | None
    v_scale: torch.Tensor | None
    loc: torch.Tensor  # the step's full slots (out_cache_loc), -1 for a request without a new token
    mapping: torch.Tensor | None  # full -> SWA slots of a sliding layer's pool


def build(case: Case, device: str, seed: int = 0) -> Built:
    """A pool state on the CPU (moved to ``device``), its window indices, and random queries."""
    g = torch.Generator().manual_seed(seed)
    full = case.window_left < 0
    state = make_pool_state(
        seq_lens=list(case.seq_lens),
        window_left=case.window_left,
        page_size=case.page,
        swa_head_num=case.h,
        swa_head_dim=case.d,
        full_head_num=case.h,
        full_head_dim=case.d,
        dtype=case.fp8_dtype if case.fp8 else case.dtype,
        new_tokens=[1 if n else 0 for n in case.seq_lens],
        chunk=max(5, max(case.seq_lens) // 12),
        generator=g,
    )
    # Layer 0 is the sliding layer (SWA slots through the mapping), layer 1 the full layer (full slots).
    layer, mapping = (1, None) if full else (0, state.mapping)
    k, v = state.kv_pool.get_kv_buffer(layer)
    rpi, lens = state.req_pool_indices(), state.seq_lens()
    kv_indptr, kv_indices, starts = ref.decode_window_indices(state.req_to_token, rpi, lens, case.window_left, mapping)
    page_table = ref.window_page_table(state.req_to_token, rpi, starts, lens, case.page, mapping)
    if case.dv is not None:
        # A V pool of another head dim, NaN except at the windows' slots.
        values = torch.full((v.shape[0], case.h, case.dv), float("nan"))
        live = kv_indices.long().unique()
        values[live] = torch.randn(len(live), case.h, case.dv, generator=g)
        v = values.to(v.dtype)
    q = torch.randn(len(case.seq_lens), case.hq, case.d, generator=g).to(case.dtype)
    sinks = torch.randn(case.hq, generator=g) * 2 if case.sinks else None
    k_scale, v_scale = (0.75, torch.tensor([1.25])) if case.fp8 else (None, None)
    loc = torch.full((len(case.seq_lens),), -1, dtype=torch.int64)
    loc[torch.tensor([n > 0 for n in case.seq_lens])] = state.new_slots().long()
    to = lambda x: None if x is None else x.to(device)
    return Built(
        to(q),
        to(k),
        to(v),
        to(kv_indptr),
        to(kv_indices),
        to(page_table),
        to(starts),
        to(lens),
        to(sinks),
        k_scale,
        to(v_scale),
        to(loc),
        to(mapping),
    )


def run(case: Case, b: Built, **kwargs) -> torch.Tensor:
    out = torch.full((b.q.shape[0], case.hq, b.v.shape[-1]), float("nan"), dtype=b.q.dtype, device=b.q.device)
    if case.form == "csr":
        where = dict(kv_indptr=b.kv_indptr, kv_indices=b.kv_indices)
    else:
        where = dict(page_table=b.page_table, window_starts=b.window_starts, seq_lens=b.seq_lens, page_size=case.page)
    if case.merge is not None:
        kwargs["tune"] = _Tune(fused_merge=case.merge == "fused")
    decode = _swa_decode_impl if "tune" in kwargs else swa_decode
    got = decode(
        b.q,
        b.k,
        b.v,
        **where,
        sm_scale=0.6 / case.d**0.5,
        logit_cap=case.softcap,
        sinks=b.sinks,
        k_scale=b.k_scale,
        v_scale=b.v_scale,
        out=out,
        num_splits=case.num_splits,
        block_n=case.block_n,
        **kwargs,
    )
    assert got is out
    return got


def expected(case: Case, b: Built) -> torch.Tensor:
    return ref.decode_attention(
        b.q,
        b.k,
        b.v,
        b.kv_indptr,
        b.kv_indices,
        sm_scale=0.6 / case.d**0.5,
        logit_cap=case.softcap,
        sinks=b.sinks,
        k_scale=b.k_scale,
        v_scale=b.v_scale,
    )


@pytest.mark.interpreter
@pytest.mark.parametrize("case", cases())
def test_decode_matches_reference(case, device):
    b = build(case, device)
    assert_close(run(case, b), expected(case, b), name=case.id)


@pytest.mark.interpreter
def test_decode_fp8_uint8_storage(device):
    """The pool's uint8 storage reads as fp8 e4m3, same as its typed view."""
    case = Case((30, 9), 21, 4, 2, 16, dtype=torch.float16, fp8=True, num_splits=2, block_n=16)
    b = build(case, device)
    want = expected(case, b)
    b.k, b.v = b.k.view(torch.uint8), b.v.view(torch.uint8)
    assert_close(run(case, b), want)


FP8_CASES = [
    Case((40, 11), 27, 4, 2, 16, dv=32, dtype=torch.float16, fp8=True, num_splits=2, block_n=16),
    Case((40, 11), 27, 4, 2, 16, page=4, form="paged", dtype=torch.bfloat16, fp8=True, softcap=5.0, sinks=True, num_splits=1, block_n=16),
]


@pytest.mark.interpreter
@pytest.mark.parametrize("how", ["e4m3fn-native", "e4m3fn-bytes", "e4m3fnuz"])
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in FP8_CASES])
def test_decode_fp8_formats(case, how, device):
    """Both fp8 formats, and e4m3fn loaded natively or as bytes decoded in the kernel (the path of
    targets without Triton's conversion, sm_80/86): each equals the reference over its own bytes."""
    if how == "e4m3fnuz":
        case = replace(case, fp8_dtype=torch.float8_e4m3fnuz)
    b = build(case, device)
    want = expected(case, b)
    with without_native_fp8(device) if how == "e4m3fn-bytes" else contextlib.nullcontext():
        got = run(case, b)
    assert_close(got, want, name=f"{case.id}-{how}")


@pytest.mark.interpreter
def test_decode_fixed_buffers_ignore_tails(device):
    """CUDA-graph style buffers: kv_indices and page-table rows longer than the windows, their tails
    pointing at the NaN dummy slot/page, and padding requests with empty windows."""
    case = Case((0, 37, 12, 0), 19, 4, 2, 16, page=4, dtype=torch.float16, sinks=True, num_splits=3, block_n=16)
    b = build(case, device)
    want = expected(case, b)
    b.kv_indices = torch.cat([b.kv_indices, torch.zeros(50, dtype=b.kv_indices.dtype, device=device)])
    pad = torch.zeros(4, 6, dtype=b.page_table.dtype, device=device)
    b.page_table = torch.cat([b.page_table, pad], dim=1)
    assert_close(run(case, b, max_window=64), want)
    paged = replace(case, form="paged")
    assert_close(run(paged, b, max_window=64), want)
    # Padding rows give exact zeros, sinks or not.
    got = run(paged, b)
    assert bool((got[0] == 0).all()) and bool((got[3] == 0).all())


@pytest.mark.interpreter
@pytest.mark.parametrize("merge", ["fused", "kernel"])
def test_decode_merge_in_chunks(merge, device, monkeypatch):
    """Merges that take the splits in several chunks (a merge tile of 64 floats here)."""
    import triton_swa.ops._common.merge as merge_mod
    import triton_swa.ops.decode.launcher as decode
    from triton_swa.runtime.plans import PlanCache

    monkeypatch.setattr(merge_mod, "MERGE_TILE", 64)
    monkeypatch.setattr(decode, "_PLANS", PlanCache())
    case = Case((53, 3, 26), 40, 6, 3, 16, page=4, form="paged", dtype=torch.float16, sinks=True, num_splits=5, block_n=16, merge=merge)
    b = build(case, device)
    assert_close(run(case, b), expected(case, b), name=case.id)
    _assert_counters_reset()


@pytest.mark.interpreter
@pytest.mark.parametrize("chunks", [2, 4])
def test_decode_merge_kernel_in_column_chunks(chunks, device, monkeypatch):
    """The merge kernel with each output row's columns in ``chunks`` programs (what few, wide rows get:
    ``merge_dv_chunks``), value heads wider than the key heads, a column count that is not a power of
    two, sinks: equal to the reference, and close to the same plan merging whole rows (bit for bit
    under the interpreter; a GPU's compiler may order a narrower tile's float sums differently)."""
    import triton_swa.ops.decode.launcher as decode
    from triton_swa.runtime.plans import PlanCache

    case = Case((53, 3, 26), 40, 4, 2, 32, dv=72, sinks=True, num_splits=3, block_n=16, merge="kernel")
    b = build(case, device)
    monkeypatch.setattr(decode, "_PLANS", PlanCache())
    monkeypatch.setattr(decode, "merge_dv_chunks", lambda programs, dv, num_sms: 1)
    whole = run(case, b).clone()
    monkeypatch.setattr(decode, "_PLANS", PlanCache())
    monkeypatch.setattr(decode, "merge_dv_chunks", lambda programs, dv, num_sms: chunks)
    got = run(case, b)
    assert_close(got, expected(case, b), name=case.id)
    assert_close(got, whole, name="chunked merge against the whole-row merge")
    plan = next(iter(decode._PLANS.plans.values()))
    assert plan.merge.grid == (len(case.seq_lens) * case.hq, chunks, 1)


@pytest.mark.interpreter
def test_decode_direct_calls_merge_in_place_in_one_workspace(device, monkeypatch):
    """A direct call with splits merges them in place by default (up to head dim 256): one launch, the
    partials in a workspace kept per stream, grown for a larger batch and NaN-filled per call while
    poisoning is on (so a split left unwritten still shows); 512-wide heads keep the merge kernel."""
    import triton_swa.ops._common.workspace as workspace
    import triton_swa.ops.decode.launcher as decode
    from triton_swa.runtime.plans import PlanCache

    monkeypatch.setattr(decode, "_PLANS", PlanCache())
    monkeypatch.setattr(workspace, "_STREAMS", {})
    small = Case((31, 9), 12, 4, 2, 16, dtype=torch.float16, num_splits=3, block_n=16)
    large = replace(small, seq_lens=(40, 3, 17, 29))
    for case, seed in ((small, 1), (large, 2), (small, 3)):
        b = build(case, device, seed=seed)
        assert_close(run(case, b), expected(case, b), name=case.id)
    plans = list(decode._PLANS.values())
    assert plans and all(p.fused and p.merge is None for p in plans)
    (stream,) = workspace._STREAMS.values()  # one stream, one buffer, big enough for the larger batch
    assert stream.partials.numel() >= max(p.part_numel for p in plans)
    _assert_counters_reset()
    wide = Case((20, 7), 12, 2, 1, 512, dtype=torch.float16, num_splits=2, block_n=16)
    b = build(wide, device, seed=4)
    assert_close(run(wide, b), expected(wide, b), name=wide.id)
    assert any(not p.fused and p.merge is not None for p in decode._PLANS.values())


def _assert_counters_reset():
    """Every call leaves the fused merge's counters at zero (the next call counts from there)."""
    import triton_swa.ops._common.workspace as workspace

    for stream, ws in workspace._STREAMS.items():
        assert int(ws.counters.abs().sum()) == 0, f"merge counters of {stream} not reset"


@pytest.mark.interpreter
def test_decode_plan_cache(device):
    """Repeated calls reuse the checked plan: new data, new index lengths, another ``out`` layout and a
    bad argument after a good call all behave as on a first call."""
    case = Case((31, 9), 12, 4, 2, 16, dtype=torch.float16, num_splits=2, block_n=16)
    first, second = build(case, device, seed=3), build(replace(case, seq_lens=(5, 20)), device, seed=4)
    assert_close(run(case, first, max_window=13), expected(case, first), name="first")
    # Same signature (kv_indices' length is not part of it when max_window is given).
    assert_close(run(case, second, max_window=13), expected(case, second), name="second")
    # A strided out (every other query head of a wider tensor).
    wide = torch.full((2, 8, 16), float("nan"), dtype=torch.float16, device=device)
    got = swa_decode(
        second.q,
        second.k,
        second.v,
        kv_indptr=second.kv_indptr,
        kv_indices=second.kv_indices,
        sm_scale=0.6 / 4,
        out=wide[:, ::2],
        num_splits=2,
        block_n=16,
        max_window=13,
    )
    assert_close(got, expected(case, second), name="strided out")
    assert bool(wide[:, 1::2].isnan().all()), "the other heads must stay untouched"
    with pytest.raises(ValueError, match="sinks must have shape"):
        swa_decode(
            second.q,
            second.k,
            second.v,
            kv_indptr=second.kv_indptr,
            kv_indices=second.kv_indices,
            sinks=torch.zeros(3, device=device),
            num_splits=2,
            block_n=16,
            max_window=13,
        )
    with pytest.raises(TypeError, match="page_size must be an int"):
        swa_decode(
            second.q,
            second.k,
            second.v,
            kv_indptr=second.kv_indptr,
            kv_indices=second.kv_indices,
            page_size=True,
            num_splits=2,
            block_n=16,
            max_window=13,
        )


@pytest.mark.interpreter
def test_decode_empty_batch(device):
    q = torch.zeros(0, 4, 16, device=device)
    k = torch.zeros(8, 2, 16, device=device)
    got = swa_decode(
        q, k, k, kv_indptr=torch.zeros(1, dtype=torch.int32, device=device), kv_indices=torch.zeros(0, dtype=torch.int32, device=device)
    )
    assert got.shape == (0, 4, 16)


def _valid(device="cpu"):
    q = torch.randn(2, 4, 16, device=device)
    k = torch.randn(16, 2, 16, device=device)
    v = torch.randn(16, 2, 8, device=device)
    indptr = torch.tensor([0, 3, 5], dtype=torch.int32, device=device)
    indices = torch.tensor([1, 2, 3, 5, 6], dtype=torch.int32, device=device)
    return dict(q=q, k_buffer=k, v_buffer=v, kv_indptr=indptr, kv_indices=indices)


def _paged(device="cpu"):
    args = _valid(device)
    del args["kv_indptr"], args["kv_indices"]
    return dict(
        args,
        page_table=torch.tensor([[1, 2], [3, 0]], dtype=torch.int32),
        window_starts=torch.tensor([2, 0], dtype=torch.int32),
        seq_lens=torch.tensor([9, 4], dtype=torch.int64),
        page_size=4,
    )


def _with(base, **changes):
    args = dict(base)
    for key, value in changes.items():
        if value is _DROP:
            args.pop(key)
        else:
            args[key] = value
    return args


_DROP = object()
_BAD = [
    ("q-2d", lambda a: _with(a, q=a["q"][0]), ValueError, "q must have 3 dimensions"),
    ("q-int", lambda a: _with(a, q=a["q"].long()), TypeError, "q must have dtype"),
    (
        "k-dtype",
        lambda a: _with(a, k_buffer=a["k_buffer"].half(), v_buffer=a["v_buffer"].half()),
        TypeError,
        "k_buffer must have q's dtype",
    ),
    ("v-dtype", lambda a: _with(a, v_buffer=a["v_buffer"].double()), TypeError, "v_buffer must have k_buffer's"),
    ("head-ratio", lambda a: _with(a, q=torch.randn(2, 3, 16)), ValueError, "multiple of KV heads"),
    ("k-head-dim", lambda a: _with(a, k_buffer=torch.randn(16, 2, 8)), ValueError, "k_buffer head dim"),
    ("v-slots", lambda a: _with(a, v_buffer=torch.randn(15, 2, 8)), ValueError, "v_buffer must have k_buffer's"),
    ("dv-too-wide", lambda a: _with(a, v_buffer=torch.randn(16, 2, 520)), ValueError, "v head dim"),
    (
        "k-stride",
        lambda a: _with(a, k_buffer=torch.randn(16, 2, 32)[..., ::2]),
        ValueError,
        "k_buffer must have a contiguous last dimension",
    ),
    ("no-window", lambda a: _with(a, kv_indptr=_DROP, kv_indices=_DROP), ValueError, "either as kv_indptr"),
    ("both-forms", lambda a: _with(a, page_table=torch.zeros(2, 1, dtype=torch.int32)), ValueError, "not both"),
    ("indptr-only", lambda a: _with(a, kv_indices=_DROP), ValueError, "needs both kv_indptr and kv_indices"),
    ("indptr-shape", lambda a: _with(a, kv_indptr=a["kv_indptr"][:2]), ValueError, "kv_indptr must have shape"),
    ("indices-float", lambda a: _with(a, kv_indices=a["kv_indices"].float()), TypeError, "kv_indices must have"),
    ("indices-device", lambda a: _with(a, kv_indices=a["kv_indices"].to("meta")), ValueError, "kv_indices must be on device"),
    ("csr-page", lambda a: _with(a, page_size=16), ValueError, "page_size must be 1 with CSR"),
    ("page-zero", lambda a: _with(a, page_size=0), ValueError, "page_size must be >= 1"),
    ("sinks-shape", lambda a: _with(a, sinks=torch.zeros(2)), ValueError, "sinks must have shape"),
    ("sinks-int", lambda a: _with(a, sinks=torch.zeros(4, dtype=torch.int32)), TypeError, "sinks must have dtype"),
    ("out-dtype", lambda a: _with(a, out=torch.empty(2, 4, 8, dtype=torch.float16)), TypeError, "out must have dtype"),
    ("out-shape", lambda a: _with(a, out=torch.empty(2, 4, 16)), ValueError, "out must have shape"),
    ("cap-negative", lambda a: _with(a, logit_cap=-1.0), ValueError, "logit_cap"),
    ("scale-type", lambda a: _with(a, k_scale="1"), TypeError, "k_scale"),
    ("scale-numel", lambda a: _with(a, v_scale=torch.ones(2)), ValueError, "v_scale"),
    ("splits", lambda a: _with(a, num_splits=MAX_SPLITS + 1), ValueError, "num_splits"),
    ("block-n", lambda a: _with(a, block_n=24), ValueError, "block_n must be a power of two"),
    ("max-window", lambda a: _with(a, max_window=-1), ValueError, "max_window"),
]
_BAD_PAGED = [
    ("table-rows", lambda a: _with(a, page_table=torch.zeros(3, 2, dtype=torch.int32)), ValueError, "page_table must have 2 rows"),
    ("table-missing", lambda a: _with(a, page_table=_DROP), ValueError, "needs page_table"),
    ("starts-shape", lambda a: _with(a, window_starts=torch.zeros(3, dtype=torch.int32)), ValueError, "window_starts must have shape"),
    ("lens-dtype", lambda a: _with(a, seq_lens=torch.zeros(2)), TypeError, "seq_lens must have dtype"),
    ("pool-pages", lambda a: _with(a, page_size=5), ValueError, "not a whole number of pages"),
    (
        "table-stride",
        lambda a: _with(a, page_table=torch.zeros(2, 4, dtype=torch.int32)[:, ::2]),
        ValueError,
        "page_table must have a contiguous last dimension",
    ),
]


@pytest.mark.parametrize("make, error, match", [pytest.param(*x[1:], id=x[0]) for x in _BAD])
def test_decode_rejects_bad_input(make, error, match):
    args = make(_valid())
    out = args.get("out")
    if out is not None:
        out.fill_(float("nan"))
    with pytest.raises(error, match=match):
        swa_decode(args.pop("q"), args.pop("k_buffer"), args.pop("v_buffer"), **args)
    if out is not None and out.dtype.is_floating_point:
        assert bool(out.isnan().all()), "nothing may be written before the error"


@pytest.mark.parametrize("make, error, match", [pytest.param(*x[1:], id=x[0]) for x in _BAD_PAGED])
def test_decode_rejects_bad_page_table(make, error, match):
    args = make(_paged())
    with pytest.raises(error, match=match):
        swa_decode(args.pop("q"), args.pop("k_buffer"), args.pop("v_buffer"), **args)


@pytest.mark.gpu
def test_decode_unaligned_pointers_after_aligned():
    """The direct launch of a compiled kernel is keyed by pointer alignment: a query tensor that starts
    2 bytes into its storage, after aligned calls of the same shape, gets its own compiled variant."""
    case = Case((300, 41, 1000), 511, 16, 4, 128, page=16, form="paged", dtype=torch.bfloat16, sinks=True)
    b = build(case, "cuda")
    want = expected(case, b)
    for _ in range(2):
        assert_close(run(case, b), want, name="aligned")
    flat = torch.empty(b.q.numel() + 1, dtype=b.q.dtype, device="cuda")
    b.q = flat[1:].view(b.q.shape).copy_(b.q)
    assert b.q.data_ptr() % 16 != 0
    for _ in range(2):
        assert_close(run(case, b), want, name="unaligned q")


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["csr", "paged"])
def test_decode_cuda_graph_replay(form):
    """Capture once with fixed buffers and max_window, then replay on other windows: no host sync."""
    base = Case((700, 5, 1200), 1023, 32, 8, 128, page=16, form=form, dtype=torch.bfloat16, sinks=True)
    other = Case((1500, 0, 64), 1023, 32, 8, 128, page=16, form=form, dtype=torch.bfloat16, sinks=True)
    first, second = build(base, "cuda", seed=1), build(other, "cuda", seed=2)
    # Both states share buffers: the second's pools and indices are copied into the first's.
    n_idx = max(len(first.kv_indices), len(second.kv_indices)) + 64
    width = max(first.page_table.shape[1], second.page_table.shape[1]) + 2
    static = {
        "q": first.q.clone(),
        "k": torch.cat([first.k, second.k]),
        "v": torch.cat([first.v, second.v]),
        "kv_indptr": first.kv_indptr.clone(),
        "kv_indices": torch.zeros(n_idx, dtype=torch.int32, device="cuda"),
        "page_table": torch.zeros(3, width, dtype=torch.int32, device="cuda"),
        "window_starts": first.window_starts.clone(),
        "seq_lens": first.seq_lens.clone(),
        "sinks": first.sinks,
    }
    offset_slots = first.k.shape[0]

    def load(b: Built, shift: int):
        static["q"].copy_(b.q)
        static["kv_indptr"].copy_(b.kv_indptr)
        static["kv_indices"].zero_()
        static["kv_indices"][: len(b.kv_indices)] = b.kv_indices + shift
        static["page_table"].zero_()
        static["page_table"][:, : b.page_table.shape[1]] = b.page_table + shift // 16
        static["window_starts"].copy_(b.window_starts)
        static["seq_lens"].copy_(b.seq_lens)
        static["sinks"].copy_(b.sinks)

    out = torch.full((3, 32, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
    if form == "csr":
        where = dict(kv_indptr=static["kv_indptr"], kv_indices=static["kv_indices"])
    else:
        where = dict(page_table=static["page_table"], window_starts=static["window_starts"], seq_lens=static["seq_lens"], page_size=16)
    # The same score scale as ``expected`` (the test once left the kernel's default 1 / sqrt(D) here).
    call = lambda: swa_decode(
        static["q"], static["k"], static["v"], **where, sm_scale=0.6 / base.d**0.5, sinks=static["sinks"], out=out, max_window=1024
    )
    load(first, 0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for b, case, shift in ((first, base, 0), (second, other, offset_slots)):
        load(b, shift)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_close(out, expected(case, b), name=f"graph replay {case.id}")
    _assert_counters_reset()


PLAN_CASES = [
    Case((37, 1, 12), 5, 2, 2, 16, num_splits=2, block_n=16),
    Case((45, 2, 30), 29, 8, 2, 16, dtype=torch.float16, softcap=2.0, sinks=True, num_splits=3, block_n=16),
    Case((40, 11), 27, 4, 2, 16, page=4, form="paged", dtype=torch.float16, fp8=True, sinks=True, num_splits=1, block_n=16),
    Case((0, 37, 5), 30, 6, 2, 16, page=4, form="paged", sinks=True, num_splits=5, block_n=16),
]


@pytest.mark.interpreter
@pytest.mark.parametrize("in_place", [False, True], ids=["merge-kernel", "in-place"])
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in PLAN_CASES])
def test_decode_plan_runs_layers(case, in_place, device):
    """``swa_decode_plan`` once, ``run`` per layer: each run equals, bit for bit, ``swa_decode`` on that
    layer's buffers merging the same way (in place, with its counters back at zero after each run, or
    with the merge kernel), and the reference, with per-run sinks and scales; the outputs are fresh."""
    from triton_swa import swa_decode_plan

    b0, b1 = build(case, device), build(case, device)
    # a second layer over the same windows: other queries, its heads' K/V swapped, other sinks
    flip = lambda x: x.view(torch.uint8).flip(1).contiguous().view(x.dtype)
    b1.q, b1.k, b1.v = torch.randn_like(b0.q.float()).to(b0.q.dtype), flip(b0.k), flip(b0.v)
    if b0.sinks is not None:
        b1.sinks = b0.sinks.flip(0).contiguous()
    if b0.k_scale is not None:
        b1.k_scale, b1.v_scale = 1.5, b0.v_scale * 0.5
    layers = (b0, b1)
    where = (
        dict(kv_indptr=b0.kv_indptr, kv_indices=b0.kv_indices)
        if case.form == "csr"
        else dict(page_table=b0.page_table, window_starts=b0.window_starts, seq_lens=b0.seq_lens, page_size=case.page)
    )
    opts = dict(sm_scale=0.6 / case.d**0.5, logit_cap=case.softcap, num_splits=case.num_splits, block_n=case.block_n)
    scales = dict(sinks=b0.sinks, k_scale=b0.k_scale, v_scale=b0.v_scale)
    plan = swa_decode_plan(b0.q, b0.k, b0.v, **where, **scales, **opts, in_place_merge=in_place)
    counters = plan._tensors[1]
    for b in layers:
        want = run(case, b, tune=_Tune(fused_merge=in_place))
        out = torch.full_like(want, float("nan"))
        got = plan.run(b.q, b.k, b.v, out, sinks=b.sinks, k_scale=b.k_scale, v_scale=b.v_scale)
        assert got is out
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), case.id
        assert_close(got, expected(case, b), name=case.id)
        fresh = plan.run(b.q, b.k, b.v, sinks=b.sinks, k_scale=b.k_scale, v_scale=b.v_scale)
        assert fresh is not out and torch.equal(fresh.view(torch.uint8), got.view(torch.uint8))
        if in_place and (case.num_splits or 1) > 1:
            assert counters.numel() > 4 and not counters.any(), "the in-place merge's counters must be back at 0"


@pytest.mark.interpreter
@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c.id) for c in PLAN_CASES + [Case((41, 5), -1, 4, 1, 16, dtype=torch.float16, num_splits=3, block_n=16)]]
)
def test_decode_plan_fused_store(case, device):
    """A plan with ``store_loc`` writes the new K/V in the decode launch: the pool equals ``store_kv``
    then ``swa_decode``'s bit for bit, the output up to the other kernel's float rounding (sliding layers through the mapping, full layers,
    fp8 pools with a number and a tensor scale, empty windows whose dropped slot writes nothing),
    layer after layer."""
    from triton_swa import store_kv, swa_decode_plan

    b = build(case, device)
    # a request without a new token writes the dummy slot 0, as an engine's padding rows do (the
    # build's -1 wraps to the pool's last row, which another request's window may read: the fused
    # store's precondition rules that out); and the slots as an engine often hands them over: a slice
    # at an 8-byte offset (the kernel does not specialise on their alignment)
    b.loc = torch.cat([b.loc[:1], b.loc.clamp(min=0)])[1:]
    assert b.loc.data_ptr() % 16 == 8
    g = torch.Generator().manual_seed(7)
    B, H = b.q.shape[0], b.k.shape[1]
    new_rows = lambda dim: (torch.randn(B, H, dim, generator=g) * 3).to(b.q.dtype).to(device)
    where = (
        dict(kv_indptr=b.kv_indptr, kv_indices=b.kv_indices)
        if case.form == "csr"
        else dict(page_table=b.page_table, window_starts=b.window_starts, seq_lens=b.seq_lens, page_size=case.page)
    )
    opts = dict(sm_scale=0.6 / case.d**0.5, logit_cap=case.softcap, num_splits=case.num_splits, block_n=case.block_n)
    scales = dict(sinks=b.sinks, k_scale=b.k_scale, v_scale=b.v_scale)
    k_new, v_new = new_rows(b.k.shape[2]), new_rows(b.v.shape[2])
    plan = swa_decode_plan(b.q, b.k, b.v, **where, **opts, **scales, store_loc=b.loc, store_mapping=b.mapping, k_new=k_new, v_new=v_new)
    k_fused, v_fused = b.k.clone(), b.v.clone()
    for layer in range(2):
        k_new, v_new = new_rows(b.k.shape[2]), new_rows(b.v.shape[2])
        store_kv(b.k, b.v, b.loc, k_new, v_new, mapping=b.mapping, k_scale=b.k_scale, v_scale=b.v_scale)
        want = run(case, b)
        got = plan.run(b.q, k_fused, v_fused, torch.full_like(want, float("nan")), k_new=k_new, v_new=v_new)
        for name, x, y in (("k pool", k_fused, b.k), ("v pool", v_fused, b.v)):
            assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), f"{case.id} layer {layer}: {name}"
        # both against the reference first (a failure then says which one is off), then each other:
        # another compiled kernel, equal up to its float rounding (bit for bit through the interpreter)
        assert_close(got, expected(case, b), name=f"{case.id} layer {layer}: fused store")
        assert_close(want, expected(case, b), name=f"{case.id} layer {layer}: store_kv + swa_decode")
        exact = dict(atol=0.0, rtol=0.0) if not HAS_CUDA else dict(atol=1e-6, rtol=1e-5) if got.dtype == torch.float32 else {}
        assert_close(got, want, **exact, name=f"{case.id} layer {layer}: fused against store_kv + swa_decode")
    with pytest.raises(ValueError, match="k_new must be what the plan was made for"):
        plan.run(b.q, k_fused, v_fused, k_new=k_new[:, :, :1], v_new=v_new)
    with pytest.raises(TypeError, match="v_new must be a torch.Tensor"):
        plan.run(b.q, k_fused, v_fused, k_new=k_new)
    with pytest.raises(ValueError, match="store_loc must hold one slot per request"):
        swa_decode_plan(b.q, b.k, b.v, **where, **opts, **scales, store_loc=b.loc[:1], k_new=k_new[:1], v_new=v_new[:1])
    with pytest.raises(ValueError, match="need a plan made with store_loc"):
        swa_decode_plan(b.q, b.k, b.v, **where, **opts, **scales).run(b.q, b.k, b.v, k_new=k_new, v_new=v_new)


@pytest.mark.interpreter
def test_decode_plan_reuses_a_finished_plans_workspace(device):
    """``reuse=``: a plan of the same signature takes over the finished plan's split workspace and
    counters (no allocation) and gives the same output; the finished plan then refuses to run; a plan
    of another signature allocates its own and leaves ``reuse`` alone."""
    from triton_swa import swa_decode_plan

    case = Case((45, 2, 30), 29, 8, 2, 16, dtype=torch.float16, softcap=2.0, sinks=True, num_splits=3, block_n=16)
    b = build(case, device)
    kw = dict(kv_indptr=b.kv_indptr, kv_indices=b.kv_indices, sm_scale=0.6 / case.d**0.5, logit_cap=2.0, sinks=b.sinks)
    first = swa_decode_plan(b.q, b.k, b.v, **kw, num_splits=3, block_n=16)
    want = first.run(b.q, b.k, b.v)
    second = swa_decode_plan(b.q, b.k, b.v, **kw, num_splits=3, block_n=16, reuse=first)
    assert second._tensors[0] is first._tensors[0] and second._tensors[1] is first._tensors[1]
    assert torch.equal(second.run(b.q, b.k, b.v), want)
    with pytest.raises(ValueError, match="workspace went to a later plan"):
        first.run(b.q, b.k, b.v)
    other = swa_decode_plan(b.q, b.k, b.v, **kw, num_splits=2, block_n=16, reuse=second)
    assert other._tensors[0] is not second._tensors[0]
    assert torch.equal(second.run(b.q, b.k, b.v), want)
    assert_close(other.run(b.q, b.k, b.v), expected(case, b), name="a plan of another signature")


@pytest.mark.interpreter
def test_decode_plan_next_step_follows_windows_of_its_kinds(device):
    """``DecodePlan._next_step`` (the backend's later steps of a kind): the same plan over other
    windows of the planned kinds gives what a fresh plan over them gives, taking over the workspace;
    windows (or a max_window, or store slots) of another kind get None and change nothing."""
    from triton_swa import swa_decode_plan

    case = Case((45, 2, 30), 29, 8, 2, 16, dtype=torch.float16, num_splits=3, block_n=16)
    b = build(case, device)
    # the next step's windows: each request's last 1, 7 and 20 keys of this one's
    ptr = b.kv_indptr.tolist()
    lists = [b.kv_indices[ptr[i + 1] - n : ptr[i + 1]] for i, n in enumerate((1, 7, 20))]
    b2 = type("Next", (), {})()
    b2.kv_indices = torch.cat(lists)
    b2.kv_indptr = torch.tensor([0, 1, 8, 28], dtype=b.kv_indptr.dtype, device=device)
    b2.q, b2.k, b2.v = torch.randn_like(b.q), b.k, b.v
    kw = dict(sm_scale=0.4, num_splits=3, block_n=16)
    first = swa_decode_plan(b.q, b.k, b.v, kv_indptr=b.kv_indptr, kv_indices=b.kv_indices, max_window=64, **kw)
    first.run(b.q, b.k, b.v)
    for bad in (
        dict(kv_indptr=b2.kv_indptr.long(), kv_indices=b2.kv_indices),  # another dtype
        dict(kv_indptr=b2.kv_indptr, kv_indices=b2.kv_indices, max_window=32),
        dict(kv_indptr=b2.kv_indptr, kv_indices=b2.kv_indices, store_loc=b2.kv_indices[:3]),
    ):
        assert first._next_step(**{"max_window": 64, **bad}) is None and not first._retired
    nxt = first._next_step(kv_indptr=b2.kv_indptr, kv_indices=b2.kv_indices, max_window=64)
    assert nxt is not None and first._retired and nxt._tensors[0] is first._tensors[0]
    fresh = swa_decode_plan(b2.q, b2.k, b2.v, kv_indptr=b2.kv_indptr, kv_indices=b2.kv_indices, max_window=64, **kw)
    want = fresh.run(b2.q, b2.k, b2.v)
    assert torch.equal(nxt.run(b2.q, b2.k, b2.v), want)
    assert first._next_step(kv_indptr=b2.kv_indptr, kv_indices=b2.kv_indices, max_window=64) is None  # retired


@pytest.mark.interpreter
def test_decode_plan_refuses_another_kind(device):
    """A run whose tensors or scales are not what the plan was made for raises, naming them, before any launch."""
    from triton_swa import swa_decode_plan

    case = Case((37, 1, 12), 5, 2, 2, 16, num_splits=2, block_n=16)
    b = build(case, device)
    plan = swa_decode_plan(b.q, b.k, b.v, kv_indptr=b.kv_indptr, kv_indices=b.kv_indices, num_splits=2, block_n=16)
    assert plan.out_shape == (3, 2, 16)
    with pytest.raises(ValueError, match="q must be what the plan was made for"):
        plan.run(b.q[:2], b.k, b.v)
    with pytest.raises(ValueError, match="k_buffer must be"):
        plan.run(b.q, b.k.half(), b.v)
    with pytest.raises(TypeError, match="v_buffer must be a torch.Tensor"):
        plan.run(b.q, b.k, None)
    with pytest.raises(ValueError, match="out must be"):
        plan.run(b.q, b.k, b.v, torch.empty(3, 2, 32, device=device)[..., :16])
    with pytest.raises(ValueError, match="sinks must be of the planned kind"):
        plan.run(b.q, b.k, b.v, sinks=torch.zeros(2, device=device))
    with pytest.raises(ValueError, match="k_scale and v_scale"):
        plan.run(b.q, b.k, b.v, k_scale=torch.ones(1, device=device))
    with pytest.raises(ValueError, match="page_size must be 1"):
        swa_decode_plan(b.q, b.k, b.v, kv_indptr=b.kv_indptr, kv_indices=b.kv_indices, page_size=4)


def test_decode_tiles_fit_the_targets_shared_memory():
    """Tiles shrink to the target's shared memory per program; where even 16-key tiles do not fit
    (float32 at 512-wide heads in AMD's 64 KB), one pipeline stage, as the compile tier measured (3
    stages: 66560 B; 1 stage: 32768 B). Hopper and 16-bit pools keep the defaults."""
    from triton_swa.ops.decode.config import decode_block_config

    assert decode_block_config(512, 512, 8, 4, smem_limit=None)[1:] == (32, 4, 3)
    assert decode_block_config(512, 512, 8, 4, smem_limit=227 * 1024)[1:] == (32, 4, 3)
    assert decode_block_config(512, 512, 8, 4, smem_limit=64 * 1024)[1:] == (16, 4, 1)
    assert decode_block_config(512, 512, 8, 2, smem_limit=64 * 1024)[1:] == (16, 4, 3)
    assert decode_block_config(256, 256, 8, 4, smem_limit=64 * 1024)[1:] == (16, 4, 3)


def test_decode_split_rules():
    """The split count's rules (a host function of shapes): no split once more than half the GPU's
    program slots are taken (512-wide heads at B 64: 256 programs on 264 slots), one wave of splits of
    at least ``min_tokens`` keys for a small batch (512-wide heads at B 1, L 4k: 64 splits of 64 keys),
    a long window on a half-full GPU in several waves of splits of 32 blocks, none for an empty window."""
    from triton_swa.ops.decode.config import decode_min_split_tokens, decode_num_splits

    assert decode_min_split_tokens(8, 512, 512, 2) == 64
    assert decode_num_splits(256, 4096, 32, 132, 64, 2) == 1
    assert decode_num_splits(264, 4096, 32, 132, 64, 2) == 1
    assert decode_num_splits(4, 4096, 32, 132, 64, 2) == 64
    assert decode_num_splits(132, 4096, 32, 132, 64, 2) == 4
    assert decode_num_splits(4, 0, 32, 132, 64, 2) == 1
