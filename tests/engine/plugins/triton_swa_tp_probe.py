"""Test-side SGLang plugin: what each tensor-parallel rank's triton_swa backend sees.

SGLang loads it in every engine process (each TP rank's scheduler is one) when ``tests/engine/plugins``
is on ``PYTHONPATH`` and ``SGLANG_PLUGINS`` names ``triton_swa_tp_probe``; with
``TRITON_SWA_TP_PROBE_LOG`` set it appends lines to that file (the ranks' lines interleave; each is one
short ``write`` of an append-mode file), and changes nothing else:

- ``B``, once per backend built (SGLang's ``TritonSWASGLangBackend``)::

    B tp_rank=<r> tp_size=<n> draft=<bool> kv_pool=<type> swa_pool=<resolved SWA pool's type or None>
      policy=<bool> mapping_is_allocators=<bool or None> allreduce=<torch.distributed:<backend> | shm>
      config_heads=<q>/<kv> original_heads=<q>/<kv>

  ``policy``: the resolved pool is the one the policy of docs/contract.md §3
  (``TritonSWAAttnBackend._resolve_swa_kv_pool``) resolves for this rank's runner;
  ``mapping_is_allocators``: its ``full_to_swa_index_mapping`` is the very tensor of this rank's
  allocator (None without an SWA pool); ``allreduce``: the path SGLang's
  ``GroupCoordinator.all_reduce`` takes on this rank's TP group for float32 CPU tensors
  (``is_shm_available``: sgl_kernel's ``shm_allreduce``, else ``torch.distributed`` on the group's
  backend); ``config_heads``: the model config's full-attention heads (all ranks together), after
  SGLang's CPU padding of heads that do not divide by ``tp_size`` (``original_heads``: before).
- ``L``, on each layer's first call (a RadixAttention, and again for a KV-shared call)::

    L tp_rank=<r> layer=<id> shared=<bool> sliding=<bool> q_heads=<tp_q_head_num> kv_heads=<tp_k_head_num>
      head_dim=<d> kv_buffer_heads=<heads of the K buffer the layer reads>

- ``A``, at the first all-reduce of a float tensor through ``torch.distributed`` in the process::

    A tp_rank=<r> all_reduce=torch.distributed backend=<gloo> dtype=<dtype>
"""

from __future__ import annotations

import os


def _write(line: str) -> None:
    path = os.environ.get("TRITON_SWA_TP_PROBE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def _tp() -> tuple[int, int]:
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    return int(parallel.tp_rank), int(parallel.tp_size)


def _rank() -> str:
    try:
        return str(_tp()[0])
    except Exception:  # noqa: BLE001 - before SGLang's parallel context exists
        return "?"


def _allreduce_path() -> str:
    import torch
    import torch.distributed as dist
    from sglang.srt.distributed.parallel_state import get_tp_group
    from sglang.srt.utils.common import is_shm_available

    group = get_tp_group()
    if is_shm_available(torch.float32, group.world_size, group.local_size):
        return "shm"
    return f"torch.distributed:{dist.get_backend(group.device_group)}"


def _config_heads(model_runner) -> str:
    """The full-attention head counts of the runner's model config, and what they were before SGLang's
    CPU tensor parallelism padded them (``adjust_config_with_unaligned_cpu_tp``; equal when aligned)."""
    try:
        mc = model_runner.model_config
        text = mc.hf_text_config
        original = f"{getattr(text, 'original_num_attention_heads', None)}/{getattr(text, 'original_total_num_kv_heads', None)}"
        return f"config_heads={mc.num_attention_heads}/{mc.get_total_num_kv_heads()} original_heads={original}"
    except Exception as e:  # noqa: BLE001 - evidence only
        return f"config_heads=? ({type(e).__name__})"


def register() -> None:
    if not os.environ.get("TRITON_SWA_TP_PROBE_LOG"):
        return
    import torch
    import torch.distributed as dist

    from triton_swa.backend import TritonSWAAttnBackend
    from triton_swa.integrations.sglang import TritonSWASGLangBackend

    policy = TritonSWAAttnBackend._resolve_swa_kv_pool

    init, extend, decode = TritonSWASGLangBackend.__init__, TritonSWASGLangBackend.forward_extend, TritonSWASGLangBackend.forward_decode

    def __init__(self, model_runner, *args, **kwargs):
        init(self, model_runner, *args, **kwargs)
        rank, size = _tp()
        swa = self._swa_kv_pool
        allocator = model_runner.token_to_kv_pool_allocator
        mapping = None if swa is None else swa.full_to_swa_index_mapping is getattr(allocator, "full_to_swa_index_mapping", None)
        _write(
            f"B tp_rank={rank} tp_size={size} draft={model_runner.is_draft_worker} kv_pool={type(self.token_to_kv_pool).__name__} "
            f"swa_pool={type(swa).__name__ if swa is not None else None} policy={swa is policy(model_runner)} "
            f"mapping_is_allocators={mapping} allreduce={_allreduce_path()} {_config_heads(model_runner)}"
        )
        self._tp_probe_seen = set()

    def seen(self, layer, k) -> None:
        key = (id(layer), k is None)
        if key in self._tp_probe_seen:
            return
        self._tp_probe_seen.add(key)
        k_buf, _ = self.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        _write(
            f"L tp_rank={_rank()} layer={layer.layer_id} shared={k is None} sliding={layer.sliding_window_size >= 0} "
            f"q_heads={layer.tp_q_head_num} kv_heads={layer.tp_k_head_num} head_dim={layer.head_dim} kv_buffer_heads={k_buf.shape[-2]}"
        )

    def forward_extend(self, q, k, v, layer, *args, **kwargs):
        seen(self, layer, k)
        return extend(self, q, k, v, layer, *args, **kwargs)

    def forward_decode(self, q, k, v, layer, *args, **kwargs):
        seen(self, layer, k)
        return decode(self, q, k, v, layer, *args, **kwargs)

    TritonSWASGLangBackend.__init__ = __init__
    TritonSWASGLangBackend.forward_extend = forward_extend
    TritonSWASGLangBackend.forward_decode = forward_decode

    all_reduce = dist.all_reduce
    first = [True]

    def probing_all_reduce(tensor, *args, **kwargs):
        if first[0] and isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
            first[0] = False
            group = kwargs.get("group", args[1] if len(args) > 1 else None)
            _write(f"A tp_rank={_rank()} all_reduce=torch.distributed backend={dist.get_backend(group)} dtype={tensor.dtype}")
        return all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = probing_all_reduce
