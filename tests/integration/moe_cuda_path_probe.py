"""Run by tests/integration/test_sgl_kernel_standins.py in a subprocess (PYTHONPATH: the sgl_kernel
stand-in first, ``TRITON_INTERPRET=1``): SGLang 0.5.23's Triton fused-MoE sequence, the one the GPU
engine tier's gpt-oss takes (``fused_experts_impl``: the stand-in's ``moe_align_block_size``, SGLang's
Triton expert GEMMs, gpt-oss's clamped SwiGLU on interleaved gate/up rows, the stand-in's
``moe_sum_reduce`` above 32 tokens with top-k > 2), on CPU tensors. Prints one JSON line: the largest
error against a float64 per-expert loop, and that loop's largest magnitude. A fourth argument 1
breaks the aligner on purpose (each pair filed under the next expert), to show the check can fail.

SGLang's runtime context (its parallel groups and execution flags) is not published outside an
engine; ``_Off`` answers as an engine without those features does (no deterministic mode, no fused
all-reduce, no symmetric memory). The aligner, the sum-reduce and the CUDA branches are bound as
on CUDA (SGLang binds them only where ``is_cuda()``)."""

from __future__ import annotations

import importlib
import json
import sys

import torch


class _Off:
    def __getattr__(self, name):
        return False if name.startswith("enable") else _Off()

    def __bool__(self):
        return False


def main(tokens: int, top_k: int, block_m: int, broken: int = 0, experts: int = 8, hidden: int = 64, inter: int = 32) -> dict:
    from sglang.kernels.ops.moe import moe_align_block_size as aligner
    from sglang.srt.layers.moe.moe_runner.triton_utils import override_config

    pkg = "sglang.srt.layers.moe.moe_runner.triton_utils."
    align_mod = importlib.import_module(pkg + "moe_align_block_size")
    fused = importlib.import_module(pkg + "fused_moe")
    cfg = importlib.import_module(pkg + "fused_moe_triton_config")
    align_mod.sgl_moe_align_block_size = aligner
    if broken:  # the checker's own check: every pair filed under the next expert
        align_mod.sgl_moe_align_block_size = lambda topk_ids, *rest: aligner((topk_ids + 1) % experts, *rest)
    fused.get_exec = fused.get_parallel = cfg.get_exec = lambda: _Off()
    fused.is_allocation_symmetric = lambda: False
    # the CUDA branches, as on the GPU tier: the row filter of the gated activation, and the combine
    # through sgl_kernel's moe_sum_reduce above 32 tokens (the stand-in; off CUDA SGLang would call
    # vLLM's moe_sum or its own Triton sum instead)
    from sgl_kernel import moe_sum_reduce

    calls = []
    fused._is_cuda = True
    fused.moe_sum_reduce = lambda *args: calls.append(1) or moe_sum_reduce(*args)

    g = torch.Generator().manual_seed(0)
    alpha, limit = 1.702, 7.0  # gpt-oss's SwiGLU
    x = torch.randn(tokens, hidden, generator=g)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) * 0.3
    w2 = torch.randn(experts, hidden, inter, generator=g) * 0.3
    b13 = torch.randn(experts, 2 * inter, generator=g)
    b2 = torch.randn(experts, hidden, generator=g)
    weights, ids = torch.topk(torch.softmax(torch.randn(tokens, experts, generator=g), -1), top_k)
    weights = weights / weights.sum(-1, keepdim=True)
    ids = ids.to(torch.int32)
    with override_config({"BLOCK_SIZE_M": block_m, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1}):
        out = fused.fused_experts_impl(
            x, w13, w2, weights, ids, b13, b2, False, "silu", True, gemm1_alpha=alpha, gemm1_limit=limit, gate_up_interleaved=True
        )
    ref = torch.zeros(tokens, hidden, dtype=torch.float64)
    for t in range(tokens):
        for j in range(top_k):
            e = int(ids[t, j])
            h = x[t].double() @ w13[e].double().T + b13[e].double()
            gate, up = h[::2].clamp(max=limit), h[1::2].clamp(-limit, limit)
            act = gate * torch.sigmoid(gate * alpha) * (up + 1)
            ref[t] += float(weights[t, j]) * (act @ w2[e].double().T + b2[e].double())
    err = float((out.double() - ref).abs().max())
    return {"max_err": err, "ref_max": float(ref.abs().max()), "finite": bool(out.isfinite().all()), "sum_reduce_calls": len(calls)}


if __name__ == "__main__":
    print(json.dumps(main(*(int(a) for a in sys.argv[1:]))))
