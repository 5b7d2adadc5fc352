"""Host cost of the step path, eager and under CUDA-graph replay, for one source tree (issue 24's table).

    python3 bench/host_cost.py --tree PATH [--batch 1 64]

For a 48-layer Gemma-4-like stack (``bench/bench_step.py``'s ``build`` of that tree, 4k context):
- ``metadata_us``: ``init_forward_metadata`` per step, eager wall time (host and GPU, synchronised);
- ``decode_layer_eager_us``: one layer's ``forward_decode`` (K/V store + attention), eager, wall time
  per call over 48 x 20 back-to-back calls (host-bound where the GPU keeps up);
- ``decode_layer_graph_us``: the same 48 calls captured in one CUDA graph, replayed: GPU time per layer;
- ``extend_eager_us`` / ``extend_graph_us``: one ``swa_extend`` call (a 256-token chunk over a
  1023-token window prefix, Gemma-3-like heads), eager wall time and graph-replay GPU time.
Medians of 7 rounds. Prints one ``ROW tree metric batch value`` line each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def _wall(fn, reps: int) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1e6


def _graph_us(fn, reps: int = 20) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def _decode_rows(build, backend_cls, batch: int) -> list:
    runner, layers, fb = build(batch, 4096, 1023, 40, 8)
    backend = backend_cls(runner)
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(heads, dim):
        return torch.randn(batch, heads * dim, device="cuda", dtype=torch.bfloat16, generator=g)

    qkv = [(rand(32, lay.head_dim), rand(lay.tp_k_head_num, lay.head_dim), rand(lay.tp_k_head_num, lay.head_dim)) for lay in layers]

    def step_layers():
        for lay, (q, k, v) in zip(layers, qkv):
            backend.forward_decode(q, k, v, lay, fb)

    backend.init_forward_metadata(fb)
    step_layers()
    meta = [_wall(lambda: backend.init_forward_metadata(fb), 20) for _ in range(7)]
    eager = [_wall(step_layers, 20) / len(layers) for _ in range(7)]
    graph = [_graph_us(step_layers) / len(layers) for _ in range(7)]
    return [
        ("metadata_us", batch, statistics.median(meta)),
        ("decode_layer_eager_us", batch, statistics.median(eager)),
        ("decode_layer_graph_us", batch, statistics.median(graph)),
    ]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tree", required=True)
    p.add_argument("--name", default=None)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    a = p.parse_args()
    sys.path.insert(0, a.tree)
    from bench.bench_step import build
    from triton_swa.backend import TritonSWAAttnBackend
    from triton_swa.ops.extend import swa_extend

    name = a.name or a.tree
    rows = []
    for batch in a.batch:
        rows += _decode_rows(build, TritonSWAAttnBackend, batch)
        torch.cuda.empty_cache()
    # one prefill chunk: 256 new tokens over a 1023-token window prefix, 32 / 16 heads, D 128
    B, new, prefix, HQ, H, D = 1, 256, 1023, 32, 16, 128
    q = torch.randn(B * new, HQ, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B * new, H, D, device="cuda", dtype=torch.bfloat16)
    kb = torch.randn(prefix + 8, H, D, device="cuda", dtype=torch.bfloat16)
    qo = torch.tensor([0, new], dtype=torch.int32, device="cuda")
    pl = torch.tensor([prefix], dtype=torch.int32, device="cuda")
    idx = dict(
        kv_indptr=torch.tensor([0, prefix], dtype=torch.int32, device="cuda"),
        kv_indices=torch.arange(1, prefix + 1, dtype=torch.int32, device="cuda"),
    )

    def chunk():
        swa_extend(q, k, k, kb, kb, qo, pl, window_left=1023, max_extend_len=new, **idx)

    chunk()
    rows.append(("extend_eager_us", B, statistics.median(_wall(chunk, 50) for _ in range(7))))
    rows.append(("extend_graph_us", B, statistics.median(_graph_us(chunk) for _ in range(7))))
    for metric, batch, value in rows:
        print(f"ROW {name} {metric} {batch} {value:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
