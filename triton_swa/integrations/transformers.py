"""Hugging Face transformers integration: run a transformers model's attention over triton-swa's paged pools.

Importing this module imports transformers (5.19, the ``demo`` extra); the core library never does.
:func:`register` (idempotent) adds ``"triton_swa"`` to transformers' ``AttentionInterface`` (the
attention function :func:`triton_swa_attention_forward`) and to its ``AttentionMaskInterface`` (a
mask builder that returns None, so transformers builds no dense mask: the kernels apply causality
and each layer's window per request, from the step's batch).

Any causal decoder whose layers are sliding-window or full attention runs on it: Gemma 2 (soft-cap),
Gemma 3 and Gemma 4 text (per-layer head dims, KV-shared tail layers), gpt-oss (sinks), Mistral and
Ministral. Everything per layer comes from the model itself (:func:`model_layer_specs` reads its
attention modules and config; the attention function reads each call's arguments).

Set-up::

    from triton_swa.integrations import transformers as tswa

    tswa.register()
    model.set_attn_implementation("triton_swa")  # or from_pretrained(..., attn_implementation="triton_swa")
    kv = tswa.build_paged_kv(model, size=8192, size_swa=2048, page_size=16, max_num_reqs=8, max_context_len=8192)
    row = kv.req_to_token_pool.alloc(1)[0]      # one req_to_token row per live request

A step packs the new tokens of all its requests into one sequence (batch dim 1, request after
request, ``T`` = every new token of the step). A step method allocates the new tokens' slots (full and
SWA, recorded in ``req_to_token``), builds the step's :class:`triton_swa.engine.ForwardBatch`, runs
``backend.init_forward_metadata`` once, and returns a :class:`StepContext`; the model then runs with
``model(input_ids=ids[None], **step.model_kwargs())`` (``position_ids``, ``use_cache=False``: the pools
are the cache, and the context under the keyword ``triton_swa_step``, which transformers passes from
the model's forward through every decoder layer to the attention function). Logits row ``t`` belongs
to the ``t``-th new token of the step.

- EXTEND, prefill or chunked prefill over a cached prefix: ``kv.extend(rows, prefix_lens,
  extend_lens)``; request ``i`` brings tokens ``prefix_lens[i] .. prefix_lens[i] + extend_lens[i] - 1``.
- DECODE: ``kv.decode(rows, prefix_lens)``: one token per request, at position ``prefix_lens[i]``.
- TARGET_VERIFY, chain drafts: ``kv.verify(rows, prefix_lens, num_draft)``: ``num_draft`` tokens per
  request after its ``prefix_lens[i]`` committed tokens (row ``i * num_draft + j`` scores draft ``j``).
  Keep the accepted drafts' K/V and free the rest with ``kv.free(row, prefix + accepted, prefix +
  num_draft)``.

Here ``prefix_lens`` are the tokens a request already holds in the pools. After every step the
engine evicts what no later query can see: ``evicted = kv.evict(row, seq_len, evicted)`` per request
(``seq_len`` its committed tokens, ``evicted`` its mark, 0 at first). A finished request:
``kv.free(row, 0, seq_len)`` then ``kv.req_to_token_pool.free(row)``. An engine that builds its own
``ForwardBatch`` (for instance tree drafts, with ``SpecInfo.custom_mask`` and ``positions``) gets its
context from ``kv.context(forward_batch, position_ids)``.

What transformers 5.19 passes (read from its Gemma 2/3/4, gpt-oss and Mistral modules): the attention
function gets ``(module, query [B, HQ, T, D], key, value [B, H, T, D], attention_mask, scaling=,
dropout=, sliding_window=S or None, softcap= (Gemma 2), s_aux= (gpt-oss sinks), position_ids=, and
every keyword the model's forward was given)`` and returns ``(out [B, T, HQ, D], None)``. Hugging
Face's ``sliding_window = S`` counts the current key, so ``window_left = S - 1`` (docs/contract.md §1). Gemma 4's
KV-shared layers (the last ``num_kv_shared_layers``) receive, without an HF cache, the step's K/V of
the last earlier layer of their type (the one with ``store_full_length_kv``; Gemma 3n names it
``kv_shared_layer_index``); here they read that layer's K/V from the pools instead
(``kv_shared_layer_id``) and write none, so the shared layers take no pool memory.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from transformers import AttentionInterface, AttentionMaskInterface

from ..backend import TritonSWAAttnBackend
from ..engine import AttentionLayer, ForwardBatch, ModelRunner, SpecInfo, SpeculativeAlgorithm
from ..mem import ReqToTokenPool, SWAKVPool, SWATokenToKVPoolAllocator, alloc_positions, evict_swa_window

__all__ = [
    "NAME",
    "STEP_KWARG",
    "LayerSpec",
    "ModelWorker",
    "PagedKV",
    "StepContext",
    "build_draft_paged_kv",
    "build_paged_kv",
    "model_layer_specs",
    "positions_of",
    "register",
    "triton_swa_attention_forward",
    "window_left_from_hf",
]

NAME = "triton_swa"
# the keyword of the model's forward that carries the StepContext to every attention call
STEP_KWARG = "triton_swa_step"
_LAYER_TYPES = ("sliding_attention", "full_attention")


def window_left_from_hf(sliding_window: int | None) -> int:
    """``window_left`` of a Hugging Face ``sliding_window`` (S keys including the current one): ``S - 1``; None: -1."""
    if sliding_window is None:
        return -1
    if isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 1:
        raise ValueError(f"sliding_window must be None or an int >= 1, got {sliding_window!r}")
    return sliding_window - 1


@dataclass(frozen=True)
class LayerSpec:
    """One attention layer of a model, as its modules and config describe it."""

    layer_id: int
    window_left: int  # -1: full attention
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    kv_shared_layer_id: int | None = None  # the layer whose K/V this one reads (and writes none)

    @property
    def is_sliding(self) -> bool:
        return self.window_left >= 0


def _attention_modules(model) -> dict[int, torch.nn.Module]:
    config = model.config.get_text_config(decoder=True)
    found: dict[int, torch.nn.Module] = {}
    for m in model.modules():
        if getattr(m, "config", None) is not config or not isinstance(getattr(m, "layer_idx", None), int):
            continue
        if not (hasattr(m, "q_proj") and hasattr(m, "head_dim")):
            continue  # a decoder layer or another module that carries layer_idx
        if m.layer_idx in found:
            raise ValueError(f"two attention modules claim layer {m.layer_idx}")
        found[m.layer_idx] = m
    want = set(range(config.num_hidden_layers))
    if set(found) != want:
        raise ValueError(
            f"found attention modules for layers {sorted(found)}, expected 0..{config.num_hidden_layers - 1}: "
            f"not a decoder this integration knows ({type(model).__name__})"
        )
    return found


def _hf_sliding_window(module, config) -> int | None:
    """The module's ``sliding_window`` (Gemma, gpt-oss, Ministral); else by ``layer_types``; else the
    config's (Mistral slides every layer)."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and layer_types[module.layer_idx] not in _LAYER_TYPES:
        raise ValueError(
            f"layer {module.layer_idx} is {layer_types[module.layer_idx]!r}; triton_swa runs {' and '.join(_LAYER_TYPES)} layers only"
        )
    if hasattr(module, "sliding_window"):
        return module.sliding_window
    if layer_types is not None:
        return config.sliding_window if layer_types[module.layer_idx] == "sliding_attention" else None
    return getattr(config, "sliding_window", None)


def _kv_source(module, modules: Mapping[int, torch.nn.Module]) -> int | None:
    """The layer whose K/V a KV-shared layer reuses, or None."""
    if not getattr(module, "is_kv_shared_layer", False):
        return None
    source = getattr(module, "kv_shared_layer_index", None)  # Gemma 3n names it
    if source is None:
        # Gemma 4: the last earlier layer of the same type stores its K/V for the shared ones
        source = [
            i
            for i, m in modules.items()
            if getattr(m, "store_full_length_kv", False) and getattr(m, "layer_type", None) == getattr(module, "layer_type", None)
        ]
        if len(source) != 1:
            raise ValueError(
                f"layer {module.layer_idx} is KV-shared but {len(source)} layers of its type "
                f"({getattr(module, 'layer_type', None)!r}) store K/V for sharing"
            )
        source = source[0]
    if getattr(modules[source], "is_kv_shared_layer", False):
        raise ValueError(f"layer {module.layer_idx} reads the K/V of layer {source}, itself KV-shared")
    return source


def model_layer_specs(model) -> list[LayerSpec]:
    """Every attention layer of a transformers decoder, read from its attention modules and config.

    Head counts from ``q_proj`` and ``num_key_value_groups``, ``head_dim`` per layer (Gemma 4's
    sliding and full layers differ), the window from ``sliding_window`` (or ``layer_types``, or the
    config's window: Mistral), KV sharing from ``is_kv_shared_layer``.

    Raises:
        ValueError: a layer that is neither sliding nor full attention, a non-causal layer, or a
            model whose attention modules cannot be found.
    """
    config = model.config.get_text_config(decoder=True)
    modules = _attention_modules(model)
    specs = []
    for i in sorted(modules):
        m = modules[i]
        if getattr(m, "is_causal", True) is False:
            raise ValueError(f"layer {i} is bidirectional; triton_swa runs causal decoders only")
        hq = m.q_proj.out_features // m.head_dim
        groups = getattr(m, "num_key_value_groups", None)
        h = hq // groups if groups else config.num_key_value_heads
        specs.append(LayerSpec(i, window_left_from_hf(_hf_sliding_window(m, config)), hq, h, m.head_dim, _kv_source(m, modules)))
    return specs


@dataclass
class StepContext:
    """What the attention function needs for one step; the model's forward carries it as ``triton_swa_step``.

    Attributes:
        backend: the :class:`~triton_swa.backend.TritonSWAAttnBackend`, its metadata built for this step.
        forward_batch: the step's :class:`~triton_swa.engine.ForwardBatch` (SGLang's field names).
        position_ids (torch.Tensor): int64 `[1, T]`, the position of each new token.
        kv_shared_layer_ids (Mapping[int, int]): model layer -> the layer whose K/V it reads.
    """

    backend: TritonSWAAttnBackend
    forward_batch: ForwardBatch
    position_ids: torch.Tensor
    kv_shared_layer_ids: Mapping[int, int]
    # called after each layer's attention as observer(layer, q, k, v, out, step) (k, v None in KV-shared
    # layers): a spot-check of outputs against the reference, a trace
    observer: Callable | None = None

    def model_kwargs(self) -> dict:
        """Keywords of the model's forward for this step: ``position_ids``, ``use_cache=False``, the context."""
        return {"position_ids": self.position_ids, "use_cache": False, STEP_KWARG: self}


def positions_of(forward_batch) -> torch.Tensor:
    """int64 `[1, T]` positions of a step's new tokens (chain drafts in TARGET_VERIFY), from its CPU lengths."""
    fb, mode = forward_batch, forward_batch.forward_mode
    seq = (fb.seq_lens_cpu if fb.seq_lens_cpu is not None else fb.seq_lens.cpu()).long()
    if mode.is_decode():
        pos = seq - 1
    elif mode.is_target_verify():
        if fb.spec_info.positions is not None:
            return fb.spec_info.positions.long().view(1, -1)
        pos = (seq[:, None] + torch.arange(fb.spec_info.draft_token_num)).reshape(-1)
    else:
        prefix = fb.extend_prefix_lens_cpu if fb.extend_prefix_lens_cpu is not None else fb.extend_prefix_lens.tolist()
        ext = fb.extend_seq_lens_cpu if fb.extend_seq_lens_cpu is not None else fb.extend_seq_lens.tolist()
        pos = torch.cat([torch.arange(p, p + e) for p, e in zip(prefix, ext)]) if ext else torch.zeros(0, dtype=torch.long)
    return pos.view(1, -1).to(fb.seq_lens.device)


class PagedKV:
    """The paged pools of one model and the step helpers an engine's loop needs (see the module docstring).

    Attributes:
        pool (SWAKVPool): sliding layers in its SWA sub-pool, full layers in its full sub-pool (KV-shared
            layers in neither).
        allocator (SWATokenToKVPoolAllocator): full and SWA slots, with the full-to-SWA mapping.
        req_to_token_pool (ReqToTokenPool): one row per live request (row 0 is padding).
        model_runner (ModelRunner): what the backend reads.
        backend (TritonSWAAttnBackend): one for every layer of the model.
        layers (list[LayerSpec]): the model's layers.
        window_left (int): ``W`` of the sliding layers.
    """

    def __init__(self, pool, allocator, req_to_token_pool, model_runner, backend, layers: Sequence[LayerSpec]):
        self.pool, self.allocator, self.req_to_token_pool = pool, allocator, req_to_token_pool
        self.model_runner, self.backend = model_runner, backend
        self.layers = list(layers)
        self.window_left = model_runner.sliding_window_size
        self.page_size = allocator.page_size
        self.device = backend.device
        self.kv_shared_layer_ids = {s.layer_id: s.kv_shared_layer_id for s in self.layers if s.kv_shared_layer_id is not None}

    def _lengths(self, name: str, values, n: int) -> list[int]:
        values = values.tolist() if isinstance(values, torch.Tensor) else list(values)
        if len(values) != n:
            raise ValueError(f"{name} must have one entry per request ({n}), got {len(values)}")
        return [int(x) for x in values]

    def _alloc(self, rows: list[int], prefix: list[int], new: list[int]) -> torch.Tensor:
        """Slots for ``new[i]`` tokens after ``prefix[i]`` of row ``rows[i]``, recorded in ``req_to_token``."""
        slots = alloc_positions(self.allocator, self.req_to_token_pool.req_to_token, rows, prefix, new)
        if slots is None:
            raise RuntimeError(
                f"out of KV slots for {sum(new)} tokens (full free {self.allocator.full_available_size()}, "
                f"SWA free {self.allocator.swa_available_size()}): evict, free requests or grow the pools"
            )
        return slots

    def context(self, forward_batch, position_ids: torch.Tensor | None = None, observer: Callable | None = None) -> StepContext:
        """Build the step's metadata once (``backend.init_forward_metadata``) and the context the model carries.

        ``position_ids`` default to :func:`positions_of` the batch; ``observer`` see :class:`StepContext`.
        """
        self.backend.init_forward_metadata(forward_batch)
        if position_ids is None:
            position_ids = positions_of(forward_batch)
        return StepContext(self.backend, forward_batch, position_ids, self.kv_shared_layer_ids, observer)

    def extend(self, rows: Sequence[int], prefix_lens: Sequence[int], extend_lens: Sequence[int]) -> StepContext:
        """EXTEND: prefill, or chunked prefill after ``prefix_lens[i]`` cached tokens; allocates the new tokens' slots."""
        rows = [int(r) for r in rows]
        prefix = self._lengths("prefix_lens", prefix_lens, len(rows))
        ext = self._lengths("extend_lens", extend_lens, len(rows))
        loc = self._alloc(rows, prefix, ext)
        fb = ForwardBatch.extend(rows, prefix, ext, loc, device=self.device)
        return self.context(fb)

    def decode(self, rows: Sequence[int], prefix_lens: Sequence[int]) -> StepContext:
        """DECODE: one new token per request, at position ``prefix_lens[i]``; allocates its slot."""
        rows = [int(r) for r in rows]
        prefix = self._lengths("prefix_lens", prefix_lens, len(rows))
        loc = self._alloc(rows, prefix, [1] * len(rows))
        fb = ForwardBatch.decode(rows, prefix, loc, device=self.device)
        return self.context(fb)

    def verify(self, rows: Sequence[int], prefix_lens: Sequence[int], num_draft: int) -> StepContext:
        """TARGET_VERIFY of chain drafts: ``num_draft`` tokens after each request's ``prefix_lens[i]`` committed ones.

        The drafts' slots are allocated and their K/V written; free the rejected ones with :meth:`free`.
        """
        rows = [int(r) for r in rows]
        prefix = self._lengths("prefix_lens", prefix_lens, len(rows))
        loc = self._alloc(rows, prefix, [num_draft] * len(rows))
        fb = ForwardBatch.verify(rows, prefix, SpecInfo(num_draft), loc, device=self.device)
        return self.context(fb)

    def evict(self, row: int, seq_len: int, evicted_len: int) -> int:
        """Free the SWA slots of row ``row``'s tokens that no later query sees; returns the new ``evicted_len``."""
        return evict_swa_window(self.allocator, self.req_to_token_pool.req_to_token, row, seq_len, self.window_left, evicted_len)

    def free(self, row: int, start: int, end: int) -> None:
        """Free tokens ``start .. end - 1`` of row ``row`` (full slots and any SWA slots): rejected drafts, a finished request."""
        if end > start:
            self.allocator.free(self.req_to_token_pool.req_to_token[row, start:end].long())


def build_paged_kv(
    model,
    *,
    size: int,
    size_swa: int,
    page_size: int = 1,
    max_num_reqs: int,
    max_context_len: int,
    dtype: torch.dtype | None = None,
    device=None,
    target: PagedKV | None = None,
    backend_class: type = TritonSWAAttnBackend,
) -> PagedKV:
    """Pools, allocator, request table, runner and backend for a transformers model with sliding layers.

    Args:
        model: a transformers causal LM (its attention modules are read by :func:`model_layer_specs`).
        size (int): full-pool token slots (a multiple of ``page_size``); ``size_swa`` SWA-pool slots,
            usually far fewer (live requests times their window, plus a page each).
        page_size (int): tokens per page, shared by both sub-pools.
        max_num_reqs (int): live requests at once; ``max_context_len`` tokens per request.
        dtype (torch.dtype | None): KV dtype (default the model's); ``device`` (default the model's).
        target (PagedKV | None): build a draft's pools over this target's slots instead (use
            :func:`build_draft_paged_kv`).
        backend_class (type): the backend to build (a subclass of ``TritonSWAAttnBackend``).

    Returns:
        PagedKV: see the module docstring for how a step uses it.

    Raises:
        ValueError: the model has no sliding layers, its sliding layers disagree on the window, or the
            layers of one kind disagree on head count or head dim (one geometry per sub-pool).
    """
    specs = model_layer_specs(model)
    dtype = model.dtype if dtype is None else dtype
    device = model.device if device is None else torch.device(device)
    owners = [s for s in specs if s.kv_shared_layer_id is None]
    sliding = [s for s in owners if s.is_sliding]
    full = [s for s in owners if not s.is_sliding]
    if not sliding:
        raise ValueError("the model has no sliding-window layers; triton_swa's pools need at least one")
    windows = sorted({s.window_left for s in specs if s.is_sliding})
    if len(windows) > 1:
        raise ValueError(f"the sliding layers have different windows (window_left {windows}); one window per model")

    def geometry(group: list[LayerSpec], kind: str) -> tuple[int, int]:
        shapes = sorted({(s.num_kv_heads, s.head_dim) for s in group})
        if len(shapes) > 1:
            raise ValueError(f"the {kind} layers have different (KV heads, head dim): {shapes}; one geometry per sub-pool")
        return shapes[0] if shapes else (None, None)

    swa_h, swa_d = geometry(sliding, "sliding")
    full_h, full_d = geometry(full, "full")
    pool = SWAKVPool(
        size,
        size_swa,
        page_size,
        dtype,
        [s.layer_id for s in sliding],
        [s.layer_id for s in full],
        device,
        swa_head_num=swa_h,
        swa_head_dim=swa_d,
        full_head_num=full_h,
        full_head_dim=full_d,
    )
    if target is None:
        allocator = SWATokenToKVPoolAllocator(size, size_swa, page_size, dtype, device, pool)
        req_to_token_pool = ReqToTokenPool(max_num_reqs, max_context_len, device)
        runner = ModelRunner(pool, allocator, req_to_token_pool, sliding_window_size=windows[0], device=device, page_size=page_size)
    else:
        # the DFlash topology: the draft's own pool, the target's slots and mapping
        allocator, req_to_token_pool = target.allocator, target.req_to_token_pool
        pool.register_mapping(allocator.full_to_swa_index_mapping)
        runner = ModelRunner(
            pool,
            allocator,
            req_to_token_pool,
            sliding_window_size=windows[0],
            device=device,
            page_size=page_size,
            is_draft_worker=True,
            spec_algorithm=SpeculativeAlgorithm.DFLASH,
        )
    return PagedKV(pool, allocator, req_to_token_pool, runner, backend_class(runner), specs)


def build_draft_paged_kv(
    draft_model, target: PagedKV, *, dtype: torch.dtype | None = None, backend_class: type = TritonSWAAttnBackend
) -> PagedKV:
    """A draft worker's pools in the Gemma 4 + DFlash topology: its own SWA-backed pool (the draft
    model's geometry, the target's sizes) that registers the target allocator's
    ``full_to_swa_index_mapping``, and the target's allocator and ``req_to_token`` pool, so that one
    full slot names one token in both pools. Its runner is a draft worker (DFLASH); the policy of docs/contract.md §3
    resolves its own active pool.

    Args:
        draft_model: a transformers causal LM with sliding layers and the target's window.
        target (PagedKV): the target's, from :func:`build_paged_kv`.
        backend_class (type): the backend to build (a subclass of ``TritonSWAAttnBackend``).

    Raises:
        ValueError: as :func:`build_paged_kv`, or the draft's window differs from the target's.
    """
    alloc = target.allocator
    kv = build_paged_kv(
        draft_model,
        size=alloc.size,
        size_swa=alloc.size_swa,
        page_size=alloc.page_size,
        max_num_reqs=target.req_to_token_pool.size,
        max_context_len=target.req_to_token_pool.max_context_len,
        dtype=dtype,
        device=target.device,
        target=target,
        backend_class=backend_class,
    )
    if kv.window_left != target.window_left:
        raise ValueError(
            f"the draft's sliding window (window_left {kv.window_left}) differs from the target's "
            f"({target.window_left}): they share one slot space and its eviction"
        )
    return kv


class ModelWorker:
    """A transformers model over its :class:`PagedKV`: the :class:`triton_swa.serving.Worker` the engine drives.

    Args:
        model: the transformers causal LM (``register()`` and ``set_attn_implementation("triton_swa")`` done).
        kv (PagedKV): its pools.
        observer: passed to every step's :class:`StepContext` (see there).
    """

    def __init__(self, model, kv: PagedKV, observer: Callable | None = None):
        self.model, self.kv, self.observer = model, kv, observer
        self.runner = kv.model_runner

    @torch.inference_mode()
    def forward(self, batch, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits `[T, vocab]` of the step's packed tokens (their K/V written to the pools)."""
        step = self.kv.context(batch, positions.view(1, -1), self.observer)
        return self.model(input_ids=input_ids.view(1, -1), **step.model_kwargs()).logits[0]


# HF attention module -> (what its AttentionLayer was made from, the layer): one layer object per module,
# so that the backend keeps its per-layer plan from call to call
_LAYERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _attention_layer(module, layer_id, hq, h, d, dv, scaling, cap, window, sinks, shared) -> AttentionLayer:
    made = (layer_id, hq, h, d, dv, scaling, cap, window, shared)
    try:
        hit = _LAYERS.get(module)
    except TypeError:  # a module without weak references: a new layer each call
        hit = None
    if hit is not None and hit[0] == made and hit[1].sinks is sinks:
        return hit[1]
    layer = AttentionLayer(
        layer_id,
        hq,
        h,
        d,
        v_head_dim=dv,
        scaling=scaling,
        logit_cap=cap,
        sliding_window_size=window,
        sinks=sinks,
        kv_shared_layer_id=shared,
    )
    try:
        _LAYERS[module] = (made, layer)
    except TypeError:
        pass
    return layer


def triton_swa_attention_forward(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None, softcap=None, s_aux=None, **kwargs
):
    """transformers' attention-function signature over triton-swa's pools, for one layer of one step.

    Writes the step's K/V of ``module.layer_idx`` (SWA slots for sliding layers; none for KV-shared
    layers, which read their source layer's) and attends with ``TritonSWAAttnBackend.forward`` in the
    step's mode.

    Args:
        module: the attention module (``layer_idx``).
        query (torch.Tensor): `[1, HQ, T, D]`, the step's new tokens packed along ``T``.
        key, value (torch.Tensor): `[1, H, T, D]` (ignored in KV-shared layers).
        attention_mask: must be None (what the registered mask builder gives).
        scaling (float | None): the softmax scale (default ``D ** -0.5``).
        sliding_window (int | None): Hugging Face's ``S``; the layer attends ``S - 1`` keys back.
        softcap (float | None): logit soft-cap (Gemma 2); ``s_aux`` (torch.Tensor | None): sinks `[HQ]` (gpt-oss).
        **kwargs: must hold ``triton_swa_step`` (a :class:`StepContext`); the rest is ignored.

    Returns:
        tuple: ``(out [1, T, HQ, D_v], None)``.

    Raises:
        ValueError: no step context, a dense mask, dropout, a bidirectional layer, a batch dimension other than 1, or K/V
            longer than the queries (an HF cache is in use: call with ``use_cache=False``).
    """
    step = kwargs.get(STEP_KWARG)
    if not isinstance(step, StepContext):
        raise ValueError(
            f"the triton_swa attention needs the step's context: call the model with {STEP_KWARG}=... "
            "(PagedKV.extend/decode/verify/context, then model(..., **step.model_kwargs()))"
        )
    if attention_mask is not None:
        raise ValueError(
            "the triton_swa attention takes no dense attention mask (register() installs its mask builder, "
            "and the model must be called without attention_mask)"
        )
    if dropout:
        raise ValueError(f"the triton_swa attention is for inference: dropout must be 0, got {dropout}")
    if getattr(module, "is_causal", True) is False:
        raise ValueError(f"layer {module.layer_idx} is bidirectional; the triton_swa attention runs causal decoders only")
    if query.dim() != 4 or query.shape[0] != 1:
        raise ValueError(f"query must be [1, HQ, T, D] (the step's tokens packed, batch dim 1), got {list(query.shape)}")
    layer_id = module.layer_idx
    _, hq, t, d = query.shape
    shared = step.kv_shared_layer_ids.get(layer_id)
    if shared is None and key.shape[2] != t:
        raise ValueError(
            f"layer {layer_id}: key has {key.shape[2]} tokens but query {t}: an HF cache is in use; call "
            "the model with use_cache=False (the pools are the cache)"
        )
    layer = _attention_layer(
        module,
        layer_id,
        hq,
        key.shape[1],
        d,
        value.shape[-1],
        d**-0.5 if scaling is None else float(scaling),
        float(softcap or 0.0),
        window_left_from_hf(sliding_window),
        s_aux,
        shared,
    )
    q = query[0].transpose(0, 1).contiguous()
    k = v = None
    if shared is None:
        k = key[0].transpose(0, 1).contiguous()
        v = value[0].transpose(0, 1).contiguous()
    out = step.backend.forward(q, k, v, layer, step.forward_batch, save_kv_cache=shared is None)
    out = out.view(t, hq, layer.v_head_dim)
    if step.observer is not None:
        step.observer(layer, q, k, v, out, step)
    return out.view(1, t, hq, layer.v_head_dim), None


def _no_dense_mask(*args, attention_mask=None, **kwargs):
    """transformers' mask-builder signature: no mask (the kernels mask per request from the step's batch).

    Raises:
        ValueError: a 2-D padding mask that masks something: the step's tokens must come packed, unpadded.
    """
    if attention_mask is not None and not bool(attention_mask.all()):
        raise ValueError(
            "the triton_swa attention takes no padding mask: pack the step's tokens of every request "
            "along one sequence (batch dim 1), without padding"
        )
    return None


def register() -> None:
    """Register ``"triton_swa"`` with transformers' ``AttentionInterface`` and ``AttentionMaskInterface`` (idempotent)."""
    AttentionInterface.register(NAME, triton_swa_attention_forward)
    AttentionMaskInterface.register(NAME, _no_dense_mask)
