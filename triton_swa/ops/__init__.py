"""Triton kernels, one module per op."""

from .decode import swa_decode

__all__ = [
    "swa_decode",
]
