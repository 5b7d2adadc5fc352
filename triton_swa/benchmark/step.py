"""Op ``step`` of ``triton-swa bench``: a model step's cost, eager and under CUDA-graph replay (issue 24's table).

    triton-swa bench --op step [--batch 1,8,64] [--verify-batch 1,8] [--rounds 7] [--no-flashinfer]
    triton-swa bench --op step --compare before=.ab/before      # two source trees side by side

On a 48-layer Gemma-4-like stack (:func:`build`, through the measured tree's public pools and engine
classes: 40 sliding layers of
32 / 16 heads, head dim 256, W = 1023, and 8 full layers of 32 / 4 heads, head dim 512; page size 1,
bf16, 4k context), in microseconds:

- ``launch_floor_us``: one bare ``torch`` launch (``x.add_(1)`` on a small tensor), eager, per call;
- per decode batch (``--batch``): ``metadata_us`` (``init_forward_metadata``, eager, per step);
  ``decode_layer_eager_us`` / ``decode_layer_graph_us`` (a layer's ``forward_decode``: K/V store and
  attention, over the 48 layers); ``step_eager_us`` / ``step_graph_us`` (the whole step: metadata and
  48 layers); ``swa_decode_eager_us`` / ``swa_decode_graph_us`` (``swa_decode`` alone on the step's
  indices, one sliding layer's shape); where the tree has ``swa_decode_plan``: ``swa_decode_plan_us``
  (making the plan, per step) and ``swa_decode_plan_run_eager_us`` / ``..._graph_us`` (its ``run``);
- per verify batch (``--verify-batch``, 8 drafts after a 4088-token prefix, TARGET_VERIFY):
  ``verify_metadata_us``, ``verify_layer_eager_us`` / ``verify_layer_graph_us`` (``forward_extend``
  over the 48 layers) and ``verify_sliding_layer_eager_us`` (one sliding layer, called back to back);
  ``swa_extend_verify_eager_us`` / ``..._graph_us`` (``swa_extend`` called directly on that sliding
  layer's verify shape, FlashInfer's prefill shape, checked against the backend's output first) and
  ``swa_extend_plan_run_verify_eager_us`` (``swa_extend_plan(...).run`` there);
- an extend chunk (EXTEND, B = 1, 256 new tokens over a 1023-token prefix): ``extend_chunk_metadata_us``
  and ``extend_chunk_layer_eager_us`` / ``..._graph_us`` (``forward_extend`` over the 48 layers);
  ``extend_eager_us`` / ``extend_graph_us``: one ``swa_extend`` call alone (the same chunk, Gemma-3-like
  heads: 32 / 16, head dim 128);
- FlashInfer (where importable: ``.peers/flashinfer_site`` from ``bash scripts/fetch_peers.sh``, or
  ``$TRITON_SWA_PEERS``, else an installed one): ``fi_decode_tc_*`` / ``fi_decode_cc_*``
  (``BatchDecodeWithPagedKVCacheWrapper`` with tensor cores / CUDA cores, fa2) on the decode shape of
  ``swa_decode_*`` and ``fi_prefill_*`` (``BatchPrefillWithPagedKVCacheWrapper``, fa2) on the verify
  shape of one sliding layer, both reading the stack's own pool at the step's window slots:
  ``*_run_us`` (``run``, eager, per call), ``*_graph_us`` (``run`` under graph replay), ``*_plan_us``
  (``plan``, per step) and ``*_max_abs_diff`` (its output against the tree's, checked first).
  Its kernels are JIT-built on first use (15-45 s each): a child process builds them first, and no
  row is timed before it is done (host-bound rows beside a compiler measure the compiler).

Eager rows are wall time per call over back-to-back calls (the host's cost wherever it exceeds the
GPU's); graph rows are GPU time per call of the same calls captured in one CUDA graph and replayed.
Medians of ``--rounds`` rounds. Prints one ``ROW tree metric batch value`` line each (``n/a`` where the
tree or the machine lacks what a row needs: an older tree, ``--compare before=.ab/before``, gets ``n/a``
for the newer APIs), then a table of them; the rows go to the run's CSV as op ``step`` (case
``<stack>-B<batch>``, provider the metric; ``max_abs_diff`` rows in ``max_abs_err``).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import sys
import time

import torch

CONTEXT, WINDOW_LEFT, SLIDING, FULL = 4096, 1023, 40, 8
DRAFTS = 8
CHUNK, CHUNK_PREFIX = 256, 1023
FLASHINFER_WORKSPACE_BYTES = 256 * 2**20
NA = math.nan
STACK = f"g4-{SLIDING}s{FULL}f-L{CONTEXT // 1024}k-W{WINDOW_LEFT}"
# FlashInfer's modules this op uses (bf16, head dim 256, sliding), in the order it uses them: the fa2
# prefill module (tensor-core decode's too), then CUDA-core decode
FLASHINFER_KEYS = [["prefill", "bfloat16", 256, True], ["decode", "bfloat16", 256, True]]


def build(batch: int, context: int, window_left: int, n_sliding: int, n_full: int, dtype=None, device: str = "cuda", fill: bool = True):
    """The stack: SWA pools of the batch's requests (full slots for every token, SWA slots for the last
    ``W + 1``, both shuffled), the engine's runner, the layers and a decode batch; ``fill``: random K/V
    (host-only rows leave the pools zero)."""
    from triton_swa import ReqToTokenPool, SWAKVPool, SWATokenToKVPoolAllocator
    from triton_swa.engine import AttentionLayer, ForwardBatch, ForwardMode, ModelRunner

    dtype = dtype or torch.bfloat16
    dev = device
    swa_ids = [i for i in range(n_sliding + n_full) if (i + 1) % 6 != 0][:n_sliding]
    full_ids = [i for i in range(n_sliding + n_full) if i not in swa_ids]
    size = batch * (context + 1)
    size_swa = batch * (window_left + 2)
    pool = SWAKVPool(
        size,
        size_swa,
        1,
        dtype,
        swa_attention_layer_ids=swa_ids,
        full_attention_layer_ids=full_ids,
        device=dev,
        swa_head_num=16,
        swa_head_dim=256,
        full_head_num=4,
        full_head_dim=512,
    )
    alloc = SWATokenToKVPoolAllocator(size, size_swa, 1, dtype, dev, pool)
    g = torch.Generator(device="cpu").manual_seed(0)
    alloc.full_attn_allocator.shuffle_free_list(g)
    alloc.swa_attn_allocator.shuffle_free_list(g)
    rtp = ReqToTokenPool(batch, context + 1, dev)
    rows = torch.tensor(rtp.alloc(batch), device=dev)
    # Full slots for every token; SWA slots only for the window (older tokens evicted).
    full = alloc.full_attn_allocator.alloc(batch * context).view(batch, context)
    rtp.req_to_token[rows, :context] = full.int()
    keep = full[:, context - (window_left + 1) :].reshape(-1)
    alloc.full_to_swa_index_mapping[keep] = alloc.swa_attn_allocator.alloc(keep.numel())
    for sub in (pool.swa_kv_pool, pool.full_kv_pool) if fill else ():
        for buf in sub.k_buffer + sub.v_buffer:
            buf.normal_()
    runner = ModelRunner(pool, alloc, rtp, sliding_window_size=window_left, device=dev)
    layers = [
        AttentionLayer(i, 32, 16, 256, sliding_window_size=window_left) if i in swa_ids else AttentionLayer(i, 32, 4, 512)
        for i in range(n_sliding + n_full)
    ]
    seq = torch.full((batch,), context, dtype=torch.int64, device=dev)
    out_loc = full[:, -1].contiguous()
    fb = ForwardBatch(ForwardMode.DECODE, batch, rows, seq, out_loc, seq_lens_cpu=seq.cpu())
    return runner, layers, fb


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _wall(fn, reps: int) -> float:
    _sync()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    _sync()
    return (time.perf_counter() - t) / reps * 1e6


def _graph_us(fn, reps: int = 20) -> float:
    """GPU time of one replay of ``fn`` captured in a CUDA graph (warmed up on a side stream first);
    NaN, with the reason printed, when it cannot be captured."""
    try:
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
            fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - a call that cannot be captured gets n/a, not a crash
        print(f"# graph capture failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        try:
            torch.cuda.synchronize()
        except Exception as late:  # noqa: BLE001 - a failed capture can leave its error behind once
            print(f"# after the failed capture: {type(late).__name__}: {str(late)[:200]}", flush=True)
        return NA
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def _median(measure, rounds: int) -> float:
    values = [measure() for _ in range(rounds)]
    return NA if any(math.isnan(v) for v in values) else statistics.median(values)


class Bench:
    """One tree's measurements: its APIs, the rows, and what FlashInfer is compared on."""

    def __init__(self, name: str, rounds: int, host_only: bool = False):
        import triton_swa
        from triton_swa.backend import TritonSWAAttnBackend
        from triton_swa.engine import ForwardBatch, SpecInfo

        self.ts, self.build, self.backend_cls = triton_swa, build, TritonSWAAttnBackend
        self.ForwardBatch, self.SpecInfo = ForwardBatch, SpecInfo
        self.name, self.rounds = name, rounds
        self.rows = []  # (metric, batch, value)
        self.fi_decode, self.fi_verify = [], []  # the shapes FlashInfer runs on, with the tree's outputs
        # host-only rows: the CPU, launches stubbed out (nothing computed, so nothing compared), no graphs
        self.host_only = host_only
        self.device = "cpu" if host_only else "cuda"

    def _graph(self, fn, reps: int = 20) -> float:
        return NA if self.host_only else _graph_us(fn, reps)

    def add(self, metric: str, batch: int, value: float) -> None:
        self.rows.append((metric, batch, value))
        print(f"ROW {self.name} {metric} {batch} {_fmt(metric, value)}", flush=True)

    def timed(self, metric: str, batch: int, measure) -> None:
        """``measure`` (one round) over the rounds; n/a when it raises (the reason printed)."""
        try:
            value = _median(measure, self.rounds)
        except Exception as exc:  # noqa: BLE001 - an API the tree lacks, or a call it rejects
            print(f"# {metric} B{batch}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            _sync()
            value = NA
        self.add(metric, batch, value)

    # ---- the stack ----

    def stack(self, batch: int, context: int):
        runner, layers, fb = self.build(batch, context, WINDOW_LEFT, SLIDING, FULL, device=self.device, fill=not self.host_only)
        return runner, layers, fb, self.backend_cls(runner)

    @staticmethod
    def alias_unmapped(runner, fb, lo: int, hi: int) -> None:
        """Give positions ``[lo, hi)`` of every request, which the build left without SWA slots (it maps
        the last W + 1 positions of its context), the SWA slots of the positions right after: a verify
        or extend window reaches back there, and reads live slots then."""
        req_to_token = runner.req_to_token_pool.req_to_token
        mapping = runner.token_to_kv_pool_allocator.full_to_swa_index_mapping
        rows = fb.req_pool_indices
        mapping[req_to_token[rows, lo:hi].long()] = mapping[req_to_token[rows, hi : 2 * hi - lo].long()]

    def inputs(self, layers, tokens: int, seed: int = 0) -> list:
        g = torch.Generator(device=self.device).manual_seed(seed)

        def rand(heads, dim):
            return torch.randn(tokens, heads * dim, device=self.device, dtype=torch.bfloat16, generator=g)

        return [
            (rand(lay.tp_q_head_num, lay.head_dim), rand(lay.tp_k_head_num, lay.head_dim), rand(lay.tp_k_head_num, lay.head_dim))
            for lay in layers
        ]

    # ---- rows ----

    def floor(self) -> None:
        x = torch.zeros(16, device=self.device)
        x.add_(1)
        self.timed("launch_floor_us", 1, lambda: _wall(lambda: x.add_(1), 960))

    def decode(self, batch: int) -> None:
        runner, layers, fb, backend = self.stack(batch, CONTEXT)
        qkv = self.inputs(layers, batch)

        def step_layers():
            for lay, (q, k, v) in zip(layers, qkv):
                backend.forward_decode(q, k, v, lay, fb)

        def step():
            backend.init_forward_metadata(fb)
            step_layers()

        n = len(layers)
        backend.init_forward_metadata(fb)
        step_layers()
        self.timed("metadata_us", batch, lambda: _wall(lambda: backend.init_forward_metadata(fb), 20))
        backend.init_forward_metadata(fb)
        self.timed("decode_layer_eager_us", batch, lambda: _wall(step_layers, 20) / n)
        self.timed("decode_layer_graph_us", batch, lambda: self._graph(step_layers) / n)
        self.timed("step_eager_us", batch, lambda: _wall(step, 20))
        self.timed("step_graph_us", batch, lambda: self._graph(step))

        # swa_decode alone on the step's indices (metadata rebuilt eagerly: the graph's own is gone)
        backend.init_forward_metadata(fb)
        i, lay = next((i, lay) for i, lay in enumerate(layers) if lay.sliding_window_size >= 0)
        idx = backend.forward_metadata.sliding
        k_buf, v_buf = backend.kv_pool.get_kv_buffer(lay.layer_id)
        q = qkv[i][0].view(batch, lay.tp_q_head_num, lay.head_dim)
        out = torch.empty_like(q)
        kw = dict(kv_indptr=idx.kv_indptr, kv_indices=idx.kv_indices, sm_scale=lay.scaling, max_window=idx.max_window)

        def op():
            self.ts.swa_decode(q, k_buf, v_buf, out=out, **kw)

        op()
        self.timed("swa_decode_eager_us", batch, lambda: _wall(op, n * 20))
        self.timed("swa_decode_graph_us", batch, lambda: self._graph(lambda: [op() for _ in range(n)]) / n)
        make_plan = getattr(self.ts, "swa_decode_plan", None)
        if make_plan is None:
            print("# swa_decode_plan: not in this tree", flush=True)
            for metric in ("swa_decode_plan_us", "swa_decode_plan_run_eager_us", "swa_decode_plan_run_graph_us"):
                self.add(metric, batch, NA)
        else:
            holder = {}

            def plan():
                holder["plan"] = make_plan(q, k_buf, v_buf, **kw)

            def run():
                holder["plan"].run(q, k_buf, v_buf, out)

            self.timed("swa_decode_plan_us", batch, lambda: _wall(plan, 20))
            self.timed("swa_decode_plan_run_eager_us", batch, lambda: _wall(run, n * 20))
            self.timed("swa_decode_plan_run_graph_us", batch, lambda: self._graph(lambda: [run() for _ in range(n)]) / n)
        op()
        if idx.kv_indptr is not None and not self.host_only:  # FlashInfer reads the same pool at the same window slots
            self.fi_decode.append(
                dict(batch=batch, q=q, k=k_buf, v=v_buf, indptr=idx.kv_indptr, indices=idx.kv_indices, scale=lay.scaling, out=out.clone())
            )

    def verify(self, batch: int) -> None:
        runner, layers, fb0, backend = self.stack(batch, CONTEXT)
        prefix = CONTEXT - DRAFTS  # committed tokens; the drafts take the last positions
        self.alias_unmapped(runner, fb0, prefix - WINDOW_LEFT, CONTEXT - WINDOW_LEFT - 1)
        rows = fb0.req_pool_indices
        loc = runner.req_to_token_pool.req_to_token[rows, prefix:CONTEXT].reshape(-1).to(torch.int64)
        fb = self.ForwardBatch.verify(rows.tolist(), [prefix] * batch, self.SpecInfo(draft_token_num=DRAFTS), loc, device=self.device)
        qkv = self.inputs(layers, batch * DRAFTS, seed=1)

        def step_layers():
            for lay, (q, k, v) in zip(layers, qkv):
                backend.forward_extend(q, k, v, lay, fb)

        n = len(layers)
        backend.init_forward_metadata(fb)
        step_layers()
        self.timed("verify_metadata_us", batch, lambda: _wall(lambda: backend.init_forward_metadata(fb), 20))
        backend.init_forward_metadata(fb)
        self.timed("verify_layer_eager_us", batch, lambda: _wall(step_layers, 10) / n)
        self.timed("verify_layer_graph_us", batch, lambda: self._graph(step_layers) / n)
        i, lay = next((i, lay) for i, lay in enumerate(layers) if lay.sliding_window_size >= 0)
        q, k, v = qkv[i]
        self.timed("verify_sliding_layer_eager_us", batch, lambda: _wall(lambda: backend.forward_extend(q, k, v, lay, fb), n * 10))
        out = backend.forward_extend(q, k, v, lay, fb).view(-1, lay.tp_q_head_num, lay.head_dim).clone()
        idx = backend.forward_metadata.sliding
        self.extend_verify_op(batch, lay, (q, k, v), backend.kv_pool.get_kv_buffer(lay.layer_id), idx, prefix, out, n)
        if idx.kv_indptr is not None and not self.host_only:
            # FlashInfer reads the new tokens' K/V from the cache: each request's list is its prefix
            # window's slots, then its drafts' (where the layer call above wrote them)
            drafts = runner.token_to_kv_pool_allocator.full_to_swa_index_mapping[loc].view(batch, DRAFTS).to(torch.int32)
            ptr = idx.kv_indptr.tolist()
            lists = [torch.cat([idx.kv_indices[ptr[b] : ptr[b + 1]], drafts[b]]) for b in range(batch)]
            lens = torch.tensor([0] + [len(x) for x in lists], device=self.device)
            k_buf, v_buf = backend.kv_pool.get_kv_buffer(lay.layer_id)
            self.fi_verify.append(
                dict(
                    batch=batch,
                    q=q.view(-1, lay.tp_q_head_num, lay.head_dim),
                    k=k_buf,
                    v=v_buf,
                    qo_indptr=(torch.arange(batch + 1, device=self.device) * DRAFTS).to(torch.int32),
                    indptr=torch.cumsum(lens, 0).to(torch.int32),
                    indices=torch.cat(lists),
                    scale=lay.scaling,
                    out=out,
                )
            )

    def extend_verify_op(self, batch: int, lay, qkv: tuple, kv: tuple, idx, prefix: int, want: torch.Tensor, n: int) -> None:
        """``swa_extend`` called directly (and, where the tree has it, ``swa_extend_plan(...).run``) on
        the verify shape of one sliding layer: the shape FlashInfer's prefill rows run on, its inputs
        the step's (the layer's new rows as k/v, the prefix window's indices), checked against the
        backend's output first."""
        names = ("swa_extend_verify_eager_us", "swa_extend_verify_graph_us", "swa_extend_plan_run_verify_eager_us")
        if idx.kv_indptr is None:
            for name in names:
                self.add(name, batch, NA)
            return
        HQ, H, D = lay.tp_q_head_num, lay.tp_k_head_num, lay.head_dim
        q, k, v = (t.view(-1, heads, D) for t, heads in zip(qkv, (HQ, H, H)))
        k_buf, v_buf = kv
        qo_indptr = (torch.arange(batch + 1, device=self.device) * DRAFTS).to(torch.int32)
        prefix_lens = torch.full((batch,), prefix, dtype=torch.int32, device=self.device)
        kw = dict(window_left=WINDOW_LEFT, kv_indptr=idx.kv_indptr, kv_indices=idx.kv_indices, sm_scale=lay.scaling, max_extend_len=DRAFTS)
        out = torch.full_like(want, math.nan)

        def op():
            self.ts.swa_extend(q, k, v, k_buf, v_buf, qo_indptr, prefix_lens, out=out, **kw)

        try:
            op()
            _sync()
            diff = 0.0 if self.host_only else float((out.float() - want.float()).abs().max())
        except Exception as exc:  # noqa: BLE001 - an API the tree lacks, or a call it rejects
            print(f"# swa_extend on the verify shape B{batch}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            _sync()
            diff = math.nan
        if not diff <= 1e-2:  # the same tree's two paths: a difference is a defect, not a timing
            print(f"# swa_extend on the verify shape B{batch}: {diff} from the backend's output", flush=True)
            for name in names:
                self.add(name, batch, NA)
            return
        self.timed(names[0], batch, lambda: _wall(op, n * 10))
        self.timed(names[1], batch, lambda: self._graph(lambda: [op() for _ in range(n)]) / n)
        make_plan = getattr(self.ts, "swa_extend_plan", None)
        if make_plan is None:
            self.add(names[2], batch, NA)
            return
        plan = make_plan(q, k, v, k_buf, v_buf, qo_indptr, prefix_lens, **kw)
        self.timed(names[2], batch, lambda: _wall(lambda: plan.run(q, k, v, k_buf, v_buf, out), n * 10))

    def extend_chunk(self) -> None:
        runner, layers, fb0, backend = self.stack(1, CHUNK_PREFIX + CHUNK)
        self.alias_unmapped(runner, fb0, 0, CHUNK_PREFIX + CHUNK - WINDOW_LEFT - 1)
        rows = fb0.req_pool_indices
        loc = runner.req_to_token_pool.req_to_token[rows, CHUNK_PREFIX : CHUNK_PREFIX + CHUNK].reshape(-1).to(torch.int64)
        fb = self.ForwardBatch.extend(rows.tolist(), [CHUNK_PREFIX], [CHUNK], loc, device=self.device)
        qkv = self.inputs(layers, CHUNK, seed=2)

        def step_layers():
            for lay, (q, k, v) in zip(layers, qkv):
                backend.forward_extend(q, k, v, lay, fb)

        n = len(layers)
        backend.init_forward_metadata(fb)
        step_layers()
        self.timed("extend_chunk_metadata_us", 1, lambda: _wall(lambda: backend.init_forward_metadata(fb), 20))
        backend.init_forward_metadata(fb)
        self.timed("extend_chunk_layer_eager_us", 1, lambda: _wall(step_layers, 10) / n)
        self.timed("extend_chunk_layer_graph_us", 1, lambda: self._graph(step_layers) / n)

    def extend_op(self) -> None:
        """One ``swa_extend`` call: 256 new tokens over a 1023-token window prefix, 32 / 16 heads, D 128."""
        B, new, prefix, HQ, H, D = 1, CHUNK, CHUNK_PREFIX, 32, 16, 128
        q = torch.randn(B * new, HQ, D, device=self.device, dtype=torch.bfloat16)
        k = torch.randn(B * new, H, D, device=self.device, dtype=torch.bfloat16)
        kb = torch.randn(prefix + 8, H, D, device=self.device, dtype=torch.bfloat16)
        qo = torch.tensor([0, new], dtype=torch.int32, device=self.device)
        pl = torch.tensor([prefix], dtype=torch.int32, device=self.device)
        idx = dict(
            kv_indptr=torch.tensor([0, prefix], dtype=torch.int32, device=self.device),
            kv_indices=torch.arange(1, prefix + 1, dtype=torch.int32, device=self.device),
        )

        def chunk():
            self.ts.swa_extend(q, k, k, kb, kb, qo, pl, window_left=WINDOW_LEFT, max_extend_len=new, **idx)

        chunk()
        self.timed("extend_eager_us", B, lambda: _wall(chunk, 50))
        self.timed("extend_graph_us", B, lambda: self._graph(chunk))

    # ---- FlashInfer ----

    def flashinfer(self, modules) -> None:
        """FlashInfer's run (and plan) on the shapes the tree ran, its output checked against the tree's."""
        metrics = ("max_abs_diff", "run_us", "graph_us", "plan_us")
        names = [("fi_decode_tc", c) for c in self.fi_decode] + [("fi_decode_cc", c) for c in self.fi_decode]
        names += [("fi_prefill", c) for c in self.fi_verify]
        if isinstance(modules, str):
            print(f"# FlashInfer: {modules}", flush=True)
            for name, c in names:
                for m in metrics:
                    self.add(f"{name}_{m}", c["batch"], NA)
            return
        decode, prefill = modules
        workspace = torch.zeros(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        for name, c in names:
            B, q = c["batch"], c["q"]
            HQ, D, H = q.shape[1], q.shape[2], c["k"].shape[1]
            cache = (c["k"].view(-1, 1, H, D), c["v"].view(-1, 1, H, D))
            last_page_len = torch.ones(B, dtype=torch.int32, device="cuda")
            common = dict(window_left=WINDOW_LEFT, q_data_type=q.dtype, kv_data_type=c["k"].dtype, sm_scale=c["scale"])
            try:
                if name == "fi_prefill":
                    wrapper = prefill.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
                    args = (c["qo_indptr"], c["indptr"], c["indices"], last_page_len, HQ, H, D, 1)
                    common["causal"] = True
                else:
                    tc = name == "fi_decode_tc"
                    wrapper = decode.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tc, backend="fa2")
                    args = (c["indptr"], c["indices"], last_page_len, HQ, H, D, 1)
                plan = _bind(wrapper.plan, *args, **common)
                plan()  # builds its JIT module, or waits for the background build of it
                out = torch.empty_like(c["out"])
                run = _bind(wrapper.run, q, cache, out=out)
                run()
                torch.cuda.synchronize()
                diff = float((out.float() - c["out"].float()).abs().max())
            except Exception as exc:  # noqa: BLE001 - its error is the row's result
                print(f"# {name} B{B}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                for m in metrics:
                    self.add(f"{name}_{m}", B, NA)
                continue
            self.add(f"{name}_max_abs_diff", B, diff)
            reps = 48 * (20 if name != "fi_prefill" else 10)
            self.timed(f"{name}_run_us", B, lambda run=run, reps=reps: _wall(run, reps))
            self.timed(f"{name}_graph_us", B, lambda run=run: _graph_us(lambda: [run() for _ in range(48)]) / 48)
            self.timed(f"{name}_plan_us", B, lambda plan=plan: _wall(plan, 20))


def _bind(fn, *args, **kwargs):
    return lambda: fn(*args, **kwargs)


def _fmt(metric: str, value: float) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:.1f}" if metric.endswith("_us") else f"{value:.3g}"


def table(rows: list) -> str:
    """Markdown: a line per metric, a column per batch."""
    batches = sorted({b for _, b, _ in rows})
    value = {(m, b): v for m, b, v in rows}
    lines = ["| metric | " + " | ".join(f"B{b}" for b in batches) + " |", "|" + " --- |" * (len(batches) + 1)]
    for metric in dict.fromkeys(m for m, _, _ in rows):
        cells = [_fmt(metric, value[(metric, b)]) if (metric, b) in value else "" for b in batches]
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def measure(
    name: str, batches=(1, 8, 64), verify_batches=(1, 8), rounds: int = 7, flashinfer: bool = True, host_only: bool = False
) -> list:
    """Every row of one tree (the ``triton_swa`` this process imports), ``(metric, batch, value)``;
    FlashInfer's modules are built (in a child process) before anything is timed. ``host_only``: the
    eager rows' host path alone, on the CPU with every kernel launch stubbed out (:func:`stubbed_launches`;
    no GPU, no graph or FlashInfer rows, nothing computed): a proxy for comparing trees' host cost where
    no GPU is at hand, not a GPU host's figure."""
    if host_only:
        with stubbed_launches():
            bench = Bench(name, rounds, host_only=True)
            bench.floor()
            for batch in batches:
                bench.decode(batch)
            for batch in verify_batches:
                bench.verify(batch)
            bench.extend_chunk()
            bench.extend_op()
        print(f"\n== host-only cost of {bench.name} (us; CPU, launches stubbed)")
        print(table(bench.rows))
        return bench.rows
    import os

    from . import providers as P

    t0 = time.perf_counter()
    modules, child = None, None
    if flashinfer:
        # the background build and this process must build for the same architectures (the modules' names)
        os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "{}.{}".format(*torch.cuda.get_device_capability()))
        modules = P._flashinfer_modules()
        if not isinstance(modules, str):
            child = P.start_flashinfer_build(FLASHINFER_KEYS, errors=sys.stderr)
            # host-bound rows measured beside a compiler are not the host's cost: wait for the build
            t = time.perf_counter()
            child.wait()
            print(f"# FlashInfer's modules built in {time.perf_counter() - t:.0f} s, before any timing", flush=True)
    try:
        bench = Bench(name, rounds)
        bench.floor()
        for batch in batches:
            bench.decode(batch)
            torch.cuda.empty_cache()
        for batch in verify_batches:
            bench.verify(batch)
            torch.cuda.empty_cache()
        bench.extend_chunk()
        torch.cuda.empty_cache()
        bench.extend_op()
        if flashinfer:
            bench.flashinfer(modules)
    finally:
        P.stop_flashinfer_build(child)
    print(f"\n== host cost of {bench.name} (us; max_abs_diff: FlashInfer's output against the tree's), {time.perf_counter() - t0:.0f} s")
    print(table(bench.rows))
    return bench.rows


@contextlib.contextmanager
def stubbed_launches():
    """Every kernel launch of the ``triton_swa`` this process imports returns at once: the host path of
    each call runs up to Triton's launcher (the direct launches bound to a callable that does nothing),
    so its Python cost can be timed on a machine without a GPU. Restored on exit."""
    from triton_swa.runtime import launch

    saved = launch.Launcher.__call__, getattr(launch.Launcher, "bind", None)
    launch.Launcher.__call__ = lambda self, args, grid=None: None
    launch.Launcher.bind = lambda self, args, grid=None: _no_launch
    try:
        yield
    finally:
        launch.Launcher.__call__ = saved[0]
        if saved[1] is None:
            del launch.Launcher.bind
        else:
            launch.Launcher.bind = saved[1]


def _no_launch(args) -> None:
    return None


def compare_table(rows: dict) -> str:
    """Markdown: a line per (metric, batch), a column per tree, then each tree's value over the first's."""
    names = list(rows)
    value = {(n, m, b): v for n in names for m, b, v in rows[n]}
    keys = list(dict.fromkeys((m, b) for n in names for m, b, _ in rows[n]))
    head = "| metric | B | " + " | ".join(names) + " | " + " | ".join(f"{n} / {names[0]}" for n in names[1:]) + " |"
    lines = [head, "|" + " --- |" * (2 * len(names) + 1)]
    for m, b in keys:
        vals = [value.get((n, m, b), NA) for n in names]
        cells = [_fmt(m, v) for v in vals]
        ratios = [f"{v / vals[0]:.2f}x" if vals[0] and not (math.isnan(v) or math.isnan(vals[0])) else "-" for v in vals[1:]]
        lines.append(f"| {m} | {b} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines)


def csv_rows(rows: list, provider_prefix: str, sha: str, dirty: str, run_id: str) -> list[dict]:
    """The rows as docs/contract.md §7 rows of op ``step``: case ``<stack>-B<batch>``, provider the
    metric (prefixed by the tree's name in a comparison), the value in ``us_p50`` (a ``max_abs_diff``
    in ``max_abs_err``)."""
    import datetime

    from .runner import environment

    env, out = environment(), []
    for metric, batch, value in rows:
        diff = not metric.endswith("_us")
        us = NA if diff else round(value, 3)
        out.append(
            dict(
                op="step",
                case=f"{STACK}-B{batch}",
                provider=provider_prefix + metric,
                us_p50=us,
                us_p20=NA,
                us_p80=NA,
                bytes=0,
                flops=0,
                tbps=NA,
                tflops=NA,
                pct_copy=NA,
                copy_tbps=NA,
                **env,
                git_sha=sha,
                date=datetime.date.today().isoformat(),
                dirty=dirty,
                run_id=run_id,
                status="n/a" if math.isnan(value) else "ok",
                max_abs_err=value if diff else None,
                eager_us_p50=NA,
            )
        )
    return out


def profile(batch: int = 1, steps: int = 200, top: int = 30, metadata_only: bool = False) -> str:
    """Where one eager decode step's host time goes: ``steps`` steps (``init_forward_metadata``, then
    the 48 layers' ``forward_decode``; only the former with ``metadata_only``) of the stack at
    ``batch`` under cProfile, after a warm step; returns the ``top`` functions by own time, in
    microseconds per step."""
    import cProfile
    import pstats

    bench = Bench("profile", 1)
    runner, layers, fb, backend = bench.stack(batch, CONTEXT)
    qkv = bench.inputs(layers, batch)

    def step():
        backend.init_forward_metadata(fb)
        for lay, (q, k, v) in zip(layers, qkv if not metadata_only else ()):
            backend.forward_decode(q, k, v, lay, fb)

    step()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    wall = (time.perf_counter() - t0) / steps * 1e6
    torch.cuda.synchronize()
    stats = pstats.Stats(prof).stats
    what = "init_forward_metadata" if metadata_only else "step"
    head = f"== one eager B{batch} {what} under cProfile: {wall:.0f} us of wall per step (profiled)"
    lines = [head, "own us / cumulative us / calls, per step"]
    entries = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    for (path, line, name), (_, calls, own, cum, _) in entries:
        where = "/".join(path.split("/")[-2:])
        lines.append(f"{own / steps * 1e6:9.1f} {cum / steps * 1e6:9.1f} {calls / steps:7.1f}  {name} ({where}:{line})")
    return "\n".join(lines)
