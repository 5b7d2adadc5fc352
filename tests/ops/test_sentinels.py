"""No count read from device memory makes a kernel write outside the tensors it was handed.

Device contents (``qo_indptr``, ``kv_indptr``, lengths, slots) are unchecked outside debug mode, so a
wrong one may give wrong numbers, but never a write past a tensor: each kernel bounds its writes by
host sizes. Every tensor a kernel writes is handed to it as a slice of a larger buffer whose guard
rows hold a sentinel; after a call with counts that overshoot, the guard rows must be unchanged bit
for bit. Tensors the kernels read are slices of larger buffers too, with harmless contents in their
guard rows, so that an unbounded read (which these tests do not judge) stays inside memory this test
owns. Launcher overrides (block sizes, split counts) make the tiny shapes walk the split-KV paths,
whose float32 partials are internal buffers (``poison.empty``): they are guarded the same way.

Issue 25, item 1: ``swa_extend`` with ``qo_indptr[-1]`` past ``q``'s rows overwrote the rows after
``out`` (and, split, the memory after its partials).
"""

from __future__ import annotations

import pytest
import torch

from triton_swa import WindowIndices, WindowPageTable, build_window_indices, build_window_page_table, store_kv, swa_decode, swa_extend
from triton_swa.runtime import poison

pytestmark = pytest.mark.interpreter

I32 = torch.int32
G = 8  # guard rows on each side
SENTINEL = {torch.float32: 1234.5, torch.int32: -777, torch.int64: -777}
# on a GPU the kernels run compiled, over tensors made on it (torch's default device in this module)
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _on_the_kernels_device():
    with torch.device(DEV):
        yield


def guarded(x: torch.Tensor, guard_fill=None, rows: int = G):
    """``(big, view)``: ``view`` holds ``x`` at rows ``[rows, rows + len(x))`` of ``big``, whose other
    rows hold ``guard_fill`` (default: the dtype's sentinel)."""
    fill = SENTINEL[x.dtype] if guard_fill is None else guard_fill
    big = torch.full((x.shape[0] + 2 * rows, *x.shape[1:]), fill, dtype=x.dtype)
    big[rows : rows + x.shape[0]] = x
    return big, big[rows : rows + x.shape[0]]


def assert_guards_untouched(big: torch.Tensor, n: int, name: str, rows: int = G, fill=None) -> None:
    fill = SENTINEL[big.dtype] if fill is None else fill
    want = torch.full((rows, *big.shape[1:]), fill, dtype=big.dtype)
    for side, part in (("before", big[:rows]), ("after", big[rows + n :])):
        assert torch.equal(part.view(-1).view(torch.uint8), want.view(-1).view(torch.uint8)), f"a write landed {side} {name}"


@pytest.fixture
def guarded_internal(monkeypatch):
    """Every buffer the launchers allocate (outputs, split partials) comes with guard elements."""
    made = []
    real = poison.empty

    def empty(*shape, dtype, device):
        x = real(*shape, dtype=dtype, device=device)
        n = x.numel()
        big = torch.full((n + 2 * max(n, 64),), SENTINEL.get(dtype, 0), dtype=dtype, device=device)
        pad = max(n, 64)
        view = big[pad : pad + n].view(x.shape)
        view.copy_(x)
        made.append((big, n, pad))
        return view

    monkeypatch.setattr(poison, "empty", empty)
    return made


def check_internal(made) -> None:
    for big, n, pad in made:
        assert_guards_untouched(big, n, f"an internal buffer of {n} elements", rows=pad)


# ----- swa_extend: qo_indptr past q's rows -----------------------------------------------------------


def _extend_inputs(paged: bool, T: int = 6):
    g = torch.Generator(DEV).manual_seed(0)
    HQ, H, D = 4, 2, 16
    q = torch.randn(T, HQ, D, generator=g)
    k = torch.randn(T, H, D, generator=g)
    v = torch.randn(T, H, D, generator=g)
    kb, vb = torch.randn(16, H, D, generator=g), torch.randn(16, H, D, generator=g)
    prefix = torch.tensor([4, 2], dtype=I32)
    if paged:
        idx = dict(page_table=torch.tensor([[1, 2], [3, 0]], dtype=I32), window_starts=torch.tensor([1, 0], dtype=I32), page_size=4)
    else:
        idx = dict(kv_indptr=torch.tensor([0, 3, 5], dtype=I32), kv_indices=torch.tensor([1, 2, 3, 5, 6], dtype=I32))
    return q, k, v, kb, vb, prefix, idx


@pytest.mark.parametrize("paged", [False, True], ids=["csr", "paged"])
@pytest.mark.parametrize("num_splits", [1, 3], ids=["one-split", "three-splits"])
@pytest.mark.parametrize("qo_end", [9, 40], ids=["three-rows-past", "far-past"])
def test_extend_qo_indptr_past_q_writes_nothing_outside(paged, num_splits, qo_end, guarded_internal):
    q, k, v, kb, vb, prefix, idx = _extend_inputs(paged)
    T = q.shape[0]
    over = dict(window_left=3, block_m=16, block_n=16, num_splits=num_splits, max_extend_len=qo_end - 3, **idx)
    # the valid batch: 3 + 3 tokens
    want = swa_extend(q, k, v, kb, vb, torch.tensor([0, 3, 6], dtype=I32), prefix, **over)
    # reads past q, k, v (before the fix) stay inside these buffers: zeros there
    big_q, q_v = guarded(q, 0.0, rows=64)
    big_k, k_v = guarded(k, 0.0, rows=64)
    big_v, v_v = guarded(v, 0.0, rows=64)
    big_out, out = guarded(torch.full_like(want, float("nan")), rows=64)
    guarded_internal.clear()
    got = swa_extend(q_v, k_v, v_v, kb, vb, torch.tensor([0, 3, qo_end], dtype=I32), prefix, out=out, **over)
    assert got.data_ptr() == out.data_ptr()
    assert_guards_untouched(big_out, T, "out", rows=64)
    check_internal(guarded_internal)
    # the rows inside q: request 1's first three tokens, as in the valid batch
    assert torch.equal(out, want)


def test_extend_qo_indptr_negative_or_decreasing_writes_nothing_outside(guarded_internal):
    q, k, v, kb, vb, prefix, idx = _extend_inputs(False)
    T = q.shape[0]
    big_q, q_v = guarded(q, 0.0, rows=64)
    big_k, k_v = guarded(k, 0.0, rows=64)
    big_v, v_v = guarded(v, 0.0, rows=64)
    for qo in ([-5, 3, 6], [0, 7, 2], [-40, -20, 6]):
        big_out, out = guarded(torch.zeros(T, 4, 16), rows=64)
        guarded_internal.clear()
        swa_extend(
            q_v, k_v, v_v, kb, vb, torch.tensor(qo, dtype=I32), prefix, out=out, window_left=3, block_m=16, block_n=16, num_splits=2,
            max_extend_len=50, **idx,
        )  # fmt: skip
        assert_guards_untouched(big_out, T, f"out (qo_indptr {qo})", rows=64)
        check_internal(guarded_internal)


# ----- swa_decode: kv_indptr / seq_lens past the index tensors ---------------------------------------


@pytest.mark.parametrize("paged", [False, True], ids=["csr", "paged"])
@pytest.mark.parametrize("num_splits", [1, 3], ids=["one-split", "three-splits"])
def test_decode_counts_past_the_indices_write_nothing_outside(paged, num_splits, guarded_internal):
    g = torch.Generator(DEV).manual_seed(1)
    B, HQ, H, D = 2, 4, 2, 16
    q = torch.randn(B, HQ, D, generator=g)
    kb, vb = torch.randn(16, H, D, generator=g), torch.randn(16, H, 8, generator=g)
    if paged:
        # seq_lens far past the table's two pages; reads past it find page 1
        big_pt, pt = guarded(torch.tensor([[1, 2], [3, 0]], dtype=I32), 1, rows=64)
        idx = dict(
            page_table=pt, window_starts=torch.tensor([2, 0], dtype=I32), seq_lens=torch.tensor([90, 4], dtype=torch.int64), page_size=4
        )
    else:
        # kv_indptr[-1] = 40, kv_indices holds 5; reads past it find slot 1
        big_ki, ki = guarded(torch.tensor([1, 2, 3, 5, 6], dtype=I32), 1, rows=64)
        idx = dict(kv_indptr=torch.tensor([0, 3, 40], dtype=I32), kv_indices=ki)
    big_out, out = guarded(torch.zeros(B, HQ, 8))
    guarded_internal.clear()
    swa_decode(q, kb, vb, out=out, num_splits=num_splits, block_n=16, max_window=64, **idx)
    assert_guards_untouched(big_out, B, "out")
    check_internal(guarded_internal)


# ----- index builders: lengths past req_to_token, undersized out buffers -----------------------------


def _rtt():
    rt = torch.ones(3, 16, dtype=I32)  # reads past a row (before any bound) find slot 1
    rt[1] = torch.arange(1, 17)
    rt[2] = torch.arange(17, 33)
    return guarded(rt, 1, rows=64)


@pytest.mark.parametrize("extend", [False, True], ids=["decode", "extend"])
@pytest.mark.parametrize("num_splits", [1, 4], ids=["one-program", "four-programs"])
def test_window_indices_lengths_past_capacity_write_nothing_outside(extend, num_splits):
    _, rt = _rtt()
    seq = torch.tensor([60, 9], dtype=I32)  # 60 > max_context_len 16, and the list overflows out
    prefix = torch.tensor([50, 9], dtype=I32) if extend else None
    bufs = [guarded(torch.zeros(n, dtype=I32)) for n in (3, 8, 2)]
    out = WindowIndices(*(view for _, view in bufs))
    build_window_indices(
        rt, torch.tensor([1, 2], dtype=I32), seq, window_left=-1, prefix_lens=prefix, out=out, block=16, num_splits=num_splits
    )
    for (big, view), name in zip(bufs, ("kv_indptr", "kv_indices", "window_starts")):
        assert_guards_untouched(big, view.shape[0], f"out.{name}")


@pytest.mark.parametrize("extend", [False, True], ids=["decode", "extend"])
@pytest.mark.parametrize("num_splits", [1, 4], ids=["one-program", "four-programs"])
def test_window_page_table_lengths_past_width_write_nothing_outside(extend, num_splits):
    _, rt = _rtt()
    seq = torch.tensor([60, 9], dtype=I32)
    prefix = torch.tensor([50, 9], dtype=I32) if extend else None
    # a [2, 2] table inside a [2 + 2G, 2 + 2G] buffer: guard rows and guard columns
    big_pt = torch.full((2 + 2 * G, 2 + 2 * G), SENTINEL[I32], dtype=I32)
    pt = big_pt[G : G + 2, G : G + 2]
    big_ws, ws = guarded(torch.zeros(2, dtype=I32))
    build_window_page_table(
        rt, torch.tensor([1, 2], dtype=I32), seq, window_left=-1, page_size=4, prefix_lens=prefix, out=WindowPageTable(pt, ws), block=16,
        num_splits=num_splits,
    )  # fmt: skip
    outside = big_pt.clone()
    outside[G : G + 2, G : G + 2] = SENTINEL[I32]
    assert torch.equal(outside, torch.full_like(big_pt, SENTINEL[I32])), "a write landed outside out.page_table"
    assert_guards_untouched(big_ws, 2, "out.window_starts")


# ----- store_kv: slots past the buffers (already dropped; kept dropped) ------------------------------


@pytest.mark.parametrize("translated", [False, True], ids=["full", "translated"])
def test_store_kv_out_of_range_slots_write_nothing_outside(translated):
    rows = 12
    big_k, kb = guarded(torch.zeros(rows, 2, 4))
    big_v, vb = guarded(torch.zeros(rows, 2, 4))
    loc = torch.tensor([rows, rows + 5, -rows - 1, 10**6, -(10**6), 3], dtype=torch.int64)
    k = torch.randn(len(loc), 2, 4)
    mapping = None
    if translated:
        mapping = torch.arange(0, 9, dtype=torch.int64)
        mapping[-1] = -1
        big_map, mapping = guarded(mapping, 5, rows=64)  # reads past the mapping would find slot 5
        loc = torch.tensor([9, 40, -10, 10**6, 3, 7], dtype=torch.int64)
    store_kv(kb, vb, loc, k, k.clone(), mapping=mapping)
    assert_guards_untouched(big_k, rows, "k_buffer")
    assert_guards_untouched(big_v, rows, "v_buffer")
