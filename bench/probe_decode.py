"""Decode probes behind the heuristics (H200 questions the grid benchmark cannot answer by itself).

1. ``d512``: why does a 512-wide head reach 72% of copy through a CSR list but 96-99% through a page
   table? The same kernel (CSR form) is timed on token slots scattered one by one (page size 1) and
   on the slots of 16-token pages (same CSR path, page-local slots), next to the page-table form,
   with tile/warp/stage variants, and the compiled kernels' registers, spills and shared memory.
2. ``short``: windows of one tile (gpt-oss, W 127): stage and warp counts (fewer stages, more resident
   programs, more dependent index-then-K/V chains in flight).
3. ``floor``: what a call of the same bytes costs at the small sizes: a device copy of the same
   number of bytes (read + write) by CUDA-graph replay, and triton_swa on the same cases.
4. ``stats``: registers, spills and shared memory of every model's default kernels (the residency
   estimate of ``decode_resident_programs`` against the compiler's numbers).
5. ``splits``: split counts at 512-wide heads with few programs (B 1 and 8).
6. ``b1``: B 1 over 8-17 MB windows (Gemma-3-, Gemma-4-sliding-, Mistral-like at L 8k) against a
   device copy of the same bytes: split counts x key tiles x stages (graph replay: the merge kernel).
7. ``d512p16``: Gemma-4-full-like B 64 L 4k through a page table of 16: key tiles x warps x stages.

    python bench/probe_decode.py [d512] [short] [floor] [stats] [splits] [b1] [d512p16]

Prints one line per measurement; timings are CUDA-graph replay medians over rotated input sets.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton_swa.ops.decode.launcher as decode_mod  # noqa: E402
from bench.bench_decode import MODELS, Providers, case_bytes, make_set, window_len  # noqa: E402
from bench.harness import copy_ceiling_tbps, rotation_count, time_rotated  # noqa: E402

CEIL = None


def line(label: str, us: float, nbytes: int) -> None:
    tbps = nbytes / (us * 1e-6) / 1e12
    print(f"{label:<58} {us:9.2f} us {tbps:6.2f} TB/s {100 * tbps / CEIL:6.1f}%", flush=True)


def provs_for(name: str, B: int, L: int, set_page: int, call_page: int) -> tuple[list, int]:
    m = MODELS[name]
    nbytes = case_bytes(m, B, L, call_page)
    sets = [make_set(m, B, L, set_page, seed=i, contiguous=False) for i in range(min(rotation_count(nbytes), 8))]
    return [Providers(m, s, call_page, L, False, False, False) for s in sets], nbytes


def timed(provs, **over) -> float:
    return time_rotated([lambda p=p: p.triton_swa(**over) for p in provs], reps=15, use_graph=True)[1]


def compiled_stats(tag: str) -> None:
    for plan in list(decode_mod._PLANS.values())[-4:]:
        launch = plan.main
        for kernel in launch.compiled.values():
            meta = kernel.metadata
            print(
                f"STATS {tag}: regs {kernel.n_regs} spills {kernel.n_spills} shared {meta.shared} "
                f"warps {meta.num_warps} stages {meta.num_stages} "
                f"BLOCK_N {launch.constexprs['BLOCK_N']} PAGED {launch.constexprs['PAGED']}",
                flush=True,
            )


def d512() -> None:
    for B, L in ((64, 4096), (8, 32768)):
        for label, set_page, call_page in (("CSR scattered slots", 1, 1), ("CSR page-local slots", 16, 1), ("page table P16", 16, 16)):
            provs, nbytes = provs_for("g4full", B, L, set_page, call_page)
            line(f"g4full B{B} L{L // 1024}k {label} default", timed(provs), nbytes)
            for over in (
                dict(block_n=16),
                dict(block_n=16, num_warps=4),
                dict(block_n=32, num_warps=4),
                dict(num_stages=2),
                dict(num_stages=4),
                dict(block_n=64, num_stages=2),
            ):
                try:
                    line(f"g4full B{B} L{L // 1024}k {label} {over}", timed(provs, **over), nbytes)
                except Exception as exc:
                    print(f"  {over}: {type(exc).__name__}: {str(exc)[:100]}")
            del provs
            torch.cuda.empty_cache()
    decode_mod._PLANS.clear()
    for set_page, call_page in ((1, 1), (16, 16)):
        provs, _ = provs_for("g4full", 64, 4096, set_page, call_page)
        timed(provs)
        compiled_stats(f"g4full P{call_page}")
        decode_mod._PLANS.clear()


def short() -> None:
    for B in (64, 256):
        provs, nbytes = provs_for("gptoss", B, 4096, 1, 1)
        line(f"gptoss B{B} default", timed(provs), nbytes)
        for stages in (1, 2, 3):
            for warps in (2, 4):
                for block_n in (64, 128):
                    over = dict(num_stages=stages, num_warps=warps, block_n=block_n)
                    try:
                        line(f"gptoss B{B} {over}", timed(provs, **over), nbytes)
                    except Exception as exc:
                        print(f"  {over}: {type(exc).__name__}: {str(exc)[:100]}")
    for name in ("g3", "g4swa"):
        provs, nbytes = provs_for(name, 1, 4096, 1, 1)
        line(f"{name} B1 default", timed(provs), nbytes)
        for over in (
            dict(num_stages=1),
            dict(num_stages=2),
            dict(num_splits=8),
            dict(num_splits=8, num_stages=2),
            dict(num_splits=32, block_n=32, num_stages=1),
            dict(num_splits=16, block_n=32, num_stages=2),
        ):
            try:
                line(f"{name} B1 {over}", timed(provs, **over), nbytes)
            except Exception as exc:
                print(f"  {over}: {type(exc).__name__}: {str(exc)[:100]}")


def floor() -> None:
    for name, B in (("gptoss", 1), ("g3", 1), ("g4swa", 1), ("g4full", 1), ("gptoss", 64), ("g3", 8)):
        m = MODELS[name]
        nbytes = case_bytes(m, B, 4096, 1)
        n_sets = rotation_count(nbytes)
        bufs = [
            (
                torch.empty(nbytes // 256 * 64, dtype=torch.int16, device="cuda"),
                torch.empty(nbytes // 256 * 64, dtype=torch.int16, device="cuda"),
            )
            for _ in range(n_sets)
        ]
        us = time_rotated([lambda s=s, d=d: d.copy_(s) for s, d in bufs], reps=20, use_graph=True)[1]
        line(f"copy of the same bytes ({name} B{B}, {nbytes / 1e6:.1f} MB)", us, nbytes)
        provs, _ = provs_for(name, B, 4096, 1, 1)
        line(f"triton_swa {name} B{B} L4k P1 (window {window_len(m, 4096)})", timed(provs), nbytes)
        del bufs, provs


def stats() -> None:
    for name in MODELS:
        for B, page in ((64, 1), (64, 16), (1, 1)):
            decode_mod._PLANS.clear()
            provs, _ = provs_for(name, B, 4096, page, page)
            timed(provs)
            plan = list(decode_mod._PLANS.values())[-1]
            m = MODELS[name]
            est = decode_mod.decode_resident_programs(plan.main.constexprs["BLOCK_N"], m.d, m.d, 2)
            print(f"{name} B{B} P{page}: splits {plan.ints[0]} estimated resident {est}", flush=True)
            compiled_stats(f"{name} B{B} P{page}")


def splits() -> None:
    for B, L, page in ((8, 4096, 1), (8, 4096, 16), (1, 4096, 16), (1, 32768, 1)):
        provs, nbytes = provs_for("g4full", B, L, page, page)
        line(f"g4full B{B} L{L // 1024}k P{page} default", timed(provs), nbytes)
        for n in (4, 8, 16, 32, 64):
            for stages in (None, 2):
                over = dict(num_splits=n) if stages is None else dict(num_splits=n, num_stages=stages)
                line(f"g4full B{B} L{L // 1024}k P{page} {over}", timed(provs, **over), nbytes)


def _copy_us(nbytes: int) -> float:
    bufs = [
        (torch.empty(nbytes // 4, dtype=torch.int16, device="cuda"), torch.empty(nbytes // 4, dtype=torch.int16, device="cuda"))
        for _ in range(rotation_count(nbytes))
    ]
    return time_rotated([lambda s=s, d=d: d.copy_(s) for s, d in bufs], reps=20, use_graph=True)[1]


def _best_of(provs, label: str, nbytes: int, variants) -> tuple[float, str]:
    """The defaults, then each override in ``variants``: one line each; the fastest (us, name)."""
    best = (timed(provs), "default")
    line(f"{label} default", best[0], nbytes)
    for over in variants:
        try:
            us = timed(provs, **over)
        except Exception as exc:
            print(f"  {over}: {type(exc).__name__}: {str(exc)[:100]}")
            continue
        line(f"{label} {over}", us, nbytes)
        best = min(best, (us, str(over)))
    return best


def b1() -> None:
    for name in ("g3", "g4swa", "mistral"):
        provs, nbytes = provs_for(name, 1, 8192, 1, 1)
        copy = _copy_us(nbytes)
        line(f"{name} B1 L8k copy of the same bytes ({nbytes / 1e6:.1f} MB)", copy, nbytes)
        variants = [dict(num_splits=n, block_n=bn, num_stages=st) for n in (8, 16, 32, 64) for bn in (32, 64) for st in (2, 3)]
        best = _best_of(provs, f"{name} B1 L8k", nbytes, variants)
        print(f"B1 {name}: best {best[0]:.2f} us ({best[1]}), copy {copy:.2f} us, ratio {best[0] / copy:.2f}", flush=True)
        del provs
        torch.cuda.empty_cache()


def d512p16() -> None:
    provs, nbytes = provs_for("g4full", 64, 4096, 16, 16)
    variants = [dict(block_n=bn, num_warps=w, num_stages=st) for bn in (16, 32, 64) for w in (4, 8) for st in (2, 3, 4)]
    best = _best_of(provs, "g4full B64 L4k P16", nbytes, variants)
    print(f"D512 P16: best {best[0]:.2f} us ({best[1]})", flush=True)


def main() -> None:
    global CEIL
    CEIL = copy_ceiling_tbps()
    print(f"copy ceiling {CEIL:.2f} TB/s on {torch.cuda.get_device_name()}", flush=True)
    steps = sys.argv[1:] or ["d512", "short", "floor"]
    for step in steps:
        print(f"== {step}", flush=True)
        globals()[step]()


if __name__ == "__main__":
    main()
