"""Test tiers and the interpreter switch.

Without CUDA, Triton kernels run in Triton's interpreter: ``TRITON_INTERPRET=1`` must be in the
environment before triton is first imported (``@triton.jit`` decides at decoration time), so it is
set here (:func:`triton_swa.testing.use_interpreter`), before any test module imports triton_swa's
kernels. Neither torch nor ``triton_swa.testing`` imports triton itself.

Every test runs with ``TRITON_SWA_POISON=1`` (``triton_swa/runtime/poison.py``): the buffers the ops
allocate themselves (outputs, split-KV partials, index buffers) start as NaN or the int32 minimum,
so a split, tile or row that a kernel forgets to write fails the comparison with the reference
instead of passing on whatever ``torch.empty`` returned. A test that needs it off uses
``monkeypatch.setattr(poison, "_ENABLED", False)``.
"""

import pytest
import torch

from triton_swa.testing import use_interpreter

if not torch.cuda.is_available():
    use_interpreter()

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"


# The longest tests on a CPU (a minute or more each, cold: the compile tier per target, the soak, the
# demo, the serving loop) run first, and pytest-xdist's work stealing (scripts/test.sh: --dist
# worksteal) spreads them, so that the workers finish together on short tests instead of one of them
# running the last long test alone. Order within each file is kept.
LONGEST_FIRST = (
    "tests/compile/",
    "tests/integration/test_demo.py",
    "tests/test_soak.py",
    "tests/integration/test_serving.py",
    "tests/test_backend.py",
)


def _start_rank(item) -> int:
    return next((i for i, prefix in enumerate(LONGEST_FIRST) if item.nodeid.startswith(prefix)), len(LONGEST_FIRST))


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
    items.sort(key=_start_rank)


@pytest.fixture(autouse=True)
def _poison_internal_buffers(monkeypatch):
    # the switch is cached at import (triton_swa.runtime.poison); monkeypatch restores it after the test
    from triton_swa.runtime import poison

    monkeypatch.setattr(poison, "_ENABLED", True)


@pytest.fixture
def device():
    return DEVICE
