"""The attention backend: SGLang's pool-resolution policy, per-step metadata, per-layer dispatch.

``TritonSWAAttnBackend(model_runner)`` is shaped like an SGLang attention backend. Once per step,
``init_forward_metadata`` builds the window indices of the sliding layers (built from
``req_to_token`` and translated to SWA slots in one fused launch) and the indices of the full
layers; every layer then reuses them. This package holds no Triton code: it turns pool state into
kernel arguments.

Its parts, each a module of its own (the class composes them, :mod:`.facade`):

- :mod:`.pool`: which pool sliding layers translate against (docs/contract.md §3) and which holds K/V;
- :mod:`.metadata`: the step's metadata (``LayerIndices``, ``ForwardMetadata``), built once per step;
- :mod:`.batch`: a step's batch checks, on the host, before any launch;
- :mod:`.graph`: the CUDA-graph buffers, refilled at capture and replay;
- :mod:`.layers`: each layer call's checks and the layer plans its later calls reuse;
- :mod:`.forward`: the forward paths, planned and checked;
- :mod:`.checks`: the argument checks they share.
"""

from .facade import TritonSWAAttnBackend
from .metadata import ForwardMetadata, LayerIndices

__all__ = ["ForwardMetadata", "LayerIndices", "TritonSWAAttnBackend"]
