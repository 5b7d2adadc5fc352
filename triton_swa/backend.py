"""The attention backend: SGLang's pool-resolution policy, per-step metadata, per-layer dispatch.

``TritonSWAAttnBackend(model_runner)`` is shaped like an SGLang attention backend. Once per step,
``init_forward_metadata`` builds the window indices of the sliding layers (built from
``req_to_token`` and translated to SWA slots in one fused launch) and the indices of the full
layers; every layer then reuses them. This module holds no Triton code: it turns pool state into
kernel arguments.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch

from .engine import ForwardMode
from .mem.pools import is_swa_kv_pool
from .ops.decode import swa_decode, swa_decode_plan
from .ops.extend import swa_extend, swa_extend_plan
from .ops.indices import (
    WindowIndices,
    WindowPageTable,
    _window_lists_plan,
    build_window_indices,
    build_window_page_table,
    max_window_len,
    max_window_pages,
    window_count_of,
)
from .ops.kv_store import KVStorePlan, store_kv, store_kv_plan
from .runtime import poison
from .runtime.checks import (
    FLOAT_DTYPES,
    FP8_DTYPES,
    INDEX_DTYPES,
    check_kv_scale,
    check_logit_cap,
    check_sinks,
    check_sm_scale,
    check_tensor,
    split_kv_scale,
)
from .runtime.guard import check_forward_batch, check_forward_metadata, debug_enabled
from .runtime.launch import current_stream
from .runtime.plans import tensor_key


def _dequantize(x: torch.Tensor, scale, dtype: torch.dtype) -> torch.Tensor:
    x = x.float()
    return (x * scale if scale is not None else x).to(dtype)


@dataclass
class LayerIndices:
    """Window indices of one kind of layer (sliding or full) for the current step.

    Page size 1: a CSR list (``kv_indptr``, ``kv_indices``). Larger pages: a page table of the
    windows (``page_table``), a quarter to a sixty-fourth of the index bytes and the kernels' faster
    paged path.
    """

    kv_indptr: torch.Tensor | None  # int32 [B + 1] (CSR form)
    kv_indices: torch.Tensor | None  # int32 slots (SWA slots for translated sliding layers)
    page_table: torch.Tensor | None  # int32 [B, max_pages] (page-table form)
    window_starts: torch.Tensor  # int32 [B], first position of each window
    window_ends: torch.Tensor  # [B], one past the last position (seq_lens or prefix_lens)
    page_size: int
    max_window: int  # the most keys any request's window can hold (sizes the decode splits)
    translated: bool

    def kernel_args(self, *, decode: bool) -> dict:
        """The window arguments of ``swa_decode`` (``decode``) or ``swa_extend``."""
        if self.page_table is None:
            return dict(kv_indptr=self.kv_indptr, kv_indices=self.kv_indices)
        args = dict(page_table=self.page_table, window_starts=self.window_starts, page_size=self.page_size)
        if decode:
            args["seq_lens"] = self.window_ends
        return args


@dataclass
class ForwardMetadata:
    """Everything the layers of one step share."""

    forward_mode: ForwardMode
    full: LayerIndices | None
    sliding: LayerIndices | None
    # rows of q, k and v every layer of the step must bring (host ints, checked before any write)
    batch_size: int = 0
    num_tokens: int = 0
    qo_indptr: torch.Tensor | None = None  # int32 [B + 1], extend modes
    prefix_lens: torch.Tensor | None = None  # int32 [B], extend modes
    prefix_lens_cpu: torch.Tensor | None = None
    max_extend_len: int = 0
    # longest cached prefix of an eager EXTEND / DRAFT_EXTEND_V2 batch (None: verify, whose split
    # count follows the layer's window bound, as under CUDA-graph replay)
    max_prefix_len: int | None = None
    causal: bool = True
    custom_mask: torch.Tensor | None = None
    mask_indptr: torch.Tensor | None = None
    q_positions: torch.Tensor | None = None
    # the step's launch plans, one per kind of layer call (see TritonSWAAttnBackend._layer_run)
    runs: dict = field(default_factory=dict, repr=False)


_MASK_DTYPES = (torch.bool, torch.uint8, torch.int8)
_RUNNER_ATTRS = ("token_to_kv_pool", "token_to_kv_pool_allocator", "req_to_token_pool", "is_draft_worker", "spec_algorithm", "device")
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


def _rows_key(t):
    """What a step's launch plan depends on of a layer call's q, k or v (None for None)."""
    return None if t is None else (t.dtype, t.shape, t.stride(), t.get_device())


def _batch_kind(fb, mode) -> tuple:
    """What a DECODE or TARGET_VERIFY batch's checks depend on beside the lengths' values: the mode,
    batch size, tensor kinds and (verify) the draft count and spec_info's kinds."""
    spec = fb.spec_info if mode.is_target_verify() else None
    spec_kind = None
    if spec is not None:
        spec_kind = (
            type(spec.draft_token_num),
            spec.draft_token_num,
            type(spec.causal),
            tensor_key(getattr(spec, "custom_mask", None)),
            tensor_key(getattr(spec, "positions", None)),
        )
    bs = fb.batch_size
    return (
        mode,
        type(bs),
        bs,
        tensor_key(fb.req_pool_indices),
        tensor_key(fb.seq_lens),
        tensor_key(fb.seq_lens_cpu),
        tensor_key(fb.out_cache_loc),
        spec_kind,
    )


def _scale_kind(s):
    return tensor_key(s) if isinstance(s, torch.Tensor) else (s is None)


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


def _as_int(name: str, value, minimum: int | None = None) -> int:
    """``value`` as an int (Python or numpy/torch integer scalars, not bools), or raise naming ``name``."""
    if isinstance(value, bool) or isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_rows(name: str, x, rows: int, heads: int, dim: int, dtype, device) -> None:
    """``x`` is ``[rows, heads * dim]`` or ``[rows, heads, dim]`` (last stride 1) of ``dtype``."""
    check_tensor(name, x, dtype=dtype, device=device)
    ok = (x.dim() == 3 and tuple(x.shape) == (rows, heads, dim)) or (x.dim() == 2 and tuple(x.shape) == (rows, heads * dim))
    if not ok:
        raise ValueError(
            f"{name} must have shape [{rows}, {heads * dim}] or [{rows}, {heads}, {dim}] "
            f"(tokens, heads, head dim of the layer and step), got {list(x.shape)}"
        )
    if x.numel() and x.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous along its last dimension (strides {x.stride()})")


def _check_index(name: str, x, device, length: int | None = None, why: str = "") -> torch.Tensor:
    check_tensor(name, x, dtype=INDEX_DTYPES, device=device, ndim=1)
    if length is not None and x.shape[0] != length:
        raise ValueError(f"{name} must have {length} entries{f' ({why})' if why else ''}, got {x.shape[0]}")
    return x


class TritonSWAAttnBackend:
    """Paged sliding-window attention for a hybrid model (sliding and full layers).

    Every input of a step is checked on the host before anything is written: a bad batch raises in
    ``init_forward_metadata``, a bad tensor or layer in ``forward`` before the step's K/V are saved.

    Args:
        model_runner: an object with SGLang's ``ModelRunner`` attribute names (see
            :class:`triton_swa.engine.ModelRunner`): ``token_to_kv_pool``,
            ``token_to_kv_pool_allocator``, ``req_to_token_pool``, ``is_draft_worker``,
            ``spec_algorithm``, ``sliding_window_size``, ``device``.

    Raises:
        TypeError: ``model_runner`` lacks one of those attributes (named), or one has the wrong type.
        ValueError: an SWA pool was resolved but ``sliding_window_size`` is -1, or a bad device.
    """

    # layers write their new K/V inside the attention kernel, decode and extend (one launch per layer
    # fewer); False stores them with their own launch first (same bytes either way)
    fuse_kv_store: bool = True

    def __init__(self, model_runner):
        for name in _RUNNER_ATTRS:
            if not hasattr(model_runner, name):
                raise TypeError(
                    f"model_runner has no attribute {name!r}; the backend reads SGLang's ModelRunner "
                    f"names: {', '.join(_RUNNER_ATTRS)}, sliding_window_size"
                )
        self.model_runner = model_runner
        try:
            self.device = torch.device(model_runner.device)
        except (TypeError, RuntimeError) as e:
            raise ValueError(f"model_runner.device must name a torch device, got {model_runner.device!r}") from e
        if not hasattr(model_runner.req_to_token_pool, "req_to_token"):
            raise TypeError(
                "model_runner.req_to_token_pool has no attribute 'req_to_token' (the int32 [rows, max_context_len] table of full slots)"
            )
        self.req_to_token = check_tensor(
            "model_runner.req_to_token_pool.req_to_token",
            model_runner.req_to_token_pool.req_to_token,
            dtype=torch.int32,
            ndim=2,
            device=self.device,
        )
        window = getattr(model_runner, "sliding_window_size", -1)
        self.sliding_window_size = -1 if window is None else _as_int("model_runner.sliding_window_size", window, -1)
        if not isinstance(model_runner.is_draft_worker, bool):
            raise TypeError(f"model_runner.is_draft_worker must be a bool, got {type(model_runner.is_draft_worker).__name__}")
        if not hasattr(model_runner.spec_algorithm, "is_frozen_kv_mtp"):
            raise TypeError(
                "model_runner.spec_algorithm must be a SpeculativeAlgorithm (with is_frozen_kv_mtp()), "
                f"got {type(model_runner.spec_algorithm).__name__}"
            )
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
        self.page_size = _as_int("kv_pool.page_size", getattr(self.kv_pool, "page_size", 1) or 1, 1)
        self.forward_metadata: ForwardMetadata | None = None
        self.cuda_graph: dict | None = None
        self._layer_plans: dict = {}  # id(layer) -> _LayerPlan
        # the latest eager run of each kind of decode call (its key but the step's slots) per stream: the
        # next eager step's plan of that kind on that stream takes over its workspace (stream order)
        self._last_decode_runs: dict = {}
        self._checked_batches: dict = {}  # kind of DECODE / TARGET_VERIFY batch -> (tokens, drafts)
        self._max_windows: dict = {}  # (window_left, extend) -> the kernels' max_window
        self._window_plans: dict = {}  # extend -> the CSR window builds of the latest kind of eager step

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
        page_size = _as_int("kv_pool.page_size", getattr(pool, "page_size", 1) or 1, 1)
        if page_size != self.page_size:
            raise ValueError(f"the KV pool's page_size is {page_size} but the backend's indices are built for page_size {self.page_size}")
        self._kv_pool_is_swa = is_swa_kv_pool(pool)
        self.kv_pool = pool

    @staticmethod
    def _resolve_swa_kv_pool(model_runner):
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

    # ----- per-step metadata -------------------------------------------------------------------

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

    @staticmethod
    def _index_count(lens_host, window_left: int, extend: bool) -> int:
        """The CSR length of a step's windows from the lengths' host values (no device read)."""
        if lens_host and min(lens_host) < 0:
            raise ValueError(f"the step's {'prefix' if extend else 'sequence'} lengths must be >= 0, got {min(lens_host)}")
        return window_count_of(lens_host, window_left, extend)

    def _step_indices(self, req_pool_indices, lens, lens_host, *, extend: bool, debug: bool) -> tuple:
        """The eager step's ``(full, sliding)`` indices (sliding None without sliding layers). Pages of
        one token: both CSR lists in one launch, through the plan of the latest step of its kind (the
        inputs' kinds checked once, then compared); the debug guard's path builds each with the public
        :func:`~triton_swa.ops.indices.build_window_indices`."""
        w = self.sliding_window_size
        translate = self.use_sliding_window_kv_pool
        if self.page_size > 1 or debug:
            full = self._indices(req_pool_indices, lens, lens_host, window_left=-1, extend=extend, translate=False)
            sliding = None
            if w >= 0:
                sliding = self._indices(req_pool_indices, lens, lens_host, window_left=w, extend=extend, translate=translate)
            return full, sliding
        mapping = self._mapping_for(translate)
        num_full = self._index_count(lens_host, -1, extend)
        num_window = self._index_count(lens_host, w, extend) if w >= 0 else None
        plan = self._window_plans.get(extend)
        built = None if plan is None else plan.run(self.req_to_token, req_pool_indices, lens, mapping, num_full, num_window)
        if built is None:
            plan = _window_lists_plan(self.req_to_token, req_pool_indices, lens, window_left=w, extend=extend, mapping=mapping)
            self._window_plans[extend] = plan
            built = plan.run(self.req_to_token, req_pool_indices, lens, mapping, num_full, num_window)
        full, window = built
        full = self._layer_indices(full.kv_indptr, full.kv_indices, None, full.window_starts, lens, -1, extend, False)
        if window is not None:
            window = self._layer_indices(window.kv_indptr, window.kv_indices, None, window.window_starts, lens, w, extend, translate)
        return full, window

    def _indices(self, req_pool_indices, lens, lens_host=None, *, window_left, extend, translate, out=None):
        """One fused launch: every request's window (SWA slots or pages when ``translate``).

        ``out`` holds the fixed buffers of a CUDA graph; otherwise the CSR length comes from
        ``lens_host``, the lengths' host values (no host synchronisation).
        """
        mapping = self._mapping_for(translate)
        max_ctx = self.req_to_token.shape[1]
        prefix_lens = lens if extend else None
        if self.page_size == 1:
            built = build_window_indices(
                self.req_to_token,
                req_pool_indices,
                lens,
                window_left=window_left,
                prefix_lens=prefix_lens,
                mapping=mapping,
                num_indices=None if out is not None else self._index_count(lens_host, window_left, extend),
                out=out,
            )
            return self._layer_indices(built.kv_indptr, built.kv_indices, None, built.window_starts, lens, window_left, extend, translate)
        max_pages = None if out is not None else max_window_pages(window_left, self.page_size, max_ctx, extend=extend)
        built = build_window_page_table(
            self.req_to_token,
            req_pool_indices,
            lens,
            window_left=window_left,
            page_size=self.page_size,
            prefix_lens=prefix_lens,
            mapping=mapping,
            max_pages=max_pages,
            out=out,
        )
        return self._layer_indices(None, None, built.page_table, built.window_starts, lens, window_left, extend, translate)

    def _layer_indices(self, kv_indptr, kv_indices, page_table, window_starts, lens, window_left, extend, translate) -> LayerIndices:
        # Splits are sized by what the layer can hold, never by this batch's buffers: decode W + 1
        # keys (req_to_token's width for full layers), extend/verify prefixes W keys. Eager metadata
        # and the CUDA-graph buffers (whose kv_indices and page tables are larger) then give the
        # kernels the same bound, the same split counts and the same bits.
        key = (window_left, extend)
        max_window = self._max_windows.get(key)
        if max_window is None:
            max_window = self._max_windows[key] = max_window_len(window_left, self.req_to_token.shape[1], extend=extend)
        return LayerIndices(kv_indptr, kv_indices, page_table, window_starts, lens, self.page_size, max_window, translate)

    def _check_batch(self, fb) -> tuple[int, list | None]:
        """Check a batch on the host (shapes, dtypes, devices, CPU copies); returns its token count and
        ``seq_lens_cpu``'s values (None when the batch has none).

        DECODE and TARGET_VERIFY batches of a kind seen before (the same mode, batch size, draft count
        and tensor kinds) check only their host values (the lengths' range); extend batches check
        everything every step (their host lists change with the batch)."""
        mode = fb.forward_mode
        key = None
        if mode.is_decode() or mode.is_target_verify():
            try:
                key = _batch_kind(fb, mode)
            except (AttributeError, TypeError):  # not tensors where tensors belong: the checks name them
                key = None
            checked = self._checked_batches.get(key) if key is not None else None
            if checked is not None:
                num_tokens, extra = checked
                return num_tokens, self._check_lens_range(fb, extra)
        num_tokens, extra, lens = self._check_batch_in_full(fb)
        if key is not None:
            if len(self._checked_batches) >= 256:
                self._checked_batches.clear()
            self._checked_batches[key] = (num_tokens, extra)
        return num_tokens, lens

    def _check_lens_range(self, fb, extra: int) -> list | None:
        """``seq_lens_cpu`` (plus ``extra`` drafts) within ``req_to_token``'s columns; returns its values
        (None without host lengths)."""
        lens = fb.seq_lens_cpu
        if lens is None:
            return None
        values = lens.tolist()
        if values:
            max_ctx = self.req_to_token.shape[1]
            lo, hi = min(values), max(values)
            if lo < 0 or hi + extra > max_ctx:
                what = f"seq_lens_cpu (+ draft_token_num {extra})" if extra else "seq_lens_cpu"
                raise ValueError(
                    f"forward_batch.{what} must lie in [0, {max_ctx}] (req_to_token's columns), got values from {lo} to {hi + extra}"
                )
        return values

    def _check_batch_in_full(self, fb) -> tuple[int, int]:
        """Every check of :meth:`_check_batch`; returns (tokens, drafts per request in verify (else 0),
        ``seq_lens_cpu``'s values)."""
        mode = fb.forward_mode
        dev, max_ctx = self.device, self.req_to_token.shape[1]
        bs = _as_int("forward_batch.batch_size", fb.batch_size, 0)
        _check_index("forward_batch.req_pool_indices", fb.req_pool_indices, dev, bs)
        _check_index("forward_batch.seq_lens", fb.seq_lens, dev, bs)
        if fb.seq_lens_cpu is not None:
            check_tensor("forward_batch.seq_lens_cpu", fb.seq_lens_cpu, dtype=INDEX_DTYPES, device="cpu", shape=(bs,))
        if mode.is_decode():
            num_tokens, extra = bs, 0
            tokens_why = "one per request in DECODE: batch_size"
        elif mode.is_target_verify():
            spec = fb.spec_info
            if spec is None:
                raise ValueError("TARGET_VERIFY needs forward_batch.spec_info with draft_token_num")
            n = _as_int("spec_info.draft_token_num", getattr(spec, "draft_token_num", None), 1)
            num_tokens, extra = bs * n, n
            tokens_why = f"one per draft token: batch_size {bs} x draft_token_num {n}"
            self._check_spec(spec, bs, n, exact=True)
        else:
            if fb.extend_seq_lens is None or fb.extend_prefix_lens is None:
                raise ValueError(f"{mode.name} needs forward_batch.extend_seq_lens and extend_prefix_lens")
            _check_index("forward_batch.extend_seq_lens", fb.extend_seq_lens, dev, bs)
            _check_index("forward_batch.extend_prefix_lens", fb.extend_prefix_lens, dev, bs)
            cpu = {}
            for name in ("extend_seq_lens_cpu", "extend_prefix_lens_cpu"):
                values = getattr(fb, name)
                if values is None:
                    continue
                values = values.tolist() if isinstance(values, torch.Tensor) else list(values)
                if len(values) != bs:
                    raise ValueError(f"forward_batch.{name} must have {bs} entries, got {len(values)}")
                cpu[name] = [_as_int(f"forward_batch.{name}[{i}]", x, 0) for i, x in enumerate(values)]
            if "extend_seq_lens_cpu" in cpu and "extend_prefix_lens_cpu" in cpu:
                for i, (e, p) in enumerate(zip(cpu["extend_seq_lens_cpu"], cpu["extend_prefix_lens_cpu"])):
                    if p + e > max_ctx:
                        raise ValueError(
                            f"request {i}: extend_prefix_lens_cpu + extend_seq_lens_cpu = {p + e} exceeds req_to_token's {max_ctx} columns"
                        )
                if fb.seq_lens_cpu is not None:
                    # host values: the sum rule of an extend step costs nothing to check, every step
                    seq_cpu = fb.seq_lens_cpu.tolist()
                    for i, (e, p, n) in enumerate(zip(cpu["extend_seq_lens_cpu"], cpu["extend_prefix_lens_cpu"], seq_cpu)):
                        if p + e != n:
                            raise ValueError(
                                f"request {i}: forward_batch.extend_prefix_lens_cpu[{i}] + extend_seq_lens_cpu[{i}] = "
                                f"{p} + {e} = {p + e}, but seq_lens_cpu[{i}] = {n} (cached prefix + new tokens must equal "
                                "seq_lens in an extend step)"
                            )
            ext = cpu.get("extend_seq_lens_cpu")
            num_tokens = sum(ext) if ext is not None else int(fb.extend_seq_lens.sum())
            tokens_why = "one per new token: the sum of extend_seq_lens" + ("_cpu" if ext is not None else "")
            extra = 0
            spec = fb.spec_info
            if spec is not None and not isinstance(getattr(spec, "causal", True), bool):
                raise TypeError(f"spec_info.causal must be a bool, got {type(spec.causal).__name__}")
        lens = self._check_lens_range(fb, extra)
        if fb.out_cache_loc is not None:
            _check_index("forward_batch.out_cache_loc", fb.out_cache_loc, dev, num_tokens, tokens_why)
        return num_tokens, extra, lens

    def _check_spec(self, spec, bs: int, n: int, *, exact: bool) -> None:
        """spec_info of a verify step: ``causal`` a bool, ``custom_mask`` ``[bs * n * n]`` and ``positions``
        ``[bs * n]`` on the device (``exact=False``, graph replay: whole requests, at most ``bs``)."""
        if not isinstance(getattr(spec, "causal", None), bool):
            raise TypeError(f"spec_info.causal must be a bool, got {type(getattr(spec, 'causal', None)).__name__}")
        for name, per_request, dtypes in (("custom_mask", n * n, _MASK_DTYPES), ("positions", n, INDEX_DTYPES)):
            x = getattr(spec, name, None)
            if x is None:
                continue
            check_tensor(f"spec_info.{name}", x, dtype=dtypes, device=self.device, ndim=1)
            m = x.shape[0]
            if exact and m != bs * per_request:
                raise ValueError(
                    f"spec_info.{name} must have shape [{bs * per_request}] (batch_size {bs} x "
                    f"{'draft_token_num^2' if name == 'custom_mask' else 'draft_token_num'}), got [{m}]"
                )
            if not exact and (m % per_request or m > bs * per_request):
                raise ValueError(
                    f"spec_info.{name} must hold whole requests of {per_request} entries, at most {bs} of "
                    f"them (the graph's batch), got [{m}]"
                )

    def init_forward_metadata(self, forward_batch, *, debug: bool | None = None) -> None:
        """Build the step's indices once: full layers, sliding layers (translated), extend layout.

        Args:
            forward_batch: the step's batch (SGLang's ``ForwardBatch`` field names).
            debug (bool | None): before any launch, check the device contents the index builds read
                (:func:`~triton_swa.runtime.guard.check_forward_batch`: rows of ``req_to_token``,
                lengths in range and adding up, host copies equal to their device tensors, every window
                slot in range and live); afterwards, check the built indices against the reference path
                (:func:`~triton_swa.runtime.guard.check_forward_metadata`). A host sync; ValueError
                naming the field, request, position and slot. None follows ``TRITON_SWA_DEBUG`` (see
                :mod:`triton_swa.runtime.guard`).

        Raises:
            TypeError, ValueError: naming the field of a bad batch (lengths of ``req_pool_indices``,
                ``seq_lens``, ``out_cache_loc`` or the CPU copies disagreeing with ``batch_size``, a
                missing ``spec_info`` or ``extend_seq_lens``, wrong dtypes or devices, CPU lengths past
                ``req_to_token``, and in extend modes ``extend_prefix_lens_cpu[i] +
                extend_seq_lens_cpu[i] != seq_lens_cpu[i]`` when the three host copies are given),
                before anything is launched. Checks of host values run on every call; device values
                only in debug mode.

        An empty batch (``batch_size`` 0, int tensors of length 0) is valid in every mode: the step's
        layers then return ``[0, heads * head_dim]`` outputs and launch nothing.
        """
        debug = debug_enabled(debug)
        self._build_forward_metadata(forward_batch, debug=debug)
        if debug:
            check_forward_metadata(self, forward_batch, batch_checked=True)

    def _build_forward_metadata(self, forward_batch, *, debug: bool = False) -> None:
        mode = forward_batch.forward_mode
        if not all(hasattr(mode, name) for name in ("is_idle", "is_decode", "is_target_verify")):
            raise TypeError(f"forward_batch.forward_mode must be a ForwardMode, got {type(mode).__name__}")
        if mode.is_idle():
            self.forward_metadata = ForwardMetadata(mode, None, None)
            return
        num_tokens, lens_host = self._check_batch(forward_batch)
        if debug:
            # the device contents the index builds read (rows, lengths, window slots), before any launch
            check_forward_batch(self, forward_batch)
        req = forward_batch.req_pool_indices
        if mode.is_decode():
            lens = forward_batch.seq_lens
            if lens_host is None:
                lens_host = lens.tolist()  # a host synchronisation, for a batch without seq_lens_cpu
            full, sliding = self._step_indices(req, lens, lens_host, extend=False, debug=debug)
            self.forward_metadata = ForwardMetadata(mode, full, sliding, forward_batch.batch_size, num_tokens)
            return
        meta = self._extend_layout(forward_batch)
        meta.batch_size, meta.num_tokens = forward_batch.batch_size, num_tokens
        prefix, prefix_cpu = meta.prefix_lens, meta.prefix_lens_cpu.tolist()
        meta.full, meta.sliding = self._step_indices(req, prefix, prefix_cpu, extend=True, debug=debug)
        self.forward_metadata = meta

    # ----- CUDA graphs ----------------------------------------------------------------------------

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        """``seq_lens`` value of padded batch entries (they point at ``req_to_token`` row 0)."""
        return 1

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Allocate, once, every buffer a captured graph's kernels read: window indices, lengths,
        ``qo_indptr``, draft positions, the tree mask and its offsets.

        TARGET_VERIFY follows SGLang's convention ``draft_token_num = max_num_tokens // max_bs``: the
        mask holds ``max_bs * draft_token_num ** 2`` entries and the positions ``max_num_tokens``.
        Capture and replay fill these buffers in place (``[:n]``, the tail zeroed or padded); a replay
        that needs more than this raises.
        """
        max_bs = _as_int("max_bs", max_bs, 1)
        max_num_tokens = _as_int("max_num_tokens", max_num_tokens, max_bs)
        max_ctx = self.req_to_token.shape[1]
        w, dev = self.sliding_window_size, self.device
        drafts = max_num_tokens // max_bs

        def buffers(per_request: int) -> WindowIndices:
            return WindowIndices(
                torch.zeros(max_bs + 1, dtype=torch.int32, device=dev),
                torch.zeros(max(1, max_bs * per_request), dtype=torch.int32, device=dev),
                torch.zeros(max_bs, dtype=torch.int32, device=dev),
            )

        def tables(window_left: int) -> WindowPageTable:
            # Wide enough for a decode window (W + 1 keys) and a verify prefix window (W keys).
            width = max_window_pages(window_left, self.page_size, max_ctx)
            return WindowPageTable(
                torch.zeros(max_bs, max(1, width), dtype=torch.int32, device=dev), torch.zeros(max_bs, dtype=torch.int32, device=dev)
            )

        make = buffers if self.page_size == 1 else tables
        self.cuda_graph = {
            "max_bs": max_bs,
            "max_num_tokens": max_num_tokens,
            "draft_token_num": drafts,
            "full": make(max_ctx if self.page_size == 1 else -1),
            "sliding": (make(max_window_len(w, max_ctx) if self.page_size == 1 else w)) if w >= 0 else None,
            "seq_lens": torch.zeros(max_bs, dtype=torch.int64, device=dev),
            "qo_indptr": torch.zeros(max_bs + 1, dtype=torch.int32, device=dev),
            "prefix_lens": torch.zeros(max_bs, dtype=torch.int32, device=dev),
            "positions": torch.zeros(max_num_tokens, dtype=torch.int64, device=dev),
            "custom_mask": torch.zeros(max_bs * drafts * drafts, dtype=torch.bool, device=dev),
            "mask_indptr": torch.zeros(max_bs + 1, dtype=torch.int32, device=dev),
            # (bs, mode) -> what the captured kernels were specialised on (draft count, causal, mask, positions)
            "captured": {},
        }

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ) -> None:
        """Metadata for capture: the same fixed buffers that replay refills."""
        self._graph_metadata(bs, req_pool_indices, seq_lens, forward_mode, spec_info, capture=True)

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu=None
    ) -> None:
        """Refill the fixed buffers for a replay (padded entries use row 0 and the fill length).

        ``spec_info`` may be a fresh object every step: its positions and tree mask are copied into
        the buffers the graph reads. It must match what was captured (``draft_token_num``, ``causal``,
        whether it has a mask and positions); it may cover fewer requests than ``bs`` (padding).

        What a replay promises, for a batch padded the engine's way (the padded requests on
        ``req_to_token`` row 0 with :meth:`get_cuda_graph_seq_len_fill_value`, their drafts past
        ``spec_info``'s requests):

        - Metadata: equal, bit for bit, to :meth:`init_forward_metadata` over the same ``bs``
          requests, padding included: the window indices (``kv_indptr``, ``kv_indices`` up to
          ``kv_indptr[bs]``; the page tables, whose columns past eager's width are 0), window
          starts and ends, ``qo_indptr``, prefix lengths and the split bounds. Verify: the tree mask
          and positions of the requests ``spec_info`` covers are copied; the requests past it get an
          all-zero mask block (they see no draft) and positions ``prefix + i``, which is what eager
          must be given to match.
        - Outputs of the real requests (rows not on row 0): equal, bit for bit, to eager's over the
          same padded batch with the same inputs and pools (same indices, bounds and split counts).
          Eager over the real requests alone may split otherwise and differ within rounding.
        - Outputs of the padded requests: unspecified, to be discarded. Their window is row 0's
          dummy slot 0, which the padded tokens' own stores (``out_cache_loc`` 0) write
          concurrently, in no fixed order on a GPU, so they can differ from eager's, and from one
          replay to the next. They never change a real request's rows.

        ``tests/test_backend_graph.py::test_padded_replay_promise`` tests exactly this (DECODE and
        TARGET_VERIFY, page sizes 1 and 4).
        """
        self._graph_metadata(bs, req_pool_indices, seq_lens, forward_mode, spec_info, capture=False)

    def _graph_metadata(self, bs, req_pool_indices, seq_lens, forward_mode, spec_info, *, capture: bool) -> None:
        if self.cuda_graph is None:
            raise ValueError("init_cuda_graph_state must run before capture or replay")
        g = self.cuda_graph
        bs = _as_int("bs", bs, 1)
        if bs > g["max_bs"]:
            raise ValueError(f"bs={bs} exceeds the max_bs={g['max_bs']} of init_cuda_graph_state")
        if not (forward_mode.is_decode() or forward_mode.is_target_verify()):
            raise ValueError(f"CUDA graphs cover DECODE and TARGET_VERIFY, not {forward_mode.name}")
        for name, t in (("req_pool_indices", req_pool_indices), ("seq_lens", seq_lens)):
            _check_index(name, t, self.device)
            if t.shape[0] < bs:
                raise ValueError(f"{name} must have at least bs={bs} entries, got {t.shape[0]}")
        req_pool_indices, seq_lens = req_pool_indices[:bs], seq_lens[:bs]
        extend = forward_mode.is_target_verify()
        sig = ("decode",)
        n = 1
        if extend:
            if spec_info is None:
                raise ValueError("TARGET_VERIFY needs spec_info with draft_token_num")
            n = _as_int("spec_info.draft_token_num", getattr(spec_info, "draft_token_num", None), 1)
            if bs * n > g["max_num_tokens"]:
                raise ValueError(
                    f"TARGET_VERIFY needs bs * draft_token_num = {bs} * {n} = {bs * n} query tokens, more "
                    f"than the max_num_tokens={g['max_num_tokens']} of init_cuda_graph_state"
                )
            self._check_spec(spec_info, bs, n, exact=False)
            has_mask = spec_info.custom_mask is not None
            if has_mask and bs * n * n > g["custom_mask"].numel():
                raise ValueError(
                    f"TARGET_VERIFY's tree mask needs bs * draft_token_num^2 = {bs * n * n} entries, more "
                    f"than the {g['custom_mask'].numel()} init_cuda_graph_state allocated (max_bs "
                    f"{g['max_bs']} x draft_token_num {g['draft_token_num']}^2, draft_token_num = "
                    "max_num_tokens // max_bs)"
                )
            sig = (n, spec_info.causal, has_mask, spec_info.positions is not None)
        key = (bs, forward_mode)
        if capture:
            g["captured"][key] = sig
        else:
            want = g["captured"].get(key)
            if want is None:
                raise ValueError(f"no CUDA graph was captured for bs={bs} in {forward_mode.name}")
            if want != sig:
                names = ("draft_token_num", "causal", "custom_mask given", "positions given")
                diff = ", ".join(f"{k}: captured {a}, replayed {b}" for k, a, b in zip(names, want, sig) if a != b)
                raise ValueError(f"spec_info does not match the captured graph (bs={bs}): {diff}")
        w = self.sliding_window_size
        # Everything a captured kernel reads lives in the buffers of init_cuda_graph_state: a tensor
        # made here (or a spec_info's own) would be gone or stale at the next replay.
        lens = g["prefix_lens"][:bs].copy_(seq_lens) if extend else g["seq_lens"][:bs].copy_(seq_lens)

        def build(which, window_left, translate):
            buf = g[which]
            if self.page_size == 1:
                out = WindowIndices(buf.kv_indptr[: bs + 1], buf.kv_indices, buf.window_starts[:bs])
            else:
                out = WindowPageTable(buf.page_table[:bs], buf.window_starts[:bs])
            return self._indices(req_pool_indices, lens, window_left=window_left, extend=extend, translate=translate, out=out)

        full = build("full", -1, False)
        sliding = build("sliding", w, self.use_sliding_window_kv_pool) if w >= 0 else None
        meta = ForwardMetadata(forward_mode, full, sliding, bs, bs * n)
        if extend:
            dev = self.device
            qo = g["qo_indptr"][: bs + 1]
            qo.copy_(torch.arange(0, (bs + 1) * n, n, dtype=torch.int32, device=dev))
            meta.qo_indptr, meta.prefix_lens, meta.max_extend_len = qo, lens, n
            meta.causal = spec_info.causal
            if spec_info.positions is not None:
                # padded requests (and any the spec_info does not cover) sit at prefix + i
                pos = g["positions"]
                pos[: bs * n].copy_((lens.long()[:, None] + torch.arange(n, device=dev)).reshape(-1))
                pos[bs * n :].zero_()
                pos[: spec_info.positions.shape[0]].copy_(spec_info.positions)
                meta.q_positions = pos[: bs * n]
            if has_mask:
                mask = g["custom_mask"]
                mask.zero_()  # padded requests see no draft (their rows are discarded)
                mask[: spec_info.custom_mask.shape[0]].copy_(spec_info.custom_mask)
                meta.custom_mask = mask[: bs * n * n]
                mi = g["mask_indptr"][: bs + 1]
                mi.copy_(torch.arange(0, (bs + 1) * n * n, n * n, dtype=torch.int32, device=dev))
                meta.mask_indptr = mi[:bs]
        self.forward_metadata = meta

    def _extend_layout(self, forward_batch) -> ForwardMetadata:
        """qo_indptr, prefix lengths and draft masks of EXTEND, DRAFT_EXTEND_V2 and TARGET_VERIFY."""
        mode, bs, dev = forward_batch.forward_mode, forward_batch.batch_size, self.device
        spec = forward_batch.spec_info
        if mode.is_target_verify():
            # SGLang's convention: seq_lens are the committed lengths; the drafts follow them.
            n = spec.draft_token_num
            prefix = forward_batch.seq_lens.to(torch.int32)
            prefix_cpu = forward_batch.seq_lens_cpu if forward_batch.seq_lens_cpu is not None else prefix.cpu()
            qo_indptr = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32, device=dev)
            max_extend = n
        else:
            prefix = forward_batch.extend_prefix_lens.to(torch.int32)
            # int64 whatever the list holds (torch.tensor([]) alone would be float32: an empty batch)
            prefix_cpu = (
                torch.tensor(forward_batch.extend_prefix_lens_cpu, dtype=torch.int64)
                if forward_batch.extend_prefix_lens_cpu is not None
                else prefix.cpu()
            )
            ext = forward_batch.extend_seq_lens
            qo_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=dev)
            qo_indptr[1:] = torch.cumsum(ext, 0)
            ext_cpu = forward_batch.extend_seq_lens_cpu if forward_batch.extend_seq_lens_cpu is not None else ext.tolist()
            max_extend = max(ext_cpu, default=0)
        meta = ForwardMetadata(
            mode, None, None, qo_indptr=qo_indptr, prefix_lens=prefix, prefix_lens_cpu=prefix_cpu, max_extend_len=int(max_extend)
        )
        if not mode.is_target_verify():
            # bounds the prefix keys a request reads, so that a prompt without a prefix takes no
            # (empty) split-KV programs
            meta.max_prefix_len = int(prefix_cpu.max()) if bs else 0
        if spec is not None and mode.is_target_verify():
            meta.causal = spec.causal
            meta.q_positions = spec.positions
            if spec.custom_mask is not None:
                meta.custom_mask = spec.custom_mask
                meta.mask_indptr = torch.arange(0, bs * n * n, n * n, dtype=torch.int32, device=dev)
        elif spec is not None:
            # an engine's own draft-extend inputs (SGLang's EagleDraftExtendInput) carry no ``causal``:
            # their new tokens are causal
            meta.causal = getattr(spec, "causal", True)
        return meta

    # ----- per-layer dispatch --------------------------------------------------------------------

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

    # ----- the fast path: plan once per step and kind of layer, launch per layer ------------------

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
        if type(self)._save is not TritonSWAAttnBackend._save:
            return None
        return loc, lp.write_mapping

    def _store_plan(self, lp, k_buf, v_buf, loc, k, v):
        """The K/V store of a kind of layer call: planned here, or the engine's (a subclass's ``_save``)."""
        if type(self)._save is not TritonSWAAttnBackend._save:
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

    def forward(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        """Dispatch by ``forward_batch.forward_mode`` (IDLE returns an empty output)."""
        mode = forward_batch.forward_mode
        if mode.is_idle():
            return q.new_empty(0, layer.tp_q_head_num * layer.v_head_dim)
        if mode.is_decode():
            return self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        return self.forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
