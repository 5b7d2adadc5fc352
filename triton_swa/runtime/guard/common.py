"""What every check of the guard shares: reading index tensors to the host, naming the first bad
entry in the error, offsets vectors, duplicate slots, host copies of device lengths, and deferring
arguments too malformed to check to the op's own argument checks (:class:`_Defer`)."""

from __future__ import annotations

import torch


class _Defer(ValueError):
    """Arguments too malformed to check (not a tensor, wrong rank or length, a page size the pool
    contradicts): the op's own always-on checks reject them with their own message, so the wrapper
    lets the op run into them rather than pre-empting it with a different error."""


def _tensor(name: str, x, ndim: int | None = None, *, integer: bool = True) -> torch.Tensor:
    """``x`` if it is a tensor the checks can read (else :class:`_Defer`)."""
    if not isinstance(x, torch.Tensor):
        raise _Defer(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if ndim is not None and x.dim() != ndim:
        raise _Defer(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if integer and (x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool):
        raise _Defer(f"{name} must be an integer tensor, got {x.dtype}")
    return x


def _defer(message: str):
    raise _Defer(message)


def _host(name: str, x, ndim: int = 1) -> torch.Tensor:
    """An index tensor as int64 on the host (a synchronisation)."""
    return _tensor(name, x, ndim).detach().to("cpu", torch.int64)


def _first(bad: torch.Tensor) -> int | None:
    """Index of the first True of a host bool vector, or None."""
    hits = bad.nonzero()
    return int(hits[0, 0]) if hits.numel() else None


def _fail(op: str, message: str):
    raise ValueError(f"{op} (debug check): {message}")


def _check_cpu_copies(op: str, arguments: dict) -> None:
    """Every ``<name>_cpu`` argument equals ``<name>``."""
    for name, host in arguments.items():
        if not name.endswith("_cpu") or host is None or arguments.get(name[:-4]) is None:
            continue
        dev = _host(name[:-4], torch.as_tensor(arguments[name[:-4]]), None).reshape(-1)
        cpu = torch.as_tensor(host).to("cpu", torch.int64).reshape(-1)
        if cpu.shape != dev.shape:
            _fail(op, f"{name} has {cpu.numel()} entries but {name[:-4]} has {dev.numel()}")
        i = _first(cpu != dev)
        if i is not None:
            _fail(op, f"request {i} (batch index): {name}[{i}] = {int(cpu[i])} disagrees with {name[:-4]}[{i}] = {int(dev[i])}")


def _check_indptr(op: str, name: str, ptr: torch.Tensor, end_max: int | None, *, end_exact: int | None = None, what: str) -> torch.Tensor:
    """A host ``[B + 1]`` offsets vector: 0 first, never decreasing, ending in bounds; returns the counts."""
    if ptr.numel() == 0:
        _defer(f"{name} must have B + 1 entries, got none")
    if int(ptr[0]) != 0:
        _fail(op, f"{name}[0] must be 0, got {int(ptr[0])}")
    counts = ptr[1:] - ptr[:-1]
    b = _first(counts < 0)
    if b is not None:
        _fail(op, f"request {b} (batch index): {name} decreases from {int(ptr[b])} to {int(ptr[b + 1])}")
    end = int(ptr[-1])
    if end_exact is not None and end != end_exact:
        _fail(op, f"request {len(counts) - 1} (batch index): {name}[-1] = {end} but {what} has {end_exact}")
    if end_max is not None and end > end_max:
        b = _first(ptr[1:] > end_max)
        _fail(op, f"request {b} (batch index): {name}[{b + 1}] = {int(ptr[b + 1])} runs past the {end_max} entries of {what}")
    return counts


def _flat(counts: torch.Tensor):
    """(request, offset in its window) of every entry of windows of ``counts`` entries (host int64)."""
    total = int(counts.sum())
    b = torch.repeat_interleave(torch.arange(len(counts)), counts, output_size=total)
    first = torch.cumsum(counts, 0) - counts
    return b, torch.arange(total) - first[b]


def _check_count(name: str, value) -> None:
    """Host sizes (``max_window``, ``max_extend_len``, ...) the op itself requires to be ints >= 0."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        _defer(f"{name} must be an int >= 0, got {value!r}")


def _check_window_left(window_left) -> None:
    if isinstance(window_left, bool) or not isinstance(window_left, int) or window_left < -1:
        _defer(f"window_left must be an int >= -1, got {window_left!r}")


def _check_page_size(page_size, mapping=None) -> None:
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        _defer(f"page_size must be an int >= 1, got {page_size!r}")
    if isinstance(mapping, torch.Tensor) and mapping.dim() == 1 and (mapping.numel() - 1) % page_size:
        _defer(f"page_size={page_size} disagrees with the mapping's {mapping.numel()} entries")


def _buffer_rows(name: str, buf) -> int:
    _tensor(name, buf, integer=False)
    if buf.dim() < 1:
        _defer(f"{name} must have at least one dimension")
    return int(buf.shape[0])


def _duplicates(op: str, values: torch.Tensor, keys: torch.Tensor, describe) -> None:
    """Raise when two entries with different ``keys`` carry the same value (host int64); ``describe(i)`` names entry i."""
    if values.numel() < 2:
        return
    order = torch.argsort(values, stable=True)
    v, k = values[order], keys[order]
    i = _first((v[1:] == v[:-1]) & (k[1:] != k[:-1]))
    if i is not None:
        a, c = int(order[i]), int(order[i + 1])
        _fail(op, f"{describe(a)} and {describe(c)} share one slot (a slot of another token or request)")
