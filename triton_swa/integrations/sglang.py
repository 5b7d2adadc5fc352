"""SGLang integration: ``--attention-backend triton_swa`` on SGLang 0.5.23's own pools, batches and layers.

Importing this module imports SGLang (the core library never does). :func:`register` puts the
backend in SGLang's ``ATTENTION_BACKENDS`` under ``"triton_swa"`` and in the ``--attention-backend`` /
draft-backend choices; SGLang calls it through the ``sglang.srt.plugins`` entry point (see
pyproject.toml; ``SGLANG_PLUGINS=triton_swa`` selects it).

:class:`TritonSWASGLangBackend` subclasses SGLang's ``AttentionBackend`` and hands every step to
:class:`triton_swa.backend.TritonSWAAttnBackend`, which resolves the SWA pool by the policy of docs/contract.md §3 on
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
for DECODE, TARGET_VERIFY and DRAFT_EXTEND_V2. ``init_forward_metadata_in_graph`` has nothing to record.
SGLang 0.5.23 captures an EAGLE draft's extend only for backends on a fixed list; for a triton_swa
draft-extend backend :func:`_capture_draft_extend` captures it with SGLang's own runner.
"""

from __future__ import annotations

import logging
import operator
import os
import time
import weakref

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.mem_cache.kv_loc_plan import IdSpaceKind
from sglang.srt.mem_cache.memory_pool import KVWriteLoc, MHATokenToKVPool
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

from ..backend import TritonSWAAttnBackend

__all__ = ["NAME", "TritonSWASGLangBackend", "attention_layers", "read_backends_as", "register"]

NAME = "triton_swa"
logger = logging.getLogger(__name__)
_PRECOMPILED = weakref.WeakSet()  # the models whose prefill kernels a backend compiled at its start
# what a RadixAttention exposes that the backend reads (attention layers are found by these names)
_LAYER_NAMES = ("layer_id", "tp_q_head_num", "tp_k_head_num", "head_dim", "v_head_dim", "scaling", "sliding_window_size")
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
        self._read = _radix_values(layer)

    def matches(self, layer, sinks, kv_shared: bool) -> bool:
        """Whether this view still describes ``layer`` called with ``sinks`` (the attributes it read
        are the same objects), so that the core's per-layer plan stays valid."""
        return (
            self.radix is layer
            and self.sinks is sinks
            and (self.kv_shared_layer_id is not None) == kv_shared
            and all(map(operator.is_, _radix_values(layer), self._read))
        )


def _radix_values(layer) -> tuple:
    return (
        layer.layer_id,
        layer.tp_q_head_num,
        layer.tp_k_head_num,
        layer.head_dim,
        layer.v_head_dim,
        layer.scaling,
        layer.logit_cap,
        layer.sliding_window_size,
        getattr(layer, "attn_type", None),
        getattr(layer, "k_scale_float", None),
        getattr(layer, "v_scale_float", None),
    )


def _tree_mask_is_full() -> bool:
    """Whether SGLang lays this process's verify masks out FULL_MASK (else QLEN_ONLY)."""
    from sglang.srt.speculative import eagle_utils

    mode = eagle_utils.default_tree_mask_mode()
    if mode.name not in ("FULL_MASK", "QLEN_ONLY"):
        raise ValueError(f"SGLang's tree mask mode {mode.name} is not supported by the triton_swa SGLang backend (FULL_MASK, QLEN_ONLY)")
    return mode.name == "FULL_MASK"


class _VerifySpec:
    """SGLang's verify input as the core reads it: the drafts' own mask blocks and tree positions.

    SGLang lays a verify mask out as one block per request, row-major, back to back, in the layout
    its ``default_tree_mask_mode()`` names for the process (EAGLE's and NGRAM's workers build that
    one): ``FULL_MASK`` (on GPUs) ``[drafts, prefix + drafts]``, ``QLEN_ONLY`` (on a CPU) ``[drafts,
    drafts]``. Its buffers may be longer than the batch needs (the graph runners hand every captured
    batch size the static buffer sized for the largest, and an unknown ``seq_lens_sum`` sizes it
    ``bs * max_context_len``): blocks are taken in order and the tail is ignored.

    Args:
        graph: the batch is a CUDA-graph capture or replay view, whose padded requests (past the
            real ones) may have no block: they get a causal one (their rows are discarded).
        mask_required: the captured graph reads a mask; a verify input without one (DFlash's
            chain verify) gets causal blocks.
    """

    def __init__(self, spec_info, forward_batch, *, graph: bool = False, mask_required: bool = False):
        n = int(spec_info.draft_token_num)
        self.draft_token_num = n
        self.causal = True
        self.custom_mask = None
        self.positions = None
        mask = getattr(spec_info, "custom_mask", None)
        if mask is None and not mask_required:
            return
        bs = int(forward_batch.batch_size)
        lens = forward_batch.seq_lens_cpu if forward_batch.seq_lens_cpu is not None else forward_batch.seq_lens.cpu()
        lens = [int(x) for x in lens[:bs].tolist()]
        causal = torch.ones(n, n, dtype=torch.bool, device=forward_batch.seq_lens.device).tril_().reshape(-1)
        full = _tree_mask_is_full()
        blocks, at = [], 0
        for p in lens:
            width = p + n if full else n
            if mask is None or at + n * width > mask.numel():
                break
            blocks.append(mask[at : at + n * width].view(n, width)[:, width - n :].reshape(-1))
            at += n * width
        if len(blocks) < bs and mask is not None and not graph:
            need = sum(n * (p + n if full else n) for p in lens)
            layout = "[draft_token_num, prefix + draft_token_num]" if full else "[draft_token_num, draft_token_num]"
            raise ValueError(
                f"spec_info.custom_mask has {mask.numel()} entries, fewer than the {need} that SGLang's layout "
                f"({layout} per request, draft_token_num {n}, seq_lens {lens}) needs for the batch"
            )
        blocks += [causal] * (bs - len(blocks))
        self.custom_mask = torch.cat(blocks) if blocks else causal[:0]
        positions = getattr(forward_batch, "positions", None)
        self.positions = None if positions is None else positions[: bs * n].to(torch.int64)


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


class _CaptureBatch:
    """The fields of a capture batch that the graph path reads, for runners that pass them one by one."""

    def __init__(self, forward_mode, bs, req_pool_indices, seq_lens, out_cache_loc, spec_info):
        self.forward_mode, self.batch_size, self.spec_info = forward_mode, int(bs), spec_info
        self.req_pool_indices, self.seq_lens, self.out_cache_loc = req_pool_indices, seq_lens, out_cache_loc
        self.seq_lens_cpu, self.positions, self.kv_loc_plan = None, None, None


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

    def _fused_store_target(self, lp, loc, k, v):
        """The attention kernel (decode or extend) writes the new K/V itself where SGLang's own write is a plain row copy:
        the pool's ``set_kv_buffer`` is SGLang's stock MHA one (or the stock SWA pool's over stock MHA
        sub-pools), unquantized, and the rows already have the buffer's dtype (no scale, no cast). Then
        the slots are the SWA write ids for a layer of the SWA sub-pool, ``out_cache_loc`` for the others."""
        if lp.k_buf.dtype != k.dtype or lp.v_buf.dtype != v.dtype or not _stock_row_writes(self.kv_pool):
            return None
        if lp.write_mapping is None:
            return loc, None
        return None if self.swa_loc is None else (self.swa_loc, None)  # None: _save names what is missing


def _stock_row_writes(pool) -> bool:
    """Whether ``pool.set_kv_buffer`` is SGLang's own row copy (``MHATokenToKVPool``'s, unquantized,
    token-major; or ``SWAKVPool``'s over two such pools), so that writing the same rows elsewhere
    writes the same bytes."""
    if type(pool).set_kv_buffer is SWAKVPool.set_kv_buffer:
        return all(_stock_row_writes(getattr(pool, name, None)) for name in ("full_kv_pool", "swa_kv_pool"))
    return (
        type(pool).set_kv_buffer is MHATokenToKVPool.set_kv_buffer
        and not getattr(pool, "is_quantized_kv_cache", True)
        and not getattr(pool, "use_hnd", True)
        and getattr(pool, "store_dtype", None) == getattr(pool, "dtype", False)
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
        self._views: dict = {}  # (id(RadixAttention), kv_shared) -> _Layer
        self._precompile_at_start(model_runner)

    def _precompile_at_start(self, model_runner) -> None:
        """:meth:`precompile_extend` over the runner's model, on a GPU, unless ``TRITON_SWA_PRECOMPILE=0``.
        A failure is logged and costs nothing but the time: the kernels then compile at first use."""
        from ..runtime.launch import precompile_wanted, run_start_precompile

        model = getattr(model_runner, "model", None)
        if model is None or not precompile_wanted(self.core.device):
            return
        if model in _PRECOMPILED:  # another backend of this model did (a draft's step backends)
            return
        _PRECOMPILED.add(model)

        def run() -> str:
            chunk = getattr(getattr(model_runner, "server_args", None), "chunked_prefill_size", None)
            tokens = chunk if isinstance(chunk, int) and chunk > 0 else 8192
            dtype = getattr(model_runner, "dtype", None) or model_runner.model_config.dtype
            kv_shared = any(getattr(m, "is_kv_shared_layer", False) for m in model.modules())
            drafts = _draft_extend_tokens(model_runner)
            return self.precompile_extend(attention_layers(model), tokens=tokens, dtype=dtype, kv_shared=kv_shared, draft_tokens=drafts)

        run_start_precompile(run, logger)

    def precompile_extend(
        self, layers, *, tokens: int, dtype: torch.dtype, kv_shared: bool = False, draft_tokens: int = 0, jobs: int | None = None
    ) -> str:
        """Compile, before serving, the extend kernels a prefill of these layers launches, so that no
        request waits for Triton's compiler (3-5 s per kernel on an H100, once per kind of layer and
        K/V store: SGLang logs each one that compiles after serving started).

        A synthetic EXTEND step of ``tokens`` new tokens, then one more over as many cached ones (a
        chunked prefill's next chunk), runs through this backend's own ``forward_extend`` for every
        layer, with their K/V (the kernel's fused store) and, with ``kv_shared``, without (Gemma 4's
        KV-shared layers); launches are recorded, not run, and the step's slots are the pools'
        padding slot 0. ``draft_tokens`` (a speculative draft's backend: EAGLE, EAGLE3, STANDALONE)
        adds the draft extends SGLang runs eagerly for this backend (it captures draft-extend graphs
        only for its own backends): ``draft_tokens`` new tokens per request over a cached prefix, at
        the batch sizes and prefixes :meth:`_plan_draft_extends` enumerates, since the split-KV count
        follows both. Then :func:`~triton_swa.runtime.launch.precompile` compiles the
        distinct kernels ``jobs`` at a time (default :func:`~triton_swa.runtime.launch.compile_jobs`)
        and loads them; the plans made on the way are dropped. Not covered: prompts under 32 tokens
        (their own short tiles), the target's verify without CUDA graphs, sinks (gpt-oss), decode and
        graph-captured verify (compiled by CUDA-graph capture). Returns a one-line summary."""
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        from ..runtime.launch import record_and_precompile

        dev = self.core.device
        inputs, counts = {}, {"steps": 0, "refused": 0}

        def step(batch: int, new: int, prefix: int, calls: list, device_lens: bool = False) -> None:
            """One synthetic EXTEND step through each ``(layer, with its K/V)`` call (``device_lens``:
            without host copies of its prefix and sequence lengths, as SGLang's overlapped draft extend)."""
            fb = _extend_batch(ForwardMode.EXTEND, new, prefix, dev, batch)
            if device_lens:
                fb.extend_prefix_lens_cpu = fb.seq_lens_cpu = None
            self.init_forward_metadata(fb)
            counts["steps"] += 1
            t = batch * new
            for layer, with_kv in calls:
                hq, h = layer.tp_q_head_num, layer.tp_k_head_num
                cols = (hq * layer.head_dim, h * layer.head_dim, h * layer.v_head_dim)
                if (t, cols) not in inputs:  # one q, k, v per shape: nothing is launched on them
                    inputs[(t, cols)] = [torch.empty(t, c, dtype=dtype, device=dev) for c in cols]
                q, k, v = inputs[(t, cols)]
                try:
                    self.forward_extend(q, *((k, v) if with_kv else (None, None)), layer, fb, save_kv_cache=with_kv)
                except (TypeError, ValueError, KeyError, IndexError):  # a layer this pool does not hold
                    counts["refused"] += 1

        prefill_calls = [(layer, with_kv) for layer in layers for with_kv in ((True, False) if kv_shared else (True,))]

        def steps(launches: list) -> None:
            step(1, tokens, 0, prefill_calls)
            if 2 * tokens <= self.max_context_len:
                step(1, tokens, tokens, prefill_calls)
            if draft_tokens > 0:
                self._plan_draft_extends(step, launches, layers, draft_tokens)

        def forget() -> None:
            inputs.clear()
            self.core.forget_plans()
            self.forward_metadata, self._views, self.core.swa_loc = None, {}, None

        report = record_and_precompile(steps, dev, jobs=jobs, forget=forget, logger=logger)
        refused = counts["refused"]
        return (
            f"precompiled {report.kernels} extend kernel(s) for {len(layers)} layer(s) ({report.launches} launches of {counts['steps']} "
            f"synthetic step(s): prefills of {tokens} tokens{f', draft extends of {draft_tokens}' if draft_tokens else ''}; "
            f"recorded in {report.recorded_s:.1f} s, {report.total_s:.1f} s in all"
            f"{f'; {refused} layer call(s) refused' if refused else ''}"
            f"{f'; {len(report.errors)} error(s)' if report.errors else ''})"
        )

    def _plan_draft_extends(self, step, launches: list, layers, new: int) -> None:
        """:meth:`precompile_extend`'s draft extends: ``new`` tokens per request over prefixes of 1,
        1.25 and 1.5 times each power of two from 16 up to the context (together they reach every
        split-KV count's merge tile and the specialisations of the split kernel), and once with its
        lengths on the device only (SGLang's overlapped draft extend: the layer's split bound), at batch
        sizes 1, 2, 3, ... until one no longer splits: split-KV is for idle SMs, so a larger batch
        launches as that one did. One layer of each kind (heads, dims, window, soft-cap, sinks, scales)."""
        kinds = {}
        for layer in layers:
            kind = (
                layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim, layer.v_head_dim, layer.sliding_window_size,
                bool(getattr(layer, "logit_cap", 0.0)), getattr(layer, "sinks", None) is None,
                getattr(layer, "k_scale", None) is None, getattr(layer, "v_scale", None) is None,
            )  # fmt: skip
            kinds.setdefault(kind, layer)
        calls = [(layer, True) for layer in kinds.values()]
        top = self.max_context_len - new
        prefixes = sorted({int(m * (1 << k)) for k in range(4, 31) for m in (1, 1.25, 1.5) if m * (1 << k) <= top}, reverse=True)
        if not prefixes:  # a context too short for any
            return
        for batch in range(1, int(self.core.req_to_token.shape[0]) + 1):
            first = len(launches)
            step(batch, new, prefixes[0], calls, device_lens=True)  # the layer's split bound
            for prefix in prefixes:
                step(batch, new, prefix, calls)
            if not any(getattr(x[0], "fn", x[0]).__name__ == "_swa_merge_kernel" for x in launches[first:]):
                break

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
            ValueError: ``init_cuda_graph_state`` has not run, the mode is not DECODE, TARGET_VERIFY
                or DRAFT_EXTEND_V2, or (replay) nothing was captured for this batch size and mode.
        """
        self._check_mode(forward_batch)
        self._sync_pool()
        if self._graph_swa_loc is None:
            raise ValueError("init_cuda_graph_state must run before the CUDA-graph metadata path")
        fb = forward_batch
        bs = int(fb.batch_size)
        mode = fb.forward_mode
        spec = None
        if mode.is_target_verify():
            captured = self.core.cuda_graph["captured"].get((bs, mode)) if not in_capture else None
            # A graph captured with a mask reads one at replay; DFlash verifies a chain without one.
            spec = _VerifySpec(fb.spec_info, fb, graph=True, mask_required=bool(captured and captured[2]))
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
            # the step's padded token count, as captured (a draft extend's replay view holds only the
            # real requests' out_cache_loc; the padded ones write the dummy slot 0)
            self.core.swa_loc = buf[: max(n, self.core.forward_metadata.num_tokens)]
        self.forward_metadata = self.core.forward_metadata
        self._verify_batch = fb if mode.is_target_verify() else None

    def init_forward_metadata_in_graph(self, forward_batch) -> None:
        """Nothing to record: every buffer the kernels read is filled in ``_out_graph``."""

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.core.init_cuda_graph_state(max_bs, max_num_tokens)
        self._graph_swa_loc = torch.zeros(max_num_tokens, dtype=torch.int64, device=self.core.device)

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return self.core.get_cuda_graph_seq_len_fill_value()

    # SGLang's CPU graph runner (decode only) captures a compiled forward per batch size: it sets the
    # backend up with these two hooks, runs the capture batch through them, and before each replay
    # builds the metadata eagerly (``init_forward_metadata``) over the captured, padded batch.

    def get_cpu_graph_seq_len_fill_value(self) -> int:
        return self.core.get_cuda_graph_seq_len_fill_value()

    def init_cpu_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.init_cuda_graph_state(max_bs, max_num_tokens)

    def init_forward_metadata_capture_cpu_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, out_cache_loc, encoder_lens, forward_mode, spec_info
    ) -> None:
        """Metadata of the CPU graph runner's capture batch (DECODE; its fixed buffers, as for CUDA graphs)."""
        if encoder_lens is not None:
            raise ValueError("the triton_swa SGLang backend serves decoder-only models: encoder_lens must be None")
        if not forward_mode.is_decode():
            raise ValueError(f"SGLang's CPU graphs capture DECODE, not {getattr(forward_mode, 'name', forward_mode)}")
        batch = _CaptureBatch(forward_mode, bs, req_pool_indices, seq_lens, out_cache_loc, spec_info)
        self.init_forward_metadata_out_graph(batch, in_capture=True)

    def attend_images_bidirectionally(self, forward_batch) -> None:
        """Gemma 3 / Gemma 4 prefill: each image's tokens see one another, as in Hugging Face's models.

        Set by SGLang's ``prepare_attn_masks`` of those models (hooked by the plugin) after the step's
        metadata: the step's new tokens get one ``[extend, extend]`` mask block per request, causal,
        with each image span that lies wholly inside this chunk made bidirectional (a span split by
        chunked prefill stays causal, as SGLang's Triton backend does). Keys stay windowed by position.
        """
        if not forward_batch.forward_mode.is_extend() or forward_batch.forward_mode.is_target_verify():
            return
        meta = self.core.forward_metadata
        ext = [int(x) for x in forward_batch.extend_seq_lens_cpu]
        prefix = [int(x) for x in forward_batch.extend_prefix_lens_cpu]
        mm_inputs = getattr(forward_batch, "mm_inputs", None) or [None] * len(ext)
        blocks, offsets, spans = [], [0], 0
        for e, p, mm in zip(ext, prefix, mm_inputs):
            block = torch.ones(e, e, dtype=torch.bool).tril_()
            for item in getattr(mm, "mm_items", None) or ():
                if not item.is_image():
                    continue
                for begin, end in item.offsets:
                    if p <= begin and end < p + e:
                        block[begin - p : end + 1 - p, begin - p : end + 1 - p] = True
                        spans += 1
            blocks.append(block.reshape(-1))
            offsets.append(offsets[-1] + e * e)
        if spans == 0:
            return
        dev = self.core.device
        meta.custom_mask = torch.cat(blocks).to(dev)
        meta.mask_indptr = torch.tensor(offsets[:-1], dtype=torch.int32, device=dev)

    def _view(self, layer, sinks, kv_shared: bool) -> _Layer:
        """The core's view of a RadixAttention call, made once per layer and call kind (a view the
        core has seen keeps its per-layer plan)."""
        key = (id(layer), kv_shared)
        view = self._views.get(key)
        if view is None or not view.matches(layer, sinks, kv_shared):
            view = self._views[key] = _Layer(layer, sinks, kv_shared)
        return view

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None, **kwargs):
        self._sync_pool()
        view = self._view(layer, sinks, kv_shared=k is None)
        return self.core.forward_decode(q, k, v, view, forward_batch, save_kv_cache and k is not None)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None, **kwargs):
        self._sync_pool()
        view = self._view(layer, sinks, kv_shared=k is None)
        return self.core.forward_extend(q, k, v, view, forward_batch, save_kv_cache and k is not None)


def attention_layers(model) -> list:
    """The model's attention layers (modules exposing what a ``RadixAttention`` does), in layer order."""
    found = [m for m in model.modules() if all(hasattr(m, name) for name in _LAYER_NAMES)]
    return sorted(found, key=lambda m: m.layer_id)


def _extend_batch(mode, new: int, prefix: int, device, batch: int = 1):
    """SGLang's ``ForwardBatch`` of ``batch`` requests (all request row 0), each extending ``prefix``
    cached tokens by ``new``, every slot the pools' padding slot 0 (what
    :meth:`TritonSWASGLangBackend.precompile_extend` plans over)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    on = dict(device=device)
    t = batch * new
    return ForwardBatch(
        forward_mode=mode,
        batch_size=batch,
        input_ids=torch.zeros(t, dtype=torch.long, **on),
        req_pool_indices=torch.zeros(batch, dtype=torch.long, **on),
        seq_lens=torch.full((batch,), prefix + new, **on),
        out_cache_loc=torch.zeros(t, dtype=torch.long, **on),
        seq_lens_sum=batch * (prefix + new),
        seq_lens_cpu=torch.full((batch,), prefix + new),
        extend_prefix_lens=torch.full((batch,), prefix, **on),
        extend_prefix_lens_cpu=[prefix] * batch,
        extend_seq_lens=torch.full((batch,), new, **on),
        extend_seq_lens_cpu=[new] * batch,
        extend_num_tokens=t,
        spec_algorithm=SpeculativeAlgorithm.NONE,
    )


def _draft_extend_tokens(model_runner) -> int:
    """The new tokens per request of a draft extend this runner's backend runs eagerly: SGLang's
    ``speculative_num_draft_tokens`` for an EAGLE, EAGLE3 or STANDALONE draft runner, else 0 (a
    target, or a draft whose extend is not a causal chain: DFLASH's block, NGRAM's none)."""
    algorithm = getattr(getattr(model_runner, "spec_algorithm", None), "name", None)
    if not getattr(model_runner, "is_draft_worker", False) or algorithm not in ("EAGLE", "EAGLE3", "STANDALONE"):
        return 0
    drafts = getattr(getattr(model_runner, "server_args", None), "speculative_num_draft_tokens", None)
    if not isinstance(drafts, int):
        from sglang.srt.runtime_context import get_spec

        try:
            drafts = get_spec().speculative_num_draft_tokens
        except ValueError:  # SGLang's settings not published in this process
            return 0
    return drafts if isinstance(drafts, int) and drafts > 0 else 0


class _DraftStepBatch:
    """Draft decode step ``step`` of a chain draft (topk 1) as a plain DECODE batch.

    The draft's tokens sit in ``req_to_token`` right after each request's committed ``seq_lens``
    (SGLang assigns them there before the draft runs), so step ``i`` decodes at length
    ``seq_lens + i + 1`` and writes the ``i``-th of the request's draft slots.
    """

    def __init__(self, forward_batch, step: int):
        self._fb = forward_batch
        shift = step + 1
        bs = int(forward_batch.batch_size)
        self.seq_lens = forward_batch.seq_lens + shift
        cpu = getattr(forward_batch, "seq_lens_cpu", None)
        self.seq_lens_cpu = None if cpu is None else cpu + shift
        self.seq_lens_sum = None
        self.spec_info = None
        loc = getattr(forward_batch, "out_cache_loc", None)
        # SGLang's layout: [bs, topk = 1, columns], step i writes column i.
        self.out_cache_loc = None if loc is None or bs == 0 else loc.view(bs, -1)[:, step]
        self.kv_loc_plan = None

    def __getattr__(self, name):
        return getattr(self._fb, name)


class _DraftStepBackend(TritonSWASGLangBackend):
    """The backend of one draft decode step (see :class:`TritonSWAMultiStepDraftBackend`)."""

    def __init__(self, model_runner, step: int):
        super().__init__(model_runner)
        self.step = step

    def _swa_write_ids(self, forward_batch):
        loc = getattr(forward_batch, "out_cache_loc", None)
        if not self.core.use_sliding_window_kv_pool or loc is None:
            return None
        return self._swa_kv_pool.translate_loc_from_full_to_swa(loc)

    def init_forward_metadata(self, forward_batch) -> None:
        super().init_forward_metadata(_DraftStepBatch(forward_batch, self.step))

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False) -> None:
        super().init_forward_metadata_out_graph(_DraftStepBatch(forward_batch, self.step), in_capture)


class TritonSWAMultiStepDraftBackend:
    """SGLang's multi-step draft decode container (EAGLE, EAGLE3, STANDALONE) over triton-swa: one
    backend per draft step, ``attn_backends[i]`` for step ``i``, each resolving its SWA pool by the
    policy on the draft runner.

    Chain drafts only (``--speculative-eagle-topk 1``): a tree draft's branches do not sit in
    ``req_to_token`` in order, and this container does not gather them.

    Raises:
        ValueError: ``topk`` is not 1.
    """

    def __init__(self, model_runner, topk: int, speculative_num_steps: int):
        if int(topk) != 1:
            raise ValueError(
                f"the triton_swa draft decode backend runs chain drafts (--speculative-eagle-topk 1), got topk {topk}; "
                "use another --speculative-draft-attention-backend for tree drafts"
            )
        self.topk, self.speculative_num_steps = 1, int(speculative_num_steps)
        self.attn_backends = [_DraftStepBackend(model_runner, i) for i in range(self.speculative_num_steps - 1)]
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.req_to_token_pool = model_runner.req_to_token_pool

    def init_forward_metadata(self, forward_batch) -> None:
        for backend in self.attn_backends:
            backend.init_forward_metadata(forward_batch)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        for backend in self.attn_backends:
            backend.init_cuda_graph_state(max_bs, max_num_tokens)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False) -> None:
        for backend in self.attn_backends:
            backend.init_forward_metadata_out_graph(forward_batch, in_capture)

    def init_forward_metadata_in_graph(self, forward_batch) -> None:
        """Nothing to record (as for one step)."""

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return self.attn_backends[0].get_cuda_graph_seq_len_fill_value()


def _factory(model_runner):
    return TritonSWASGLangBackend(model_runner)


# SGLang accepts triton_swa wherever it accepts this sibling: its own Triton backend serves the same
# features (sliding windows, sinks, softcap, head dims up to 512, KV-shared layers, custom masks).
SIBLING = "triton"

_registered = False


def read_backends_as(aliases: dict):
    """A wrapper of SGLang's per-model server-argument step (``handle_model_specific_adjustments``:
    its Gemma 4 and gpt-oss backend allow-lists among its checks) under which those checks read
    backend ``name`` as ``aliases[name]``; everything else reads the real names. For
    ``register_resolution_hook``: the plugin reads ``triton_swa`` as its sibling, and the real-engine
    kit uses it to run SGLang's own backends as controls where its allow-lists refuse them."""

    def wrapper(server_args, previous):
        from sglang.srt.arg_groups import model_hook

        real = model_hook.attention_backends_of

        def backends_of(view):
            return tuple(aliases.get(b, b) for b in real(view))

        model_hook.attention_backends_of = backends_of
        try:
            previous(server_args)
        finally:
            model_hook.attention_backends_of = real

    return wrapper


def _dflash_mask_policy(result, attn_backend, *args, **kwargs):
    """DFlash verifies a causal chain without a mask; this backend expresses that natively."""
    name, _ = result
    if name == TritonSWASGLangBackend.__name__:
        return name, False
    return None


def _draft_backend(original, factory, backend_name, backend_map, error_template, stamps_children=False):
    """SGLang's draft-backend factory builds triton_swa draft backends: the multi-step draft decode
    container (``stamps_children``) or a draft-extend backend."""
    runner = factory.draft_model_runner
    if stamps_children:
        creator = lambda: (NAME, TritonSWAMultiStepDraftBackend(runner, factory.topk, factory.speculative_num_steps))  # noqa: E731
    else:

        def creator():
            _hook_draft_extend_capture()
            return NAME, TritonSWASGLangBackend(runner)

    return original(factory, backend_name, {**backend_map, NAME: creator}, error_template, stamps_children)


_DRAFT_EXTEND_CAPTURE = "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._capture_cuda_graphs"
_draft_extend_hooked = False


def _hook_draft_extend_capture() -> None:
    """Hook :func:`_capture_draft_extend` on the draft worker's graph capture, once per process, when
    a triton_swa draft-extend backend is first made (the draft worker builds its backends before it
    captures): through SGLang's ``HookRegistry``, as the plugin's other hooks, but not at plugin load,
    which would import SGLang's speculative worker (about 1 s) into every process, speculative or not."""
    global _draft_extend_hooked
    if _draft_extend_hooked:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(_DRAFT_EXTEND_CAPTURE, _capture_draft_extend, HookType.AFTER)
    HookRegistry.apply_hooks()  # patches the targets not yet patched: this one
    _draft_extend_hooked = True


def _capture_draft_extend(result, worker, *args, **kwargs):
    """After SGLang's EAGLE draft worker captured its graphs (``_capture_cuda_graphs``): capture the
    draft extend with SGLang's own ``EAGLEDraftExtendCudaGraphRunner`` where the draft-extend backend
    is triton_swa's. SGLang 0.5.23 builds that runner only for backends on a fixed list of its own
    classes and runs any other draft extend eagerly, each step paying its planning and launches on
    the host. Skipped, as SGLang skips its own: on a CPU or another platform, with graphs off, with
    ``SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH``; and with ``TRITON_SWA_DRAFT_EXTEND_GRAPH=0``. A failed
    capture is logged and leaves the draft extend eager, as it was."""
    from sglang.srt.speculative import eagle_worker_v2 as sg

    backend = getattr(worker, "draft_extend_attn_backend", None)
    if not isinstance(backend, TritonSWASGLangBackend) or getattr(worker, "cuda_graph_runner_for_draft_extend", None) is not None:
        return None
    if os.environ.get("TRITON_SWA_DRAFT_EXTEND_GRAPH", "1") == "0" or backend.core.device.type != "cuda":
        return None
    if not sg._is_cuda or sg.current_platform.is_out_of_tree() or sg.envs.SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH.get():
        return None
    if sg.check_cuda_graph_backend(sg.Phase.DECODE, sg.Backend.DISABLED):
        return None
    t0 = time.perf_counter()
    try:
        worker.cuda_graph_runner_for_draft_extend = sg.EAGLEDraftExtendCudaGraphRunner(worker)
    except Exception as exc:  # noqa: BLE001 - the eager draft extend still serves
        worker.cuda_graph_runner_for_draft_extend = None
        logger.warning("triton_swa: capturing the draft extend's CUDA graphs failed (%s: %s); it runs eagerly", type(exc).__name__, exc)
        return None
    logger.info("triton_swa: captured the draft extend's CUDA graphs in %.1f s", time.perf_counter() - t0)
    return None


def _image_masks(original, model, forward_batch, *args, **kwargs):
    """Gemma 3 / Gemma 4 build bidirectional image-token masks for SGLang's Triton backend only
    (by class); with triton_swa serving the prefill, it builds them itself."""
    from sglang.srt.model_executor.forward_context import get_attn_backend

    backend = get_attn_backend()
    backend = getattr(backend, "prefill_backend", backend)
    if isinstance(backend, TritonSWASGLangBackend):
        backend.attend_images_bidirectionally(forward_batch)
        return None
    return original(model, forward_batch, *args, **kwargs)


# SGLang's resolution steps that select by backend name: step name -> wrapper(server_args, previous).
_RESOLUTION_HOOKS = {"handle_model_specific_adjustments": read_backends_as({NAME: SIBLING})}


def _hooks() -> dict:
    """The SGLang functions that select by backend name with no resolution step of their own, hooked
    at plugin load through SGLang's HookRegistry: target -> (hook type, hook)."""
    return {
        "sglang.srt.speculative.dflash_utils.resolve_dflash_verify_mask_policy": ("AFTER", _dflash_mask_policy),
        "sglang.srt.speculative.draft_utils.DraftBackendFactory._create_backend": ("AROUND", _draft_backend),
        "sglang.srt.models.gemma3_mm.Gemma3ForConditionalGeneration.prepare_attn_masks": ("AROUND", _image_masks),
        "sglang.srt.models.gemma4_mm.Gemma4ForConditionalGeneration.prepare_attn_masks": ("AROUND", _image_masks),
    }


_stack_dumps: dict = {}  # pid -> the stop event of that process's stack-dump thread


def _dump_stacks_every(every: str):
    """Every other thread's Python stack on stderr each ``every`` seconds, from a daemon thread of this
    process (one per process: a forked child starts its own). Returns the thread's stop event.

    A Python thread rather than ``faulthandler.dump_traceback_later``: SGLang's scheduler processes,
    which inherit faulthandler's timer state, crashed (SIGSEGV) when it was armed there."""
    import sys
    import threading
    import traceback

    try:
        seconds = float(every)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"TRITON_SWA_DUMP_STACKS_S must be a number of seconds above 0, got {every!r}")
    pid = os.getpid()
    if pid in _stack_dumps:
        return _stack_dumps[pid]
    stop = _stack_dumps[pid] = threading.Event()

    def dump() -> None:
        while not stop.wait(seconds):
            me = threading.get_ident()
            names = {t.ident: t.name for t in threading.enumerate()}
            out = [f"triton_swa: Python stacks of process {pid}, {time.strftime('%H:%M:%S')}\n"]
            for ident, frame in sys._current_frames().items():
                if ident != me:
                    out.append(f"  thread {names.get(ident, ident)}:\n")
                    out += traceback.format_stack(frame)
            sys.stderr.write("".join(out))
            sys.stderr.flush()

    threading.Thread(target=dump, name="triton_swa-stack-dump", daemon=True).start()
    return stop


def register() -> None:
    """Register ``triton_swa`` with SGLang (idempotent): the backend registry, both choice lists, and
    hooks on the SGLang functions that accept attention backends by name (:func:`_hooks`).

    SGLang's plugin loader calls this through the ``sglang.srt.plugins`` entry point and applies the
    hooks right after every plugin has run (``HookRegistry.apply_hooks``), before it resolves server
    arguments, in the server process and in each scheduler process. ``TRITON_SWA_LOG_LEVEL`` (e.g.
    ``INFO``) sets the level of the ``triton_swa`` loggers there. ``TRITON_SWA_DUMP_STACKS_S`` (seconds,
    a diagnostic) has each of those processes write its threads' Python stacks to stderr that often
    (:func:`_dump_stacks_every`): where a stall sits that no profiler event covers.

    Raises:
        ValueError: ``TRITON_SWA_DUMP_STACKS_S`` is not a number of seconds above 0.
    """
    global _registered
    level = os.environ.get("TRITON_SWA_LOG_LEVEL")
    if level:  # an engine logging at WARNING shows the plugin's INFO lines (its precompile, its graph capture)
        logging.getLogger("triton_swa").setLevel(level.upper())
    every = os.environ.get("TRITON_SWA_DUMP_STACKS_S")
    if every:
        _dump_stacks_every(every)
    from sglang.srt.arg_groups import choices
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if NAME not in ATTENTION_BACKENDS:
        register_attention_backend(NAME)(_factory)
    for name in ("ATTENTION_BACKEND_CHOICES", "DRAFT_ATTENTION_BACKEND_CHOICES"):
        listed = getattr(choices, name, None)
        if listed is not None and NAME in listed:
            continue
        add = choices.add_attention_backend_choices if name.startswith("ATT") else choices.add_draft_attention_backend_choices
        add([NAME])
    if not _registered:
        for step, wrapper in _RESOLUTION_HOOKS.items():
            register_resolution_hook(step)(wrapper)
        for target, (kind, hook) in _hooks().items():
            HookRegistry.register(target, hook, HookType[kind])
        _registered = True
