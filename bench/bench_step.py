"""One decode step of a 48-layer Gemma-4-like stack through the backend, on the GPU.

40 sliding layers (32 query / 16 KV heads, head dim 256, W = 1023) and 8 full layers (32 / 4 heads,
head dim 512), B = 64 requests of 4k tokens, page size 1, bf16. Measured, each as a median of
CUDA-event timings:

- ``metadata``: ``init_forward_metadata`` (the fused index builds of the step, once per step);
- ``attention_sum``: the sum over layers of the attention kernel alone (``swa_decode``);
- ``step``: the whole step (metadata, then per layer the K/V store and the attention kernel),
  replayed from a CUDA graph as an engine runs decode.

Target (issue 6): metadata at most 5% of the step. Rows go to ``bench/results/step-*.csv``.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.harness import Recorder, time_rotated  # noqa: E402
from triton_swa import ReqToTokenPool, SWAKVPool, SWATokenToKVPoolAllocator  # noqa: E402
from triton_swa.backend import TritonSWAAttnBackend  # noqa: E402
from triton_swa.engine import AttentionLayer, ForwardBatch, ForwardMode, ModelRunner  # noqa: E402
from triton_swa.ops.decode import swa_decode  # noqa: E402


def build(batch: int, context: int, window_left: int, n_sliding: int, n_full: int, dtype=torch.bfloat16):
    dev = "cuda"
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
    for sub in (pool.swa_kv_pool, pool.full_kv_pool):
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--window-left", type=int, default=1023)
    p.add_argument("--sliding", type=int, default=40)
    p.add_argument("--full", type=int, default=8)
    args = p.parse_args(argv)
    runner, layers, fb = build(args.batch, args.context, args.window_left, args.sliding, args.full)
    backend = TritonSWAAttnBackend(runner)
    qs = {
        256: torch.randn(args.batch, 32, 256, device="cuda", dtype=torch.bfloat16),
        512: torch.randn(args.batch, 32, 512, device="cuda", dtype=torch.bfloat16),
    }
    ks = {lay.layer_id: torch.randn(args.batch, lay.tp_k_head_num, lay.head_dim, device="cuda", dtype=torch.bfloat16) for lay in layers}

    def step():
        backend.init_forward_metadata(fb)
        for lay in layers:
            backend.forward_decode(qs[lay.head_dim], ks[lay.layer_id], ks[lay.layer_id], lay, fb)

    rec = Recorder.start("step")
    case = f"g4-{args.sliding}s{args.full}f-B{args.batch}-L{args.context // 1024}k-W{args.window_left}"
    t_meta = time_rotated([lambda: backend.init_forward_metadata(fb)], reps=50)
    backend.init_forward_metadata(fb)
    meta = backend.forward_metadata
    attn = []
    for lay in layers:
        idx = meta.sliding if lay.sliding_window_size >= 0 else meta.full
        k_buf, v_buf = backend.kv_pool.get_kv_buffer(lay.layer_id)
        fn = lambda lay=lay, idx=idx, k_buf=k_buf, v_buf=v_buf: swa_decode(
            qs[lay.head_dim],
            k_buf,
            v_buf,
            kv_indptr=idx.kv_indptr,
            kv_indices=idx.kv_indices,
            sm_scale=lay.scaling,
            max_window=idx.max_window,
        )
        attn.append(time_rotated([fn], reps=10, use_graph=True))
    attn_sum = tuple(sum(t[i] for t in attn) for i in range(3))
    t_eager = time_rotated([step], reps=10)
    t_graph = time_rotated([step], reps=10, use_graph=True)
    window_bytes = sum(
        args.batch
        * (min(args.context, args.window_left + 1) if lay.sliding_window_size >= 0 else args.context)
        * lay.tp_k_head_num
        * (lay.head_dim + lay.v_head_dim)
        * 2
        for lay in layers
    )
    rec.add(case, "metadata", t_meta, 0, 0)
    rec.add(case, "attention_sum", attn_sum, window_bytes, 0)
    rec.add(case, "step_graph", t_graph, window_bytes, 0)
    rec.add(case, "step_eager", t_eager, window_bytes, 0)
    print(f"saved {rec.save()}")
    print(rec.table())
    print(
        f"metadata / step (graph): {100 * t_meta[1] / t_graph[1]:.2f}% (target <= 5%); step / attention sum: {t_graph[1] / attn_sum[1]:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
