"""Test-only stand-in for ``vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so`` (vLLM 0.32's FlashAttention 2
extension, 293 MiB), for vLLM's real engine on the lent GPU (``scripts/gpu.sh vllm-engine``).

Why it exists: on the CUDA platform, ``vllm/v1/attention/backends/fa_utils.py`` imports
``vllm.vllm_flash_attn`` at module level, and that package raises ImportError unless one of its two
compiled extensions (``_vllm_fa2_C`` or ``_vllm_fa3_C``, 457 MiB together) imports. Gemma 3's model
file reaches it through ``mm_encoder_attention``, so no model loads without it. The engines compared
here never run FlashAttention: the attention backend is named (``TRITON_SWA`` or ``TRITON_ATTN``) and
the model is text only. So ``scripts/gpu.sh vllm-engine`` copies this file to
``vllm/vllm_flash_attn/_vllm_fa2_C.py`` of the installed vLLM: the import succeeds and registers no op.
Anything that does call FlashAttention then fails at the call with torch's own error for a missing op
(``torch.ops._vllm_fa2_C`` has no ``varlen_fwd``), naming it.
"""

STAND_IN = True
