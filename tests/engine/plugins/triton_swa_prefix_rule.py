"""Test-only SGLang plugin: the pre-fix SWA-pool rule on draft workers, and the slot-space drift.

The engine tier's speculative runs happen in SGLang's spawned scheduler processes, where a
monkeypatch in the test process does not reach; SGLang loads this plugin in every engine process
when ``tests/engine/plugins`` is on ``PYTHONPATH`` and ``SGLANG_PLUGINS`` names
``triton_swa_prefix_rule`` (only the runs that ask for it do).

``TRITON_SWA_PREFIX_RULE`` picks the rule draft workers resolve their SWA pool by (target workers
always keep the policy, so the target's tokens stay right and only the draft's proposals, the
acceptance, show the rule):

- ``policy`` (default): the policy of docs/contract.md §3 (``TritonSWAAttnBackend._resolve_swa_kv_pool``), unchanged;
  the plugin only records the drift (below);
- ``legacy``: :func:`triton_swa.testing.legacy.legacy_resolve_by_allocator_type`, the pre-fix rule,
  with an SWA allocator type given by ``TRITON_SWA_PREFIX_RULE_ALLOCATOR``:

  - ``other`` (default): a type the draft's allocator is not, the condition of the seed's failure
    (Gemma 4 + DFlash: the draft's allocator is not the SWA allocator). The rule resolves no SWA
    pool, and the draft's sliding layers read ``swa_buffer[full_slot]``;
  - ``sglang``: SGLang's ``SWATokenToKVPoolAllocator``, which a STANDALONE draft's (shared,
    target's) allocator is. The rule then resolves the target's ``SWAKVPool``, whose full->SWA
    mapping is the very tensor the draft's own pool registered.

``TRITON_SWA_PREFIX_RULE_WRITES`` says where a draft's SWA write ids come from when the rule
resolved no SWA pool:

- ``adapter`` (default): as the SGLang adapter has them, from the resolved pool: none. SGLang
  0.5.23's ``SWAKVPool.set_kv_buffer`` takes no untranslated write, and the adapter refuses the
  first one with a ValueError: the pre-fix rule fails loudly there;
- ``pool``: from the layer's own pool's mapping, the write rule of the core backend (and of the
  SGLang pools the seed ran on, which translated writes themselves): writes stay right and sliding
  reads are untranslated, which is the seed's silent failure. Under CUDA graphs too: the adapter's
  graph buffer of write ids is filled from the same translation.

With ``TRITON_SWA_PREFIX_RULE_LOG`` set, every draft step appends ``D <drifted> <written>`` to that
file: how many of its K/V writes went to an SWA slot other than their full slot (where an
untranslated read of them finds other tokens' K/V), and the resolutions as ``R ...`` lines. Verify
steps append ``V`` and each request's accepted drafts: on a CPU the sgl_kernel stand-in writes them
(``TRITON_SWA_STUB_VERIFY_LOG``), elsewhere this plugin (SGLang's own greedy verify).
"""

from __future__ import annotations

import os


def _record(line: str) -> None:
    path = os.environ.get("TRITON_SWA_PREFIX_RULE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def _record_verify_steps() -> None:
    """``V`` lines where the CPU tier's sgl_kernel stand-in does not write them (a GPU, whose greedy
    verify is SGLang's own ``verify_tree_greedy_func``): wrap that function where SGLang's EAGLE
    verify calls it (``eagle_utils``), once per process, at the first draft write (the module is
    loaded by then; verify runs in the draft worker's process)."""
    import sys

    if not os.environ.get("TRITON_SWA_PREFIX_RULE_LOG") or os.environ.get("TRITON_SWA_STUB_VERIFY_LOG"):
        return
    utils = sys.modules.get("sglang.srt.speculative.eagle_utils")
    verify = getattr(utils, "verify_tree_greedy_func", None)
    if verify is None or getattr(verify, "_triton_swa_recording", False):
        return

    def verify_tree_greedy_func(*args, **kwargs):
        out = verify(*args, **kwargs)
        _record("V " + " ".join(str(int(x)) for x in out[2].tolist()))
        return out

    verify_tree_greedy_func._triton_swa_recording = True
    utils.verify_tree_greedy_func = verify_tree_greedy_func


class _NotTheDraftsAllocator:
    """An SWA allocator type no SGLang allocator is an instance of."""


def register() -> None:
    from triton_swa.backend import TritonSWAAttnBackend
    from triton_swa.integrations import sglang as adapter
    from triton_swa.mem.pools import is_swa_kv_pool
    from triton_swa.testing.legacy import legacy_resolve_by_allocator_type

    rule = os.environ.get("TRITON_SWA_PREFIX_RULE", "policy")
    which = os.environ.get("TRITON_SWA_PREFIX_RULE_ALLOCATOR", "other")
    writes = os.environ.get("TRITON_SWA_PREFIX_RULE_WRITES", "adapter")
    if rule not in ("policy", "legacy") or which not in ("other", "sglang") or writes not in ("adapter", "pool"):
        raise ValueError(f"triton_swa_prefix_rule: bad settings rule={rule!r} allocator={which!r} writes={writes!r}")

    if rule == "legacy":
        if which == "sglang":
            from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator as allocator_type
        else:
            allocator_type = _NotTheDraftsAllocator
        policy = TritonSWAAttnBackend._resolve_swa_kv_pool

        def resolve(model_runner):
            if not model_runner.is_draft_worker:
                return policy(model_runner)
            pool = legacy_resolve_by_allocator_type(model_runner, allocator_type)
            wanted = policy(model_runner)
            shared = pool is not None and pool.full_to_swa_index_mapping is getattr(wanted, "full_to_swa_index_mapping", None)
            _record(
                f"R draft resolves {type(pool).__name__ if pool is not None else None} "
                f"(the policy: {type(wanted).__name__}; the same object: {pool is wanted}; "
                f"the same full->SWA mapping tensor: {shared}) "
                f"allocator {type(model_runner.token_to_kv_pool_allocator).__name__}"
            )
            return pool

        TritonSWAAttnBackend._resolve_swa_kv_pool = staticmethod(resolve)

    def recording(adapter_ids):
        def _swa_write_ids(self, forward_batch):
            _record_verify_steps()
            ids = adapter_ids(self, forward_batch)
            loc = getattr(forward_batch, "out_cache_loc", None)
            pool = self.token_to_kv_pool
            if not getattr(self.core.model_runner, "is_draft_worker", False) or loc is None or not is_swa_kv_pool(pool):
                return ids
            if ids is None and writes == "pool":
                ids = pool.translate_loc_from_full_to_swa(loc)  # the pool's own translation
            if ids is not None:
                drifted = int((ids.reshape(-1) != loc.reshape(-1).to(ids.dtype)).sum())
                _record(f"D {drifted} {loc.numel()}")
            return ids

        return _swa_write_ids

    # the one-step backend and the draft steps' backend each define their own
    for cls in (adapter.TritonSWASGLangBackend, adapter._DraftStepBackend):
        cls._swa_write_ids = recording(cls.__dict__["_swa_write_ids"])

    if writes == "pool":
        # CUDA graphs: the adapter fills its graph buffer of SWA write ids only where the resolved pool
        # is an SWA pool; under the pre-fix rule a draft resolved none, so the pool's own ids go there
        # too (zeros while capturing, as the adapter's own; the translation before each replay)
        out_graph = adapter.TritonSWASGLangBackend.init_forward_metadata_out_graph

        def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
            out_graph(self, forward_batch, in_capture)
            loc = getattr(forward_batch, "out_cache_loc", None)
            draft = getattr(self.core.model_runner, "is_draft_worker", False)
            if self.core.swa_loc is not None or loc is None or not draft or not is_swa_kv_pool(self.token_to_kv_pool):
                return
            buf = self._graph_swa_loc[: loc.shape[0]]
            if in_capture:
                buf.zero_()
            else:
                buf.copy_(self._swa_write_ids(forward_batch))
            self.core.swa_loc = buf

        adapter.TritonSWASGLangBackend.init_forward_metadata_out_graph = init_forward_metadata_out_graph
