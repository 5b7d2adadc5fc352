"""What the index guard (``triton_swa.runtime.guard``) costs: off (the default) against the undecorated op, and on.

Providers, on the same inputs in the same process (SPEC §7 rows, ``bench/results/guard-<date>-<gpu>.csv``):

- ``triton_swa_undecorated``: the op without the guard's wrapper (``swa_decode.__wrapped__``);
- ``triton_swa``: the public op as every caller gets it, guard off (no ``debug``, no environment);
- ``triton_swa_guard_on``: ``debug=True``: every index read back and checked before the launch (it
  synchronises, so it is never captured in a graph).

Each is timed eagerly (``time_rotated``: events around back-to-back calls, so the host's launch time
counts where it exceeds the kernel's), and its host time per call is recorded too, as provider
``<name>_host`` (``us_p50`` is the median host microseconds of one call over 10 batches of 100 calls
issued back to back; ``tbps``/``tflops`` of those rows are not meaningful). Cases: decode at B 1 and
64, L 4k, a Gemma-3-like sliding layer (32/16 heads, D 128, W 1023), page sizes 1 (CSR) and 16 (page
table); extend (chunked prefill: 512 new tokens after a 4k prefix, B 1 and 8).

``--host`` runs on any machine (no GPU needed) and measures only the wrapper's host cost per call:
the public op with its launch stubbed out against the same with the undecorated function, and a
bare function with the wrapper, on and off.

    python bench/bench_guard.py              # on the GPU: CSV rows and a table
    python bench/bench_guard.py --host       # on a CPU: the wrapper's per-call cost
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DTYPE = torch.bfloat16
HQ, H, D, W = 32, 16, 128, 1023


def _host_times(fn, calls: int = 100, batches: int = 10, sync=None) -> tuple[float, float, float]:
    """(p20, p50, p80) host microseconds per call over ``batches`` batches of ``calls`` calls."""
    fn()
    per = []
    for _ in range(batches):
        if sync:
            sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) / calls * 1e6)
    per.sort()
    q = statistics.quantiles(per, n=10, method="inclusive")
    return q[1], statistics.median(per), q[7]


# ----- GPU rows ----------------------------------------------------------------------------------------


def decode_inputs(B: int, L: int, page: int, seed: int, dev: str = "cuda"):
    g = torch.Generator(device=dev).manual_seed(seed)
    n = min(L, W + 1)
    start = L - n
    first = start // page
    npg = (L - 1) // page - first + 1
    total = B * npg + 1
    pages = (torch.randperm(total - 1, device=dev, generator=g)[: B * npg] + 1).view(B, npg).to(torch.int32)
    pos = start + torch.arange(n, device=dev)
    slots = pages[:, pos // page - first].long() * page + pos % page
    kw = dict(max_window=W + 1)
    if page == 1:
        kw.update(kv_indptr=(torch.arange(B + 1, device=dev) * n).to(torch.int32), kv_indices=slots.reshape(-1).to(torch.int32))
    else:
        kw.update(
            page_table=pages,
            window_starts=torch.full((B,), start, dtype=torch.int32, device=dev),
            seq_lens=torch.full((B,), L, dtype=torch.int32, device=dev),
            page_size=page,
        )
    q = torch.randn(B, HQ, D, dtype=DTYPE, device=dev, generator=g)
    k = torch.randn(total * page, H, D, dtype=DTYPE, device=dev, generator=g)
    v = torch.randn(total * page, H, D, dtype=DTYPE, device=dev, generator=g)
    nbytes = B * n * H * 2 * D * 2 + 2 * B * HQ * D * 2
    return (q, k, v), kw, nbytes, 4 * B * HQ * n * D


def extend_inputs(B: int, P: int, E: int, seed: int, dev: str = "cuda"):
    g = torch.Generator(device=dev).manual_seed(seed)
    n = min(P, W)
    total = B * n + 1
    slots = torch.randperm(total - 1, device=dev, generator=g)[: B * n] + 1
    T = B * E
    q = torch.randn(T, HQ, D, dtype=DTYPE, device=dev, generator=g)
    k = torch.randn(T, H, D, dtype=DTYPE, device=dev, generator=g)
    v = torch.randn(T, H, D, dtype=DTYPE, device=dev, generator=g)
    kb = torch.randn(total, H, D, dtype=DTYPE, device=dev, generator=g)
    vb = torch.randn(total, H, D, dtype=DTYPE, device=dev, generator=g)
    qo = (torch.arange(B + 1, device=dev) * E).to(torch.int32)
    prefix = torch.full((B,), P, dtype=torch.int32, device=dev)
    kw = dict(
        window_left=W, kv_indptr=(torch.arange(B + 1, device=dev) * n).to(torch.int32), kv_indices=slots.to(torch.int32), max_extend_len=E
    )
    nbytes = B * n * H * 2 * D * 2 + T * (2 * HQ + 2 * H) * D * 2
    keys = sum(min(W + 1, P + i + 1) for i in range(E))
    return (q, k, v, kb, vb, qo, prefix), kw, nbytes, 4 * B * HQ * keys * D


def gpu_main(args) -> int:
    from bench.harness import Recorder, rotation_count, time_rotated
    from triton_swa import swa_decode, swa_extend
    from triton_swa.runtime import guard

    if guard.debug_enabled():
        print(f"unset {guard.ENV_VAR}: the 'triton_swa' rows are the guard off")
        return 2
    rec = Recorder.start("guard")
    cases = []
    for B in (1, 64):
        for page in (1, 16):
            cases.append(("decode", f"g3swa-B{B}-L4k-W{W}-P{page}", swa_decode, lambda s, B=B, page=page: decode_inputs(B, 4096, page, s)))
    for B in (1, 8):
        cases.append(("extend", f"g3swa-B{B}-P4k-E512-W{W}", swa_extend, lambda s, B=B: extend_inputs(B, 4096, 512, s)))
    failures = 0
    for op, case, public, make in cases:
        first = make(0)
        n_sets = rotation_count(first[2])
        sets = [first] + [make(i) for i in range(1, n_sets)]
        providers = {
            "triton_swa_undecorated": lambda s: public.__wrapped__(*s[0], **s[1]),
            "triton_swa": lambda s: public(*s[0], **s[1]),
            "triton_swa_guard_on": lambda s: public(*s[0], **s[1], debug=True),
        }
        outs = {name: fn(sets[0]) for name, fn in providers.items()}
        ref = outs["triton_swa_undecorated"]
        for name, out in outs.items():
            if not torch.equal(out, ref):
                print(f"MISMATCH {case} {name}: output differs from the undecorated op", flush=True)
                failures += 1
        rec.op = op
        for name, fn in providers.items():
            fns = [lambda s=s, fn=fn: fn(s) for s in sets]
            rec.add(case, name, time_rotated(fns, reps=args.reps), first[2], first[3])
            it = iter(range(10**9))
            rec.add(case, f"{name}_host", _host_times(lambda: fns[next(it) % len(fns)](), sync=torch.cuda.synchronize), first[2], first[3])
        print(f"  {case}: {n_sets} set(s)", flush=True)
    rec.op = "guard"
    path = rec.save()
    print(rec.table())
    print(f"rows appended to {path}")
    return 1 if failures else 0


# ----- host-only ---------------------------------------------------------------------------------------


def host_main(args) -> int:
    """The wrapper's own per-call cost, with every launch stubbed out (runs on a CPU)."""
    from triton_swa import swa_decode, swa_extend
    from triton_swa.runtime import guard
    from triton_swa.runtime.launch import Launcher

    guard.refresh_debug_env()
    results = []

    def report(name, fn):
        p20, p50, p80 = _host_times(fn, calls=args.calls, batches=args.batches)
        results.append((name, p50))
        print(f"{name:<52} {p50:8.3f} us/call  (p20 {p20:.3f}, p80 {p80:.3f})", flush=True)

    def bare(a, b=2, *, c=None, d=None, e=None):
        return a

    wrapped = guard.guarded(lambda *a, **k: None)(bare)
    report("bare function, undecorated", lambda: bare(1, c=2, d=3))
    report("bare function, guarded, off", lambda: wrapped(1, c=2, d=3))
    report("bare function, guarded, debug=False", lambda: wrapped(1, c=2, d=3, debug=False))
    report("bare function, guarded, on (no-op check)", lambda: wrapped(1, c=2, d=3, debug=True))

    # swa_decode as the backend calls it, the launch stubbed out (cached plan, no kernel).
    B = 8
    q = torch.randn(B, HQ, D)
    k = torch.zeros(B * 64 + 1, H, D)
    kv = dict(kv_indptr=(torch.arange(B + 1) * 64).to(torch.int32), kv_indices=torch.arange(1, B * 64 + 1, dtype=torch.int32))
    kw = dict(sm_scale=0.1, logit_cap=0.0, sinks=None, k_scale=None, v_scale=None, max_window=W + 1)

    real_launch = Launcher.__call__
    Launcher.__call__ = lambda self, *a, **k: None
    try:
        report("swa_decode (launch stubbed), undecorated", lambda: swa_decode.__wrapped__(q, k, k, **kv, **kw))
        report("swa_decode (launch stubbed), guarded, off", lambda: swa_decode(q, k, k, **kv, **kw))
        report("swa_decode (launch stubbed), guard on", lambda: swa_decode(q, k, k, **kv, **kw, debug=True))
    finally:
        Launcher.__call__ = real_launch

    T = 16
    qe, ke = torch.randn(T, HQ, D), torch.randn(T, H, D)
    kb = torch.zeros(W + 1, H, D)
    ext = (qe, ke, ke, kb, kb, torch.tensor([0, T], dtype=torch.int32), torch.tensor([W], dtype=torch.int32))
    ekw = dict(
        window_left=W,
        kv_indptr=torch.tensor([0, W], dtype=torch.int32),
        kv_indices=torch.arange(1, W + 1, dtype=torch.int32),
        max_extend_len=T,
        num_splits=1,
    )
    Launcher.__call__ = lambda self, *a, **k: None
    try:
        report("swa_extend (launch stubbed), undecorated", lambda: swa_extend.__wrapped__(*ext, **ekw))
        report("swa_extend (launch stubbed), guarded, off", lambda: swa_extend(*ext, **ekw))
        report("swa_extend (launch stubbed), guard on", lambda: swa_extend(*ext, **ekw, debug=True))
    finally:
        Launcher.__call__ = real_launch

    r = dict(results)
    for op in ("bare function", "swa_decode (launch stubbed)", "swa_extend (launch stubbed)"):
        off, base = r[f"{op}, guarded, off"], r[f"{op}, undecorated"]
        print(f"{op}: guard off costs {off - base:+.3f} us per call ({100 * (off - base) / base:+.1f}%)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", action="store_true", help="only the wrapper's host cost, launches stubbed (CPU)")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=15)
    args = parser.parse_args()
    if args.host:
        return host_main(args)
    if not torch.cuda.is_available():
        print("needs CUDA (use --host for the wrapper's host cost on a CPU)")
        return 2
    return gpu_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
