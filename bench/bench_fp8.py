"""fp8 KV decode against bf16 on the same window, and the two ways of reading fp8 (docs/contract.md §7 rows).

Providers, each over its own pool of the same values (bf16, or ``value / 0.5`` cast to fp8):

- ``bf16``: a bf16 pool;
- ``fp8_native``: float8_e4m3fn loaded with Triton's conversion (the default on sm_89+ and AMD), to
  float16, dotted with the bf16 queries rounded to float16 (the default);
- ``fp8_native_bf16dot``: as ``fp8_native``, converted to bf16 and dotted in bf16 (the default before);
- ``fp8_bytes``: the same bytes loaded as uint8 and decoded with integer ops in the kernel (the path of
  sm_80/86, forced here with ``triton_swa.testing.without_native_fp8``), bf16 queries dotting in float16;
- ``fp8_bytes_bf16dot``: as ``fp8_bytes``, every decoded element converted on to bf16 for the dots;
- ``fp8nuz``: float8_e4m3fnuz (MI300's format), decoded from its bytes off gfx942.

Shapes: Gemma-3-like (32/16 heads, D 128, W 1023), Gemma-4-sliding-like (32/16, D 256, W 1023),
Mistral-like (32/8, D 128, W 4095), at B 1/8/64 and L 8k, CSR window-trimmed slots scattered over a
pool whose other slots hold NaN. Every provider's output on input set 0 is checked against the float64
reference over its own pool before it is timed; a mismatch is reported WRONG and not timed. Timing:
CUDA-graph replay over input sets rotated past L2 (``bench.harness.time_rotated``), p50 of 30 reps.
``bytes`` counts the window's K and V at the pool's element size (one byte for fp8), q and o.

``--sweep``: for ``fp8_native`` at B 8 and 64, also ``block_n`` 32/64/128 x ``num_warps`` 4/8.

    python bench/bench_fp8.py                 # about a minute on an H200
    python bench/bench_fp8.py --sweep --models g4swa
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton_swa_reference as ref  # noqa: E402
from bench.harness import Recorder, rotation_count, time_rotated  # noqa: E402
from triton_swa.ops.decode.launcher import _swa_decode_impl, _Tune  # noqa: E402
from triton_swa.testing import without_native_fp8  # noqa: E402

MODELS = {"g3": (32, 16, 128, 1023), "g4swa": (32, 16, 256, 1023), "mistral": (32, 8, 128, 4095)}
SCALE = 0.5
DEVICE = "cuda"
TOL = 2e-2
PROVIDERS = {
    # name: (pool dtype, bytes decoded in the kernel, f16_dot)
    "bf16": (torch.bfloat16, False, None),
    "fp8_native": (torch.float8_e4m3fn, False, None),
    "fp8_native_bf16dot": (torch.float8_e4m3fn, False, False),
    "fp8_bytes": (torch.float8_e4m3fn, True, None),
    "fp8_bytes_bf16dot": (torch.float8_e4m3fn, True, False),
    "fp8nuz": (torch.float8_e4m3fnuz, False, None),
}


def make_set(hq, h, d, window, batch, gen):
    """Queries, a bf16 pool random at the windows' slots and NaN elsewhere, its fp8 versions, indices."""
    pool_slots = batch * window + batch * window // 8 + 1
    slots = (torch.randperm(pool_slots - 1, generator=gen, device=DEVICE)[: batch * window] + 1).view(batch, window)
    k = torch.full((pool_slots, h, d), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    v = torch.full_like(k, float("nan"))
    flat = slots.reshape(-1)
    k[flat] = torch.randn(flat.numel(), h, d, generator=gen, device=DEVICE, dtype=torch.bfloat16)
    v[flat] = torch.randn(flat.numel(), h, d, generator=gen, device=DEVICE, dtype=torch.bfloat16)
    pools = {torch.bfloat16: (k, v)}
    for fp8 in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        pools[fp8] = ((k.float() / SCALE).to(fp8), (v.float() / SCALE).to(fp8))
    return dict(
        q=torch.randn(batch, hq, d, generator=gen, device=DEVICE, dtype=torch.bfloat16),
        pools=pools,
        kv_indptr=(torch.arange(batch + 1, device=DEVICE) * window).to(torch.int32),
        kv_indices=flat.to(torch.int32),
        out=torch.full((batch, hq, d), float("nan"), dtype=torch.bfloat16, device=DEVICE),
    )


def call(s, provider, window, block_n=None, num_warps=None):
    dtype, as_bytes, f16_dot = PROVIDERS[provider]
    k, v = s["pools"][dtype]
    scales = {} if dtype == torch.bfloat16 else dict(k_scale=SCALE, v_scale=SCALE)
    tune = _Tune(num_warps=num_warps, f16_dot=f16_dot)
    with without_native_fp8(DEVICE) if as_bytes else contextlib.nullcontext():
        where = dict(kv_indptr=s["kv_indptr"], kv_indices=s["kv_indices"])
        _swa_decode_impl(s["q"], k, v, **where, out=s["out"], max_window=window, block_n=block_n, tune=tune, **scales)


def check(s, provider, window, **tiles) -> float:
    dtype = PROVIDERS[provider][0]
    k, v = s["pools"][dtype]
    s["out"].fill_(float("nan"))
    call(s, provider, window, **tiles)
    scales = {} if dtype == torch.bfloat16 else dict(k_scale=SCALE, v_scale=SCALE)
    want = ref.decode_attention(s["q"], k, v, s["kv_indptr"], s["kv_indices"], sm_scale=1 / math.sqrt(s["q"].shape[-1]), **scales)
    got = s["out"].double()
    return math.inf if bool(torch.isnan(got).any()) else float((got - want.to(got.device)).abs().max())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="g3,g4swa,mistral")
    parser.add_argument("--batch", default="1,8,64")
    parser.add_argument("--ctx", type=int, default=8192)
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args()
    rec = Recorder.start("fp8-decode")
    wrong = 0
    summary = []
    for name in args.models.split(","):
        hq, h, d, w = MODELS[name]
        window = min(args.ctx, w + 1)
        for batch in map(int, args.batch.split(",")):
            case = f"{name}-B{batch}-L{args.ctx // 1024}k-W{w}-D{d}"
            gen = torch.Generator(device=DEVICE).manual_seed(batch * 1000 + d)
            set_bytes = 2 * batch * window * h * d * 4  # the bf16 pool and both fp8 ones, K and V
            sets = [make_set(hq, h, d, window, batch, gen) for _ in range(rotation_count(set_bytes, 12 * 2**30))]
            configs = [(p, None, None) for p in PROVIDERS]
            if args.sweep and batch >= 8:
                configs += [(p, bn, nw) for p in ("fp8_native",) for bn in (32, 64, 128) for nw in (4, 8)]
            times = {}
            for provider, bn, nw in configs:
                label = provider if bn is None else f"{provider}_n{bn}w{nw}"
                err = check(sets[0], provider, window, block_n=bn, num_warps=nw)
                if not err <= TOL:
                    print(f"WRONG {case} {label}: max abs err {err}", flush=True)
                    wrong += 1
                    continue
                itemsize = 2 if provider == "bf16" else 1
                nbytes = 2 * batch * window * h * d * itemsize + 2 * batch * hq * d * 2
                flops = 4 * batch * hq * window * d
                t = time_rotated([functools.partial(call, s, provider, window, bn, nw) for s in sets], use_graph=True)
                rec.add(case, label, t, nbytes, flops)
                times[label] = t[1]
            bf16 = times.get("bf16")
            best = min((v, k) for k, v in times.items() if k != "bf16") if len(times) > 1 else (math.nan, "-")
            cols = "  ".join(f"{p} {times.get(p, math.nan):8.2f}" for p in PROVIDERS)
            speedup = bf16 / best[0] if bf16 else math.nan
            summary.append(f"{case:<28} {cols}  best fp8 {best[0]:8.2f} ({best[1]}), bf16/best {speedup:.2f}x")
            del sets
            torch.cuda.empty_cache()
    print(f"rows: {rec.save()}")
    print(rec.table())
    print(f"\n== summary: us p50 per provider (copy ceiling {rec.copy_tbps:.2f} TB/s), {wrong} WRONG")
    print("\n".join(summary))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
