"""Memory model: request rows, KV pools, the SWA pool and the allocators (SPEC §2)."""

from .allocators import (
    PagedTokenToKVPoolAllocator,
    SWATokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
    evict_swa_window,
)
from .invariants import check_allocator_invariants
from .pools import BaseSWAKVPool, MHATokenToKVPool, ReqToTokenPool, SWAKVPool

__all__ = [
    "BaseSWAKVPool",
    "MHATokenToKVPool",
    "PagedTokenToKVPoolAllocator",
    "ReqToTokenPool",
    "SWAKVPool",
    "SWATokenToKVPoolAllocator",
    "TokenToKVPoolAllocator",
    "check_allocator_invariants",
    "evict_swa_window",
]
