"""Memory model: request rows, KV pools, the SWA pool and the allocators (SPEC §2)."""

from .allocators import (
    PagedTokenToKVPoolAllocator,
    SWATokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
    evict_swa_window,
)
from .pools import BaseSWAKVPool, MHATokenToKVPool, ReqToTokenPool, SWAKVPool

__all__ = [
    "BaseSWAKVPool",
    "MHATokenToKVPool",
    "PagedTokenToKVPoolAllocator",
    "ReqToTokenPool",
    "SWAKVPool",
    "SWATokenToKVPoolAllocator",
    "TokenToKVPoolAllocator",
    "evict_swa_window",
]
