"""SGLang integration: ``--attention-backend triton_swa`` on SGLang 0.5.23's own pools, batches and layers.

Importing this module imports SGLang (the core library never does). :func:`register` puts the
backend in SGLang's ``ATTENTION_BACKENDS`` under ``"triton_swa"`` and in the ``--attention-backend`` /
draft-backend choices; SGLang calls it through the ``sglang.srt.plugins`` entry point (see
pyproject.toml; ``SGLANG_PLUGINS=triton_swa`` selects it).

:class:`TritonSWASGLangBackend` subclasses SGLang's ``AttentionBackend`` and hands every step to
:class:`triton_swa.backend.TritonSWAAttnBackend`, which resolves the SWA pool by SPEC §3's policy on
SGLang's real pools and reads SGLang's runner and batch fields by their own names. What SGLang
passes differently is adapted here, per call:

- ``sinks=`` (gpt-oss) arrives as a keyword, not a layer attribute; extra keywords are accepted.
- KV-shared layers (Gemma 4) are called with ``k = v = None, save_kv_cache=False`` and the shared
  layer's ``layer_id``: they read the new tokens' K/V from the pool.
- fp8 scales: ``layer.k_scale_float`` / ``v_scale_float`` (Python floats) when set.
- Speculative tree masks span each request's prefix plus its drafts (``[drafts, prefix + drafts]``
  row-major per request); the kernels take the drafts' ``[drafts, drafts]`` block, cut out here.
- Draft positions of a tree come from ``forward_batch.positions``.

Supported forward modes: IDLE, DECODE, EXTEND, MIXED, DRAFT_EXTEND_V2 and TARGET_VERIFY (chain or
tree). SPLIT_PREFILL, DLLM_EXTEND and PREBUILT raise a ValueError naming the mode, as do layers
whose ``attn_type`` is not DECODER (bidirectional blocks are not wired yet). CUDA graphs: the
metadata is built eagerly in ``init_forward_metadata_out_graph``; capture and replay through
SGLang's graph runner are not wired yet.
"""

from __future__ import annotations

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

from ..backend import TritonSWAAttnBackend

__all__ = ["NAME", "TritonSWASGLangBackend", "register"]

NAME = "triton_swa"
_UNSUPPORTED_MODES = ("SPLIT_PREFILL", "DLLM_EXTEND", "PREBUILT")


class _Layer:
    """A ``RadixAttention`` as the core backend reads a layer, plus this call's ``sinks`` and sharing."""

    def __init__(self, layer, sinks, kv_shared: bool):
        attn_type = getattr(layer, "attn_type", None)
        if attn_type is not None and getattr(attn_type, "name", "DECODER") != "DECODER":
            raise ValueError(f"layer {layer.layer_id}: attn_type {attn_type.name} is not supported by the "
                             "triton_swa SGLang backend yet (only causal DECODER layers)")
        self.layer_id = layer.layer_id
        self.tp_q_head_num, self.tp_k_head_num = layer.tp_q_head_num, layer.tp_k_head_num
        self.head_dim, self.v_head_dim = layer.head_dim, layer.v_head_dim
        self.scaling, self.logit_cap = layer.scaling, layer.logit_cap
        self.sliding_window_size = layer.sliding_window_size
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
        if mask is not None:
            prefix = [int(p) for p in forward_batch.seq_lens_cpu.tolist()]
            need = sum(n * (p + n) for p in prefix)
            if mask.numel() != need:
                raise ValueError(f"spec_info.custom_mask has {mask.numel()} entries; SGLang's layout "
                                 f"([drafts, prefix + drafts] per request) needs {need}")
            blocks, at = [], 0
            for p in prefix:
                blocks.append(mask[at:at + n * (p + n)].view(n, p + n)[:, p:].reshape(-1))
                at += n * (p + n)
            self.custom_mask = torch.cat(blocks)
            positions = getattr(forward_batch, "positions", None)
            self.positions = None if positions is None else positions.to(torch.int64)


class _Batch:
    """An SGLang ``ForwardBatch`` with its verify input adapted; every other field is SGLang's own."""

    def __init__(self, forward_batch):
        self._fb = forward_batch
        spec = forward_batch.spec_info
        self.spec_info = _VerifySpec(spec, forward_batch) if forward_batch.forward_mode.is_target_verify() else spec
        if forward_batch.forward_mode.is_target_verify() and forward_batch.seq_lens_cpu is None:
            raise ValueError("TARGET_VERIFY needs forward_batch.seq_lens_cpu (the committed lengths on the host)")

    def __getattr__(self, name):
        return getattr(self._fb, name)


class TritonSWASGLangBackend(AttentionBackend):
    """triton-swa as an SGLang attention backend (see the module docstring for what is adapted).

    Args:
        model_runner: SGLang's ``ModelRunner`` (or anything with its attribute names).
    """

    def __init__(self, model_runner):
        super().__init__()
        self.core = TritonSWAAttnBackend(model_runner)
        # SGLang reads these off the backend (ForwardBatch carries no pools).
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.max_context_len = self.core.req_to_token.shape[1]
        self.forward_metadata = None

    @staticmethod
    def _resolve_swa_kv_pool(model_runner):
        return TritonSWAAttnBackend._resolve_swa_kv_pool(model_runner)

    def _check_mode(self, forward_batch) -> None:
        name = getattr(forward_batch.forward_mode, "name", str(forward_batch.forward_mode))
        if name in _UNSUPPORTED_MODES:
            raise ValueError(f"forward mode {name} is not supported by the triton_swa SGLang backend")

    def init_forward_metadata(self, forward_batch) -> None:
        self.init_forward_metadata_out_graph(forward_batch)
        self.init_forward_metadata_in_graph(forward_batch)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False) -> None:
        self._check_mode(forward_batch)
        self.core.init_forward_metadata(_Batch(forward_batch))
        self.forward_metadata = self.core.forward_metadata

    def init_forward_metadata_in_graph(self, forward_batch) -> None:
        """Nothing: the step's metadata is built eagerly in ``init_forward_metadata_out_graph``."""

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.core.init_cuda_graph_state(max_bs, max_num_tokens)

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return self.core.get_cuda_graph_seq_len_fill_value()

    def get_cpu_graph_seq_len_fill_value(self) -> int:
        return self.core.get_cuda_graph_seq_len_fill_value()

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None, **kwargs):
        view = _Layer(layer, sinks, kv_shared=k is None)
        return self.core.forward_decode(q, k, v, view, forward_batch, save_kv_cache and k is not None)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None, **kwargs):
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
