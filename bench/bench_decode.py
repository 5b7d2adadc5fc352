"""Decode benchmark: ``swa_decode`` against FlexAttention and gather + SDPA on the same bytes (docs/contract.md §7).

Shapes (bf16, one decode query per request at sequence length L):

- ``g3``: Gemma-3-like sliding layer, 32 query / 16 KV heads, D 128, W 1023;
- ``g4swa``: Gemma-4-like sliding layer, 32 / 16, D 256, W 1023;
- ``g4full``: Gemma-4-like full layer, 32 / 4, D 512, no window;
- ``mistral``: Mistral-like, 32 / 8, D 128, W 4095;
- ``gptoss``: gpt-oss-like, 64 / 8, D 64, W 127, with sinks;

B in {1, 8, 64, 256}, L in {4k, 32k}, page sizes 1 (CSR token slots) and 16 (page table). The pool
holds only what the windows need, pages scattered by a random permutation (as in a long-running
server). Input sets rotate so that L2 does not serve them (one set when it is larger than 1 GiB).
``triton_swa`` is also timed by CUDA-graph replay at every size (``triton_swa_graph``: kernel time, no
launch cost; the copy-share targets are judged on it), the peers where small (``*_graph``); an eager row
with one input set includes the host's launch time, since the timer starts before the call is issued.
The summary's ``host us`` is the host time of one ``swa_decode`` call (issued back to back).

Providers, all on the same K/V values: ``triton_swa``; ``flex`` (FlexAttention decode over the window
gathered into contiguous `[B, H, n, D]`, untimed); ``flex_paged`` (FlexAttention over the pool itself
through a block mask of the window's pages, page size 16 only: it needs pages of at least 16 tokens);
``gather_sdpa`` (gather the window from the pool, then SDPA; the gather is timed). Flex and SDPA have no
sinks: on ``gptoss`` they do slightly less work than ``triton_swa``. Where graph replay times the peers,
``copy_same_bytes_graph`` is a device copy moving the case's bytes (read + write), the same way: the
small-size ceiling, since a call of a few MB cannot reach the large-copy bandwidth.

``bytes`` counts the window's K and V once, q, o and the index metadata; ``flops`` counts attended
(query, key) pairs only. Rows go to ``bench/results/decode-<date>-<gpu>.csv``; a compact table is
printed last. Every output of set 0 is checked against a float32 PyTorch decode of a few requests
(with sinks); a mismatch is reported and makes the exit status non-zero.

    python bench/bench_decode.py                       # the issue's grid, about 4 minutes
    python bench/bench_decode.py --models g3 --batch 1,64 --no-flex
    python bench/bench_decode.py --sweep --models mistral --batch 64 --ctx 4k --pages 1 --sweep-splits auto,1,2
    python bench/bench_decode.py --tune --jobs 14       # the sweeps behind the heuristics, host cost
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import signal
import sys
import time
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton_swa.ops.decode.launcher as decode_mod  # noqa: E402
from bench.harness import Recorder, rotation_count, time_rotated  # noqa: E402
from triton_swa.benchmark.cases import SHAPES, Shape  # noqa: E402
from triton_swa.ops.decode.launcher import _swa_decode_impl, _Tune, swa_decode  # noqa: E402
from triton_swa.runtime.launch import set_fast_launch  # noqa: E402

GiB = 2**30
DTYPE = torch.bfloat16
DEVICE = "cuda"


# The shapes of triton-swa bench (one list): Gemma-3/4-, Mistral- and gpt-oss-like layers.
Model = Shape
MODELS = {name: shape for name, shape in SHAPES.items() if name != "tiny"}


@dataclass
class Set:
    """One input set: a pool holding B windows, queries, and both index forms."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    slots: torch.Tensor  # int64 [B, n]
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    page_table: torch.Tensor
    window_starts: torch.Tensor
    seq_lens: torch.Tensor
    sinks: torch.Tensor | None
    k_win: torch.Tensor | None = None  # contiguous [B, H, n, D] copies for flex
    v_win: torch.Tensor | None = None


def window_len(m: Model, L: int) -> int:
    return L if m.window_left < 0 else min(L, m.window_left + 1)


def make_set(m: Model, B: int, L: int, page: int, seed: int, contiguous: bool) -> Set:
    dev = DEVICE
    torch.manual_seed(seed)
    n = window_len(m, L)
    start = L - n
    first = start // page
    npg = (L - 1) // page - first + 1
    total = B * npg + 1
    pages = (torch.randperm(total - 1, device=dev)[: B * npg] + 1).view(B, npg).to(torch.int32)
    pos = start + torch.arange(n, device=dev)
    slots = pages[:, pos // page - first].long() * page + pos % page
    k = torch.randn(total * page, m.h, m.d, dtype=DTYPE, device=dev)
    v = torch.randn(total * page, m.h, m.d, dtype=DTYPE, device=dev)
    s = Set(
        q=torch.randn(B, m.hq, m.d, dtype=DTYPE, device=dev),
        k=k,
        v=v,
        slots=slots,
        kv_indptr=(torch.arange(B + 1, device=dev) * n).to(torch.int32),
        kv_indices=slots.reshape(-1).to(torch.int32),
        page_table=pages,
        window_starts=torch.full((B,), start, dtype=torch.int32, device=dev),
        seq_lens=torch.full((B,), L, dtype=torch.int32, device=dev),
        sinks=torch.randn(m.hq, device=dev) if m.sinks else None,
    )
    if contiguous:
        s.k_win = k[slots].permute(0, 2, 1, 3).contiguous()
        s.v_win = v[slots].permute(0, 2, 1, 3).contiguous()
    return s


def torch_decode(m: Model, s: Set, rows: int) -> torch.Tensor:
    """float32 decode of the first ``rows`` requests, sinks included: the check of every provider."""
    g = m.hq // m.h
    q = s.q[:rows].float().view(rows, m.h, g, m.d)
    k = s.k[s.slots[:rows]].float()  # [rows, n, H, D]
    v = s.v[s.slots[:rows]].float()
    scores = torch.einsum("bhgd,bnhd->bhgn", q, k) / math.sqrt(m.d)
    if s.sinks is not None:
        scores = torch.cat([scores, s.sinks.float().view(1, m.h, g, 1).expand(rows, -1, -1, 1)], dim=-1)
    p = scores.softmax(-1)[..., : k.shape[1]]
    return torch.einsum("bhgn,bnhd->bhgd", p, v).reshape(rows, m.hq, m.d)


class Providers:
    """Callables per provider for one set; FlexAttention compiled once per process."""

    flex_fn = None

    def __init__(self, m: Model, s: Set, page: int, L: int, flex: bool, flex_paged: bool, sdpa: bool):
        self.m, self.s, self.page = m, s, page
        B = s.q.shape[0]
        self.sm_scale = 1.0 / math.sqrt(m.d)
        self.out = torch.empty(B, m.hq, m.d, dtype=DTYPE, device=DEVICE)
        self.max_window = window_len(m, L)
        self.fns = {"triton_swa": self.triton_swa}
        if flex and s.k_win is not None:
            self.fns["flex"] = self.flex
        if flex_paged and page >= 16:
            self._build_paged_mask(L)
            self.fns["flex_paged"] = self.flex_paged
        if sdpa:
            self.fns["gather_sdpa"] = self.gather_sdpa

    def triton_swa(self, block_n=None, num_splits=None, **tune):
        """The public call, or with overrides (block_n, num_splits, and num_warps, num_stages, fused_merge
        of the launcher) the same call through the launcher."""
        s = self.s
        if self.page == 1:
            where = dict(kv_indptr=s.kv_indptr, kv_indices=s.kv_indices)
        else:
            where = dict(page_table=s.page_table, window_starts=s.window_starts, seq_lens=s.seq_lens, page_size=self.page)
        if block_n is not None or num_splits is not None or tune:
            return _swa_decode_impl(
                s.q,
                s.k,
                s.v,
                **where,
                sm_scale=self.sm_scale,
                sinks=s.sinks,
                out=self.out,
                max_window=self.max_window,
                block_n=block_n,
                num_splits=num_splits,
                tune=_Tune(**tune),
            )
        return swa_decode(s.q, s.k, s.v, **where, sm_scale=self.sm_scale, sinks=s.sinks, out=self.out, max_window=self.max_window)

    @classmethod
    def _flex(cls):
        if cls.flex_fn is None:
            from torch.nn.attention.flex_attention import flex_attention

            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
            if hasattr(torch._dynamo.config, "accumulated_cache_size_limit"):
                torch._dynamo.config.accumulated_cache_size_limit = 4096
            cls.flex_fn = torch.compile(flex_attention)
        return cls.flex_fn

    def flex(self):
        s = self.s
        return self._flex()(s.q.unsqueeze(2), s.k_win, s.v_win, scale=self.sm_scale, enable_gqa=True)

    def _build_paged_mask(self, L: int):
        """A block mask over the pool `[1, H, slots, D]` whose KV blocks are the window's pages. The
        mask_mod admits a slot when its page belongs to the request and the slot is inside the window
        (the first and last pages are cut at the window's ends); compiled flex evaluates it only on the
        listed pages, eager flex everywhere."""
        from torch.nn.attention.flex_attention import BlockMask

        s, page = self.s, self.page
        B, npg = s.page_table.shape
        start = L - self.max_window
        owner = torch.full((s.k.shape[0] // page,), -1, dtype=torch.int64, device=DEVICE)
        owner[s.page_table.long().view(-1)] = torch.arange(B, device=DEVICE).repeat_interleave(npg)
        first_phys, last_phys = s.page_table[:, 0].long(), s.page_table[:, -1].long()
        first_off, last_off = start % page, (L - 1) % page

        def mask_mod(b, h, q_idx, kv_idx):
            pg, off = kv_idx // page, kv_idx % page
            inside = ((pg != first_phys[b]) | (off >= first_off)) & ((pg != last_phys[b]) | (off <= last_off))
            return (owner[pg] == b) & inside

        num = torch.full((B, 1, 1), npg, dtype=torch.int32, device=DEVICE)
        # Flex wants the mask's KV extent to cover the whole pool: one column per pool page.
        idx = torch.zeros(B, 1, 1, owner.shape[0], dtype=torch.int32, device=DEVICE)
        idx[:, 0, 0, :npg] = s.page_table
        kwargs = dict(BLOCK_SIZE=(128, page), mask_mod=mask_mod, seq_lengths=(1, s.k.shape[0]))
        try:
            self.block_mask = BlockMask.from_kv_blocks(num, idx, compute_q_blocks=False, **kwargs)
        except TypeError:
            self.block_mask = BlockMask.from_kv_blocks(num, idx, **kwargs)
        self.k_pool = s.k.unsqueeze(0).permute(0, 2, 1, 3)  # [1, H, slots, D], a view of the pool
        self.v_pool = s.v.unsqueeze(0).permute(0, 2, 1, 3)

    def flex_paged(self):
        return self._flex()(
            self.s.q.unsqueeze(2), self.k_pool, self.v_pool, block_mask=self.block_mask, scale=self.sm_scale, enable_gqa=True
        )

    def gather_sdpa(self):
        """Gather the window, then SDPA with each KV head's query group as its query rows (no GQA
        expansion of K/V, which the math backend would materialise)."""
        s, m = self.s, self.m
        B, n = s.slots.shape
        flat = s.slots.view(-1)
        k = s.k.index_select(0, flat).view(B, n, m.h, m.d).transpose(1, 2)
        v = s.v.index_select(0, flat).view(B, n, m.h, m.d).transpose(1, 2)
        q = s.q.view(B, m.h, m.hq // m.h, m.d)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=self.sm_scale)
        return o.reshape(B, m.hq, m.d)


def case_bytes(m: Model, B: int, L: int, page: int) -> int:
    n = window_len(m, L)
    kv = B * n * m.h * 2 * m.d * 2
    qo = 2 * B * m.hq * m.d * 2
    if page == 1:
        index = 4 * (B * n + B + 1)
    else:
        index = 4 * (B * (math.ceil(n / page) + 1) + 2 * B)
    return kv + qo + index


def run_case(rec: Recorder, m: Model, B: int, L: int, page: int, args, failures: list) -> None:
    n = window_len(m, L)
    case = f"{m.name}-B{B}-L{L // 1024}k-W{m.window_left}-P{page}"
    nbytes = case_bytes(m, B, L, page)
    flops = 4 * B * m.hq * n * m.d
    set_bytes = nbytes
    n_sets = 1 if set_bytes >= GiB else rotation_count(set_bytes)
    peers = not args.sweep and set_bytes <= args.peer_max_gib * GiB
    want_flex = peers and not args.no_flex
    sets = [make_set(m, B, L, page, seed=i, contiguous=want_flex) for i in range(n_sets)]
    provs = [Providers(m, s, page, L, want_flex, want_flex and not args.no_flex_paged, peers) for s in sets]

    if args.sweep:
        sweep(case, m, B, L, page, provs, nbytes, args)
        return

    check_rows = min(B, 2)
    want = torch_decode(m, sets[0], check_rows)
    names = list(provs[0].fns)
    graph = set_bytes <= args.graph_max_mib * 2**20
    for name in names:
        try:
            got = provs[0].fns[name]()
            if got.dim() == 4:
                got = got.squeeze(2)
            got = got[:check_rows].float()
            # Peers have no sinks: on sink shapes only triton_swa is checked.
            if (name == "triton_swa" or not m.sinks) and not torch.allclose(got, want, atol=2e-2, rtol=2e-2):
                err = (got - want).abs().max().item()
                failures.append(f"{case} {name}: max-abs error {err:.3e} against the float32 decode")
                print(f"MISMATCH {case} {name}: max-abs error {err:.3e}", flush=True)
            fns = [p.fns[name] for p in provs]
            rec.add(case, name, time_rotated(fns, reps=args.reps), nbytes, flops)
            # triton_swa's kernel time at every size (graph replay has no launch cost), peers' where small.
            if graph or name == "triton_swa":
                rec.add(case, f"{name}_graph", time_rotated(fns, reps=args.reps, use_graph=True), nbytes, flops)
            if name == "triton_swa":
                HOST_US[case] = host_us(fns)
        except Exception as exc:  # a peer that does not run on this shape is reported, not fatal
            msg = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
            print(f"  {case} {name}: did not run ({type(exc).__name__}: {msg})", flush=True)
            if name == "triton_swa":
                failures.append(f"{case} triton_swa raised {type(exc).__name__}: {msg}")
    if graph:
        # What the same bytes cost as a plain device copy (read + write = nbytes), launched the same way:
        # at these sizes even a copy is far from the ceiling (launch, ramp-up, drain).
        # Halves of whole 128-byte lines: a misaligned second half would take a slower copy kernel.
        bufs = [torch.empty(2, nbytes // 256 * 64, dtype=torch.int16, device=DEVICE) for _ in range(n_sets)]
        rec.add(
            case,
            "copy_same_bytes_graph",
            time_rotated([lambda b=b: b[1].copy_(b[0]) for b in bufs], reps=args.reps, use_graph=True),
            nbytes,
            0,
        )
        del bufs
    print(f"  {case}: {n_sets} set(s) of {set_bytes / 2**20:.1f} MiB, {len(names)} providers", flush=True)


HOST_US: dict = {}


def host_us(fns, calls: int = 200) -> float:
    """Host microseconds per call: ``calls`` calls issued back to back, the GPU left to catch up after."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(calls):
        fns[i % len(fns)]()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def _parse_list(text: str, cast=int) -> list:
    """ "a,b,c" with "auto" for None (the heuristic's choice)."""
    return [None if x == "auto" else cast(x) for x in text.split(",") if x]


def sweep_overrides(m: Model, args) -> list[dict]:
    """The sweep's grid: tiles, warps, stages, splits and merge kind (``auto``: the heuristic's)."""
    merge = {"auto": None, "fused": True, "kernel": False}
    grid = itertools.product(
        _parse_list(args.sweep_block_n),
        _parse_list(args.sweep_warps),
        _parse_list(args.sweep_stages),
        _parse_list(args.sweep_splits),
        [merge[x] for x in args.sweep_merge.split(",")],
    )
    out = []
    for block_n, warps, stages, splits, fused in grid:
        o = dict(block_n=block_n, num_warps=warps, num_stages=stages, num_splits=splits, fused_merge=fused)
        out.append({k: v for k, v in o.items() if v is not None})
    return out


_WORKER_SETS: dict = {}


def _precompile_one(job) -> str:
    """Worker: build one input set of the case and run one override once, so that Triton's cache holds
    the compiled kernel when the parent times it."""
    name, B, L, page, override = job
    key = (name, B, L, page)
    try:
        if key not in _WORKER_SETS:
            _WORKER_SETS.clear()
            m = MODELS[name]
            _WORKER_SETS[key] = Providers(m, make_set(m, B, L, page, seed=0, contiguous=False), page, L, False, False, False)
        _WORKER_SETS[key].triton_swa(**override)
        torch.cuda.synchronize()
        return ""
    except Exception as exc:
        return f"{override}: {type(exc).__name__}"


def precompile(jobs: list, workers: int) -> None:
    """Compile the sweep's variants in parallel processes (Triton compiles one kernel at a time per
    process; the cache on disk is shared)."""
    import multiprocessing as mp

    if workers <= 1 or not jobs:
        return
    t0 = time.time()
    with mp.get_context("spawn").Pool(min(workers, len(jobs))) as pool:
        errors = [e for e in pool.map(_precompile_one, jobs, chunksize=1) if e]
    print(f"  precompiled {len(jobs)} variants in {time.time() - t0:.0f} s ({len(errors)} failed)", flush=True)


def sweep(case: str, m: Model, B: int, L: int, page: int, provs, nbytes: int, args) -> None:
    """Time triton_swa (CUDA-graph replay: kernel time only) over tile/warp/stage/split/merge choices;
    print the default and the best few (no CSV rows)."""
    results = []
    default = time_rotated([p.triton_swa for p in provs], reps=10, use_graph=True)[1]
    for override in sweep_overrides(m, args):
        try:
            fns = [lambda p=p, o=override: p.triton_swa(**o) for p in provs]
            t = time_rotated(fns, reps=10, use_graph=True)
        except Exception as exc:
            print(f"  {case} {override}: {type(exc).__name__}", flush=True)
            continue
        results.append((t[1], override))
    results.sort(key=lambda r: r[0])
    plan = [pl for key, pl in decode_mod._PLANS.items() if key[-1] is None and key[0][1][0] == B]
    auto = f"splits {plan[-1].ints[0]}, fused {plan[-1].fused}" if plan else ""
    print(f"SWEEP {case} {nbytes / 1e6:.1f} MB: default {default:.2f} us ({nbytes / default / 1e6:.2f} TB/s) [{auto}]", flush=True)
    for us, override in results[: args.sweep_top]:
        print(f"    {us:8.2f} us {nbytes / us / 1e6:6.2f} TB/s  {override}", flush=True)


# --tune: (model, B, context in k, page, sweep lists) of the cases that decide the heuristics.
TUNE_SPECS = [
    ("g3", 64, 4, 1, dict(block_n="64,128", warps="4,8", stages="3,5", splits="auto,1")),
    ("g4swa", 64, 4, 16, dict(block_n="32,64", stages="3,5", splits="auto,1")),
    ("mistral", 64, 32, 1, dict(stages="3,5", splits="auto,1,2,4")),
    ("g4full", 8, 32, 16, dict(block_n="32,64", stages="2,3,4")),
    ("g3", 1, 4, 1, dict(block_n="32,64", splits="auto,8,16,32")),
    ("g4swa", 1, 32, 16, dict(block_n="16,32", splits="auto,16,32,64")),
    ("mistral", 1, 4, 1, dict(block_n="32,64", splits="auto,16,32,64")),
    ("g4full", 1, 4, 1, dict(block_n="16,32", splits="auto,16,32,64")),
    ("gptoss", 64, 4, 1, dict(block_n="32,64,128", stages="3,5")),
]


HOST_CASES = (("g3", 1, 1), ("gptoss", 64, 16), ("mistral", 8, 16))


def host_report() -> None:
    """Host microseconds per call of the public function, launching compiled kernels directly or
    through the JIT's binder every time (``--slow-launch``), on a few small cases."""
    for name, B, page in HOST_CASES:
        m, L = MODELS[name], 4096
        sets = [make_set(m, B, L, page, seed=i, contiguous=False) for i in range(4)]
        fns = [Providers(m, s, page, L, False, False, False).triton_swa for s in sets]
        times = {}
        for fast in (True, False):
            set_fast_launch(fast)
            host_us(fns, 50)
            times[fast] = min(host_us(fns) for _ in range(3))
        set_fast_launch(True)
        print(f"HOST {name}-B{B}-P{page}: {times[True]:.1f} us per call (direct launch), {times[False]:.1f} us (JIT binder)", flush=True)


def tune_args(args, lists: dict) -> argparse.Namespace:
    """``args`` in sweep mode with one spec's sweep lists."""
    ns = argparse.Namespace(**vars(args))
    ns.sweep = True
    for key in ("block_n", "warps", "stages", "splits", "merge"):
        setattr(ns, f"sweep_{key}", lists.get(key, "auto"))
    return ns


def target_summary(rows: list) -> str:
    """One line per case: triton_swa's share of the copy ceiling and its speed-up over each peer, with
    the issue's targets (>= 90% of copy at >= 256 MB, >= 70% at 16-64 MB, <= 8 us at B = 1 by graph
    replay, >= 1.0x FlexAttention)."""
    by_case: dict = {}
    for r in rows:
        by_case.setdefault(r["case"], {})[r["provider"]] = r
    lines = [f"{'case':<34} {'MB':>8} {'%copy':>6} {'%graph':>6} {'us':>8} {'graph us':>8} {'host us':>7}  speed-up over peers"]
    for case, prov in by_case.items():
        ours = prov.get("triton_swa")
        if ours is None:
            continue
        mb = ours["bytes"] / 1e6
        misses = []
        graph = prov.get("triton_swa_graph")
        # The copy-share targets judge the kernel: graph replay where measured (no launch cost).
        pct = (graph or ours)["pct_copy"]
        if mb >= 256 and pct < 90 or 16 <= mb <= 64 and pct < 70:
            misses.append("%copy")
        if "-B1-" in case and graph is not None and graph["us_p50"] > 8:
            misses.append("B1 latency")
        ratios = []
        for name in ("flex", "flex_paged", "gather_sdpa"):
            for suffix in ("", "_graph"):
                peer, mine = prov.get(name + suffix), prov.get("triton_swa" + suffix)
                if peer is not None and mine is not None:
                    x = peer["us_p50"] / mine["us_p50"]
                    ratios.append(f"{name + suffix} {x:.2f}x")
                    if name.startswith("flex") and x < 1.0:
                        misses.append(name + suffix)
        same = prov.get("copy_same_bytes_graph")
        if same is not None and graph is not None:
            ratios.append(f"same-bytes copy {same['us_p50'] / graph['us_p50']:.2f}x")
        g = f"{graph['pct_copy']:6.1f} " if graph is not None else f"{'-':>6} "
        g = g + (f"{ours['us_p50']:8.2f} " + (f"{graph['us_p50']:8.2f}" if graph is not None else f"{'-':>8}"))
        h = f"{HOST_US[case]:7.1f}" if case in HOST_US else f"{'-':>7}"
        lines.append(
            f"{case:<34} {mb:8.1f} {ours['pct_copy']:6.1f} {g} {h}  "
            + ", ".join(ratios)
            + (f"  MISS: {', '.join(misses)}" if misses else "")
        )
    return "\n".join(lines)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batch", default="1,8,64,256")
    parser.add_argument("--ctx", default="4k,32k")
    parser.add_argument("--pages", default="1,16")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--no-flex", action="store_true", help="skip both FlexAttention peers")
    parser.add_argument("--no-flex-paged", action="store_true")
    parser.add_argument("--peer-max-gib", type=float, default=20.0, help="skip peers on larger window sets")
    parser.add_argument("--graph-max-mib", type=float, default=64.0, help="graph-replay timing up to this size")
    parser.add_argument("--max-gib", type=float, default=20.0, help="skip cases whose window K/V is larger")
    parser.add_argument("--budget-s", type=float, default=230.0, help="start no case after this many seconds")
    parser.add_argument("--sweep", action="store_true", help="tile/split sweep of triton_swa only")
    parser.add_argument("--sweep-block-n", default="auto", help="e.g. 32,64,auto")
    parser.add_argument("--sweep-warps", default="auto")
    parser.add_argument("--sweep-stages", default="auto")
    parser.add_argument("--sweep-splits", default="auto")
    parser.add_argument("--sweep-merge", default="auto", help="auto,fused,kernel (a CUDA-graph capture always merges by kernel)")
    parser.add_argument("--sweep-top", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=0, help="processes that precompile the sweep's variants")
    parser.add_argument("--tune", action="store_true", help="the sweeps of TUNE_SPECS (the heuristics' evidence)")
    parser.add_argument("--slow-launch", action="store_true", help="launch through the JIT every call")
    args = parser.parse_args()

    t0 = time.time()
    set_fast_launch(not args.slow_launch)
    # `timeout` sends SIGTERM: save what was measured before leaving.
    signal.signal(signal.SIGTERM, _interrupt)
    rec = Recorder.start("decode")
    print(f"copy ceiling {rec.copy_tbps:.2f} TB/s on {torch.cuda.get_device_name()}", flush=True)
    failures, skipped = [], []
    # Context-major, so that a run cut short by the budget still covers every model at the first context.
    grid = [
        (MODELS[name], int(b), int(c.rstrip("k")) * 1024, int(p))
        for c in args.ctx.split(",")
        for p in args.pages.split(",")
        for name in args.models.split(",")
        for b in args.batch.split(",")
    ]
    if args.tune:
        specs = [(MODELS[n], b, c * 1024, p, tune_args(args, lists)) for n, b, c, p, lists in TUNE_SPECS]
        jobs = [(m.name, B, L, page, o) for m, B, L, page, ns in specs for o in [{}] + sweep_overrides(m, ns)]
        precompile(jobs + [(name, B, 4096, page, {}) for name, B, page in HOST_CASES], args.jobs)
        host_report()
        for m, B, L, page, ns in specs:
            try:
                run_case(rec, m, B, L, page, ns, failures)
            except Exception as exc:
                print(f"  tune {m.name}-B{B}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            torch.cuda.empty_cache()
        print(f"total {time.time() - t0:.0f} s")
        return 0
    if args.sweep and args.jobs > 1:
        precompile([(m.name, B, L, page, o) for m, B, L, page in grid for o in sweep_overrides(m, args)], args.jobs)
    try:
        for m, B, L, page in grid:
            case = f"{m.name}-B{B}-L{L // 1024}k-P{page}"
            if case_bytes(m, B, L, page) > args.max_gib * GiB:
                skipped.append(f"{case} (window K/V over {args.max_gib:g} GiB)")
                continue
            if time.time() - t0 > args.budget_s:
                skipped.append(f"{case} (time budget)")
                continue
            run_case(rec, m, B, L, page, args, failures)
            torch.cuda.empty_cache()
    except KeyboardInterrupt:
        print("interrupted: saving the rows measured so far", flush=True)
    finally:
        if rec.rows:
            print(f"saved {rec.save()}")
    if skipped:
        print(f"skipped {len(skipped)}: " + "; ".join(skipped))
    print(f"total {time.time() - t0:.0f} s")
    if rec.rows:
        print(rec.table())
        print(target_summary(rec.rows))
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
