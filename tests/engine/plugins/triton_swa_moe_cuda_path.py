"""Test-side SGLang plugin: gpt-oss's unquantized MoE experts take SGLang's CUDA path (its Triton MoE
runner) while ``SGLANG_FORCE_FUSED_OP_BACKEND=torch`` keeps every other fused op on plain torch.

Why (SGLang 0.5.23): the GPU engine tier forces the fused-op backend to ``torch`` because its compiled
``sgl_kernel`` does not load there. ``UnquantizedFusedMoEMethod`` is a fused op too, and its
``forward_native`` is ``forward_cpu`` (``layers/quantization/unquant.py``), which on a GPU runs
``moe_forward_native`` (``layers/moe/fused_moe_native.py``): a per-expert loop sized by
``tokens_per_expert.cpu()``, a device-to-host copy that CUDA graph capture refuses. This plugin makes
that method's ``forward_native`` call its own ``forward_cuda`` for CUDA tensors: SGLang's Triton
fused-MoE kernels, with ``moe_align_block_size`` and ``moe_sum_reduce`` from the ``sgl_kernel``
stand-in (tests/integration/stubs_cuda). CPU tensors keep SGLang's native path. Routing (``TopK``)
stays on its forced native path (softmax, ``torch.topk``, renormalise: capturable).

Loaded when ``tests/engine/plugins`` is on ``PYTHONPATH`` and ``SGLANG_PLUGINS`` names
``triton_swa_moe_cuda_path`` (``triton_swa.benchmark.serve`` does so for models that ask for it).
"""

from __future__ import annotations


def register() -> None:
    from sglang.srt.layers.quantization.unquant import UnquantizedFusedMoEMethod

    if getattr(UnquantizedFusedMoEMethod, "_triton_swa_moe_cuda_path", False):
        return
    native = UnquantizedFusedMoEMethod.forward_native

    def forward_native(self, layer, dispatch_output):
        if dispatch_output.hidden_states.is_cuda:
            return self.forward_cuda(layer, dispatch_output)
        return native(self, layer, dispatch_output)

    UnquantizedFusedMoEMethod.forward_native = forward_native
    UnquantizedFusedMoEMethod._triton_swa_moe_cuda_path = True
