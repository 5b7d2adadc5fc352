"""Host checks of the backend's arguments that its parts share: ints, index tensors, rows of q, k, v."""

from __future__ import annotations

import operator

import torch

from ..runtime.checks import INDEX_DTYPES, check_tensor


def _as_int(name: str, value, minimum: int | None = None) -> int:
    """``value`` as an int (Python or numpy/torch integer scalars, not bools), or raise naming ``name``."""
    if isinstance(value, bool) or isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_rows(name: str, x, rows: int, heads: int, dim: int, dtype, device) -> None:
    """``x`` is ``[rows, heads * dim]`` or ``[rows, heads, dim]`` (last stride 1) of ``dtype``."""
    check_tensor(name, x, dtype=dtype, device=device)
    ok = (x.dim() == 3 and tuple(x.shape) == (rows, heads, dim)) or (x.dim() == 2 and tuple(x.shape) == (rows, heads * dim))
    if not ok:
        raise ValueError(
            f"{name} must have shape [{rows}, {heads * dim}] or [{rows}, {heads}, {dim}] "
            f"(tokens, heads, head dim of the layer and step), got {list(x.shape)}"
        )
    if x.numel() and x.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous along its last dimension (strides {x.stride()})")


def _check_index(name: str, x, device, length: int | None = None, why: str = "") -> torch.Tensor:
    check_tensor(name, x, dtype=INDEX_DTYPES, device=device, ndim=1)
    if length is not None and x.shape[0] != length:
        raise ValueError(f"{name} must have {length} entries{f' ({why})' if why else ''}, got {x.shape[0]}")
    return x
