"""Stateful property tests of the SWA allocator, eviction and the request pool against a plain model.

A hypothesis ``RuleBasedStateMachine`` drives random interleavings of what a serving engine does to
the memory model: admission (a row and a first prefill chunk), chunked prefill / extend of several
requests in one batch, decode batches, speculative drafts with verify (accept a prefix, free the
rejected tail, which may start inside a page), window eviction, retraction of a live request,
finish (sometimes in two partial frees), and stale frees of slots or rows already freed (which
must raise). The pools are a few pages, so allocations fail often; a failed allocation must leave
every free list, ownership mark, the mapping and ``req_to_token`` exactly as they were.

The model is plain Python: per request the full and SWA slot of every token, the committed
length, the eviction mark; sets of owned slots. After every rule the allocator must agree with the
model (slots, mapping, ownership, available sizes) and pass ``check_allocator_invariants``; the
teardown finishes every request and checks that the available sizes return to their start.

Cost: ``MAX_EXAMPLES`` examples of up to ``STEPS`` rules for each of page sizes 1, 4 and 16.
"""

from __future__ import annotations

import sys
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from triton_swa.mem import ReqToTokenPool, SWAKVPool, SWATokenToKVPoolAllocator, check_allocator_invariants, evict_swa_window

pytestmark = pytest.mark.reference

MAX_EXAMPLES = 25
STEPS = 80
MAX_LEN = 48
ROWS = 4

STEP_COUNT: Counter = Counter()  # rules run, by name (read by a timing run; not asserted)


def _count() -> None:
    STEP_COUNT["rules"] += 1
    STEP_COUNT[sys._getframe(1).f_code.co_name] += 1


def _pages(n: int, ps: int) -> int:
    return -(-n // ps)


class Req:
    def __init__(self, row: int):
        self.row = row
        self.full: list[int] = []
        self.swa: list[int] = []
        self.committed = 0
        self.evicted = 0

    @property
    def drafts(self) -> int:
        return len(self.full) - self.committed


class AllocatorMachine(RuleBasedStateMachine):
    page_size = 1

    @initialize(full_tokens=st.integers(12, 64), swa_tokens=st.integers(8, 40), window_left=st.integers(-1, 20), seed=st.integers(0, 2**16))
    def setup(self, full_tokens, swa_tokens, window_left, seed):
        """Pools of a few dozen tokens (at least two pages each): allocations fail often."""
        ps = self.page_size
        full_pages, swa_pages = max(2, full_tokens // ps), max(2, swa_tokens // ps)
        STEP_COUNT["examples"] += 1
        self.size, self.size_swa, self.window = full_pages * ps, swa_pages * ps, window_left
        self.pool = SWAKVPool(self.size, self.size_swa, ps, torch.float16, [0], [1], head_num=1, head_dim=4)
        self.alloc = SWATokenToKVPoolAllocator(self.size, self.size_swa, ps, torch.float16, "cpu", self.pool)
        g = torch.Generator().manual_seed(seed)
        self.alloc.full_attn_allocator.shuffle_free_list(g)
        self.alloc.swa_attn_allocator.shuffle_free_list(g)
        self.rtp = ReqToTokenPool(ROWS, MAX_LEN)
        self.reqs: dict[int, Req] = {}
        self.full_owned: set[int] = set()
        self.swa_owned: set[int] = set()
        self.freed_slots: list[list[int]] = []
        self.freed_rows: list[int] = []

    # ---- model helpers ---------------------------------------------------------------------------

    def _free_pages(self, owned: set[int], total: int) -> int:
        return total // self.page_size - len({s // self.page_size for s in owned})

    def _snapshot(self):
        f, s = self.alloc.full_attn_allocator, self.alloc.swa_attn_allocator
        return [
            t.clone()
            for t in (f.free_pages, s.free_pages, f.slot_owned, s.slot_owned, self.alloc.full_to_swa_index_mapping, self.rtp.req_to_token)
        ] + [list(self.rtp.free_slots)]

    def _assert_unchanged(self, before, what):
        after = self._snapshot()
        for i, (x, y) in enumerate(zip(before, after)):
            same = x == y if isinstance(x, list) else torch.equal(x, y)
            assert same, f"{what} changed state item {i}"

    def _last_loc(self, r: Req) -> int:
        return r.full[-1] if r.full else -1

    def _extend(self, batch: list[tuple[Req, int]], decode: bool = False) -> bool:
        """One alloc_extend (or alloc_decode) for ``batch``; checks the result against the model."""
        ps = self.page_size
        prefix = torch.tensor([len(r.full) for r, _ in batch])
        seq = prefix + torch.tensor([n for _, n in batch])
        last = torch.tensor([self._last_loc(r) for r, _ in batch])
        needed = sum(_pages(len(r.full) + n, ps) - _pages(len(r.full), ps) for r, n in batch)
        fits = needed <= min(self._free_pages(self.full_owned, self.size), self._free_pages(self.swa_owned, self.size_swa))
        before = self._snapshot()
        if decode:
            slots = self.alloc.alloc_decode(seq.int(), last)
        else:
            slots = self.alloc.alloc_extend(prefix, seq.int(), last, int((seq - prefix).sum()))
        STEP_COUNT["allocations failed" if slots is None else "allocations"] += 1
        if slots is None:
            assert not fits, f"allocation of {needed} pages failed with room for it"
            self._assert_unchanged(before, "a failed allocation")
            return False
        assert fits, f"allocation of {needed} pages succeeded without room"
        swa = self.alloc.full_to_swa_index_mapping[slots]
        at = 0
        for r, n in batch:
            got, got_swa = slots[at : at + n].tolist(), swa[at : at + n].tolist()
            for t, (f, s) in enumerate(zip(got, got_swa), start=len(r.full)):
                assert f not in self.full_owned, f"full slot {f} handed out while live"
                assert s not in self.swa_owned and s > 0, f"SWA slot {s} handed out while live"
                assert f % ps == t % ps == s % ps, f"token {t}: slots {f}/{s} not page-aligned"
                self.full_owned.add(f)
                self.swa_owned.add(s)
            self.rtp.req_to_token[r.row, len(r.full) : len(r.full) + n] = torch.tensor(got, dtype=torch.int32)
            r.full += got
            r.swa += got_swa
            at += n
        return True

    def _free_tail(self, r: Req, keep: int) -> None:
        slots = r.full[keep:]
        if slots:
            self.alloc.free(self.rtp.req_to_token[r.row, keep : len(r.full)].long())
            self.freed_slots.append(slots)
        self.full_owned -= set(slots)
        self.swa_owned -= {s for s in r.swa[keep:] if s}
        del r.full[keep:], r.swa[keep:]
        r.committed = min(r.committed, keep)

    def _room(self, r: Req) -> int:
        return MAX_LEN - len(r.full)

    def _ready(self):
        return [r for r in self.reqs.values() if r.drafts == 0 and self._room(r) > 0]

    # ---- rules -----------------------------------------------------------------------------------

    @precondition(lambda self: len(self.reqs) == ROWS)
    @rule()
    def admit_without_a_free_row(self):
        _count()
        before = self._snapshot()
        assert self.rtp.alloc(1) is None
        self._assert_unchanged(before, "a failed row allocation")

    @precondition(lambda self: len(self.reqs) < ROWS)
    @rule(n=st.integers(1, 20))
    def admit(self, n):
        _count()
        before = self._snapshot()
        (row,) = self.rtp.alloc(1)
        assert row not in self.reqs and 1 <= row <= ROWS, f"row {row} handed out twice"
        r = Req(row)
        self.reqs[row] = r
        if self._extend([(r, n)]):  # on failure it checks that the allocators did not change
            r.committed = n
        else:
            self.rtp.free(row)
            del self.reqs[row]
            assert sorted(self.rtp.free_slots) == sorted(before[-1])

    @precondition(lambda self: self._ready())
    @rule(data=st.data())
    def extend(self, data):
        """Chunked prefill / extend of one or more requests in one batch."""
        _count()
        ready = self._ready()
        picked = data.draw(st.lists(st.sampled_from(ready), min_size=1, max_size=len(ready), unique_by=lambda r: r.row))
        batch = [(r, data.draw(st.integers(0, min(12, self._room(r))))) for r in picked]
        if self._extend(batch):
            for r, n in batch:
                r.committed += n

    @precondition(lambda self: self._ready())
    @rule(data=st.data())
    def decode(self, data):
        _count()
        ready = [r for r in self._ready() if r.full]
        if not ready:
            return
        picked = data.draw(st.lists(st.sampled_from(ready), min_size=1, max_size=len(ready), unique_by=lambda r: r.row))
        if self._extend([(r, 1) for r in picked], decode=True):
            for r in picked:
                r.committed += 1

    @precondition(lambda self: any(r.full for r in self._ready()))
    @rule(data=st.data(), drafts=st.integers(1, 6))
    def draft(self, data, drafts):
        _count()
        r = data.draw(st.sampled_from([r for r in self._ready() if r.full]))
        self._extend([(r, min(drafts, self._room(r)))])

    @precondition(lambda self: any(r.drafts for r in self.reqs.values()))
    @rule(data=st.data())
    def verify(self, data):
        """Accept a prefix of the drafts (the target's token counts too), free the rejected tail."""
        _count()
        self._verify(data.draw(st.sampled_from([r for r in self.reqs.values() if r.drafts])), data)

    def _verify(self, r: Req, data) -> None:
        accepted = data.draw(st.integers(0, r.drafts))
        self._free_tail(r, r.committed + accepted)
        r.committed = len(r.full)

    @precondition(lambda self: any(r.full for r in self._ready()))
    @rule(data=st.data(), drafts=st.integers(1, 6))
    def draft_and_verify(self, data, drafts):
        """One speculative step: allocate drafts, verify at once."""
        _count()
        r = data.draw(st.sampled_from([r for r in self._ready() if r.full]))
        if self._extend([(r, min(drafts, self._room(r)))]):
            self._verify(r, data)

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def evict(self, data):
        _count()
        r = data.draw(st.sampled_from(list(self.reqs.values())))
        mark = evict_swa_window(self.alloc, self.rtp.req_to_token, r.row, r.committed, self.window, r.evicted)
        want = r.evicted
        if self.window >= 0:
            want = max(r.evicted, max(0, r.committed - self.window) // self.page_size * self.page_size)
        assert mark == want, f"eviction mark {mark}, model {want}"
        for t in range(r.evicted, mark):
            self.swa_owned.discard(r.swa[t])
            r.swa[t] = 0
        r.evicted = mark

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def retract_or_finish(self, data):
        """Free a whole request (drafts included), sometimes as a tail first, then the rest."""
        _count()
        r = data.draw(st.sampled_from(list(self.reqs.values())))
        split = data.draw(st.integers(0, len(r.full)))
        self._free_tail(r, split)
        self._free_tail(r, 0)
        self.rtp.free(r.row)
        self.freed_rows.append(r.row)
        del self.reqs[r.row]

    @precondition(lambda self: self.freed_slots or self.freed_rows)
    @rule(data=st.data())
    def stale_free(self, data):
        """Freeing slots or a row a second time raises and changes nothing (unless handed out again)."""
        _count()
        before = self._snapshot()
        stale = [s for s in self.freed_slots if not set(s) & self.full_owned]
        if stale and data.draw(st.booleans()):
            slots = data.draw(st.sampled_from(stale))
            with pytest.raises(ValueError, match="not allocated"):
                self.alloc.free(torch.tensor(slots))
        rows = [row for row in self.freed_rows if row not in self.reqs]
        if rows:
            with pytest.raises(ValueError, match="not allocated"):
                self.rtp.free(data.draw(st.sampled_from(rows)))
        self._assert_unchanged(before, "a rejected stale free")

    # ---- invariants and teardown ----------------------------------------------------------------

    @invariant()
    def agrees_with_model(self):
        if not hasattr(self, "alloc"):
            return
        f, s = self.alloc.full_attn_allocator, self.alloc.swa_attn_allocator
        mapping = self.alloc.full_to_swa_index_mapping
        for r in self.reqs.values():
            assert self.rtp.req_to_token[r.row, : len(r.full)].tolist() == r.full
            assert mapping[torch.tensor(r.full, dtype=torch.long)].tolist() == r.swa, f"row {r.row}: mapping"
        assert set(f.slot_owned.nonzero().flatten().tolist()) == self.full_owned
        assert set(s.slot_owned.nonzero().flatten().tolist()) == self.swa_owned
        assert self.alloc.full_available_size() == self._free_pages(self.full_owned, self.size) * self.page_size
        assert self.alloc.swa_available_size() == self._free_pages(self.swa_owned, self.size_swa) * self.page_size
        assert self.rtp.available_size() == ROWS - len(self.reqs)
        check_allocator_invariants(self.alloc, self.rtp.req_to_token, [(r.row, len(r.full), r.evicted) for r in self.reqs.values()])

    def teardown(self):
        if not hasattr(self, "alloc"):
            return
        for r in list(self.reqs.values()):
            self._free_tail(r, 0)
            self.rtp.free(r.row)
            del self.reqs[r.row]
        check_allocator_invariants(self.alloc, self.rtp.req_to_token, [])
        assert self.alloc.full_available_size() == self.size and self.alloc.swa_available_size() == self.size_swa
        assert self.rtp.available_size() == ROWS
        assert not bool(self.alloc.full_to_swa_index_mapping[:-1].any())


def _machine(page_size: int):
    cls = type(f"AllocatorMachinePage{page_size}", (AllocatorMachine,), {"page_size": page_size})
    cls.TestCase.settings = settings(
        max_examples=MAX_EXAMPLES,
        stateful_step_count=STEPS,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    return cls.TestCase


TestAllocatorPage1 = _machine(1)
TestAllocatorPage4 = _machine(4)
TestAllocatorPage16 = _machine(16)
