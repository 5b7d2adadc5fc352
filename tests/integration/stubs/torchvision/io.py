"""Stub of ``torchvision.io`` (see the package docstring)."""

from torchvision import _module_getattr

__getattr__ = _module_getattr("torchvision.io")
