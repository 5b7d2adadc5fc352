"""Argument checks shared by pools, ops and the backend: one clear error naming the argument, before any work.

One rule per kind of argument: tensors (:func:`check_tensor`), ints, powers of two, windows, the
scalars of the attention and store ops (scales, caps, K/V scales), sinks, grids; and the dtype sets
the ops accept.
"""

from __future__ import annotations

import math
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


def check_pow2(name: str, value, minimum: int = 1) -> int:
    """Return ``value`` if it is an int power of two ``>= minimum`` (a block size), or raise naming it."""
    check_int(name, value, minimum=minimum)
    if value & (value - 1):
        raise ValueError(f"{name} must be a power of two, got {value}")
    return value


# Queries and a step's new K/V; index tensors; what a pool holds (fp8 e4m3fn, or MI300's e4m3fnuz,
# stored as uint8); the fp8 K/V buffers the ops read (typed, or uint8 storage meaning e4m3fn); sinks.
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
KV_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.float8_e4m3fnuz)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.uint8)
SINK_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def storage_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a KV buffer is stored in: fp8 as uint8 (index_put and friends do not take fp8)."""
    return torch.uint8 if dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz) else dtype


# ---- scalars of the attention and store ops: one rule everywhere ----
#
# A wrong type (a string, a bool, an int tensor) is a TypeError; a wrong value (NaN, inf, 0 or a
# negative number where a positive one is needed, a tensor of the wrong size or device) a ValueError.

SCALE_TENSOR_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _is_number(x) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float))


def check_sm_scale(sm_scale, default: float, name: str = "sm_scale") -> float:
    """``sm_scale`` as a float (``default`` for None): a finite number > 0, or raise naming ``name``."""
    if sm_scale is None:
        return default
    if type(sm_scale) is float and 0.0 < sm_scale < math.inf:  # the common case, at a comparison's cost
        return sm_scale
    if not _is_number(sm_scale):
        raise TypeError(f"{name} must be a float, got {type(sm_scale).__name__}")
    if not (math.isfinite(sm_scale) and sm_scale > 0):
        raise ValueError(f"{name} must be finite and > 0, got {sm_scale!r}")
    return float(sm_scale)


def check_logit_cap(logit_cap, name: str = "logit_cap") -> float:
    """``logit_cap`` as a float (None: 0): finite and >= 0, where 0 turns the soft cap off."""
    if logit_cap is None:
        return 0.0
    if type(logit_cap) is float and 0.0 <= logit_cap < math.inf:
        return logit_cap
    if not _is_number(logit_cap):
        raise TypeError(f"{name} must be a float (0 disables it), got {type(logit_cap).__name__}")
    if not (math.isfinite(logit_cap) and logit_cap >= 0):
        raise ValueError(f"{name} must be finite and >= 0 (0 disables it), got {logit_cap!r}")
    return float(logit_cap)


def check_kv_scale(name: str, scale, device) -> tuple[float, torch.Tensor | None]:
    """A per-tensor K/V scale as ``(host factor, device tensor or None)``.

    None gives ``(1.0, None)``; a Python number must be finite and > 0 and gives ``(scale, None)``; a
    one-element float tensor on ``device`` gives ``(1.0, tensor)`` (read in the kernel, so that a
    CUDA graph replays with its current value; its value is checked only by the debug guard, which
    synchronises).
    """
    if scale is None:
        return 1.0, None
    if isinstance(scale, torch.Tensor):
        if scale.dtype not in SCALE_TENSOR_DTYPES:
            raise TypeError(f"{name} must be a float or a one-element float tensor, got a {scale.dtype} tensor")
        check_tensor(name, scale, device=device)
        if scale.numel() != 1:
            raise ValueError(f"{name} must hold one value (a per-tensor scale), got shape {list(scale.shape)}")
        return 1.0, scale
    if not _is_number(scale):
        raise TypeError(f"{name} must be a float or a one-element float tensor, got {type(scale).__name__}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"{name} must be finite and > 0, got {scale!r}")
    return float(scale), None


def check_sinks(name: str, sinks, heads: int, device) -> torch.Tensor | None:
    """``sinks`` (None, or a contiguous float `[heads]` tensor on ``device``), or raise naming ``name``."""
    if sinks is not None:
        check_tensor(name, sinks, dtype=SINK_DTYPES, device=device, shape=(heads,), contiguous=True)
    return sinks


def split_kv_scale(name: str, scale) -> tuple[float, torch.Tensor | None]:
    """A K/V scale on a launcher's hot path: ``(host factor, tensor read in the kernel or None)``. A
    number (or None) is checked here, on every call, by :func:`check_kv_scale`'s rule; a tensor's dtype,
    shape and device are part of the plan's signature and checked once by the plan."""
    if scale is None:
        return 1.0, None
    if isinstance(scale, torch.Tensor):
        return 1.0, scale
    return check_kv_scale(name, scale, None)[0], None


def check_contiguous(name: str, x: torch.Tensor | None) -> None:
    """Raise ValueError naming ``x`` unless it is contiguous (kernels index it with unit strides)."""
    if x is not None and not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous (strides {x.stride()} for shape {tuple(x.shape)})")


# CUDA's grid limits: axis 0 up to 2**31 - 1 programs, axes 1 and 2 up to 65535.
GRID_LIMITS = (2**31 - 1, 65535, 65535)


def check_grid(op: str, grid: Sequence[int], what: Sequence[str]) -> tuple[int, ...]:
    """Raise ValueError before a launch whose grid exceeds CUDA's limits; ``what`` names each axis."""
    for axis, (n, limit) in enumerate(zip(grid, GRID_LIMITS)):
        if n > limit:
            raise ValueError(
                f"{op}: {what[axis]} gives {n} programs on grid axis {axis}, more than CUDA's limit of {limit}; split the batch"
            )
    return tuple(grid)
