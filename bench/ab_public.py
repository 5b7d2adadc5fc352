"""A/B benchmark of two source trees of triton-swa, through the public API only.

What it measures: for each case, the GPU time of one call of ``triton_swa.swa_decode``,
``triton_swa.swa_extend`` or ``triton_swa.build_window_indices`` in each of two trees, on the same shapes
and the same seeded inputs, and the ratio between the trees. Only public names are used, so the script
runs unchanged against a tree from before and one from after a refactor of the internals.

Methodology:

- The driver runs one worker subprocess per (round, tree) with ``PYTHONPATH`` set to the tree, so the
  worker imports that tree's ``triton_swa`` and its reference (``DIR/reference``, registered as
  ``triton_swa_reference``); the worker refuses to run unless every module of both packages came from the
  tree, and reports the files it imported. The order of the trees alternates between rounds (drift of
  clocks and neighbours cancels); a tree's time for a case is the median over its rounds. A worker that
  crashes marks the case it was running as crashed, and a new worker goes on with the next case.
- Inputs: bf16 (fp8 e4m3 KV cache where the case says so); the windows' slots (page size 1) or pages
  (page size 16) are scattered over a pool by a random permutation; every pool slot outside the windows,
  and every output before the call, is NaN, so an over-read or an unwritten output shows up.
- Correctness first, on input set 0, against the tree's float64 reference: decode, every request;
  extend, the last ``check_rows`` new tokens of every request, its earlier new tokens committed to the
  reference's cached prefix (the same causal attention); window indices, exactly. A case whose error
  passes the tolerance, or whose output holds a NaN anywhere, is WRONG and is not timed.
- Timing: N input sets, together over 4x the L2 (64 MB) when memory allows (at most 256 sets, 8 GiB); a
  rep calls every set once. After an eager warm-up the rep is captured in a CUDA graph and replayed
  (3 replays of warm-up, then ``--reps`` timed by CUDA events); the time of a call is the rep's over N,
  with p20 / p50 / p80 over reps. Set 0 is checked again after the replays (the graph's own output).
- ``--smoke``: tiny shapes; on a machine without CUDA they run in Triton's interpreter and are timed
  eagerly (``time.perf_counter``, 2 reps, 2 sets): a test of the script, not a measurement.

Output: a markdown table, case by case, of each tree's median p50, the time ratio second / first and the
speedup first / second, then the geometric mean, min and max of the speedup per op; with ``--git-sha``, one
CSV row per (case, tree, round) appended to ``--out`` (default ``bench/results/ab-<date>-<gpu>.csv``). No
worker starts after ``--budget-s``, and none starts a case after it; a worker still running 120 s later
is killed. The exit status is 1 unless every case ran and was ok in both trees.

Usage (the first ``--tree`` is the baseline):

    python bench/ab_public.py --tree before=.ab/before --tree after=. --git-sha $(git rev-parse --short HEAD)
    python bench/ab_public.py --tree before=A --tree after=B --quick --rounds 2 --cases decode-g3,verify
    TRITON_INTERPRET=1 python bench/ab_public.py --tree before=A --tree after=B --smoke --rounds 1
"""

from __future__ import annotations

import argparse
import csv
import datetime
import functools
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

L2_BYTES = 64 * 2**20
SET_MEMORY = 8 * 2**30
MAX_SETS = 256
CPU_SETS = 2
CPU_REPS = 2
WARM_REPLAYS = 3
BF16_TOL = 2e-2
FP8_SCALE = 0.5
KILL_GRACE_S = 120  # a worker still running this long after the budget is killed
DTYPE = torch.bfloat16
RESULTS = Path(__file__).resolve().parent / "results"
CSV_COLUMNS = ["case", "tree", "round", "us_p50", "us_p20", "us_p80", "max_abs_err", "status", "gpu", "torch", "triton", "git_sha", "date"]


@dataclass(frozen=True)
class Model:
    """Attention shape of one layer: query heads, KV heads, head dim, window (``-1``: full), sinks."""

    name: str
    hq: int
    h: int
    d: int
    window_left: int
    sinks: bool = False

    @property
    def sm_scale(self) -> float:
        return 1.0 / math.sqrt(self.d)


MODELS = {
    m.name: m
    for m in (
        Model("g3", 32, 16, 128, 1023),
        Model("g4swa", 32, 16, 256, 1023),
        Model("g4full", 32, 4, 512, -1),
        Model("mistral", 32, 8, 128, 4095),
        Model("gptoss", 64, 8, 64, 127, sinks=True),
        # --smoke only: small enough for Triton's interpreter on a CPU
        Model("tswa", 4, 2, 32, 15),
        Model("twide", 4, 2, 64, 23),
        Model("tfull", 4, 1, 64, -1),
        Model("tsink", 8, 2, 32, 7, sinks=True),
    )
}


def _tokens(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _window_start(end: int, window_left: int) -> int:
    """First position a query at ``end`` sees: ``end - W`` (never below 0; ``W = -1``: 0)."""
    return 0 if window_left < 0 else max(0, end - window_left)


def _scattered_windows(batch: int, start: int, end: int, page_size: int, gen: torch.Generator, device: str):
    """Slots of positions ``[start, end)`` of ``batch`` requests on random pages of a pool with 1/8 spare
    pages (page 0 is the dummy). Returns ``slots`` int64 `[B, end - start]`, the page table int32
    `[B, pages]` (page 0 holds position ``start``) and the pool's slot count."""
    first = start // page_size
    pages_per_request = (end - 1) // page_size - first + 1 if end > start else 0
    used = batch * pages_per_request
    pool_pages = used + max(used // 8, 2) + 1
    pages = (torch.randperm(pool_pages - 1, generator=gen, device=device)[:used] + 1).view(batch, pages_per_request)
    pos = torch.arange(start, end, device=device)
    slots = pages[:, pos // page_size - first] * page_size + pos % page_size
    return slots, pages.to(torch.int32), pool_pages * page_size


def _nan_pool(pool_slots: int, slots: torch.Tensor, heads: int, dim: int, dtype: torch.dtype, gen, device: str):
    """A `[pool_slots, heads, dim]` buffer, random at ``slots`` and NaN everywhere else."""
    pool = torch.full((pool_slots, heads, dim), float("nan"), dtype=DTYPE, device=device)
    flat = slots.reshape(-1)
    pool[flat] = torch.randn(flat.numel(), heads, dim, generator=gen, device=device, dtype=DTYPE)
    return pool.to(dtype)


def _randn(*shape, gen, device):
    return torch.randn(*shape, generator=gen, device=device, dtype=DTYPE)


def _float_error(out: torch.Tensor, rows: torch.Tensor | None, want: torch.Tensor) -> float:
    """Largest absolute error of ``out[rows]`` against ``want``; infinite when ``out`` holds a NaN anywhere."""
    if torch.isnan(out).any():
        return math.inf
    got = out.double() if rows is None else out[rows.to(out.device)].double()
    return float((got - want.to(got.device)).abs().max()) if want.numel() else 0.0


@dataclass(frozen=True)
class DecodeCase:
    """One decode query per request over the last ``min(L, W + 1)`` of its ``L`` tokens."""

    model: Model
    batch: int
    context: int
    page_size: int = 1
    fp8: bool = False
    op = "decode"
    tolerance = BF16_TOL

    @property
    def id(self) -> str:
        m = self.model
        return f"decode-{m.name}-B{self.batch}-L{_tokens(self.context)}-W{m.window_left}-D{m.d}-P{self.page_size}" + (
            "-fp8" if self.fp8 else ""
        )

    @property
    def window(self) -> int:
        return self.context if self.model.window_left < 0 else min(self.context, self.model.window_left + 1)

    def make_inputs(self, gen: torch.Generator, device: str) -> dict:
        m, B = self.model, self.batch
        start = self.context - self.window
        slots, page_table, pool_slots = _scattered_windows(B, start, self.context, self.page_size, gen, device)
        kv_dtype = torch.float8_e4m3fn if self.fp8 else DTYPE
        return dict(
            q=_randn(B, m.hq, m.d, gen=gen, device=device),
            k_buffer=_nan_pool(pool_slots, slots, m.h, m.d, kv_dtype, gen, device),
            v_buffer=_nan_pool(pool_slots, slots, m.h, m.d, kv_dtype, gen, device),
            kv_indptr=(torch.arange(B + 1, device=device) * self.window).to(torch.int32),
            kv_indices=slots.reshape(-1).to(torch.int32),
            page_table=page_table,
            window_starts=torch.full((B,), start, dtype=torch.int32, device=device),
            seq_lens=torch.full((B,), self.context, dtype=torch.int32, device=device),
            sinks=torch.randn(m.hq, generator=gen, device=device) if m.sinks else None,
            out=torch.full((B, m.hq, m.d), float("nan"), dtype=DTYPE, device=device),
        )

    def _scales(self) -> dict:
        return dict(k_scale=FP8_SCALE, v_scale=FP8_SCALE) if self.fp8 else {}

    def run(self, lib, s: dict) -> None:
        if self.page_size == 1:
            where = dict(kv_indptr=s["kv_indptr"], kv_indices=s["kv_indices"])
        else:
            where = dict(page_table=s["page_table"], window_starts=s["window_starts"], seq_lens=s["seq_lens"], page_size=self.page_size)
        lib.swa_decode(
            s["q"],
            s["k_buffer"],
            s["v_buffer"],
            **where,
            sm_scale=self.model.sm_scale,
            sinks=s["sinks"],
            out=s["out"],
            max_window=self.window,
            **self._scales(),
        )

    def reference(self, ref, s: dict) -> torch.Tensor:
        """Every request, over the slots the inputs were built with (the page-table form's too)."""
        return ref.decode_attention(
            s["q"],
            s["k_buffer"],
            s["v_buffer"],
            s["kv_indptr"],
            s["kv_indices"],
            sm_scale=self.model.sm_scale,
            sinks=s["sinks"],
            **self._scales(),
        )

    def error(self, s: dict, expected: torch.Tensor) -> float:
        return _float_error(s["out"], None, expected)


@dataclass(frozen=True)
class ExtendCase:
    """``batch`` requests of ``new_tokens`` causal new tokens each after a ``prefix`` (CSR cached window)."""

    label: str
    model: Model
    batch: int
    new_tokens: int
    prefix: int
    check_rows: int = 256
    fp8: bool = False
    op = "extend"
    tolerance = BF16_TOL

    @property
    def id(self) -> str:
        m = self.model
        return f"extend-{self.label}-{m.name}-B{self.batch}-E{self.new_tokens}-pre{self.prefix}-W{m.window_left}-D{m.d}" + (
            "-fp8" if self.fp8 else ""
        )

    def make_inputs(self, gen: torch.Generator, device: str) -> dict:
        m, B, E, P = self.model, self.batch, self.new_tokens, self.prefix
        start = _window_start(P, m.window_left)
        slots, _, pool_slots = _scattered_windows(B, start, P, 1, gen, device)
        T = B * E
        kv_dtype = torch.float8_e4m3fn if self.fp8 else DTYPE
        return dict(
            q=_randn(T, m.hq, m.d, gen=gen, device=device),
            k=_randn(T, m.h, m.d, gen=gen, device=device),
            v=_randn(T, m.h, m.d, gen=gen, device=device),
            k_buffer=_nan_pool(pool_slots, slots, m.h, m.d, kv_dtype, gen, device),
            v_buffer=_nan_pool(pool_slots, slots, m.h, m.d, kv_dtype, gen, device),
            qo_indptr=(torch.arange(B + 1, device=device) * E).to(torch.int32),
            prefix_lens=torch.full((B,), P, dtype=torch.int32, device=device),
            kv_indptr=(torch.arange(B + 1, device=device) * (P - start)).to(torch.int32),
            kv_indices=slots.reshape(-1).to(torch.int32),
            sinks=torch.randn(m.hq, generator=gen, device=device) if m.sinks else None,
            out=torch.full((T, m.hq, m.d), float("nan"), dtype=DTYPE, device=device),
        )

    def run(self, lib, s: dict) -> None:
        lib.swa_extend(
            s["q"],
            s["k"],
            s["v"],
            s["k_buffer"],
            s["v_buffer"],
            s["qo_indptr"],
            s["prefix_lens"],
            window_left=self.model.window_left,
            kv_indptr=s["kv_indptr"],
            kv_indices=s["kv_indices"],
            causal=True,
            sm_scale=self.model.sm_scale,
            sinks=s["sinks"],
            out=s["out"],
            max_extend_len=self.new_tokens,
            **(dict(k_scale=FP8_SCALE, v_scale=FP8_SCALE) if self.fp8 else {}),
        )

    def reference(self, ref, s: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, float64 values) of the last ``check_rows`` new tokens of each request.

        Causal attention of a token does not depend on whether earlier tokens arrive in the same step or
        were cached, so the reference gets the tail alone, after a prefix of ``P + cut`` tokens whose
        cached window is gathered from the pool and from this step's first ``cut`` new keys.
        """
        m, E, P = self.model, self.new_tokens, self.prefix
        tail = min(E, self.check_rows)
        cut = E - tail
        start, ref_start = _window_start(P, m.window_left), _window_start(P + cut, m.window_left)
        cached = P - start
        rows, values = [], []
        for b in range(self.batch):
            q0 = b * E
            pool_slots = s["kv_indices"][b * cached : (b + 1) * cached].long()[ref_start - start :]
            new_from, new_to = q0 + max(0, ref_start - P), q0 + cut
            # the pool's values (fp8 times its scale) and this step's first new keys, in float32
            scale = FP8_SCALE if self.fp8 else 1.0
            k_win = torch.cat([s["k_buffer"][pool_slots].float() * scale, s["k"][new_from:new_to].float()])
            v_win = torch.cat([s["v_buffer"][pool_slots].float() * scale, s["v"][new_from:new_to].float()])
            n = k_win.shape[0]
            t = slice(q0 + cut, q0 + E)
            values.append(
                ref.extend_attention(
                    s["q"][t],
                    s["k"][t],
                    s["v"][t],
                    k_win,
                    v_win,
                    torch.tensor([0, tail]),
                    torch.tensor([0, n]),
                    torch.arange(n),
                    torch.tensor([P + cut]),
                    window_left=m.window_left,
                    sm_scale=m.sm_scale,
                    causal=True,
                    sinks=s["sinks"],
                )
            )
            rows.append(torch.arange(q0 + cut, q0 + E))
        return torch.cat(rows), torch.cat(values)

    def error(self, s: dict, expected: tuple[torch.Tensor, torch.Tensor]) -> float:
        return _float_error(s["out"], *expected)


@dataclass(frozen=True)
class IndicesCase:
    """Decode windows of ``batch`` requests of ``context`` tokens, translated to SWA slots, as a CSR list."""

    batch: int
    context: int
    window_left: int
    full_slots: int = 1 << 22
    op = "indices"
    tolerance = 0.0

    @property
    def id(self) -> str:
        return f"indices-decode-B{self.batch}-L{_tokens(self.context)}-W{self.window_left}"

    def make_inputs(self, gen: torch.Generator, device: str) -> dict:
        B, L = self.batch, self.context
        full = max(self.full_slots, 2 * B * L)
        req_to_token = torch.zeros(B + 1, L, dtype=torch.int32, device=device)
        req_to_token[1:] = (torch.randperm(full, generator=gen, device=device)[: B * L] + 1).view(B, L).to(torch.int32)
        # full_to_swa_index_mapping: [full + page_size + 1] entries, 0 -> 0 (none), the last -1 -> -1
        mapping = torch.randint(1, 2 * B * (self.window_left + 1) + 1, (full + 2,), generator=gen, device=device)
        mapping[0], mapping[-1] = 0, -1
        n = min(L, self.window_left + 1)
        poison = lambda size: torch.full((size,), -7, dtype=torch.int32, device=device)
        return dict(
            req_to_token=req_to_token,
            mapping=mapping,
            req_pool_indices=torch.arange(1, B + 1, dtype=torch.int32, device=device),
            seq_lens=torch.full((B,), L, dtype=torch.int32, device=device),
            out=(poison(B + 1), poison(B * n), poison(B)),
        )

    def run(self, lib, s: dict) -> None:
        lib.build_window_indices(
            s["req_to_token"],
            s["req_pool_indices"],
            s["seq_lens"],
            window_left=self.window_left,
            mapping=s["mapping"],
            page_size=1,
            out=lib.WindowIndices(*s["out"]),
        )

    def reference(self, ref, s: dict) -> tuple[torch.Tensor, ...]:
        return ref.decode_window_indices(s["req_to_token"], s["req_pool_indices"], s["seq_lens"], self.window_left, s["mapping"])

    def error(self, s: dict, expected: tuple[torch.Tensor, ...]) -> float:
        """Entries that differ from the reference (kv_indptr, kv_indices, window_starts)."""
        return float(sum(int((got.cpu() != want.cpu()).sum()) for got, want in zip(s["out"], expected)))


def _catalog() -> dict[str, list]:
    """The cases of each selection: full, quick (a subset of full) and smoke."""
    M = MODELS
    decode = [DecodeCase(M[name], B, 8192) for name in ("g3", "g4swa", "mistral", "gptoss") for B in (1, 8, 64)]
    decode += [DecodeCase(M["g4full"], B, L) for B, L in ((1, 4096), (1, 32768), (8, 4096), (64, 4096))]
    decode += [DecodeCase(M[name], B, 8192, page_size=16) for name in ("g3", "g4swa") for B in (8, 64)]
    decode += [DecodeCase(M[name], 64, 8192, fp8=True) for name in ("g3", "g4swa")]
    extend = [ExtendCase("prefill", M[name], 1, 8192, 0) for name in ("g3", "g4swa")]
    extend += [ExtendCase("chunk", M["g3"], 4, 1024, 4096)]
    extend += [ExtendCase("verify", M[name], B, 8, 4096) for name in ("g3", "g4swa") for B in (1, 8)]
    extend += [ExtendCase("chunk", M["g3"], 4, 1024, 4096, fp8=True)]
    extend += [ExtendCase("verify", M[name], 8, 8, 4096, fp8=True) for name in ("g3", "g4swa")]
    full = decode + extend + [IndicesCase(64, 8192, 1023)]
    quick_ids = {
        "decode-g3-B1-L8k-W1023-D128-P1",
        "decode-g3-B64-L8k-W1023-D128-P1",
        "decode-g4swa-B64-L8k-W1023-D256-P1",
        "decode-g4full-B1-L32k-W-1-D512-P1",
        "decode-mistral-B64-L8k-W4095-D128-P1",
        "decode-gptoss-B8-L8k-W127-D64-P1",
        "decode-g3-B64-L8k-W1023-D128-P16",
        "decode-g3-B64-L8k-W1023-D128-P1-fp8",
        "extend-prefill-g3-B1-E8192-pre0-W1023-D128",
        "extend-chunk-g3-B4-E1024-pre4096-W1023-D128",
        "extend-verify-g3-B8-E8-pre4096-W1023-D128",
    }
    smoke = [
        DecodeCase(M["tswa"], 2, 40),
        DecodeCase(M["twide"], 2, 40, page_size=4),
        DecodeCase(M["tfull"], 2, 24),
        DecodeCase(M["tsink"], 2, 40),
        DecodeCase(M["tswa"], 2, 40, fp8=True),
        ExtendCase("prefill", M["tswa"], 1, 48, 0, check_rows=16),
        ExtendCase("chunk", M["tswa"], 2, 16, 40, check_rows=8),
        ExtendCase("verify", M["twide"], 2, 4, 40),
        ExtendCase("chunk", M["tswa"], 2, 16, 40, check_rows=8, fp8=True),
        IndicesCase(2, 40, 15, full_slots=1024),
    ]
    return dict(full=full, quick=[c for c in full if c.id in quick_ids], smoke=smoke)


CATALOG = _catalog()
CASES = {c.id: c for cases in CATALOG.values() for c in cases}


# ---------------------------------------------------------------------------------------------- worker


def _import_tree(tree_dir: Path):
    """``(triton_swa, triton_swa_reference)`` of ``tree_dir``; ImportError unless every module of both
    packages was loaded from the tree. The reference comes first (``triton_swa`` may import it): from
    ``DIR/reference`` under its package name, else (a tree laid out otherwise) from ``PYTHONPATH``."""
    folder = tree_dir / "reference"
    if (folder / "__init__.py").is_file():  # a source tree: never a triton_swa_reference installed elsewhere
        spec = importlib.util.spec_from_file_location(
            "triton_swa_reference", folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        ref = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = ref
        spec.loader.exec_module(ref)
    else:
        import triton_swa_reference as ref
    import triton_swa

    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if name.split(".")[0] in ("triton_swa", "triton_swa_reference") and file and not Path(file).resolve().is_relative_to(tree_dir):
            raise ImportError(f"{name} was imported from {file}, outside the tree {tree_dir}")
    return triton_swa, ref


def _emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def _rotation_count(bytes_per_set: int, max_sets: int) -> int:
    """Input sets to cycle: together over 4x the L2, at least 2, within ``max_sets`` and SET_MEMORY."""
    want = max(2, math.ceil(4 * L2_BYTES / max(bytes_per_set, 1)))
    return max(1, min(want, max_sets, SET_MEMORY // max(bytes_per_set, 1)))


def _set_bytes(s: dict) -> int:
    tensors = [t for v in s.values() for t in (v if isinstance(v, tuple) else (v,)) if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def _percentiles(times: list[float]) -> tuple[float, float, float]:
    p20, p50, p80 = torch.tensor(times, dtype=torch.float64).quantile(torch.tensor([0.2, 0.5, 0.8], dtype=torch.float64))
    return float(p20), float(p50), float(p80)


def _time_graph(fns, reps: int) -> tuple[float, float, float]:
    """(p20, p50, p80) us of one call: one rep calls every fn once, captured in a CUDA graph and replayed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # eager warm-up on a side stream, as torch recommends before a capture
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in fns:
            f()
    for _ in range(WARM_REPLAYS):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(fns))
    return _percentiles(times)


def _time_eager(fns, reps: int) -> tuple[float, float, float]:
    """(p20, p50, p80) us of one call, timed on the host (the CPU interpreter: no graphs, no events)."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for f in fns:
            f()
        times.append((time.perf_counter() - t0) * 1e6 / len(fns))
    return _percentiles(times)


def _measure(case, lib, ref, device: str, reps: int) -> dict:
    """Check ``case`` on input set 0, then time it over rotated sets; the row of the case."""
    row = dict(kind="case", case=case.id, us_p50=None, us_p20=None, us_p80=None, max_abs_err=None, status="ok")
    t0 = time.perf_counter()
    seed = zlib.crc32(case.id.encode()) << 8
    make = lambda i: case.make_inputs(torch.Generator(device=device).manual_seed(seed + i), device)
    try:
        sets = [make(0)]
        case.run(lib, sets[0])
        expected = case.reference(ref, sets[0])
        row["max_abs_err"] = err = case.error(sets[0], expected)
        if not err <= case.tolerance:
            row["status"] = "WRONG"
            return row
        on_gpu = device == "cuda"
        sets += [make(i) for i in range(1, _rotation_count(_set_bytes(sets[0]), MAX_SETS if on_gpu else CPU_SETS))]
        fns = [functools.partial(case.run, lib, s) for s in sets]
        p20, p50, p80 = _time_graph(fns, reps) if on_gpu else _time_eager(fns, CPU_REPS)
        row.update(us_p20=round(p20, 3), us_p50=round(p50, 3), us_p80=round(p80, 3), sets=len(sets))
        err = case.error(sets[0], expected)
        if not err <= case.tolerance:
            row.update(max_abs_err=err, status="WRONG-REPLAY")
    except Exception as exc:  # reported as the case's status; the next case still runs
        message = (str(exc).strip().splitlines() or [""])[0][:160]
        row["status"] = f"ERROR {type(exc).__name__}: {message}"
    finally:
        row["seconds"] = round(time.perf_counter() - t0, 1)
        sets = fns = expected = None  # drop the inputs (and the graph's closures) before freeing the cache
        if device == "cuda":
            torch.cuda.empty_cache()
    return row


def worker(args) -> int:
    """Run ``args.cases`` with the tree on PYTHONPATH; one JSON line on stdout per case (and one first)."""
    warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")
    warnings.filterwarnings("ignore", message="Conversion of an array with ndim > 0 to a scalar")
    torch.set_num_threads(1)
    tree_dir = Path(args.tree_dir).resolve()
    lib, ref = _import_tree(tree_dir)
    import triton

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cases = [CASES[c] for c in args.cases.split(",")]
    smoke_ids = {c.id for c in CATALOG["smoke"]}
    if device == "cpu" and any(c.id not in smoke_ids for c in cases):
        print("no CUDA device: only the --smoke cases run on the CPU", file=sys.stderr)
        return 2
    _emit(
        dict(
            kind="env",
            triton_swa=lib.__file__,
            reference=ref.__file__,
            triton=triton.__version__,
            torch=torch.__version__,
            gpu=torch.cuda.get_device_name() if device == "cuda" else "cpu",
        )
    )
    for case in cases:
        if time.time() >= args.stop_at:
            break
        _emit(_measure(case, lib, ref, device, args.reps))
    return 0


# ---------------------------------------------------------------------------------------------- driver


def _run_worker(name: str, tree_dir: Path, case_ids: list[str], args, deadline: float, env_info: dict):
    """One worker over ``case_ids``: (rows it reported, exit status, whether it was killed past the deadline,
    whether it got as far as its cases)."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--tree-dir",
        str(tree_dir),
        "--cases",
        ",".join(case_ids),
        "--stop-at",
        str(deadline),
        "--reps",
        str(args.reps),
    ]
    env = dict(os.environ, PYTHONPATH=str(tree_dir), PYTHONUNBUFFERED="1")
    env.pop("TRITON_SWA_DEBUG", None)  # the debug guard syncs with the host: no graph capture
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    killed = threading.Event()

    def kill() -> None:
        killed.set()
        proc.kill()

    killer = threading.Timer(max(0.0, deadline - time.time()) + KILL_GRACE_S, kill)
    killer.start()
    rows, started = [], False
    for line in proc.stdout:
        if not line.startswith("{"):
            print(line, end="", flush=True)
            continue
        record = json.loads(line)
        if record.pop("kind") == "env":
            started = True
            env_info[name] = record
            print(
                f"  {name}: triton_swa {record['triton_swa']}, reference {record['reference']}, "
                f"{record['gpu']}, torch {record['torch']}, triton {record['triton']}",
                flush=True,
            )
            continue
        rows.append(record)
        us = "-" if record["us_p50"] is None else f"{record['us_p50']:.2f} us"
        err = "-" if record["max_abs_err"] is None else f"{record['max_abs_err']:.1e}"
        sets = f"{record['sets']} sets" if "sets" in record else ""
        print(
            f"  {name:<8} {record['case']:<48} {us:>12}  err {err:>8}  {sets:>8}  {record['seconds']:>6.1f} s  {record['status']}",
            flush=True,
        )
    rc = proc.wait()
    killer.cancel()
    return rows, rc, killed.is_set(), started


def _run_tree(name: str, tree_dir: Path, case_ids: list[str], rnd: int, args, deadline: float, env_info: dict) -> list:
    """All cases of one (round, tree); after a crash, a new worker goes on from the next case."""
    rows, pending = [], list(case_ids)
    while pending and time.time() < deadline:
        got, rc, killed, started = _run_worker(name, tree_dir, pending, args, deadline, env_info)
        rows += got
        done = {r["case"] for r in got}
        pending = [c for c in pending if c not in done]
        if rc == 0 or not pending:
            break
        if not started:  # died before its first case: the tree does not import, or no device
            print(f"  {name} round {rnd}: worker failed (exit {rc}) before its first case; skipping the tree", flush=True)
            rows += [dict(case=c, status=f"worker failed (exit {rc})") for c in pending]
            break
        status = "killed (budget)" if killed else f"crashed (exit {rc})"
        print(f"  {name} round {rnd}: worker {status} in {pending[0]}", flush=True)
        rows.append(dict(case=pending[0], status=status))
        pending = pending[1:]
        if killed:
            break
    for r in rows:
        r.update(tree=name, round=rnd)
    return rows


def _median_us(rows: list[dict]) -> float | None:
    times = [r["us_p50"] for r in rows if r["status"] == "ok"]
    return statistics.median(times) if times else None


def _summary(rows: list[dict], cases: list, trees: list[str]) -> tuple[str, bool]:
    """The markdown table (median over rounds per tree), the per-op geomeans, and whether all was ok."""
    base, cand = trees
    lines = [
        f"| case | {base} us | {cand} us | {cand}/{base} time | speedup {base}/{cand} | status |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    speedups: dict[str, list[tuple[float, str]]] = {}
    all_ok = True
    for case in cases:
        mine = [r for r in rows if r["case"] == case.id]
        if not mine:
            lines.append(f"| {case.id} | | | | | not run |")
            continue
        us = {t: _median_us([r for r in mine if r["tree"] == t]) for t in trees}
        bad = [
            f"{r['tree']} r{r['round']}: {r['status'][:60]}" + (f" (err {r['max_abs_err']:.1e})" if "WRONG" in r["status"] else "")
            for r in mine
            if r["status"] != "ok"
        ]
        missing = [t for t in trees if not any(r["tree"] == t for r in mine)]
        status = "; ".join(bad + [f"{t}: not run" for t in missing]) or "ok"
        all_ok &= status == "ok"
        cells = [f"{us[t]:.2f}" if us[t] is not None else "-" for t in trees]
        if us[base] and us[cand]:
            speedups.setdefault(case.op, []).append((us[base] / us[cand], case.id))
            cells += [f"{us[cand] / us[base]:.3f}", f"{us[base] / us[cand]:.3f}x"]
        else:
            cells += ["-", "-"]
        lines.append(f"| {case.id} | " + " | ".join(cells) + f" | {status} |")
    lines.append("")
    for op, values in speedups.items():
        geomean = math.exp(statistics.fmean(math.log(v) for v, _ in values))
        (lo, lo_case), (hi, hi_case) = min(values), max(values)
        lines.append(
            f"{op}: geomean speedup {base}/{cand} {geomean:.3f}x over {len(values)} cases; "
            f"min {lo:.3f}x ({lo_case}), max {hi:.3f}x ({hi_case})"
        )
    return "\n".join(lines), all_ok


def _write_csv(rows: list[dict], env_info: dict, args) -> None:
    if not args.git_sha:
        print("WARNING: no --git-sha given: the CSV is not written (rows without their commit mislead later readers)")
        return
    gpu = next(iter(env_info.values()), {}).get("gpu", "unknown")
    today = datetime.date.today().isoformat()
    path = Path(args.out) if args.out else RESULTS / f"ab-{today}-{gpu.replace(' ', '_')}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        if new:
            writer.writeheader()
        for r in rows:
            info = env_info.get(r["tree"], {})
            writer.writerow(
                dict(
                    r, gpu=info.get("gpu", ""), torch=info.get("torch", ""), triton=info.get("triton", ""), git_sha=args.git_sha, date=today
                )
            )
    print(f"wrote {len(rows)} rows to {path}")


def _parse_trees(specs: list[str]) -> list[tuple[str, Path]]:
    trees = []
    for spec in specs:
        name, sep, folder = spec.partition("=")
        path = Path(folder).resolve()
        if not sep or not name or not (path / "triton_swa" / "__init__.py").is_file():
            raise SystemExit(f"--tree {spec!r}: expected NAME=DIR with DIR/triton_swa/__init__.py")
        trees.append((name, path))
    if len(trees) != 2 or trees[0][0] == trees[1][0]:
        raise SystemExit("give exactly two --tree NAME=DIR with different names (baseline first)")
    return trees


def driver(args) -> int:
    trees = _parse_trees(args.tree or [])
    cases = CATALOG["smoke" if args.smoke else "quick" if args.quick else "full"]
    if args.cases:
        cases = [c for c in cases if any(part in c.id for part in args.cases.split(","))]
    if not cases:
        raise SystemExit("no case selected")
    deadline = time.time() + args.budget_s
    t0 = time.time()
    print(f"{len(cases)} cases x {len(trees)} trees x {args.rounds} rounds, budget {args.budget_s:.0f} s", flush=True)
    # The trees' order alternates between rounds: A B, B A, A B, ...
    jobs = [(rnd, tree) for rnd in range(1, args.rounds + 1) for tree in (trees if rnd % 2 else trees[::-1])]
    rows, env_info = [], {}
    for done, (rnd, (name, tree_dir)) in enumerate(jobs):
        if time.time() >= deadline:
            print(f"budget of {args.budget_s:.0f} s spent: {len(jobs) - done} of {len(jobs)} worker runs not started", flush=True)
            break
        print(f"round {rnd}/{args.rounds}: {name} ({tree_dir})", flush=True)
        rows += _run_tree(name, tree_dir, [c.id for c in cases], rnd, args, deadline, env_info)
    print(f"\ntotal {time.time() - t0:.0f} s\n")
    table, all_ok = _summary(rows, cases, [name for name, _ in trees])
    print(table)
    _write_csv(rows, env_info, args)
    return 0 if all_ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", help="NAME=DIR of a source tree (twice: the baseline first)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=30, help="timed graph replays per case")
    parser.add_argument("--quick", action="store_true", help="a subset of about 10 cases")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (they also run on a CPU in the interpreter)")
    parser.add_argument("--cases", help="driver: comma list of substrings selecting case ids; worker: the case ids")
    parser.add_argument("--git-sha", help="commit recorded in every CSV row (required to write the CSV)")
    parser.add_argument("--out", help="CSV path (default bench/results/ab-<date>-<gpu>.csv, appended to)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="start no new work after this many seconds")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree-dir", help=argparse.SUPPRESS)
    parser.add_argument("--stop-at", type=float, default=math.inf, help=argparse.SUPPRESS)
    args = parser.parse_args()
    return worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    sys.exit(main())
