"""Index guard: a debug mode that checks, before any launch, every index a kernel will read.

A kernel that reads a slot outside its buffer, the dummy slot 0, an evicted SWA slot or another
request's slot returns plausible numbers, not an error. In debug mode every public op first reads its
index tensors back to the host (a device synchronisation) and raises a ``ValueError`` naming the
request (its batch index), the position and the slot of the first bad index, before anything is
launched or written.

Turning it on:

- ``debug=True`` on a call of any public op: :func:`~triton_swa.swa_decode`,
  :func:`~triton_swa.swa_extend`, :func:`~triton_swa.build_window_indices`,
  :func:`~triton_swa.build_window_page_table`, :func:`~triton_swa.swa_out_cache_loc`,
  :func:`~triton_swa.store_kv`. ``debug=False`` turns it off for that call whatever the environment
  says; ``debug=None`` (the default) follows the environment.
- ``TRITON_SWA_DEBUG=1`` in the environment: debug for every call that does not pass ``debug``. The
  variable is read once, when this module is imported (reading ``os.environ`` costs about a
  microsecond per call on a small host); after changing it at run time call
  :func:`refresh_debug_env`. Accepted values: ``1``/``true``/``yes``/``on`` and
  ``0``/``false``/``no``/``off``/empty.

Off, the guard costs one keyword and one flag test per call: about 0.4 us on a busy 2-core AMD EPYC
host (a bare function: 0.12 us undecorated, 0.52 us wrapped), about 1 us (8%) of ``swa_decode``'s
host path there (``python bench/bench_guard.py --host``); ``bench/bench_guard.py`` on a GPU writes
the off/on/undecorated rows.
While a CUDA graph is being captured the checks are skipped (they synchronise, which capture
forbids); a captured graph replays with metadata refreshed outside the capture, which
:func:`check_forward_metadata` validates.

What is checked (each op's check is a function here, named ``check_<op>``):

- ``swa_decode``: CSR ``kv_indptr`` starts at 0, never decreases and ends within ``kv_indices``;
  every listed slot lies in ``[1, k_buffer rows)`` and appears once per window; no window holds more
  than ``max_window`` keys.
  Page-table form: ``0 <= window_starts <= seq_lens``, the table is wide enough for every window,
  and every page a window covers lies in ``[1, num_pages)``.
- ``swa_extend``: ``qo_indptr`` starts at 0, never decreases and ends within ``q``'s tokens, no
  request has more than ``max_extend_len`` tokens, ``prefix_lens >= 0``; the cached prefix covers
  the keys the new tokens see, ``[max(0, P - W), P)`` (``[0, P)`` at ``W = -1``): a CSR list (which
  ends at position ``P - 1``) holds at least those and at most ``P`` entries, a page table has
  ``0 <= window_starts <= max(0, P - W)`` and columns for every page up to ``P - 1``; every slot or
  page read is in range and not the dummy (entries the kernel never reads are not checked);
  ``q_positions`` of request ``b`` lie in ``[P, P + E)``; each custom-mask block ``[E, E]`` fits in
  ``custom_mask`` (and ``mask_indptr [B + 1]`` steps by ``E * E``).
- ``build_window_indices`` / ``build_window_page_table``: ``req_pool_indices`` are rows of
  ``req_to_token``, ``0 <= prefix_lens <= seq_lens <= max_context_len``; every token of every
  window has a full slot in ``[1, mapping size - 1)`` and, with a mapping, a live SWA slot (not 0:
  not evicted or unmapped); no two windows share a slot; page tables: slots keep their in-page offset
  and a page's tokens share its page; ``num_indices`` equals the true count, ``out`` buffers and
  ``max_pages`` are large enough (the ops would truncate silently).
- ``swa_out_cache_loc`` / ``store_kv``: every ``loc`` lies in ``[0, mapping size - 1)`` (or the
  buffers' rows), a real token (``loc > 0``) has an SWA slot, translated slots lie in
  ``[0, rows)`` of both buffers, and no two tokens write the same slot. ``loc = 0`` is padding (it
  writes the dummy slot) and is allowed; ``swa_out_cache_loc`` also passes the mapping's ``-1``
  sentinel through; every other negative slot is refused.
- Any argument named ``<name>_cpu`` must equal the argument ``<name>`` (host copies of device lengths).

Padding: CUDA-graph padding entries point at ``req_to_token`` row 0 with a length of 1, so their
windows are one dummy slot. The op-level checks therefore accept a window that is exactly one entry
equal to 0 (or one page 0); the index builders and :func:`check_forward_metadata` know row 0 and
exempt its tokens instead.

Backend: :func:`check_forward_batch` checks, before the step's index builds launch, the device
contents they read (rows of ``req_to_token``, lengths and their sums, host copies, window slots);
:func:`check_forward_metadata` compares a step's ``backend.forward_metadata`` with the
reference path's indices, index for index, and checks the windows' slots are live.
"""

from __future__ import annotations

import functools
import inspect
import os

import torch

from .window import window_start

__all__ = [
    "ENV_VAR",
    "check_build_window_indices",
    "check_build_window_page_table",
    "check_forward_batch",
    "check_forward_metadata",
    "check_store_kv",
    "check_swa_decode",
    "check_swa_extend",
    "check_swa_out_cache_loc",
    "debug_enabled",
    "guarded",
    "refresh_debug_env",
]

ENV_VAR = "TRITON_SWA_DEBUG"
_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"", "0", "false", "no", "off"})


def _read_env() -> bool:
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError(f"{ENV_VAR} must be 1/true/yes/on or 0/false/no/off (or unset), got {os.environ[ENV_VAR]!r}")


_DEBUG_ENV = _read_env()


def refresh_debug_env() -> bool:
    """Re-read ``TRITON_SWA_DEBUG`` (it is cached at import); returns the new setting."""
    global _DEBUG_ENV
    _DEBUG_ENV = _read_env()
    return _DEBUG_ENV


def debug_enabled(debug: bool | None = None) -> bool:
    """Whether a call with this ``debug`` argument runs the guard: ``debug`` itself, or the cached
    environment setting when it is None."""
    if debug is None:
        return _DEBUG_ENV
    if not isinstance(debug, bool):
        raise TypeError(f"debug must be a bool or None, got {type(debug).__name__}")
    return debug


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def guarded(check_fn):
    """Decorator: add a keyword ``debug`` to a public op; when on, ``check_fn`` runs first.

    ``check_fn`` receives exactly the op's arguments, bound to the op's signature with its defaults
    applied (so it sees every parameter, however the caller passed it); before it, every argument
    ``<name>_cpu`` is compared with ``<name>``. Off, the wrapper calls the
    op directly. The op stays reachable undecorated as ``wrapper.__wrapped__``, and the check as
    ``wrapper.guard_check`` (tests replace it with a spy).
    """

    def decorate(fn):
        sig = inspect.signature(fn)
        if "debug" in sig.parameters:
            raise TypeError(f"{fn.__name__} already has a 'debug' parameter")
        check_sig = inspect.signature(check_fn)
        takes_any = any(p.kind is p.VAR_KEYWORD for p in check_sig.parameters.values())
        missing = [n for n in sig.parameters if n not in check_sig.parameters and not takes_any]
        if missing:
            raise TypeError(f"{check_fn.__name__} cannot take {fn.__name__}'s parameters {missing}")

        @functools.wraps(fn)
        def wrapper(*args, debug=None, **kwargs):
            if debug is None:
                if not _DEBUG_ENV:
                    return fn(*args, **kwargs)
            elif debug is False:
                return fn(*args, **kwargs)
            elif debug is not True:
                raise TypeError(f"debug must be a bool or None, got {type(debug).__name__}")
            if not _capturing():
                bound = sig.bind(*args, **kwargs)
                bound.apply_defaults()
                try:
                    _check_devices(bound.arguments)
                    _check_cpu_copies(fn.__name__, bound.arguments)
                    wrapper.guard_check(*bound.args, **bound.kwargs)
                except _Defer:
                    pass  # malformed arguments: the op's own checks name them
            return fn(*args, **kwargs)

        wrapper.guard_check = check_fn
        params = list(sig.parameters.values())
        debug_param = inspect.Parameter("debug", inspect.Parameter.KEYWORD_ONLY, default=None, annotation="bool | None")
        at = next((i for i, p in enumerate(params) if p.kind is p.VAR_KEYWORD), len(params))
        wrapper.__signature__ = sig.replace(parameters=params[:at] + [debug_param] + params[at:])
        return wrapper

    return decorate


# ----- helpers ---------------------------------------------------------------------------------------


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


def _check_devices(arguments: dict) -> None:
    """Defer unless every tensor argument (host copies ``*_cpu`` aside) lives on one real device."""
    devices = {x.device for name, x in arguments.items() if isinstance(x, torch.Tensor) and not name.endswith("_cpu")}
    if len(devices) > 1 or any(d.type == "meta" for d in devices):
        _defer(f"tensor arguments on several devices or on meta: {sorted(map(str, devices))}")


def _length_fields(forward_batch) -> dict:
    """A batch's device lengths beside their host copies (None where the batch has none)."""
    fields = {"seq_lens": forward_batch.seq_lens, "seq_lens_cpu": getattr(forward_batch, "seq_lens_cpu", None)}
    for name in ("extend_prefix_lens", "extend_seq_lens"):
        if getattr(forward_batch, name, None) is not None:
            fields[name] = getattr(forward_batch, name)
            fields[name + "_cpu"] = getattr(forward_batch, name + "_cpu", None)
    return fields


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


def _slot_problem(slot: int, rows: int) -> str:
    if slot == 0:
        return "is the dummy slot 0 (an evicted or unmapped SWA slot translates to 0)"
    if slot < 0:
        return "is negative"
    return f"is past the buffer's {rows} rows"


def _check_slots(op: str, slots, req, pos, at, rows: int, counts, *, pos_is_offset: bool = False) -> None:
    """Every slot in ``[1, rows)``; a window of one dummy slot is a CUDA-graph padding entry."""
    bad = (slots < 1) | (slots >= rows)
    if bad.any():
        bad &= ~((slots == 0) & (counts[req] == 1))
    i = _first(bad)
    if i is not None:
        b, s = int(req[i]), int(slots[i])
        where = f"window entry {int(pos[i])}" if pos_is_offset else f"position {int(pos[i])}"
        _fail(op, f"request {b} (batch index), {where}: slot {s} (kv_indices[{int(at[i])}]) {_slot_problem(s, rows)}")


def _check_csr(op: str, kv_indptr, kv_indices, rows: int, B: int, *, need=None, prefix=None, max_count=None) -> None:
    """A CSR window list. Decode (``need`` None) reads every entry. Extend reads the last ``need[b]``
    entries of request ``b``'s list, which ends at position ``prefix[b] - 1``: the list must hold at
    least those and no more than the prefix has; earlier entries are never read, so not checked."""
    ptr = _host("kv_indptr", kv_indptr)
    if ptr.numel() != B + 1:
        _defer(f"kv_indptr must have B + 1 = {B + 1} entries, got {ptr.numel()}")
    _tensor("kv_indices", kv_indices, 1)
    counts = _check_indptr(op, "kv_indptr", ptr, kv_indices.numel(), what="kv_indices")
    if need is not None:
        b = _first(counts < need)
        if b is not None:
            _fail(
                op,
                f"request {b} (batch index): its cached prefix list holds {int(counts[b])} keys in kv_indices, "
                f"fewer than the window's {int(need[b])} (positions [{int(prefix[b] - need[b])}, {int(prefix[b])}))",
            )
        b = _first(counts > prefix)
        if b is not None:
            _fail(
                op,
                f"request {b} (batch index): its cached prefix list holds {int(counts[b])} keys in kv_indices, more "
                f"than its {int(prefix[b])} prefix tokens (a list that ends at position prefix_lens - 1)",
            )
    if max_count is not None:
        b = _first(counts > max_count)
        if b is not None:
            _fail(op, f"request {b} (batch index): its window holds {int(counts[b])} keys, more than max_window={max_count}")
    read = counts if need is None else need
    req, off = _flat(read)
    # entry index in kv_indices: decode reads from each list's start, extend its last `need` entries
    at = ptr[:-1][req] + off if need is None else ptr[1:][req] - read[req] + off
    slots = kv_indices.detach()[at.to(kv_indices.device)].to("cpu", torch.int64)
    pos = off if need is None else prefix[req] - read[req] + off
    _check_slots(op, slots, req, pos, at, rows, read, pos_is_offset=need is None)
    where = "window entry" if need is None else "position"
    _duplicates(
        op,
        req * rows + slots,
        off,
        lambda i: f"request {int(req[i])} (batch index) {where} {int(pos[i])} (slot {int(slots[i])}, kv_indices[{int(at[i])}])",
    )


def _check_page_table(
    op: str,
    page_table,
    starts: torch.Tensor,
    ends: torch.Tensor,
    page_size: int,
    rows: int,
    *,
    ends_name: str,
    read_from: torch.Tensor | None = None,
) -> None:
    """A page table whose row ``b`` starts at the page of position ``starts[b]``: the columns of every
    position the kernel reads, ``[read_from, ends)`` (default ``[starts, ends)``), exist and hold pages
    in ``[1, num_pages)``."""
    _tensor("page_table", page_table, 2)
    B, width = page_table.shape
    if B != starts.numel() or (width > 1 and page_table.stride(1) != 1) or rows % page_size:
        _defer("page_table rows, its strides or the buffer's whole pages are wrong")
    b = _first(starts < 0)
    if b is not None:
        _fail(op, f"request {b} (batch index): window_starts[{b}] = {int(starts[b])} is negative")
    read_from = starts if read_from is None else read_from
    b = _first(read_from < starts)
    if b is not None:
        _fail(
            op,
            f"request {b} (batch index): window_starts[{b}] = {int(starts[b])} is past the first position the "
            f"window reads, {int(read_from[b])}",
        )
    b = _first(ends < read_from)
    if b is not None:
        _fail(op, f"request {b} (batch index): window_starts[{b}] = {int(read_from[b])} is past {ends_name}[{b}] = {int(ends[b])}")
    base = starts // page_size
    lo = read_from // page_size - base
    pages = torch.where(ends > read_from, (ends - 1) // page_size + 1 - base, torch.zeros_like(starts))
    b = _first(pages > width)
    if b is not None:
        _fail(
            op,
            f"request {b} (batch index): window [{int(read_from[b])}, {int(ends[b])}) needs {int(pages[b])} "
            f"page_table columns from window_starts {int(starts[b])}, more than the page_table's {width}",
        )
    used = torch.where(ends > read_from, pages - lo, torch.zeros_like(pages))
    req, off = _flat(used)
    j = lo[req] + off
    entries = page_table.detach()[req.to(page_table.device), j.to(page_table.device)].to("cpu", torch.int64)
    num_pages = rows // page_size
    bad = (entries < 1) | (entries >= num_pages)
    if bad.any():
        # a padding entry: a one-token window on the dummy page
        bad &= ~((entries == 0) & ((ends - read_from)[req] == 1))
    i = _first(bad)
    if i is not None:
        b, p = int(req[i]), int(entries[i])
        pos = max(int(read_from[b]), (int(base[b]) + int(j[i])) * page_size)
        slot = p * page_size + pos % page_size
        why = (
            "is the dummy page 0 (an evicted or unmapped SWA page translates to 0)"
            if p == 0
            else "is negative"
            if p < 0
            else f"is past the buffer's {num_pages} pages"
        )
        _fail(op, f"request {b} (batch index), position {pos}: slot {slot} on page {p} (page_table[{b}, {int(j[i])}]) {why}")
    _duplicates(
        op,
        req * num_pages + entries,
        j,
        lambda i: f"request {int(req[i])} (batch index) page_table[{int(req[i])}, {int(j[i])}] (page {int(entries[i])})",
    )


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


# ----- swa_decode ------------------------------------------------------------------------------------


def check_swa_decode(
    q,
    k_buffer,
    v_buffer,
    *,
    kv_indptr=None,
    kv_indices=None,
    page_table=None,
    window_starts=None,
    seq_lens=None,
    page_size=1,
    max_window=None,
    **extra,
) -> None:
    """The debug check of :func:`~triton_swa.swa_decode` (module docstring); raises ValueError."""
    op = "swa_decode"
    _check_page_size(page_size)
    _check_count("max_window", max_window)
    B = _buffer_rows("q", q)
    rows = min(_buffer_rows("k_buffer", k_buffer), _buffer_rows("v_buffer", v_buffer))
    if kv_indptr is not None and kv_indices is not None:
        _check_csr(op, kv_indptr, kv_indices, rows, B, max_count=max_window)
    elif page_table is not None and window_starts is not None and seq_lens is not None:
        starts, ends = _host("window_starts", window_starts), _host("seq_lens", seq_lens)
        if starts.numel() != B or ends.numel() != B:
            _defer(f"window_starts and seq_lens must have B = {B} entries, got {starts.numel()} and {ends.numel()}")
        if max_window is not None:
            b = _first(ends - starts > max_window)
            if b is not None:
                _fail(
                    op, f"request {b} (batch index): window [{int(starts[b])}, {int(ends[b])}) holds more than max_window={max_window} keys"
                )
        _check_page_table(op, page_table, starts, ends, page_size, rows, ends_name="seq_lens")


# ----- swa_extend ------------------------------------------------------------------------------------


def check_swa_extend(
    q,
    k,
    v,
    k_buffer,
    v_buffer,
    qo_indptr,
    prefix_lens,
    *,
    window_left,
    kv_indptr=None,
    kv_indices=None,
    page_table=None,
    window_starts=None,
    page_size=1,
    custom_mask=None,
    mask_indptr=None,
    q_positions=None,
    max_extend_len=None,
    max_window=None,
    **extra,
) -> None:
    """The debug check of :func:`~triton_swa.swa_extend` (module docstring); raises ValueError."""
    op = "swa_extend"
    _check_window_left(window_left)
    _check_page_size(page_size)
    _check_count("max_extend_len", max_extend_len)
    T = _buffer_rows("q", q)
    _tensor("k_buffer", k_buffer, integer=False)
    _tensor("v_buffer", v_buffer, integer=False)
    rows = k_buffer.shape[0] * (k_buffer.shape[1] if k_buffer.dim() == 4 else 1)
    rows = min(rows, v_buffer.shape[0] * (v_buffer.shape[1] if v_buffer.dim() == 4 else 1))
    P = _host("prefix_lens", prefix_lens)
    B = P.numel()
    qo = _host("qo_indptr", qo_indptr)
    if qo.numel() != B + 1:
        _defer(f"qo_indptr must have B + 1 = {B + 1} entries, got {qo.numel()}")
    # rows of q past the last request are allowed (never read, never written)
    E = _check_indptr(op, "qo_indptr", qo, T, what="q")
    b = _first(P < 0)
    if b is not None:
        _fail(op, f"request {b} (batch index): prefix_lens[{b}] = {int(P[b])} is negative")
    if max_extend_len is not None and B:
        b = _first(E > max_extend_len)
        if b is not None:
            _fail(
                op,
                f"request {b} (batch index): {int(E[b])} new tokens, more than max_extend_len={max_extend_len} "
                "(the grid would skip the rest)",
            )
    # The cached keys a request's new tokens see: [max(0, P - W), P) ([0, P) at W = -1). (max_window
    # only sizes the split count; the kernel covers the whole window whatever it says.)
    start = window_start(P, window_left, extend=True)
    need = P - start
    if kv_indptr is not None and kv_indices is not None:
        _check_csr(op, kv_indptr, kv_indices, rows, B, need=need, prefix=P)
    elif page_table is not None and window_starts is not None:
        ws = _host("window_starts", window_starts)
        if ws.numel() != B:
            _defer(f"window_starts must have B = {B} entries, got {ws.numel()}")
        _check_page_table(op, page_table, ws, P, page_size, rows, ends_name="prefix_lens", read_from=start)
    if q_positions is not None:
        pos = _host("q_positions", q_positions)
        if pos.numel() != T:
            _defer(f"q_positions must have T = {T} entries, got {pos.numel()}")
        req = torch.repeat_interleave(torch.arange(B), E, output_size=T)
        t = _first((pos < P[req]) | (pos >= (P + E)[req]))
        if t is not None:
            b = int(req[t])
            _fail(
                op,
                f"request {b} (batch index), new token {t - int(qo[b])}: q_positions[{t}] = {int(pos[t])} is "
                f"outside its new tokens' positions [{int(P[b])}, {int(P[b] + E[b])})",
            )
    if custom_mask is not None and mask_indptr is not None:
        _tensor("custom_mask", custom_mask, 1, integer=False)
        mi = _host("mask_indptr", mask_indptr)
        if mi.numel() < B:
            _defer(f"mask_indptr must have at least B = {B} entries, got {mi.numel()}")
        size = E * E
        b = _first(mi[:B] < 0)
        if b is not None:
            _fail(op, f"request {b} (batch index): mask_indptr[{b}] = {int(mi[b])} is negative")
        b = _first(mi[:B] + size > custom_mask.numel())
        if b is not None:
            _fail(
                op,
                f"request {b} (batch index): its [{int(E[b])}, {int(E[b])}] mask block at mask_indptr[{b}] = "
                f"{int(mi[b])} runs past custom_mask's {custom_mask.numel()} entries",
            )
        if mi.numel() == B + 1:
            b = _first(mi[1:] - mi[:-1] != size)
            if b is not None:
                _fail(
                    op,
                    f"request {b} (batch index): mask_indptr steps by {int(mi[b + 1] - mi[b])}, but its mask block "
                    f"is [{int(E[b])}, {int(E[b])}] = {int(size[b])} entries",
                )


# ----- index builders --------------------------------------------------------------------------------


def _window_bounds(op, req_to_token, req_pool_indices, seq_lens, window_left, prefix_lens):
    """Host (rows, starts, ends) of every request's window after range checks of rows and lengths."""
    _check_window_left(window_left)
    _tensor("req_to_token", req_to_token, 2)
    R, C = req_to_token.shape
    rows = _host("req_pool_indices", req_pool_indices)
    B = rows.numel()
    b = _first((rows < 0) | (rows >= R))
    if b is not None:
        _fail(op, f"request {b} (batch index): req_pool_indices[{b}] = {int(rows[b])} is not a row of req_to_token [0, {R})")
    L = _host("seq_lens", seq_lens)
    if L.numel() != B:
        _defer(f"seq_lens must have B = {B} entries, got {L.numel()}")
    b = _first((L < 0) | (L > C))
    if b is not None:
        _fail(op, f"request {b} (batch index): seq_lens[{b}] = {int(L[b])} is outside [0, max_context_len={C}]")
    ends = L
    if prefix_lens is not None:
        P = _host("prefix_lens", prefix_lens)
        if P.numel() != B:
            _defer(f"prefix_lens must have B = {B} entries, got {P.numel()}")
        b = _first((P < 0) | (P > L))
        if b is not None:
            _fail(op, f"request {b} (batch index): prefix_lens[{b}] = {int(P[b])} is outside [0, seq_lens[{b}] = {int(L[b])}]")
        ends = P
    starts = window_start(ends, window_left, extend=prefix_lens is not None)
    return rows, starts, ends


def _check_window_slots(op, req_to_token, rows, starts, ends, mapping=None, page_size=None, *, slot_rows=None, swa_rows=None) -> None:
    """Every in-window token of every request (row 0, padding, exempt) has a full slot in range, and with a
    mapping a live SWA slot; no slot is shared between two tokens; paged: offsets and pages agree."""
    dev = req_to_token.device
    counts = ends - starts
    req, off = _flat(counts)
    pos = starts[req] + off
    real = rows[req] != 0
    req, pos = req[real], pos[real]
    if req.numel() == 0:
        return
    row = rows[req]
    full = req_to_token.detach()[row.to(dev), pos.to(dev)].to("cpu", torch.int64)
    upper = slot_rows if slot_rows is not None else (mapping.numel() - 1 if mapping is not None else None)

    def name(i):
        return f"request {int(req[i])} (batch index) position {int(pos[i])}"

    bad = full < 1 if upper is None else (full < 1) | (full >= upper)
    i = _first(bad)
    if i is not None:
        s = int(full[i])
        why = (
            "is 0, the dummy slot (an unwritten req_to_token entry)"
            if s == 0
            else "is negative"
            if s < 0
            else f"is past the {upper} full slots"
        )
        _fail(op, f"{name(i)} (req_to_token[{int(row[i])}, {int(pos[i])}]): full slot {s} {why}")
    # Requests may share full slots (a cached common prefix), one request's positions may not; two
    # different full slots never share an SWA slot.
    _duplicates(op, row * (int(full.max()) + 1) + full, pos, lambda i: f"{name(i)} (full slot {int(full[i])})")
    swa = None
    if mapping is not None:
        _tensor("mapping", mapping, 1)
        swa = mapping.detach()[full.to(mapping.device)].to("cpu", torch.int64)
        bad = swa < 1 if swa_rows is None else (swa < 1) | (swa >= swa_rows)
        i = _first(bad)
        if i is not None:
            s = int(swa[i])
            why = (
                "is 0: evicted or never allocated, though inside the window"
                if s == 0
                else "is negative"
                if s < 0
                else f"is past the SWA buffer's {swa_rows} rows"
            )
            _fail(op, f"{name(i)}: SWA slot {s} (mapping[{int(full[i])}]) {why}")
        _duplicates(op, swa, full, lambda i: f"{name(i)} (full slot {int(full[i])}, SWA slot {int(swa[i])})")
    if page_size is not None and page_size > 1:
        ps = page_size
        # the kernels read each page through the slot of its first token, which may lie before the window
        head_pos = pos // ps * ps
        head = req_to_token.detach()[row.to(dev), head_pos.to(dev)].to("cpu", torch.int64)
        for kind, slot, head_slot in (("full", full, head), ("SWA", swa, None)):
            if slot is None:
                continue
            if head_slot is None:
                head_slot = mapping.detach()[head.clamp(0, mapping.numel() - 1).to(mapping.device)].to("cpu", torch.int64)
            i = _first(slot % ps != pos % ps)
            if i is not None:
                _fail(
                    op,
                    f"{name(i)}: {kind} slot {int(slot[i])} sits at offset {int(slot[i] % ps)} of its page, not at "
                    f"the position's offset {int(pos[i] % ps)} (page_size {ps})",
                )
            i = _first(slot // ps != head_slot // ps)
            if i is not None:
                _fail(
                    op,
                    f"{name(i)}: {kind} slot {int(slot[i])} is on page {int(slot[i] // ps)}, but its page's first "
                    f"token (position {int(head_pos[i])}) is on page {int(head_slot[i] // ps)}",
                )


def check_build_window_indices(
    req_to_token,
    req_pool_indices,
    seq_lens,
    *,
    window_left,
    prefix_lens=None,
    mapping=None,
    page_size=None,
    num_indices=None,
    out=None,
    **extra,
) -> None:
    """The debug check of :func:`~triton_swa.build_window_indices` (module docstring); raises ValueError."""
    op = "build_window_indices"
    _check_count("num_indices", num_indices)
    if page_size is not None:
        _check_page_size(page_size, mapping)
    rows, starts, ends = _window_bounds(op, req_to_token, req_pool_indices, seq_lens, window_left, prefix_lens)
    total = int((ends - starts).sum())
    if num_indices is not None and num_indices != total:
        lens = "prefix_lens" if prefix_lens is not None else "seq_lens"
        _fail(
            op,
            f"num_indices={num_indices}, but the windows hold {total} indices (window_index_count of the device "
            f"{lens}): num_indices was computed from other lengths, e.g. a host copy that disagrees with {lens}",
        )
    if out is not None and getattr(out, "kv_indices", None) is not None and out.kv_indices.numel() < total:
        _fail(op, f"out.kv_indices holds {out.kv_indices.numel()} entries, fewer than the windows' {total} (it would be truncated)")
    _check_window_slots(op, req_to_token, rows, starts, ends, mapping)


def check_build_window_page_table(
    req_to_token, req_pool_indices, seq_lens, *, window_left, page_size, prefix_lens=None, mapping=None, max_pages=None, out=None, **extra
) -> None:
    """The debug check of :func:`~triton_swa.build_window_page_table` (module docstring); raises ValueError."""
    op = "build_window_page_table"
    _check_count("max_pages", max_pages)
    _check_page_size(page_size, mapping)
    rows, starts, ends = _window_bounds(op, req_to_token, req_pool_indices, seq_lens, window_left, prefix_lens)
    width, source = max_pages, f"max_pages={max_pages}"
    if width is None and out is not None and getattr(out, "page_table", None) is not None:
        width = out.page_table.shape[1]
        source = f"out.page_table's width ({width} columns)"
    if width is not None and isinstance(page_size, int) and page_size >= 1:
        first = starts // page_size
        pages = torch.where(ends > starts, (ends - 1) // page_size + 1 - first, torch.zeros_like(ends))
        b = _first(pages > width)
        if b is not None:
            _fail(
                op,
                f"request {b} (batch index): window [{int(starts[b])}, {int(ends[b])}) spans {int(pages[b])} pages "
                f"of page_size {page_size}, more than {source}: the pages past it would be dropped (give "
                f"max_pages >= {int(pages.max())}, e.g. max_window_pages(...))",
            )
    _check_window_slots(op, req_to_token, rows, starts, ends, mapping, page_size)


# ----- writes ----------------------------------------------------------------------------------------


def _check_write_slots(op, loc, mapping, rows: int | None, rows_name: str) -> None:
    locs = _host("loc" if op == "store_kv" else "out_cache_loc", loc)
    source = "loc" if op == "store_kv" else "out_cache_loc"
    # swa_out_cache_loc passes the mapping's -1 sentinel through (docs/contract.md §2); a store never takes it
    sentinel_ok = rows is None
    if mapping is not None:
        _tensor("mapping", mapping, 1)
        n_map = mapping.numel()
        i = _first(((locs < 0) & ~((locs == -1) & sentinel_ok)) | (locs >= n_map - 1))
        if i is not None:
            s = int(locs[i])
            why = "is negative" if s < 0 else f"is past the {n_map - 1} full slots of the mapping"
            _fail(op, f"token {i}: full slot {s} ({source}[{i}]) {why}")
        slots = mapping.detach()[locs.to(mapping.device)].to("cpu", torch.int64)
        i = _first((locs > 0) & (slots <= 0))
        if i is not None:
            _fail(
                op,
                f"token {i}: full slot {int(locs[i])} ({source}[{i}]) has SWA slot {int(slots[i])} "
                f"(mapping[{int(locs[i])}]: evicted or never allocated); its K/V would be lost",
            )
    else:
        slots = locs
    if rows is not None:
        i = _first((slots < 0) | (slots >= rows))
        if i is not None:
            s = int(slots[i])
            via = f" (mapping[{int(locs[i])}])" if mapping is not None else f" ({source}[{i}])"
            why = "is negative" if s < 0 else f"is past the {rows} rows of {rows_name}"
            _fail(op, f"token {i}: slot {s}{via} {why}")
    real = slots > 0
    idx = torch.arange(slots.numel())[real]
    _duplicates(op, slots[real], idx, lambda i: f"token {int(idx[i])}")


def check_swa_out_cache_loc(out_cache_loc, mapping, *, out=None, **extra) -> None:
    """The debug check of :func:`~triton_swa.swa_out_cache_loc` (module docstring); raises ValueError."""
    if isinstance(out, torch.Tensor) and isinstance(out_cache_loc, torch.Tensor) and out.numel() < out_cache_loc.numel():
        _defer("out is smaller than out_cache_loc")
    _check_write_slots("swa_out_cache_loc", out_cache_loc, mapping, None, "")


def check_store_kv(k_buffer, v_buffer, loc, k, v, *, mapping=None, k_scale=None, v_scale=None, **extra) -> None:
    """The debug check of :func:`~triton_swa.store_kv` (module docstring); raises ValueError."""
    rows_k, rows_v = _buffer_rows("k_buffer", k_buffer), _buffer_rows("v_buffer", v_buffer)
    n = _tensor("loc", loc, 1).numel()
    for x, buf in ((k, k_buffer), (v, v_buffer)):
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != (n, *buf.shape[1:]):
            _defer("k or v does not match loc and the buffers")
    for scale in (k_scale, v_scale):
        if isinstance(scale, torch.Tensor) and scale.numel() != 1:
            _defer("a scale tensor must hold one value")
    rows, name = (rows_k, "k_buffer") if rows_k <= rows_v else (rows_v, "v_buffer")
    _check_write_slots("store_kv", loc, mapping, rows, name)


# ----- backend step ----------------------------------------------------------------------------------


def _pool_rows(pool) -> int | None:
    """Rows of a KV pool's buffers (``k_buffer[0]``), when it exposes them."""
    bufs = getattr(pool, "k_buffer", None)
    if isinstance(bufs, (list, tuple)) and bufs and isinstance(bufs[0], torch.Tensor):
        return int(bufs[0].shape[0])
    return None


def _free_pages(allocator) -> torch.Tensor | None:
    pages = getattr(allocator, "free_pages", None)
    return pages.detach().to("cpu", torch.int64) if isinstance(pages, torch.Tensor) else None


def _compare(op: str, kind: str, what: str, got: torch.Tensor, want: torch.Tensor, describe) -> None:
    got, want = got.to("cpu", torch.int64).reshape(-1), want.to("cpu", torch.int64).reshape(-1)
    if got.numel() != want.numel():
        _fail(op, f"{kind} layers: {what} has {got.numel()} entries, the reference {want.numel()}")
    i = _first(got != want)
    if i is not None:
        _fail(op, f"{kind} layers: {describe(i)}: {what} holds {int(got[i])}, the reference path builds {int(want[i])}")


def _host_window_list(rtt, rows, starts, ends, mapping) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR ``(kv_indptr, kv_indices)`` of the windows ``[starts, ends)`` of ``req_to_token`` rows, SWA
    slots through ``mapping`` when given (host int64)."""
    counts = (ends - starts).clamp(min=0)
    req, off = _flat(counts)
    slots = _slots_at(rtt, rows[req], starts[req] + off, mapping)
    return torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(counts, 0)]), slots


def _host_page_table(op, kind, rtt, rows, starts, ends, page_size: int, mapping, width: int) -> torch.Tensor:
    """Page table ``[B, width]`` of the windows ``[starts, ends)``: entry ``j`` is the page of the
    slot of the ``j``-th page's first token (translated when ``mapping``), 0 past the last page."""
    first = starts // page_size
    num = torch.where(ends > starts, (ends - 1) // page_size + 1 - first, 0)
    b = _first(num > width)
    if b is not None:
        _fail(op, f"{kind} layers: request {b} (batch index) spans {int(num[b])} pages, more than the page_table's {width}")
    req, j = _flat(num)
    table = torch.zeros(len(starts), width, dtype=torch.int64)
    table[req, j] = _slots_at(rtt, rows[req], (first[req] + j) * page_size, mapping) // page_size
    return table


def _slots_at(rtt, rows, positions, mapping) -> torch.Tensor:
    """Host int64 slots of ``req_to_token[rows, positions]``, through ``mapping`` when given."""
    slots = rtt.detach()[rows.to(rtt.device), positions.to(rtt.device)].long()
    if mapping is not None:
        slots = mapping.detach()[slots.to(mapping.device)].long()
    return slots.cpu()


def check_forward_batch(backend, forward_batch) -> None:
    """Check, before any launch, the device contents a step's index builds will read.

    For ``TritonSWAAttnBackend.init_forward_metadata`` to call in debug mode after its host checks
    and before building anything (the builds read ``req_to_token`` at the batch's rows and the
    mapping at their slots: a bad row would be read, not reported). Checks:

    - the host copies (``seq_lens_cpu``, ``extend_prefix_lens_cpu``, ``extend_seq_lens_cpu``) equal
      their device tensors (named, with the request);
    - ``req_pool_indices`` are rows of ``req_to_token``; ``seq_lens`` lie in ``[0, max_context_len]``
      (verify: plus ``draft_token_num``); extend modes: ``extend_prefix_lens >= 0``,
      ``extend_seq_lens >= 0`` and ``extend_prefix_lens + extend_seq_lens == seq_lens``;
    - every in-window token of every layer kind (row 0, padding, exempt) has a full slot inside the
      full pool (or the mapping) and, for translated sliding layers, a live SWA slot.

    Raises:
        ValueError: naming the field, the request (batch index), the position and the slot.
    """
    op = "forward batch"
    mode = forward_batch.forward_mode
    if mode.is_idle():
        return
    rtt = backend.req_to_token
    R, C = rtt.shape
    _check_cpu_copies(op, _length_fields(forward_batch))
    rows = _host("req_pool_indices", forward_batch.req_pool_indices)
    b = _first((rows < 0) | (rows >= R))
    if b is not None:
        _fail(op, f"request {b} (batch index): req_pool_indices[{b}] = {int(rows[b])} is not a row of req_to_token [0, {R})")
    seq = _host("seq_lens", forward_batch.seq_lens)
    verify, extend = mode.is_target_verify(), not mode.is_decode()
    extra = int(forward_batch.spec_info.draft_token_num) if verify else 0
    b = _first((seq < 0) | (seq + extra > C))
    if b is not None:
        plus = f" (+ draft_token_num {extra})" if extra else ""
        _fail(op, f"request {b} (batch index): seq_lens[{b}] = {int(seq[b])}{plus} is outside [0, max_context_len={C}]")
    ends = seq
    if extend and not verify:
        P = _host("extend_prefix_lens", forward_batch.extend_prefix_lens)
        E = _host("extend_seq_lens", forward_batch.extend_seq_lens)
        for name, x in (("extend_prefix_lens", P), ("extend_seq_lens", E)):
            b = _first(x < 0)
            if b is not None:
                _fail(op, f"request {b} (batch index): {name}[{b}] = {int(x[b])} is negative")
        b = _first(P + E != seq)
        if b is not None:
            _fail(
                op,
                f"request {b} (batch index): extend_prefix_lens[{b}] + extend_seq_lens[{b}] = {int(P[b])} + {int(E[b])} "
                f"= {int(P[b] + E[b])}, but seq_lens[{b}] = {int(seq[b])} (cached prefix + new tokens must equal seq_lens)",
            )
        ends = P
    ps = int(backend.page_size)
    W = int(backend.sliding_window_size)
    pool = backend.kv_pool
    full_pool = getattr(pool, "full_kv_pool", None) or pool
    swa_pool = getattr(pool, "swa_kv_pool", None)
    kinds = [(-1, False)] + ([(W, bool(backend.use_sliding_window_kv_pool))] if W >= 0 else [])
    for w, translate in kinds:
        starts = window_start(ends, w, extend=extend)
        _check_window_slots(
            op,
            rtt,
            rows,
            starts,
            ends,
            backend.mapping if translate else None,
            ps if ps > 1 else None,
            slot_rows=_pool_rows(full_pool) if not translate else None,
            swa_rows=_pool_rows(swa_pool) if translate else None,
        )


def check_forward_metadata(backend, forward_batch, *, batch_checked: bool = False) -> None:
    """Check a step's metadata (``backend.forward_metadata``) against the reference path and the pools.

    For ``TritonSWAAttnBackend.init_forward_metadata`` to call last when :func:`debug_enabled`, and
    after a CUDA-graph replay refill (outside capture), with a batch-like object carrying
    ``forward_mode``, ``req_pool_indices`` and ``seq_lens`` of the padded batch (padding rows point
    at row 0), ``spec_info`` for verify, and optionally ``out_cache_loc`` and the ``*_cpu`` copies.
    Checks:

    - the host copies (``seq_lens_cpu``, ``extend_*_cpu``, ``prefix_lens_cpu``) equal their device
      tensors; ``qo_indptr`` and ``prefix_lens`` follow the batch (verify: ``seq_lens`` are the
      committed lengths and every request has ``draft_token_num`` queries);
    - sliding and full layers' indices (CSR lists or page tables, and ``window_starts``) equal the
      windows recomputed on the host from ``req_to_token`` and the mapping (the rule of
      ``triton_swa_reference``'s ``decode_window_indices`` / ``extend_window_indices`` /
      ``window_page_table``), index for index;
    - every in-window token of every request (``req_to_token`` row 0, padding, exempt) has a full slot
      inside the full pool, and for translated sliding layers a live SWA slot: not 0 (evicted or never
      allocated), inside the SWA pool, not on the SWA allocator's free list, not shared with another
      token; the same for full slots (full free list);
    - ``out_cache_loc`` (when given) are the new tokens' slots in ``req_to_token``, each with an SWA slot.

    The batch's own device contents are checked first (:func:`check_forward_batch`), so that a bad row
    or length is named rather than read; ``batch_checked=True`` skips that when the caller has just run
    it (``init_forward_metadata`` does, before building).

    Raises:
        ValueError: naming the layer kind, the request (batch index), the position and the slot.
    """
    op = "forward metadata"
    meta = backend.forward_metadata
    if meta is None:
        _fail(op, "backend.forward_metadata is None: init_forward_metadata has not run")
    mode = meta.forward_mode
    if mode.is_idle():
        return
    if not batch_checked:
        check_forward_batch(backend, forward_batch)
    rtt = backend.req_to_token
    ps = int(backend.page_size)
    W = int(backend.sliding_window_size)
    rows = _host("req_pool_indices", forward_batch.req_pool_indices)
    B = rows.numel()
    seq = _host("seq_lens", forward_batch.seq_lens)
    _check_cpu_copies(op, _length_fields(forward_batch))

    extend = not mode.is_decode()
    if extend:
        lens = _host("prefix_lens", meta.prefix_lens)
        if meta.prefix_lens_cpu is not None:
            _check_cpu_copies(op, {"prefix_lens": meta.prefix_lens, "prefix_lens_cpu": meta.prefix_lens_cpu})
        if mode.is_target_verify():
            want_prefix = seq
            n = int(forward_batch.spec_info.draft_token_num)
            want_e = torch.full((B,), n, dtype=torch.int64)
        else:
            want_prefix = _host("extend_prefix_lens", forward_batch.extend_prefix_lens)
            want_e = _host("extend_seq_lens", forward_batch.extend_seq_lens)
        b = _first(lens != want_prefix)
        if b is not None:
            _fail(op, f"request {b} (batch index): prefix_lens[{b}] = {int(lens[b])}, the batch says {int(want_prefix[b])}")
        qo = _host("qo_indptr", meta.qo_indptr)
        e = _check_indptr(op, "qo_indptr", qo, None, what="the batch")
        b = _first(e != want_e)
        if b is not None:
            _fail(op, f"request {b} (batch index): qo_indptr gives {int(e[b])} new tokens, the batch {int(want_e[b])}")
        b = _first(e > meta.max_extend_len) if B else None
        if b is not None:
            _fail(op, f"request {b} (batch index): {int(e[b])} new tokens, more than max_extend_len={meta.max_extend_len}")
        new_start, new_end = lens, lens + e
    else:
        lens = seq
        new_start, new_end = seq - 1, seq

    pool = backend.kv_pool
    swa_pool = getattr(pool, "swa_kv_pool", None)
    full_pool = getattr(pool, "full_kv_pool", None) or pool
    allocator = getattr(getattr(backend, "model_runner", None), "token_to_kv_pool_allocator", None)
    mapping = backend.mapping
    kinds = [("full", meta.full, -1, False)]
    if W >= 0:
        kinds.append(("sliding", meta.sliding, W, bool(backend.use_sliding_window_kv_pool)))
    for kind, li, w, translate in kinds:
        if li is None:
            _fail(op, f"{kind} layers have no indices in forward_metadata")
        if bool(li.translated) != translate:
            _fail(op, f"{kind} layers: indices are {'' if li.translated else 'not '}translated, expected the opposite")
        _compare(op, kind, "window_ends", li.window_ends, lens, lambda i: f"request {i} (batch index)")
        m = mapping if translate else None
        starts = window_start(lens, w, extend=extend)
        _compare(op, kind, "window_starts", li.window_starts, starts, lambda i: f"request {i} (batch index)")
        if li.page_table is None:
            ref_ptr, ref_idx = _host_window_list(rtt, rows, starts, lens, m)
            _compare(op, kind, "kv_indptr", li.kv_indptr, ref_ptr, lambda i: f"request {i - 1} (batch index)")
            total = int(ref_ptr[-1])
            if li.kv_indices.numel() < total:
                _fail(op, f"{kind} layers: kv_indices holds {li.kv_indices.numel()} entries, the windows {total}")
            req, off = _flat((lens - starts).clamp(min=0))
            _compare(
                op,
                kind,
                "kv_indices",
                li.kv_indices[:total],
                ref_idx,
                lambda i: f"request {int(req[i])} (batch index), position {int(starts[req[i]] + off[i])}, kv_indices[{i}]",
            )
        else:
            table = li.page_table
            want = _host_page_table(op, kind, rtt, rows, starts, lens, ps, m, table.shape[1])
            width = max(table.shape[1], 1)
            _compare(
                op,
                kind,
                "page_table",
                table,
                want,
                lambda i: (
                    f"request {i // width} (batch index), position "
                    f"{max(int(starts[i // width]), (int(starts[i // width]) // ps + i % width) * ps)}, "
                    f"page_table[{i // width}, {i % width}]"
                ),
            )
        sub = swa_pool if translate else full_pool
        sub_alloc = getattr(allocator, "swa_attn_allocator" if translate else "full_attn_allocator", None)
        if sub_alloc is None and not translate:
            sub_alloc = allocator  # a plain (full-only) allocator
        _check_window_slots(
            op,
            rtt,
            rows,
            starts,
            lens,
            m,
            ps if ps > 1 else None,
            slot_rows=_pool_rows(full_pool) if not translate else None,
            swa_rows=_pool_rows(sub) if translate else None,
        )
        free = _free_pages(sub_alloc)
        if free is not None and free.numel():
            _check_not_free(op, kind, rtt, rows, starts, lens, m, ps, free)

    loc = getattr(forward_batch, "out_cache_loc", None)
    if loc is not None:
        got = _host("out_cache_loc", loc)
        req, off = _flat((new_end - new_start).clamp(min=0))
        pos = new_start[req] + off
        want = rtt.detach()[rows[req].to(rtt.device), pos.to(rtt.device)].to("cpu", torch.int64)
        if got.numel() != want.numel():
            _fail(op, f"out_cache_loc has {got.numel()} entries, the step has {want.numel()} new tokens")
        i = _first(got != want)
        if i is not None:
            _fail(
                op,
                f"request {int(req[i])} (batch index), position {int(pos[i])}: out_cache_loc[{i}] = {int(got[i])}, "
                f"but req_to_token holds slot {int(want[i])}",
            )
        if mapping is not None and W >= 0 and backend.use_sliding_window_kv_pool:
            real = rows[req] != 0
            swa = mapping.detach()[got.clamp(min=0).to(mapping.device)].to("cpu", torch.int64)
            i = _first(real & (swa <= 0))
            if i is not None:
                _fail(
                    op,
                    f"request {int(req[i])} (batch index), position {int(pos[i])}: new token's full slot {int(got[i])} "
                    f"has SWA slot {int(swa[i])} (mapping[{int(got[i])}]): its sliding K/V would be lost",
                )


def _check_not_free(op, kind, rtt, rows, starts, ends, mapping, ps, free) -> None:
    """No in-window token's page (SWA page when translated) is on its allocator's free list."""
    req, off = _flat((ends - starts).clamp(min=0))
    pos = starts[req] + off
    real = rows[req] != 0
    req, pos = req[real], pos[real]
    if req.numel() == 0:
        return
    slot = rtt.detach()[rows[req].to(rtt.device), pos.to(rtt.device)].to("cpu", torch.int64)
    if mapping is not None:
        slot = mapping.detach()[slot.to(mapping.device)].to("cpu", torch.int64)
    i = _first(torch.isin(slot // ps, free))
    if i is not None:
        _fail(
            op,
            f"{kind} layers: request {int(req[i])} (batch index), position {int(pos[i])}: slot {int(slot[i])} is on a "
            f"free page ({int(slot[i] // ps)}) of the {'SWA' if mapping is not None else 'full'} allocator",
        )
