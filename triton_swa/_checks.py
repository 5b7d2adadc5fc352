"""Argument checks shared by pools and launchers: one clear error naming the argument, before any work."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def check_tensor(
    name: str,
    x,
    *,
    dtype: torch.dtype | Sequence[torch.dtype] | None = None,
    device: torch.device | str | None = None,
    ndim: int | None = None,
    shape: Sequence[int | None] | None = None,
    contiguous: bool = False,
) -> torch.Tensor:
    """Raise ``TypeError``/``ValueError`` naming ``name`` unless ``x`` is a tensor as described.

    ``shape`` may hold None for a free dimension. Returns ``x`` for chaining.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if dtype is not None:
        allowed = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)
        if x.dtype not in allowed:
            want = " or ".join(str(d) for d in allowed)
            raise TypeError(f"{name} must have dtype {want}, got {x.dtype}")
    if device is not None and not same_device(x.device, torch.device(device)):
        raise ValueError(f"{name} must be on device {device}, got {x.device}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if shape is not None:
        if x.dim() != len(shape) or any(w is not None and w != s for w, s in zip(shape, x.shape)):
            want = "[" + ", ".join("*" if w is None else str(w) for w in shape) + "]"
            raise ValueError(f"{name} must have shape {want}, got {list(x.shape)}")
    if contiguous and not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous (strides {x.stride()} for shape {tuple(x.shape)})")
    return x


def same_device(a: torch.device, b: torch.device) -> bool:
    """Device equality where ``cuda`` and ``cuda:<current>`` count as the same."""
    if a.type != b.type:
        return False
    if a.index is None or b.index is None:
        return True
    return a.index == b.index


def check_int(name: str, value, *, minimum: int | None = None) -> int:
    """Return ``value`` as an int, or raise naming ``name`` (bools are not ints here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_window_left(window_left) -> int:
    """Return ``window_left`` (``W >= 0``, or ``-1`` for full attention), or raise naming it."""
    if isinstance(window_left, bool) or not isinstance(window_left, int):
        raise TypeError(f"window_left must be an int (-1 for full attention), got {type(window_left).__name__}")
    if window_left < -1:
        raise ValueError(f"window_left must be >= -1 (-1 means full attention), got {window_left}")
    return window_left


KV_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn)


def storage_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a KV buffer is stored in: fp8 as uint8 (index_put and friends do not take fp8)."""
    return torch.uint8 if dtype == torch.float8_e4m3fn else dtype
