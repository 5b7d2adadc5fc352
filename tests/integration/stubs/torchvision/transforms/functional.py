"""Stub of ``torchvision.transforms.functional`` (see the package docstring)."""

from torchvision import InterpolationMode, _module_getattr

__all__ = ["InterpolationMode"]
__getattr__ = _module_getattr("torchvision.transforms.functional")
