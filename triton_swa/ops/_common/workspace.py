"""The split-KV workspace of eager calls, kept per (device, stream): no allocation per call.

An eager call with splits needs float32 partials (decode and extend) and, where the splits merge in
place, zeroed int32 counters (decode: one per split-kernel program; every call leaves them zero).
Each stream has one buffer of each, grown as needed, so calls on concurrent streams never share
them, and calls on one stream use them in stream order (a call's merge has read its partials before
the next call's kernels write them). Inside a CUDA-graph capture there is no workspace (None): a
graph allocates its own, since buffers shared by graphs replayed on several streams could collide.
"""

from __future__ import annotations

import math

import torch
import triton

from ...runtime import poison
from ...runtime.launch import current_stream

__all__ = ["eager_workspace", "stream_workspace"]


class _StreamWorkspace:
    """One stream's buffers and the views calls of each size take of them."""

    __slots__ = ("counters", "partials", "views")

    def __init__(self):
        self.counters = self.partials = None
        # (counters, partials' length) -> (counters, partials' view, their addresses)
        self.views: dict = {}


_STREAMS: dict = {}  # (device, stream) -> _StreamWorkspace


def _stream_key(device: torch.device):
    """(device, current stream) of an eager call, or None inside a CUDA-graph capture."""
    if device.type != "cuda":
        return (device, 0)
    if torch.cuda.is_current_stream_capturing():
        return None
    return (device, current_stream(device.index))


def _grown(buf, n: int, dtype: torch.dtype, device: torch.device, zero: bool) -> torch.Tensor:
    if buf is not None and buf.numel() >= n:
        return buf
    size = max(1024, triton.next_power_of_2(n))
    return torch.zeros(size, dtype=dtype, device=device) if zero else torch.empty(size, dtype=dtype, device=device)


def stream_workspace(device: torch.device) -> _StreamWorkspace | None:
    """The current stream's workspace on ``device`` (its buffers, for tests), or None in a capture."""
    key = _stream_key(device)
    return None if key is None else _STREAMS.get(key)


def eager_workspace(device: torch.device, counters: int, part_numel: int) -> tuple | None:
    """``(counters, partials, counters' address, partials' address)`` of an eager call on the current
    stream: ``counters`` zeroed int32 words (at least that many; 0: none needed, the buffer is still
    given) and a float32 view of ``part_numel`` partials, NaN-filled while poisoning is on (as a fresh
    allocation would be); None inside a CUDA-graph capture."""
    key = _stream_key(device)
    if key is None:
        return None
    ws = _STREAMS.get(key)
    if ws is None:
        ws = _STREAMS[key] = _StreamWorkspace()
    views = ws.views.get((counters, part_numel))
    if views is None:
        sem = _grown(ws.counters, max(counters, 1), torch.int32, device, True)
        part = _grown(ws.partials, part_numel, torch.float32, device, False)
        if sem is not ws.counters or part is not ws.partials or len(ws.views) > 256:
            ws.views.clear()  # views of buffers replaced, or of sizes that no longer come
            ws.counters, ws.partials = sem, part
        view = part[:part_numel]
        views = ws.views[(counters, part_numel)] = (sem, view, sem.data_ptr(), view.data_ptr())
    if poison.poison_enabled():
        views[1].fill_(math.nan)
    return views
