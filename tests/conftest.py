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


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _poison_internal_buffers(monkeypatch):
    # the switch is cached at import (triton_swa.runtime.poison); monkeypatch restores it after the test
    from triton_swa.runtime import poison

    monkeypatch.setattr(poison, "_ENABLED", True)


@pytest.fixture
def device():
    return DEVICE
