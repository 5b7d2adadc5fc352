"""Stub of ``torchvision.transforms`` (see the package docstring)."""

from torchvision import InterpolationMode, _module_getattr
from torchvision.transforms import functional

__all__ = ["InterpolationMode", "functional"]
__getattr__ = _module_getattr("torchvision.transforms")
