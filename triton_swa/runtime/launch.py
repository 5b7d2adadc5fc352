"""Launching compiled kernels with little host cost, and caching what a checked call decides.

- :class:`Launcher`: one kernel with fixed constexprs and options. The first call per device and
  specialisation key goes through Triton's JIT (which compiles, or finds the compiled kernel); later
  calls launch that compiled kernel directly, skipping the JIT's per-call argument binding (about
  half of a short call's host time on the H200's host: ``bench/results/probe-extend-launch-*``). The direct
  call uses the launcher signature of Triton 3.6's compiled kernels (CUDA and HIP alike); other Triton
  versions, the interpreter, or ``TRITON_SWA_FAST_LAUNCH=0`` (read at import; or
  :func:`set_fast_launch`) take the JIT every time.
- :class:`Bound`: one compiled kernel on a fixed grid, for a plan whose arguments keep their
  specialisation from call to call (same dtypes, same integers, pointers of the same 16-byte
  alignment): each call is Triton's launcher alone (:meth:`Launcher.bind`).
- :func:`precompile`: compile recorded launches (:func:`recorded_launches`) before they are needed;
  :func:`precompile_wanted`, :func:`record_and_precompile` and :func:`run_start_precompile` are what
  the engine integrations' start-time precompiles share.

What a checked call decided is cached by :mod:`triton_swa.runtime.plans`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass

import torch
import triton
from triton import knobs

from .device import interpreting

__all__ = [
    "Bound",
    "launcher_for",
    "Launcher",
    "compile_jobs",
    "current_stream",
    "fast_launch_enabled",
    "precompile",
    "precompile_wanted",
    "PrecompileReport",
    "record_and_precompile",
    "recorded_launches",
    "run_start_precompile",
    "set_fast_launch",
]

try:  # Triton's argument specialisation (3.6's native binder), for keys over varying integers
    from triton._C.libtriton import native_specialize_impl as _SPECIALIZE
except ImportError:  # pragma: no cover - other Triton versions take the JIT path
    _SPECIALIZE = None

# the direct launch calls compiled kernels with Triton 3.6's launcher signature
_DIRECT_LAUNCH_OK = triton.__version__.startswith("3.6.")
_FAST = _DIRECT_LAUNCH_OK and os.environ.get("TRITON_SWA_FAST_LAUNCH", "1") != "0"
_DRIVER: list = []


def set_fast_launch(enabled: bool) -> None:
    """Turn the direct launch of compiled kernels on or off (benchmarks compare the two)."""
    global _FAST
    _FAST = bool(enabled) and _DIRECT_LAUNCH_OK


def fast_launch_enabled() -> bool:
    return _FAST


def _driver_fns():
    if not _DRIVER:
        from triton.runtime import driver

        _DRIVER.extend([driver.active.get_current_device, driver.active.get_current_stream])
    return _DRIVER


def _current_device() -> int:
    """The current device's index (torch's own call where it has one: no lazy-init check per launch)."""
    return _GET_DEVICE() if _GET_DEVICE is not None else _driver_fns()[0]()


_GET_DEVICE = getattr(torch._C, "_cuda_getDevice", None)


def current_stream(device_index: int | None):
    """The driver's current stream handle on ``device_index`` (None: the current device)."""
    return _driver_fns()[1](_current_device() if device_index is None else device_index)


class Bound:
    """One compiled kernel launched directly on a fixed grid: ``bound(args)``.

    The caller guarantees that ``args`` specialise as those it was bound with (same dtypes and
    integers, pointers of the same 16-byte alignment, tensors on the same device). A pointer may be
    given as its address (an int): Triton's launcher then skips its per-pointer driver query, so the
    caller vouches that the memory is on the bound device and alive until the kernel ran. Launch hooks
    (profilers) are honoured as Triton's own launch does.
    """

    __slots__ = ("fn", "kernel", "run", "function", "packed", "tail", "grid", "device", "direct")

    def __init__(self, fn, kernel, tail: tuple, grid: tuple, device: int):
        self.fn = fn  # the JIT function it was compiled from
        self.kernel, self.tail, self.grid, self.device = kernel, tail, grid, device
        self.run = kernel.run  # loads the module on the current device
        self.function, self.packed = kernel.function, kernel.packed_metadata
        # Triton 3.6's CUDA launcher: its C entry point, called directly when the kernel needs no
        # scratch memory (what the Python wrapper around it would allocate)
        launcher = self.run
        self.direct = None
        if type(launcher).__name__ == "CudaLauncher" and all(
            hasattr(launcher, name)
            for name in ("launch", "launch_cooperative_grid", "launch_pdl", "global_scratch_size", "profile_scratch_size")
        ):
            if launcher.global_scratch_size == 0 and launcher.profile_scratch_size == 0:
                self.direct = (launcher.launch, launcher.launch_cooperative_grid, launcher.launch_pdl)

    def __call__(self, args: tuple) -> None:
        device = self.device
        if _current_device() != device:
            with torch.cuda.device(device):
                self(args)
            return
        stream = _DRIVER[1](device) if _DRIVER else _driver_fns()[1](device)
        grid = self.grid
        enter = knobs.runtime.launch_enter_hook
        if enter is None or not getattr(enter, "calls", True):
            direct = self.direct
            if direct is not None:
                direct[0](
                    grid[0],
                    grid[1],
                    grid[2],
                    stream,
                    self.function,
                    direct[1],
                    direct[2],
                    None,
                    None,
                    self.packed,
                    None,
                    None,
                    None,
                    *args,
                    *self.tail,
                )
            else:
                self.run(grid[0], grid[1], grid[2], stream, self.function, self.packed, None, None, None, *args, *self.tail)
            return
        full = (*args, *self.tail)
        meta = self.kernel.launch_metadata(grid, stream, *full)
        self.run(grid[0], grid[1], grid[2], stream, self.function, self.packed, meta, enter, knobs.runtime.launch_exit_hook, *full)


class Launcher:
    """One kernel with fixed constexprs and options; call it with the runtime arguments and a grid.

    The direct-launch key is what Triton specialises a kernel on beyond the constexprs and options.
    With ``n_ptr`` (launches whose argument dtypes and integers are fixed, as decode's plans) it is the
    16-byte alignment of the first ``n_ptr`` arguments (pointers); with ``n_ptr=None`` (integers that
    vary between calls, as extend's) it is Triton's own specialisation of every argument (dtype,
    16-divisibility, an integer's width and whether it is 1). The grid is fixed (``grid``) or given
    per call.
    """

    __slots__ = ("fn", "grid", "constexprs", "tail", "options", "n_ptr", "compiled", "interpret")

    def __init__(self, fn, grid, constexprs: dict, n_ptr: int | None, num_warps: int, num_stages: int | None = None):
        self.fn, self.grid, self.constexprs, self.n_ptr = fn, grid, constexprs, n_ptr
        self.interpret = interpreting()
        self.tail = ()
        self.options = {"num_warps": num_warps}
        if num_stages is not None:
            self.options["num_stages"] = num_stages
        self.compiled: dict = {}

    def __call__(self, args: tuple, grid: tuple | None = None) -> None:
        grid = self.grid if grid is None else grid
        if self.interpret:
            self.fn[grid](*args, **self.constexprs, **self.options)
            return
        get_device, get_stream = _driver_fns()
        device = get_device()
        # Triton launches on the current device: run on the first tensor's instead (-1: a CPU tensor)
        want = args[0].get_device()
        if want != device and want >= 0:
            with torch.cuda.device(want):
                self(args, grid)
            return
        if not _FAST or (self.n_ptr is None and _SPECIALIZE is None):
            self.fn[grid](*args, **self.constexprs, **self.options)
            return
        if self.n_ptr is None:
            # the JIT's own backend for this device, as its binder uses (device_caches: 3.6's layout)
            backend = self.fn.device_caches[device][3]
            key = (device, *[_SPECIALIZE(backend, a, False, True, True) for a in args])
        else:
            key = (device, *[a.data_ptr() & 15 == 0 for a in args[: self.n_ptr]])
        kernel = self.compiled.get(key)
        if kernel is None:
            kernel = self.fn[grid](*args, **self.constexprs, **self.options)
            if all(hasattr(kernel, name) for name in ("run", "function", "packed_metadata", "launch_metadata")):
                # The launcher takes every parameter in order, the constexprs (the last ones) included.
                self.tail = tuple(self.constexprs[name] for name in self.fn.arg_names[len(args) :])
                self.compiled[key] = kernel
            return
        stream = get_stream(device)
        full = (*args, *self.tail)
        enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        if enter is None or not getattr(enter, "calls", True):
            # No launch hooks (profilers) registered: the launcher skips them and their metadata.
            meta = enter = leave = None
        else:
            meta = kernel.launch_metadata(grid, stream, *full)
        kernel.run(grid[0], grid[1], grid[2], stream, kernel.function, kernel.packed_metadata, meta, enter, leave, *full)

    def bind(self, args: tuple, grid: tuple | None = None) -> Bound | None:
        """The compiled kernel for ``args`` on ``grid`` (compiled, not launched, when new) as a
        :class:`Bound`, or None where launches go through the JIT (the interpreter, another Triton
        version, ``TRITON_SWA_FAST_LAUNCH=0``, CPU tensors)."""
        grid = self.grid if grid is None else grid
        if self.interpret or not _FAST:
            return None
        device = args[0].get_device()
        if device < 0:
            return None
        with torch.cuda.device(device):
            kernel = self.fn.warmup(*args, grid=grid, **self.constexprs, **self.options)
            if not all(hasattr(kernel, name) for name in ("run", "function", "packed_metadata", "launch_metadata")):
                return None
            tail = tuple(self.constexprs[name] for name in self.fn.arg_names[len(args) :])
            return Bound(self.fn, kernel, tail, tuple(grid), device)


_LAUNCHERS: dict = {}


def launcher_for(fn, constexprs: dict, num_warps: int = 4, num_stages: int | None = None) -> Launcher:
    """The :class:`Launcher` of ``fn`` with these constexprs and options (grid given per call), one per
    distinct set and shared by every call that compiles to the same kernel: a new input signature
    still launches the compiled kernel directly."""
    key = (fn, *constexprs.items(), num_warps, num_stages)
    launch = _LAUNCHERS.get(key)
    if launch is None:
        launch = _LAUNCHERS[key] = Launcher(fn, None, constexprs, None, num_warps, num_stages)
    return launch


def _as_dtype(a):
    # what Triton's warmup takes for a 16-byte-aligned pointer (its MockTensor), holding no memory
    return a.dtype if isinstance(a, torch.Tensor) and a.data_ptr() % 16 == 0 else a


@contextlib.contextmanager
def recorded_launches(tensors_as_dtypes: bool = False):
    """Record every launch instead of running it: ``(kernel, arguments, constexprs, options, grid)``
    per :class:`Launcher` call and per :meth:`Launcher.bind`, which then binds nothing. Plans made
    inside remember that they have no compiled kernel: drop them after (``PlanCache.clear_all`` and
    a backend's own caches), as :func:`precompile`'s callers do. ``tensors_as_dtypes``: each
    16-byte-aligned tensor argument is recorded as its dtype (enough for :func:`precompile`; the
    tensor is not kept alive)."""
    launches = []
    saved = Launcher.__call__, Launcher.bind

    def record(launcher, args, grid=None):
        grid = launcher.grid if grid is None else grid
        args = tuple(map(_as_dtype, args)) if tensors_as_dtypes else tuple(args)
        launches.append((launcher.fn, args, dict(launcher.constexprs), dict(launcher.options), grid))

    def bind(launcher, args, grid=None):
        record(launcher, args, grid)

    Launcher.__call__, Launcher.bind = record, bind
    try:
        yield launches
    finally:
        Launcher.__call__, Launcher.bind = saved


def compile_jobs() -> int:
    """Kernels to compile side by side: half the host's cores, at most 8 (Triton compiles one kernel
    on one core)."""
    return min(8, max(1, (os.cpu_count() or 2) // 2))


def precompile(launches: list, device: torch.device, jobs: int | None = None) -> tuple[int, list[str]]:
    """Compile every recorded launch (:func:`recorded_launches`) for ``device`` through Triton's JIT
    (``warmup``: compiled, not launched), ``jobs`` (default :func:`compile_jobs`) at a time where Triton has its asynchronous compile
    mode (3.6's ``AsyncCompileMode``), and load each kernel on the device. A later launch of the same
    specialisation then finds the kernel in the JIT's cache. A launch already compiled costs its
    argument binding only. Returns (distinct kernels, errors: one line per launch that failed)."""
    from concurrent.futures import ThreadPoolExecutor

    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:  # another Triton: one after another
        AsyncCompileMode = None
    jobs = compile_jobs() if jobs is None else jobs
    results, errors = [], []

    def warm_all():
        for fn, args, constexprs, options, grid in launches:
            try:
                results.append((fn, fn.warmup(*args, grid=grid or (1, 1, 1), **constexprs, **options)))
            except Exception as exc:  # noqa: BLE001 - reported; that kernel compiles at its first launch
                errors.append(f"{getattr(fn, '__name__', fn)}: {type(exc).__name__}: {exc}"[:300])

    on = torch.cuda.device(device) if torch.device(device).type == "cuda" else contextlib.nullcontext()
    with on:
        if AsyncCompileMode is not None and jobs > 1:
            with ThreadPoolExecutor(max_workers=jobs) as pool, AsyncCompileMode(pool, ignore_errors=True):
                warm_all()
        else:
            warm_all()
        kernels = {}
        for fn, k in results:
            if hasattr(k, "future"):  # a FutureKernel, finished when its mode exited
                exc = k.future.exception()
                if exc is not None:
                    errors.append(f"{getattr(fn, '__name__', fn)}: {type(exc).__name__}: {exc}"[:300])
                    continue
                k = k.kernel
            if k is not None:
                kernels[id(k)] = (fn, k)
        for fn, k in kernels.values():
            # on the device now: a kernel first loaded mid-serving may find no memory left beside the pools
            load = getattr(k, "_init_handles", None)
            try:
                if load is not None:
                    load()
            except Exception as exc:  # noqa: BLE001 - as above
                errors.append(f"{getattr(fn, '__name__', fn)}: loading: {type(exc).__name__}: {exc}"[:300])
    return len(kernels), errors


# --- the engine integrations' start-time precompiles ------------------------------------------------


def precompile_wanted(device) -> bool:
    """Whether a start-time precompile (an engine integration's, before serving) runs for ``device``:
    ``TRITON_SWA_PRECOMPILE`` is not ``0``, the device is CUDA, and kernels are compiled (not
    Triton's interpreter, ``TRITON_INTERPRET=1``)."""
    if os.environ.get("TRITON_SWA_PRECOMPILE", "1") == "0":
        return False
    return torch.device(device).type == "cuda" and not interpreting()


@dataclass(frozen=True)
class PrecompileReport:
    """What :func:`record_and_precompile` did: distinct kernels compiled (or found compiled), launches
    recorded, one line per launch that failed to compile, and its seconds (recording, all)."""

    kernels: int
    launches: int
    errors: tuple
    recorded_s: float
    total_s: float


def record_and_precompile(steps, device, *, jobs: int | None = None, forget=None, logger=None) -> PrecompileReport:
    """Run ``steps(launches)`` (synthetic engine steps through a backend's own path) with every launch
    recorded, not run, into ``launches`` (:func:`recorded_launches`, tensors as dtypes; a step may read
    what it launched there); then, even when ``steps`` raised, call
    ``forget()`` (default ``PlanCache.clear_all``: plans made while recording hold no compiled kernel);
    then :func:`precompile` the launches on ``device``, ``jobs`` at a time, and log each error as a
    warning on ``logger`` (default this module's). An exception of ``steps`` propagates after ``forget``."""
    from .plans import PlanCache

    log = logger if logger is not None else logging.getLogger(__name__)
    t0 = time.perf_counter()
    with recorded_launches(tensors_as_dtypes=True) as launches:
        try:
            steps(launches)
        finally:
            (forget if forget is not None else PlanCache.clear_all)()
    recorded = time.perf_counter() - t0
    kernels, errors = precompile(launches, device, jobs)
    for e in errors:
        log.warning("triton_swa: precompile: %s", e)
    return PrecompileReport(kernels, len(launches), tuple(errors), recorded, time.perf_counter() - t0)


def run_start_precompile(run, logger) -> bool:
    """Call ``run()`` (a start-time precompile that returns its one-line summary) and log the summary at
    INFO on ``logger``. Any exception is logged there as a warning and swallowed: a precompile never
    stops an engine's start (its kernels then compile at first use). Returns whether ``run`` finished."""
    try:
        summary = run()
    except Exception as exc:  # noqa: BLE001 - never in the way of a start
        why = f"{type(exc).__name__}: {exc}"
        logger.warning("triton_swa: precompiling the extend kernels failed (%s); they compile at first use", why)
        return False
    logger.info("triton_swa: %s", summary)
    return True
