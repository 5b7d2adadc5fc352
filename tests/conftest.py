"""Test tiers and the interpreter switch.

Without CUDA, Triton kernels run in Triton's interpreter: ``TRITON_INTERPRET=1`` must be in the
environment before triton is first imported (``@triton.jit`` decides at decoration time), so it is
set here, before any test module imports triton_swa's kernels. torch does not import triton itself.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture
def device():
    return DEVICE
