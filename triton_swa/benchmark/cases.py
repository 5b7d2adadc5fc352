"""What ``triton-swa bench`` measures: model-like attention shapes and the cases built on them."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["SHAPES", "Case", "Shape", "catalog"]


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
OPS = ("decode", "prefill", "verify")


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
        tail = f"-E{self.new}" if self.op == "verify" else ""
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
        """Cached keys the step reads: the window of its first new token, from the prefix."""
        return min(self.prefix, self.keys_seen(self.prefix) - 1) if self.op != "decode" else self.keys_seen(self.prefix)

    @property
    def window_start(self) -> int:
        """Position of the first cached key the step reads (decode: its own token is cached too)."""
        return self.prefix + (1 if self.op == "decode" else 0) - self.window

    def nbytes(self) -> int:
        """The fewest bytes the op moves: the cached window's K and V once, new K/V, q read, o written."""
        s, kv = self.shape, 1 if self.fp8 else 2
        cached = self.batch * self.window * s.h * 2 * s.d * kv
        if self.op == "decode":
            return cached + 2 * self.batch * s.hq * s.d * 2
        tokens = self.batch * self.new
        return cached + tokens * (2 * s.hq * s.d + 2 * s.h * s.d) * 2

    def flops(self) -> int:
        """4 * D per attended (query head, key) pair."""
        pairs = sum(self.keys_seen(self.prefix + i) for i in range(self.new))
        return 4 * self.shape.d * self.shape.hq * self.batch * pairs


def catalog(ops=OPS, shapes=None, batches=None, contexts=None, pages=None, quick=False, smoke=False) -> list[Case]:
    """The cases of a run: the default grid (or ``quick``'s subset), narrowed by the arguments."""
    if smoke:
        t = SHAPES["tiny"]
        cases = [Case("decode", t, 2, 40), Case("decode", t, 2, 40, page_size=4), Case("decode", t, 2, 40, fp8=True)]
        cases += [Case("prefill", t, 1, 48, new=48), Case("verify", t, 2, 40, new=4), Case("verify", t, 2, 40, new=4, fp8=True)]
        return [c for c in cases if c.op in ops]
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
            elif op == "verify":
                L = (contexts or [4096])[0] + 8
                for B in batches or ([1, 8] if not quick else [8]):
                    cases.append(Case("verify", s, B, L, new=8, page_size=(pages or [1])[0]))
                if not quick and s.d in (128, 256) and s.window_left >= 0 and (not batches or 8 in batches):
                    cases.append(Case("verify", s, 8, L, new=8, page_size=(pages or [1])[0], fp8=True))  # an fp8 prefix
    return cases


def tbps(nbytes: int, us: float) -> float:
    return nbytes / (us * 1e-6) / 1e12 if us and math.isfinite(us) else math.nan
