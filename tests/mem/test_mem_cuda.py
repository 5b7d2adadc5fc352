"""The memory model on CUDA: the same workload gives the same slots as on the CPU; ``alloc`` and an
eviction with nothing to evict do not synchronise (the other calls' counts are printed: the
allocators module docstring states the expected ones)."""

from __future__ import annotations

import warnings

import pytest
import torch

from triton_swa.mem import ReqToTokenPool, SWAKVPool, SWATokenToKVPoolAllocator, check_allocator_invariants, evict_swa_window

pytestmark = pytest.mark.gpu


def workload(device, ps=4, steps=60, seed=0):
    """A fixed random serving history (extend, drafts with mid-page rejection, eviction, finish)."""
    g = torch.Generator().manual_seed(seed)
    pool = SWAKVPool(96, 48, ps, torch.float16, [0], [1], device=device, head_num=1, head_dim=8)
    alloc = SWATokenToKVPoolAllocator(96, 48, ps, torch.float16, device, pool)
    alloc.full_attn_allocator.shuffle_free_list(g)
    alloc.swa_attn_allocator.shuffle_free_list(g)
    rtp = ReqToTokenPool(4, 256, device)
    lens, evicted, rows, history = {}, {}, [], []
    for _ in range(steps):
        if len(rows) < 3:
            (row,) = rtp.alloc(1)
            rows.append(row)
            lens[row], evicted[row] = 0, 0
        row = rows[int(torch.randint(len(rows), (1,), generator=g))]
        n, new = lens[row], int(torch.randint(1, 9, (1,), generator=g))
        last = rtp.req_to_token[row, n - 1].long().reshape(1) if n else torch.tensor([-1], device=device)
        prefix = torch.tensor([n], device=device)
        slots = alloc.alloc_extend(prefix, prefix + new, last, new) if n + new <= 200 else None
        if slots is None:
            alloc.free(rtp.req_to_token[row, :n])
            rtp.free(row)
            rows.remove(row)
            history.append(("finish", row))
            continue
        rtp.req_to_token[row, n : n + new] = slots.int()
        keep = n + int(torch.randint(0, new + 1, (1,), generator=g))
        alloc.free(rtp.req_to_token[row, keep : n + new])  # the rejected drafts
        lens[row] = keep
        evicted[row] = evict_swa_window(alloc, rtp.req_to_token, row, keep, 11, evicted[row])
        history.append((row, slots.tolist(), alloc.full_to_swa_index_mapping[slots].tolist()))
        check_allocator_invariants(alloc, rtp.req_to_token, [(r, lens[r], evicted[r]) for r in rows])
    return history, alloc


@pytest.mark.parametrize("ps", [1, 16])
def test_cuda_matches_cpu(ps):
    cpu, _ = workload("cpu", ps)
    gpu, alloc = workload("cuda", ps)
    assert gpu == cpu
    assert alloc.full_attn_allocator.slot_owned.is_cuda and alloc.full_attn_allocator.free_pages.is_cuda


def _syncs(fn) -> int:
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def test_synchronisations_per_call(capsys):
    ps = 16
    pool = SWAKVPool(64 * ps, 16 * ps, ps, torch.float16, [0], [1], device="cuda", head_num=1, head_dim=8)
    alloc = SWATokenToKVPoolAllocator(64 * ps, 16 * ps, ps, torch.float16, "cuda", pool)
    rtp = ReqToTokenPool(2, 512, "cuda")
    (row,) = rtp.alloc(1)
    counts = {}
    out = {}
    counts["alloc"] = _syncs(lambda: out.__setitem__("a", alloc.alloc(2 * ps)))
    rtp.req_to_token[row, : 2 * ps] = out["a"].int()
    dev = lambda *v: torch.tensor(v, device="cuda")
    counts["alloc_extend (device lengths)"] = _syncs(
        lambda: out.__setitem__("b", alloc.alloc_extend(dev(2 * ps), dev(2 * ps + 5), rtp.req_to_token[row, 2 * ps - 1 : 2 * ps].long(), 5))
    )
    rtp.req_to_token[row, 2 * ps : 2 * ps + 5] = out["b"].int()
    counts["alloc_decode"] = _syncs(lambda: alloc.alloc_decode(dev(2 * ps + 6), out["b"][-1:]))
    counts["free (tail)"] = _syncs(lambda: alloc.free(rtp.req_to_token[row, 2 * ps + 2 : 2 * ps + 5]))
    counts["free_swa"] = _syncs(lambda: alloc.free_swa(rtp.req_to_token[row, :ps]))
    counts["evict_swa_window (nothing to evict)"] = _syncs(lambda: evict_swa_window(alloc, rtp.req_to_token, row, 2 * ps + 2, 4 * ps, ps))
    with capsys.disabled():
        print("\nsynchronisations per call:", counts)
    assert counts["alloc"] == 0
    assert counts["evict_swa_window (nothing to evict)"] == 0
