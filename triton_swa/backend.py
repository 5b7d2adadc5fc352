"""The attention backend: SGLang's pool-resolution policy, per-step metadata, per-layer dispatch.

``TritonSWAAttnBackend(model_runner)`` is shaped like an SGLang attention backend. Once per step,
``init_forward_metadata`` builds the window indices of the sliding layers (built from
``req_to_token`` and translated to SWA slots in one fused launch) and the indices of the full
layers; every layer then reuses them. This module holds no Triton code: it turns pool state into
kernel arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._checks import check_tensor
from .engine import ForwardMode
from .mem.pools import BaseSWAKVPool
from .ops.decode import swa_decode
from .ops.extend import swa_extend
from .ops.indices import (
    WindowIndices,
    WindowPageTable,
    build_window_indices,
    build_window_page_table,
    max_window_len,
    max_window_pages,
    store_kv,
)


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
    qo_indptr: torch.Tensor | None = None  # int32 [B + 1], extend modes
    prefix_lens: torch.Tensor | None = None  # int32 [B], extend modes
    prefix_lens_cpu: torch.Tensor | None = None
    max_extend_len: int = 0
    # longest cached prefix of an eager EXTEND / DRAFT_EXTEND batch (None: verify, whose split
    # count follows the layer's window bound, as under CUDA-graph replay)
    max_prefix_len: int | None = None
    causal: bool = True
    custom_mask: torch.Tensor | None = None
    mask_indptr: torch.Tensor | None = None
    q_positions: torch.Tensor | None = None


class TritonSWAAttnBackend:
    """Paged sliding-window attention for a hybrid model (sliding and full layers).

    Args:
        model_runner: an object with SGLang's ``ModelRunner`` attribute names (see
            :class:`triton_swa.engine.ModelRunner`): ``token_to_kv_pool``,
            ``token_to_kv_pool_allocator``, ``req_to_token_pool``, ``is_draft_worker``,
            ``spec_algorithm``, ``sliding_window_size``, ``device``.
        legacy_resolve_by_allocator_type (type | None): **for demonstrations and regression tests
            only.** Resolve the SWA pool by the old rule (the allocator's type is this class) instead
            of SPEC §3's policy. That rule reads wrong K/V on draft workers whose active pool is
            SWA-backed (Gemma 4 + DFlash); never use it to serve.
    """

    def __init__(self, model_runner, *, legacy_resolve_by_allocator_type: type | None = None):
        self.model_runner = model_runner
        self.device = torch.device(model_runner.device)
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.sliding_window_size = int(getattr(model_runner, "sliding_window_size", -1) or -1)
        if legacy_resolve_by_allocator_type is None:
            self._swa_kv_pool = self._resolve_swa_kv_pool(model_runner)
        else:
            from triton_swa_reference import legacy_resolve_by_allocator_type as legacy

            self._swa_kv_pool = legacy(model_runner, legacy_resolve_by_allocator_type)
        self.use_sliding_window_kv_pool = self._swa_kv_pool is not None
        # K/V buffers come from the resolved SWA pool when there is one (FROZEN_KV MTP reads the
        # target's pool), else from the runner's active pool.
        self.kv_pool = self._swa_kv_pool if self._swa_kv_pool is not None else model_runner.token_to_kv_pool
        self.page_size = int(getattr(self.kv_pool, "page_size", 1) or 1)
        self.forward_metadata: ForwardMetadata | None = None
        self.cuda_graph: dict | None = None

    @staticmethod
    def _resolve_swa_kv_pool(model_runner):
        """SPEC §3: the SWA pool sliding layers translate against, or None.

        The active pool wins when it is SWA-backed (also on draft workers); an EAGLE-like draft
        worker owns a full-only pool and gets None; otherwise (FROZEN_KV MTP, plain runners) the
        allocator's pool when it is SWA-backed.
        """
        active = model_runner.token_to_kv_pool
        if isinstance(active, BaseSWAKVPool):
            return active
        if model_runner.is_draft_worker and not model_runner.spec_algorithm.is_frozen_kv_mtp():
            return None
        kvcache = model_runner.token_to_kv_pool_allocator.get_kvcache()
        return kvcache if isinstance(kvcache, BaseSWAKVPool) else None

    # ----- per-step metadata -------------------------------------------------------------------

    @property
    def mapping(self) -> torch.Tensor | None:
        return self._swa_kv_pool.full_to_swa_index_mapping if self._swa_kv_pool is not None else None

    def _indices(self, req_pool_indices, lens, lens_cpu=None, *, window_left, extend, translate, out=None):
        """One fused launch: every request's window (SWA slots or pages when ``translate``).

        ``out`` holds the fixed buffers of a CUDA graph; otherwise the CSR length comes from
        ``lens_cpu`` (no host synchronisation).
        """
        mapping = self.mapping if translate else None
        max_ctx = self.req_to_token.shape[1]
        prefix_lens = lens if extend else None
        if self.page_size == 1:
            num_indices = None
            if out is None:
                counts = lens_cpu.long().clamp(min=0)
                if window_left >= 0:
                    counts = counts.clamp(max=window_left + (0 if extend else 1))
                num_indices = int(counts.sum())
            built = build_window_indices(self.req_to_token, req_pool_indices, lens, window_left=window_left,
                                         prefix_lens=prefix_lens, mapping=mapping, num_indices=num_indices, out=out)
            csr, table, starts = (built.kv_indptr, built.kv_indices), None, built.window_starts
        else:
            max_pages = None if out is not None else max_window_pages(window_left, self.page_size, max_ctx, extend=extend)
            built = build_window_page_table(self.req_to_token, req_pool_indices, lens, window_left=window_left,
                                            page_size=self.page_size, prefix_lens=prefix_lens, mapping=mapping,
                                            max_pages=max_pages, out=out)
            csr, table, starts = (None, None), built.page_table, built.window_starts
        # Decode splits are sized by what the layer can hold, not by this batch: W + 1 for sliding
        # layers, req_to_token's width for full ones. Eager and CUDA-graph replay then pick the same
        # splits and agree bit for bit.
        max_window = window_left + 1 if window_left >= 0 else max_ctx
        return LayerIndices(*csr, table, starts, lens, self.page_size, max_window, translate)

    def init_forward_metadata(self, forward_batch) -> None:
        """Build the step's indices once: full layers, sliding layers (translated), extend layout."""
        mode = forward_batch.forward_mode
        if mode.is_idle():
            self.forward_metadata = ForwardMetadata(mode, None, None)
            return
        req = forward_batch.req_pool_indices
        w = self.sliding_window_size
        translate = self.use_sliding_window_kv_pool
        if mode.is_decode():
            lens = forward_batch.seq_lens
            lens_cpu = forward_batch.seq_lens_cpu if forward_batch.seq_lens_cpu is not None else lens.cpu()
            full = self._indices(req, lens, lens_cpu, window_left=-1, extend=False, translate=False)
            sliding = None
            if w >= 0:
                sliding = self._indices(req, lens, lens_cpu, window_left=w, extend=False, translate=translate)
            self.forward_metadata = ForwardMetadata(mode, full, sliding)
            return
        meta = self._extend_layout(forward_batch)
        prefix, prefix_cpu = meta.prefix_lens, meta.prefix_lens_cpu
        meta.full = self._indices(req, prefix, prefix_cpu, window_left=-1, extend=True, translate=False)
        if w >= 0:
            meta.sliding = self._indices(req, prefix, prefix_cpu, window_left=w, extend=True, translate=translate)
        self.forward_metadata = meta

    # ----- CUDA graphs ----------------------------------------------------------------------------

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        """``seq_lens`` value of padded batch entries (they point at ``req_to_token`` row 0)."""
        return 1

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Allocate the fixed buffers every captured graph reads its metadata from."""
        max_ctx = self.req_to_token.shape[1]
        w, dev = self.sliding_window_size, self.device

        def buffers(per_request: int) -> WindowIndices:
            return WindowIndices(torch.zeros(max_bs + 1, dtype=torch.int32, device=dev),
                                 torch.zeros(max(1, max_bs * per_request), dtype=torch.int32, device=dev),
                                 torch.zeros(max_bs, dtype=torch.int32, device=dev))

        def tables(window_left: int) -> WindowPageTable:
            # Wide enough for a decode window (W + 1 keys) and a verify prefix window (W keys).
            width = max_window_pages(window_left, self.page_size, max_ctx)
            return WindowPageTable(torch.zeros(max_bs, max(1, width), dtype=torch.int32, device=dev),
                                   torch.zeros(max_bs, dtype=torch.int32, device=dev))

        make = buffers if self.page_size == 1 else tables
        self.cuda_graph = {
            "max_bs": max_bs,
            "max_num_tokens": max_num_tokens,
            "full": make(max_ctx if self.page_size == 1 else -1),
            "sliding": (make(max_window_len(w, max_ctx) if self.page_size == 1 else w)) if w >= 0 else None,
            "seq_lens": torch.zeros(max_bs, dtype=torch.int64, device=dev),
            "qo_indptr": torch.zeros(max_bs + 1, dtype=torch.int32, device=dev),
            "prefix_lens": torch.zeros(max_bs, dtype=torch.int32, device=dev),
            "custom_mask": None,
            "mask_indptr": torch.zeros(max_bs + 1, dtype=torch.int32, device=dev),
        }

    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens,
                                                 forward_mode, spec_info) -> None:
        """Metadata for capture: the same fixed buffers that replay refills."""
        self._graph_metadata(bs, req_pool_indices, seq_lens, forward_mode, spec_info)

    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens,
                                                forward_mode, spec_info, seq_lens_cpu=None) -> None:
        """Refill the fixed buffers for a replay (padded entries use row 0 and the fill length)."""
        self._graph_metadata(bs, req_pool_indices[:bs], seq_lens[:bs], forward_mode, spec_info)

    def _graph_metadata(self, bs, req_pool_indices, seq_lens, forward_mode, spec_info) -> None:
        if self.cuda_graph is None:
            raise ValueError("init_cuda_graph_state must run before capture or replay")
        g = self.cuda_graph
        if bs > g["max_bs"]:
            raise ValueError(f"bs={bs} exceeds the max_bs={g['max_bs']} of init_cuda_graph_state")
        if not (forward_mode.is_decode() or forward_mode.is_target_verify()):
            raise ValueError(f"CUDA graphs cover DECODE and TARGET_VERIFY, not {forward_mode.name}")
        w = self.sliding_window_size
        extend = forward_mode.is_target_verify()
        # Everything a captured kernel reads must live in the fixed buffers: a tensor made here would
        # be freed once the next replay replaces the metadata.
        lens = g["prefix_lens"][:bs].copy_(seq_lens) if extend else g["seq_lens"][:bs].copy_(seq_lens)

        def build(which, window_left, translate):
            buf = g[which]
            if self.page_size == 1:
                out = WindowIndices(buf.kv_indptr[: bs + 1], buf.kv_indices, buf.window_starts[:bs])
            else:
                out = WindowPageTable(buf.page_table[:bs], buf.window_starts[:bs])
            return self._indices(req_pool_indices, lens, window_left=window_left, extend=extend, translate=translate,
                                 out=out)

        full = build("full", -1, False)
        sliding = build("sliding", w, self.use_sliding_window_kv_pool) if w >= 0 else None
        meta = ForwardMetadata(forward_mode, full, sliding)
        if extend:
            n = spec_info.draft_token_num
            qo = g["qo_indptr"][: bs + 1]
            qo.copy_(torch.arange(0, (bs + 1) * n, n, dtype=torch.int32, device=self.device))
            meta.qo_indptr, meta.prefix_lens, meta.max_extend_len = qo, lens, n
            meta.causal = spec_info.causal
            if spec_info.custom_mask is not None:
                size = g["max_bs"] * n * n
                if g["custom_mask"] is None or g["custom_mask"].numel() != size:
                    g["custom_mask"] = torch.zeros(size, dtype=spec_info.custom_mask.dtype, device=self.device)
                mask = g["custom_mask"][: bs * n * n]
                mask.copy_(spec_info.custom_mask[: bs * n * n])
                meta.custom_mask = mask
                meta.mask_indptr = g["mask_indptr"][:bs].copy_(
                    torch.arange(0, bs * n * n, n * n, dtype=torch.int32, device=self.device))
            meta.q_positions = spec_info.positions
        self.forward_metadata = meta

    def _extend_layout(self, forward_batch) -> ForwardMetadata:
        """qo_indptr, prefix lengths and draft masks of EXTEND, DRAFT_EXTEND and TARGET_VERIFY."""
        mode, bs, dev = forward_batch.forward_mode, forward_batch.batch_size, self.device
        spec = forward_batch.spec_info
        if mode.is_target_verify():
            # SGLang's convention: seq_lens are the committed lengths; the drafts follow them.
            if spec is None:
                raise ValueError("TARGET_VERIFY needs forward_batch.spec_info with draft_token_num")
            n = spec.draft_token_num
            prefix = forward_batch.seq_lens.to(torch.int32)
            prefix_cpu = forward_batch.seq_lens_cpu if forward_batch.seq_lens_cpu is not None else prefix.cpu()
            qo_indptr = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32, device=dev)
            max_extend = n
        else:
            if forward_batch.extend_seq_lens is None or forward_batch.extend_prefix_lens is None:
                raise ValueError(f"{mode.name} needs forward_batch.extend_seq_lens and extend_prefix_lens")
            prefix = forward_batch.extend_prefix_lens.to(torch.int32)
            prefix_cpu = (torch.tensor(forward_batch.extend_prefix_lens_cpu) if forward_batch.extend_prefix_lens_cpu is not None
                          else prefix.cpu())
            ext = forward_batch.extend_seq_lens
            qo_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=dev)
            qo_indptr[1:] = torch.cumsum(ext, 0)
            ext_cpu = forward_batch.extend_seq_lens_cpu if forward_batch.extend_seq_lens_cpu is not None else ext.tolist()
            max_extend = max(ext_cpu, default=0)
        meta = ForwardMetadata(mode, None, None, qo_indptr=qo_indptr, prefix_lens=prefix, prefix_lens_cpu=prefix_cpu,
                               max_extend_len=int(max_extend))
        if not mode.is_target_verify():
            # bounds the prefix keys a request reads, so that a prompt without a prefix takes no
            # (empty) split-KV programs
            meta.max_prefix_len = int(prefix_cpu.max()) if bs else 0
        if spec is not None and mode.is_target_verify():
            meta.causal = spec.causal
            meta.q_positions = spec.positions
            if spec.custom_mask is not None:
                check_tensor("spec_info.custom_mask", spec.custom_mask, shape=(bs * n * n,))
                meta.custom_mask = spec.custom_mask
                meta.mask_indptr = torch.arange(0, bs * n * n, n * n, dtype=torch.int32, device=dev)
        elif spec is not None:
            meta.causal = spec.causal
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
        kv_layer = layer.layer_id if getattr(layer, "kv_shared_layer_id", None) is None else layer.kv_shared_layer_id
        k_buf, v_buf = self.kv_pool.get_kv_buffer(kv_layer)
        sliding = layer.sliding_window_size >= 0
        if sliding and layer.sliding_window_size != self.sliding_window_size:
            raise ValueError(f"layer {layer.layer_id} has sliding_window_size {layer.sliding_window_size} but the "
                             f"runner's is {self.sliding_window_size}: one window per model")
        in_swa_pool = isinstance(self.kv_pool, BaseSWAKVPool) and self.kv_pool.layers_mapping[kv_layer][1]
        if sliding and self.use_sliding_window_kv_pool and not in_swa_pool:
            raise ValueError(f"layer {layer.layer_id} is sliding but not in the SWA sub-pool; it cannot share the "
                             "sliding layers' translated indices")
        write_mapping = self.kv_pool.full_to_swa_index_mapping if in_swa_pool else None
        return k_buf, v_buf, (meta.sliding if sliding else meta.full), write_mapping

    def _save(self, layer, k, v, k_buf, v_buf, write_mapping, forward_batch, save_kv_cache):
        if not save_kv_cache or getattr(layer, "kv_shared_layer_id", None) is not None or k is None:
            return
        store_kv(k_buf, v_buf, forward_batch.out_cache_loc, k.view(-1, layer.tp_k_head_num, layer.head_dim),
                 v.view(-1, layer.tp_k_head_num, layer.v_head_dim), mapping=write_mapping,
                 k_scale=layer.k_scale, v_scale=layer.v_scale)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        """Write the new K/V (translated for sliding layers), then decode over the layer's window."""
        k_buf, v_buf, idx, write_mapping = self._layer_setup(layer)
        self._save(layer, k, v, k_buf, v_buf, write_mapping, forward_batch, save_kv_cache)
        q = q.view(-1, layer.tp_q_head_num, layer.head_dim)
        out = swa_decode(
            q, k_buf, v_buf, **idx.kernel_args(decode=True), sm_scale=layer.scaling,
            logit_cap=layer.logit_cap, sinks=layer.sinks, k_scale=layer.k_scale, v_scale=layer.v_scale,
            max_window=max(idx.max_window, 1),
        )
        return out.view(-1, layer.tp_q_head_num * layer.v_head_dim)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        """Write the new K/V, then attend the cached window prefix and the new tokens."""
        k_buf, v_buf, idx, write_mapping = self._layer_setup(layer)
        meta = self.forward_metadata
        q = q.view(-1, layer.tp_q_head_num, layer.head_dim)
        if getattr(layer, "kv_shared_layer_id", None) is not None:
            # The new tokens' K/V live in the shared layer's buffers, written by that layer.
            loc = forward_batch.out_cache_loc.long()
            if write_mapping is not None:
                loc = write_mapping[loc]
            k = _dequantize(k_buf[loc], layer.k_scale, q.dtype)
            v = _dequantize(v_buf[loc], layer.v_scale, q.dtype)
        else:
            k = k.view(-1, layer.tp_k_head_num, layer.head_dim)
            v = v.view(-1, layer.tp_k_head_num, layer.v_head_dim)
            self._save(layer, k, v, k_buf, v_buf, write_mapping, forward_batch, save_kv_cache)
        window = layer.sliding_window_size
        max_window = meta.max_prefix_len
        if max_window is not None and window >= 0:
            max_window = min(max_window, window)
        out = swa_extend(
            q, k, v, k_buf, v_buf, meta.qo_indptr, meta.prefix_lens, **idx.kernel_args(decode=False),
            window_left=window, causal=meta.causal, custom_mask=meta.custom_mask, mask_indptr=meta.mask_indptr,
            q_positions=meta.q_positions, sm_scale=layer.scaling, logit_cap=layer.logit_cap, sinks=layer.sinks,
            k_scale=layer.k_scale, v_scale=layer.v_scale, max_extend_len=meta.max_extend_len, max_window=max_window,
        )
        return out.view(-1, layer.tp_q_head_num * layer.v_head_dim)

    def forward(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        """Dispatch by ``forward_batch.forward_mode`` (IDLE returns an empty output)."""
        mode = forward_batch.forward_mode
        if mode.is_idle():
            return q.new_empty(0, layer.tp_q_head_num * layer.v_head_dim)
        if mode.is_decode():
            return self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        return self.forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
