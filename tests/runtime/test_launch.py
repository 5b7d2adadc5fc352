"""The launcher (direct launch of compiled kernels, and its opt-out) and the plan cache."""

from __future__ import annotations

import contextlib

import pytest
import torch
import triton
import triton.language as tl

from triton_swa.runtime import launch
from triton_swa.runtime.launch import Launcher
from triton_swa.runtime.plans import PlanCache


def test_plan_cache_makes_each_signature_once():
    made = []

    def make(x, y):
        made.append((x, y))
        return x + y

    cache = PlanCache(max_size=2)
    signature = lambda x, y: (x, y)
    assert cache.get_or_make(signature, make, (1, 2)) == 3
    assert cache.get_or_make(signature, make, (1, 2)) == 3
    assert made == [(1, 2)]
    # an argument without a signature is checked (made) every time, never cached
    assert cache.get_or_make(signature, lambda x, y: len(y), (1, [2])) == 1
    assert len(cache) == 1
    # full: cleared, then the new plan stored
    cache.get_or_make(signature, make, (2, 2))
    cache.get_or_make(signature, make, (3, 2))
    assert len(cache) == 1 and made[-1] == (3, 2)


class _FakeKernel:
    """Records how it is launched: ``fn[grid](*args, **kwargs)`` as Triton's JIT is called."""

    arg_names = ("x", "BLOCK")

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((grid, args, kwargs))


def test_opt_out_launches_through_the_jit(monkeypatch):
    """``set_fast_launch(False)``: every call goes through the JIT's binder with the constexprs and
    options, never touching the driver."""
    monkeypatch.setattr(launch, "_FAST", launch._FAST)
    launch.set_fast_launch(False)
    assert not launch.fast_launch_enabled()
    fake = _FakeKernel()
    launcher = Launcher(fake, (3, 1, 1), {"BLOCK": 16}, 1, num_warps=2, num_stages=1)
    launcher((torch.zeros(1),))
    launcher((torch.zeros(1),), (5, 1, 1))
    assert [c[0] for c in fake.calls] == [(3, 1, 1), (5, 1, 1)]
    assert fake.calls[0][2] == {"BLOCK": 16, "num_warps": 2, "num_stages": 1}
    assert launcher.compiled == {}


@triton.jit
def _add_one_kernel(x, y, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + o, tl.load(x + o, mask=o < n) + 1, mask=o < n)


@pytest.mark.gpu
@pytest.mark.parametrize("fast", [True, False], ids=["direct", "jit"])
def test_launcher_runs_a_compiled_kernel(fast, monkeypatch):
    """First call through the JIT (compiles), later calls direct when fast launch is on; the same
    results either way."""
    monkeypatch.setattr(launch, "_FAST", launch._FAST)
    launch.set_fast_launch(fast)
    x = torch.randn(1000, device="cuda")
    launcher = Launcher(_add_one_kernel, (4, 1, 1), {"BLOCK": 256}, None, num_warps=4)
    for _ in range(3):
        y = torch.full_like(x, float("nan"))
        launcher((x, y, x.numel()))
        torch.testing.assert_close(y, x + 1)
    assert len(launcher.compiled) == (1 if fast and launch.fast_launch_enabled() else 0)


class _OnDevice:
    """A tensor stand-in on device ``index`` (``get_device`` as torch's)."""

    def __init__(self, index: int):
        self.index = index

    def get_device(self) -> int:
        return self.index


def test_launches_on_the_tensors_device(monkeypatch):
    """A launch whose first tensor is on another device than the current one runs under
    ``torch.cuda.device`` of the tensor's device (Triton itself launches on the current one)."""
    current = [0]

    @contextlib.contextmanager
    def on(index):
        saved, current[0] = current[0], index
        try:
            yield
        finally:
            current[0] = saved

    monkeypatch.setattr(launch, "_DRIVER", [lambda: current[0], lambda index: 0])
    monkeypatch.setattr(torch.cuda, "device", on)
    monkeypatch.setattr(launch, "_FAST", False)
    seen = []

    class Kernel(_FakeKernel):
        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.append(current[0])

    launcher = Launcher(Kernel(), (1, 1, 1), {"BLOCK": 16}, 1, num_warps=1)
    launcher.interpret = False
    launcher((_OnDevice(1),))
    launcher((_OnDevice(0),))
    assert seen == [1, 0] and current[0] == 0


def test_a_kernel_without_a_direct_launcher_keeps_the_jit(monkeypatch):
    """Fast launch on, but the compiled kernel Triton returns lacks 3.6's launcher fields (another
    backend or Triton version): nothing is cached and every call goes through the JIT again."""
    monkeypatch.setattr(launch, "_DRIVER", [lambda: 0, lambda index: 0])
    monkeypatch.setattr(launch, "_FAST", True)
    calls = []

    class Kernel(_FakeKernel):
        def __getitem__(self, grid):
            def run(*args, **kwargs):
                calls.append(grid)
                return object()  # no run / function / packed_metadata / launch_metadata

            return run

    launcher = Launcher(Kernel(), (2, 1, 1), {"BLOCK": 16}, 1, num_warps=1)
    launcher.interpret = False
    x = torch.zeros(4)
    for _ in range(3):
        launcher((x,))
    assert calls == [(2, 1, 1)] * 3 and launcher.compiled == {}


def test_precompile_compiles_each_launch_through_the_jit_and_loads_it(monkeypatch):
    """``precompile`` hands each recorded launch to the kernel's own ``warmup`` (compiled, not launched),
    through Triton's asynchronous mode with several jobs, counts each distinct kernel once, loads it,
    and reports the launches that failed instead of raising."""
    from triton_swa.runtime.launch import precompile

    class Kernel:
        loaded = 0

        def _init_handles(self):
            self.loaded += 1

    class Fn:
        __name__ = "fake_kernel"

        def __init__(self):
            self.calls, self.kernels = [], {}

        def warmup(self, *args, grid, **kw):
            if kw.get("BAD"):
                raise RuntimeError("out of resource")
            self.calls.append((args, grid, kw))
            return self.kernels.setdefault(args, Kernel())  # the JIT's cache: one kernel per specialisation

    fn = Fn()
    launches = [
        (fn, (torch.bfloat16, 3), {"BLOCK": 16}, {"num_warps": 4}, (2, 1, 1)),
        (fn, (torch.bfloat16, 3), {"BLOCK": 16}, {"num_warps": 4}, None),
        (fn, (torch.float16, 3), {"BLOCK": 16}, {"num_warps": 4}, (1, 1, 1)),
        (fn, (torch.float16, 3), {"BLOCK": 16, "BAD": True}, {"num_warps": 4}, (1, 1, 1)),
    ]
    for jobs in (1, 4):
        fn.calls.clear()
        kernels, errors = precompile(launches, torch.device("cpu"), jobs)
        assert kernels == 2 and errors == ["fake_kernel: RuntimeError: out of resource"]
        assert [c[1] for c in fn.calls] == [(2, 1, 1), (1, 1, 1), (1, 1, 1)]  # a launch without a grid: any grid
        assert fn.calls[0][2] == {"BLOCK": 16, "num_warps": 4}
    assert all(k.loaded == 2 for k in fn.kernels.values())  # loaded on the device by each call


def test_recorded_launches_record_binds_and_can_drop_their_tensors():
    from triton_swa.runtime.launch import Launcher, recorded_launches

    fn = object()
    launcher = Launcher(fn, (4, 1, 1), {"X": 1}, None, 4)
    aligned = torch.zeros(8, dtype=torch.float32)
    with recorded_launches(tensors_as_dtypes=True) as launches:
        launcher((aligned, 7))
        assert launcher.bind((aligned, 7), (2, 1, 1)) is None
    recorded = ((torch.float32, 7), {"X": 1}, {"num_warps": 4})
    assert [x[1:] for x in launches] == [(*recorded, (4, 1, 1)), (*recorded, (2, 1, 1))]
    with recorded_launches() as launches:
        launcher((aligned, 7))
    assert launches[0][1][0] is aligned
    assert Launcher.__call__.__name__ == "__call__"  # restored


def test_the_start_time_precompile_helpers(monkeypatch, caplog):
    """What the engine integrations' start-time precompiles share: the switch (a CUDA device, compiled
    kernels, ``TRITON_SWA_PRECOMPILE`` not 0); steps recorded into the list they are given, their plans
    forgotten even when a step raises, the launches compiled and each error logged; and a failure that
    is a warning, never an exception."""
    import logging

    from triton_swa.runtime.launch import precompile_wanted, record_and_precompile, run_start_precompile

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert precompile_wanted("cuda") and precompile_wanted(torch.device("cuda", 1))
    assert not precompile_wanted("cpu")
    monkeypatch.setenv("TRITON_SWA_PRECOMPILE", "0")
    assert not precompile_wanted("cuda")
    monkeypatch.delenv("TRITON_SWA_PRECOMPILE")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not precompile_wanted("cuda")

    compiled, forgotten = [], []
    monkeypatch.setattr(
        launch, "precompile", lambda launches, dev, jobs: (compiled.append((list(launches), dev, jobs)), (3, ["k: bad"]))[1]
    )
    launcher = Launcher(object(), (1, 1, 1), {"X": 1}, None, 4)

    def steps(launches):
        launcher((torch.zeros(4), 5))
        assert len(launches) == 1  # a step sees what it launched

    log = logging.getLogger("test_the_start_time_precompile_helpers")
    with caplog.at_level(logging.INFO, logger=log.name):
        report = record_and_precompile(steps, "cpu", jobs=2, forget=lambda: forgotten.append(1), logger=log)
        assert (report.kernels, report.launches, report.errors) == (3, 1, ("k: bad",))
        assert forgotten == [1] and compiled[0][0][0][1] == (torch.float32, 5) and compiled[0][1:] == ("cpu", 2)
        with pytest.raises(RuntimeError, match="mid-step"):
            record_and_precompile(
                lambda launches: (_ for _ in ()).throw(RuntimeError("mid-step")), "cpu", forget=lambda: forgotten.append(2)
            )
        assert forgotten == [1, 2] and len(compiled) == 1  # forgotten, nothing compiled
        assert run_start_precompile(lambda: "precompiled 3 kernel(s)", log)
        assert not run_start_precompile(lambda: 1 / 0, log)
    assert "triton_swa: precompile: k: bad" in caplog.text and "triton_swa: precompiled 3 kernel(s)" in caplog.text
    assert "precompiling the extend kernels failed (ZeroDivisionError: division by zero); they compile at first use" in caplog.text
