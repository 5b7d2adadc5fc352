"""Test-side SGLang plugin: stand-ins for the compiled packages SGLang 0.5.23's speculative paths import
on a CUDA device, where the lent GPU's image lacks them. Loaded for every attention backend the GPU
engine tier compares (``triton_swa.testing.sglang_engine.gpu_engine_env``), so each costs the same
under all of them. Each stand-in takes effect only where the real package does not import.

- ``cutlass`` (NVIDIA's CuteDSL): ``DualGemm._select_mode`` (``layers/dual_gemm.py``, built by every
  Llama MLP: the EAGLE and EAGLE3 drafts) imports the CuteDSL dual-GEMM module to ask whether its
  fused kernel may run. That kernel is for sm100 only (``can_use_dual_gemm`` requires
  ``is_sm100_supported()``), so on any other GPU the answer is "no": the stand-in gives that answer
  (mode ``None``, the plain gate/up projection) without the import.
- ``flash_mla``: EAGLE's worker imports ``FlashMLABackend`` only to ask whether the draft's attention
  backend is one (``isinstance``) before capturing its draft-extend graph. The stand-in registers a
  module of that name holding an empty class no backend derives from: the answer SGLang gets is the
  one it would get with FlashMLA installed, since no compared backend is FlashMLA.
- ``flashinfer``: DFLASH's start-up rehearses its sampling verify (``prewarm_sampling``), whose kernel
  SGLang compiles just in time against FlashInfer's headers (``kernels/ops/speculative/sampling.py``;
  without FlashInfer: "Cannot find flashinfer package"). The stand-in marks that sampling verify
  unavailable (``dflash_utils._DFLASH_SAMPLING_VERIFY_AVAILABLE``), the state SGLang itself runs
  DFLASH in on NPUs: no rehearsal, greedy verify unchanged (every request of the tier is greedy), and
  a sampled request takes SGLang's own fallback.

``register()`` returns the list of stand-ins it installed (tests read it).
"""

from __future__ import annotations

import importlib
import sys
import types

FLASHMLA_BACKEND = "sglang.srt.layers.attention.flashmla_backend"


def _imports(name: str) -> bool:
    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 - an import that fails for any reason is what is stood in
        return False
    return True


def _dual_gemm() -> bool:
    from sglang.srt.layers.dual_gemm import DualGemm

    if getattr(DualGemm, "_triton_swa_standin", False) or _imports("cutlass"):
        return False
    select = DualGemm._select_mode

    def _select_mode(self, gate_up_proj, hidden_size):
        from sglang.srt.utils import is_cuda, is_sm100_supported

        if is_cuda() and not is_sm100_supported():
            return None  # can_use_dual_gemm's own answer off sm100
        return select(self, gate_up_proj, hidden_size)

    DualGemm._select_mode = _select_mode
    DualGemm._triton_swa_standin = True
    return True


def _flashmla() -> bool:
    if FLASHMLA_BACKEND in sys.modules or _imports(FLASHMLA_BACKEND):
        return False
    module = types.ModuleType(FLASHMLA_BACKEND, "triton-swa GPU engine tier stand-in: flash_mla is not installed")
    module.FlashMLABackend = type("FlashMLABackend", (), {"__doc__": "Stand-in: no attention backend is this class."})
    sys.modules[FLASHMLA_BACKEND] = module
    return True


def _dflash_sampling_verify() -> bool:
    if _imports("flashinfer"):
        return False
    from sglang.srt.speculative import dflash_utils

    if not dflash_utils._DFLASH_SAMPLING_VERIFY_AVAILABLE:
        return False
    dflash_utils._DFLASH_SAMPLING_VERIFY_AVAILABLE = False
    return True


def register() -> list[str]:
    installed = []
    for name, standin in (("cutlass", _dual_gemm), ("flash_mla", _flashmla), ("flashinfer", _dflash_sampling_verify)):
        if standin():
            installed.append(name)
    return installed
