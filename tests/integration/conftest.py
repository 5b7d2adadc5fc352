"""Engine-integration tiers: shared import set-up.

SGLang 0.5.23's pool, allocator and backend modules import ``sglang.srt.configs``, which imports
``torchvision.transforms`` at module level, and on a CUDA torch its layer modules import
``sgl_kernel``. ``sglang_stubs.install()`` puts test-only stand-ins on ``sys.path`` for whichever of
the two does not import here (``stubs/torchvision`` on a CPU torch, ``stubs_cuda/sgl_kernel`` on a
GPU without SGLang's kernel wheel), so a working real package is always the one used.
``scripts/setup_sglang.sh`` (CPU) and ``scripts/gpu.sh tests`` (the lent GPU, from carried wheels)
install the rest of the tier.
"""

import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "_triton_swa_sglang_stubs", os.path.join(os.path.dirname(os.path.abspath(__file__)), "sglang_stubs.py")
)
_stubs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_stubs)
_stubs.install()
