"""``TritonSWAAttnBackend``: the SGLang-shaped attention backend, composed of its parts.

Each part is a mixin of one module, readable alone: the pool policy (:mod:`.pool`), the step's
metadata (:mod:`.metadata`), the batch checks (:mod:`.batch`), the CUDA-graph buffers (:mod:`.graph`),
the layer plans (:mod:`.layers`) and the forward paths (:mod:`.forward`). They share the state this
class's constructor sets; subclasses override their methods (``_resolve_swa_kv_pool``, ``_save``,
``_fused_store_target``, ``_layer_indices``) as they would on one class.
"""

from __future__ import annotations

import torch

from ..runtime.checks import check_tensor
from .batch import _BatchChecks
from .checks import _as_int
from .forward import _Forward
from .graph import _CudaGraphs
from .layers import _LayerPlans
from .metadata import ForwardMetadata, _StepMetadata
from .pool import _KVPools

_RUNNER_ATTRS = ("token_to_kv_pool", "token_to_kv_pool_allocator", "req_to_token_pool", "is_draft_worker", "spec_algorithm", "device")


class TritonSWAAttnBackend(_KVPools, _StepMetadata, _BatchChecks, _CudaGraphs, _LayerPlans, _Forward):
    """Paged sliding-window attention for a hybrid model (sliding and full layers).

    Every input of a step is checked on the host before anything is written: a bad batch raises in
    ``init_forward_metadata``, a bad tensor or layer in ``forward`` before the step's K/V are saved.

    Args:
        model_runner: an object with SGLang's ``ModelRunner`` attribute names (see
            :class:`triton_swa.engine.ModelRunner`): ``token_to_kv_pool``,
            ``token_to_kv_pool_allocator``, ``req_to_token_pool``, ``is_draft_worker``,
            ``spec_algorithm``, ``sliding_window_size``, ``device``.

    Raises:
        TypeError: ``model_runner`` lacks one of those attributes (named), or one has the wrong type.
        ValueError: an SWA pool was resolved but ``sliding_window_size`` is -1, or a bad device.
    """

    def __init__(self, model_runner):
        for name in _RUNNER_ATTRS:
            if not hasattr(model_runner, name):
                raise TypeError(
                    f"model_runner has no attribute {name!r}; the backend reads SGLang's ModelRunner "
                    f"names: {', '.join(_RUNNER_ATTRS)}, sliding_window_size"
                )
        self.model_runner = model_runner
        try:
            self.device = torch.device(model_runner.device)
        except (TypeError, RuntimeError) as e:
            raise ValueError(f"model_runner.device must name a torch device, got {model_runner.device!r}") from e
        if not hasattr(model_runner.req_to_token_pool, "req_to_token"):
            raise TypeError(
                "model_runner.req_to_token_pool has no attribute 'req_to_token' (the int32 [rows, max_context_len] table of full slots)"
            )
        self.req_to_token = check_tensor(
            "model_runner.req_to_token_pool.req_to_token",
            model_runner.req_to_token_pool.req_to_token,
            dtype=torch.int32,
            ndim=2,
            device=self.device,
        )
        window = getattr(model_runner, "sliding_window_size", -1)
        self.sliding_window_size = -1 if window is None else _as_int("model_runner.sliding_window_size", window, -1)
        if not isinstance(model_runner.is_draft_worker, bool):
            raise TypeError(f"model_runner.is_draft_worker must be a bool, got {type(model_runner.is_draft_worker).__name__}")
        if not hasattr(model_runner.spec_algorithm, "is_frozen_kv_mtp"):
            raise TypeError(
                "model_runner.spec_algorithm must be a SpeculativeAlgorithm (with is_frozen_kv_mtp()), "
                f"got {type(model_runner.spec_algorithm).__name__}"
            )
        self._init_kv_pools(model_runner)
        self.forward_metadata: ForwardMetadata | None = None
        self.cuda_graph: dict | None = None
        self._layer_plans: dict = {}  # id(layer) -> _LayerPlan
        # the latest eager run of each kind of decode call (its key but the step's slots) per stream: the
        # next eager step's plan of that kind on that stream takes over its workspace (stream order)
        self._last_decode_runs: dict = {}
        self._checked_batches: dict = {}  # kind of DECODE / TARGET_VERIFY batch -> (tokens, drafts)
        self._max_windows: dict = {}  # (window_left, extend) -> the kernels' max_window
        self._window_plans: dict = {}  # extend -> the CSR window builds of the latest kind of eager step

    def forget_plans(self) -> None:
        """Drop every plan this backend and the ops have cached (layers, the step, window builds, the
        ops' plans by signature): the next step plans afresh. For plans made where launches were only
        recorded (:func:`triton_swa.runtime.launch.recorded_launches`), which hold no compiled kernel."""
        from ..runtime.plans import PlanCache

        PlanCache.clear_all()
        self.forward_metadata = None
        for cache in (self._layer_plans, self._last_decode_runs, self._checked_batches, self._max_windows, self._window_plans):
            cache.clear()
