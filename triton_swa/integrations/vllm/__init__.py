"""vLLM integration: the ``TRITON_SWA`` attention backend for vLLM 0.32's V1 engine.

Importing this package does not import vLLM: the backend, builder, impl and metadata classes live in
:mod:`.classes`, which imports vLLM and is imported on first access to them (``TritonSWABackend``
and the others are attributes of this package then); :func:`register` (:mod:`.registry`) imports
only vLLM's registry. The core library never imports this package. vLLM calls :func:`register`
through the ``vllm.general_plugins`` entry point (pyproject.toml), in the engine and in every
worker; then ``--attention-backend TRITON_SWA`` or
``--attention-config '{"backend_per_kind": {"sliding_window": "TRITON_SWA"}}'`` selects it
(``AttentionBackendEnum.CUSTOM`` resolves to it too, unless another plugin took CUSTOM first).

- :mod:`.registry`: :func:`register`, the ``TRITON_SWA`` name and how its enum member pickles;
- :mod:`.classes`: vLLM's ``AttentionBackend``, ``AttentionMetadataBuilder``, ``AttentionImpl`` and the
  step's metadata, what they support and what they refuse;
- :mod:`.precompile`: the prefill kernels compiled at the engine's start, in vLLM's JIT warm-up.
"""

from __future__ import annotations

from .registry import BACKEND_NAME, CLASS_PATH, register

# The classes' names: attributes of this package from their first access (vLLM resolves CLASS_PATH here)
_LAZY = ("TritonSWABackend", "TritonSWAMetadataBuilder", "TritonSWAImpl", "TritonSWAMetadata")

__all__ = ["BACKEND_NAME", "CLASS_PATH", "register", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        from . import classes

        globals().update({n: getattr(classes, n) for n in _LAZY})
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
