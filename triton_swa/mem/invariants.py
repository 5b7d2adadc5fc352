"""The allocator invariants of docs/contract.md §2, checked against the live requests (for tests and debugging).

:func:`check_allocator_invariants` reads everything back to the host (a device synchronisation), so
it belongs in tests, soak runs and debug paths, not in a serving step.
"""

from __future__ import annotations

import torch

__all__ = ["check_allocator_invariants"]


def _requests(requests) -> list[tuple[int, int, int]]:
    out = []
    for r in requests:
        if isinstance(r, (tuple, list)):
            row, n, e = (tuple(r) + (0,))[:3] if len(r) == 2 else tuple(r)
        else:
            row, n, e = r.req_pool_index, r.seq_len, getattr(r, "evicted_len", 0)
        out.append((int(row), int(n), int(e)))
    return out


class _Where:
    """Lazy descriptions of live tokens: ``where[i]`` names the request row, position and slots of the i-th."""

    def __init__(self, segments):
        self.segments = segments

    def __getitem__(self, i: int) -> str:
        for row, start, full, swa in self.segments:
            if i < full.numel():
                extra = "" if swa is None else f", SWA slot {int(swa[i])}"
                return f"request row {row} token {start + i} (full slot {int(full[i])}{extra})"
            i -= full.numel()
        raise IndexError(i)


def _check_side(alloc, live: torch.Tensor, where, side: str) -> None:
    """One paged allocator: its marks and free list against the slots ``live`` (with descriptions)."""
    ps, num_pages = alloc.page_size, alloc.num_pages
    owned = alloc.slot_owned.cpu()
    free = alloc.free_pages.cpu()
    if owned[:ps].any():
        raise AssertionError(f"{side}: a slot of the dummy page 0 is owned ({owned[:ps].nonzero().flatten().tolist()})")
    if free.numel() and (free.min() < 1 or free.max() > num_pages):
        bad = free[(free < 1) | (free > num_pages)]
        raise AssertionError(f"{side}: the free list holds page {int(bad[0])}, outside 1..{num_pages}")
    uniq, counts = torch.unique(free, return_counts=True)
    if (counts > 1).any():
        raise AssertionError(f"{side}: page {int(uniq[counts > 1][0])} is on the free list twice")
    live_mask = torch.zeros_like(owned)
    live_mask[live] = True
    unowned = live_mask & ~owned
    if unowned.any():
        s = int(unowned.nonzero()[0])
        i = int((live == s).nonzero()[0])
        raise AssertionError(f"{side}: {where[i]} uses slot {s}, which the allocator does not own (freed or never allocated)")
    leaked = owned & ~live_mask
    if leaked.any():
        raise AssertionError(
            f"{side}: slot {int(leaked.nonzero()[0])} is owned but no live token uses it (leaked); {int(leaked.sum())} such slots"
        )
    held = owned.view(-1, ps).any(1)
    on_free = torch.zeros(num_pages + 1, dtype=torch.bool)
    on_free[free] = True
    both = held & on_free
    if both.any():
        p = int(both.nonzero()[0])
        s = p * ps + int(owned.view(-1, ps)[p].nonzero()[0])
        i = int((live == s).nonzero()[0])
        raise AssertionError(f"{side}: a live page is on the free list: page {p} holds slot {s} of {where[i]}")
    lost = ~held & ~on_free
    lost[0] = False
    if lost.any():
        raise AssertionError(
            f"{side}: pages leaked: {int(lost.sum())} pages are neither free nor hold an owned slot "
            f"(first: page {int(lost.nonzero()[0])}); free {free.numel()} + held "
            f"{int(held.sum())} != {num_pages}"
        )


def _distinct(slots: torch.Tensor, where, side: str) -> None:
    uniq, inverse, counts = torch.unique(slots, return_inverse=True, return_counts=True)
    if (counts > 1).any():
        s = int(uniq[counts > 1][0])
        holders = [where[i] for i in (slots == s).nonzero().flatten().tolist()[:2]]
        raise AssertionError(f"{side}: slot {s} is owned twice: by {holders[0]} and by {holders[1]}")


def check_allocator_invariants(allocator, req_to_token: torch.Tensor, requests) -> None:
    """Assert that the allocator's state is exactly what the live requests hold.

    Checked: every live token of a request maps to its own full slot (not the dummy page, at offset
    ``t % page_size``, owned, used by no other token); no slot or page is owned twice, no page with
    an owned slot is on a free list, no page is leaked (free + held == total), no slot is owned that
    no live token uses. With an SWA allocator also: tokens ``>= evicted_len`` map to an owned SWA slot
    of the same in-page offset, used by no other token; evicted tokens and every full slot that is
    not live map to 0; ``mapping[-1] == -1``.

    Args:
        allocator: a :class:`~triton_swa.mem.SWATokenToKVPoolAllocator` or a
            :class:`~triton_swa.mem.PagedTokenToKVPoolAllocator`.
        req_to_token (torch.Tensor): `[rows, max_context_len]` full slots per request row.
        requests: the live requests, each ``(req_pool_index, seq_len, evicted_len)`` (or
            ``(req_pool_index, seq_len)``), or an object with those attributes; ``seq_len`` counts
            every token that holds a slot (drafts included).

    Raises:
        AssertionError: the first broken invariant, naming the request row, position and slot.
    """
    swa_alloc = getattr(allocator, "swa_attn_allocator", None)
    full_alloc = getattr(allocator, "full_attn_allocator", allocator)
    ps = full_alloc.page_size
    rtt = req_to_token.cpu().long()
    reqs = _requests(requests)
    rows_seen: dict[int, int] = {}
    full_parts, swa_parts, full_where, swa_where = [], [], [], []
    mapping = allocator.full_to_swa_index_mapping.cpu() if swa_alloc is not None else None
    for row, n, e in reqs:
        if not 1 <= row < rtt.shape[0]:
            raise AssertionError(f"request row {row}: not a request row of req_to_token (1..{rtt.shape[0] - 1})")
        if row in rows_seen:
            raise AssertionError(f"request row {row} is listed twice")
        rows_seen[row] = n
        if not 0 <= e <= n <= rtt.shape[1]:
            raise AssertionError(f"request row {row}: needs 0 <= evicted_len ({e}) <= seq_len ({n}) <= {rtt.shape[1]}")
        full = rtt[row, :n]
        pos = torch.arange(n)
        bad = (full < ps) | (full >= full_alloc.num_slots)
        if bad.any():
            t = int(bad.nonzero()[0])
            raise AssertionError(
                f"request row {row}: token {t} maps to full slot {int(full[t])}, "
                f"not a slot of the pool ({ps}..{full_alloc.num_slots - 1}; page 0 is the dummy)"
            )
        off = full % ps != pos % ps
        if off.any():
            t = int(off.nonzero()[0])
            raise AssertionError(
                f"request row {row}: token {t} sits at offset {int(full[t]) % ps} of its page (full slot {int(full[t])}), expected {t % ps}"
            )
        full_parts.append(full)
        full_where.append((row, 0, full, None))
        if mapping is None:
            continue
        swa = mapping[full]
        ev = swa[:e] != 0
        if ev.any():
            t = int(ev.nonzero()[0])
            raise AssertionError(
                f"request row {row}: evicted token {t} (full slot {int(full[t])}, evicted_len {e}) "
                f"maps to SWA slot {int(swa[t])}, expected 0"
            )
        win = swa[e:]
        bad = (win < ps) | (win >= swa_alloc.num_slots)
        if bad.any():
            t = e + int(bad.nonzero()[0])
            raise AssertionError(
                f"request row {row}: in-window token {t} (full slot {int(full[t])}, evicted_len {e}) "
                f"maps to SWA slot {int(swa[t])}, not a live SWA slot ({ps}..{swa_alloc.num_slots - 1})"
            )
        off = win % ps != full[e:] % ps
        if off.any():
            t = e + int(off.nonzero()[0])
            raise AssertionError(
                f"request row {row}: token {t}: SWA slot {int(swa[t])} and full slot {int(full[t])} "
                f"sit at different offsets of their pages (lockstep broken)"
            )
        swa_parts.append(win)
        swa_where.append((row, e, full[e:], win))
    empty = torch.zeros(0, dtype=torch.int64)
    full_where, swa_where = _Where(full_where), _Where(swa_where)
    live_full = torch.cat(full_parts) if full_parts else empty
    _distinct(live_full, full_where, "full" if mapping is not None else "pool")
    _check_side(full_alloc, live_full, full_where, "full" if mapping is not None else "pool")
    if mapping is None:
        return
    live_swa = torch.cat(swa_parts) if swa_parts else empty
    _distinct(live_swa, swa_where, "SWA")
    _check_side(swa_alloc, live_swa, swa_where, "SWA")
    if mapping.shape[0] != full_alloc.num_slots + 1 or int(mapping[-1]) != -1:
        raise AssertionError(
            f"mapping must have {full_alloc.num_slots + 1} entries ending in -1, got {mapping.shape[0]} ending in {int(mapping[-1])}"
        )
    dead = torch.ones(full_alloc.num_slots, dtype=torch.bool)
    dead[live_full] = False
    stale = dead & (mapping[:-1] != 0)
    if stale.any():
        s = int(stale.nonzero()[0])
        raise AssertionError(f"full slot {s} is not live but maps to SWA slot {int(mapping[s])} (expected 0)")
