"""Token-slot allocators with SGLang's names and semantics (SPEC §2).

Failure policy: every ``alloc*`` returns **None** when capacity is short, and then leaves the free
lists and the full-to-SWA mapping exactly as they were (capacity is checked before anything moves).

Slots are page-aligned: with ``page_size > 1``, token ``t`` of a request sits at offset
``t % page_size`` of its page, and the SWA allocator runs its two paged allocators in lockstep so
that a full slot and its SWA slot share that offset.
"""

from __future__ import annotations

import torch

from .._checks import check_int, check_tensor


class PagedTokenToKVPoolAllocator:
    """Free list of pages ``1..size // page_size`` (page 0 is the dummy); hands out token slots.

    Args:
        size (int): usable token slots, a multiple of ``page_size``.
        page_size (int): tokens per page.
        dtype: the KV dtype (kept for SGLang's signature).
        device: where returned slot tensors live.
        kvcache: the pool these slots index; ``get_kvcache()`` returns it.
    """

    def __init__(self, size: int, page_size: int, dtype, device, kvcache):
        check_int("size", size, minimum=0)
        check_int("page_size", page_size, minimum=1)
        if size % page_size:
            raise ValueError(f"size ({size}) must be a multiple of page_size ({page_size})")
        kv_page = getattr(kvcache, "page_size", page_size)
        if kv_page != page_size:
            raise ValueError(f"page_size ({page_size}) disagrees with the pool's page_size ({kv_page})")
        self.size, self.page_size, self.dtype = size, page_size, dtype
        self.device = torch.device(device)
        self._kvcache = kvcache
        self.num_pages = size // page_size
        self.clear()

    def clear(self) -> None:
        """Every page free again, in order."""
        self.free_pages = torch.arange(1, self.num_pages + 1, dtype=torch.int64, device=self.device)

    def get_kvcache(self):
        return self._kvcache

    def available_size(self) -> int:
        """Free token slots (whole free pages times ``page_size``)."""
        return len(self.free_pages) * self.page_size

    def shuffle_free_list(self, generator: torch.Generator | None = None) -> None:
        """Permute the free list (tests use it so that two allocators' slots differ)."""
        order = torch.randperm(len(self.free_pages), generator=generator).to(self.device)
        self.free_pages = self.free_pages[order]

    def _pages_to_slots(self, pages: torch.Tensor) -> torch.Tensor:
        offsets = torch.arange(self.page_size, dtype=torch.int64, device=self.device)
        return (pages[:, None] * self.page_size + offsets).reshape(-1)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` slots (a multiple of ``page_size``) on whole fresh pages, or None."""
        check_int("need_size", need_size, minimum=0)
        if need_size % self.page_size:
            raise ValueError(f"need_size ({need_size}) must be a multiple of page_size ({self.page_size})")
        num = need_size // self.page_size
        if num > len(self.free_pages):
            return None
        pages, self.free_pages = self.free_pages[:num], self.free_pages[num:]
        return self._pages_to_slots(pages)

    def alloc_extend(self, prefix_lens, seq_lens, last_loc, extend_num_tokens: int | None = None):
        """Slots for tokens ``[prefix_lens[b], seq_lens[b])`` of each request, concatenated.

        A request whose prefix ends inside a page continues that page after ``last_loc[b]`` (the slot
        of token ``prefix_lens[b] - 1``, or -1 when there is no prefix); further tokens take fresh pages.

        Returns:
            torch.Tensor | None: int64 `[sum(seq_lens - prefix_lens)]`, or None when pages are short.
        """
        prefix = check_tensor("prefix_lens", prefix_lens, dtype=(torch.int32, torch.int64), ndim=1).cpu().long()
        seq = check_tensor("seq_lens", seq_lens, dtype=(torch.int32, torch.int64), shape=prefix.shape).cpu().long()
        last = check_tensor("last_loc", last_loc, dtype=(torch.int32, torch.int64), shape=prefix.shape).cpu().long()
        if bool((seq < prefix).any()):
            raise ValueError("seq_lens must be >= prefix_lens for every request")
        total = int((seq - prefix).sum())
        if extend_num_tokens is not None and extend_num_tokens != total:
            raise ValueError(f"extend_num_tokens ({extend_num_tokens}) != sum(seq_lens - prefix_lens) ({total})")
        ps = self.page_size
        # Pages already held cover positions < ceil(prefix / ps) * ps.
        new_pages = (seq + ps - 1) // ps - (prefix + ps - 1) // ps
        if int(new_pages.sum()) > len(self.free_pages):
            return None
        fresh, self.free_pages = self.free_pages[: int(new_pages.sum())].cpu(), self.free_pages[int(new_pages.sum()) :]
        out, used = [], 0
        for p, s, lloc, n in zip(prefix.tolist(), seq.tolist(), last.tolist(), new_pages.tolist()):
            pos = torch.arange(p, s)
            # Position t lives on the request's page t // ps; pages from the fresh ones start at
            # ceil(p / ps), earlier positions continue the page of last_loc.
            first_fresh = (p + ps - 1) // ps
            page_of = torch.where(
                pos // ps < first_fresh,
                torch.full_like(pos, lloc // ps if lloc >= 0 else 0),
                fresh[used + (pos // ps - first_fresh).clamp(min=0)] if n else pos * 0,
            )
            out.append(page_of * ps + pos % ps)
            used += n
        slots = torch.cat(out) if out else torch.zeros(0, dtype=torch.int64)
        return slots.to(self.device)

    def alloc_decode(self, seq_lens, last_loc):
        """One slot per request for token ``seq_lens[b] - 1`` (``seq_lens`` already counts it)."""
        seq = check_tensor("seq_lens", seq_lens, dtype=(torch.int32, torch.int64), ndim=1)
        return self.alloc_extend(seq - 1, seq, last_loc, None)

    def free(self, free_index: torch.Tensor) -> None:
        """Return the pages of ``free_index`` (slots > 0; slot 0 is the dummy and is skipped)."""
        check_tensor("free_index", free_index, dtype=(torch.int32, torch.int64))
        slots = free_index.reshape(-1).long().to(self.device)
        pages = torch.unique(slots[slots > 0] // self.page_size)
        self.free_pages = torch.cat([self.free_pages, pages])


class TokenToKVPoolAllocator(PagedTokenToKVPoolAllocator):
    """The page-size-1 allocator: any ``need_size`` slots from the free list."""

    def __init__(self, size: int, dtype, device, kvcache):
        super().__init__(size, 1, dtype, device, kvcache)


class SWATokenToKVPoolAllocator:
    """A full and an SWA allocator in lockstep, recording ``full_to_swa_index_mapping[full] = swa``.

    The mapping is int64 `[size + page_size + 1]`: 0 means no SWA slot, the last element is -1 (so
    that -1 maps to -1). It is registered with ``kvcache`` (an ``SWAKVPool``) and shared by reference.

    Args:
        size (int): full-pool token slots; ``size_swa`` SWA-pool token slots.
        page_size (int): tokens per page, the same on both sides.
        kvcache: the ``SWAKVPool`` whose sub-pools these slots index.
    """

    def __init__(self, size: int, size_swa: int, page_size: int, dtype, device, kvcache):
        from .pools import BaseSWAKVPool

        if not isinstance(kvcache, BaseSWAKVPool):
            raise TypeError(f"kvcache must be a BaseSWAKVPool, got {type(kvcache).__name__}")
        self.size, self.size_swa, self.page_size = size, size_swa, page_size
        self.dtype, self.device = dtype, torch.device(device)
        self._kvcache = kvcache
        self.full_attn_allocator = PagedTokenToKVPoolAllocator(size, page_size, dtype, device, kvcache.full_kv_pool or kvcache)
        self.swa_attn_allocator = PagedTokenToKVPoolAllocator(size_swa, page_size, dtype, device, kvcache.swa_kv_pool)
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

    def _record(self, full: torch.Tensor | None, swa: torch.Tensor | None) -> torch.Tensor:
        self.full_to_swa_index_mapping[full] = swa
        return full

    def _both_or_none(self, allocate, needed_pages: int):
        # Check both sides first so that a failure moves nothing.
        have = min(len(self.full_attn_allocator.free_pages), len(self.swa_attn_allocator.free_pages))
        if needed_pages > have:
            return None
        full = allocate(self.full_attn_allocator, None)
        swa = allocate(self.swa_attn_allocator, full)
        return self._record(full, swa)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """Full slots for ``need_size`` tokens (SWA slots recorded in the mapping), or None."""
        check_int("need_size", need_size, minimum=0)
        if need_size % self.page_size:
            raise ValueError(f"need_size ({need_size}) must be a multiple of page_size ({self.page_size})")
        return self._both_or_none(lambda a, _: a.alloc(need_size), need_size // self.page_size)

    def alloc_extend(self, prefix_lens, seq_lens, last_loc, extend_num_tokens: int | None = None):
        """Paged extend on both sides; the SWA side continues the page of ``mapping[last_loc]``."""
        check_tensor("last_loc", last_loc, dtype=(torch.int32, torch.int64), ndim=1)
        check_tensor("prefix_lens", prefix_lens, dtype=(torch.int32, torch.int64), ndim=1)
        check_tensor("seq_lens", seq_lens, dtype=(torch.int32, torch.int64), ndim=1)
        ps = self.page_size
        needed = int(((seq_lens.long() + ps - 1) // ps - (prefix_lens.long() + ps - 1) // ps).sum())
        swa_last = self.full_to_swa_index_mapping[last_loc.long().to(self.device)]
        return self._both_or_none(
            lambda a, full: a.alloc_extend(prefix_lens, seq_lens, last_loc if full is None else swa_last, extend_num_tokens),
            needed,
        )

    def alloc_decode(self, seq_lens, last_loc):
        seq = check_tensor("seq_lens", seq_lens, dtype=(torch.int32, torch.int64), ndim=1)
        return self.alloc_extend(seq - 1, seq, last_loc, None)

    def free(self, free_index: torch.Tensor) -> None:
        """Free full slots and the SWA slots they map to; their mapping entries become 0."""
        check_tensor("free_index", free_index, dtype=(torch.int32, torch.int64))
        idx = free_index.reshape(-1).long().to(self.device)
        if idx.numel() == 0:
            return
        self.free_swa(idx)
        self.full_attn_allocator.free(idx)

    def free_swa(self, free_index: torch.Tensor) -> None:
        """Free only the SWA slots of full slots ``free_index`` (those mapped ``> 0``); mapping -> 0."""
        check_tensor("free_index", free_index, dtype=(torch.int32, torch.int64))
        idx = free_index.reshape(-1).long().to(self.device)
        swa = self.full_to_swa_index_mapping[idx]
        self.swa_attn_allocator.free(swa[swa > 0])
        self.full_to_swa_index_mapping[idx] = 0


def evict_swa_window(
    allocator: SWATokenToKVPoolAllocator,
    req_to_token: torch.Tensor,
    req_pool_index: int,
    seq_len: int,
    window_left: int,
    evicted_len: int,
) -> int:
    """Free the SWA slots of one request's tokens that no later query can see; return the new mark.

    After a step that committed ``seq_len`` tokens, every later query sits at position ``>= seq_len``
    and sees keys ``>= seq_len - W``. Tokens ``[evicted_len, floor_page(seq_len - W))`` are freed with
    ``free_swa`` (whole pages only, so a page shared with in-window tokens stays). ``window_left = -1``
    evicts nothing.

    Returns:
        int: the new ``evicted_len`` (tokens below it have no SWA slot).
    """
    check_int("seq_len", seq_len, minimum=0)
    check_int("evicted_len", evicted_len, minimum=0)
    check_int("window_left", window_left, minimum=-1)
    if window_left < 0:
        return evicted_len
    ps = allocator.page_size
    upto = max(0, seq_len - window_left) // ps * ps
    if upto <= evicted_len:
        return evicted_len
    allocator.free_swa(req_to_token[req_pool_index, evicted_len:upto].long())
    return upto
