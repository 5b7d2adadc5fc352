"""The window convention of docs/contract.md §1, stated once.

``window_left = W`` (``-1`` means full attention). A query at absolute position ``p`` attends the keys
at positions ``[max(0, p - W), p]``: W + 1 keys including itself (FlashInfer's ``window_left``,
SGLang's ``layer.sliding_window_size``; Hugging Face's ``sliding_window = S`` is ``W = S - 1``).

Note on a peer: SGLang's Triton decode path keeps only ``min(seq_len, W)`` keys, one short of this
rule. triton-swa does not replicate that.
"""

from __future__ import annotations

import torch


def check_window_left(window_left) -> int:
    """``window_left`` as an int ``>= -1``, or a TypeError/ValueError naming it."""
    if isinstance(window_left, bool) or not isinstance(window_left, int):
        raise TypeError(f"window_left must be an int (-1 for full attention), got {type(window_left).__name__}")
    if window_left < -1:
        raise ValueError(f"window_left must be >= -1 (-1 means full attention), got {window_left}")
    return window_left


def decode_window_start(seq_len, window_left: int):
    """First key position a decode query sees at sequence length ``L`` (the current token included).

    The window is the last ``min(L, W + 1)`` tokens, so it starts at ``L - min(L, W + 1)``.
    Works on ints and on integer tensors alike.
    """
    window_left = check_window_left(window_left)
    if window_left < 0:
        return seq_len * 0
    if isinstance(seq_len, torch.Tensor):
        return torch.clamp(seq_len - (window_left + 1), min=0)
    return max(0, seq_len - (window_left + 1))


def extend_window_start(prefix_len, window_left: int):
    """First cached key position that new tokens after a prefix of length ``P`` can see.

    The first new token sits at position ``P`` and sees ``[max(0, P - W), P]``; later new tokens see
    less of the prefix. So the cached keys needed are ``[max(0, P - W), P)``.
    """
    window_left = check_window_left(window_left)
    if window_left < 0:
        return prefix_len * 0
    if isinstance(prefix_len, torch.Tensor):
        return torch.clamp(prefix_len - window_left, min=0)
    return max(0, prefix_len - window_left)


def window_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window_left: int, causal: bool = True) -> torch.Tensor:
    """Boolean ``[Tq, Tk]`` mask: may the query at ``q_pos[i]`` attend the key at ``k_pos[j]``.

    Causal: ``k <= p``. Window (``W >= 0``): ``p - k <= W``. A non-causal mask (a draft block that
    proposes all its tokens at once) keeps only the window's lower bound.
    """
    window_left = check_window_left(window_left)
    diff = q_pos.reshape(-1, 1).long() - k_pos.reshape(1, -1).long()
    mask = torch.ones_like(diff, dtype=torch.bool)
    if causal:
        mask &= diff >= 0
    if window_left >= 0:
        mask &= diff <= window_left
    return mask
