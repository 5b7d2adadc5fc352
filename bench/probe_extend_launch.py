"""Is a short prefill bound by the host? Eager calls against CUDA-graph replay of the same calls.

The N = 2048 prefill rows of ``bench_extend.py`` (eager calls, one request, W = 1023, 32/8 heads,
D 128) run slower than FlexAttention while N = 8192 runs faster. This probe times, per N:

- ``eager``: the calls as ``bench_extend.py`` makes them (Python launcher, Triton's JIT dispatch);
- ``graph``: the same calls captured once in a CUDA graph and replayed (GPU time alone);
- ``host``: wall-clock per call of a 16-token prefill issued back to back (the GPU work is tiny, so
  the host's launch path sets the pace).

    python bench/probe_extend_launch.py        # prints a table; nothing is saved
"""

from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_extend import build_set, extend_call  # noqa: E402
from bench.harness import time_rotated  # noqa: E402


def host_us_per_call(fn, calls: int = 400) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main():
    hq, h, d = 32, 8, 128
    gen = torch.Generator().manual_seed(5)
    print(f"{'N':>6} {'page':>4} {'eager us':>9} {'graph us':>9}")
    for n in (2048, 8192):
        for page_size in (1, 16):
            sets = [build_set([0], [n], hq, h, d, d, page_size, gen) for _ in range(3)]
            fns = [extend_call(s, page_size, n) for s in sets]
            eager = time_rotated(fns)[1]
            graph = time_rotated(fns, use_graph=True)[1]
            print(f"{n:>6} {page_size:>4} {eager:>9.1f} {graph:>9.1f}", flush=True)
    tiny = build_set([0], [16], hq, h, d, d, 1, gen)
    print(f"host: {host_us_per_call(extend_call(tiny, 1, 16)):.1f} us per 16-token call, issued back to back")


if __name__ == "__main__":
    main()
