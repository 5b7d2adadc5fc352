"""Stub of ``torchvision.transforms.v2`` (see the package docstring)."""

from torchvision import InterpolationMode, _module_getattr
from torchvision.transforms.v2 import functional

__all__ = ["InterpolationMode", "functional"]
__getattr__ = _module_getattr("torchvision.transforms.v2")
