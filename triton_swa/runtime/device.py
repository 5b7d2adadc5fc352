"""Facts about the device a launch runs on, read once per device.

Under Triton's interpreter (a CPU run) the ops size their work as for a small GPU: the numbers only
steer split counts and tiles there, never correctness.
"""

from __future__ import annotations

import os

import torch

__all__ = ["device_sizes", "interpreting"]

# A small GPU, as the interpreter pretends to be: 4 SMs with Hopper's shared memory.
_INTERPRETER_SIZES = (4, 228 * 1024)
_SIZES: dict = {}


def interpreting() -> bool:
    """Whether Triton's interpreter runs the kernels (``TRITON_INTERPRET=1``, read at each call)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def device_sizes(device: torch.device) -> tuple[int, int]:
    """``(SM count, shared memory bytes per SM)`` of ``device``; a small GPU's off CUDA."""
    if device.type != "cuda":
        return _INTERPRETER_SIZES
    sizes = _SIZES.get(device)
    if sizes is None:
        props = torch.cuda.get_device_properties(device)
        smem = getattr(props, "shared_memory_per_multiprocessor", 0) or _INTERPRETER_SIZES[1]
        sizes = _SIZES[device] = (props.multi_processor_count, smem)
    return sizes
