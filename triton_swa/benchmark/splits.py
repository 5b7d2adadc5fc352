"""Where a decode, prefill or verify case's GPU time goes: ``python -m triton_swa.benchmark.splits [--case ID ...]``.

For each case (default: the 512-wide-head full-attention decodes FlashInfer wins under graph replay,
and a wide batch beside them; any decode or verify case of the default and heuristics grids by
``--case``), on a CUDA device:

- ``swa_decode`` (``swa_extend`` for verify) at the heuristics' split count and at forced counts 1, 2,
  4, ... (each output checked against the float64 reference first, NaN-poisoned), timed by CUDA-graph
  replay over rotated input sets, beside a read and a copy of the same bytes (the bandwidth ceiling);
- the default's time by kernel (the split kernel and the merge kernel) from ``torch.profiler``.

``--tile BMxBNxWARPSxSTAGES[xPARTS]`` (repeatable) times those extend tiles beside the default instead of
the split counts (``block_m``, ``block_n``, ``num_warps``, ``num_stages``, ``dv_parts`` overrides, each output checked
first): the way to try a tile the compile tier proposes, e.g. D 512 prefill at 64x32x8x2.

``--once CASE`` runs the default call a few times and nothing else: the target of a kernel profiler
(``scripts/gpu.sh profile`` runs it under Nsight Compute where ``ncu`` is on the machine).
"""

from __future__ import annotations

import argparse
import sys

import torch

DEFAULT_CASES = (
    "decode-g4full-B1-L4k-W-1-D512-P1",
    "decode-g4full-B1-L4k-W-1-D512-P16",
    "decode-g4full-B1-L32k-W-1-D512-P1",
    "decode-g4full-B64-L4k-W-1-D512-P1",
)
FORCED_SPLITS = (1, 2, 4, 8, 16, 32, 64)


def _cases(ids):
    from .cases import catalog

    every = {c.id: c for grid in ("default", "heuristics") for c in catalog(["decode", "prefill", "verify"], grid=grid)}
    missing = [i for i in ids if i not in every]
    if missing:
        raise SystemExit(f"unknown case ids {missing}; decode cases look like {DEFAULT_CASES[0]}")
    return [every[i] for i in ids]


def _call(case, x, **extra):
    from .providers import _triton_swa

    return _triton_swa(case, x, **extra)


def _chosen_splits(case) -> int:
    """The split count of the plan the latest new signature of ``case``'s op made (the decode plans'
    first integer; the extend plan of the latest checked signature)."""
    if case.op == "decode":
        from triton_swa.ops.decode import launcher

        return list(launcher._PLANS.plans.values())[-1].ints[0]
    from triton_swa.ops.extend import launcher

    return list(list(launcher._CHECKED.plans.values())[-1].plans.values())[-1].num_splits


def _kernel_times(fn, reps: int = 50) -> dict:
    """GPU microseconds per call of each kernel ``fn`` launches, from ``torch.profiler``."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and e.count:
            total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
            out[e.key[:40]] = (total / reps, e.count / reps)
    return out


TILE_KNOBS = ("block_m", "block_n", "num_warps", "num_stages", "dv_parts")


def parse_tile(text: str) -> dict:
    """``BMxBNxWARPSxSTAGES[xPARTS]`` as ``swa_extend``'s overrides (``64x32x8x2``; ``128x16x8x3x2``
    divides the value width between two programs, ``dv_parts``)."""
    parts = text.lower().split("x")
    if len(parts) not in (4, 5) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"--tile must be BMxBNxWARPSxSTAGES[xPARTS] of positive ints (64x32x8x2), got {text!r}")
    return dict(zip(TILE_KNOBS, map(int, parts)))


def sweep(case, tiles: tuple[dict, ...] = ()) -> list[str]:
    """The split sweep of ``case`` (or, with ``tiles``, the extend tile sweep) as report lines."""
    if tiles and case.op == "decode":
        raise ValueError("--tile overrides extend tiles: give prefill or verify cases")
    from .providers import _copy, _read, build, check, reference
    from .runner import _set_bytes, _time, input_set_count

    sets = [build(case, i, "cuda") for i in range(input_set_count(_set_bytes(build(case, 0, "cuda")), "cuda"))]
    want = reference(case, sets[0])
    kv_bytes = case.nbytes()
    lines = [f"== {case.id}: {len(sets)} input sets, {kv_bytes / 1e6:.1f} MB per call (the cached K/V once, q, new K/V, out)"]
    read_us = _time([_read(case, x) for x in sets], "cuda")[0][1]
    copy_us = _time([_copy(case, x) for x in sets], "cuda")[0][1]
    lines.append(f"read of the same bytes {read_us:.1f} us ({kv_bytes / read_us / 1e3:.0f} GB/s), copy {copy_us:.1f} us")
    if tiles:
        lines.append(f"flops per call {case.flops() / 1e12:.2f} TFLOP (TFLOP/s: that / us p50 x 1e6)")
    head = "tile (block_m x block_n x warps x stages [x value parts])" if tiles else "splits"
    lines.append(f"| {head} | us p50 (graph) | GB/s | over the read | max abs err |")
    lines.append("| --- | ---: | ---: | ---: | ---: |")
    for extra in tiles or [{}, *({"num_splits": n} for n in FORCED_SPLITS)]:
        if tiles:
            label = "x".join(str(extra[k]) for k in TILE_KNOBS if k in extra) if extra else "default"
        else:
            label = str(extra["num_splits"]) if extra else None
        try:
            err = check(case, sets[0], _call(case, sets[0], **extra), want)
        except Exception as exc:  # noqa: BLE001 - a tile that does not compile or launch is a row, not the end
            lines.append(f"| {label or 'default'} | - | - | - | failed: {type(exc).__name__}: {str(exc)[:100]} |")
            continue
        label = label or f"{_chosen_splits(case)} (default)"
        if not err < 0.05:
            lines.append(f"| {label} | - | - | - | {err:.3g} (wrong: not timed) |")
            continue
        us = _time([_call(case, x, **extra) for x in sets], "cuda")[0][1]
        lines.append(f"| {label} | {us:.1f} | {kv_bytes / us / 1e3:.0f} | {us / read_us:.2f}x | {err:.2g} |")
    fns = [_call(case, x) for x in sets]
    step = iter(range(10**9))
    kernels = _kernel_times(lambda: fns[next(step) % len(fns)]())
    lines.append("default, by kernel (eager, us per call): " + ", ".join(f"{k} {t:.1f} x{n:g}" for k, (t, n) in kernels.items()))
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m triton_swa.benchmark.splits", description=__doc__.split("\n")[0])
    parser.add_argument("--case", action="append", help=f"a decode or verify case id (default: {', '.join(DEFAULT_CASES)})")
    parser.add_argument("--once", metavar="CASE", help="run CASE's default call 5 times, nothing else (for a kernel profiler)")
    parser.add_argument("--tile", action="append", default=[], help="BMxBNxWARPSxSTAGES[xPARTS]: time these extend tiles (and the default)")
    args = parser.parse_args(argv)
    tiles = tuple(parse_tile(t) for t in args.tile)
    if tiles:
        tiles = ({},) + tiles  # the default's own tile first
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    if args.once:
        from .providers import build

        (case,) = _cases([args.once])
        x = build(case, 0, "cuda")
        fn = _call(case, x)
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        print(f"{case.id}: {_chosen_splits(case)} splits")
        return 0
    for case in _cases(args.case or DEFAULT_CASES):
        print("\n".join(sweep(case, tiles)), flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
