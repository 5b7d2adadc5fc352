"""Run fp8 K/V through the path of targets without Triton's fp8 conversion, on any device."""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from ..runtime.device import device_facts, planning_for

__all__ = ["without_native_fp8"]


@contextlib.contextmanager
def without_native_fp8(device):
    """Plan the launches inside as for ``device``'s target without native fp8 (as on sm_80/86): fp8
    e4m3fn pools are then read as bytes and decoded in the kernel. The tests check that path against
    the reference on every device, and the benchmarks time it against the native loads."""
    facts = device_facts(torch.device(device))
    with planning_for(dataclasses.replace(facts, fp8=())):
        yield
