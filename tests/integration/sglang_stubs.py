"""Test-only stand-ins that SGLang 0.5.23's imports need, put on ``sys.path`` only where needed.

- ``stubs/torchvision``: where the real torchvision does not import (PyPI's wheels do not load
  beside the CPU torch of the test tier); ``sglang.srt.configs`` imports ``torchvision.transforms``.
- ``stubs_cuda/sgl_kernel``: where torch has CUDA and the real ``sgl_kernel`` (SGLang's CUDA kernel
  wheel, several hundred MiB) is not installed; SGLang's layer modules import its names at module
  level on CUDA, and its Triton attention backend asks it whether the GPU supports PDL.

Used by ``conftest.py`` and by ``triton-swa bench --op sglang_backend``
(``triton_swa/benchmark/sglang_backend.py``), both loading it by path as tests/ is no package; the
benchmark runs from a checkout with them and without them elsewhere. A working real package always
wins: a stub is added only when the real one is missing.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHVISION_STUBS = os.path.join(HERE, "stubs")
CUDA_STUBS = os.path.join(HERE, "stubs_cuda")


def _real_torchvision_imports() -> bool:
    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        importlib.import_module("torchvision.transforms")
    except Exception:
        # A half-imported torchvision must not shadow the stub.
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        return False
    return True


def _cuda_torch() -> bool:
    import torch

    return torch.cuda.is_available() and torch.version.cuda is not None


def install() -> list[str]:
    """Put the stubs this environment needs on ``sys.path``; returns the names stubbed (none
    where SGLang is not installed)."""
    if importlib.util.find_spec("sglang") is None:
        return []
    stubbed = []
    if TORCHVISION_STUBS in sys.path or not _real_torchvision_imports():
        if TORCHVISION_STUBS not in sys.path:
            sys.path.insert(0, TORCHVISION_STUBS)
        stubbed.append("torchvision")
    if CUDA_STUBS in sys.path or (_cuda_torch() and importlib.util.find_spec("sgl_kernel") is None):
        if CUDA_STUBS not in sys.path:
            sys.path.insert(0, CUDA_STUBS)
        stubbed.append("sgl_kernel")
    return stubbed
