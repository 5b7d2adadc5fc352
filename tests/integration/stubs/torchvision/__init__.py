"""Test-only stand-in for ``torchvision``, for the SGLang integration tier on a CPU.

Why it exists: ``sglang.srt.mem_cache.memory_pool`` (and so every pool, allocator and backend
module) imports ``sglang.srt.configs``, whose multimodal configs import ``torchvision.transforms``
at module level. PyPI's torchvision wheels are built against a CUDA torch of their own and do not
load beside the CPU torch of this tier (``operator torchvision::nms does not exist``), and no
attention test ever touches an image transform. So the names those modules bind at import time
exist here, and using any of them raises.

It is put on ``sys.path`` only when the real torchvision cannot be imported
(``tests/integration/conftest.py`` and ``scripts/setup_sglang.sh``). While it is there,
transformers 5.19's ``is_torchvision_available()`` (a ``find_spec`` check) answers True, so tests
of this tier must not build image processors.
"""

import enum
import importlib

__version__ = "0.0.0+triton-swa-test-stub"
IS_STUB = True


class _Unavailable:
    """A name bound at import time whose use needs the real torchvision."""

    def __init__(self, qualname):
        self._qualname = qualname

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._qualname}: torchvision is a test stub here (tests/integration/stubs); install the real one")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unavailable(f"{self._qualname}.{name}")

    def __repr__(self):
        return f"<torchvision stub {self._qualname}>"


def _module_getattr(module_name):
    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        # `from torchvision import transforms` asks for the attribute before the submodule.
        try:
            return importlib.import_module(f"{module_name}.{name}")
        except ModuleNotFoundError:
            return _Unavailable(f"{module_name}.{name}")

    return __getattr__


class InterpolationMode(enum.Enum):
    """Same members and values as torchvision's, so that defaults written at import time resolve."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


__getattr__ = _module_getattr("torchvision")
