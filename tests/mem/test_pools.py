"""Pools and allocators: the invariants of docs/contract.md §2 under permuted free lists, eviction and failure."""

import copy
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import triton_swa_reference as ref
from triton_swa import (
    BaseSWAKVPool,
    MHATokenToKVPool,
    PagedTokenToKVPoolAllocator,
    ReqToTokenPool,
    SWAKVPool,
    SWATokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
    evict_swa_window,
)
from triton_swa.mem import check_allocator_invariants
from triton_swa.testing import assert_close, make_pool_state

pytestmark = pytest.mark.reference


def make_swa(size=64, size_swa=32, page_size=1, dtype=torch.float16, **kw):
    pool = SWAKVPool(
        size,
        size_swa,
        page_size,
        dtype,
        swa_attention_layer_ids=[0, 2],
        full_attention_layer_ids=[1],
        swa_head_num=kw.get("swa_h", 2),
        swa_head_dim=kw.get("swa_d", 8),
        full_head_num=kw.get("full_h", 1),
        full_head_dim=kw.get("full_d", 16),
    )
    alloc = SWATokenToKVPoolAllocator(size, size_swa, page_size, dtype, "cpu", pool)
    return pool, alloc


def snapshot(alloc):
    full, swa = alloc.full_attn_allocator, alloc.swa_attn_allocator
    return (
        full.free_pages.clone(),
        swa.free_pages.clone(),
        full.slot_owned.clone(),
        swa.slot_owned.clone(),
        alloc.full_to_swa_index_mapping.clone(),
    )


def assert_same_snapshot(a, b):
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_pool_shapes_and_dummy_slot():
    pool, alloc = make_swa(size=64, size_swa=32, page_size=4, swa_d=8, full_d=16)
    assert pool.swa_kv_pool.k_buffer[0].shape == (32 + 4, 2, 8)
    assert pool.full_kv_pool.k_buffer[0].shape == (64 + 4, 1, 16)
    assert pool.layers_mapping == {1: (0, False), 0: (0, True), 2: (1, True)}
    mapping = alloc.full_to_swa_index_mapping
    assert mapping.dtype == torch.int64 and mapping.shape == (64 + 4 + 1,) and int(mapping[-1]) == -1
    assert pool.full_to_swa_index_mapping is mapping, "the mapping is shared by reference"
    assert alloc.get_kvcache() is pool and isinstance(pool, BaseSWAKVPool)
    # Free lists start after the dummy page 0.
    assert int(alloc.full_attn_allocator.free_pages.min()) == 1


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e4m3fnuz])
def test_mha_pool_v_head_dim_and_fp8_storage(fp8):
    pool = MHATokenToKVPool(8, 1, fp8, head_num=2, head_dim=8, layer_num=2, v_head_dim=4)
    assert pool.k_buffer[0].dtype == torch.uint8 and pool.v_buffer[1].shape == (9, 2, 4)
    k, v = pool.get_kv_buffer(1)
    assert k.dtype == fp8 and v.shape == (9, 2, 4)
    ck, cv = torch.randn(3, 2, 8), torch.randn(3, 2, 4)
    pool.set_kv_buffer(1, torch.tensor([1, 5, 7]), ck, cv, k_scale=0.5, v_scale=0.25)
    assert_close(pool.get_key_buffer(1)[[1, 5, 7]].float() * 0.5, ck, atol=0.13, rtol=0.13)
    assert_close(pool.get_value_buffer(1)[[1, 5, 7]].float() * 0.25, cv, atol=0.07, rtol=0.13)
    assert pool.get_key_buffer(0).float().abs().sum() == 0, "other layers untouched"


def test_swa_pool_routes_writes_through_the_mapping():
    pool, alloc = make_swa(dtype=torch.float32)
    alloc.swa_attn_allocator.shuffle_free_list(torch.Generator().manual_seed(1))
    loc = alloc.alloc(5)
    swa = alloc.full_to_swa_index_mapping[loc]
    assert not torch.equal(loc, swa)
    k, v = torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    pool.set_kv_buffer(mock.Mock(layer_id=2), loc, k, v)
    assert torch.equal(pool.get_key_buffer(2)[swa], k) and torch.equal(pool.get_value_buffer(2)[swa], v)
    fk, fv = torch.randn(5, 1, 16), torch.randn(5, 1, 16)
    pool.set_kv_buffer(1, loc, fk, fv)
    assert torch.equal(pool.get_key_buffer(1)[loc], fk)
    assert torch.equal(pool.translate_loc_from_full_to_swa(loc), swa.int())
    assert pool.translate_loc_from_full_to_swa(loc).dtype == torch.int32


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda p: p.get_key_buffer(7), ValueError, "layer_id 7"),
        (lambda p: p.set_kv_buffer(0, torch.tensor([1.0]), torch.zeros(1, 2, 8), torch.zeros(1, 2, 8)), TypeError, "loc"),
        (lambda p: p.set_kv_buffer(0, torch.tensor([1]), torch.zeros(1, 2, 9), torch.zeros(1, 2, 8)), ValueError, "cache_k"),
        (lambda p: p.set_kv_buffer(1, torch.tensor([1]), torch.zeros(1, 1, 16), torch.zeros(2, 1, 16)), ValueError, "cache_v"),
        (lambda p: p.register_mapping(torch.zeros(5, dtype=torch.int64)), ValueError, "full_to_swa_index_mapping"),
        (lambda p: p.register_mapping(torch.zeros(66, dtype=torch.int32)), TypeError, "full_to_swa_index_mapping"),
    ],
)
def test_pool_bad_input(call, error, match):
    pool, _ = make_swa()
    with pytest.raises(error, match=match):
        call(pool)


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda: MHATokenToKVPool(10, 4, torch.float16, 1, 8, 1), ValueError, "multiple of page_size"),
        (lambda: MHATokenToKVPool(8, 4, torch.int32, 1, 8, 1), TypeError, "dtype"),
        (lambda: MHATokenToKVPool(8, 4, torch.float16, 0, 8, 1), ValueError, "head_num"),
        (lambda: SWAKVPool(8, 8, 1, torch.float16, [0], [0], head_num=1, head_dim=8), ValueError, "both sliding and full"),
        (
            lambda: PagedTokenToKVPoolAllocator(8, 2, torch.float16, "cpu", MHATokenToKVPool(8, 4, torch.float16, 1, 8, 1)),
            ValueError,
            "disagrees",
        ),
        (
            lambda: SWATokenToKVPoolAllocator(8, 8, 1, torch.float16, "cpu", MHATokenToKVPool(8, 1, torch.float16, 1, 8, 1)),
            TypeError,
            "kvcache",
        ),
        (lambda: ReqToTokenPool(0, 8), ValueError, "size"),
    ],
)
def test_construction_bad_input(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_req_to_token_pool_keeps_row_zero_for_padding():
    rtp = ReqToTokenPool(3, 16)
    assert rtp.req_to_token.shape == (4, 16) and rtp.req_to_token.dtype == torch.int32
    rows = rtp.alloc(3)
    assert sorted(rows) == [1, 2, 3] and rtp.alloc(1) is None
    rtp.free(rows[1])
    assert rtp.alloc(1) == [rows[1]]
    with pytest.raises(ValueError, match="row 0"):
        rtp.free([0])


@pytest.mark.parametrize("page_size", [1, 4])
def test_alloc_failure_leaves_everything_unchanged(page_size):
    pool, alloc = make_swa(size=32, size_swa=16, page_size=page_size)
    alloc.full_attn_allocator.shuffle_free_list(torch.Generator().manual_seed(0))
    first = alloc.alloc(8)
    assert first is not None
    before = snapshot(alloc)
    assert alloc.alloc(16) is None  # the SWA side has only 8 slots left
    assert_same_snapshot(before, snapshot(alloc))
    # alloc_extend: one request fits on both sides in pages, the whole batch does not.
    prefix = torch.tensor([0, 0])
    assert alloc.alloc_extend(prefix, torch.tensor([4, 8]), torch.tensor([-1, -1]), 12) is None
    assert_same_snapshot(before, snapshot(alloc))
    assert alloc.alloc_extend(prefix[:1], torch.tensor([8]), torch.tensor([-1]), 8) is not None


def test_alloc_size_checks():
    _, alloc = make_swa(page_size=4)
    with pytest.raises(ValueError, match="multiple of page_size"):
        alloc.alloc(3)
    with pytest.raises(ValueError, match="extend_num_tokens"):
        alloc.alloc_extend(torch.tensor([0]), torch.tensor([5]), torch.tensor([-1]), 4)
    with pytest.raises(TypeError, match="prefix_lens"):
        alloc.full_attn_allocator.alloc_extend(torch.tensor([0.0]), torch.tensor([5]), torch.tensor([-1]))


def _grow(alloc, rtp, rows, lens, new):
    """alloc_extend for a batch; writes req_to_token; returns the slots."""
    prefix = torch.tensor(lens)
    seq = prefix + torch.tensor(new)
    last = torch.tensor([int(rtp.req_to_token[r, n - 1]) if n else -1 for r, n in zip(rows, lens)])
    slots = alloc.alloc_extend(prefix, seq, last, int(sum(new)))
    if slots is None:
        return None
    at = 0
    for r, n, m in zip(rows, lens, new):
        rtp.req_to_token[r, n : n + m] = slots[at : at + m].int()
        at += m
    return slots


def check_invariants(alloc, rtp, rows, lens, evicted):
    check_allocator_invariants(alloc, rtp.req_to_token, list(zip(rows, lens, evicted)))


@settings(max_examples=25, deadline=None)
@given(
    page_size=st.sampled_from([1, 2, 4]),
    window_left=st.integers(0, 12),
    seed=st.integers(0, 10**6),
    steps=st.lists(st.lists(st.integers(0, 7), min_size=3, max_size=3), min_size=1, max_size=8),
)
def test_allocator_invariants_under_growth_and_eviction(page_size, window_left, seed, steps):
    g = torch.Generator().manual_seed(seed)
    _, alloc = make_swa(size=256, size_swa=96, page_size=page_size)
    alloc.full_attn_allocator.shuffle_free_list(g)
    alloc.swa_attn_allocator.shuffle_free_list(g)
    rtp = ReqToTokenPool(4, 128)
    rows = rtp.alloc(3)
    lens, evicted = [0, 0, 0], [0, 0, 0]
    for new in steps:
        before = snapshot(alloc)
        if _grow(alloc, rtp, rows, lens, new) is None:
            assert_same_snapshot(before, snapshot(alloc))
            continue
        lens = [n + m for n, m in zip(lens, new)]
        check_invariants(alloc, rtp, rows, lens, evicted)
        for i, r in enumerate(rows):
            evicted[i] = evict_swa_window(alloc, rtp.req_to_token, r, lens[i], window_left, evicted[i])
            next_window = ref.extend_window_start(lens[i], window_left)
            assert evicted[i] <= next_window, "evicted a token the next query can see"
            assert next_window - evicted[i] < page_size, "kept a whole page nobody can see"
        check_invariants(alloc, rtp, rows, lens, evicted)
    # Finishing every request returns every page.
    for r, n in zip(rows, lens):
        alloc.free(rtp.req_to_token[r, :n].long())
    assert alloc.full_available_size() == 256 and alloc.swa_available_size() == 96
    assert (alloc.full_to_swa_index_mapping[:-1] == 0).all()


def test_free_swa_sets_zero_and_skips_unmapped():
    _, alloc = make_swa()
    loc = alloc.alloc(6)
    swa_free_before = alloc.swa_available_size()
    alloc.free_swa(loc[:3])
    assert (alloc.full_to_swa_index_mapping[loc[:3]] == 0).all()
    assert alloc.swa_available_size() == swa_free_before + 3
    alloc.free_swa(loc[:3])  # already 0: nothing more is freed
    assert alloc.swa_available_size() == swa_free_before + 3
    full_before = alloc.full_available_size()
    alloc.free(loc)
    assert alloc.full_available_size() == full_before + 6 and alloc.swa_available_size() == swa_free_before + 6


def test_decode_alloc_continues_pages_in_lockstep():
    _, alloc = make_swa(size=64, size_swa=32, page_size=4)
    alloc.swa_attn_allocator.shuffle_free_list(torch.Generator().manual_seed(3))
    rtp = ReqToTokenPool(2, 32)
    rows = rtp.alloc(1)
    _grow(alloc, rtp, rows, [0], [6])
    for n in range(6, 11):
        last = rtp.req_to_token[rows[0], n - 1].long().reshape(1)
        loc = alloc.alloc_decode(torch.tensor([n + 1]), last)
        rtp.req_to_token[rows[0], n] = loc.int()
        swa = alloc.full_to_swa_index_mapping[loc]
        assert int(loc) % 4 == n % 4 == int(swa) % 4
        if n % 4:
            assert int(loc) == int(last) + 1


def test_plain_allocator_and_clear():
    pool = MHATokenToKVPool(16, 1, torch.float16, 1, 8, 1)
    alloc = TokenToKVPoolAllocator(16, torch.float16, "cpu", pool)
    a = alloc.alloc(10)
    assert a.tolist() == list(range(1, 11)) and alloc.available_size() == 6 and alloc.alloc(7) is None
    alloc.free(a[:4])
    assert alloc.available_size() == 10
    alloc.clear()
    assert alloc.available_size() == 16 and alloc.get_kvcache() is pool


def test_make_pool_state_poisons_everything_outside_windows():
    state = make_pool_state(seq_lens=[3, 20, 41], window_left=6, page_size=4, new_tokens=[1, 3, 2])
    k_buf, _ = state.kv_pool.get_kv_buffer(0)
    readable = set()
    for r in state.requests:
        start = ref.extend_window_start(r.prefix_len, 6)
        full = state.req_to_token[r.req_pool_index, start : r.seq_len].long()
        readable |= set(state.mapping[full].tolist())
    finite = set(torch.isfinite(k_buf).all(-1).all(-1).nonzero().flatten().tolist())
    assert finite == readable and 0 not in finite
    assert copy.copy(state.seq_lens().tolist()) == [3, 20, 41]
    assert state.prefix_lens().tolist() == [2, 17, 39]


# ----- issue 11: ownership (defects 1 and 8) ---------------------------------------------------------


def _live_slots(rtp, rows_lens):
    return torch.cat([rtp.req_to_token[r, :n].long() for r, n in rows_lens])


def test_rejected_draft_tail_mid_page_keeps_the_live_page():
    """Defect 1, the page-4 backend scenario: 23 committed tokens, 4 drafts verified, all rejected.

    The rejected tail starts at token 23, inside the page that holds committed tokens 20-22. The old
    ``free`` put that page back on the free list; the next request's allocation (which takes every
    free page) then received slots of tokens 20-22 and overwrote their K/V.
    """
    ps = 4
    # Full pool: 6 pages for the 24 first positions + 1 draft page + 2 spare; SWA likewise.
    pool, alloc = make_swa(size=9 * ps, size_swa=9 * ps, page_size=ps)
    rtp = ReqToTokenPool(3, 64)
    a, b = rtp.alloc(2)
    assert _grow(alloc, rtp, [a], [0], [23]) is not None
    committed_page = int(rtp.req_to_token[a, 22]) // ps
    assert _grow(alloc, rtp, [a], [23], [4]) is not None  # drafts: token 23 continues the page of 20-22
    assert int(rtp.req_to_token[a, 23]) // ps == committed_page
    alloc.free(rtp.req_to_token[a, 23:27].long())  # reject every draft
    live = set(_live_slots(rtp, [(a, 23)]).tolist())
    free_pages = alloc.full_attn_allocator.available_size() // ps
    got = _grow(alloc, rtp, [b], [0], [free_pages * ps])  # takes every free page
    assert got is not None
    reused = sorted(live & set(got.tolist()))
    assert not reused, f"live slots of committed tokens handed out again: {reused}"
    swa_live = set(alloc.full_to_swa_index_mapping[_live_slots(rtp, [(a, 23)])].tolist())
    assert not swa_live & set(alloc.full_to_swa_index_mapping[got].tolist())
    assert free_pages == 3, "only the wholly rejected draft page came back"
    check_invariants(alloc, rtp, [a, b], [23, free_pages * ps], [0, 0])
    # The kept page is continued by the next step (token 23 takes the slot freed above).
    assert _grow(alloc, rtp, [a], [23], [1]) is not None and int(rtp.req_to_token[a, 23]) // ps == committed_page
    # Finishing both requests returns every page.
    alloc.free(rtp.req_to_token[a, :24].long())
    alloc.free(rtp.req_to_token[b, : free_pages * ps].long())
    assert alloc.full_available_size() == 9 * ps and alloc.swa_available_size() == 9 * ps


def test_paged_free_of_part_of_a_page_keeps_it_until_the_last_slot():
    pool = MHATokenToKVPool(16, 4, torch.float16, 1, 8, 1)
    alloc = PagedTokenToKVPoolAllocator(16, 4, torch.float16, "cpu", pool)
    slots = alloc.alloc(8)  # pages 1 and 2
    alloc.free(slots[2:6])  # the second half of page 1, the first half of page 2
    assert alloc.available_size() == 8 and alloc.slot_owned[slots].tolist() == [True] * 2 + [False] * 4 + [True] * 2
    alloc.free(slots[:2])
    assert alloc.available_size() == 12 and alloc.free_pages.tolist()[-1] == 1
    alloc.free(slots[6:])
    assert alloc.available_size() == 16


def test_double_free_raises_and_changes_nothing():
    """Defect 8: freeing one allocation twice handed its slots out twice (``alloc(16)`` and a later
    ``alloc(4)`` both held slots 4-7) and ``full_available_size()`` reported 20 of 16."""
    _, alloc = make_swa(size=16, size_swa=16, page_size=4)
    x = alloc.alloc(4)
    assert x.tolist() == [4, 5, 6, 7]
    alloc.free(x)
    before = snapshot(alloc)
    with pytest.raises(ValueError, match=r"free_index holds slot 4, which is not allocated"):
        alloc.free(x)
    assert_same_snapshot(before, snapshot(alloc))
    assert alloc.full_available_size() == 16 and alloc.swa_available_size() == 16
    everything = alloc.alloc(16)
    assert everything is not None and alloc.alloc(4) is None
    alloc.free_swa(torch.tensor([9]))  # full slot 9 maps to its SWA slot: freed
    alloc.free_swa(torch.tensor([9]))  # now 0 (evicted): skipped, as SGLang does
    before = snapshot(alloc)
    with pytest.raises(ValueError, match="slot 5 twice"):
        alloc.free(torch.tensor([5, 5]))
    with pytest.raises(ValueError, match="slot 9 twice"):
        alloc.full_attn_allocator.free(torch.tensor([9, 9]))
    assert_same_snapshot(before, snapshot(alloc))


def test_paged_double_free_raises():
    pool = MHATokenToKVPool(16, 1, torch.float16, 1, 8, 1)
    alloc = TokenToKVPoolAllocator(16, torch.float16, "cpu", pool)
    a = alloc.alloc(16)
    alloc.free(a[:4])
    with pytest.raises(ValueError, match="free_index holds slot 1, which is not allocated"):
        alloc.free(a[:4])
    assert alloc.available_size() == 4
    b, c = alloc.alloc(4), alloc.alloc(1)
    assert sorted(b.tolist()) == [1, 2, 3, 4] and c is None


@pytest.mark.parametrize("page_size", [1, 4])
def test_out_of_range_free_raises(page_size):
    """Defect 8: ``free([1000])`` on a 16-slot pool later handed out slot 1000 (past the buffers)."""
    _, alloc = make_swa(size=16, size_swa=16, page_size=page_size)
    alloc.alloc(16)
    before = snapshot(alloc)
    for bad in ([1000], [-1], [16 + page_size], [page_size, page_size + 1, 1000]):
        with pytest.raises(ValueError, match=rf"free_index holds slot {bad[-1]}, outside"):
            alloc.free(torch.tensor(bad))
        with pytest.raises(ValueError, match=rf"free_index holds slot {bad[-1]}, outside"):
            alloc.full_attn_allocator.free(torch.tensor(bad))
        assert_same_snapshot(before, snapshot(alloc))
    assert alloc.alloc(page_size) is None
    if page_size > 1:
        with pytest.raises(ValueError, match="slot 2, outside"):  # a slot of the dummy page
            alloc.free(torch.tensor([2]))
    alloc.free(torch.tensor([0, 0]))  # the dummy slot (padded tokens) is skipped, repeated or not
    assert_same_snapshot(before, snapshot(alloc))


def test_req_to_token_pool_double_free_raises():
    """Defect 8: a double-freed row was handed out twice (``alloc(3)`` returned ``[1, 2, 1]``)."""
    rtp = ReqToTokenPool(3, 8)
    rows = rtp.alloc(2)
    rtp.free(rows[0])
    with pytest.raises(ValueError, match=rf"row {rows[0]}, which is not allocated"):
        rtp.free(rows[0])
    with pytest.raises(ValueError, match=rf"row {rows[1]} twice"):
        rtp.free([rows[1], rows[1]])
    with pytest.raises(ValueError, match="not allocated"):
        rtp.free([rows[1], 3])  # 3 was never handed out: nothing is freed, rows[1] stays in use
    assert rtp.available_size() == 2
    got = rtp.alloc(2)
    assert len(set(got) | {rows[1]}) == 3 and rtp.alloc(1) is None


def test_size_swa_past_the_swa_buffer_raises():
    """Defect 8: the allocator did not check ``size_swa`` against the pool's SWA buffer and handed
    out SWA slots past it (a write there lands outside ``k_buffer``)."""
    pool = SWAKVPool(16, 8, 4, torch.float16, [0], [1], head_num=1, head_dim=8)
    with pytest.raises(ValueError, match=r"size_swa \(16\) exceeds the SWA sub-pool's size \(8"):
        SWATokenToKVPoolAllocator(16, 16, 4, torch.float16, "cpu", pool)
    with pytest.raises(ValueError, match=r"size \(32\) exceeds the full sub-pool's size \(16"):
        SWATokenToKVPoolAllocator(32, 8, 4, torch.float16, "cpu", pool)
    assert pool.full_to_swa_index_mapping is None, "nothing registered by a failed construction"


def test_alloc_extend_refuses_to_continue_into_owned_or_freed_slots():
    ps = 4
    _, alloc = make_swa(size=32, size_swa=32, page_size=ps)
    rtp = ReqToTokenPool(2, 32)
    (a,) = rtp.alloc(1)
    _grow(alloc, rtp, [a], [0], [6])
    before = snapshot(alloc)
    s5 = rtp.req_to_token[a, 5].long().reshape(1)
    s4 = rtp.req_to_token[a, 4].long().reshape(1)
    # A stale last_loc: token 5 is live, so continuing after token 4 would hand slot 5 out again.
    with pytest.raises(ValueError, match=r"last_loc\[0\] = \d+: slot \d+ after it is already allocated"):
        alloc.alloc_extend(torch.tensor([5]), torch.tensor([7]), s4, 2)
    # last_loc at the wrong offset for prefix 6.
    with pytest.raises(ValueError, match=r"last_loc\[0\] = \d+ is not the slot of token prefix_lens\[0\] - 1 = 5"):
        alloc.alloc_extend(torch.tensor([6]), torch.tensor([7]), s4, 1)
    # -1 while the prefix ends inside a page.
    with pytest.raises(ValueError, match=r"last_loc\[0\] = -1 is not the slot"):
        alloc.alloc_extend(torch.tensor([6]), torch.tensor([7]), torch.tensor([-1]), 1)
    with pytest.raises(ValueError, match="neither -1 nor a slot"):
        alloc.alloc_extend(torch.tensor([6]), torch.tensor([7]), torch.tensor([1000]), 1)
    with pytest.raises(ValueError, match="continue the same page"):
        alloc.alloc_extend(torch.tensor([6, 6]), torch.tensor([7, 7]), torch.cat([s5, s5]), 2)
    assert_same_snapshot(before, snapshot(alloc))
    # A freed last token: its page may be empty of owners (or reused) by now.
    alloc.free(rtp.req_to_token[a, 4:6].long())
    before = snapshot(alloc)
    with pytest.raises(ValueError, match=r"last_loc\[0\] = \d+ is a slot that is not allocated"):
        alloc.alloc_extend(torch.tensor([6]), torch.tensor([7]), s5, 1)
    assert_same_snapshot(before, snapshot(alloc))
    # An evicted last token has no SWA page to continue.
    alloc.free_swa(rtp.req_to_token[a, :4].long())
    alloc.free(rtp.req_to_token[a, 3:4].long())
    before = snapshot(alloc)
    with pytest.raises(ValueError, match=r"last_loc\[0\] = \d+ has no SWA slot"):
        alloc.alloc_extend(torch.tensor([3]), torch.tensor([4]), rtp.req_to_token[a, 2].long().reshape(1), 1)
    assert_same_snapshot(before, snapshot(alloc))


def test_invariant_checker_catches_each_kind_of_corruption():
    ps = 4
    _, alloc = make_swa(size=32, size_swa=32, page_size=ps)
    rtp = ReqToTokenPool(3, 32)
    a, b = rtp.alloc(2)
    _grow(alloc, rtp, [a, b], [0, 0], [6, 5])
    reqs = [(a, 6, 0), (b, 5, 0)]
    check_allocator_invariants(alloc, rtp.req_to_token, reqs)
    with pytest.raises(AssertionError, match=r"slot \d+ is owned but no live token uses it"):
        check_allocator_invariants(alloc, rtp.req_to_token, [(a, 6, 0), (b, 4, 0)])
    with pytest.raises(AssertionError, match=rf"request row {a}: evicted token 0 .* maps to SWA slot"):
        check_allocator_invariants(alloc, rtp.req_to_token, [(a, 6, 4), (b, 5, 0)])
    full = alloc.full_attn_allocator
    saved = full.free_pages.clone()
    full.free_pages = torch.cat([full.free_pages, rtp.req_to_token[a, 5:6].long() // ps])
    with pytest.raises(AssertionError, match=rf"a live page is on the free list: page \d+ holds slot \d+ of request row {a}"):
        check_allocator_invariants(alloc, rtp.req_to_token, reqs)
    full.free_pages = saved[1:]
    with pytest.raises(AssertionError, match="pages leaked"):
        check_allocator_invariants(alloc, rtp.req_to_token, reqs)
    full.free_pages = saved
    rtp.req_to_token[b, 4] = rtp.req_to_token[a, 4]
    with pytest.raises(AssertionError, match=rf"slot \d+ is owned twice: by request row {a} token 4 .* and by request row {b} token 4"):
        check_allocator_invariants(alloc, rtp.req_to_token, reqs)


def test_empty_frees_and_allocations_change_nothing():
    _, alloc = make_swa(size=16, size_swa=8, page_size=4)
    alloc.alloc(4)
    before = snapshot(alloc)
    e = torch.zeros(0, dtype=torch.int64)
    alloc.free(e)
    alloc.free_swa(e)
    alloc.full_attn_allocator.free(e)
    alloc.free(torch.zeros(2, 3, dtype=torch.int32))  # padded tokens only (slot 0)
    assert alloc.alloc_extend(e, e, e, 0).numel() == 0 and alloc.alloc_decode(e, e).numel() == 0
    assert alloc.alloc(0).numel() == 0
    assert_same_snapshot(before, snapshot(alloc))
