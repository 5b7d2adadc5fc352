"""Testing helpers for triton-swa and for users who compare their own kernels with the reference.

- :func:`assert_close`: the one loud comparison (max-abs, RMS, mismatch count, first bad index; NaN
  and inf must agree; per-dtype default tolerances).
- :func:`make_pool_state`: a random but realistic serving state built by the real allocators
  (several requests, permuted free lists, window eviction, NaN in every slot no window may read).
- :func:`use_interpreter`: run the kernels on a CPU through Triton's interpreter.
- :func:`without_native_fp8`: read fp8 pools as bytes decoded in the kernel, as on sm_80/86.
- :func:`legacy_backend`: the backend with the pool-resolution rule the policy replaced (regression
  tests and the demo only).
- :func:`launch_key`: a recorded launch as the compiled kernel it runs (tests of what a start-time
  precompile covers).
"""

from .compare import DEFAULT_TOLERANCES, assert_close
from .fp8 import without_native_fp8
from .interpreter import use_interpreter
from .launch_keys import launch_key
from .legacy import legacy_backend, legacy_resolve_by_allocator_type
from .pool_state import PoolState, Request, make_pool_state

__all__ = [
    "DEFAULT_TOLERANCES",
    "PoolState",
    "Request",
    "assert_close",
    "launch_key",
    "legacy_backend",
    "legacy_resolve_by_allocator_type",
    "make_pool_state",
    "use_interpreter",
    "without_native_fp8",
]
