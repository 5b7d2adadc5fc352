"""Which pool a backend reads and writes: the SWA-pool resolution policy of docs/contract.md §3.

Sliding layers translate their full slots to SWA slots by the resolved pool's
``full_to_swa_index_mapping``; K/V live in the resolved pool when there is one, else in the runner's
active pool, until an engine hands the backend another with :meth:`use_kv_pool`.
"""

from __future__ import annotations

import torch

from ..mem.pools import is_swa_kv_pool
from .checks import _as_int


def resolve_swa_kv_pool(model_runner):
    """docs/contract.md §3: the SWA pool sliding layers translate against, or None.

    The active pool wins when it is SWA-backed (also on draft workers); an EAGLE-like draft
    worker owns a full-only pool and gets None; otherwise (FROZEN_KV MTP, plain runners) the
    allocator's pool when it is SWA-backed. "SWA-backed" is :func:`triton_swa.mem.is_swa_kv_pool`:
    by what a pool is or exposes (SGLang's pools included), never by identity with our class; a
    pool that cannot be classified raises ValueError here, at construction.
    """
    active = model_runner.token_to_kv_pool
    if is_swa_kv_pool(active):
        return active
    if model_runner.is_draft_worker and not model_runner.spec_algorithm.is_frozen_kv_mtp():
        return None
    kvcache = model_runner.token_to_kv_pool_allocator.get_kvcache()
    return kvcache if is_swa_kv_pool(kvcache) else None


def _page_size(pool) -> int:
    return _as_int("kv_pool.page_size", getattr(pool, "page_size", 1) or 1, 1)


class _KVPools:
    """The pool part of :class:`~triton_swa.backend.TritonSWAAttnBackend`: resolution, the K/V pool,
    the slot mapping of sliding layers."""

    # the policy, as the backend calls it (a subclass or a test may swap in another rule)
    _resolve_swa_kv_pool = staticmethod(resolve_swa_kv_pool)

    def _init_kv_pools(self, model_runner) -> None:
        """Resolve the SWA pool by the policy and pick the K/V pool; reads ``self.sliding_window_size``
        and sets ``_swa_kv_pool``, ``use_sliding_window_kv_pool``, ``kv_pool`` and ``page_size``."""
        self._swa_kv_pool = self._resolve_swa_kv_pool(model_runner)
        self.use_sliding_window_kv_pool = self._swa_kv_pool is not None
        # K/V buffers come from the resolved SWA pool when there is one (FROZEN_KV MTP reads the
        # target's pool), else from the runner's active pool.
        self.kv_pool = self._swa_kv_pool if self._swa_kv_pool is not None else model_runner.token_to_kv_pool
        self._kv_pool_is_swa = is_swa_kv_pool(self.kv_pool)
        if not hasattr(self.kv_pool, "get_kv_buffer"):
            raise TypeError(f"the KV pool ({type(self.kv_pool).__name__}) has no get_kv_buffer(layer_id)")
        if self.use_sliding_window_kv_pool and self.sliding_window_size < 0:
            swa_ids = sorted(i for i, (_, is_swa) in self._swa_kv_pool.layers_mapping.items() if is_swa)
            raise ValueError(
                f"model_runner.sliding_window_size is {self.sliding_window_size} (no sliding layers) but "
                f"the resolved SWA pool holds sliding layers {swa_ids}: give the sliding layers' "
                "window_left"
            )
        self.page_size = _page_size(self.kv_pool)

    def use_kv_pool(self, pool) -> None:
        """Read and write K/V in ``pool`` from now on; sliding layers still translate by the resolved pool.

        An engine that swaps the pool under a backend calls this (SGLang points a FROZEN_KV MTP
        draft backend's ``token_to_kv_pool`` at the target's pool around the draft's forwards).

        Raises:
            TypeError: ``pool`` has no ``get_kv_buffer(layer_id)``.
            ValueError: its page size differs from the one the step's indices are built for, or it
                cannot be classified (see :func:`triton_swa.mem.is_swa_kv_pool`).
        """
        if pool is self.kv_pool:
            return
        if not hasattr(pool, "get_kv_buffer"):
            raise TypeError(f"the KV pool ({type(pool).__name__}) has no get_kv_buffer(layer_id)")
        page_size = _page_size(pool)
        if page_size != self.page_size:
            raise ValueError(f"the KV pool's page_size is {page_size} but the backend's indices are built for page_size {self.page_size}")
        self._kv_pool_is_swa = is_swa_kv_pool(pool)
        self.kv_pool = pool

    @property
    def mapping(self) -> torch.Tensor | None:
        return self._swa_kv_pool.full_to_swa_index_mapping if self._swa_kv_pool is not None else None

    def _mapping_for(self, translate: bool) -> torch.Tensor | None:
        mapping = self.mapping if translate else None
        if translate and mapping is None:
            raise ValueError(
                "the resolved SWA pool has no full_to_swa_index_mapping: register the SWA "
                "allocator's mapping (register_mapping) before the first step"
            )
        return mapping
