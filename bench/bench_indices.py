"""The fused window index builder (issue 3) against the two-pass path and a plain gather, on the GPU.

Decode windows (the last W + 1 tokens of each request) of B requests of length L, from a pool whose
slots are random (page size 1) or random pages (page size 16), translated to SWA slots through an int64
``full_to_swa_index_mapping`` of at least 4M slots. Providers, all on the same inputs:

- ``triton_swa``: :func:`build_window_indices` with ``mapping`` (one launch, fixed output buffers);
- ``two_pass``: the same builder without a mapping, then ``mapping[kv_indices].to(torch.int32)`` (what
  engines do today: build, then translate with a torch gather);
- ``plain_gather``: ``torch.index_select(mapping, 0, full_slots)`` at the window's full slots,
  precomputed: the same gathers from the same int64 mapping, with nothing else to do (the floor of a
  translation; it writes int64, 4 bytes more per index than the fused builder's int32).

For page size 16 the page-table form is measured too (``-table`` cases): the fused
:func:`build_window_page_table` against the full page table then ``mapping[table * 16] // 16``, and a
plain gather of ``B * max_pages`` entries. Every timing is a CUDA-graph replay (launch cost excluded,
as in an engine's decode loop) rotating through enough input sets to defeat the 60 MB L2.
``bytes`` = indices read (int32) + mapping entries gathered (int64) + indices written (int32), plus
the per-request metadata; the same for every provider of a case, so GB/s ratios are time ratios.

Targets (issue 3), checked at the end: at B = 256, L = 32k, W = 4095, page 1 the fused builder is at
least 2x faster than two_pass and within 1.2x of plain_gather.

Run on the GPU: ``python bench/bench_indices.py`` (``--quick`` for the target case only). Rows go to
``bench/results/indices-<date>-<gpu>.csv`` (SPEC §7). ``--dry-run`` checks the providers' outputs
against each other on tiny shapes without timing (works in the CPU interpreter).
"""

from __future__ import annotations

import argparse
import os
import sys

if __name__ == "__main__" and "--dry-run" in sys.argv and not __import__("torch").cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.harness import Recorder, rotation_count, time_rotated  # noqa: E402
from triton_swa.ops.indices import WindowIndices, WindowPageTable, build_window_indices, build_window_page_table, max_window_pages  # noqa: E402

BATCHES = (1, 64, 256, 1024)
LENGTHS = (4096, 32768)
WINDOWS = (1023, 4095)
PAGE_SIZES = (1, 16)
TARGET = dict(B=256, L=32768, W=4095, page_size=1)


def make_pool(B: int, L: int, page_size: int, num_sets: int, device, g: torch.Generator):
    """``num_sets`` batches of B requests of length L on distinct rows of one ``req_to_token``.

    Slots are random pool slots (page size 1) or random pages with in-page offsets (page size 16), in
    a full pool of ``max(B * L, 4M)`` slots; the mapping sends them to random SWA slots (int64).
    """
    n_pages = max(B * L, 1 << 22) // page_size
    rows = num_sets * B + 1
    pages = torch.randint(1, n_pages, (rows, L // page_size), device=device, generator=g, dtype=torch.int32)
    offsets = torch.arange(page_size, device=device, dtype=torch.int32)
    req_to_token = (pages[:, :, None] * page_size + offsets).reshape(rows, L)
    req_to_token[0] = 0
    size = n_pages * page_size
    mapping = torch.randint(1, size // 4, (size + page_size + 1,), device=device, generator=g)
    mapping = mapping // page_size * page_size + torch.arange(size + page_size + 1, device=device) % page_size
    mapping[0], mapping[-1] = 0, -1
    sets = []
    for s in range(num_sets):
        rpi = torch.arange(1 + s * B, 1 + (s + 1) * B, device=device, dtype=torch.int64)
        seq = torch.full((B,), L, device=device, dtype=torch.int64)
        sets.append((rpi, seq))
    return req_to_token, mapping, sets


def csr_providers(req_to_token, mapping, sets, W):
    """(fns per provider, outputs to compare) of the CSR form; outputs live in fixed buffers."""
    dev = req_to_token.device
    B = sets[0][0].shape[0]
    n = B * (W + 1)
    fused, two, plain, outs = [], [], [], []

    def buffers():
        return WindowIndices(
            torch.empty(B + 1, dtype=torch.int32, device=dev),
            torch.empty(n, dtype=torch.int32, device=dev),
            torch.empty(B, dtype=torch.int32, device=dev),
        )

    for rpi, seq in sets:
        fo, to = buffers(), buffers()
        fused.append(lambda rpi=rpi, seq=seq, fo=fo: build_window_indices(req_to_token, rpi, seq, window_left=W, mapping=mapping, out=fo))
        holder = {}

        def two_pass(rpi=rpi, seq=seq, to=to, holder=holder):
            built = build_window_indices(req_to_token, rpi, seq, window_left=W, out=to)
            holder["swa"] = mapping[built.kv_indices].to(torch.int32)

        two.append(two_pass)
        full = build_window_indices(req_to_token, rpi, seq, window_left=W, num_indices=n).kv_indices
        po = torch.empty(n, dtype=mapping.dtype, device=dev)
        plain.append(lambda full=full, po=po: torch.index_select(mapping, 0, full, out=po))
        outs.append((fo, holder, full, po))
    nbytes = n * (4 + 8 + 4) + B * (8 + 8 + 4 + 4)

    def check():
        fo, holder, full, po = outs[0]
        fused[0]()
        two[0]()
        plain[0]()
        ok = torch.equal(fo.kv_indices, holder["swa"]) and torch.equal(fo.kv_indices, po.to(torch.int32))
        ok &= torch.equal(fo.kv_indices, mapping[full.long()].to(torch.int32))
        return ok

    return {"triton_swa": fused, "two_pass": two, "plain_gather": plain}, nbytes, check


def table_providers(req_to_token, mapping, sets, W, page_size):
    dev = req_to_token.device
    B = sets[0][0].shape[0]
    width = max_window_pages(W, page_size, req_to_token.shape[1])
    fused, two, plain, outs = [], [], [], []
    kw = dict(window_left=W, page_size=page_size)

    def buffers():
        return WindowPageTable(torch.empty(B, width, dtype=torch.int32, device=dev), torch.empty(B, dtype=torch.int32, device=dev))

    for rpi, seq in sets:
        fo, to = buffers(), buffers()
        fused.append(lambda rpi=rpi, seq=seq, fo=fo: build_window_page_table(req_to_token, rpi, seq, mapping=mapping, out=fo, **kw))
        holder = {}

        def two_pass(rpi=rpi, seq=seq, to=to, holder=holder):
            built = build_window_page_table(req_to_token, rpi, seq, out=to, **kw)
            holder["swa"] = (mapping[built.page_table * page_size] // page_size).to(torch.int32)

        two.append(two_pass)
        first_slots = (build_window_page_table(req_to_token, rpi, seq, max_pages=width, **kw).page_table * page_size).reshape(-1)
        po = torch.empty(B * width, dtype=mapping.dtype, device=dev)
        plain.append(lambda first_slots=first_slots, po=po: torch.index_select(mapping, 0, first_slots, out=po))
        outs.append((fo, holder, first_slots, po))
    nbytes = B * width * (4 + 8 + 4) + B * (8 + 8 + 4)

    def check():
        fo, holder, first_slots, po = outs[0]
        fused[0]()
        two[0]()
        plain[0]()
        ok = torch.equal(fo.page_table, holder["swa"])
        ok &= torch.equal(fo.page_table.reshape(-1), (po // page_size).to(torch.int32))
        return ok

    return {"triton_swa": fused, "two_pass": two, "plain_gather": plain}, nbytes, check


def run(args) -> int:
    dry = args.dry_run
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if not dry and device != "cuda":
        print("bench_indices needs CUDA (use --dry-run to check the providers on the CPU)")
        return 2
    g = torch.Generator(device=device).manual_seed(0)
    rec = None if dry else Recorder.start("indices")
    shapes = [(b, l, ps) for ps in PAGE_SIZES for l in LENGTHS for b in BATCHES]
    windows = WINDOWS
    if args.quick:
        shapes, windows = [(TARGET["B"], TARGET["L"], TARGET["page_size"])], (TARGET["W"],)
    if dry:
        shapes, windows = [(3, 64, 1), (2, 96, 16)], (7, 40)
    failures = 0
    summary = {}
    for B, L, ps in shapes:
        # Rotate enough sets for the smallest window, so that every window's sets exceed L2.
        num_sets = 2 if dry else rotation_count(B * (min(windows) + 1) * 16)
        req_to_token, mapping, sets = make_pool(B, L, ps, num_sets, device, g)
        for W in windows:
            forms = [("csr", csr_providers)] + ([("table", table_providers)] if ps > 1 else [])
            for form, make in forms:
                n_sets = num_sets if dry else min(num_sets, rotation_count(B * (W + 1) * 16))
                use = sets[:n_sets]
                fns, nbytes, check = make(req_to_token, mapping, use, W) if form == "csr" else make(req_to_token, mapping, use, W, ps)
                case = f"B{B}-L{L // 1024}k-W{W}-P{ps}" + ("-table" if form == "table" else "")
                if not check():
                    print(f"MISMATCH between providers in {case}")
                    failures += 1
                    continue
                if dry:
                    print(f"{case}: providers agree")
                    continue
                for provider, f in fns.items():
                    times = time_rotated(f, use_graph=True, reps=args.reps)
                    row = rec.add(case, provider, times, nbytes, 0)
                    summary[(B, L, W, ps, form, provider)] = row
        del req_to_token, mapping, sets
        if device == "cuda":
            torch.cuda.empty_cache()
    if dry:
        return 1 if failures else 0
    if args.sweep:
        sweep(rec, g, args.reps)
    print(f"saved {rec.save()}")
    print(f"{'case':<28} {'triton_swa us':>13} {'GB/s':>7} {'two_pass us':>11} {'plain us':>9} {'x two_pass':>10} {'/ plain':>8}")
    for (B, L, W, ps, form, provider), row in summary.items():
        if provider != "triton_swa":
            continue
        two = summary[(B, L, W, ps, form, "two_pass")]
        plain = summary[(B, L, W, ps, form, "plain_gather")]
        print(
            f"{row['case']:<28} {row['us_p50']:>13.2f} {row['tbps'] * 1e3:>7.0f} {two['us_p50']:>11.2f} "
            f"{plain['us_p50']:>9.2f} {two['us_p50'] / row['us_p50']:>10.2f} "
            f"{row['us_p50'] / plain['us_p50']:>8.2f}"
        )
    key = (TARGET["B"], TARGET["L"], TARGET["W"], TARGET["page_size"], "csr")
    if key + ("triton_swa",) in summary:
        f, t, p = (summary[key + (prov,)]["us_p50"] for prov in ("triton_swa", "two_pass", "plain_gather"))
        print(
            f"target B256-L32k-W4095-P1: {t / f:.2f}x faster than two_pass (want >= 2: "
            f"{'PASS' if t / f >= 2 else 'FAIL'}), {f / p:.2f}x plain_gather (want <= 1.2: "
            f"{'PASS' if f / p <= 1.2 else 'FAIL'})"
        )
    return 1 if failures else 0


def sweep(rec: Recorder, g: torch.Generator, reps: int) -> None:
    """Block size and splits per request of the fused builder at the target case (for tuning the
    heuristics); rows go to the CSV as providers ``triton_swa-b<block>-s<splits>``."""
    B, L, W = TARGET["B"], TARGET["L"], TARGET["W"]
    num_sets = rotation_count(B * (W + 1) * 16)
    req_to_token, mapping, sets = make_pool(B, L, 1, num_sets, "cuda", g)
    n = B * (W + 1)
    outs = [
        WindowIndices(
            torch.empty(B + 1, dtype=torch.int32, device="cuda"),
            torch.empty(n, dtype=torch.int32, device="cuda"),
            torch.empty(B, dtype=torch.int32, device="cuda"),
        )
        for _ in sets
    ]
    nbytes = n * (4 + 8 + 4) + B * (8 + 8 + 4 + 4)
    print(f"sweep B{B}-L{L // 1024}k-W{W}-P1: block x splits -> us (p50)")
    for block in (256, 512, 1024, 2048, 4096):
        line = []
        for splits in (1, 2, 4, 8, 16):
            if splits * block > 2 * (W + 1):
                continue
            fns = [
                lambda rpi=rpi, seq=seq, o=o, block=block, splits=splits: build_window_indices(
                    req_to_token, rpi, seq, window_left=W, mapping=mapping, out=o, block=block, num_splits=splits
                )
                for (rpi, seq), o in zip(sets, outs)
            ]
            row = rec.add(
                f"B{B}-L{L // 1024}k-W{W}-P1", f"triton_swa-b{block}-s{splits}", time_rotated(fns, use_graph=True, reps=reps), nbytes, 0
            )
            line.append(f"s{splits}: {row['us_p50']:.2f}")
        print(f"  block {block:>4}: " + "  ".join(line))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="only the target case B256-L32k-W4095-P1")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--dry-run", action="store_true", help="check providers agree on tiny shapes, no timing")
    p.add_argument("--sweep", action="store_true", help="also sweep block/splits of the fused builder")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
