"""vLLM's classes of the ``TRITON_SWA`` backend. This module imports vLLM: the package imports it
only when its classes are asked for (vLLM resolving ``CLASS_PATH``, or an attribute access).

What the classes do (vLLM's names):

- ``TritonSWABackend`` (``AttentionBackend``): ``forward_includes_kv_cache_update = False``, so vLLM
  calls ``do_kv_cache_update`` before ``forward``; decoder attention only; model dtypes float16,
  bfloat16, float32; KV cache ``auto``/``float16``/``bfloat16``/``fp8``/``fp8_e4m3``; any block
  size; head sizes 1..512; sinks and sliding windows supported; only the ``LBNHC`` KV-cache layout
  (every layer's blocks consecutive, tokens then heads inside a block: the kernels address token
  ``slot = block * block_size + offset`` with one stride).
- ``TritonSWAMetadataBuilder``: one ``build`` per step per KV-cache group, on the device, without a
  host synchronisation. A decode-only step (``max_query_len == 1``) gets, for each window of the
  group's layers, a window-relative page table (row ``b``: the blocks holding positions
  ``[max(0, seq_len - W - 1), seq_len)``, taken from vLLM's absolute block table by one Triton
  launch into a persistent buffer); every other step (prefill, chunked prefill, mixed, spec-decode
  verify) reads vLLM's absolute block table directly with ``window_starts = 0``: ``swa_extend``
  reads only the pages of each query's window, so the null-block entries vLLM leaves outside the
  window are never read. CUDA graphs: ``UNIFORM_SINGLE_TOKEN_DECODE`` (the decode path reads only
  persistent buffers and host values fixed by the batch shape; mixed and prefill batches run eager).
- ``TritonSWAImpl`` (``AttentionImpl``): ``do_kv_cache_update`` writes K/V with
  :func:`triton_swa.store_kv_plan` (planned once per kind of call and slot mapping, which vLLM refills
  in place; fp8: ``value / layer._k_scale``, saturating; ``slot_mapping`` entries ``-1`` are padding
  and are skipped, ``skip_negative``); ``forward`` runs :func:`triton_swa.swa_decode` (decode-only
  steps) or :func:`triton_swa.swa_extend` (every other step, the step's new K/V taken from
  ``key``/``value``; a KV-shared layer, called with ``key = value = None``, gathers them from the
  shared cache by ``slot_mapping``), planned once per step and kind of layer
  (:func:`triton_swa.swa_decode_plan`, :func:`triton_swa.swa_extend_plan`: the step's metadata
  keeps the plans) and run per layer. vLLM's ``sliding_window = S`` (S keys including the query's
  own) is ``window_left = S - 1``, taken from the impl, so a sliding layer in a full-attention group
  (hybrid allocator off) is still windowed. Sinks (one logit per query head), logits soft cap and
  fp8 KV with the layer's ``_k_scale`` / ``_v_scale`` tensors (read in the kernels) are passed on.
  ``attn_metadata is None`` (vLLM's profiling run) zero-fills the output and launches nothing else.
  Constructing it registers the start-time precompile with the runner's JIT warm-up (:mod:`.precompile`).

Unsupported, each raising ``NotImplementedError`` naming it: ALiBi, encoder / encoder-only /
cross attention, non-causal batches, multimodal prefix-LM ranges, R-SWA, KV-cache dtypes other
than the above (``fp8_e5m2``, per-token-head quantisation), fused output quantisation, fused
RoPE / QK-norm + KV-cache update, other KV-cache layouts, DCP/PCP (vLLM checks ``supports_dcp`` /
``supports_pcp``, both False).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.kv_cache_layout import KVCacheLayout

from ...ops.decode import swa_decode_plan
from ...ops.extend import swa_extend_plan
from ...ops.indices import WindowPageTable, max_window_pages, window_page_table_from_block_table
from ...ops.kv_store import store_kv, store_kv_plan
from ...runtime.guard import debug_enabled
from ...runtime.plans import PlanCache, scale_key, tensor_key
from .precompile import request_at_start
from .registry import BACKEND_NAME

_SUPPORTED_KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3")
_FP8_KV_CACHE_DTYPES = ("fp8", "fp8_e4m3")


def _unsupported(what: str) -> NotImplementedError:
    return NotImplementedError(f"{BACKEND_NAME} (triton-swa) does not support {what}")


# K/V-update plans by the kinds of the call and the slot mapping's address: vLLM refills its
# persistent slot_mapping in place step after step, and a plan reads it at every run
_KV_UPDATE_PLANS = PlanCache(max_size=64)


def _kv_update_signature(k_buffer, v_buffer, slot_mapping, key, value, k_scale, v_scale):
    keys = (tensor_key(k_buffer), tensor_key(v_buffer), tensor_key(slot_mapping), tensor_key(key), tensor_key(value))
    return (*keys, slot_mapping.data_ptr(), scale_key(k_scale), scale_key(v_scale))


def _kv_update_plan(k_buffer, v_buffer, slot_mapping, key, value, k_scale, v_scale):
    return store_kv_plan(k_buffer, v_buffer, slot_mapping, key, value, k_scale=k_scale, v_scale=v_scale, skip_negative=True)


def _window_left_of(sliding_window) -> int:
    """vLLM's ``sliding_window = S`` (S keys including the query's own) as ``window_left = S - 1``;
    None is full attention (-1)."""
    if sliding_window is None:
        return -1
    if isinstance(sliding_window, tuple):  # (left, right) as some vLLM layers pass it
        left, right = sliding_window
        if right not in (0, -1):
            raise _unsupported(f"a sliding window with right context {right}")
        return int(left)
    if int(sliding_window) < 1:
        raise ValueError(f"sliding_window must be >= 1 (keys in the window, the query's own included), got {sliding_window}")
    return int(sliding_window) - 1


@dataclass
class TritonSWAMetadata:
    """One step's metadata for the layers of one KV-cache group (built once, shared by them).

    ``decode``: every request has one query token (``swa_decode`` with ``tables``); otherwise
    ``swa_extend`` over ``block_table`` with ``window_starts`` zero. ``tables`` maps a
    ``window_left`` to ``(page_table, window_starts, max_window)`` of the decode windows.
    """

    num_actual_tokens: int
    num_reqs: int
    max_query_len: int
    max_seq_len: int
    block_size: int
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    prefix_lens: torch.Tensor | None
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    zero_starts: torch.Tensor
    decode: bool
    tables: dict = field(default_factory=dict)
    builder: object = None
    # the step's launch plans, one per kind of layer call (made by the first such layer)
    plans: dict = field(default_factory=dict)

    def decode_table(self, window_left: int):
        """``(page_table, window_starts, max_window)`` of a decode step for this window; built on
        first use when the builder did not know the window (a layer it was not told about)."""
        entry = self.tables.get(window_left)
        if entry is None:
            entry = self.builder._decode_table(window_left, self.block_table, self.seq_lens, self.num_reqs)
            self.tables[window_left] = entry
        return entry


class TritonSWAMetadataBuilder(AttentionMetadataBuilder[TritonSWAMetadata]):
    """Builds :class:`TritonSWAMetadata` from vLLM's ``CommonAttentionMetadata``, once per step per
    KV-cache group, with device work only (no host synchronisation)."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    # one kernel call serves decodes and prefills in any order: vLLM need not reorder the batch
    reorder_batch_threshold: int | None = None

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size
        sched = getattr(vllm_config, "scheduler_config", None)
        self.max_num_seqs = int(getattr(sched, "max_num_seqs", 0) or 0)
        self.windows = self._group_windows(kv_cache_spec, layer_names, vllm_config)
        self._buffers: dict = {}
        self._zero_starts = torch.zeros(max(self.max_num_seqs, 1), dtype=torch.int32, device=device)

    @staticmethod
    def _group_windows(kv_cache_spec, layer_names, vllm_config) -> list[int]:
        """The windows of the group's layers: the spec's, and each known layer's own (a sliding
        layer can sit in a full-attention group when the hybrid allocator is off)."""
        windows = {_window_left_of(getattr(kv_cache_spec, "sliding_window", None))}
        context = getattr(getattr(vllm_config, "compilation_config", None), "static_forward_context", None) or {}
        for name in layer_names:
            impl = getattr(context.get(name), "impl", None)
            if isinstance(impl, TritonSWAImpl):
                windows.add(impl.window_left)
        return sorted(windows)

    def _buffer(self, window_left: int, rows: int, n_pages: int):
        """Persistent ``(page_table, window_starts)`` of a window (fixed addresses: CUDA graphs)."""
        buf = self._buffers.get(window_left)
        if buf is None or buf[0].shape[0] < rows or buf[0].shape[1] != n_pages:
            rows = max(rows, self.max_num_seqs)
            buf = (
                torch.zeros(rows, n_pages, dtype=torch.int32, device=self.device),
                torch.zeros(rows, dtype=torch.int32, device=self.device),
            )
            self._buffers[window_left] = buf
        return buf

    def _decode_table(self, window_left: int, block_table: torch.Tensor, seq_lens: torch.Tensor, num_reqs: int):
        bs = self.block_size
        max_context = block_table.shape[1] * bs
        n_pages = max(1, max_window_pages(window_left, bs, max_context))
        table, starts = self._buffer(window_left, num_reqs, n_pages)
        table, starts = table[:num_reqs], starts[:num_reqs]
        if num_reqs > 0:
            window_page_table_from_block_table(
                block_table, seq_lens, window_left=window_left, block_size=bs, out=WindowPageTable(table, starts)
            )
        max_window = max_context if window_left < 0 else min(window_left + 1, max_context)
        return table, starts, max_window

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False):
        cm = common_attn_metadata
        if cm.causal is not True:
            raise _unsupported("non-causal attention (CommonAttentionMetadata.causal is not True)")
        if cm.mm_req_doc_ranges is not None:
            raise _unsupported("multimodal prefix-LM ranges (CommonAttentionMetadata.mm_req_doc_ranges)")
        if cm.rswa_prefix_lens is not None:
            raise _unsupported("R-SWA (CommonAttentionMetadata.rswa_prefix_lens)")
        if cm.dcp_local_seq_lens is not None:
            raise _unsupported("decode context parallelism (CommonAttentionMetadata.dcp_local_seq_lens)")
        num_reqs = cm.num_reqs
        query_start_loc = cm.query_start_loc[: num_reqs + 1]
        seq_lens = cm.seq_lens[:num_reqs]
        block_table = cm.block_table_tensor[:num_reqs]
        if block_table.stride(-1) != 1:
            block_table = block_table.contiguous()
        decode = cm.max_query_len <= 1
        if self._zero_starts.shape[0] < num_reqs:
            self._zero_starts = torch.zeros(num_reqs, dtype=torch.int32, device=self.device)
        md = TritonSWAMetadata(
            num_actual_tokens=cm.num_actual_tokens,
            num_reqs=num_reqs,
            max_query_len=cm.max_query_len,
            max_seq_len=cm.max_seq_len,
            block_size=self.block_size,
            query_start_loc=query_start_loc,
            seq_lens=seq_lens,
            prefix_lens=None,
            block_table=block_table,
            slot_mapping=cm.slot_mapping,
            zero_starts=self._zero_starts[:num_reqs],
            decode=decode,
            builder=self,
        )
        if decode:
            for w in self.windows:
                md.tables[w] = self._decode_table(w, block_table, seq_lens, num_reqs)
        else:
            # committed tokens before each request's new ones (device only)
            md.prefix_lens = (seq_lens - (query_start_loc[1:] - query_start_loc[:-1])).to(torch.int32)
        return md

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata):
        if common_attn_metadata.max_query_len > 1:
            raise _unsupported(
                f"CUDA-graph capture of batches with {common_attn_metadata.max_query_len} query tokens per request "
                "(the builder declares UNIFORM_SINGLE_TOKEN_DECODE)"
            )
        return self.build(0, common_attn_metadata)

    def update_block_table(self, metadata, blk_table, slot_mapping):
        raise _unsupported("update_block_table (supports_update_block_table is False)")


class TritonSWAImpl(AttentionImpl[TritonSWAMetadata]):
    """Paged sliding-window attention of one layer over vLLM's KV cache, with triton-swa's kernels."""

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes: list[float] | None = None,
        sliding_window: int | None = None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks: torch.Tensor | None = None,
        **extra,
    ) -> None:
        if alibi_slopes is not None:
            raise _unsupported("ALiBi (alibi_slopes)")
        if attn_type != AttentionType.DECODER:
            raise _unsupported(f"attention type {getattr(attn_type, 'value', attn_type)} (decoder self-attention only)")
        if kv_cache_dtype not in _SUPPORTED_KV_CACHE_DTYPES:
            raise _unsupported(f"kv_cache_dtype {kv_cache_dtype!r} (supported: {', '.join(_SUPPORTED_KV_CACHE_DTYPES)})")
        for key, value in extra.items():
            if key == "use_alibi_sqrt" and not value:
                continue
            if key == "chunk_lookback" and value in (None, -1):
                continue
            raise _unsupported(f"the attention argument {key}={value!r}")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if not 1 <= head_size <= 512:
            raise _unsupported(f"head_size {head_size} (1 to 512)")
        self.sliding_window = sliding_window
        self.window_left = _window_left_of(sliding_window)
        self.kv_cache_dtype = kv_cache_dtype
        self.fp8 = kv_cache_dtype in _FP8_KV_CACHE_DTYPES
        self.logits_soft_cap = float(logits_soft_cap or 0.0)
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        if sinks is not None and tuple(sinks.shape) != (num_heads,):
            raise ValueError(f"sinks must have one logit per query head ({num_heads}), got shape {tuple(sinks.shape)}")
        self.sinks = sinks
        # the runner being set up compiles the prefill kernels in its JIT warm-up (see .precompile)
        request_at_start()

    # --- the KV cache as the kernels read it ---------------------------------------------

    def _fp8_dtype(self):
        from vllm.platforms import current_platform

        return current_platform.fp8_dtype()

    def _kv_buffers(self, kv_cache: torch.Tensor):
        """``(k_buffer, v_buffer)`` `[num_blocks * block_size, H, D]` views of vLLM's per-layer cache
        (logical ``[num_blocks, H, block_size, 2 * D]``, K then V in the last dimension)."""
        if kv_cache.dim() != 4 or kv_cache.shape[1] != self.num_kv_heads or kv_cache.shape[3] != 2 * self.head_size:
            raise ValueError(
                f"{BACKEND_NAME}: expected a KV cache [num_blocks, {self.num_kv_heads}, block_size, {2 * self.head_size}], "
                f"got {list(kv_cache.shape)}"
            )
        nb, h, bs, _ = kv_cache.shape
        s_block, s_head, s_tok, s_c = kv_cache.stride()
        if s_c != 1 or s_block != bs * s_tok:
            raise _unsupported(
                f"this KV-cache layout (strides {kv_cache.stride()} of [blocks, heads, tokens, K|V]); "
                f"it needs {KVCacheLayout.LBNHC.name}: token slots of one stride across blocks"
            )
        if kv_cache.dtype == torch.uint8:
            kv_cache = kv_cache.view(self._fp8_dtype())
        d = self.head_size
        k = torch.as_strided(kv_cache, (nb * bs, h, d), (s_tok, s_head, 1), kv_cache.storage_offset())
        v = torch.as_strided(kv_cache, (nb * bs, h, d), (s_tok, s_head, 1), kv_cache.storage_offset() + d)
        return k, v

    def _scales(self, layer):
        if not self.fp8:
            return None, None
        return layer._k_scale, layer._v_scale

    def do_kv_cache_update(self, layer, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor):
        """Write the step's K/V at ``slot_mapping`` (entries < 0 are padding: skipped)."""
        if self.kv_sharing_target_layer_name is not None:
            return
        k_buffer, v_buffer = self._kv_buffers(kv_cache)
        n = slot_mapping.shape[0]
        key, value = key[:n], value[:n]
        k_scale, v_scale = self._scales(layer)
        if debug_enabled(None):  # every call's slots checked (a plan checks its slots when made)
            store_kv(k_buffer, v_buffer, slot_mapping, key, value, k_scale=k_scale, v_scale=v_scale, skip_negative=True)
            return
        # planned once per kind and slot mapping (the step's layers share it); -1 is padding
        args = (k_buffer, v_buffer, slot_mapping, key, value, k_scale, v_scale)
        plan = _KV_UPDATE_PLANS.get_or_make(_kv_update_signature, _kv_update_plan, args)
        if plan is not None:
            plan.run(k_buffer, v_buffer, key, value, k_scale=k_scale, v_scale=v_scale)

    def fused_rope_kvcache_supported(self):
        return False

    def do_rope_and_kv_cache_update(self, *args, **kwargs):
        raise _unsupported("the fused RoPE + KV-cache update (fused_rope_kvcache_supported is False)")

    def do_qk_norm_rope_kvcache_update(self, *args, **kwargs):
        raise _unsupported("the fused QK-norm + RoPE + KV-cache update")

    def do_qk_norm_mrope_kvcache_update(self, *args, **kwargs):
        raise _unsupported("the fused QK-norm + MRoPE + KV-cache update")

    def _sinks(self, query):
        sinks = self.sinks
        if sinks is None:
            return None
        if sinks.dtype != torch.float32 or not sinks.is_contiguous() or sinks.device != query.device:
            sinks = sinks.detach().to(device=query.device, dtype=torch.float32).contiguous()
        return sinks

    def forward(
        self,
        layer,
        query: torch.Tensor,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        kv_cache: torch.Tensor,
        attn_metadata,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise _unsupported("fused output quantisation (output_scale / output_block_scale)")
        if attn_metadata is None:
            # vLLM's profiling run: no metadata, no attention.
            return output.fill_(0)
        md = attn_metadata
        T = md.num_actual_tokens
        q = query[:T]
        out = output[:T]
        k_buffer, v_buffer = self._kv_buffers(kv_cache)
        k_scale, v_scale = self._scales(layer)
        sinks = self._sinks(query)
        W = self.window_left
        if md.decode:
            table, starts, max_window = md.decode_table(W)
            qd, od = q[: md.num_reqs], out[: md.num_reqs]
            plan = self._plan(
                md,
                ("decode", W, qd, k_buffer, v_buffer, od, sinks, k_scale, v_scale),
                lambda: swa_decode_plan(
                    qd,
                    k_buffer,
                    v_buffer,
                    page_table=table,
                    window_starts=starts,
                    seq_lens=md.seq_lens,
                    page_size=md.block_size,
                    sm_scale=self.scale,
                    logit_cap=self.logits_soft_cap,
                    sinks=sinks,
                    k_scale=k_scale,
                    v_scale=v_scale,
                    max_window=max_window,
                ),
            )
            plan.run(qd, k_buffer, v_buffer, od, sinks=sinks, k_scale=k_scale, v_scale=v_scale)
            return output
        if key is None or value is None:
            # KV-shared layer: the step's K/V were written by the target layer; gather them.
            key, value = self._gather_new_kv(k_buffer, v_buffer, md.slot_mapping[:T], q.dtype, k_scale, v_scale)
        k, v = key[:T], value[:T]
        plan = self._plan(
            md,
            ("extend", W, q, k, v, k_buffer, v_buffer, out, sinks, k_scale, v_scale),
            lambda: swa_extend_plan(
                q,
                k,
                v,
                k_buffer,
                v_buffer,
                md.query_start_loc,
                md.prefix_lens,
                window_left=W,
                page_table=md.block_table,
                window_starts=md.zero_starts,
                page_size=md.block_size,
                causal=True,
                sm_scale=self.scale,
                logit_cap=self.logits_soft_cap,
                sinks=sinks,
                k_scale=k_scale,
                v_scale=v_scale,
                max_extend_len=max(md.max_query_len, 1),
            ),
        )
        plan.run(q, k, v, k_buffer, v_buffer, out, sinks=sinks, k_scale=k_scale, v_scale=v_scale)
        return output

    def _plan(self, md, call: tuple, make):
        """The step's plan for this kind of layer call (made by ``make`` for the first such layer):
        layers of one window, scale, cap and tensor kinds share a plan, whose ``run`` checks each
        layer's tensors against those kinds."""
        op, window_left, *tensors = call
        kinds = tuple(scale_key(t) if i >= len(tensors) - 2 else tensor_key(t) for i, t in enumerate(tensors))
        key = (op, window_left, self.scale, self.logits_soft_cap, *kinds)
        plan = md.plans.get(key)
        if plan is None:
            plan = md.plans[key] = make()
        return plan

    @staticmethod
    def _gather_new_kv(k_buffer, v_buffer, slots, dtype, k_scale, v_scale):
        k, v = k_buffer[slots], v_buffer[slots]
        if k_scale is not None:
            k = (k.to(torch.float32) * k_scale.to(torch.float32)).to(dtype)
            v = (v.to(torch.float32) * v_scale.to(torch.float32)).to(dtype)
        return k.to(dtype), v.to(dtype)


class TritonSWABackend(AttentionBackend):
    """vLLM attention backend ``TRITON_SWA``: triton-swa's paged sliding-window kernels."""

    supported_dtypes: ClassVar[list] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list] = list(_SUPPORTED_KV_CACHE_DTYPES)
    forward_includes_kv_cache_update: bool = False

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_impl_cls():
        return TritonSWAImpl

    @staticmethod
    def get_builder_cls():
        return TritonSWAMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None):
        return [MultipleOf(1)]

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        return 1 <= head_size <= 512

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @classmethod
    def supported_kv_cache_layouts(cls):
        return (KVCacheLayout.LBNHC,)


for _cls in (TritonSWABackend, TritonSWAMetadataBuilder, TritonSWAImpl, TritonSWAMetadata):
    # named as the package that vLLM's registry and pickles resolve them through (CLASS_PATH)
    _cls.__module__ = __package__
