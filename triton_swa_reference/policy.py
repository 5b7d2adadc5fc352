"""The pool-resolution policy of docs/contract.md §3, written out as that section states it.

A backend decides once, at construction, which SWA pool its sliding layers translate against. The
runner's attributes are read by SGLang's names, so an SGLang ``ModelRunner``, the project's own
runner dataclass or a ``unittest.mock.MagicMock`` all work.
"""

from __future__ import annotations

from collections.abc import Mapping

# What a pool with an SWA sub-pool exposes (docs/contract.md §2), whoever wrote its class.
_SWA_PROTOCOL = ("swa_kv_pool", "full_kv_pool", "layers_mapping", "full_to_swa_index_mapping", "translate_loc_from_full_to_swa")


def has_swa_sub_pool(pool) -> bool:
    """Whether ``pool`` exposes the SWA pool protocol: both sub-pools, a ``layers_mapping`` mapping,
    the full-to-SWA mapping and ``translate_loc_from_full_to_swa``."""
    return pool is not None and all(hasattr(pool, name) for name in _SWA_PROTOCOL) and isinstance(pool.layers_mapping, Mapping)


def resolve_swa_kv_pool(runner):
    """The SWA pool that a backend built for ``runner`` must use, or None for no translation.

    1. The runner's active pool, when it has an SWA sub-pool (also on draft workers: a DFlash draft
       owns an SWA pool that shares the target's mapping).
    2. None on a draft worker other than FROZEN_KV MTP (an EAGLE-like draft owns a full-only pool).
    3. Otherwise the allocator's pool when it has an SWA sub-pool (FROZEN_KV MTP reads the target's
       pool; plain runners), else None.
    """
    active = runner.token_to_kv_pool
    if has_swa_sub_pool(active):
        return active
    if runner.is_draft_worker and not runner.spec_algorithm.is_frozen_kv_mtp():
        return None
    kvcache = runner.token_to_kv_pool_allocator.get_kvcache()
    return kvcache if has_swa_sub_pool(kvcache) else None
