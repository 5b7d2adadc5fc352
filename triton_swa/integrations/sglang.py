"""SGLang integration: ``--attention-backend triton_swa`` on SGLang 0.5.23's own pools, batches and layers.

Importing this module imports SGLang (the core library never does). :func:`register` puts the
backend in SGLang's ``ATTENTION_BACKENDS`` under ``"triton_swa"`` and in the ``--attention-backend`` /
draft-backend choices; SGLang calls it through the ``sglang.srt.plugins`` entry point (see
pyproject.toml; ``SGLANG_PLUGINS=triton_swa`` selects it).

:class:`TritonSWASGLangBackend` subclasses SGLang's ``AttentionBackend`` and hands every step to
:class:`triton_swa.backend.TritonSWAAttnBackend`, which resolves the SWA pool by SPEC §3's policy on
SGLang's real pools and reads SGLang's runner and batch fields by their own names. As SGLang's
FlashInfer backend does, K/V are read from and written to ``self.token_to_kv_pool`` (the runner's
active pool, which SGLang swaps for the target's around FROZEN_KV MTP draft forwards); the resolved
pool only translates full slots to SWA slots. What SGLang passes differently is adapted here:

- Writes go through the pool's own ``set_kv_buffer(layer, KVWriteLoc(loc, swa_loc=...), k, v,
  k_scale, v_scale)``, with ``swa_loc`` the step's SWA write ids from the runner's
  ``kv_index_translator`` (its plan), or the resolved pool's translation of ``out_cache_loc`` when
  the batch has no plan. They happen after every check of the call, so a bad call writes nothing.
- ``sinks=`` (gpt-oss) arrives as a keyword, not a layer attribute; extra keywords are accepted.
- KV-shared layers (Gemma 4) are called with ``k = v = None, save_kv_cache=False`` and the shared
  layer's ``layer_id``: they read the new tokens' K/V from the pool.
- ``layer.attn_type`` ENCODER_ONLY or DECODER_BIDIRECTIONAL (DFlash's draft block): the step's new
  tokens see each other (``causal=False``); the cached prefix is still windowed by position.
- fp8 scales: ``layer.k_scale_float`` / ``v_scale_float`` (Python floats) when set.
- Speculative tree masks span each request's prefix plus its drafts (``[drafts, prefix + drafts]``
  row-major per request); the kernels take the drafts' ``[drafts, drafts]`` block, cut out here.
- Draft positions of a tree come from ``forward_batch.positions``.

Forward modes: IDLE, DECODE, EXTEND, MIXED, DRAFT_EXTEND_V2 and TARGET_VERIFY (chain or tree) run;
SPLIT_PREFILL, DLLM_EXTEND and PREBUILT raise a ValueError naming the mode, as do cross-attention
layers, unified KV memory (virtual ids in ``req_to_token``) and HND or page-major pool layouts.

CUDA graphs (SGLang's 0.5.23 contract): ``init_forward_metadata`` builds a step eagerly;
``init_forward_metadata_out_graph(fb, in_capture)`` is the graph path, called by SGLang's graph
runners before capture (``in_capture=True``) and before each replay: it fills the fixed buffers of
``init_cuda_graph_state`` (window indices, lengths, draft positions and masks, the SWA write ids)
for DECODE and TARGET_VERIFY. ``init_forward_metadata_in_graph`` has nothing to record.
"""

from __future__ import annotations

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.mem_cache.kv_loc_plan import IdSpaceKind
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from ..backend import TritonSWAAttnBackend

__all__ = ["NAME", "TritonSWASGLangBackend", "register"]

NAME = "triton_swa"
_UNSUPPORTED_MODES = ("SPLIT_PREFILL", "DLLM_EXTEND", "PREBUILT")
_NON_CAUSAL = ("ENCODER_ONLY", "DECODER_BIDIRECTIONAL")


class _Layer:
    """A ``RadixAttention`` as the core backend reads a layer, plus this call's ``sinks`` and sharing."""

    def __init__(self, layer, sinks, kv_shared: bool):
        if getattr(layer, "is_cross_attention", False):
            raise ValueError(f"layer {layer.layer_id}: cross-attention is not supported by the triton_swa SGLang backend")
        attn_type = getattr(getattr(layer, "attn_type", None), "name", "DECODER")
        self.radix = layer
        self.layer_id = layer.layer_id
        self.tp_q_head_num, self.tp_k_head_num = layer.tp_q_head_num, layer.tp_k_head_num
        self.head_dim, self.v_head_dim = layer.head_dim, layer.v_head_dim
        self.scaling, self.logit_cap = layer.scaling, layer.logit_cap
        self.sliding_window_size = layer.sliding_window_size
        self.causal = attn_type not in _NON_CAUSAL
        self.sinks = sinks
        self.k_scale = getattr(layer, "k_scale_float", None)
        self.v_scale = getattr(layer, "v_scale_float", None)
        # SGLang's KV-shared call: the layer id is the shared layer's, and no K/V come with it.
        self.kv_shared_layer_id = layer.layer_id if kv_shared else None


class _VerifySpec:
    """SGLang's verify input as the core reads it: the drafts' own mask block and tree positions."""

    def __init__(self, spec_info, forward_batch):
        n = int(spec_info.draft_token_num)
        self.draft_token_num = n
        self.causal = True
        self.custom_mask = None
        self.positions = None
        mask = getattr(spec_info, "custom_mask", None)
        if mask is None:
            return
        lens = forward_batch.seq_lens_cpu if forward_batch.seq_lens_cpu is not None else forward_batch.seq_lens.cpu()
        blocks, at = [], 0
        # A padded graph batch has more requests than the verify input covers: take prefixes in
        # order until SGLang's mask is consumed.
        for p in (int(x) for x in lens.tolist()):
            if at == mask.numel():
                break
            size = n * (p + n)
            if at + size > mask.numel():
                break
            blocks.append(mask[at : at + size].view(n, p + n)[:, p:].reshape(-1))
            at += size
        if at != mask.numel():
            raise ValueError(
                f"spec_info.custom_mask has {mask.numel()} entries; SGLang's layout ([drafts, prefix + "
                f"drafts] per request over seq_lens {lens.tolist()}) does not add up to it"
            )
        self.custom_mask = torch.cat(blocks)
        positions = getattr(forward_batch, "positions", None)
        self.positions = None if positions is None else positions[: len(blocks) * n].to(torch.int64)


class _Batch:
    """An SGLang ``ForwardBatch`` with its verify input adapted; every other field is SGLang's own."""

    def __init__(self, forward_batch):
        self._fb = forward_batch
        spec = forward_batch.spec_info
        verify = forward_batch.forward_mode.is_target_verify()
        if verify and forward_batch.seq_lens_cpu is None:
            raise ValueError("TARGET_VERIFY needs forward_batch.seq_lens_cpu (the committed lengths on the host)")
        self.spec_info = _VerifySpec(spec, forward_batch) if verify else spec

    def __getattr__(self, name):
        return getattr(self._fb, name)


class _Core(TritonSWAAttnBackend):
    """The core backend, writing K/V through SGLang's pool (``set_kv_buffer`` with a ``KVWriteLoc``)."""

    swa_loc: torch.Tensor | None = None  # the step's SWA write ids, set by the adapter per step

    def _save(self, layer, k, v, k_buf, v_buf, write_mapping, forward_batch):
        swa_loc = None
        if write_mapping is not None:  # the layer lives in an SWA sub-pool
            swa_loc = self.swa_loc
            if swa_loc is None:
                raise ValueError(
                    f"layer {layer.layer_id} writes an SWA sub-pool but the step has no SWA write ids "
                    "(init_forward_metadata must run with forward_batch.out_cache_loc)"
                )
        radix = layer.radix
        if k_buf.dtype != k.dtype:
            # SGLang's pool divides quantized writes by the scale in place: keep the caller's k, v
            k, v = k.clone(), v.clone()
        self.kv_pool.set_kv_buffer(
            radix,
            KVWriteLoc.for_layer(forward_batch, radix, swa_loc=swa_loc),
            k,
            v,
            getattr(radix, "k_scale", None),
            getattr(radix, "v_scale", None),
        )


def _check_layout(pool) -> None:
    for sub in (pool, getattr(pool, "full_kv_pool", None), getattr(pool, "swa_kv_pool", None)):
        layout = getattr(sub, "kv_cache_layout", "nhd")
        if sub is not None and (getattr(sub, "use_hnd", False) or str(layout).lower() not in ("nhd", "none")):
            raise ValueError(
                f"the KV pool ({type(sub).__name__}) uses the {layout!r} layout; the triton_swa SGLang "
                "backend reads token-major (NHD) buffers: unset SGLANG_USE_HND_KVCACHE"
            )


class TritonSWASGLangBackend(AttentionBackend):
    """triton-swa as an SGLang attention backend (see the module docstring for what is adapted).

    Args:
        model_runner: SGLang's ``ModelRunner`` (or anything with its attribute names).

    Raises:
        ValueError: the runner serves unified KV memory (its ``kv_index_translator`` translates
            virtual ids), or its pool is not token-major; and whatever the core backend raises.
    """

    def __init__(self, model_runner):
        super().__init__()
        translator = getattr(model_runner, "kv_index_translator", None)
        if translator is not None and bool(getattr(translator, "is_translating", False)):
            raise ValueError(
                "the runner serves unified KV memory (req_to_token holds virtual ids); the triton_swa "
                "SGLang backend reads physical slots only"
            )
        # Kept private: SGLang's base reads a backend's public kv_index_translator as "can serve the
        # unified pool", which this backend cannot.
        self._translator = translator
        self.core = _Core(model_runner)
        # SGLang reads these off the backend (ForwardBatch carries no pools).
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.req_to_token_pool = model_runner.req_to_token_pool
        _check_layout(self.token_to_kv_pool)
        self.core.use_kv_pool(self.token_to_kv_pool)
        self.max_context_len = self.core.req_to_token.shape[1]
        self.forward_metadata = None
        self._graph_swa_loc: torch.Tensor | None = None
        self._verify_batch = None  # the last TARGET_VERIFY batch, for update_verify_buffers_to_fill_after_draft

    @staticmethod
    def _resolve_swa_kv_pool(model_runner):
        return TritonSWAAttnBackend._resolve_swa_kv_pool(model_runner)

    @property
    def _swa_kv_pool(self):
        return self.core._swa_kv_pool

    def _check_mode(self, forward_batch) -> None:
        name = getattr(forward_batch.forward_mode, "name", str(forward_batch.forward_mode))
        if name in _UNSUPPORTED_MODES:
            raise ValueError(f"forward mode {name} is not supported by the triton_swa SGLang backend")

    def _sync_pool(self) -> None:
        # SGLang may have swapped self.token_to_kv_pool (FROZEN_KV MTP's target view).
        if self.token_to_kv_pool is not self.core.kv_pool:
            _check_layout(self.token_to_kv_pool)
            self.core.use_kv_pool(self.token_to_kv_pool)

    def _swa_write_ids(self, forward_batch):
        """The step's SWA write ids: the translator's (from the batch's plan), else the resolved pool's
        translation of ``out_cache_loc`` (physical slots on a non-unified pool); None without an SWA pool."""
        loc = getattr(forward_batch, "out_cache_loc", None)
        if not self.core.use_sliding_window_kv_pool or loc is None:
            return None
        ids = None
        if self._translator is not None:
            ids = self._translator.write_ids(forward_batch, IdSpaceKind.SLIDING_WINDOW)
        if ids is None:
            ids = self._swa_kv_pool.translate_loc_from_full_to_swa(loc)
        return ids

    def init_forward_metadata(self, forward_batch) -> None:
        """Eager metadata of one step (every supported mode)."""
        self._check_mode(forward_batch)
        self._sync_pool()
        self.core.init_forward_metadata(_Batch(forward_batch))
        self.core.swa_loc = self._swa_write_ids(forward_batch)
        self.forward_metadata = self.core.forward_metadata
        self._verify_batch = forward_batch if forward_batch.forward_mode.is_target_verify() else None

    def update_verify_buffers_to_fill_after_draft(self, spec_info, cuda_graph_bs) -> None:
        """Redo the verify metadata that depends on the draft's tree mask and positions.

        SGLang (EAGLE with an overlapped plan) builds the verify metadata before the draft has
        filled ``spec_info``'s mask and positions, then calls this. ``cuda_graph_bs``: the graph's
        batch size when the step replays a graph, else None.
        """
        fb = self._verify_batch
        if fb is None:
            raise ValueError("update_verify_buffers_to_fill_after_draft: no TARGET_VERIFY metadata was built")
        if spec_info is not fb.spec_info:
            raise ValueError("update_verify_buffers_to_fill_after_draft: spec_info is not the verify batch's")
        if cuda_graph_bs is None:
            self.init_forward_metadata(fb)
        else:
            self.init_forward_metadata_out_graph(fb)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False) -> None:
        """The CUDA-graph path: fill the fixed buffers before capture (``in_capture``) or a replay.

        Raises:
            ValueError: ``init_cuda_graph_state`` has not run, the mode is not DECODE or
                TARGET_VERIFY, or (replay) nothing was captured for this batch size and mode.
        """
        self._check_mode(forward_batch)
        self._sync_pool()
        if self._graph_swa_loc is None:
            raise ValueError("init_cuda_graph_state must run before the CUDA-graph metadata path")
        fb = forward_batch
        bs = int(fb.batch_size)
        mode = fb.forward_mode
        spec = _VerifySpec(fb.spec_info, fb) if mode.is_target_verify() else None
        if in_capture:
            num_tokens = fb.positions.numel() if getattr(fb, "positions", None) is not None else bs
            self.core.init_forward_metadata_capture_cuda_graph(bs, num_tokens, fb.req_pool_indices, fb.seq_lens, None, mode, spec)
        else:
            self.core.init_forward_metadata_replay_cuda_graph(
                bs, fb.req_pool_indices, fb.seq_lens, getattr(fb, "seq_lens_sum", None), None, mode, spec, getattr(fb, "seq_lens_cpu", None)
            )
        self.core.swa_loc = None
        loc = getattr(fb, "out_cache_loc", None)
        if self.core.use_sliding_window_kv_pool and loc is not None:
            n = loc.shape[0]
            if n > self._graph_swa_loc.numel():
                raise ValueError(
                    f"out_cache_loc has {n} entries, more than the max_num_tokens={self._graph_swa_loc.numel()} of init_cuda_graph_state"
                )
            buf = self._graph_swa_loc
            buf[n:].zero_()  # padded writes go to the dummy slot 0
            if in_capture:
                buf[:n].zero_()
            else:
                buf[:n].copy_(self._swa_write_ids(fb))
            self.core.swa_loc = buf[:n]
        self.forward_metadata = self.core.forward_metadata
        self._verify_batch = fb if mode.is_target_verify() else None

    def init_forward_metadata_in_graph(self, forward_batch) -> None:
        """Nothing to record: every buffer the kernels read is filled in ``_out_graph``."""

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.core.init_cuda_graph_state(max_bs, max_num_tokens)
        self._graph_swa_loc = torch.zeros(max_num_tokens, dtype=torch.int64, device=self.core.device)

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return self.core.get_cuda_graph_seq_len_fill_value()

    def get_cpu_graph_seq_len_fill_value(self) -> int:
        return self.core.get_cuda_graph_seq_len_fill_value()

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None, **kwargs):
        self._sync_pool()
        view = _Layer(layer, sinks, kv_shared=k is None)
        return self.core.forward_decode(q, k, v, view, forward_batch, save_kv_cache and k is not None)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None, **kwargs):
        self._sync_pool()
        view = _Layer(layer, sinks, kv_shared=k is None)
        return self.core.forward_extend(q, k, v, view, forward_batch, save_kv_cache and k is not None)


def _factory(model_runner):
    return TritonSWASGLangBackend(model_runner)


def register() -> None:
    """Register ``triton_swa`` with SGLang: the backend registry and both choice lists (idempotent).

    SGLang's plugin loader calls this through the ``sglang.srt.plugins`` entry point.
    """
    from sglang.srt.arg_groups import choices
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend

    if NAME not in ATTENTION_BACKENDS:
        register_attention_backend(NAME)(_factory)
    for name in ("ATTENTION_BACKEND_CHOICES", "DRAFT_ATTENTION_BACKEND_CHOICES"):
        listed = getattr(choices, name, None)
        if listed is not None and NAME in listed:
            continue
        add = choices.add_attention_backend_choices if name.startswith("ATT") else choices.add_draft_attention_backend_choices
        add([NAME])
