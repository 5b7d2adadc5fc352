"""The policy of docs/contract.md §3 as the reference states it, on MagicMock runners and on real pools."""

from unittest.mock import MagicMock

import pytest
import torch

import triton_swa_reference as ref
from triton_swa import MHATokenToKVPool, SWAKVPool, SWATokenToKVPoolAllocator, TokenToKVPoolAllocator
from triton_swa.testing import legacy_resolve_by_allocator_type

pytestmark = pytest.mark.reference


def swa_pool():
    return SWAKVPool(8, 8, 1, torch.float16, [0], [1], head_num=1, head_dim=8)


def plain_pool():
    return MHATokenToKVPool(8, 1, torch.float16, 1, 8, 2)


def runner(active, draft, frozen_kv_mtp, kvcache):
    r = MagicMock()
    r.token_to_kv_pool = active
    r.is_draft_worker = draft
    r.spec_algorithm.is_frozen_kv_mtp.return_value = frozen_kv_mtp
    r.token_to_kv_pool_allocator.get_kvcache.return_value = kvcache
    return r


# (active is SWA, draft worker, FROZEN_KV_MTP, allocator's kvcache is SWA) -> "active" | "allocator" | None
CASES = [
    pytest.param(True, False, False, None, "active", id="swa-active-target"),
    pytest.param(False, False, False, True, "allocator", id="plain-active-swa-allocator"),
    pytest.param(False, False, False, False, None, id="all-plain"),
    pytest.param(False, True, False, True, None, id="eagle-draft"),
    pytest.param(False, True, True, True, "allocator", id="frozen-kv-mtp-draft"),
    pytest.param(False, False, False, True, "allocator", id="eagle-target"),
    pytest.param(True, True, False, False, "active", id="dflash-draft-swa-active"),
    pytest.param(False, True, True, False, None, id="frozen-kv-mtp-plain"),
]


@pytest.mark.parametrize("active_swa, draft, frozen, alloc_swa, want", CASES)
def test_policy_cases(active_swa, draft, frozen, alloc_swa, want):
    active = swa_pool() if active_swa else plain_pool()
    kvcache = None if alloc_swa is None else (swa_pool() if alloc_swa else plain_pool())
    r = runner(active, draft, frozen, kvcache)
    got = ref.resolve_swa_kv_pool(r)
    expected = {"active": active, "allocator": kvcache, None: None}[want]
    assert got is expected
    if active_swa:
        r.token_to_kv_pool_allocator.get_kvcache.assert_not_called()


def test_legacy_rule_misses_an_swa_active_pool_on_a_draft_worker():
    """Gemma 4 + DFlash: the draft's active pool is SWA-backed, its allocator is not the SWA type."""
    target_pool = swa_pool()
    SWATokenToKVPoolAllocator(8, 8, 1, torch.float16, "cpu", target_pool)
    draft_pool = swa_pool()
    draft_pool.register_mapping(target_pool.full_to_swa_index_mapping)
    draft = runner(draft_pool, True, False, None)
    draft.token_to_kv_pool_allocator = TokenToKVPoolAllocator(8, torch.float16, "cpu", plain_pool())
    assert ref.resolve_swa_kv_pool(draft) is draft_pool
    assert legacy_resolve_by_allocator_type(draft, SWATokenToKVPoolAllocator) is None
