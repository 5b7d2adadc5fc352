"""A step's metadata: what every layer of one step shares, built once per step.

``init_forward_metadata`` checks the batch (:mod:`triton_swa.backend.batch`) and builds the window
indices of the full and the sliding layers (the sliding layers' translated to SWA slots) from
``req_to_token``, with the extend layout (``qo_indptr``, prefix lengths, a verify step's tree mask
and positions) in extend modes. Pages of one token take CSR lists, both built by one launch; larger
pages take page tables. The CUDA-graph path (:mod:`triton_swa.backend.graph`) builds the same indices
into fixed buffers through :meth:`_StepMetadata._indices`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..engine import ForwardMode
from ..ops.indices import (
    _window_lists_plan,
    build_window_indices,
    build_window_page_table,
    max_window_len,
    max_window_pages,
    window_count_of,
)
from ..runtime.guard import check_forward_batch, check_forward_metadata, debug_enabled

# a step whose lengths only the device holds builds its window lists at their bound (batch x
# req_to_token's width for a full layer): up to this many int32 entries (64 MiB), else it reads them back
DEVICE_PREFIX_MAX_INDICES = 1 << 24


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
    # the step's launch plans, one per kind of layer call (made by the layers' calls: triton_swa.backend.forward)
    runs: dict = field(default_factory=dict, repr=False)


class _StepMetadata:
    """The step-metadata part of :class:`~triton_swa.backend.TritonSWAAttnBackend`: sets
    ``forward_metadata`` once per step, reading ``req_to_token``, ``page_size``,
    ``sliding_window_size``, the pool part's ``_mapping_for`` and the batch part's ``_check_batch``;
    caches ``_window_plans`` and ``_max_windows``."""

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
            if lens_host is None and not self._lists_fit_bound(lens.shape[0], extend=False):
                lens_host = lens.tolist()  # a host synchronisation, for a batch without seq_lens_cpu
            full, sliding = self._step_indices(req, lens, lens_host, extend=False, debug=debug)
            self.forward_metadata = ForwardMetadata(mode, full, sliding, forward_batch.batch_size, num_tokens)
            return
        meta = self._extend_layout(forward_batch)
        meta.batch_size, meta.num_tokens = forward_batch.batch_size, num_tokens
        prefix = meta.prefix_lens
        prefix_cpu = None if meta.prefix_lens_cpu is None else meta.prefix_lens_cpu.tolist()
        meta.full, meta.sliding = self._step_indices(req, prefix, prefix_cpu, extend=True, debug=debug)
        self.forward_metadata = meta

    def _extend_layout(self, forward_batch) -> ForwardMetadata:
        """qo_indptr, prefix lengths and draft masks of EXTEND, DRAFT_EXTEND_V2 and TARGET_VERIFY."""
        mode, bs, dev = forward_batch.forward_mode, forward_batch.batch_size, self.device
        spec = forward_batch.spec_info
        if mode.is_target_verify():
            # SGLang's convention: seq_lens are the committed lengths; the drafts follow them.
            n = spec.draft_token_num
            prefix = forward_batch.seq_lens.to(torch.int32)
            prefix_cpu = forward_batch.seq_lens_cpu
            if prefix_cpu is None and not self._lists_fit_bound(bs, extend=True):
                prefix_cpu = prefix.cpu()  # a host synchronisation
            qo_indptr = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32, device=dev)
            max_extend = n
        else:
            prefix = forward_batch.extend_prefix_lens.to(torch.int32)
            ext = forward_batch.extend_seq_lens
            qo_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=dev)
            qo_indptr[1:] = torch.cumsum(ext, 0)
            ext_cpu = forward_batch.extend_seq_lens_cpu if forward_batch.extend_seq_lens_cpu is not None else ext.tolist()
            max_extend = max(ext_cpu, default=0)
            prefix_cpu = self._prefix_host(forward_batch, prefix, ext_cpu)
        meta = ForwardMetadata(
            mode, None, None, qo_indptr=qo_indptr, prefix_lens=prefix, prefix_lens_cpu=prefix_cpu, max_extend_len=int(max_extend)
        )
        if not mode.is_target_verify() and prefix_cpu is not None:
            # bounds the prefix keys a request reads, so that a prompt without a prefix takes no
            # (empty) split-KV programs; prefixes on the device only take the layer's bound, as verify does
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

    def _prefix_host(self, forward_batch, prefix: torch.Tensor, ext_cpu: list) -> torch.Tensor | None:
        """An extend step's cached-prefix lengths on the host (int64), without reading the device where
        the batch carries them: ``extend_prefix_lens_cpu``, else ``seq_lens_cpu`` less the new tokens.
        None where only the device holds them and the step's lists fit :data:`DEVICE_PREFIX_MAX_INDICES`
        at their bound (SGLang's overlapped draft extend: its lengths stay on the GPU and the step
        reads none back); else read back (a host synchronisation)."""
        if forward_batch.extend_prefix_lens_cpu is not None:
            # int64 whatever the list holds (torch.tensor([]) alone would be float32: an empty batch)
            return torch.tensor(forward_batch.extend_prefix_lens_cpu, dtype=torch.int64)
        if forward_batch.seq_lens_cpu is not None:
            return forward_batch.seq_lens_cpu.to(torch.int64) - torch.tensor(ext_cpu, dtype=torch.int64)
        return None if self._lists_fit_bound(prefix.shape[0], extend=True) else prefix.cpu()

    def _lists_fit_bound(self, batch: int, *, extend: bool) -> bool:
        """Whether ``batch`` requests' window lists at their bound (a full layer's: req_to_token's
        width each) fit :data:`DEVICE_PREFIX_MAX_INDICES`: then a step without host lengths builds
        them so, reading none back."""
        return batch * max_window_len(-1, self.req_to_token.shape[1], extend=extend) <= DEVICE_PREFIX_MAX_INDICES

    def _index_count(self, lens_host, window_left: int, extend: bool, batch: int = 0) -> int:
        """The CSR length of a step's windows from the lengths' host values (no device read); without
        them (None) the most ``batch`` requests' windows can hold: the list is then a capacity, as a
        CUDA graph's buffers are, and the kernels read each request's extent from ``kv_indptr``."""
        if lens_host is None:
            return batch * max_window_len(window_left, self.req_to_token.shape[1], extend=extend)
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
        bs = req_pool_indices.shape[0]
        num_full = self._index_count(lens_host, -1, extend, bs)
        num_window = self._index_count(lens_host, w, extend, bs) if w >= 0 else None
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
                # without host lengths (None) the builder counts them on the device: only the debug
                # guard's path comes here with pages of one token, and it synchronises anyway
                num_indices=None if out is not None or lens_host is None else self._index_count(lens_host, window_left, extend),
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
