"""Token-slot allocators with SGLang's names and semantics (docs/contract.md §2).

Failure policy: every ``alloc*`` returns **None** when capacity is short, and then leaves the free
lists, the ownership marks and the full-to-SWA mapping exactly as they were (capacity is checked
before anything moves). A wrong argument raises ``TypeError``/``ValueError`` naming it, also before
anything moves.

Slots are page-aligned: with ``page_size > 1``, token ``t`` of a request sits at offset
``t % page_size`` of its page, and the SWA allocator runs its two paged allocators in lockstep so
that a full slot and its SWA slot share that offset.

Ownership: each allocator marks the slots it hands out (``slot_owned``). ``free`` takes any set of
owned slots, also a request's tail that starts inside a page (rejected drafts, retraction): the
slots stop being owned and a page returns to the free list only when none of its slots is owned
any more, so a page that still holds live tokens can never be handed out again. Freeing a slot
that is not owned (a double free, a slot never handed out) or outside the pool raises.

Device synchronisations (the allocators keep their state on ``device``; index arguments may live
there or on the CPU): ``alloc`` none; ``alloc_extend``/``alloc_decode`` one read of the free list
and ownership marks, plus one to read the lengths when they are device tensors; ``free`` and
``free_swa`` two (``torch.unique``, then one read of the marks).
"""

from __future__ import annotations

import torch

from ..runtime.checks import INDEX_DTYPES, check_int, check_tensor, check_window_left, same_device
from .pools import _check_device, is_swa_kv_pool


def _check_index(name: str, x, device: torch.device, ndim: int | None = None) -> torch.Tensor:
    """An int32/int64 tensor on ``device`` or on the CPU (host copies are fine)."""
    check_tensor(name, x, dtype=INDEX_DTYPES, ndim=ndim)
    if not (x.device.type == "cpu" or same_device(x.device, device)):
        raise ValueError(f"{name} must be on device {device} or on the CPU, got {x.device}")
    return x


def _to_host(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """int64 CPU copies of 1-D tensors, read back in one transfer when any lives on a device."""
    on_device = [t.long() for t in tensors if t.device.type != "cpu"]
    read = iter(torch.cat(on_device).cpu().split([t.numel() for t in on_device]) if on_device else ())
    return [t.long() if t.device.type == "cpu" else next(read) for t in tensors]


def _to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    # From pageable memory the copy is staged before it returns, so no device synchronisation.
    return x.to(device, non_blocking=True)


class PagedTokenToKVPoolAllocator:
    """Free list of pages ``1..size // page_size`` (page 0 is the dummy); hands out token slots.

    Args:
        size (int): usable token slots, a positive multiple of ``page_size``, at most the pool's size.
        page_size (int): tokens per page; must equal ``kvcache.page_size``.
        dtype (torch.dtype): the KV dtype (kept for SGLang's signature).
        device: where the free list, the ownership marks and returned slot tensors live.
        kvcache: the pool these slots index; ``get_kvcache()`` returns it.
        need_sort (bool): keep the free list sorted after each free (SGLang's option).

    Attributes:
        free_pages (torch.Tensor): int64 free page ids, handed out from the front.
        slot_owned (torch.Tensor): bool `[size + page_size]`, True for every slot handed out and not freed.
    """

    def __init__(self, size: int, page_size: int, dtype, device, kvcache, need_sort: bool = False):
        check_int("page_size", page_size, minimum=1)
        check_int("size", size, minimum=1)
        if size % page_size:
            raise ValueError(f"size ({size}) must be a multiple of page_size ({page_size})")
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
        device = _check_device("device", device)
        if not isinstance(need_sort, bool):
            raise TypeError(f"need_sort must be a bool, got {type(need_sort).__name__}")
        if kvcache is None:
            raise TypeError("kvcache must be the KV pool these slots index, got None")
        kv_page = getattr(kvcache, "page_size", page_size)
        if kv_page != page_size:
            raise ValueError(f"page_size ({page_size}) disagrees with the pool's page_size ({kv_page})")
        kv_size = getattr(kvcache, "size", None)
        if isinstance(kv_size, int) and size > kv_size:
            raise ValueError(f"size ({size}) exceeds the pool's size ({kv_size} slots): slots past its buffers")
        kv_dev = getattr(kvcache, "device", None)
        if isinstance(kv_dev, torch.device) and not same_device(kv_dev, device):
            raise ValueError(f"device ({device}) differs from the pool's device ({kv_dev})")
        self.size, self.page_size, self.dtype = size, page_size, dtype
        self.device = device
        self.need_sort = need_sort
        self._kvcache = kvcache
        self.num_pages = size // page_size
        self.num_slots = (self.num_pages + 1) * page_size
        self.clear()

    def clear(self) -> None:
        """Every page free again, in order; no slot owned."""
        self.free_pages = torch.arange(1, self.num_pages + 1, dtype=torch.int64, device=self.device)
        self.slot_owned = torch.zeros(self.num_slots, dtype=torch.bool, device=self.device)

    def get_kvcache(self):
        return self._kvcache

    def available_size(self) -> int:
        """Free token slots: whole free pages times ``page_size`` (no device synchronisation)."""
        return len(self.free_pages) * self.page_size

    def shuffle_free_list(self, generator: torch.Generator | None = None) -> None:
        """Permute the free list (tests use it so that two allocators' slots differ)."""
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        order = torch.randperm(len(self.free_pages), generator=generator).to(self.device)
        self.free_pages = self.free_pages[order]

    def _pages_to_slots(self, pages: torch.Tensor) -> torch.Tensor:
        offsets = torch.arange(self.page_size, dtype=torch.int64, device=pages.device)
        return (pages[:, None] * self.page_size + offsets).reshape(-1)

    def _check_need_size(self, need_size) -> int:
        check_int("need_size", need_size, minimum=0)
        if need_size % self.page_size:
            raise ValueError(f"need_size ({need_size}) must be a multiple of page_size ({self.page_size})")
        return need_size // self.page_size

    def _take(self, num_pages: int) -> torch.Tensor:
        pages, self.free_pages = self.free_pages[:num_pages], self.free_pages[num_pages:]
        return pages

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` slots (a multiple of ``page_size``) on whole fresh pages, or None."""
        num = self._check_need_size(need_size)
        if num > len(self.free_pages):
            return None
        slots = self._pages_to_slots(self._take(num))
        # index_fill_ takes the value by value: `[slots] = True` would copy a host scalar (a sync on CUDA)
        self.slot_owned.index_fill_(0, slots, True)
        return slots

    # ---- extend: plan on the host, then commit -------------------------------------------------

    def _extend_inputs(self, prefix_lens, seq_lens, last_loc, extend_num_tokens, decode: bool = False):
        """Validated int64 host copies of the three length tensors (``decode``: prefix is seq - 1)."""
        _check_index("prefix_lens", prefix_lens, self.device, ndim=1)
        _check_index("seq_lens", seq_lens, self.device)
        _check_index("last_loc", last_loc, self.device)
        for name, t in (("seq_lens", seq_lens), ("last_loc", last_loc)):
            if t.shape != prefix_lens.shape:
                raise ValueError(f"{name} must have shape {list(prefix_lens.shape)} like prefix_lens, got {list(t.shape)}")
        if extend_num_tokens is not None:
            check_int("extend_num_tokens", extend_num_tokens, minimum=0)
        prefix, seq, last = _to_host(prefix_lens, seq_lens, last_loc)
        if bool((prefix < 0).any()):
            b = int((prefix < 0).nonzero()[0])
            if decode:
                raise ValueError(f"seq_lens must be >= 1 for decode (it counts the new token), got seq_lens[{b}] = {int(seq[b])}")
            raise ValueError(f"prefix_lens must be >= 0, got prefix_lens[{b}] = {int(prefix[b])}")
        if bool((seq < prefix).any()):
            b = int((seq < prefix).nonzero()[0])
            raise ValueError(f"seq_lens must be >= prefix_lens, got seq_lens[{b}] = {int(seq[b])} < prefix_lens[{b}] = {int(prefix[b])}")
        total = int((seq - prefix).sum())
        if extend_num_tokens is not None and extend_num_tokens != total:
            raise ValueError(f"extend_num_tokens ({extend_num_tokens}) != sum(seq_lens - prefix_lens) ({total})")
        self._check_last_loc(prefix, seq, last, "last_loc")
        return prefix, seq, last

    def _continuing(self, prefix: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
        """Requests whose new tokens start inside the page of their last token."""
        return (prefix % self.page_size != 0) & (seq > prefix)

    def _check_last_loc(self, prefix, seq, last, name: str) -> None:
        ps = self.page_size
        bad = (last != -1) & ((last < ps) | (last >= self.num_slots))
        if bool(bad.any()):
            b = int(bad.nonzero()[0])
            raise ValueError(f"{name}[{b}] = {int(last[b])} is neither -1 nor a slot of this pool ({ps}..{self.num_slots - 1})")
        cont = self._continuing(prefix, seq)
        wrong = cont & ((last < 0) | (last % ps != (prefix - 1) % ps))
        if bool(wrong.any()):
            b = int(wrong.nonzero()[0])
            raise ValueError(
                f"{name}[{b}] = {int(last[b])} is not the slot of token prefix_lens[{b}] - 1 = {int(prefix[b]) - 1}: "
                f"with page_size {ps} that token sits at offset {(int(prefix[b]) - 1) % ps} of its page"
            )
        pages = last[cont] // ps
        if pages.unique().numel() != pages.numel():
            raise ValueError(f"{name}: two requests continue the same page ({sorted(pages.tolist())})")

    def _new_pages(self, prefix: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
        # Pages already held cover positions < ceil(prefix / ps) * ps.
        ps = self.page_size
        return (seq + ps - 1) // ps - (prefix + ps - 1) // ps

    def _rows_of(self, last_dev: torch.Tensor) -> torch.Tensor:
        """Ownership marks of the pages of ``last_dev`` (device, clamped so the gather is safe)."""
        pages = last_dev.clamp(0, self.num_slots - 1) // self.page_size
        return self.slot_owned.view(-1, self.page_size)[pages].reshape(-1).long()

    def _check_continued(self, prefix, seq, last, rows, name: str, what: str = "slot") -> None:
        """Each continued page: ``last`` owned, the slots about to be handed out not owned."""
        ps = self.page_size
        cont = self._continuing(prefix, seq).nonzero().flatten().tolist()
        rows = rows.view(-1, ps)
        for j, b in enumerate(cont):
            p, s, lloc = int(prefix[b]), int(seq[b]), int(last[b])
            if not rows[j, lloc % ps]:
                raise ValueError(f"{name}[{b}] = {lloc} is a {what} that is not allocated: cannot continue its page for token {p}")
            first, upto = p % ps, min(ps, p % ps + s - p)
            taken = rows[j, first:upto].nonzero().flatten()
            if taken.numel():
                slot = lloc - lloc % ps + first + int(taken[0])
                raise ValueError(
                    f"{name}[{b}] = {lloc}: {what} {slot} after it is already allocated "
                    f"(continuing the page for token {p} would hand it out twice)"
                )

    def _layout(self, prefix, seq, last, fresh) -> torch.Tensor:
        """Host slots of tokens ``[prefix[b], seq[b])`` of each request, concatenated."""
        ps = self.page_size
        out, used = [], 0
        for p, s, lloc, n in zip(prefix.tolist(), seq.tolist(), last.tolist(), self._new_pages(prefix, seq).tolist()):
            if s == p:
                continue
            pos = torch.arange(p, s)
            # Position t lives on the request's page t // ps; fresh pages start at ceil(p / ps),
            # earlier positions continue the page of last_loc.
            first_fresh = (p + ps - 1) // ps
            rel = pos // ps - first_fresh
            page_of = torch.where(rel < 0, torch.full_like(pos, max(lloc, 0) // ps), fresh[used + rel.clamp(min=0)] if n else pos * 0)
            out.append(page_of * ps + pos % ps)
            used += n
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64)

    def _commit(self, slots_host: torch.Tensor, num_pages: int) -> torch.Tensor:
        self._take(num_pages)
        slots = _to_device(slots_host, self.device)
        self.slot_owned.index_fill_(0, slots, True)
        return slots

    def alloc_extend(self, prefix_lens, seq_lens, last_loc, extend_num_tokens: int | None = None):
        """Slots for tokens ``[prefix_lens[b], seq_lens[b])`` of each request, concatenated.

        A request whose prefix ends inside a page continues that page after ``last_loc[b]`` (the slot
        of token ``prefix_lens[b] - 1``, which must be allocated; -1 when there is no prefix); further
        tokens take fresh pages.

        Args:
            prefix_lens, seq_lens, last_loc (torch.Tensor): int32/int64 `[B]`, on ``device`` or the CPU.
            extend_num_tokens (int | None): ``sum(seq_lens - prefix_lens)`` when given.

        Returns:
            torch.Tensor | None: int64 `[sum(seq_lens - prefix_lens)]`, or None when pages are short.

        Raises:
            TypeError, ValueError: a wrong argument, or a ``last_loc`` whose page cannot be continued.
        """
        return self._extend(prefix_lens, seq_lens, last_loc, extend_num_tokens, False)

    def _extend(self, prefix_lens, seq_lens, last_loc, extend_num_tokens, decode: bool):
        prefix, seq, last = self._extend_inputs(prefix_lens, seq_lens, last_loc, extend_num_tokens, decode)
        num = int(self._new_pages(prefix, seq).sum())
        if num > len(self.free_pages):
            return None
        cont = self._continuing(prefix, seq)
        last_dev = _to_device(last[cont], self.device)
        packed = torch.cat([self.free_pages[:num], self._rows_of(last_dev)]).cpu()
        fresh, rows = packed[:num], packed[num:]
        self._check_continued(prefix, seq, last, rows, "last_loc")
        return self._commit(self._layout(prefix, seq, last, fresh), num)

    def alloc_decode(self, seq_lens, last_loc):
        """One slot per request for token ``seq_lens[b] - 1`` (``seq_lens`` already counts it)."""
        seq = _check_index("seq_lens", seq_lens, self.device, ndim=1)
        return self._extend(seq - 1, seq, last_loc, None, True)

    # ---- free: validate everything, then release ----------------------------------------------

    def _marks(self, slots: torch.Tensor) -> list[torch.Tensor]:
        """Device: per slot, whether it is owned and how many slots of its page are owned."""
        safe = slots.clamp(0, self.num_slots - 1)
        owned = self.slot_owned.view(-1, self.page_size)
        return [self.slot_owned[safe].long(), owned[safe // self.page_size].sum(1)]

    def _plan_release(self, slots, owned, held, name: str, what: str = "slot", check_owned: bool = True):
        """Host: validate the distinct nonzero ``slots`` and return the pages they empty."""
        ps = self.page_size
        keep = slots != 0
        slots, owned, held = slots[keep], owned[keep], held[keep]
        order = torch.argsort(slots)
        slots, owned, held = slots[order], owned[order], held[order]
        out = (slots < ps) | (slots >= self.num_slots)
        if bool(out.any()):
            s = int(slots[out][0])
            raise ValueError(
                f"{name} holds {what} {s}, outside this pool's slots {ps}..{self.num_slots - 1} "
                f"(pages 1..{self.num_pages}; slot 0 is the dummy and is skipped)"
            )
        if slots.numel() > 1 and bool((slots[1:] == slots[:-1]).any()):
            s = int(slots[1:][slots[1:] == slots[:-1]][0])
            raise ValueError(f"{name} holds {what} {s} twice")
        if not check_owned:
            return None
        if bool((owned == 0).any()):
            s = int(slots[owned == 0][0])
            raise ValueError(f"{name} holds {what} {s}, which is not allocated (a double free, or a slot never handed out)")
        pages, counts = torch.unique_consecutive(slots // ps, return_counts=True)
        first = torch.cumsum(counts, 0) - counts
        return pages[counts == held[first]]

    def _release(self, slots_dev: torch.Tensor, pages: torch.Tensor) -> None:
        self.slot_owned.index_fill_(0, slots_dev, False)  # slot 0 is never owned: zeros here are harmless
        if pages.numel():
            self.free_pages = torch.cat([self.free_pages, _to_device(pages, self.device)])
            if self.need_sort:
                self.free_pages = torch.sort(self.free_pages).values

    def _unique(self, name: str, free_index) -> tuple[torch.Tensor, torch.Tensor]:
        _check_index(name, free_index, self.device)
        flat = free_index.reshape(-1).to(self.device).long()
        return torch.unique(flat, return_counts=True)

    def free(self, free_index: torch.Tensor) -> None:
        """Free owned slots; each page whose slots are all free goes back on the free list.

        Slot 0 (the dummy, where padded tokens point) is skipped. A tail that starts inside a page
        keeps that page, whose earlier slots are still owned.

        Args:
            free_index (torch.Tensor): int32/int64 slots, any shape, on ``device`` or the CPU.

        Raises:
            ValueError: a slot outside the pool, one not allocated (double free), or one given twice;
                nothing is freed then.
        """
        uniq, counts = self._unique("free_index", free_index)
        host = torch.stack([uniq, counts, *self._marks(uniq)]).cpu()
        slots, counts, owned, held = host
        if bool((counts[slots != 0] > 1).any()):
            s = int(slots[(slots != 0) & (counts > 1)][0])
            raise ValueError(f"free_index holds slot {s} twice")
        pages = self._plan_release(slots, owned, held, "free_index")
        self._release(uniq, pages)


class TokenToKVPoolAllocator(PagedTokenToKVPoolAllocator):
    """The page-size-1 allocator: any ``need_size`` slots from the free list."""

    def __init__(self, size: int, dtype, device, kvcache, need_sort: bool = False):
        super().__init__(size, 1, dtype, device, kvcache, need_sort)


class SWATokenToKVPoolAllocator:
    """A full and an SWA allocator in lockstep, recording ``full_to_swa_index_mapping[full] = swa``.

    The mapping is int64 `[size + page_size + 1]`: 0 means no SWA slot, the last element is -1 (so
    that -1 maps to -1). It is registered with ``kvcache`` and shared by reference.

    Args:
        size (int): full-pool token slots, at most the full sub-pool's size.
        size_swa (int): SWA-pool token slots, at most the SWA sub-pool's size.
        page_size (int): tokens per page, the same on both sides and in both sub-pools.
        dtype (torch.dtype): the KV dtype (kept for SGLang's signature).
        device: where the allocators' state and the mapping live (the pool's device).
        kvcache: a pool with ``swa_kv_pool``, ``full_kv_pool`` and ``register_mapping`` (an
            ``SWAKVPool``); ``full_kv_pool`` may be None when the model has no full layers.
        need_sort (bool): keep both free lists sorted (SGLang's option).
        req_to_token_pool: accepted for SGLang's signature; not used.
    """

    def __init__(self, size: int, size_swa: int, page_size: int, dtype, device, kvcache, need_sort: bool = False, req_to_token_pool=None):
        if not (is_swa_kv_pool(kvcache) and callable(getattr(kvcache, "register_mapping", None))):
            raise TypeError(
                f"kvcache must be an SWA pool (with swa_kv_pool, full_kv_pool and register_mapping), got {type(kvcache).__name__}"
            )
        check_int("page_size", page_size, minimum=1)
        check_int("size", size, minimum=1)
        check_int("size_swa", size_swa, minimum=1)
        for name, value in (("size", size), ("size_swa", size_swa)):
            if value % page_size:
                raise ValueError(f"{name} ({value}) must be a multiple of page_size ({page_size})")
        full_pool = kvcache.full_kv_pool if kvcache.full_kv_pool is not None else kvcache
        for name, value, sub, side in (("size", size, full_pool, "full"), ("size_swa", size_swa, kvcache.swa_kv_pool, "SWA")):
            sub_size, sub_page = getattr(sub, "size", None), getattr(sub, "page_size", page_size)
            if sub_page != page_size:
                raise ValueError(f"page_size ({page_size}) disagrees with the {side} sub-pool's page_size ({sub_page})")
            if isinstance(sub_size, int) and value > sub_size:
                raise ValueError(
                    f"{name} ({value}) exceeds the {side} sub-pool's size ({sub_size} slots): it would hand out slots past its buffers"
                )
        self.full_attn_allocator = PagedTokenToKVPoolAllocator(size, page_size, dtype, device, full_pool, need_sort)
        self.swa_attn_allocator = PagedTokenToKVPoolAllocator(size_swa, page_size, dtype, device, kvcache.swa_kv_pool, need_sort)
        self.size, self.size_swa, self.page_size = size, size_swa, page_size
        self.dtype, self.device = dtype, self.full_attn_allocator.device
        self.need_sort = need_sort
        self.req_to_token_pool = req_to_token_pool
        self._kvcache = kvcache
        self.full_to_swa_index_mapping = torch.zeros(size + page_size + 1, dtype=torch.int64, device=self.device)
        self.full_to_swa_index_mapping[-1] = -1
        kvcache.register_mapping(self.full_to_swa_index_mapping)

    def get_kvcache(self):
        return self._kvcache

    def available_size(self) -> int:
        return min(self.full_available_size(), self.swa_available_size())

    def full_available_size(self) -> int:
        return self.full_attn_allocator.available_size()

    def swa_available_size(self) -> int:
        return self.swa_attn_allocator.available_size()

    def clear(self) -> None:
        self.full_attn_allocator.clear()
        self.swa_attn_allocator.clear()
        self.full_to_swa_index_mapping.zero_()
        self.full_to_swa_index_mapping[-1] = -1

    def _pages_short(self, num_pages: int) -> bool:
        return num_pages > min(len(self.full_attn_allocator.free_pages), len(self.swa_attn_allocator.free_pages))

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """Full slots for ``need_size`` tokens (SWA slots recorded in the mapping), or None."""
        num = self.full_attn_allocator._check_need_size(need_size)
        if self._pages_short(num):
            return None
        full = self.full_attn_allocator.alloc(need_size)
        swa = self.swa_attn_allocator.alloc(need_size)
        self.full_to_swa_index_mapping[full] = swa
        return full

    def alloc_extend(self, prefix_lens, seq_lens, last_loc, extend_num_tokens: int | None = None):
        """Paged extend on both sides; the SWA side continues the page of ``mapping[last_loc]``.

        Same arguments, result and errors as :meth:`PagedTokenToKVPoolAllocator.alloc_extend`; a
        ``last_loc`` whose page is continued must also have an SWA slot (not evicted).
        """
        return self._extend(prefix_lens, seq_lens, last_loc, extend_num_tokens, False)

    def _extend(self, prefix_lens, seq_lens, last_loc, extend_num_tokens, decode: bool):
        full_a, swa_a = self.full_attn_allocator, self.swa_attn_allocator
        prefix, seq, last = full_a._extend_inputs(prefix_lens, seq_lens, last_loc, extend_num_tokens, decode)
        num = int(full_a._new_pages(prefix, seq).sum())
        if self._pages_short(num):
            return None
        cont = full_a._continuing(prefix, seq)
        last_dev = _to_device(last[cont], self.device)
        swa_last_dev = self.full_to_swa_index_mapping[last_dev]
        parts = [full_a.free_pages[:num], swa_a.free_pages[:num], full_a._rows_of(last_dev), swa_last_dev, swa_a._rows_of(swa_last_dev)]
        fresh_full, fresh_swa, rows_full, swa_last_c, rows_swa = torch.cat(parts).cpu().split([p.numel() for p in parts])
        full_a._check_continued(prefix, seq, last, rows_full, "last_loc")
        swa_last = torch.full_like(last, -1)
        swa_last[cont] = swa_last_c
        no_swa = cont & (swa_last <= 0)
        if bool(no_swa.any()):
            b = int(no_swa.nonzero()[0])
            raise ValueError(
                f"last_loc[{b}] = {int(last[b])} has no SWA slot (evicted, or never allocated): "
                f"cannot continue its SWA page for token {int(prefix[b])}"
            )
        swa_a._check_last_loc(prefix, seq, swa_last, "mapping[last_loc]")
        swa_a._check_continued(prefix, seq, swa_last, rows_swa, "mapping[last_loc]", "SWA slot")
        full_host = full_a._layout(prefix, seq, last, fresh_full)
        swa_host = swa_a._layout(prefix, seq, swa_last, fresh_swa)
        full = full_a._commit(full_host, num)
        self.full_to_swa_index_mapping[full] = swa_a._commit(swa_host, num)
        return full

    def alloc_decode(self, seq_lens, last_loc):
        """One slot per request for token ``seq_lens[b] - 1`` (``seq_lens`` already counts it)."""
        seq = _check_index("seq_lens", seq_lens, self.device, ndim=1)
        return self._extend(seq - 1, seq, last_loc, None, True)

    def _swa_plan(self, uniq: torch.Tensor, extra: list[torch.Tensor]):
        """One read of the full-side marks in ``extra`` and the SWA slots of ``uniq`` with their marks."""
        swa = self.full_to_swa_index_mapping[uniq.clamp(0, self.full_attn_allocator.num_slots - 1)]
        host = torch.stack([uniq, *extra, swa, *self.swa_attn_allocator._marks(swa)]).cpu()
        return swa, host

    def free(self, free_index: torch.Tensor) -> None:
        """Free full slots and the SWA slots they map to; their mapping entries become 0.

        Same rules as :meth:`PagedTokenToKVPoolAllocator.free` on both sides (entries already 0 on
        the SWA side, i.e. evicted, are skipped); everything is checked before anything changes.
        """
        full_a, swa_a = self.full_attn_allocator, self.swa_attn_allocator
        uniq, counts = full_a._unique("free_index", free_index)
        swa_dev, host = self._swa_plan(uniq, [counts, *full_a._marks(uniq)])
        slots, counts, owned, held, swa, swa_owned, swa_held = host
        if bool((counts[slots != 0] > 1).any()):
            raise ValueError(f"free_index holds slot {int(slots[(slots != 0) & (counts > 1)][0])} twice")
        full_pages = full_a._plan_release(slots, owned, held, "free_index")
        swa_pages = swa_a._plan_release(swa, swa_owned, swa_held, "free_index", "(mapped) SWA slot")
        swa_a._release(swa_dev, swa_pages)
        full_a._release(uniq, full_pages)
        self.full_to_swa_index_mapping.index_fill_(0, uniq, 0)

    def free_swa(self, free_index: torch.Tensor) -> None:
        """Free only the SWA slots of full slots ``free_index`` (those mapped ``> 0``); mapping -> 0.

        Raises:
            ValueError: a full slot outside the pool or given twice, or an SWA slot it maps to that
                is not allocated; nothing is freed then.
        """
        full_a, swa_a = self.full_attn_allocator, self.swa_attn_allocator
        uniq, counts = full_a._unique("free_index", free_index)
        swa_dev, host = self._swa_plan(uniq, [counts])
        slots, counts, swa, swa_owned, swa_held = host
        full_a._plan_release(slots, counts, counts, "free_index", check_owned=False)
        if bool((counts[slots != 0] > 1).any()):
            raise ValueError(f"free_index holds slot {int(slots[(slots != 0) & (counts > 1)][0])} twice")
        swa_pages = swa_a._plan_release(swa, swa_owned, swa_held, "free_index", "(mapped) SWA slot")
        swa_a._release(swa_dev, swa_pages)
        self.full_to_swa_index_mapping.index_fill_(0, uniq, 0)


def evict_swa_window(
    allocator: SWATokenToKVPoolAllocator, req_to_token: torch.Tensor, req_pool_index: int, seq_len: int, window_left: int, evicted_len: int
) -> int:
    """Free the SWA slots of one request's tokens that no later query can see; return the new mark.

    After a step that committed ``seq_len`` tokens, every later query sits at position ``>= seq_len``
    and sees keys ``>= seq_len - W``. Tokens ``[evicted_len, floor_page(seq_len - W))`` are freed with
    ``free_swa`` (whole pages only, so a page shared with in-window tokens stays). ``window_left = -1``
    evicts nothing.

    Args:
        allocator: an SWA allocator (with ``free_swa`` and ``page_size``).
        req_to_token (torch.Tensor): int32/int64 `[rows, max_context_len]`.
        req_pool_index (int): the request's row, ``1..rows - 1`` (row 0 is padding).
        seq_len (int): committed tokens, ``<= max_context_len``.
        window_left (int): ``W >= 0``, or -1 for full attention.
        evicted_len (int): the current mark, ``<= seq_len``.

    Returns:
        int: the new ``evicted_len`` (tokens below it have no SWA slot).
    """
    if not (callable(getattr(allocator, "free_swa", None)) and isinstance(getattr(allocator, "page_size", None), int)):
        raise TypeError(f"allocator must be an SWA allocator (with free_swa), got {type(allocator).__name__}")
    check_tensor("req_to_token", req_to_token, dtype=INDEX_DTYPES, ndim=2)
    check_int("req_pool_index", req_pool_index)
    rows, max_len = req_to_token.shape
    if not 1 <= req_pool_index < rows:
        raise ValueError(f"req_pool_index must be a request row 1..{rows - 1} (row 0 is padding), got {req_pool_index}")
    check_int("seq_len", seq_len, minimum=0)
    if seq_len > max_len:
        raise ValueError(f"seq_len ({seq_len}) exceeds req_to_token's max_context_len ({max_len})")
    check_window_left(window_left)
    check_int("evicted_len", evicted_len, minimum=0)
    if evicted_len > seq_len:
        raise ValueError(f"evicted_len ({evicted_len}) must be <= seq_len ({seq_len})")
    if window_left < 0:
        return evicted_len
    ps = allocator.page_size
    upto = max(0, seq_len - window_left) // ps * ps
    if upto <= evicted_len:
        return evicted_len
    allocator.free_swa(req_to_token[req_pool_index, evicted_len:upto].long())
    return upto


def alloc_positions(allocator, req_to_token: torch.Tensor, rows, starts, counts) -> torch.Tensor | None:
    """Slots for positions ``[starts[i], starts[i] + counts[i])`` of request row ``rows[i]``, recorded
    in ``req_to_token``; a request's page is continued from its slot at ``starts[i] - 1``.

    One ``alloc_extend`` over the whole step, with the last slots read on the device (no host sync
    per request). Returns None, changing nothing, when the pools are short.

    Args:
        allocator: a paged or SWA allocator (with ``alloc_extend``).
        req_to_token (torch.Tensor): int32 `[rows, max_context_len]`, on the allocator's device.
        rows, starts, counts (list[int]): one entry per request.
    """
    dev = req_to_token.device
    rows_t = torch.tensor(rows, dtype=torch.int64, device=dev)
    prefix = torch.tensor(starts, dtype=torch.int64, device=dev)
    seq = prefix + torch.tensor(counts, dtype=torch.int64, device=dev)
    last = torch.where(prefix > 0, req_to_token[rows_t, (prefix - 1).clamp(min=0)].long(), -1)
    slots = allocator.alloc_extend(prefix, seq, last, int(sum(counts)))
    if slots is None:
        return None
    at = 0
    for r, s, m in zip(rows, starts, counts):
        req_to_token[r, s : s + m] = slots[at : at + m].to(torch.int32)
        at += m
    return slots
