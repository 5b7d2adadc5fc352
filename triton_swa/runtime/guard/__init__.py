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
host path there (measured by ``bench/bench_guard.py --host``, in git history); ``triton-swa bench
--providers triton_swa,triton_swa_debug`` times the guard on against off on a GPU.
While a CUDA graph is being captured the checks are skipped (they synchronise, which capture
forbids); a captured graph replays with metadata refreshed outside the capture, which
:func:`check_forward_metadata` validates.

What is checked: each public op's check is a function named ``check_<op>``, in the module of its
op family, whose docstring lists what it checks and which op's own argument checks it extends (the
ops check types, shapes and devices; only the guard reads the values inside index tensors). Every
check is importable from here.

- :mod:`~triton_swa.runtime.guard.decode`: ``swa_decode``;
- :mod:`~triton_swa.runtime.guard.extend`: ``swa_extend``;
- :mod:`~triton_swa.runtime.guard.attention_indices`: the CSR slot lists and page tables the two
  attention ops read (shared by decode and extend);
- :mod:`~triton_swa.runtime.guard.window_builds`: ``build_window_indices`` /
  ``build_window_page_table``;
- :mod:`~triton_swa.runtime.guard.kv_writes`: ``swa_out_cache_loc`` / ``store_kv``;
- :mod:`~triton_swa.runtime.guard.backend_step`: a backend step, before its index builds
  (:func:`check_forward_batch`) and after them (:func:`check_forward_metadata`);
- :mod:`~triton_swa.runtime.guard.common`: what the checks share (host reads, the error, offsets
  vectors, duplicate slots, deferring malformed arguments to the op's own checks).

Here: the switch, the :func:`guarded` decorator and the check it runs for every op: any argument
named ``<name>_cpu`` must equal the argument ``<name>`` (host copies of device lengths).

Padding: CUDA-graph padding entries point at ``req_to_token`` row 0 with a length of 1, so their
windows are one dummy slot. The op-level checks therefore accept a window that is exactly one entry
equal to 0 (or one page 0); the index builders and :func:`check_forward_metadata` know row 0 and
exempt its tokens instead.
"""

from __future__ import annotations

import functools
import inspect
import os

import torch

from .backend_step import check_forward_batch, check_forward_metadata
from .common import _check_cpu_copies, _Defer, _defer
from .decode import check_swa_decode
from .extend import check_swa_extend
from .kv_writes import check_store_kv, check_swa_out_cache_loc
from .window_builds import check_build_window_indices, check_build_window_page_table

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


def _check_devices(arguments: dict) -> None:
    """Defer unless every tensor argument (host copies ``*_cpu`` aside) lives on one real device."""
    devices = {x.device for name, x in arguments.items() if isinstance(x, torch.Tensor) and not name.endswith("_cpu")}
    if len(devices) > 1 or any(d.type == "meta" for d in devices):
        _defer(f"tensor arguments on several devices or on meta: {sorted(map(str, devices))}")


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
