"""What ``triton-swa bench`` measures: model-like attention shapes and the cases built on them."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["GRIDS", "OPS", "SHAPES", "Case", "Shape", "catalog"]


@dataclass(frozen=True)
class Shape:
    """One attention layer: query heads, KV heads, head dim, window (``-1``: full attention), sinks."""

    name: str
    hq: int
    h: int
    d: int
    window_left: int
    sinks: bool = False


SHAPES = {
    s.name: s
    for s in (
        Shape("g3", 32, 16, 128, 1023),  # Gemma-3-like sliding layer
        Shape("g4swa", 32, 16, 256, 1023),  # Gemma-4-like sliding layer
        Shape("g4full", 32, 4, 512, -1),  # Gemma-4-like full layer, 512-wide heads
        Shape("mistral", 32, 8, 128, 4095),
        Shape("gptoss", 64, 8, 64, 127, sinks=True),
        Shape("tiny", 4, 2, 32, 15),  # --smoke: small enough for Triton's interpreter
    )
}
ATTENTION_OPS = ("decode", "prefill", "verify")
# ``indices``: the decode window's index build (``build_window_indices`` / ``build_window_page_table``
# with the SWA mapping), ``step``: a whole model step and its host cost (:mod:`.step`, no cases),
# ``sglang_backend``: SGLang's whole Triton backend beside ours on SGLang's pools (:mod:`.sglang_backend`,
# its own cases; needs SGLang)
OPS = (*ATTENTION_OPS, "indices", "step", "sglang_backend")
# ``heuristics``: the grids the launch heuristics were chosen on (decode at B 1-256, L 4k / 32k;
# prefill of 2k-32k tokens with and without a 32k prefix; verify with 4-16 drafts; index builds up to B 1024)
GRIDS = ("default", "heuristics")


@dataclass(frozen=True)
class Case:
    """One op on one shape: ``batch`` requests of ``context`` tokens, the last ``new`` of them new
    (decode: 1; prefill: all, no cached prefix; verify: the drafts after a cached prefix)."""

    op: str
    shape: Shape
    batch: int
    context: int
    page_size: int = 1
    fp8: bool = False
    new: int = 1

    @property
    def id(self) -> str:
        s = self.shape
        ctx = f"{self.context // 1024}k" if self.context % 1024 == 0 else str(self.context)
        tail = f"-E{self.new}" if self.op == "verify" or (self.op == "prefill" and self.prefix) else ""
        return f"{self.op}-{s.name}-B{self.batch}-L{ctx}{tail}-W{s.window_left}-D{s.d}-P{self.page_size}" + ("-fp8" if self.fp8 else "")

    @property
    def prefix(self) -> int:
        return self.context - self.new

    def keys_seen(self, pos: int) -> int:
        """Keys a query at position ``pos`` attends (docs/contract.md §1: ``[pos - W, pos]``)."""
        w = self.shape.window_left
        return pos + 1 if w < 0 else min(pos + 1, w + 1)

    @property
    def window(self) -> int:
        """Cached keys the step reads: the window of its first new token, from the prefix (decode and
        its index build: the last ``W + 1`` tokens, its own included)."""
        return self.keys_seen(self.prefix) if self.op in ("decode", "indices") else min(self.prefix, self.keys_seen(self.prefix) - 1)

    @property
    def window_start(self) -> int:
        """Position of the first cached key the step reads (decode: its own token is cached too)."""
        return self.prefix + (1 if self.op in ("decode", "indices") else 0) - self.window

    def nbytes(self) -> int:
        """The fewest bytes the op moves: the cached window's K and V once, new K/V, q read, o written.
        An index build: per index the full slot read (int32), its mapping entry (int64) and the index
        written (int32), per page at page size > 1; and per request its row, length and start."""
        s, kv = self.shape, 1 if self.fp8 else 2
        if self.op == "indices":
            ps = self.page_size
            entries = self.window if ps == 1 else (self.context - 1) // ps - self.window_start // ps + 1
            return self.batch * (entries * (4 + 8 + 4) + 8 + 8 + 4 + (4 if ps == 1 else 0))
        cached = self.batch * self.window * s.h * 2 * s.d * kv
        if self.op == "decode":
            return cached + 2 * self.batch * s.hq * s.d * 2
        tokens = self.batch * self.new
        return cached + tokens * (2 * s.hq * s.d + 2 * s.h * s.d) * 2

    def flops(self) -> int:
        """4 * D per attended (query head, key) pair (none for an index build)."""
        if self.op == "indices":
            return 0
        pairs = sum(self.keys_seen(self.prefix + i) for i in range(self.new))
        return 4 * self.shape.d * self.shape.hq * self.batch * pairs


def catalog(
    ops=ATTENTION_OPS, shapes=None, batches=None, contexts=None, pages=None, quick=False, smoke=False, grid="default"
) -> list[Case]:
    """The cases of a run: the ``grid`` (``default``, ``quick``'s subset of it, or ``heuristics``),
    narrowed by the arguments."""
    if smoke:
        t = SHAPES["tiny"]
        cases = [Case("decode", t, 2, 40), Case("decode", t, 2, 40, page_size=4), Case("decode", t, 2, 40, fp8=True)]
        cases += [Case("prefill", t, 1, 48, new=48), Case("verify", t, 2, 40, new=4), Case("verify", t, 2, 40, new=4, fp8=True)]
        cases += [Case("indices", t, 3, 64), Case("indices", t, 2, 100, page_size=16)]
        return [c for c in cases if c.op in ops]
    if grid == "heuristics":
        return _heuristics(ops, shapes, batches, contexts, pages)
    names = shapes or [n for n in SHAPES if n != "tiny"]
    cases = []
    for name in names:
        s = SHAPES[name]
        for op in ops:
            if op == "decode":
                ctxs = contexts or ([4096, 32768] if s.window_left < 0 else [8192])
                for B in batches or ([1, 64] if quick else [1, 8, 64]):
                    for L in ctxs:
                        if not contexts and B > 8 and L > 8192 and s.window_left < 0:
                            continue  # a 16 GB window per input set: left to an explicit --ctx
                        for p in pages or ([1] if quick else [1, 16]):
                            cases.append(Case("decode", s, B, L, page_size=p))
                if not quick and s.d in (128, 256) and s.window_left >= 0:
                    page = (pages or [1])[0]
                    cases += [Case("decode", s, B, ctxs[0], page_size=page, fp8=True) for B in (8, 64) if not batches or B in batches]
            elif op == "prefill" and s.window_left >= 0:
                n = (contexts or [8192])[0]
                cases.append(Case("prefill", s, 1, n, new=n, page_size=(pages or [1])[0]))
            elif op == "prefill" and not quick:
                # a full layer's chunked prefill, as an engine runs a 32k prompt in chunks of 8192: the
                # first chunk and the last (over a 24k prefix). On Gemma-4-like (512-wide heads) these
                # are most of the time to first token (docs/sglang.md, "Where the time goes").
                n = (contexts or [8192])[0]
                page = (pages or [1])[0]
                cases += [Case("prefill", s, 1, n, new=n, page_size=page), Case("prefill", s, 1, 4 * n, new=n, page_size=page)]
            elif op == "verify":
                L = (contexts or [4096])[0] + 8
                for B in batches or ([1, 8] if not quick else [8]):
                    cases.append(Case("verify", s, B, L, new=8, page_size=(pages or [1])[0]))
                if not quick and s.d in (128, 256) and s.window_left >= 0 and (not batches or 8 in batches):
                    cases.append(Case("verify", s, 8, L, new=8, page_size=(pages or [1])[0], fp8=True))  # an fp8 prefix
            elif op == "indices" and name in ("g3", "mistral"):  # W 1023 and 4095
                for B in batches or ([256] if quick else [1, 64, 256]):
                    for L in contexts or ([32768] if quick else [4096, 32768]):
                        cases += [Case("indices", s, B, L, page_size=p) for p in pages or ([1] if quick else [1, 16])]
    return cases


def _heuristics(ops, shapes, batches, contexts, pages) -> list[Case]:
    """The grids behind the launch heuristics (formerly bench/bench_decode.py and bench_extend.py)."""
    cases = []
    for name in shapes or [n for n in SHAPES if n != "tiny"]:
        s = SHAPES[name]
        if "decode" in ops:
            for B in batches or [1, 8, 64, 256]:
                for L in contexts or [4096, 32768]:
                    if B > 8 and L > 8192 and s.window_left < 0 and not contexts:
                        continue  # 16-64 GB windows per input set
                    cases += [Case("decode", s, B, L, page_size=p) for p in pages or [1, 16]]
        if s.window_left != 1023 or s.d not in (128, 256):
            continue  # prefill and verify: the sliding layers of W 1023 (Gemma-3 / 4-like heads)
        for p in pages or [1, 16]:
            if "prefill" in ops:
                for n in contexts or [2048, 8192, 32768]:
                    cases += [Case("prefill", s, 1, prefix + n, new=n, page_size=p) for prefix in (0, 32768)]
            if "verify" in ops and s.d == 128:
                for B in batches or [1, 8, 64]:
                    cases += [Case("verify", s, B, 8192 + e, new=e, page_size=p) for e in (4, 8, 16)]
    for name in ("g3", "mistral") if "indices" in ops else ():  # W 1023 and 4095
        if not shapes or name in shapes:
            for B in batches or [1, 64, 256, 1024]:
                for L in contexts or [4096, 32768]:
                    cases += [Case("indices", SHAPES[name], B, L, page_size=p) for p in pages or [1, 16]]
    return cases


def tbps(nbytes: int, us: float) -> float:
    return nbytes / (us * 1e-6) / 1e12 if us and math.isfinite(us) else math.nan
