"""Memory model: request rows, KV pools, the SWA pool and the allocators (docs/contract.md §2)."""

from .allocators import PagedTokenToKVPoolAllocator, SWATokenToKVPoolAllocator, TokenToKVPoolAllocator, alloc_positions, evict_swa_window
from .invariants import check_allocator_invariants
from .pools import SWA_POOL_PROTOCOL, BaseSWAKVPool, MHATokenToKVPool, ReqToTokenPool, SWAKVPool, is_swa_kv_pool

__all__ = [
    "BaseSWAKVPool",
    "SWA_POOL_PROTOCOL",
    "MHATokenToKVPool",
    "PagedTokenToKVPoolAllocator",
    "ReqToTokenPool",
    "SWAKVPool",
    "SWATokenToKVPoolAllocator",
    "TokenToKVPoolAllocator",
    "alloc_positions",
    "check_allocator_invariants",
    "evict_swa_window",
    "is_swa_kv_pool",
]
