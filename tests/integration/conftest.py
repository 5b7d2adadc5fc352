"""Engine-integration tiers: shared import set-up.

SGLang 0.5.23's pool, allocator and backend modules import ``sglang.srt.configs``, which imports
``torchvision.transforms`` at module level. Where the real torchvision does not import (PyPI's
wheels do not load beside the CPU torch of the test tier), ``stubs/torchvision`` stands in for it;
it is put on ``sys.path`` only then, so a working torchvision is always the one used.
``scripts/setup_sglang.sh`` installs the rest of the tier.
"""

import importlib
import importlib.util
import os
import sys

STUBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stubs")


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


# Only where SGLang is installed (scripts/setup_sglang.sh): nothing else may see the stub.
if importlib.util.find_spec("sglang") is not None and STUBS not in sys.path and not _real_torchvision_imports():
    sys.path.insert(0, STUBS)
