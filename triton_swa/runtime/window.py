"""The window convention (docs/contract.md §1) as the library computes it on the host.

``window_left = W`` (``-1``: full attention). Decode at length ``L`` reads positions
``[max(0, L - W - 1), L)``: ``W + 1`` keys, the current token included. Extend, chunked prefill and
verify after a cached prefix ``P`` read the prefix window ``[max(0, P - W), P)``: the first new token,
at position ``P``, sees ``W`` cached keys. ``triton_swa_reference`` states the same rule on its own,
as the meaning every op is checked against.
"""

from __future__ import annotations

import torch

__all__ = ["window_keys", "window_start"]


def window_keys(window_left: int, *, extend: bool) -> int:
    """Most cached keys one window holds: ``W + 1`` (decode) or ``W`` (extend's prefix); ``-1``: no bound."""
    if window_left < 0:
        return -1
    return window_left if extend else window_left + 1


def window_start(lens, window_left: int, *, extend: bool):
    """First position of the window that ends at ``lens`` (ints or an integer tensor)."""
    keys = window_keys(window_left, extend=extend)
    if isinstance(lens, torch.Tensor):
        return (lens - keys).clamp(min=0) if keys >= 0 else torch.zeros_like(lens)
    return max(0, lens - keys) if keys >= 0 else 0
