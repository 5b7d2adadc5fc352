"""The layers' forward: write the step's K/V, then attend, by the planned or the checked path.

The planned path checks the step's first call of each kind of layer call in full and plans its
launches (the K/V store and ``swa_decode_plan`` / ``swa_extend_plan``, kept in the step's
``ForwardMetadata.runs``); the other calls of that kind compare their kind by a key and launch. The
checked path (the debug guard, KV-shared extend layers, anything the key cannot vouch for) checks
everything on every call and calls ``swa_decode`` / ``swa_extend``. Both write the same bytes.
"""

from __future__ import annotations

import torch

from ..ops.decode import swa_decode, swa_decode_plan
from ..ops.extend import swa_extend, swa_extend_plan
from ..ops.kv_store import store_kv, store_kv_plan
from ..runtime import poison
from ..runtime.guard import debug_enabled
from ..runtime.launch import current_stream
from .checks import _check_index
from .layers import _LayerPlan
from .metadata import ForwardMetadata, LayerIndices


def _dequantize(x: torch.Tensor, scale, dtype: torch.dtype) -> torch.Tensor:
    x = x.float()
    return (x * scale if scale is not None else x).to(dtype)


def _rows_key(t):
    """What a step's launch plan depends on of a layer call's q, k or v (None for None)."""
    return None if t is None else (t.dtype, t.shape, t.stride(), t.get_device())


_ENGINE_STORE = object()  # a run's store when a subclass writes K/V through its engine's pool


class _LayerRun:
    """A step's launches for one kind of layer call: the K/V store's plan (None: no write) and the
    attention's (``swa_decode_plan`` or ``swa_extend_plan``), with the views of q, k, v and out."""

    __slots__ = ("loc", "store", "attend", "fused_store", "k_shape", "v_shape", "q_shape", "out_cols", "dtype")

    def __init__(self, lp: _LayerPlan, loc, dtype: torch.dtype):
        _, hq, h, d, dv = lp.values[:5]
        self.loc = loc  # kept alive: the step's runs are keyed by its id
        self.q_shape, self.k_shape, self.v_shape, self.out_cols = (-1, hq, d), (-1, h, d), (-1, h, dv), hq * dv
        self.store = self.attend = None
        self.fused_store = False  # the attention's launch writes the new K/V (decode: swa_decode_plan's store_loc)
        self.dtype = dtype  # q's, and the output's


class _Forward:
    """The forward part of :class:`~triton_swa.backend.TritonSWAAttnBackend`: reads
    ``forward_metadata``, ``device``, the layer part's ``_layer_plan``, ``_layer_setup`` and
    ``_check_forward``; caches ``_last_decode_runs``. Subclasses may write K/V through their engine
    (override ``_save``, and ``_fused_store_target`` to let the kernels write it)."""

    # layers write their new K/V inside the attention kernel, decode and extend (one launch per layer
    # fewer); False stores them with their own launch first (same bytes either way)
    fuse_kv_store: bool = True

    def forward(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        """Dispatch by ``forward_batch.forward_mode`` (IDLE returns an empty output)."""
        mode = forward_batch.forward_mode
        if mode.is_idle():
            return q.new_empty(0, layer.tp_q_head_num * layer.v_head_dim)
        if mode.is_decode():
            return self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        return self.forward_extend(q, k, v, layer, forward_batch, save_kv_cache)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        """Write the new K/V (translated for sliding layers), then decode over the layer's window.

        The step's first call of each kind of layer (window, heads, scales, buffers, q/k/v layouts)
        checks everything and plans the store and the decode (:func:`~triton_swa.store_kv_plan`,
        :func:`~triton_swa.swa_decode_plan`); the other layers of that kind check their kind, by
        a key, and launch. Under the debug guard every call takes the checked path.

        Raises:
            TypeError, ValueError: a bad tensor, layer or scale, before the K/V are written.
        """
        planned = self._planned_call(q, k, v, layer, forward_batch, save_kv_cache, extend=False)
        if planned is None:
            return self._forward_decode_checked(q, k, v, layer, forward_batch, save_kv_cache)
        lp, k_buf, v_buf, run, out = planned
        (k_f, k_t), (v_f, v_t) = lp.scales
        fused = run.fused_store
        if lp.decode_ptrs is not None and run.attend._run_layer(q, out, lp.decode_ptrs, k_f, v_f, *((k, v) if fused else ())):
            return out
        new = (k, v, *lp.store_views) if fused else None
        return run.attend._launch(q, k_buf, v_buf, out, lp.values[9], k_f, k_t, v_f, v_t, new)

    def _planned_call(self, q, k, v, layer, forward_batch, save_kv_cache, *, extend: bool):
        """The planned path's part common to decode and extend: the layer's plan, the step's run for
        this kind of call (planned by its first call), the K/V store, and the output; returns ``(layer
        plan, k_buffer, v_buffer, run, out)``, or None where the checked path must take the call (no
        metadata, the debug guard, something not a layer or not tensors, a KV-shared extend layer)."""
        meta = self.forward_metadata
        if meta is None or debug_enabled(None):
            return None
        try:
            lp, k_buf, v_buf = self._layer_plan(layer)
            loc = getattr(forward_batch, "out_cache_loc", None)
            key = (lp.kind, _rows_key(q), _rows_key(k), _rows_key(v), bool(save_kv_cache), id(loc))
        except AttributeError:  # not a layer, or q, k, v not tensors: the checks name it
            return None
        if extend and (lp.values[7] is not None or k is None):  # KV-shared: the new K/V come from the pool
            return None
        run = meta.runs.get(key)
        if run is None:
            if extend:
                run = self._plan_extend(q, k, v, layer, lp, k_buf, v_buf, loc, forward_batch, save_kv_cache)
            else:
                # the same kind's previous run on this stream (another stream's may still be running);
                # a graph being captured keeps a workspace of its own, as its replays outlive the step
                cuda = self.device.type == "cuda"
                kind = (key[:-1], current_stream(self.device.index) if cuda else None)
                eager = not (cuda and torch.cuda.is_current_stream_capturing())
                last = self._last_decode_runs.get(kind) if eager else None
                run = self._plan_decode(q, k, v, layer, lp, k_buf, v_buf, loc, forward_batch, save_kv_cache, last)
                if eager:
                    self._last_decode_runs[kind] = run
            meta.runs[key] = run
        if run.store is _ENGINE_STORE:
            # as the checked paths hand it over: decode's rows as given, extend's viewed per head
            kv = (k.view(run.k_shape), v.view(run.v_shape)) if extend else (k, v)
            self._save(layer, *kv, k_buf, v_buf, lp.write_mapping, forward_batch)
        elif run.store is not None:
            run.store._launch(*lp.store_views, k, v, *lp.scales[0], *lp.scales[1])
        # q and the output as given / returned ([T, HQ * D], [T, HQ * Dv]): the plans read them by pointer
        out = poison.empty(q.shape[0], run.out_cols, dtype=run.dtype, device=self.device)
        return lp, k_buf, v_buf, run, out

    def _plan_decode(self, q, k, v, layer, lp, k_buf, v_buf, loc, forward_batch, save_kv_cache, last=None) -> _LayerRun:
        """Check a decode layer call in full and plan the step's launches for its kind (taking over the
        workspace of ``last``, the previous step's run of the kind, where the plans match)."""
        if last is not None and last.fused_store:
            run = self._follow_decode(q, k, v, lp, loc, last)
            if run is not None:
                return run
        writes = self._check_forward(q, k, v, layer, forward_batch, save_kv_cache, k_buf, v_buf, extend=False)
        _, _, _, _, _, scaling, _, _, cap, sinks, k_scale, v_scale, _ = lp.values
        run = _LayerRun(lp, loc, q.dtype)
        k_new, v_new = (k.view(run.k_shape), v.view(run.v_shape)) if writes else (None, None)
        # the decode kernel writes the new K/V itself (one launch fewer) where that writes what the store would
        store = {}
        target = self._fused_store_target(lp, loc, k_new, v_new) if writes and self.fuse_kv_store else None
        if target is not None:
            run.fused_store = True
            store = dict(store_loc=target[0], store_mapping=target[1], k_new=k_new, v_new=v_new)
        elif writes:
            run.store = self._store_plan(lp, k_buf, v_buf, loc, k_new, v_new)
        meta = self.forward_metadata
        idx = meta.sliding if lp.sliding else meta.full
        run.attend = swa_decode_plan(
            q.view(run.q_shape),
            k_buf,
            v_buf,
            **idx.kernel_args(decode=True),
            sm_scale=scaling,
            logit_cap=cap,
            sinks=sinks,
            k_scale=k_scale,
            v_scale=v_scale,
            max_window=max(idx.max_window, 1),
            reuse=None if last is None else last.attend,
            **store,
        )
        return run

    def _follow_decode(self, q, k, v, lp, loc, last: _LayerRun) -> _LayerRun | None:
        """The step's run of a kind of decode call whose previous step's run ``last`` (same kind key:
        layer kind, q/k/v layouts, writing) fused its store: the same plans over this step's windows
        and slots (``DecodePlan._next_step``). What the kind key does not vouch for is checked here:
        the step's token count and ``out_cache_loc``. None (nothing changed) where a full plan is
        needed: the store target or a window or slot tensor of another kind."""
        meta = self.forward_metadata
        T = meta.num_tokens
        if q.shape[0] != T or k is None or k.shape[0] != T:
            return None  # the checks name it
        _check_index("forward_batch.out_cache_loc", loc, self.device, T)
        run = _LayerRun(lp, loc, q.dtype)
        target = self._fused_store_target(lp, loc, k.view(run.k_shape), v.view(run.v_shape))
        if target is None:
            return None
        idx = meta.sliding if lp.sliding else meta.full
        attend = last.attend._next_step(
            **idx.kernel_args(decode=True), max_window=max(idx.max_window, 1), store_loc=target[0], store_mapping=target[1]
        )
        if attend is None:
            return None
        run.attend, run.fused_store = attend, True
        return run

    def _fused_store_target(self, lp, loc, k, v):
        """``(slots, mapping)`` at which the decode kernel may write a layer's new K/V itself (the same
        bytes as the layer's store), or None to keep the store: this backend's own store always; an
        engine's (a subclass's ``_save``) when the subclass says so by overriding this."""
        if type(self)._save is not _Forward._save:
            return None
        return loc, lp.write_mapping

    def _store_plan(self, lp, k_buf, v_buf, loc, k, v):
        """The K/V store of a kind of layer call: planned here, or the engine's (a subclass's ``_save``)."""
        if type(self)._save is not _Forward._save:
            return _ENGINE_STORE
        k_scale, v_scale = lp.values[10:12]
        return store_kv_plan(k_buf, v_buf, loc, k, v, mapping=lp.write_mapping, k_scale=k_scale, v_scale=v_scale)

    def _forward_decode_checked(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        """:meth:`forward_decode` with every check on every call (the debug guard's path)."""
        k_buf, v_buf, idx, write_mapping = self._layer_setup(layer)
        if self._check_forward(q, k, v, layer, forward_batch, save_kv_cache, k_buf, v_buf, extend=False):
            self._save(layer, k, v, k_buf, v_buf, write_mapping, forward_batch)
        q = q.view(-1, layer.tp_q_head_num, layer.head_dim)
        out = swa_decode(
            q,
            k_buf,
            v_buf,
            **idx.kernel_args(decode=True),
            sm_scale=layer.scaling,
            logit_cap=getattr(layer, "logit_cap", 0.0),
            sinks=getattr(layer, "sinks", None),
            k_scale=getattr(layer, "k_scale", None),
            v_scale=getattr(layer, "v_scale", None),
            max_window=max(idx.max_window, 1),
        )
        return out.view(-1, layer.tp_q_head_num * layer.v_head_dim)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        """Write the new K/V, then attend the cached window prefix and the new tokens.

        Planned once per step and kind of layer, as :meth:`forward_decode` (with
        :func:`~triton_swa.swa_extend_plan`); KV-shared layers and the debug guard take the checked path.

        Raises:
            TypeError, ValueError: a bad tensor, layer or scale, before the K/V are written.
        """
        planned = self._planned_call(q, k, v, layer, forward_batch, save_kv_cache, extend=True)
        if planned is None:
            return self._forward_extend_checked(q, k, v, layer, forward_batch, save_kv_cache)
        lp, k_buf, v_buf, run, out = planned
        (k_f, k_t), (v_f, v_t) = lp.scales
        stores = lp.store_views if run.fused_store else None
        return run.attend._launch(q, k, v, k_buf, v_buf, out, lp.values[9], k_f, k_t, v_f, v_t, stores)

    def _plan_extend(self, q, k, v, layer, lp, k_buf, v_buf, loc, forward_batch, save_kv_cache) -> _LayerRun:
        """Check an extend layer call in full and plan the step's launches for its kind."""
        writes = self._check_forward(q, k, v, layer, forward_batch, save_kv_cache, k_buf, v_buf, extend=True)
        run = _LayerRun(lp, loc, q.dtype)
        kv = (k.view(run.k_shape), v.view(run.v_shape))
        # the extend kernel writes the new K/V itself (one launch fewer) where that writes what the store
        # would, into [slots, H, D] buffers
        store = {}
        target = self._fused_store_target(lp, loc, *kv) if writes and self.fuse_kv_store and k_buf.dim() == 3 else None
        if target is not None:
            run.fused_store = True
            store = dict(store_loc=target[0], store_mapping=target[1])
        elif writes:
            run.store = self._store_plan(lp, k_buf, v_buf, loc, *kv)
        meta = self.forward_metadata
        idx = meta.sliding if lp.sliding else meta.full
        run.attend = swa_extend_plan(q.view(run.q_shape), *kv, k_buf, v_buf, **self._extend_kwargs(layer, idx, meta), **store)
        return run

    def _extend_kwargs(self, layer, idx: LayerIndices, meta: ForwardMetadata) -> dict:
        """``swa_extend``'s arguments beside the tensors, for a layer of this step."""
        window = layer.sliding_window_size
        # eager EXTEND / DRAFT_EXTEND_V2: the batch's longest prefix (capped at the window); verify, eager
        # or replayed: the layer's bound, so that both take the same splits
        max_window = meta.max_prefix_len
        if max_window is None:
            max_window = idx.max_window
        elif window >= 0:
            max_window = min(max_window, window)
        return dict(
            qo_indptr=meta.qo_indptr,
            prefix_lens=meta.prefix_lens,
            **idx.kernel_args(decode=False),
            window_left=window,
            causal=meta.causal and bool(getattr(layer, "causal", True)),
            custom_mask=meta.custom_mask,
            mask_indptr=meta.mask_indptr,
            q_positions=meta.q_positions,
            sm_scale=layer.scaling,
            logit_cap=getattr(layer, "logit_cap", 0.0),
            sinks=getattr(layer, "sinks", None),
            k_scale=getattr(layer, "k_scale", None),
            v_scale=getattr(layer, "v_scale", None),
            max_extend_len=meta.max_extend_len,
            max_window=max_window,
        )

    def _forward_extend_checked(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        """:meth:`forward_extend` with every check on every call (the debug guard's path, KV-shared layers)."""
        k_buf, v_buf, idx, write_mapping = self._layer_setup(layer)
        writes = self._check_forward(q, k, v, layer, forward_batch, save_kv_cache, k_buf, v_buf, extend=True)
        meta = self.forward_metadata
        q = q.view(-1, layer.tp_q_head_num, layer.head_dim)
        k_scale, v_scale = getattr(layer, "k_scale", None), getattr(layer, "v_scale", None)
        if getattr(layer, "kv_shared_layer_id", None) is not None:
            # The new tokens' K/V live in the shared layer's buffers, written by that layer.
            loc = forward_batch.out_cache_loc.long()
            if write_mapping is not None:
                loc = write_mapping[loc]
            k = _dequantize(k_buf[loc], k_scale, q.dtype)
            v = _dequantize(v_buf[loc], v_scale, q.dtype)
        else:
            k = k.view(-1, layer.tp_k_head_num, layer.head_dim)
            v = v.view(-1, layer.tp_k_head_num, layer.v_head_dim)
            if writes:
                self._save(layer, k, v, k_buf, v_buf, write_mapping, forward_batch)
        kwargs = self._extend_kwargs(layer, idx, meta)
        qo_indptr, prefix_lens = kwargs.pop("qo_indptr"), kwargs.pop("prefix_lens")
        out = swa_extend(q, k, v, k_buf, v_buf, qo_indptr, prefix_lens, **kwargs)
        return out.view(-1, layer.tp_q_head_num * layer.v_head_dim)

    def _save(self, layer, k, v, k_buf, v_buf, write_mapping, forward_batch):
        store_kv(
            k_buf,
            v_buf,
            forward_batch.out_cache_loc,
            k.view(-1, layer.tp_k_head_num, layer.head_dim),
            v.view(-1, layer.tp_k_head_num, layer.v_head_dim),
            mapping=write_mapping,
            k_scale=getattr(layer, "k_scale", None),
            v_scale=getattr(layer, "v_scale", None),
        )
