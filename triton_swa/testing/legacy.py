"""The pool-resolution rule that the policy of docs/contract.md §3 replaced, kept to demonstrate the bug it caused.

**For regression tests and demonstrations only.** The rule picks the allocator's pool when the
allocator is of the SWA allocator's type and ignores the runner's active pool. On a draft worker
whose active pool is SWA-backed but whose allocator has another type (Gemma 4 + DFlash) it resolves
nothing, and the sliding layers read ``swa_buffer[full_slot]``: other tokens' K/V.
"""

from __future__ import annotations

from ..mem.pools import is_swa_kv_pool

__all__ = ["legacy_backend", "legacy_resolve_by_allocator_type"]


def legacy_resolve_by_allocator_type(runner, swa_allocator_type: type):
    """The SWA pool the pre-fix rule resolves for ``runner``: the allocator's pool when the allocator
    is a ``swa_allocator_type`` and that pool has an SWA sub-pool, else None."""
    allocator = runner.token_to_kv_pool_allocator
    if isinstance(allocator, swa_allocator_type):
        kvcache = allocator.get_kvcache()
        return kvcache if is_swa_kv_pool(kvcache) else None
    return None


def legacy_backend(model_runner, swa_allocator_type: type):
    """A :class:`~triton_swa.backend.TritonSWAAttnBackend` that resolves its SWA pool by the pre-fix
    rule (:func:`legacy_resolve_by_allocator_type`) instead of the policy."""
    from ..backend import TritonSWAAttnBackend

    class LegacyBackend(TritonSWAAttnBackend):
        @staticmethod
        def _resolve_swa_kv_pool(runner):
            return legacy_resolve_by_allocator_type(runner, swa_allocator_type)

    return LegacyBackend(model_runner)
