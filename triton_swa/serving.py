"""A small serving loop over triton-swa's pools: the demo's engine, and an example for engine builders.

It is not a server. :class:`Engine` takes a stream of :class:`Request` s (each with an arrival step)
and serves them with continuous batching: requests join when a ``req_to_token`` row and their KV
reservation fit, prompts are prefilled in chunks of at most ``chunk_size`` tokens per step across
requests, finished requests free their slots and rows, and after every step each request's tokens
that no later query can see lose their SWA slots (``free_swa``, whole pages).

Decoding is greedy. With a ``draft`` worker it is speculative, in the Gemma 4 + DFlash topology: the
draft owns its own SWA-backed KV pool but shares the target's ``req_to_token``, allocator and
``full_to_swa_index_mapping``, so one full slot names one token in both pools. A round per step:

1. the draft catches up on the committed tokens it has not seen (EXTEND, one or two per request),
   proposing ``d_1``, then proposes ``d_2 .. d_k`` by DECODE steps (a chain);
2. the target scores ``[pending, d_1 .. d_k]`` in one TARGET_VERIFY (``k + 1`` queries per request,
   causal among themselves) and keeps the longest prefix of drafts that equal its own greedy tokens,
   plus its next token (the bonus): ``accepted + 1`` tokens per round, ``k + 1`` at best;
3. the slots of rejected drafts are freed (mid-page: the allocator keeps a page while any of its
   slots is owned).

A worker is a model over its pool (see :class:`Worker`); ``triton_swa.integrations.transformers``
provides one for Hugging Face models. The engine never touches K/V itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from .engine import ForwardBatch, SpecInfo, SpeculativeAlgorithm
from .mem import alloc_positions, evict_swa_window

__all__ = ["Engine", "Request", "RoundStats", "Worker"]


class Worker(Protocol):
    """A model over a KV pool, as the engine drives it.

    ``runner`` has SGLang's ``ModelRunner`` names (``token_to_kv_pool``, ``token_to_kv_pool_allocator``,
    ``req_to_token_pool``, ``sliding_window_size``, ``device``).
    """

    runner: object

    def forward(self, batch: ForwardBatch, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Write the step's K/V and return the logits of every packed token, `[T, vocab]`."""


@dataclass
class Request:
    """One request of the stream. ``tokens`` holds the prompt, then what was generated."""

    rid: int
    prompt: list[int]
    max_new_tokens: int
    arrival: int = 0  # the engine step at which it may start
    tokens: list[int] = field(default_factory=list)
    row: int = -1  # its req_to_token row while it runs
    kv_len: int = 0  # tokens[:kv_len] have target K/V
    draft_kv_len: int = 0  # tokens[:draft_kv_len] have draft K/V
    evicted: int = 0  # tokens[:evicted] have no SWA slot
    finished: bool = False

    def __post_init__(self):
        if not self.prompt:
            raise ValueError(f"request {self.rid}: the prompt is empty")
        if self.max_new_tokens < 1:
            raise ValueError(f"request {self.rid}: max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.tokens:
            self.tokens = list(self.prompt)

    @property
    def output(self) -> list[int]:
        return self.tokens[len(self.prompt) :]

    @property
    def prefilling(self) -> bool:
        return self.kv_len < len(self.prompt)


@dataclass
class RoundStats:
    """What one engine step did."""

    step: int
    mode: str  # "prefill", "decode", "speculative", or "idle" (nothing has arrived yet)
    requests: list[int]  # rids served
    tokens: int  # query tokens the target ran
    committed: int  # tokens committed to outputs
    seconds: float
    accepted: list[int] = field(default_factory=list)  # per request (speculative): accepted drafts
    proposals: dict[int, list[int]] = field(default_factory=dict)  # rid -> draft tokens (speculative)


def _pages(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)


class Engine:
    """Continuous batching with chunked prefill, window eviction and (optional) speculative decoding.

    Args:
        target (Worker): the model that decides every token.
        draft (Worker | None): a draft over its own SWA-backed pool, sharing ``target``'s
            ``req_to_token`` pool and allocator; None decodes one token per step.
        num_draft_tokens (int): ``k``, drafts proposed per round.
        chunk_size (int): most prompt tokens prefilled per step, over all requests.
        max_running (int): most requests served at once.
        eos_token_id (int | None): a request stops after generating it.

    Raises:
        ValueError: the draft does not share the target's ``req_to_token`` pool and allocator, or
            a bad number.
    """

    def __init__(
        self,
        target: Worker,
        draft: Worker | None = None,
        *,
        num_draft_tokens: int = 4,
        chunk_size: int = 64,
        max_running: int = 8,
        eos_token_id: int | None = None,
    ):
        self.target, self.draft = target, draft
        r = target.runner
        self.allocator = r.token_to_kv_pool_allocator
        self.req_pool = r.req_to_token_pool
        self.req_to_token = self.req_pool.req_to_token
        self.window = int(r.sliding_window_size)
        self.page_size = int(getattr(self.allocator, "page_size", 1))
        self.device = torch.device(r.device)
        if draft is not None and (
            draft.runner.req_to_token_pool is not self.req_pool or draft.runner.token_to_kv_pool_allocator is not self.allocator
        ):
            raise ValueError(
                "the draft worker must share the target's req_to_token pool and allocator (one full slot names one token in both pools)"
            )
        for name, value, least in (
            ("num_draft_tokens", num_draft_tokens, 1),
            ("chunk_size", chunk_size, 1),
            ("max_running", max_running, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
        self.k = num_draft_tokens
        self.chunk_size, self.max_running, self.eos = chunk_size, max_running, eos_token_id
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.finished: list[Request] = []
        self.step_id = 0
        self._reserved: dict[int, tuple[int, int]] = {}

    # ----- admission and bookkeeping ------------------------------------------------------------

    def submit(self, requests: Iterable[Request]) -> None:
        """Queue requests; each starts at its ``arrival`` step or later.

        Raises:
            ValueError: a request id already submitted, or a request longer than ``max_context_len``.
        """
        known = {q.rid for q in self.waiting + self.running + self.finished}
        for req in requests:
            if req.rid in known:
                raise ValueError(f"request id {req.rid} was already submitted")
            known.add(req.rid)
            need = len(req.prompt) + req.max_new_tokens + self.k + 2
            if need > self.req_to_token.shape[1]:
                raise ValueError(f"request {req.rid} needs {need} positions, more than max_context_len {self.req_to_token.shape[1]}")
            self.waiting.append(req)
        self.waiting.sort(key=lambda q: (q.arrival, q.rid))

    def _reservation(self, req: Request) -> tuple[int, int]:
        """Full and SWA slots a request may hold at its peak (so that no step runs out)."""
        ps, slack = self.page_size, self.k + 2
        full = _pages(len(req.prompt) + req.max_new_tokens + slack, ps) * ps
        if self.window < 0:
            return full, full
        chunk = min(self.chunk_size, len(req.prompt))  # the most prompt tokens one step brings
        swa = (_pages(self.window + 1 + max(chunk, slack) + slack, ps) + 2) * ps
        return full, min(full, swa)

    def _admit(self) -> None:
        alloc = self.allocator
        cap_full = getattr(alloc, "size", None) or alloc.available_size()
        cap_swa = getattr(alloc, "size_swa", cap_full)
        while self.waiting and self.waiting[0].arrival <= self.step_id and len(self.running) < self.max_running:
            req = self.waiting[0]
            full, swa = self._reservation(req)
            used_full = sum(f for f, _ in self._reserved.values())
            used_swa = sum(s for _, s in self._reserved.values())
            if used_full + full > cap_full or used_swa + swa > cap_swa:
                if not self.running:
                    raise ValueError(
                        f"request {req.rid} needs {full} full / {swa} SWA slots, more than the pools hold ({cap_full} / {cap_swa})"
                    )
                return
            rows = self.req_pool.alloc(1)
            if rows is None:
                return
            self.waiting.pop(0)
            req.row = rows[0]
            self._reserved[req.rid] = (full, swa)
            self.running.append(req)

    def _finish(self, req: Request) -> None:
        req.finished = True
        held = max(req.kv_len, req.draft_kv_len)
        if held:
            self.allocator.free(self.req_to_token[req.row, :held].long())
        self.req_to_token[req.row].zero_()
        self.req_pool.free(req.row)
        self._reserved.pop(req.rid)
        self.running.remove(req)
        self.finished.append(req)

    def _commit(self, req: Request, new_tokens: list[int]) -> int:
        """Append generated tokens (up to ``max_new_tokens`` and the first EOS); finish when done."""
        room = req.max_new_tokens - len(req.output)
        new_tokens = new_tokens[:room]
        if self.eos is not None and self.eos in new_tokens:
            new_tokens = new_tokens[: new_tokens.index(self.eos) + 1]
        req.tokens.extend(new_tokens)
        if len(req.output) >= req.max_new_tokens or (self.eos is not None and new_tokens and new_tokens[-1] == self.eos):
            req.finished = True
        return len(new_tokens)

    def _alloc(self, reqs: list[Request], starts: list[int], counts: list[int]) -> torch.Tensor:
        """Slots for positions ``[start, start + count)`` of each request, written to ``req_to_token``."""
        loc = alloc_positions(self.allocator, self.req_to_token, [q.row for q in reqs], starts, counts)
        if loc is None:
            raise RuntimeError("the KV pools ran out despite the reservations (a bookkeeping bug)")
        return loc

    def _loc(self, reqs: list[Request], starts: list[int], counts: list[int]) -> torch.Tensor:
        """The slots already allocated to those positions."""
        return torch.cat([self.req_to_token[q.row, s : s + m].long() for q, s, m in zip(reqs, starts, counts)])

    def _evict(self) -> None:
        if self.window < 0:
            return
        for req in self.running:
            # every later query sits at or after the first token some worker has not seen yet
            seen = req.kv_len if self.draft is None else min(req.kv_len, req.draft_kv_len)
            req.evicted = evict_swa_window(self.allocator, self.req_to_token, req.row, seen, self.window, req.evicted)

    # ----- batches -------------------------------------------------------------------------------

    def _tokens(self, reqs, starts, counts, tokens_of=None):
        ids, pos = [], []
        for q, s, m in zip(reqs, starts, counts):
            seq = q.tokens if tokens_of is None else tokens_of(q)
            ids.extend(seq[s : s + m])
            pos.extend(range(s, s + m))
        dev = self.device
        return torch.tensor(ids, dtype=torch.long, device=dev), torch.tensor(pos, dtype=torch.long, device=dev)

    @staticmethod
    def _last_of_each(logits: torch.Tensor, counts: list[int]) -> torch.Tensor:
        ends = torch.tensor(counts).cumsum(0) - 1
        return logits[ends.to(logits.device)]

    # ----- steps ---------------------------------------------------------------------------------

    def _prefill(self) -> RoundStats:
        reqs, prefix, new, budget = [], [], [], self.chunk_size
        for q in self.running:
            if q.prefilling and budget:
                m = min(len(q.prompt) - q.kv_len, budget)
                reqs.append(q)
                prefix.append(q.kv_len)
                new.append(m)
                budget -= m
        loc = self._alloc(reqs, prefix, new)
        batch = ForwardBatch.extend([q.row for q in reqs], prefix, new, loc, device=self.device)
        ids, pos = self._tokens(reqs, prefix, new)
        logits = self.target.forward(batch, ids, pos)
        if self.draft is not None:
            self.draft.forward(batch, ids, pos)
        nxt = self._last_of_each(logits, new).argmax(-1).tolist()
        committed = 0
        for q, m, t in zip(reqs, new, nxt):
            q.kv_len += m
            q.draft_kv_len = q.kv_len
            if not q.prefilling:  # its last chunk: the first generated token
                committed += self._commit(q, [t])
        return RoundStats(self.step_id, "prefill", [q.rid for q in reqs], sum(new), committed, 0.0)

    def _decode(self, reqs: list[Request]) -> RoundStats:
        starts = [q.kv_len for q in reqs]
        loc = self._alloc(reqs, starts, [1] * len(reqs))
        batch = ForwardBatch.decode([q.row for q in reqs], starts, loc, device=self.device)
        ids, pos = self._tokens(reqs, starts, [1] * len(reqs))
        nxt = self.target.forward(batch, ids, pos).argmax(-1).tolist()
        committed = 0
        for q, t in zip(reqs, nxt):
            q.kv_len += 1
            committed += self._commit(q, [t])
        return RoundStats(self.step_id, "decode", [q.rid for q in reqs], len(reqs), committed, 0.0)

    def _speculate(self, reqs: list[Request]) -> RoundStats:
        k, dev = self.k, self.device
        proposals = {q.rid: [] for q in reqs}
        pending = [len(q.tokens) - 1 for q in reqs]  # position of each request's newest token

        def tokens_of(q):
            return q.tokens + proposals[q.rid]

        # 1. the draft catches up (its tokens [draft_kv_len, pending]) and proposes d_1
        starts = [q.draft_kv_len for q in reqs]
        counts = [p + 1 - s for p, s in zip(pending, starts)]
        have = [q.kv_len for q in reqs]  # positions below kv_len already hold slots
        fresh = [p + 1 - h for p, h in zip(pending, have)]
        self._alloc(reqs, have, fresh)
        loc = self._loc(reqs, starts, counts)
        batch = ForwardBatch.extend([q.row for q in reqs], starts, counts, loc, device=dev)
        ids, pos = self._tokens(reqs, starts, counts)
        d = self._last_of_each(self.draft.forward(batch, ids, pos), counts).argmax(-1).tolist()
        for q, t in zip(reqs, d):
            proposals[q.rid].append(t)
            q.draft_kv_len = len(q.tokens)
        # d_2 .. d_k: draft decode steps over its own proposals
        for j in range(1, k):
            starts = [p + j for p in pending]
            loc = self._alloc(reqs, starts, [1] * len(reqs))
            batch = ForwardBatch.decode([q.row for q in reqs], starts, loc, device=dev)
            ids, pos = self._tokens(reqs, starts, [1] * len(reqs), tokens_of)
            d = self.draft.forward(batch, ids, pos).argmax(-1).tolist()
            for q, t in zip(reqs, d):
                proposals[q.rid].append(t)
        # 2. the target verifies [pending, d_1 .. d_k]
        n = k + 1
        self._alloc(reqs, [p + k for p in pending], [1] * len(reqs))  # d_k's slot (the draft never wrote it)
        starts = list(pending)
        loc = self._loc(reqs, starts, [n] * len(reqs))
        positions = torch.cat([torch.arange(p, p + n) for p in pending]).to(dev)
        batch = ForwardBatch.verify(
            [q.row for q in reqs], starts, SpecInfo(n, positions=positions), loc, device=dev, spec_algorithm=SpeculativeAlgorithm.DFLASH
        )
        ids, pos = self._tokens(reqs, starts, [n] * len(reqs), tokens_of)
        target = self.target.forward(batch, ids, pos).argmax(-1).view(len(reqs), n).tolist()
        accepted, committed = [], 0
        for q, p, want in zip(reqs, pending, target):
            drafts = proposals[q.rid]
            a = 0
            while a < k and drafts[a] == want[a]:
                a += 1
            accepted.append(a)
            # K/V of [pending, d_1 .. d_a] are the committed tokens' (target); the draft wrote
            # [pending, d_1 .. d_{k-1}], so it has seen min(a, k - 1) of the accepted drafts
            q.kv_len = p + 1 + a
            q.draft_kv_len = p + 1 + min(a, k - 1)
            # 3. free the rejected drafts' slots (positions p + 1 + a .. p + k)
            if a < k:
                self.allocator.free(self.req_to_token[q.row, p + 1 + a : p + 1 + k].long())
                self.req_to_token[q.row, p + 1 + a : p + 1 + k] = 0
            committed += self._commit(q, drafts[:a] + [want[a]])
        return RoundStats(self.step_id, "speculative", [q.rid for q in reqs], n * len(reqs), committed, 0.0, accepted, proposals)

    def step(self) -> RoundStats | None:
        """Serve one step: admit arrivals, then a prefill chunk if any prompt is pending, else a
        decode (or speculative) round over every running request. None when nothing is left."""
        self._admit()
        if not self.running:
            if not self.waiting:
                return None
            self.step_id += 1  # nobody has arrived yet
            return RoundStats(self.step_id - 1, "idle", [], 0, 0, 0.0)
        t0 = time.perf_counter()
        if any(q.prefilling for q in self.running):
            stats = self._prefill()
        else:
            reqs = list(self.running)
            stats = self._decode(reqs) if self.draft is None else self._speculate(reqs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        stats.seconds = time.perf_counter() - t0
        for q in [q for q in self.running if q.finished]:
            self._finish(q)
        self._evict()
        self.step_id += 1
        return stats

    def run(self, on_step: Callable[[RoundStats], None] | None = None) -> list[Request]:
        """Serve until every submitted request has finished; returns them in order of ``rid``."""
        while (stats := self.step()) is not None:
            if on_step is not None:
                on_step(stats)
        return sorted(self.finished, key=lambda q: q.rid)
