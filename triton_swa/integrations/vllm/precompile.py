"""The ``TRITON_SWA`` backend's start-time precompile for vLLM 0.32 (issue 40).

vLLM's warm-up (its dummy runs and CUDA-graph capture) does not reach every shape of the extend and
merge kernels, so without this the first real prefills wait for Triton's compiler (3-5 s a kernel on
an H100; vLLM's ``jit_monitor`` warns of each). Here synthetic prefill steps run through the
backend's own builder and impl with their launches recorded, not run, and the distinct kernels then
compile side by side (:func:`triton_swa.runtime.launch.record_and_precompile`), as the SGLang
backend does at its construction.

When it runs: vLLM 0.32 has a JIT warm-up registry (``vllm.model_executor.warmup.jit_warmup``). Its
runners (``GPUModelRunner``, v1 and v2) build the model inside the registry's ``activate()``, and
``kernel_warmup`` (in the worker's ``compile_or_warm_up_model``) compiles what was registered: once
per engine start, after the KV cache is allocated and bound to the layers and after the warm-up
dummy runs, before CUDA-graph capture and before serving. :class:`TritonSWAImpl` registers one hook
(:func:`request_at_start`) when it is constructed; the hook gets the runner's ``VllmConfig`` and
calls :func:`precompile_at_start`. No vLLM function is patched. vLLM turns its JIT warm-up off with
``enforce_eager`` (``kernel_config.enable_jit_warmup = False``, and its ``jit_monitor`` with it):
eager engines skip this precompile too.

This module imports vLLM inside its functions only.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import torch

from ...runtime.launch import precompile_wanted, record_and_precompile, run_start_precompile
from .registry import BACKEND_NAME

__all__ = ["precompile_at_start", "precompile_prefills", "request_at_start"]

# vLLM's logging configuration handles the "vllm" logger and its children only (its handler, and
# propagate=False; the root logger is left alone): under that name the summary shows in vLLM's log.
logger = logging.getLogger(f"vllm.{__name__}")

_HOOK: list = []  # the one registry hook of this process, made at the first request
_MERGE = "_swa_merge_kernel"


def request_at_start() -> None:
    """Ask the vLLM runner being set up (if any) to run :func:`precompile_at_start` in its JIT warm-up.

    A no-op outside a runner's ``jit_warmup_registry.activate()`` (vLLM's registry ignores it then);
    every layer asks for the one hook with no arguments, which the registry keeps once.
    """
    try:
        from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry
    except ImportError:  # a vLLM without the registry: kernels compile at first use, as before
        return
    JitWarmupRegistry.register(_hook())


def _hook():
    if not _HOOK:
        from vllm.model_executor.warmup.jit_warmup import VllmJitKernel

        class TritonSWAPrefillPrecompile(VllmJitKernel):
            """vLLM's warm-up entry for the backend's prefill kernels: one key per runner, its config."""

            def get_warmup_keys(self, vllm_config) -> list:
                return [_Start(vllm_config)]

            def compile(self, compile_key) -> None:
                precompile_at_start(compile_key.vllm_config)

        _HOOK.append(TritonSWAPrefillPrecompile())
    return _HOOK[0]


class _Start:
    """A warm-up key: the runner's ``VllmConfig`` (unhashable itself), hashed by identity."""

    __slots__ = ("vllm_config",)

    def __init__(self, vllm_config):
        self.vllm_config = vllm_config


def precompile_at_start(vllm_config, jobs: int | None = None) -> None:
    """:func:`precompile_prefills` over this process's ``TRITON_SWA`` layers (those of
    ``vllm_config.compilation_config.static_forward_context`` whose KV cache is bound), for the
    model's dtype, ``scheduler_config.max_num_batched_tokens`` and ``model_config.max_model_len``.

    Skipped (nothing logged) when ``TRITON_SWA_PRECOMPILE=0``, when no such layer has a cache, and
    off CUDA or under Triton's interpreter. A failure is logged as a warning and swallowed; the
    summary is logged at INFO."""
    context = getattr(getattr(vllm_config, "compilation_config", None), "static_forward_context", None) or {}
    layers = [
        layer
        for layer in context.values()
        if _ours(layer) and isinstance(getattr(layer, "kv_cache", None), torch.Tensor) and layer.kv_cache.dim() == 4
    ]
    if not layers or not precompile_wanted(layers[0].kv_cache.device):
        return

    def run() -> str:
        return precompile_prefills(
            layers,
            tokens=int(vllm_config.scheduler_config.max_num_batched_tokens),
            dtype=vllm_config.model_config.dtype,
            max_model_len=int(vllm_config.model_config.max_model_len),
            max_num_seqs=getattr(vllm_config.scheduler_config, "max_num_seqs", None) or None,
            jobs=jobs,
        )

    run_start_precompile(run, logger)


def precompile_prefills(
    layers, *, tokens: int, dtype: torch.dtype, max_model_len: int, max_num_seqs: int | None = None, jobs: int | None = None
) -> str:
    """Compile, before serving, the kernels a prefill of these layers launches: a chunk of ``tokens``
    new tokens (``max_num_batched_tokens``, at most ``max_model_len``), then one more over as many
    cached tokens (chunked prefill's next chunk) when the context holds both.

    ``layers``: vLLM ``Attention`` layers of this backend with their KV caches bound (``layer.kv_cache``,
    ``layer.impl``); one of each kind (heads, head size, window, soft cap, sinks, KV-cache dtype, shape
    and strides, KV sharing) is run. Each step is planned as vLLM's runner would hand it to the
    backend: ``CommonAttentionMetadata`` with a block table of the runner's width (vLLM's
    ``get_block_table_width`` of ``max_model_len``), through ``TritonSWAMetadataBuilder.build``, then
    per layer the impl's ``do_kv_cache_update`` (not for a KV-shared layer) and ``forward``, on q, k,
    v split from one qkv buffer. Slots are block 0's. Where the chunk alone takes split-KV (few query
    tiles on many SMs: small heads, short chunks), the chunk is planned again beside 1, 2, ... decodes
    (a mixed step of ``tokens`` tokens in all) until a step no longer splits, since the split count
    and the merge kernel follow the batch size. Launches are recorded, then compiled ``jobs`` at a
    time (:func:`~triton_swa.runtime.launch.record_and_precompile`); the plans made on the way are
    dropped.

    Not covered: shorter chunks and prompts (their own tiles, or other split counts), decode and
    spec-decode steps (vLLM's warm-up and CUDA-graph capture reach them).

    Returns a one-line summary.

    Raises:
        ValueError: ``tokens``, ``max_model_len`` or ``max_num_seqs`` below 1, no layers, or a layer
            without a bound KV cache.
    """
    for name, value in (("tokens", tokens), ("max_model_len", max_model_len), ("max_num_seqs", max_num_seqs)):
        if name == "max_num_seqs" and value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    layers = list(layers)
    if not layers:
        raise ValueError("precompile_prefills needs at least one layer")
    kinds: dict = {}
    for layer in layers:
        cache = getattr(layer, "kv_cache", None)
        if not isinstance(cache, torch.Tensor) or cache.dim() != 4:
            raise ValueError(
                f"layer {getattr(layer, 'layer_name', layer)!r} has no bound KV cache "
                f"([num_blocks, kv_heads, block_size, 2 * head_size]), got {type(cache).__name__}"
            )
        kinds.setdefault(_kind(layer), layer)
    chunk = min(tokens, max_model_len)
    most_reqs = min(chunk, max_num_seqs or chunk)
    device = next(iter(kinds.values())).kv_cache.device
    steps = {"n": 0}
    metadata: dict = {}  # (block_size, batch, prefix) -> the step's metadata
    buffers: dict = {}  # (heads, kv heads, head size) -> qkv, out

    def run_step(launches: list, prefix: int, batch: int) -> bool:
        """One step: the chunk over ``prefix`` cached tokens beside ``batch - 1`` decodes; whether it split."""
        first = len(launches)
        steps["n"] += 1
        for layer in kinds.values():
            block_size = layer.kv_cache.shape[2]
            key = (block_size, batch, prefix)
            if key not in metadata:
                metadata[key] = _step_metadata(layer, chunk, prefix, batch, max_model_len, max_num_seqs)
            md = metadata[key]
            _run_layer(layer, md, chunk, dtype, buffers)
        return any(getattr(x[0], "fn", x[0]).__name__ == _MERGE for x in launches[first:])

    def all_steps(launches: list) -> None:
        for prefix in (0, chunk) if 2 * chunk <= max_model_len else (0,):
            batch = 1
            while run_step(launches, prefix, batch) and batch < most_reqs:
                batch += 1

    def forget() -> None:
        from ...runtime.plans import PlanCache

        metadata.clear()
        buffers.clear()
        PlanCache.clear_all()

    report = record_and_precompile(all_steps, device, jobs=jobs, forget=forget, logger=logger)
    next_chunk = " and its next chunk" if 2 * chunk <= max_model_len else ""
    return (
        f"precompiled {report.kernels} kernel(s) for {len(layers)} layer(s) of {len(kinds)} kind(s) ({report.launches} "
        f"launches of {steps['n']} synthetic step(s): a prefill chunk of {chunk} tokens{next_chunk}; "
        f"recorded in {report.recorded_s:.1f} s, {report.total_s:.1f} s in all"
        f"{f'; {len(report.errors)} error(s)' if report.errors else ''})"
    )


def _ours(layer) -> bool:
    """Whether a vLLM ``Attention`` layer runs on this backend: its ``attn_backend`` (the backend class
    vLLM chose for it) is named ``TRITON_SWA``. (The classes module imports this one: read by name.)"""
    backend = getattr(layer, "attn_backend", None)
    return getattr(backend, "get_name", lambda: None)() == BACKEND_NAME


def _kind(layer) -> tuple:
    """What decides a layer's kernels beyond the step: its impl's shape and features, its cache."""
    impl, cache = layer.impl, layer.kv_cache
    return (
        impl.num_heads,
        impl.num_kv_heads,
        impl.head_size,
        impl.window_left,
        bool(impl.logits_soft_cap),
        impl.sinks is not None,
        impl.kv_cache_dtype,
        impl.kv_sharing_target_layer_name is not None,
        cache.dtype,
        tuple(cache.shape[1:]),
        cache.stride(),
        cache.data_ptr() % 16,
        cache.device,
    )


def _block_table_width(max_model_len: int, block_size: int) -> int:
    """Block-table entries per request, as vLLM 0.32's runners size their tables (a row stride the
    kernels specialise on, and the bound of a full-attention layer's window)."""
    from vllm.utils.math_utils import cdiv
    from vllm.v1.worker.block_table import get_block_table_width

    return get_block_table_width(cdiv(max_model_len, block_size), block_size)


def _step_metadata(layer, chunk: int, prefix: int, batch: int, max_model_len: int, max_num_seqs: int | None):
    """The builder's metadata of one synthetic step for ``layer``'s cache: request 0 extends ``prefix``
    cached tokens by ``chunk - batch + 1`` (the step holds ``chunk`` tokens), requests 1 .. ``batch - 1``
    decode one token each over as many; every block id and slot is block 0's."""
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    cache = layer.kv_cache
    device, block_size = cache.device, cache.shape[2]
    new = [chunk - batch + 1] + [1] * (batch - 1)
    seq_len = prefix + new[0]
    starts = torch.tensor([0, *new], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    width = _block_table_width(max_model_len, block_size)
    common = CommonAttentionMetadata(
        query_start_loc=starts.to(device),
        query_start_loc_cpu=starts,
        seq_lens=torch.full((batch,), seq_len, dtype=torch.int32, device=device),
        num_reqs=batch,
        num_actual_tokens=chunk,
        max_query_len=new[0],
        max_seq_len=seq_len,
        block_table_tensor=torch.zeros(batch, width, dtype=torch.int32, device=device),
        slot_mapping=torch.zeros(chunk, dtype=torch.int64, device=device),
        causal=True,
    )
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=cache.shape[1], head_size=layer.impl.head_size, dtype=cache.dtype)
    # of the config the builder reads max_num_seqs (a persistent buffer's rows) and, for the layers it
    # is given (none here), their windows
    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs or batch), compilation_config=None)
    builder = layer.attn_backend.get_builder_cls()(spec, [], config, device)
    return builder.build(0, common)


def _run_layer(layer, md, tokens: int, dtype: torch.dtype, buffers: dict) -> None:
    """One layer's part of a step, as vLLM's ``Attention`` layer calls the impl: the K/V write
    (``unified_kv_cache_update``; none for a KV-shared layer, which gets no K/V), then the forward
    (``unified_attention_with_output``) into a fresh output."""
    impl, cache = layer.impl, layer.kv_cache
    hq, h, d = impl.num_heads, impl.num_kv_heads, impl.head_size
    key = (hq, h, d)
    if key not in buffers:  # q, k, v as a model's qkv projection splits them; nothing reads them
        qkv = torch.empty(tokens, (hq + 2 * h) * d, dtype=dtype, device=cache.device)
        out = torch.empty(tokens, hq, d, dtype=dtype, device=cache.device)
        buffers[key] = (qkv, out)
    qkv, out = buffers[key]
    q, k, v = (x.view(tokens, -1, d) for x in qkv.split([hq * d, h * d, h * d], dim=-1))
    if impl.kv_sharing_target_layer_name is not None:
        k = v = None
    else:
        impl.do_kv_cache_update(layer, k, v, cache, md.slot_mapping)
    impl.forward(layer, q, k, v, cache, md, out)
