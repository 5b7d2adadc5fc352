"""Layers: each layer call's checks, and the plan of a layer that its later calls reuse.

:meth:`_LayerPlans._layer_setup` and :meth:`_LayerPlans._check_forward` are the checks of the checked
path (every call under the debug guard, KV-shared extend layers); :meth:`_LayerPlans._layer_plan` makes
a layer's :class:`_LayerPlan` on its first call (again when an attribute, the pool or its buffers
change), and the planned path (:mod:`triton_swa.backend.forward`) keys a step's launches by its kind.
"""

from __future__ import annotations

import operator

import torch

from ..ops.kv_store import KVStorePlan
from ..runtime.checks import FLOAT_DTYPES, FP8_DTYPES, check_kv_scale, check_logit_cap, check_sinks, check_sm_scale, split_kv_scale
from ..runtime.plans import tensor_key
from .checks import _as_int, _check_index, _check_rows

_LAYER_ATTRS = ("layer_id", "tp_q_head_num", "tp_k_head_num", "head_dim", "v_head_dim", "scaling", "sliding_window_size")


def _layer_values(layer) -> tuple:
    """Every attribute of a layer that its launches depend on (a layer plan is valid while each is the
    same object)."""
    return (
        layer.layer_id,
        layer.tp_q_head_num,
        layer.tp_k_head_num,
        layer.head_dim,
        layer.v_head_dim,
        layer.scaling,
        layer.sliding_window_size,
        getattr(layer, "kv_shared_layer_id", None),
        getattr(layer, "logit_cap", 0.0),
        getattr(layer, "sinks", None),
        getattr(layer, "k_scale", None),
        getattr(layer, "v_scale", None),
        getattr(layer, "causal", True),
    )


class _LayerPlan:
    """What a layer's calls share from step to step: its buffers, window kind and checked attributes.

    Valid while the layer's attributes are the same objects (``values``), the pool is the same and the
    pool hands out the same buffers (``buffers``).
    """

    __slots__ = (
        "layer",
        "values",
        "pool",
        "kv_layer",
        "buffers",
        "k_buf",
        "v_buf",
        "store_views",
        "sliding",
        "write_mapping",
        "kind",
        "scales",
        "decode_ptrs",
    )

    def __init__(self, layer, values, pool, kv_layer, k_buf, v_buf, sliding, write_mapping):
        self.layer, self.values, self.pool, self.kv_layer = layer, values, pool, kv_layer
        self.k_buf, self.v_buf, self.sliding, self.write_mapping = k_buf, v_buf, sliding, write_mapping
        self.buffers = (k_buf.data_ptr(), v_buf.data_ptr())
        self.store_views = KVStorePlan.views(k_buf, v_buf)  # the buffers as the store kernel writes them
        # what a step's launch plan depends on, beside q, k and v: layers of one kind share a plan
        _, hq, h, d, dv, scaling, _, shared, cap, sinks, k_scale, v_scale, causal = values
        self.kind = _kind_id(
            sliding,
            write_mapping is not None,
            hq,
            h,
            d,
            dv,
            scaling,
            shared is not None,
            cap,
            tensor_key(sinks),
            _scale_kind(k_scale),
            _scale_kind(v_scale),
            causal,
            tensor_key(k_buf),
            tensor_key(v_buf),
        )
        # (host factor, tensor) of each scale, as the decode and store kernels take them
        self.scales = (split_kv_scale("k_scale", k_scale), split_kv_scale("v_scale", v_scale))
        # the layer's own pointers as a decode plan's direct launch takes them (the K buffer standing
        # in for an absent tensor), or None where one is not 16-byte aligned
        kp, vp = self.buffers
        own = (sinks, self.scales[0][1], self.scales[1][1])
        ptrs = (kp, vp, *(kp if t is None else t.data_ptr() for t in own), *(t.data_ptr() for t in self.store_views))
        self.decode_ptrs = ptrs if all(p & 15 == 0 for p in ptrs) else None


_KINDS: dict = {}  # kinds of layer seen by this process -> small ints (cheap to hash in a step's keys)


def _kind_id(*kind) -> int:
    return _KINDS.setdefault(kind, len(_KINDS))


def _scale_kind(s):
    return tensor_key(s) if isinstance(s, torch.Tensor) else (s is None)


class _LayerPlans:
    """The per-layer part of :class:`~triton_swa.backend.TritonSWAAttnBackend`: reads
    ``forward_metadata``, ``kv_pool``, ``device``, ``sliding_window_size``, ``use_sliding_window_kv_pool``;
    caches ``_layer_plans``."""

    def _layer_setup(self, layer):
        """(k_buffer, v_buffer, indices, write_mapping) for a layer; checks its window against the step's.

        Reads follow the resolved policy (``meta.sliding`` is translated iff an SWA pool was
        resolved). Writes follow the pool, as SGLang's ``SWAKVPool.set_kv_buffer`` does: a layer in
        an SWA sub-pool is written at ``mapping[loc]``. Under the policy the two agree; under the
        legacy rule they can disagree, which is the bug the policy fixes.
        """
        meta = self.forward_metadata
        if meta is None:
            raise ValueError("init_forward_metadata must run before the layers")
        for name in _LAYER_ATTRS:
            if not hasattr(layer, name):
                raise TypeError(f"layer has no attribute {name!r} (a RadixAttention-like layer has {', '.join(_LAYER_ATTRS)})")
        layer_id = _as_int("layer.layer_id", layer.layer_id, 0)
        shared = getattr(layer, "kv_shared_layer_id", None)
        kv_layer = layer_id if shared is None else _as_int("layer.kv_shared_layer_id", shared, 0)
        window = _as_int(f"layer {layer_id}: sliding_window_size", layer.sliding_window_size, -1)
        k_buf, v_buf = self.kv_pool.get_kv_buffer(kv_layer)
        sliding = window >= 0
        if sliding and window != self.sliding_window_size:
            raise ValueError(
                f"layer {layer_id} has sliding_window_size {window} but the runner's is {self.sliding_window_size}: one window per model"
            )
        layers_mapping = getattr(self.kv_pool, "layers_mapping", None)
        in_swa_pool = self._kv_pool_is_swa and bool(layers_mapping[kv_layer][1])
        if sliding and self.use_sliding_window_kv_pool and not in_swa_pool:
            raise ValueError(
                f"layer {layer_id} is sliding but not in the SWA sub-pool; it cannot share the sliding layers' translated indices"
            )
        if not sliding and in_swa_pool:
            raise ValueError(
                f"layer {layer_id} is declared full (sliding_window_size=-1) but its K/V (layer "
                f"{kv_layer}) live in the SWA sub-pool (layers_mapping[{kv_layer}] = "
                f"{tuple(layers_mapping[kv_layer])}): it would read SWA buffers at full-slot indices"
            )
        write_mapping = self.kv_pool.full_to_swa_index_mapping if in_swa_pool else None
        return k_buf, v_buf, (meta.sliding if sliding else meta.full), write_mapping

    def _check_layer(self, layer, k_buf, v_buf) -> tuple[int, int, int, int]:
        """The checks of a layer alone (heads against its buffers, scales, caps, sinks); returns
        ``(HQ, H, D, DV)``."""
        dev = self.device
        lid = layer.layer_id
        HQ = _as_int(f"layer {lid}: tp_q_head_num", layer.tp_q_head_num, 1)
        H = _as_int(f"layer {lid}: tp_k_head_num", layer.tp_k_head_num, 1)
        D = _as_int(f"layer {lid}: head_dim", layer.head_dim, 1)
        DV = _as_int(f"layer {lid}: v_head_dim", layer.v_head_dim, 1)
        if HQ % H:
            raise ValueError(f"layer {lid}: tp_q_head_num ({HQ}) must be a multiple of tp_k_head_num ({H})")
        if tuple(k_buf.shape[-2:]) != (H, D) or tuple(v_buf.shape[-2:]) != (H, DV):
            raise ValueError(
                f"layer {lid}: tp_k_head_num={H}, head_dim={D}, v_head_dim={DV} disagree with its KV "
                f"pool's buffers (K {list(k_buf.shape)}, V {list(v_buf.shape)})"
            )
        check_sinks(f"layer {lid}: sinks", getattr(layer, "sinks", None), HQ, dev)
        if layer.scaling is None:
            raise TypeError(f"layer {lid}: scaling must be a float, got None")
        check_sm_scale(layer.scaling, None, f"layer {lid}: scaling")
        check_logit_cap(getattr(layer, "logit_cap", 0.0), f"layer {lid}: logit_cap")
        check_kv_scale(f"layer {lid}: k_scale", getattr(layer, "k_scale", None), dev)
        check_kv_scale(f"layer {lid}: v_scale", getattr(layer, "v_scale", None), dev)
        return HQ, H, D, DV

    def _check_forward(self, q, k, v, layer, forward_batch, save_kv_cache, k_buf, v_buf, *, extend: bool) -> bool:
        """Every host-side check a layer's forward needs, before anything is written.

        Returns whether this call writes the step's K/V.
        """
        meta, dev = self.forward_metadata, self.device
        lid = layer.layer_id
        HQ, H, D, DV = self._check_layer(layer, k_buf, v_buf)
        T = meta.num_tokens
        _check_rows("q", q, T, HQ, D, FLOAT_DTYPES, dev)
        if k_buf.dtype not in (q.dtype, *FP8_DTYPES):
            raise TypeError(
                f"q has dtype {q.dtype} but layer {lid}'s KV pool holds {k_buf.dtype} (q's dtype or fp8 e4m3fn / e4m3fnuz expected)"
            )
        shared = getattr(layer, "kv_shared_layer_id", None) is not None
        if extend and not shared and (k is None or v is None):
            raise ValueError(f"layer {lid}: extend modes need the step's k and v")
        if (k is None) != (v is None):
            raise ValueError("give both k and v, or neither")
        if k is not None and not shared:
            _check_rows("k", k, T, H, D, (q.dtype,), dev)
            _check_rows("v", v, T, H, DV, (q.dtype,), dev)
        writes = bool(save_kv_cache) and not shared and k is not None
        if writes or (extend and shared):
            loc = getattr(forward_batch, "out_cache_loc", None)
            if loc is None:
                raise ValueError(f"layer {lid}: forward_batch.out_cache_loc is needed to {'write' if writes else 'read'} the step's K/V")
            _check_index("forward_batch.out_cache_loc", loc, dev, T)
        return writes

    def _layer_plan(self, layer):
        """``(plan, k_buffer, v_buffer)`` of a layer: its checked setup, made on its first call (and
        again when an attribute, the pool or the pool's buffers change)."""
        values = _layer_values(layer)
        lp = self._layer_plans.get(id(layer))
        pool = self.kv_pool
        if lp is not None and lp.pool is pool and lp.layer is layer and all(map(operator.is_, values, lp.values)):
            k_buf, v_buf = pool.get_kv_buffer(lp.kv_layer)
            if (k_buf.data_ptr(), v_buf.data_ptr()) == lp.buffers:
                return lp, k_buf, v_buf
        k_buf, v_buf, _, write_mapping = self._layer_setup(layer)
        self._check_layer(layer, k_buf, v_buf)
        shared = values[7]
        kv_layer = values[0] if shared is None else shared
        lp = _LayerPlan(layer, values, pool, kv_layer, k_buf, v_buf, values[6] >= 0, write_mapping)
        self._layer_plans[id(layer)] = lp
        return lp, k_buf, v_buf
