"""swa_extend against reference.extend_attention.

Prefill, chunked prefill (prefix far beyond the window), prompts shorter than the window, one-token and
zero-length extends, chain verify, tree verify (custom mask + positions), draft extend and non-causal
draft blocks, over CSR lists and page tables, on NaN-poisoned pools (every slot outside a window is NaN)
and NaN-prefilled outputs. The CPU tier (Triton's interpreter) forces 16-wide tiles so that tiny shapes
walk several query tiles, prefix tiles, window edges and diagonals; the GPU tier widens the grid to
real head dims, dtypes, page sizes and the default tile heuristics.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace

import pytest
import torch

import triton_swa_reference as ref
from triton_swa.ops.extend import extend_config, extend_grid, extend_num_splits, swa_extend
from triton_swa.ops.extend.config import _pow2_divisor
from triton_swa.runtime.launch import Bound, Launcher
from triton_swa.testing import assert_close, make_pool_state, without_native_fp8

pytestmark = pytest.mark.interpreter

HAS_CUDA = torch.cuda.is_available()
NAN = float("nan")


@dataclass(frozen=True)
class Case:
    """One batch: request ``b`` holds ``seq_lens[b]`` tokens of which the last ``new[b]`` are new."""

    seq_lens: tuple
    new: tuple
    W: int
    HQ: int = 4
    H: int = 2
    D: int = 16
    DV: int | None = None
    ps: int = 1  # pool page size
    paged: bool = False  # page-table form instead of the CSR list
    mode: str = "causal"  # causal | noncausal | tree | mask_empty_rows | chain_qpos
    dtype: torch.dtype = torch.float32
    softcap: float = 0.0
    sinks: bool = False
    fp8: str = ""  # "" | "float" (scale as a number) | "tensor" (one-element device tensor)
    fp8_dtype: torch.dtype = torch.float8_e4m3fn  # or float8_e4m3fnuz (MI300's format)
    fp8_scales: tuple[float, float] = (0.7, 1.9)  # k_scale, v_scale
    bm: int | None = 16
    bn: int | None = 16
    pack: int | None = None
    edge: bool | None = None  # edge_in_loop override
    dvp: int | None = None  # dv_parts override
    chunk: int = 5

    @property
    def id(self) -> str:
        parts = [
            f"B{len(self.seq_lens)}",
            f"L{max(self.seq_lens)}",
            f"E{sum(self.new)}",
            f"W{self.W}",
            f"HQ{self.HQ}",
            f"H{self.H}",
            f"D{self.D}",
        ]
        if self.DV is not None:
            parts.append(f"DV{self.DV}")
        parts.append(f"P{self.ps}" + ("pt" if self.paged else "csr"))
        if self.mode != "causal":
            parts.append(self.mode)
        parts.append(str(self.dtype).replace("torch.", "").replace("float", "f"))
        if self.softcap:
            parts.append(f"cap{self.softcap:g}")
        if self.sinks:
            parts.append("sinks")
        if self.fp8:
            parts.append(("fp8" if self.fp8_dtype == torch.float8_e4m3fn else "fp8nuz") + self.fp8)
        if self.bm or self.bn:
            parts.append(f"bm{self.bm}bn{self.bn}")
        if self.pack:
            parts.append(f"pack{self.pack}")
        if self.edge is not None:
            parts.append(f"edge{int(self.edge)}")
        if self.dvp is not None:
            parts.append(f"dvp{self.dvp}")
        return "-".join(parts)


def _tree_mask(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A random draft tree of ``n`` nodes (parent before child): ancestor-or-self mask and depths."""
    mask = torch.zeros(n, n, dtype=torch.bool)
    depth = torch.zeros(n, dtype=torch.int64)
    for i in range(n):
        mask[i, i] = True
        if i:
            parent = int(torch.randint(0, i, (1,), generator=g))
            mask[i] |= mask[parent]
            depth[i] = depth[parent] + 1
    return mask, depth


def build(case: Case, device, seed: int = 0) -> dict:
    """Pool state, new tokens and every argument of both the kernel and the reference."""
    g = torch.Generator().manual_seed(seed)
    pool_dtype = case.fp8_dtype if case.fp8 else case.dtype
    state = make_pool_state(
        seq_lens=list(case.seq_lens),
        window_left=case.W,
        page_size=case.ps,
        new_tokens=list(case.new),
        swa_head_num=case.H,
        swa_head_dim=case.D,
        dtype=pool_dtype,
        device=device,
        chunk=case.chunk,
        generator=g,
    )
    k_buf, v_buf = state.kv_pool.swa_kv_pool.get_kv_buffer(0)
    dv = case.DV or case.D
    if dv != case.D:
        # a V pool of its own head dim, poisoned exactly where the K pool is
        live = ~torch.isnan(k_buf.float()).any(-1).any(-1)
        values = torch.full((k_buf.shape[0], case.H, dv), NAN)
        values[live.cpu()] = torch.randn(int(live.sum()), case.H, dv, generator=g)
        v_buf = values.to(pool_dtype).to(device)
    prefix_lens = state.prefix_lens().to(device)
    rpi = state.req_pool_indices()
    kv_indptr, kv_indices, starts = ref.extend_window_indices(state.req_to_token, rpi, prefix_lens, case.W, state.mapping)
    T = sum(case.new)
    qo_indptr = torch.zeros(len(case.new) + 1, dtype=torch.int32)
    qo_indptr[1:] = torch.cumsum(torch.tensor(case.new), 0)
    rnd = lambda *shape: torch.randn(*shape, generator=g).to(case.dtype).to(device)
    args = dict(
        q=rnd(T, case.HQ, case.D),
        k=rnd(T, case.H, case.D),
        v=rnd(T, case.H, dv),
        k_buffer=k_buf,
        v_buffer=v_buf,
        qo_indptr=qo_indptr.to(device),
        prefix_lens=prefix_lens,
    )
    kw = dict(window_left=case.W, sm_scale=case.D**-0.5 * 1.3, logit_cap=case.softcap, causal=case.mode != "noncausal")
    if case.sinks:
        kw["sinks"] = (torch.randn(case.HQ, generator=g) * 2).to(device)
    if case.fp8:
        ks, vs = case.fp8_scales
        kw["k_scale"] = ks if case.fp8 == "float" else torch.tensor([ks], device=device)
        kw["v_scale"] = vs if case.fp8 == "float" else torch.tensor([vs], device=device)
    if case.mode == "chain_qpos":
        # explicit positions that equal the default ones: the general new-key path, causal
        kw["q_positions"] = torch.cat([p + torch.arange(n) for p, n in zip(prefix_lens.tolist(), case.new)]).to(device)
    if case.mode in ("tree", "mask_empty_rows"):
        blocks, positions, offsets = [], [], [0]
        for p, n in zip(prefix_lens.tolist(), case.new):
            if case.mode == "tree":
                block, depth = _tree_mask(n, g)
                positions.append(p + depth)
            else:
                block = torch.rand(n, n, generator=g) < 0.4
                block[::3] = False  # rows that see no new key (and no key at all when p == 0)
            blocks.append(block.reshape(-1))
            offsets.append(offsets[-1] + n * n)
        kw["custom_mask"] = torch.cat(blocks).to(device)
        kw["mask_indptr"] = torch.tensor(offsets[:-1], dtype=torch.int64, device=device)
        if case.mode == "tree":
            kw["q_positions"] = torch.cat(positions).to(torch.int32).to(device)
    ref_kw = {key: val for key, val in kw.items()}
    for key in ("k_scale", "v_scale"):
        if isinstance(ref_kw.get(key), torch.Tensor):
            ref_kw[key] = float(ref_kw[key])
    expected = ref.extend_attention(
        args["q"], args["k"], args["v"], k_buf, v_buf, args["qo_indptr"], kv_indptr, kv_indices, prefix_lens, **ref_kw
    )
    if case.paged:
        page_table = ref.window_page_table(state.req_to_token, rpi, starts, prefix_lens, case.ps, state.mapping)
        index = dict(page_table=page_table, window_starts=starts, page_size=case.ps)
    else:
        index = dict(kv_indptr=kv_indptr, kv_indices=kv_indices)
    return dict(state=state, args=args, kw=kw, index=index, expected=expected, starts=starts)


def run_kernel(case: Case, built: dict, **extra) -> torch.Tensor:
    args = built["args"]
    T, HQ = args["q"].shape[:2]
    out = torch.full((T, HQ, case.DV or case.D), NAN, dtype=case.dtype, device=args["q"].device)
    got = swa_extend(
        *args.values(),
        **built["index"],
        **built["kw"],
        out=out,
        block_m=case.bm,
        block_n=case.bn,
        pack=case.pack,
        edge_in_loop=case.edge,
        dv_parts=case.dvp,
        **extra,
    )
    assert got is out
    return out


# Requests as (seq_len, new): chunked prefill far beyond the window, prefill without prefix,
# a prompt shorter than the window, one-token extends and zero-length entries.
MIX = ((75, 21), (23, 23), (9, 9), (60, 1), (14, 0), (40, 6))


def _mix(*pairs):
    return dict(seq_lens=tuple(p[0] for p in pairs), new=tuple(p[1] for p in pairs))


def cpu_cases() -> list[Case]:
    return [
        Case(**_mix(*MIX), W=11),
        Case(**_mix(*MIX), W=11, paged=True, ps=4),
        Case(**_mix(*MIX), W=13, paged=True, ps=16),
        Case(**_mix(*MIX), W=11, ps=4),  # CSR list over a paged pool
        Case(**_mix(*MIX), W=0),
        Case(**_mix(*MIX), W=1, paged=True, ps=4),
        Case(**_mix(*MIX), W=-1),
        Case(**_mix(*MIX), W=-1, paged=True, ps=4),
        Case(**_mix(*MIX), W=100),  # the window covers every context
        Case(**_mix(*MIX), W=16, bm=32, bn=16),  # W + 1 a multiple of the tile, boundaries on tile edges
        Case(**_mix(*MIX), W=15, HQ=8, H=2, bm=32, bn=32),  # 4 heads packed: 8 tokens per tile
        Case(**_mix(*MIX), W=11, HQ=8, H=2, pack=2, bm=16),  # a partial pack
        # 4 tokens per tile under 32-key tiles: a 16-key diagonal tile, and key tiles aligned on the
        # query tile, the lowest reaching below the first new key
        Case(**_mix(*MIX), W=20, HQ=8, H=2, bm=16, bn=32),
        Case(**_mix(*MIX), W=-1, HQ=8, H=2, bm=32, bn=32, paged=True, ps=4),
        # the lower edge streamed inside the main loop, on both tile alignments and without a window
        Case(**_mix(*MIX), W=20, HQ=8, H=2, bm=16, bn=32, edge=True),
        Case(**_mix(*MIX), W=11, edge=True, sinks=True),
        Case(**_mix(*MIX), W=-1, HQ=8, H=2, bm=32, bn=32, paged=True, ps=4, edge=True),
        Case(**_mix(*MIX), W=1, edge=True),
        Case(**_mix(*MIX), W=9, HQ=3, H=3),  # MHA
        Case(**_mix(*MIX), W=9, HQ=6, H=1, pack=2),  # MQA, group of 6
        Case(**_mix(*MIX), W=12, D=24),  # head dim not a power of two
        Case(**_mix(*MIX), W=12, D=16, DV=40, paged=True, ps=4),  # V head dim of its own
        # the value width divided among programs (D 512's accumulator): whole parts, a masked last
        # part (Dv 40 in two of 32), four parts over packed heads on pages, with the edge in the loop
        Case(**_mix(*MIX), W=11, DV=32, dvp=2),
        Case(**_mix(*MIX), W=12, D=16, DV=40, paged=True, ps=4, dvp=2),
        Case(**_mix(*MIX), W=-1, HQ=8, H=2, bm=32, bn=32, DV=64, dvp=4, paged=True, ps=4, edge=True, sinks=True),
        Case(**_mix(*MIX), W=12, dtype=torch.float16),
        # bf16 through the interpreter's float32 dots (UPCAST_DOT, docs/contract.md §8): prefill, chunked prefill,
        # one-token extends, over a CSR list and a page table with softcap and sinks, and chain verify
        Case(**_mix((45, 21), (19, 19), (30, 1), (9, 0)), W=11, dtype=torch.bfloat16),
        Case(**_mix((45, 21), (19, 19), (30, 1)), W=10, dtype=torch.bfloat16, paged=True, ps=4, softcap=2.5, sinks=True),
        Case(**_mix((50, 8), (37, 8)), W=19, HQ=8, dtype=torch.bfloat16),
        Case(**_mix((40, 6), (9, 5)), W=12, mode="tree", HQ=8, dtype=torch.bfloat16, fp8="float"),
        Case(**_mix(*MIX), W=10, softcap=2.5),
        Case(**_mix(*MIX), W=10, sinks=True, paged=True, ps=4),
        Case(**_mix(*MIX), W=10, fp8="float"),
        Case(**_mix(*MIX), W=10, fp8="tensor", paged=True, ps=4, dtype=torch.float16),
        Case(**_mix((60, 7), (13, 13), (40, 4)), W=9, mode="noncausal"),  # DFlash draft blocks
        Case(**_mix((60, 7), (13, 13), (40, 4)), W=9, mode="noncausal", paged=True, ps=4, HQ=8),
        Case(**_mix((70, 6), (30, 8), (9, 5), (20, 0)), W=12, mode="tree", HQ=8),
        Case(**_mix((70, 6), (30, 8), (9, 5)), W=3, mode="tree", paged=True, ps=4, sinks=True),
        Case(**_mix((70, 9), (11, 11), (30, 5)), W=7, mode="mask_empty_rows", sinks=True),
        Case(**_mix((70, 9), (11, 11), (30, 5), (9, 0)), W=7, mode="chain_qpos", paged=True, ps=4),
        Case(**_mix((50, 8), (37, 8), (70, 8), (8, 8)), W=19, HQ=8, bm=None, bn=None),  # chain verify, defaults
    ]


def gpu_cases() -> list[Case]:
    long_mix = _mix((1500, 1500), (2100, 700), (900, 37), (3000, 1), (200, 0), (640, 129))
    cases = []
    for d, w in ((64, 127), (128, 1023), (256, 255), (512, 127)):
        for ps, paged in ((1, False), (16, True), (64, True)):
            cases.append(Case(**long_mix, W=w, HQ=8, H=2, D=d, ps=ps, paged=paged, dtype=torch.bfloat16, bm=None, bn=None, chunk=128))
    big = dict(bm=None, bn=None, chunk=128)
    cases += [
        Case(**long_mix, W=1023, HQ=8, H=2, D=128, dtype=torch.float16, **big),
        Case(**long_mix, W=-1, HQ=8, H=1, D=128, dtype=torch.bfloat16, paged=True, ps=16, **big),
        Case(**long_mix, W=0, HQ=4, H=4, D=64, dtype=torch.float16, **big),
        Case(**long_mix, W=100, HQ=32, H=4, D=80, dtype=torch.bfloat16, **big),
        Case(**long_mix, W=255, HQ=8, H=2, D=192, DV=128, dtype=torch.bfloat16, paged=True, ps=16, **big),
        Case(**long_mix, W=255, HQ=8, H=2, D=256, dtype=torch.bfloat16, softcap=30.0, sinks=True, **big),
        Case(**long_mix, W=511, HQ=8, H=2, D=128, dtype=torch.bfloat16, fp8="tensor", paged=True, ps=16, **big),
        Case(**long_mix, W=200, HQ=8, H=2, D=128, dtype=torch.bfloat16, bm=64, bn=32, pack=2, chunk=128),
        Case(**_mix((300, 100), (50, 50), (90, 1)), W=63, HQ=8, H=2, D=64, dtype=torch.float32, **big),
        Case(
            **_mix(*[(300 + 97 * i, 8) for i in range(24)]), W=1023, HQ=32, H=8, D=128, dtype=torch.bfloat16, paged=True, ps=16, **big
        ),  # chain verify
        Case(
            **_mix(*[(300 + 97 * i, 16) for i in range(12)]),
            W=1023,
            HQ=16,
            H=4,
            D=256,
            dtype=torch.bfloat16,
            mode="tree",
            paged=True,
            ps=64,
            **big,
        ),
        Case(**_mix(*[(300 + 97 * i, 16) for i in range(12)]), W=255, HQ=16, H=4, D=128, dtype=torch.bfloat16, mode="noncausal", **big),
        Case(
            **_mix(*[(1 + 97 * i, 1) for i in range(40)]), W=511, HQ=32, H=8, D=256, dtype=torch.bfloat16, paged=True, ps=16, **big
        ),  # one-token extends
    ]
    return cases


def _params(cases):
    return [pytest.param(c, id=c.id) for c in cases]


@pytest.mark.parametrize("case", _params(cpu_cases()))
def test_extend_matches_reference(case, device):
    built = build(case, device)
    assert_close(run_kernel(case, built), built["expected"], name=case.id)


FP8_CASES = [
    Case(**_mix((40, 6), (9, 5)), W=12, mode="tree", HQ=8, dtype=torch.bfloat16, fp8="float"),
    Case(**_mix(*MIX), W=10, fp8="tensor", paged=True, ps=4, dtype=torch.float16, softcap=2.5, sinks=True),
]


@pytest.mark.parametrize("how", ["e4m3fn-native", "e4m3fn-bytes", "e4m3fnuz"])
@pytest.mark.parametrize("case", _params(FP8_CASES))
def test_extend_fp8_formats(case, how, device):
    """Both fp8 formats over the cached prefix, and e4m3fn loaded natively or as bytes decoded in the
    kernel (the path of sm_80/86): each equals the reference over its own bytes."""
    if how == "e4m3fnuz":
        case = replace(case, fp8_dtype=torch.float8_e4m3fnuz)
    built = build(case, device)
    with without_native_fp8(device) if how == "e4m3fn-bytes" else contextlib.nullcontext():
        got = run_kernel(case, built)
    assert_close(got, built["expected"], name=f"{case.id}-{how}")


@pytest.mark.parametrize("how", ["e4m3fn-native", "e4m3fn-bytes"])
def test_extend_fp8_v_scale_past_float16(how, device):
    """A v_scale past float16's range (for the byte path times the bytes' 2^8 too) equals the
    reference: no 16-bit intermediate may hold P times it (a float16 prefix dot must keep it out)."""
    case = replace(FP8_CASES[0], fp8_scales=(0.7, 3.0e5))
    built = build(case, device)
    with without_native_fp8(device) if how == "e4m3fn-bytes" else contextlib.nullcontext():
        got = run_kernel(case, built)
    assert bool(built["expected"].abs().max() > 65504)
    # outputs are sums of terms of about v_scale: bf16's tolerance scaled with them (an overflow gives inf)
    assert_close(got, built["expected"], atol=0.016 * case.fp8_scales[1], name=f"{case.id}-{how}")


@pytest.mark.gpu
@pytest.mark.parametrize("case", _params(gpu_cases() if HAS_CUDA else []))
def test_extend_gpu_grid(case, device):
    built = build(case, device, seed=3)
    assert_close(run_kernel(case, built), built["expected"], name=case.id)


def _compiled_variants() -> dict:
    from triton_swa.ops.extend.kernel import _swa_extend_kernel

    found = {}
    for caches in _swa_extend_kernel.device_caches.values():
        found.update(caches[0])
    return found


@pytest.mark.gpu
def test_default_tiles_keep_wgmma_async():
    """ptxas must not serialise the wgmma of any compiled variant, the default prefill ones included
    (C7515 halves Hopper's tensor-core rate; the loop order in the kernel avoids it)."""
    from triton_swa.testing.compile_matrix import wgmma_serialised

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma pipelines are Hopper's")
    for d, fp8, paged in ((128, "", False), (256, "", True), (128, "tensor", True)):
        # both cases: bf16, pages of 16, the default tiles
        common = dict(D=d, ps=16, paged=paged, dtype=torch.bfloat16, fp8=fp8, bm=None, bn=None, chunk=128)
        case = Case(**_mix((700, 300), (200, 200)), W=127, HQ=8, H=2, **common)
        built = build(case, "cuda")
        # unsplit, and split-KV (forced: a prefill does not split itself)
        for splits in (1, 2):
            got = run_kernel(case, built, num_splits=splits)
            assert_close(got, built["expected"], name=f"{case.id} num_splits={splits}")
        # the verify tiles, split as the heuristic splits them on a big GPU
        verify = Case(**_mix((3000, 8), (2000, 8)), W=1023, HQ=32, H=8, **common)
        built = build(verify, "cuda")
        assert_close(run_kernel(verify, built, num_splits=4), built["expected"], name=f"{verify.id} num_splits=4")
    variants = _compiled_variants()  # these nine and whatever earlier tests compiled
    assert len(variants) >= 9
    for kern in variants.values():
        assert not wgmma_serialised(kern.asm["ptx"]), kern.name


def test_fully_masked_rows_are_zero(device):
    case = Case(**_mix((9, 9), (5, 5)), W=4, mode="mask_empty_rows")
    built = build(case, device)
    out = run_kernel(case, built)
    empty = torch.cat([(m.reshape(n, n).sum(1) == 0) for m, n in zip(torch.split(built["kw"]["custom_mask"].cpu(), [81, 25]), case.new)])
    assert int(empty.sum()) >= 2, "the case must hold rows that see nothing"
    assert torch.equal(out[empty.to(out.device)], torch.zeros_like(out[empty.to(out.device)]))
    assert_close(out, built["expected"])


def _padded_case(device, pad: int):
    """Two requests whose q/k/v carry ``pad`` more token rows past ``qo_indptr[-1]`` (CUDA-graph
    padding); returns (case, built, built's args)."""
    case = Case(**_mix((40, 6), (9, 9)), W=20, sinks=True)
    built = build(case, device)
    args = built["args"]
    for name in ("q", "k", "v"):
        x = args[name]
        args[name] = torch.cat([x, torch.randn(pad, *x.shape[1:]).to(x)])
    return case, built, args


@pytest.mark.parametrize("num_splits", [None, 2], ids=["auto", "split2"])
def test_writes_only_request_rows(num_splits, device):
    """Rows past ``qo_indptr[-1]`` (CUDA-graph padding) keep what ``out`` held, also through the
    split path's merge (whose partials for those rows nobody wrote)."""
    pad = 3
    case, built, args = _padded_case(device, pad)
    out = torch.full((args["q"].shape[0], case.HQ, case.D), NAN, device=args["q"].device)
    with _spy_launches() as grids:
        swa_extend(*args.values(), **built["index"], **built["kw"], out=out, block_m=16, block_n=16, num_splits=num_splits)
    if num_splits:
        assert len(grids["merge"]) == 1
    # automatic: no split on the interpreter's 4 SMs, splits on a big GPU (two key tiles of prefix)
    assert torch.isnan(out[-pad:]).all()
    assert_close(out[:-pad], built["expected"])


def test_reads_only_the_window(device):
    """A list over the whole prefix, or a page table from position 0, still reads only the window.

    Entries before the window point at the dummy slot or page 0 (NaN): reading one poisons a row.
    """
    case = Case(**_mix((75, 21), (60, 1), (40, 6)), W=11, ps=4)
    built = build(case, device)
    state, prefix = built["state"], built["args"]["prefix_lens"]
    rpi = state.req_pool_indices()
    zeros = torch.zeros_like(prefix)
    indptr, indices = ref.window_index_list(state.req_to_token, rpi, zeros, prefix, state.mapping)
    in_window = torch.cat([torch.arange(int(n)) >= int(n) - min(int(n), case.W) for n in prefix.cpu()])
    indices = torch.where(in_window.to(indices.device), indices, torch.zeros_like(indices))
    out = torch.full_like(built["expected"], NAN, dtype=case.dtype)
    swa_extend(*built["args"].values(), kv_indptr=indptr, kv_indices=indices, **built["kw"], out=out, block_m=16, block_n=16)
    assert_close(out, built["expected"], name="csr over the whole prefix")

    table = ref.window_page_table(state.req_to_token, rpi, zeros, prefix, case.ps, state.mapping)
    first_page = (built["starts"].long() // case.ps).cpu()
    cols = torch.arange(table.shape[1])
    table = torch.where(cols[None, :] < first_page[:, None], 0, table.cpu()).to(table)
    out = torch.full_like(built["expected"], NAN, dtype=case.dtype)
    swa_extend(
        *built["args"].values(),
        page_table=table,
        window_starts=zeros.to(torch.int32),
        page_size=case.ps,
        **built["kw"],
        out=out,
        block_m=16,
        block_n=16,
    )
    assert_close(out, built["expected"], name="page table from position 0")


def test_default_config_and_empty_batch(device):
    case = Case(**_mix((30, 12), (5, 0)), W=6, bm=None, bn=None)
    built = build(case, device)
    assert_close(run_kernel(case, built), built["expected"])
    args = dict(built["args"])
    args["qo_indptr"] = torch.zeros_like(args["qo_indptr"])
    for name in ("q", "k", "v"):
        args[name] = args[name][:0]
    out = swa_extend(*args.values(), **built["index"], **built["kw"])
    assert out.shape == (0, case.HQ, case.D)


@pytest.mark.parametrize(
    "d, dv, group, e", [(128, 128, 4, 8192), (256, 256, 2, 8192), (512, 512, 8, 100), (128, 128, 4, 8), (80, 80, 6, 3), (128, 64, 1, 1)]
)
def test_config_heuristic_is_legal(d, dv, group, e):
    cfg = extend_config(d, dv, group, e)
    assert cfg.block_m >= 16 and cfg.block_n >= 16 and cfg.block_m % cfg.pack == 0 and group % cfg.pack == 0
    assert cfg.block_m & (cfg.block_m - 1) == 0 and cfg.block_n & (cfg.block_n - 1) == 0
    if e * cfg.pack <= 16:
        assert cfg.block_m == 16  # a one-tile request pads no more than the tensor-core minimum


def test_wide_head_tile_only_for_hopper_prefills():
    """D 512 on Hopper: launches of at least WIDE_HEAD_TILE's rows take it (value width in parts);
    verify-sized launches, fp32, other targets and narrower heads keep their tiles."""
    from triton_swa.ops.extend.config import WIDE_HEAD_TILE

    bm, bn, warps, stages, parts = WIDE_HEAD_TILE
    wide = extend_config(512, 512, 8, 8192, torch.bfloat16, wgmma=True)
    assert (wide.block_m, wide.block_n, wide.num_warps, wide.num_stages, wide.dv_parts) == WIDE_HEAD_TILE
    assert 512 // parts >= 16 and wide.block_m % wide.pack == 0
    assert extend_config(512, 512, 8, bm // 8, torch.float16, wgmma=True).dv_parts == parts  # exactly bm rows
    for cfg in (
        extend_config(512, 512, 8, 8, torch.bfloat16, wgmma=True),  # verify: 64 rows
        extend_config(512, 512, 8, 8192, torch.float32, wgmma=True),
        extend_config(512, 512, 8, 8192, torch.bfloat16),  # the portable default
        extend_config(256, 256, 2, 8192, torch.bfloat16, wgmma=True),
    ):
        assert cfg.dv_parts == 1 and cfg.block_m <= 128, cfg
    assert extend_config(512, 512, 8, 8192, torch.bfloat16).block_m == 32
    # the shared-memory fit counts a program's part of the value width (the tile fits an H200 whole)
    fitted = extend_config(512, 512, 8, 8192, torch.bfloat16, smem_limit=227 * 1024, wgmma=True)
    assert (fitted.block_m, fitted.block_n, fitted.num_stages) == (bm, bn, stages)


def _bad_inputs():
    """(name, mutate(args, index, kw), exception, message fragment)."""

    def with_(name, value):
        def mutate(a, i, k):
            a[name] = value(a) if callable(value) else value

        return mutate

    def kw(name, value):
        def mutate(a, i, k):
            k[name] = value(a) if callable(value) else value

        return mutate

    def idx(name, value):
        def mutate(a, i, k):
            i[name] = value(i) if callable(value) else value

        return mutate

    return [
        ("q-int", with_("q", lambda a: a["q"].to(torch.int32)), TypeError, "q must have dtype"),
        ("q-2d", with_("q", lambda a: a["q"][:, 0]), ValueError, "q must have 3 dimensions"),
        ("k-dtype", with_("k", lambda a: a["k"].double()), TypeError, "k must have dtype"),
        ("k-shape", with_("k", lambda a: a["k"][:-1]), ValueError, "k must have shape"),
        ("heads", with_("k", lambda a: a["k"][:, :1].expand(-1, 3, -1)), ValueError, "multiple of KV heads"),
        ("v-heads", with_("v", lambda a: a["v"][:, :1]), ValueError, "v must have shape"),
        ("kbuf-dtype", with_("k_buffer", lambda a: a["k_buffer"].double()), TypeError, "k_buffer must have dtype"),
        ("kbuf-shape", with_("k_buffer", lambda a: a["k_buffer"][:, :, :4]), ValueError, "k_buffer must have shape"),
        ("vbuf-slots", with_("v_buffer", lambda a: a["v_buffer"][1:]), ValueError, "v_buffer must have shape"),
        ("qo-len", with_("qo_indptr", lambda a: a["qo_indptr"][:-1]), ValueError, "qo_indptr must have shape"),
        ("qo-float", with_("qo_indptr", lambda a: a["qo_indptr"].float()), TypeError, "qo_indptr must have dtype"),
        ("q-stride", with_("q", lambda a: a["q"].transpose(1, 2).contiguous().transpose(1, 2)), ValueError, "contiguous along its last"),
        ("window", kw("window_left", -2), ValueError, "window_left must be >= -1"),
        ("window-float", kw("window_left", 3.0), TypeError, "window_left must be an int"),
        ("no-index", idx("kv_indices", None), ValueError, "cached window is missing"),
        (
            "both-index",
            idx("page_table", lambda i: torch.zeros(6, 1, dtype=torch.int32, device=i["kv_indptr"].device)),
            ValueError,
            "not both",
        ),
        ("indptr-len", idx("kv_indptr", lambda i: i["kv_indptr"][:-1]), ValueError, "kv_indptr must have shape"),
        (
            "mask-no-indptr",
            kw("custom_mask", lambda a: torch.ones(10, dtype=torch.bool, device=a["q"].device)),
            ValueError,
            "needs mask_indptr",
        ),
        (
            "qpos-len",
            kw("q_positions", lambda a: torch.zeros(3, dtype=torch.int32, device=a["q"].device)),
            ValueError,
            "q_positions must have shape",
        ),
        ("sinks-len", kw("sinks", lambda a: torch.zeros(3, device=a["q"].device)), ValueError, "sinks must have shape"),
        ("softcap", kw("logit_cap", -1.0), ValueError, "logit_cap"),
        ("scale-shape", kw("k_scale", lambda a: torch.ones(2, device=a["q"].device)), ValueError, "one value"),
        (
            "out-dtype",
            kw("out", lambda a: torch.empty(a["q"].shape, dtype=torch.float64, device=a["q"].device)),
            TypeError,
            "out must have dtype",
        ),
        ("out-shape", kw("out", lambda a: torch.empty(1, 4, 16, device=a["q"].device)), ValueError, "out must have shape"),
        ("block", kw("block_n", 24), ValueError, "block_n must be a power of two"),
        ("pack", kw("pack", 3), ValueError, "pack"),
        ("causal", kw("causal", 1), TypeError, "causal must be a bool"),
        ("splits-0", kw("num_splits", 0), ValueError, "num_splits must be >= 1"),
        ("splits-65", kw("num_splits", 65), ValueError, "num_splits must be at most 64"),
        ("splits-float", kw("num_splits", 2.0), TypeError, "num_splits must be an int"),
        ("dv-parts-3", kw("dv_parts", 3), ValueError, "dv_parts must be a power of two"),
        ("dv-parts-narrow", kw("dv_parts", 2), ValueError, "dv_parts must leave every part 16 value columns"),
        ("max-window", kw("max_window", -1), ValueError, "max_window must be >= 0"),
        ("max-window-bool", kw("max_window", True), TypeError, "max_window must be an int"),
    ]


@pytest.mark.parametrize("name, mutate, exc, match", [pytest.param(*b, id=b[0]) for b in _bad_inputs()])
def test_bad_input_raises_before_launch(name, mutate, exc, match, device):
    case = Case(**_mix(*MIX), W=11)
    built = build(case, device)
    args, index, kw = dict(built["args"]), dict(built["index"]), dict(built["kw"])
    mutate(args, index, kw)
    index = {k: v for k, v in index.items() if v is not None}
    with pytest.raises(exc, match=match):
        swa_extend(*args.values(), **index, **kw)


def test_dv_parts_leave_every_part_a_real_column(device):
    """Dv 40 pads to 64 columns: two parts of 32 each hold real ones, four of 16 would leave the last
    (48-63) none, and are refused by name before anything is written."""
    case = Case(**_mix(*MIX), W=11, DV=40)
    built = build(case, device)
    out = torch.full(tuple(built["expected"].shape), NAN, dtype=case.dtype, device=device)
    with pytest.raises(ValueError, match="dv_parts must leave every part 16 value columns or more, some of them real"):
        swa_extend(*built["args"].values(), **built["index"], **built["kw"], out=out, dv_parts=4)
    assert torch.isnan(out).all()


def test_cases_cover_the_issue():
    """The CPU grid holds every case the issue lists (a guard against trimming it silently)."""
    cases = cpu_cases()
    modes = {c.mode for c in cases}
    assert {"causal", "noncausal", "tree", "mask_empty_rows"} <= modes
    assert {0, -1} <= {c.W for c in cases} and any(c.paged for c in cases) and any(c.fp8 for c in cases)
    mix = [c for c in cases if c.seq_lens == _mix(*MIX)["seq_lens"]][0]
    kinds = {("no-prefix" if s == n else "zero" if n == 0 else "one" if n == 1 else "prefix") for s, n in zip(mix.seq_lens, mix.new)}
    assert kinds == {"no-prefix", "zero", "one", "prefix"}
    assert replace(mix, W=11).id == cases[0].id


# ---- split-KV (num_splits): the cached prefix divided among programs, merged by the shared merge kernel ----


class _spy_launches:
    """``with _spy_launches() as grids``: grids["main"] / grids["merge"] list the grids of the extend
    kernel's and the split merge's launches (every launch goes through a ``Launcher`` or, compiled
    and bound, a ``Bound``)."""

    def __enter__(self):
        self.grids = {"main": [], "merge": []}
        self.saved = (Launcher.__call__, Bound.__call__)
        (launch, bound), grids = self.saved, self.grids

        def record(fn, grid):
            grids["main" if fn.fn.__name__ == "_swa_extend_kernel" else "merge"].append(tuple(grid))

        def spy(launcher, args, grid=None):
            record(launcher.fn, grid or launcher.grid)
            return launch(launcher, args, grid)

        def spy_bound(b, args):
            record(b.fn, b.grid)
            return bound(b, args)

        Launcher.__call__, Bound.__call__ = spy, spy_bound
        return self.grids

    def __exit__(self, *exc):
        Launcher.__call__, Bound.__call__ = self.saved
        return False


def _run_split(case: Case, built: dict, num_splits, **extra) -> tuple[torch.Tensor, dict]:
    with _spy_launches() as grids:
        out = run_kernel(case, built, num_splits=num_splits, **extra)
    return out, grids


def _prefix_split_shares(case: Case, num_splits: int) -> list[int]:
    """Non-empty splits of each request with new tokens (its cached prefix in whole tiles, as the
    kernel divides it; a window edge that straddles a tile boundary may add one tile)."""
    shares = []
    for seq, new in zip(case.seq_lens, case.new):
        if new:
            keys = seq - new if case.W < 0 else min(seq - new, case.W)
            tiles = -(-keys // case.bn)
            per = -(-tiles // num_splits)
            shares.append(-(-tiles // per) if tiles else 0)
    return shares


# Chain verify (prefix beyond the window over several tiles, a short prefix, no prefix, zero-length
# entries), a chunk over several query tiles, tree and empty-row masks, sinks, softcap, fp8, pages.
VERIFY = _mix((70, 8), (12, 8), (30, 0), (9, 9))


def split_cases() -> list:
    cases = [
        (Case(**VERIFY, W=40, HQ=8, H=2), 3),
        (Case(**VERIFY, W=40, HQ=8, H=2, paged=True, ps=4, softcap=2.5, sinks=True), 2),
        (Case(**_mix((70, 6), (30, 8), (9, 5), (20, 0)), W=35, mode="tree", HQ=8), 3),
        (Case(**_mix((70, 9), (11, 11), (30, 5)), W=30, mode="mask_empty_rows", sinks=True), 2),
        (Case(**VERIFY, W=40, fp8="tensor", paged=True, ps=4, dtype=torch.float16), 2),
        (Case(**_mix((75, 21), (60, 1), (14, 0)), W=-1, D=24, DV=40), 3),
        (Case(**_mix((60, 7), (13, 13), (40, 4)), W=30, mode="noncausal", HQ=8, H=2, pack=2), 2),
        (Case(**_mix((50, 4), (9, 4)), W=40, dtype=torch.bfloat16, sinks=True), 3),  # bf16 split verify
        (Case(**VERIFY, W=40, HQ=8, H=2, DV=32, dvp=2, sinks=True), 3),  # splits x value parts
    ]
    return [pytest.param(c, n, id=f"{c.id}-S{n}") for c, n in cases]


@pytest.mark.parametrize("case, num_splits", split_cases())
def test_split_matches_reference(case, num_splits, device):
    built = build(case, device, seed=11)
    out, grids = _run_split(case, built, num_splits)
    T, HQ = built["args"]["q"].shape[:2]
    tok = case.bm // (case.pack or min(_pow2_divisor(case.HQ // case.H), case.bm))
    assert grids["main"][0][0] == -(-max(case.new) // tok) * num_splits * (case.dvp or 1)
    assert grids["merge"] == [(T * HQ, 1, 1)]
    assert_close(out, built["expected"], name=f"{case.id} num_splits={num_splits}")


def test_split_cases_walk_empty_and_full_splits():
    """Among the split cases, requests whose prefix fills several splits, and splits left empty."""
    shares = [(_prefix_split_shares(p.values[0], p.values[1]), p.values[1]) for p in split_cases()]
    assert any(max(s) >= 2 for s, _ in shares)
    assert any(min(s) < n for s, n in shares)
    assert sum(0 in s for s, _ in shares) >= 2  # prefix-less requests (all prefix splits empty)


def test_split_automatic_on_a_small_launch(device):
    """``num_splits=None`` splits a lone short request once ``max_window`` promises more than one
    prefix tile (the interpreter's device has 4 SMs), and not below; ``num_splits=1`` never does."""
    case = Case(**_mix((60, 4)), W=40, HQ=8, H=2, bm=None, bn=None)
    built = build(case, device)
    bound = 128 if device == "cpu" else 2048
    out, grids = _run_split(case, built, None, max_window=bound)
    programs = grids["main"][0][0] * grids["main"][0][1] * grids["main"][0][2]
    assert len(grids["merge"]) == 1 and programs >= 2, grids
    assert_close(out, built["expected"], name="automatic splits")
    out, grids = _run_split(case, built, 1, max_window=bound)
    assert grids["merge"] == []
    assert_close(out, built["expected"], name="num_splits=1")
    out, grids = _run_split(case, built, None, max_window=16)  # one key tile at most: nothing to split
    assert grids["merge"] == []
    assert_close(out, built["expected"], name="max_window of one tile")


def _programs(e: int, b: int, hq: int, h: int, d: int) -> tuple[int, int]:
    """Unsplit programs of a launch with the default tiles, and its key tile."""
    cfg = extend_config(d, d, hq // h, e)
    return -(-e // (cfg.block_m // cfg.pack)) * (hq // cfg.pack) * b, cfg.block_n


def test_split_heuristic():
    """Splits for verify at small batch on a 132-SM GPU, none for prefills and big batches."""
    sms, window = 132, 1024
    for e in (4, 8, 16):
        for d in (128, 256):
            programs, bn = _programs(e, 1, 32, 8, d)
            n = extend_num_splits(programs, window, bn, sms)
            assert n >= 4 and window // bn // n >= 1, (e, d, n)  # at least one key tile per split
    programs, bn = _programs(8, 1, 32, 8, 128)
    assert programs == 8 and extend_num_splits(programs, window, bn, sms) == 16  # one 64-key tile each
    programs, bn = _programs(8, 8, 32, 8, 128)
    assert programs == 64 and extend_num_splits(programs, window, bn, sms) == 4
    for b in (9, 17, 64):  # 72, 136 and 512 programs: over half the SMs are busy already
        programs, bn = _programs(8, b, 32, 8, 128)
        assert extend_num_splits(programs, window, bn, sms) == 1, b
    for n_new, d in ((8192, 128), (2048, 256), (32768, 128), (1024, 128)):
        programs, bn = _programs(n_new, 1, 32, 8, d)
        assert extend_num_splits(programs, window, bn, sms) == 1, (n_new, d)
    programs, bn = _programs(8, 1, 32, 8, 128)
    assert extend_num_splits(programs, 0, bn, sms) == 1  # no cached prefix anywhere
    assert extend_num_splits(programs, 192, bn, sms) == 3  # three tiles: one each
    assert extend_num_splits(programs, 128, bn, sms) == 1  # two tiles: the merge costs more than a tile
    assert extend_num_splits(programs, 64, bn, sms) == 1  # one tile: nothing to split
    # verify (one query tile per request): split while the programs fit one wave
    assert extend_num_splits(128, window, bn, sms) == 1
    assert extend_num_splits(128, window, bn, sms, one_tile_per_request=True) == 2
    assert extend_num_splits(133, window, bn, sms, one_tile_per_request=True) == 1
    assert extend_num_splits(programs, 1 << 20, bn, sms) == 33  # a long full-attention prefix: fill 2 per SM
    assert extend_num_splits(1, 1 << 30, bn, sms) == 64  # at most MAX_SPLITS
    assert extend_num_splits(64, window, 32, sms, resident=1) == 2  # D 512 tiles: one program per SM


def split_gpu_cases() -> list:
    """Verify batches at B 1 and 8 (a short prefix and a zero-length entry among them) over W 1023,
    32/8 heads, bf16, head dims 64/128/256, page sizes 1 and 16; auto and forced splits; a tree."""
    cases = []
    big = dict(bm=None, bn=None, chunk=128, dtype=torch.bfloat16)
    for d in (64, 128, 256):
        for ps, paged in ((1, False), (16, True)):
            for b in (1, 8):
                pairs = [(3000 + 977 * i + 8, 8) for i in range(b)]
                if b > 1:
                    pairs[1], pairs[2] = (45, 8), (400, 0)
                cases.append(Case(**_mix(*pairs), W=1023, HQ=32, H=8, D=d, ps=ps, paged=paged, **big))
    cases.append(
        Case(
            **_mix(*[(2000 + 977 * i + 16, 16) for i in range(4)]),
            W=1023,
            HQ=32,
            H=8,
            D=128,
            mode="tree",
            paged=True,
            ps=16,
            sinks=True,
            **big,
        )
    )
    return [pytest.param(c, n, id=f"{c.id}-S{n or 'auto'}") for c in cases for n in (None, 3)]


@pytest.mark.gpu
@pytest.mark.parametrize("case, num_splits", split_gpu_cases() if HAS_CUDA else [])
def test_split_gpu_verify(case, num_splits, device):
    built = build(case, device, seed=13)
    out, grids = _run_split(case, built, num_splits)
    assert_close(out, built["expected"], name=f"{case.id} num_splits={num_splits}")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    programs, bn = _programs(max(case.new), len(case.new), case.HQ, case.H, case.D)
    index = built["index"]
    bound = index["page_table"].shape[1] * case.ps if case.paged else index["kv_indices"].numel()
    want = num_splits or extend_num_splits(programs, min(bound, case.W + 1), bn, sms)
    assert grids["main"][0][0] * grids["main"][0][1] * grids["main"][0][2] == programs * want
    assert len(grids["merge"]) == (want > 1)
    if num_splits is None and len(case.new) == 1 and sms >= 64:
        assert want > 1, "B 1 verify must split on a big GPU"


@pytest.mark.gpu
def test_split_cuda_graph_replay(device):
    """A split verify captured in a CUDA graph replays what eager computes, also after new inputs
    are copied into the captured tensors."""
    case = Case(**_mix((5000, 8)), W=1023, HQ=32, H=8, D=128, ps=16, paged=True, dtype=torch.bfloat16, bm=None, bn=None, chunk=128)
    built = build(case, device, seed=17)
    args, index, kw = built["args"], built["index"], built["kw"]
    call = lambda out: swa_extend(*args.values(), **index, **kw, out=out, max_extend_len=8)
    eager = torch.full_like(built["expected"], NAN, dtype=case.dtype)
    with _spy_launches() as grids:
        call(eager)
    assert len(grids["merge"]) == 1, "the case must take the split path"
    assert_close(eager, built["expected"], name="eager")
    graphed = torch.full_like(eager, NAN)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call(graphed)  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(graphed)
    graphed.fill_(NAN)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(graphed, eager)
    args["q"].copy_(torch.randn_like(args["q"]))
    graph.replay()
    call(eager)
    torch.cuda.synchronize()
    assert torch.equal(graphed, eager)


# ---- grid limits (issue 11, defect 4) and poisoned allocations ----


def test_grid_limits():
    """The batch rides on grid axis 2 (at most 65535 programs on CUDA): a bigger batch raises
    ValueError naming it before anything is launched; axis 0 takes up to 2**31 - 1."""
    assert extend_grid(3, 2, 8, 65535) == (6, 8, 65535)
    assert extend_grid(2**30, 1, 1, 1) == (2**30, 1, 1)
    with pytest.raises(ValueError, match="the batch .*65535"):
        extend_grid(1, 1, 8, 65536)
    with pytest.raises(ValueError, match="query-head groups"):
        extend_grid(1, 1, 70000, 1)
    with pytest.raises(ValueError, match="query tiles x splits"):
        extend_grid(2**30, 2, 1, 1)
    with pytest.raises(ValueError, match="split merge"):
        extend_grid(1, 2, 1, 1, merge_programs=2**31)


def test_huge_batch_raises_before_launch(device):
    B, HQ, D = 65536, 1, 16
    q = torch.randn(B, HQ, D, device=device)
    buf = torch.randn(8, 1, D, device=device)
    out = torch.full_like(q, NAN)
    with _spy_launches() as grids, pytest.raises(ValueError, match="65535"):
        swa_extend(
            q,
            q,
            q,
            buf,
            buf,
            torch.arange(B + 1, dtype=torch.int32, device=device),
            torch.zeros(B, dtype=torch.int32, device=device),
            window_left=4,
            kv_indptr=torch.zeros(B + 1, dtype=torch.int32, device=device),
            kv_indices=torch.zeros(0, dtype=torch.int32, device=device),
            out=out,
            max_extend_len=1,
        )
    assert grids["main"] == [] and bool(out.isnan().all())


@pytest.mark.parametrize("num_splits", [1, 2], ids=["direct", "split2"])
def test_allocated_output_rows_outside_requests_stay_poisoned(num_splits, device):
    """With ``out=None`` under TRITON_SWA_POISON=1 (on for the whole suite), rows of requests are
    written and equal the reference, and rows past ``qo_indptr[B]`` (never written, as documented)
    hold NaN: the poisoning reaches the op's own allocations (output and split partials)."""
    from triton_swa.runtime.poison import poison_enabled

    assert poison_enabled()
    pad = 2
    _, built, args = _padded_case(device, pad)
    got = swa_extend(*args.values(), **built["index"], **built["kw"], block_m=16, block_n=16, num_splits=num_splits)
    assert bool(got[-pad:].isnan().all())
    assert_close(got[:-pad], built["expected"])


def test_strided_views_where_strides_are_passed(device):
    """q/k/v as views of one fused qkv tensor, a page-strided out and a pool with padded head rows:
    the kernel takes these strides, so the views give the reference's result (the index tensors,
    read with unit strides, are rejected when strided: test_bad_inputs)."""
    case = Case(**_mix((40, 6), (9, 9)), W=7, HQ=4, H=2)
    built = build(case, device)
    args = built["args"]
    T, D = args["q"].shape[0], case.D
    fused = torch.full((T, 4 + 2 + 2 + 1, D), NAN, device=args["q"].device)
    fused[:, :4], fused[:, 4:6], fused[:, 6:8] = args["q"], args["k"], args["v"]
    args["q"], args["k"], args["v"] = fused[:, :4], fused[:, 4:6], fused[:, 6:8]
    for name in ("k_buffer", "v_buffer"):
        buf = args[name]
        wide = torch.full((buf.shape[0], buf.shape[1] + 1, D), NAN, dtype=buf.dtype, device=buf.device)
        wide[:, : buf.shape[1]] = buf
        args[name] = wide[:, : buf.shape[1]]
    wide_out = torch.full((T, 2 * case.HQ, D), NAN, device=args["q"].device)
    got = swa_extend(*args.values(), **built["index"], **built["kw"], out=wide_out[:, ::2], block_m=16, block_n=16)
    assert_close(got, built["expected"])
    assert bool(wide_out[:, 1::2].isnan().all())


PLAN_CASES = [
    (Case(**_mix(*MIX), W=11), None),
    (Case(**_mix(*MIX), W=11, paged=True, ps=4, sinks=True, softcap=2.5), None),
    (Case(**_mix((70, 6), (30, 8), (9, 5), (20, 0)), W=35, mode="tree", HQ=8), 3),
    (Case(**VERIFY, W=40, fp8="tensor", paged=True, ps=4, dtype=torch.float16), 2),
    (Case(**VERIFY, W=40, DV=32, dvp=2), 2),
]


@pytest.mark.parametrize("case, num_splits", [pytest.param(c, n, id=f"{c.id}-S{n}") for c, n in PLAN_CASES])
def test_extend_plan_runs_layers(case, num_splits, device):
    """``swa_extend_plan`` once, ``run`` per layer: each run equals ``swa_extend`` on that layer's
    tensors bit for bit (and the reference on the first); a run of another kind raises."""
    from triton_swa import swa_extend_plan

    built = build(case, device)
    args, kw = built["args"], built["kw"]
    opts = dict(block_m=case.bm, block_n=case.bn, pack=case.pack, edge_in_loop=case.edge, num_splits=num_splits, dv_parts=case.dvp)
    plan = swa_extend_plan(*args.values(), **built["index"], **kw, max_extend_len=max(case.new), **opts)
    flip = lambda x: x.view(torch.uint8).flip(1).contiguous().view(x.dtype)
    second = dict(args, q=torch.randn_like(args["q"].float()).to(case.dtype), k_buffer=flip(args["k_buffer"]))
    second["v_buffer"] = flip(args["v_buffer"])
    scales = {key: kw[key] for key in ("sinks", "k_scale", "v_scale") if key in kw}
    nan_out = lambda: torch.full(tuple(built["expected"].shape), NAN, dtype=case.dtype, device=device)
    for layer in (args, second):
        tensors = [layer[name] for name in ("q", "k", "v", "k_buffer", "v_buffer")]
        want = swa_extend(*layer.values(), **built["index"], **kw, out=nan_out(), max_extend_len=max(case.new), **opts)
        got = plan.run(*tensors, torch.full_like(want, NAN), **scales)
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), case.id
    assert_close(plan.run(*[args[n] for n in ("q", "k", "v", "k_buffer", "v_buffer")], **scales), built["expected"], name=case.id)
    assert plan.out_shape == tuple(built["expected"].shape)
    with pytest.raises(ValueError, match="k must be what the plan was made for"):
        plan.run(args["q"], args["k"][:-1], args["v"], args["k_buffer"], args["v_buffer"])
    with pytest.raises(ValueError, match="out must be a contiguous"):
        plan.run(args["q"], args["k"], args["v"], args["k_buffer"], args["v_buffer"], nan_out()[:, :1])


FUSED_STORE_CASES = [
    (Case(**_mix(*MIX), W=11, HQ=8, H=2), None),
    (Case(**_mix(*MIX), W=11, paged=True, ps=4, sinks=True, dtype=torch.bfloat16), None),
    (Case(**VERIFY, W=40, fp8="tensor", paged=True, ps=4, dtype=torch.float16, HQ=8), 2),
    (Case(**VERIFY, W=40, fp8="float", dtype=torch.float16, mode="tree"), 3),
    # value parts with the fused store (the first part's programs write)
    (Case(**_mix(*MIX), W=11, HQ=8, H=2, DV=32, dvp=2), 2),
]


@pytest.mark.parametrize("case, num_splits", [pytest.param(c, n, id=f"{c.id}-S{n}") for c, n in FUSED_STORE_CASES])
def test_extend_plan_fused_store(case, num_splits, device):
    """A plan with ``store_loc`` writes the run's K/V in the extend launch: the pools equal
    ``store_kv`` then the plan without a store, byte for byte (sliding layers through the mapping,
    fp8 pools with a number and a tensor scale, bf16 as its bits, splits, GQA packs), and so does
    the output (bit for bit in the interpreter, to float rounding compiled), layer after layer."""
    from triton_swa import store_kv, swa_extend_plan

    built = build(case, device)
    args, kw, state = built["args"], built["kw"], built["state"]
    loc, mapping = state.new_slots().to(device), state.mapping
    opts = dict(block_m=case.bm, block_n=case.bn, pack=case.pack, num_splits=num_splits, max_extend_len=max(case.new), dv_parts=case.dvp)
    plain = swa_extend_plan(*args.values(), **built["index"], **kw, **opts)
    fused = swa_extend_plan(*args.values(), **built["index"], **kw, **opts, store_loc=loc, store_mapping=mapping)
    scales = {key: kw[key] for key in ("sinks", "k_scale", "v_scale") if key in kw}
    k_ref, v_ref = args["k_buffer"], args["v_buffer"]
    k_fused, v_fused = k_ref.clone(), v_ref.clone()
    g = torch.Generator().manual_seed(3)
    for layer in range(2):
        q, k, v = (torch.randn(args[n].shape, generator=g).to(case.dtype).to(device) * 2 for n in ("q", "k", "v"))
        store_kv(k_ref, v_ref, loc, k, v, mapping=mapping, k_scale=kw.get("k_scale"), v_scale=kw.get("v_scale"))
        want = plain.run(q, k, v, k_ref, v_ref, **scales)
        got = fused.run(q, k, v, k_fused, v_fused, torch.full_like(want, NAN), **scales)
        for name, x, y in (("k pool", k_fused, k_ref), ("v pool", v_fused, v_ref)):
            assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), f"{case.id} layer {layer}: {name}"
        exact = dict(atol=0.0, rtol=0.0) if not HAS_CUDA else {}
        assert_close(got, want, **exact, name=f"{case.id} layer {layer}: fused against store_kv + plan")
    with pytest.raises(ValueError, match="store_loc must hold one slot per new token"):
        swa_extend_plan(*args.values(), **built["index"], **kw, **opts, store_loc=loc[:-1], store_mapping=mapping)
    with pytest.raises(ValueError, match="store_mapping needs store_loc"):
        swa_extend_plan(*args.values(), **built["index"], **kw, **opts, store_mapping=mapping)
