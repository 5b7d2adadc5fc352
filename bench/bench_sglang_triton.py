"""SGLang's own Triton attention backend as a second oracle and as a peer (issue 12, item 4).

Both backends run on one SGLang pool state: SGLang 0.5.23's real ``ReqToTokenPool``, ``SWAKVPool``
and ``SWATokenToKVPoolAllocator`` (from ``sglang.srt.mem_cache.allocator.swa``), a
``KVIndexTranslator``, SGLang's ``ForwardBatch`` bound to its own plan and a sliding
``RadixAttention`` layer called through ``RadixAttention.forward`` under SGLang's forward context:

- ``sglang_triton``: ``sglang.srt.layers.attention.triton_backend.TritonAttnBackend`` (its Triton
  kernels, from the installed wheel);
- ``triton_swa``: ``triton_swa.integrations.sglang.TritonSWASGLangBackend`` (public API only).

The history of every request is allocated in rounds by SGLang's allocator, and after each round the
tokens that left the window get ``free_swa`` (whole pages at page size 16), so the SWA slots drift
away from the full slots (the fraction that differ is printed). The sliding layer's SWA buffers are
filled with NaN first and only the window's history is written (SGLang's ``set_kv_buffer``), so a
read outside the window gives NaN; each backend writes the step's new K/V itself. Outputs are
NaN-poisoned where the caller can reach them (a NaN block of the output's size is freed just
before the call, which PyTorch's caching allocator hands back to ``empty_like``; triton-swa's own
buffers with ``TRITON_SWA_POISON=1``).

Correctness first. Every case's outputs are compared with ``triton_swa_reference`` (float64) on the
window of docs/contract.md §1 (``W + 1`` keys). SGLang's Triton decode keeps ``min(seq_len, W)`` keys, one short
(docs/contract.md §1, docs/sglang-0.5.23-facts.md §11), so it is judged against the reference at window ``W - 1``
and its max error against the ``W`` reference is reported beside it. A provider that disagrees with
its reference is reported WRONG and not timed. Small probe cases (ragged lengths, W + 1 >= L, W not
a multiple of the page) check both decode and extend (chunked prefill) where one key is a visible
part of the output; they are not timed.

Timing (bf16, CUDA): each provider's whole ``RadixAttention.forward`` step (K/V write and attention;
metadata built before) is captured in a CUDA graph and replayed, L2 flushed before every replay
(``torch.cuda`` events around the replay only), providers alternating in rounds; p20/p50/p80 over
the replays. The copy ceiling is measured in the same run. Rows (docs/contract.md §7) go to
``<out>/sglang-triton-<date>-<gpu>.csv``; rows need ``--git-sha`` (the device copy has no .git).

    python bench/bench_sglang_triton.py --git-sha $(git rev-parse --short HEAD)      # the grid, H200
    python bench/bench_sglang_triton.py --git-sha X --models d128-w1023 --batch 1,64 --ctx 4k
    python bench/bench_sglang_triton.py --cpu-smoke       # tiny shapes in the Triton interpreter
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import importlib.util
import os
import sys
import time
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Model:
    name: str
    hq: int
    h: int
    d: int
    w: int  # window_left


MODELS = {
    m.name: m
    for m in [
        Model("d128-w1023", 32, 8, 128, 1023),
        Model("d256-w1023", 32, 8, 256, 1023),
        Model("d128-w4095", 32, 8, 128, 4095),
        Model("d256-w4095", 32, 8, 256, 4095),
    ]
}
# Tiny shapes for the interpreter; W + 1 >= L, W not a multiple of the page, ragged lengths.
SMOKE_MODELS = [Model("smoke-d16-w7", 4, 2, 16, 7), Model("smoke-d32-w13", 4, 1, 32, 13)]
# Probe cases (correctness only, GPU): windows small enough that the one key matters.
PROBE_MODELS = [Model("probe-d128-w15", 32, 8, 128, 15), Model("probe-d256-w37", 32, 8, 256, 37)]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--git-sha", default=None, help="the commit measured (required to write rows)")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes, Triton interpreter, no timing rows")
    p.add_argument("--smoke-dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batch", default="1,8,64")
    p.add_argument("--ctx", default="4k,32k")
    p.add_argument("--pages", default="1,16")
    p.add_argument("--reps", type=int, default=100, help="graph replays per provider and case")
    p.add_argument("--rounds", type=int, default=4, help="alternations of the providers per case")
    p.add_argument("--no-probes", action="store_true")
    p.add_argument(
        "--extend",
        default="d128-w1023,d256-w4095:1,8:32k:512",
        help="extend timing cases 'models:B list:prefix list:new tokens' ('' for none)",
    )
    p.add_argument("--budget-s", type=float, default=1e9, help="start no case after this many seconds")
    p.add_argument("--out", default=os.environ.get("OUT", os.path.join(REPO, "bench", "results")))
    return p.parse_args(argv)


def _ints(text):
    out = []
    for part in filter(None, text.split(",")):
        part = part.strip().lower()
        out.append(int(part[:-1]) * 1024 if part.endswith("k") else int(part))
    return out


def _size(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 and n else str(n)


def _load_stubs():
    """tests/integration/sglang_stubs.py, by path (tests/ is no package)."""
    spec = importlib.util.spec_from_file_location("_triton_swa_sglang_stubs", os.path.join(REPO, "tests", "integration", "sglang_stubs.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.install()


# ----- SGLang's runtime, the runner both backends read, the pool state ---------------------------------


def publish_sglang_context(device: str) -> None:
    """SGLang's backends read ``get_exec()``, ``get_spec()``, ``get_parallel()``: a published
    ``ServerArgs`` (the defaults, ``--attention-backend triton``) stands in for a server's."""
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    reset_context()
    publish(ServerArgs(model_path="dummy", device=device, attention_backend="triton"), role="bench", ranks=SpawnRanks(world_rank=0))


class ModelConfig:
    """What SGLang's ``TritonAttnBackend`` reads off ``model_runner.model_config`` (MHA, one window)."""

    is_encoder_decoder = False
    is_draft_model = False
    linear_attn_registry_result = None

    def __init__(self, m: Model, context_len: int):
        from sglang.srt.configs.model_config import AttentionArch
        from transformers import PretrainedConfig

        self.attention_arch = AttentionArch.MHA
        self.hf_config = PretrainedConfig()
        self.head_dim = self.v_head_dim = self.swa_v_head_dim = m.d
        self.context_len = context_len
        self._hq, self._h = m.hq, m.h

    def get_max_num_attention_heads(self):
        return self._hq

    def get_num_kv_heads(self, tp_size=1, dcp_size=1):
        return self._h


class Runner:
    """The model runner both backends are built from (SGLang's attribute names)."""

    def __init__(self, m, pool, alloc, rtp, translator, page, device, dtype):
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.token_to_kv_pool, self.token_to_kv_pool_allocator, self.req_to_token_pool = pool, alloc, rtp
        self.kv_index_translator = translator
        self.sliding_window_size, self.page_size = m.w, page
        self.is_draft_worker, self.spec_algorithm = False, SpeculativeAlgorithm.NONE
        self.device, self.gpu_id, self.dtype, self.kv_cache_dtype = device, 0, dtype, dtype
        self.model_config = ModelConfig(m, rtp.req_to_token.shape[1])

    def decode_num_tokens_per_req(self, **kwargs):
        return 1


@dataclass
class State:
    m: Model
    page: int
    device: str
    dtype: object
    lens: list  # history tokens per request (already in the pool)
    rows: list
    pool: object
    alloc: object
    rtp: object
    translator: object
    runner: object
    layer: object
    k_hist: list  # per request: the window's history K [n_b, H, D] (what the reference reads)
    v_hist: list
    drift: float  # fraction of the window's history whose SWA slot differs from its full slot


def _floor(x, page):
    return x // page * page


def build_state(m: Model, lens: list, page: int, device: str, dtype, seed: int, extra_per_req: int) -> State:
    """SGLang's pools with ``lens[b]`` history tokens per request, allocated in rounds by SGLang's
    allocator with ``free_swa`` of what leaves the window; only the window's K/V is written."""
    import torch
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc, ReqToTokenPool
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    B, W = len(lens), m.w
    chunk = max(page, _floor(2048, page)) if device == "cuda" else max(page, 8)
    slack = 8 * page + 16
    size = -(-(sum(lens) + B * (extra_per_req + page) + slack) // page) * page
    size_swa = -(-(B * (W + 2 * page + chunk + extra_per_req + page) + slack) // page) * page
    pool = SWAKVPool(
        size=size,
        size_swa=size_swa,
        page_size=page,
        dtype=dtype,
        head_num=1,
        head_dim=m.d,
        swa_attention_layer_ids=[0],
        full_attention_layer_ids=[1],
        device=device,
        enable_memory_saver=False,
        swa_head_num=m.h,
        swa_head_dim=m.d,
        swa_v_head_dim=m.d,
    )
    alloc = SWATokenToKVPoolAllocator(size, size_swa, page, dtype, device, pool, False)
    rtp = ReqToTokenPool(B + 1, max(lens) + extra_per_req + 1, device, False)
    rows = rtp.alloc_rows(B)
    translator = KVIndexTranslator(
        req_to_token=rtp.req_to_token, token_to_kv_pool_allocator=alloc, token_to_kv_pool=pool, page_size=page, device=device
    )
    # NaN everywhere in the sliding layer's SWA buffers: only the window's history is written below.
    k_buf, v_buf = pool.get_kv_buffer(0)
    k_buf.fill_(float("nan"))
    v_buf.fill_(float("nan"))

    # Offset the SWA slots against the full ones from the start: SGLang's SWA sub-allocator hands a few
    # pages to a holder outside this batch (as another request's live window would hold them).
    held = alloc.swa_attn_allocator.alloc(3 * page if page > 1 else 5)
    assert held is not None
    done = [0] * B
    freed = [0] * B
    while any(d < n for d, n in zip(done, lens)):
        take = [min(chunk, n - d) for d, n in zip(done, lens)]
        active = [b for b in range(B) if take[b] > 0]
        if page == 1:
            full = alloc.alloc(sum(take[b] for b in active))
        else:
            pre = torch.tensor([done[b] for b in active], dtype=torch.int64)
            seq = torch.tensor([done[b] + take[b] for b in active], dtype=torch.int64)
            last = torch.tensor(
                [int(rtp.req_to_token[rows[b], done[b] - 1]) if done[b] else -1 for b in active], dtype=torch.int64, device=device
            )
            full = alloc.alloc_extend(pre.to(device), pre, seq.to(device), seq, last, int((seq - pre).sum()))
        if full is None:
            raise RuntimeError(f"SGLang's allocator ran out (size {size}, size_swa {size_swa})")
        at = 0
        for b in active:
            rtp.req_to_token[rows[b], done[b] : done[b] + take[b]] = full[at : at + take[b]].to(torch.int32)
            at += take[b]
            done[b] += take[b]
        # SGLang's eviction: tokens older than the window of a decode after this round (whole pages).
        evict = []
        for b in range(B):
            upto = _floor(max(0, done[b] - W), page)
            if upto > freed[b]:
                evict.append(rtp.req_to_token[rows[b], freed[b] : upto].long())
                freed[b] = upto
        if evict:
            alloc.free_swa(torch.cat(evict))

    layer = RadixAttention(m.hq, m.d, m.d**-0.5, m.h, 0, sliding_window_size=W)
    g = torch.Generator(device=device).manual_seed(seed)
    k_hist, v_hist, same, total = [], [], 0, 0
    for b in range(B):
        # the decode after this history attends positions [lens - W, lens] (the new token is lens)
        start = max(0, lens[b] - W)
        full = rtp.req_to_token[rows[b], start : lens[b]].long()
        swa = pool.translate_loc_from_full_to_swa(full)
        if bool((swa <= 0).any()):
            raise RuntimeError("a token inside the window has no SWA slot: the eviction above is wrong")
        same += int((swa == full).sum())
        total += full.numel()
        k = torch.randn(full.numel(), m.h, m.d, generator=g, device=device).to(dtype)
        v = torch.randn(full.numel(), m.h, m.d, generator=g, device=device).to(dtype)
        pool.set_kv_buffer(layer, KVWriteLoc(full, swa_loc=swa), k.clone(), v.clone())
        k_hist.append(k)
        v_hist.append(v)
    runner = Runner(m, pool, alloc, rtp, translator, page, device, dtype)
    return State(
        m, page, device, dtype, list(lens), rows, pool, alloc, rtp, translator, runner, layer, k_hist, v_hist, 1.0 - same / max(total, 1)
    )


def decode_batch(st: State, seed: int):
    """One DECODE step of every request: SGLang's ForwardBatch (its own plan bound), the new token's
    slot from SGLang's allocator, and fresh q / k / v."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    dev, B = st.device, len(st.lens)
    seq_cpu = torch.tensor([n + 1 for n in st.lens], dtype=torch.int64)
    if st.page == 1:
        loc = st.alloc.alloc(B)
    else:
        last = torch.stack([st.rtp.req_to_token[r, n - 1].long() for r, n in zip(st.rows, st.lens)])
        loc = st.alloc.alloc_decode(seq_cpu.to(dev), seq_cpu, last)
    for r, n, slot in zip(st.rows, st.lens, loc.tolist()):
        st.rtp.req_to_token[r, n] = slot
    fb = ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=B,
        input_ids=torch.zeros(B, dtype=torch.long, device=dev),
        req_pool_indices=torch.tensor(st.rows, device=dev),
        seq_lens=seq_cpu.to(dev),
        out_cache_loc=loc,
        seq_lens_sum=int(seq_cpu.sum()),
        seq_lens_cpu=seq_cpu,
        positions=torch.tensor(st.lens, device=dev),
        spec_algorithm=SpeculativeAlgorithm.NONE,
    )
    st.translator.bind_own_plan(fb)
    g = torch.Generator(device=dev).manual_seed(seed)
    m = st.m
    q = torch.randn(B, m.hq * m.d, generator=g, device=dev).to(st.dtype)
    k = torch.randn(B, m.h * m.d, generator=g, device=dev).to(st.dtype)
    v = torch.randn(B, m.h * m.d, generator=g, device=dev).to(st.dtype)
    return fb, q, k, v, [[n] for n in st.lens]


def extend_batch(st: State, new: int, seed: int):
    """One EXTEND step (chunked prefill): ``new`` tokens per request after its history."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    dev, B, m = st.device, len(st.lens), st.m
    pre = torch.tensor(st.lens, dtype=torch.int64)
    seq = pre + new
    if st.page == 1:
        loc = st.alloc.alloc(B * new)
    else:
        last = torch.tensor(
            [int(st.rtp.req_to_token[r, n - 1]) if n else -1 for r, n in zip(st.rows, st.lens)], dtype=torch.int64, device=dev
        )
        loc = st.alloc.alloc_extend(pre.to(dev), pre, seq.to(dev), seq, last, B * new)
    for i, (r, n) in enumerate(zip(st.rows, st.lens)):
        st.rtp.req_to_token[r, n : n + new] = loc[i * new : (i + 1) * new].to(torch.int32)
    positions = torch.cat([torch.arange(n, n + new) for n in st.lens]).to(dev)
    fb = ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        batch_size=B,
        input_ids=torch.zeros(B * new, dtype=torch.long, device=dev),
        req_pool_indices=torch.tensor(st.rows, device=dev),
        seq_lens=seq.to(dev),
        out_cache_loc=loc,
        seq_lens_sum=int(seq.sum()),
        seq_lens_cpu=seq,
        extend_prefix_lens=pre.to(dev),
        extend_prefix_lens_cpu=pre.tolist(),
        extend_seq_lens=torch.full((B,), new, device=dev),
        extend_seq_lens_cpu=[new] * B,
        extend_num_tokens=B * new,
        positions=positions,
        spec_algorithm=SpeculativeAlgorithm.NONE,
    )
    st.translator.bind_own_plan(fb)
    g = torch.Generator(device=dev).manual_seed(seed)
    q = torch.randn(B * new, m.hq * m.d, generator=g, device=dev).to(st.dtype)
    k = torch.randn(B * new, m.h * m.d, generator=g, device=dev).to(st.dtype)
    v = torch.randn(B * new, m.h * m.d, generator=g, device=dev).to(st.dtype)
    return fb, q, k, v, [list(range(n, n + new)) for n in st.lens]


def reference(st: State, q, k, v, q_positions, window_left: int):
    """float64 reference of every query: the window's history (as written) plus this step's K/V."""
    import torch

    import triton_swa_reference as ref

    m, out, at = st.m, [], 0
    for b, pos in enumerate(q_positions):
        t = len(pos)
        n_hist = st.k_hist[b].shape[0]
        kk = torch.cat([st.k_hist[b], k[at : at + t].view(t, m.h, m.d)])
        vv = torch.cat([st.v_hist[b], v[at : at + t].view(t, m.h, m.d)])
        k_pos = torch.arange(pos[0] - n_hist, pos[-1] + 1, device=q.device)
        q_pos = torch.tensor(pos, device=q.device)
        mask = ref.window_mask(q_pos, k_pos, window_left)
        out.append(ref.attention(q[at : at + t].view(t, m.hq, m.d), kk, vv, mask, sm_scale=st.layer.scaling))
        at += t
    return torch.cat(out)


# ----- the two providers -------------------------------------------------------------------------------


def make_backends(st: State):
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    from triton_swa.integrations.sglang import TritonSWASGLangBackend

    return {"triton_swa": TritonSWASGLangBackend(st.runner), "sglang_triton": TritonAttnBackend(st.runner)}


def forward(backend, st: State, fb, q, k, v, poison: bool):
    """``RadixAttention.forward`` under SGLang's forward context (metadata built by the caller)."""
    import torch
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    if poison:
        # A freed NaN block of the output's size: the caching allocator hands it to empty_like.
        torch.full((q.shape[0], st.m.hq * st.m.d), float("nan"), dtype=q.dtype, device=q.device)
    with forward_context(ForwardContext(attn_backend=backend)):
        return st.layer(q, k, v, fb)


@dataclass
class Check:
    provider: str
    err_w: float  # max abs error against the reference at window W (docs/contract.md §1)
    err_w1: float  # ... and at window W - 1 (SGLang's Triton decode keeps one key fewer)
    ok_w: bool
    ok_w1: bool
    judged: int = 0  # the window this provider is judged at (W, or W - 1 for SGLang's decode)
    why: str = ""

    @property
    def ok(self) -> bool:
        return self.ok_w if self.judged == 0 else self.ok_w1

    def verdict(self) -> str:
        if self.ok:
            return "ok" + (" (at W-1)" if self.judged else "")
        return "WRONG"


def _close(got, want, name):
    from triton_swa.testing import assert_close

    try:
        assert_close(got, want, name=name)
        return True, ""
    except AssertionError as e:
        return False, str(e).split("\n")[0][:300]


def check(provider, op, out, st: State, want_w, want_w1) -> Check:
    """Both errors; triton_swa is judged at W; sglang_triton's decode at W - 1 (its documented one-short
    window), its extend at W when it agrees there, else at W - 1 (printed as such)."""
    import torch

    m = st.m
    got = out.view(-1, m.hq, m.d)
    finite = bool(torch.isfinite(got).all())
    err_w = float((got.double() - want_w).abs().max()) if finite else float("nan")
    err_w1 = float((got.double() - want_w1).abs().max()) if finite else float("nan")
    ok_w, why_w = _close(got, want_w, f"{provider} vs reference at W={m.w}")
    ok_w1, why_w1 = _close(got, want_w1, f"{provider} vs reference at W-1={m.w - 1}")
    judged = 0
    if provider == "sglang_triton" and (op == "decode" or not ok_w):
        judged = 1
    c = Check(provider, err_w, err_w1, ok_w, ok_w1, judged)
    c.why = "" if c.ok else (why_w1 if judged else why_w)
    return c


# ----- timing ------------------------------------------------------------------------------------------


class Timer:
    """CUDA-graph replay of one call, L2 flushed before each replay, events around the replay only
    (eager calls the same way when a provider cannot be captured). On a CPU (smoke) a wall-clock time
    of a few eager calls, only to exercise the rows."""

    def __init__(self, device: str):
        import torch

        self.cuda = device == "cuda"
        self.flush = torch.empty(256 * 2**20, dtype=torch.int8, device=device) if self.cuda else None

    def prepare(self, fn):
        """``(run, output, how)``: a replay (or the call itself) and the output it writes."""
        import torch

        if not self.cuda:
            return fn, None, "eager"
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                out = fn()
        except Exception as e:
            torch.cuda.synchronize()
            print(f"    graph capture failed ({type(e).__name__}: {str(e)[:160]}); timed eagerly", flush=True)
            return fn, None, "eager"
        graph.replay()
        torch.cuda.synchronize()
        return graph.replay, out, "graph"

    def run(self, call, reps: int) -> list:
        import torch

        if not self.cuda:
            out = []
            for _ in range(max(2, reps // 20)):
                t0 = time.perf_counter()
                call()
                out.append((time.perf_counter() - t0) * 1e6)
            return out
        events = []
        for _ in range(reps):
            self.flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
        return [s.elapsed_time(e) * 1e3 for s, e in events]


def quantiles(times):
    import torch

    t = torch.tensor(times, dtype=torch.float64)
    return float(t.quantile(0.2)), float(t.quantile(0.5)), float(t.quantile(0.8))


def copy_ceiling_tbps(device: str) -> float:
    """Device-to-device copy of 2 GiB (read + write bytes over the median time), measured now."""
    import torch

    n = (2 * 2**30 if device == "cuda" else 64 * 2**20) // 2
    src = torch.empty(n, dtype=torch.int16, device=device)
    dst = torch.empty_like(src)
    times = []
    for i in range(23):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            us = start.elapsed_time(end) * 1e3
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            us = (time.perf_counter() - t0) * 1e6
        if i >= 3:
            times.append(us)
    return 2 * src.numel() * 2 / (quantiles(times)[1] * 1e-6) / 1e12


def case_cost(st: State, q_positions, op: str):
    """docs/contract.md §7: the fewest bytes (window K/V once, q, o, new K/V written, one int32 index per
    key) and the flops over attended (query, key) pairs, at the window of docs/contract.md §1."""
    m, item = st.m, st.dtype.itemsize
    keys, pairs = 0, 0
    for pos in q_positions:
        first = max(0, pos[0] - m.w)
        keys += pos[-1] + 1 - first
        pairs += sum(p + 1 - max(0, p - m.w) for p in pos)
    tokens = sum(len(p) for p in q_positions)
    nbytes = keys * m.h * m.d * 2 * item + tokens * (2 * m.hq * m.d + 2 * m.h * m.d) * item + 4 * keys
    flops = 4 * pairs * m.hq * m.d
    return nbytes, flops


# ----- the run -----------------------------------------------------------------------------------------


def run_case(op, m, lens, page, args, ctx, timed: bool, new: int = 0):
    """Build the state, check both providers, time those that agree. Returns result lines."""
    import torch

    from triton_swa.runtime import poison

    dev, dtype = ctx["device"], ctx["dtype"]
    if len(set(lens)) > 1:
        tag = "ragged"
    elif op == "decode":
        tag = f"L{_size(lens[0] + 1)}"
    else:
        tag = f"pre{_size(lens[0])}-E{new}"
    case = f"{m.name}-B{len(lens)}-{tag}-P{page}"
    ctx["n"] += 1
    st = build_state(m, lens, page, dev, dtype, seed=ctx["n"], extra_per_req=max(new, 1) + 1)
    fb, q, k, v, q_pos = decode_batch(st, seed=7) if op == "decode" else extend_batch(st, new, seed=7)
    want_w = reference(st, q, k, v, q_pos, m.w)
    want_w1 = reference(st, q, k, v, q_pos, m.w - 1)
    backends = make_backends(st)
    checks, prepared = {}, {}
    os.environ["TRITON_SWA_POISON"] = "1"
    poison.refresh_poison_env()
    for name, be in backends.items():
        try:
            be.init_forward_metadata(fb)
            out = forward(be, st, fb, q, k, v, poison=True)
            checks[name] = check(name, op, out, st, want_w, want_w1)
        except Exception as e:  # a provider that cannot run the case is reported, not hidden
            checks[name] = Check(
                name, float("nan"), float("nan"), False, False, int(name == "sglang_triton"), f"{type(e).__name__}: {str(e)[:300]}"
            )
    os.environ["TRITON_SWA_POISON"] = "0"
    poison.refresh_poison_env()
    line = f"CHECK {op:<6} {case:<44} drift {100 * st.drift:5.1f}%  " + "  ".join(
        f"{c.provider}: {c.verdict()} err(W) {c.err_w:.2e} err(W-1) {c.err_w1:.2e}" for c in checks.values()
    )
    print(line, flush=True)
    for c in checks.values():
        if not c.ok:
            print(f"    {c.provider}: {c.why}", flush=True)
    ctx["checks"].append((op, case, checks))
    if not timed:
        return
    nbytes, flops = case_cost(st, q_pos, op)
    timer = ctx["timer"]
    for name, be in backends.items():
        if not checks[name].ok:
            continue
        try:
            be.init_forward_metadata(fb)
            call, static_out, how = timer.prepare(lambda be=be, st=st: forward(be, st, fb, q, k, v, poison=False))
        except Exception as e:
            print(f"    {name}: not timed ({type(e).__name__}: {str(e)[:200]})", flush=True)
            continue
        if static_out is not None:
            # the replayed graph must give what was checked (a replay that keeps stale state would not)
            ok, why = _close(static_out.view(-1, m.hq, m.d), want_w1 if checks[name].judged else want_w, f"{name} graph replay")
            if not ok:
                print(f"    {name}: WRONG under graph replay, not timed: {why}", flush=True)
                checks[name].ok_w = checks[name].ok_w1 = False
                continue
        prepared[name] = (call, how)
    times = {name: [] for name in prepared}
    for _ in range(args.rounds):
        for name, (call, _how) in prepared.items():
            times[name] += timer.run(call, max(1, args.reps // args.rounds))
    rows = []
    for name, (_call, how) in prepared.items():
        p20, p50, p80 = quantiles(times[name])
        tbps = nbytes / (p50 * 1e-6) / 1e12
        rows.append(
            dict(
                op=op,
                case=case,
                provider=name,
                us_p50=round(p50, 2),
                us_p20=round(p20, 2),
                us_p80=round(p80, 2),
                bytes=int(nbytes),
                flops=int(flops),
                tbps=round(tbps, 4),
                tflops=round(flops / (p50 * 1e-6) / 1e12, 3),
                pct_copy=round(100 * tbps / ctx["copy_tbps"], 1),
                copy_tbps=round(ctx["copy_tbps"], 3),
                gpu=ctx["gpu"],
                torch=torch.__version__,
                triton=ctx["triton"],
                git_sha=args.git_sha,
                date=ctx["date"],
            )
        )
        ctx["how"][(op, case, name)] = how
    if rows:
        print(
            "TIME   "
            + f"{case:<44} "
            + "  ".join(
                f"{r['provider']}: {r['us_p50']:.2f} us ({ctx['how'][(op, case, r['provider'])]}, {r['pct_copy']}% copy)" for r in rows
            ),
            flush=True,
        )
    ctx["rows"] += rows
    ctx["save"](rows)
    del backends, prepared, st
    if dev == "cuda":
        torch.cuda.empty_cache()


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.cpu_smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton
    if not args.git_sha and not args.cpu_smoke:
        print("bench_sglang_triton: refusing to write rows without --git-sha (the device copy has no .git)", file=sys.stderr)
        return 2
    sys.path.insert(0, REPO)
    stubbed = _load_stubs()
    import torch
    import triton

    from triton_swa.benchmark.runner import SPEC_COLUMNS as COLUMNS  # the columns of docs/contract.md §7

    device = "cpu" if args.cpu_smoke or not torch.cuda.is_available() else "cuda"
    if device == "cpu" and not args.cpu_smoke:
        print("bench_sglang_triton: no CUDA; use --cpu-smoke", file=sys.stderr)
        return 2
    publish_sglang_context(device)
    import sglang

    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu-interpreter"
    # The smoke runs in float32: SGLang's Triton kernels give garbage on bf16 pools in Triton 3.6's
    # interpreter (~1e8 everywhere; float32 agrees to 1e-7), triton-swa's are right in both.
    dtype = getattr(torch, args.smoke_dtype) if args.cpu_smoke else torch.bfloat16
    ctx = dict(
        device=device,
        dtype=dtype,
        rows=[],
        checks=[],
        n=0,
        how={},
        gpu=gpu,
        triton=triton.__version__,
        date=_dt.date.today().isoformat(),
        timer=None,
        copy_tbps=float("nan"),
    )
    print(
        f"bench_sglang_triton: {gpu}, torch {torch.__version__}, triton {triton.__version__}, sglang "
        f"{getattr(sglang, '__version__', '?')}, stubs {stubbed or 'none'}, git_sha {args.git_sha}",
        flush=True,
    )
    ctx["timer"] = Timer(device)
    ctx["copy_tbps"] = copy_ceiling_tbps(device)
    print(f"copy ceiling {ctx['copy_tbps']:.3f} TB/s", flush=True)

    path = None
    if args.git_sha:  # the smoke writes rows only when asked to (with a sha), to check the row path
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"sglang-triton-{ctx['date']}-{gpu.replace(' ', '_')}.csv")

    def save(rows):
        if path is None or not rows:
            return
        new_file = not os.path.exists(path)
        with open(path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            if new_file:
                w.writeheader()
            w.writerows(rows)

    ctx["save"] = save
    cases = []  # (op, model, lens, page, timed, new), cheapest and most telling first
    if args.cpu_smoke:
        for m in SMOKE_MODELS:
            for page in (1, 4):
                cases.append(("decode", m, [5, m.w + 9, 3 * m.w + 2], page, True, 0))
                cases.append(("extend", m, [0, 6, 2 * m.w + 3], page, False, 5))
    else:
        if not args.no_probes:
            for m in PROBE_MODELS:
                for page in (1, 16):
                    cases.append(("decode", m, [1, m.w - 1, m.w, m.w + 1, 5 * m.w + 3, 200], page, False, 0))
                    cases.append(("extend", m, [0, 3, m.w + 2, 4 * m.w + 1], page, False, m.w + 6))
        models = [MODELS[n] for n in args.models.split(",") if n]
        for m in models:
            for page in _ints(args.pages):
                for L in _ints(args.ctx):
                    for B in _ints(args.batch):
                        cases.append(("decode", m, [L - 1] * B, page, True, 0))
        if args.extend:
            names, bs, prefixes, new = args.extend.split(":")
            for m in [MODELS[n] for n in names.split(",") if n]:
                for page in _ints(args.pages):
                    for P in _ints(prefixes):
                        for B in _ints(bs):
                            cases.append(("extend", m, [P] * B, page, True, int(new)))
    t0 = time.time()
    skipped = 0
    for op, m, lens, page, timed, new in cases:
        if time.time() - t0 > args.budget_s:
            skipped += 1
            continue
        run_case(op, m, lens, page, args, ctx, timed=timed, new=new)
    print(
        f"== {len(ctx['checks'])} cases in {time.time() - t0:.0f} s"
        + (f"; {skipped} skipped past --budget-s {args.budget_s:.0f}" if skipped else ""),
        flush=True,
    )
    wrong = [(op, case, c.provider) for op, case, cs in ctx["checks"] for c in cs.values() if not c.ok]
    print_tables(ctx, wrong, path if ctx["rows"] else None)
    return 0


def print_tables(ctx, wrong, path) -> None:
    print(
        "\nagreement: max abs error against triton_swa_reference (float64) at window W and W-1; "
        "'!' marks the reference a provider is judged at and fails"
    )
    print(f"{'op':<7}{'case':<44}{'triton_swa W':>13}{'W-1':>10}{'sglang W':>11}{'W-1':>10}  verdicts")
    for op, case, cs in ctx["checks"]:
        t, s = cs["triton_swa"], cs["sglang_triton"]

        def mark(c, j):
            return "!" if c.judged == j and not c.ok else " "

        print(
            f"{op:<7}{case:<44}{t.err_w:>12.2e}{mark(t, 0)}{t.err_w1:>9.2e}{mark(t, 1)}"
            f"{s.err_w:>10.2e}{mark(s, 0)}{s.err_w1:>9.2e}{mark(s, 1)}  {t.verdict()} / {s.verdict()}"
        )
    print(f"WRONG: {', '.join('/'.join(w) for w in wrong)}" if wrong else "WRONG: none")
    by_case = {}
    for r in ctx["rows"]:
        by_case.setdefault((r["op"], r["case"]), {})[r["provider"]] = r
    print(f"\n{'op':<7}{'case':<44}{'triton_swa us':>14}{'sglang us':>11}{'ratio':>7}{'tsw %copy':>10}{'sgl %copy':>10}")
    for (op, case), rs in by_case.items():
        t, s = rs.get("triton_swa"), rs.get("sglang_triton")
        tu = f"{t['us_p50']:.2f}" if t else "-"
        su = f"{s['us_p50']:.2f}" if s else "-"
        ratio = f"{s['us_p50'] / t['us_p50']:.2f}" if t and s else "-"
        print(
            f"{op:<7}{case:<44}{tu:>14}{su:>11}{ratio:>7}{t['pct_copy'] if t else '-':>10}"
            f"{s['pct_copy'] if s else '-':>10}" + ("" if all(ctx["how"].get((op, case, p)) == "graph" for p in rs) else "  (eager)")
        )
    print(
        f"copy ceiling {ctx['copy_tbps']:.3f} TB/s; ratio = sglang_triton / triton_swa (p50)"
        + (f"; rows in {path}" if path else "; no rows written")
    )


if __name__ == "__main__":
    sys.exit(main())
