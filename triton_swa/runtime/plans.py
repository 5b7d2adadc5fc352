"""Caching what a checked call decided: plans keyed by the signature of their inputs.

- :func:`tensor_key`, :func:`scale_key`: what a plan may depend on of a tensor or a scale.
- :class:`PlanCache`: what an op's checks and heuristics decided for one input signature (dtypes,
  shapes, strides, devices, options), so that a repeated call skips them.

The lowest layer of the runtime: it imports nothing of triton-swa (:mod:`.device` clears every
cache when the planned-for device changes, :mod:`.launch` launches what the plans decided).
"""

from __future__ import annotations

import weakref

import torch

__all__ = ["PlanCache", "scale_key", "tensor_key"]


def tensor_key(t):
    """What a plan may depend on of a tensor: dtype, shape, strides and device (None for None)."""
    return None if t is None else (t.dtype, t.shape, t.stride(), t.device)


def scale_key(s):
    """A scale's part of a signature: a tensor's dtype, shape and device, or a number's type."""
    return (s.dtype, s.shape, s.device) if isinstance(s, torch.Tensor) else type(s)


class PlanCache:
    """Plans by signature, at most ``max_size`` of them (cleared when full: signatures are few in a
    serving loop, so a full cache means shapes that do not repeat)."""

    __slots__ = ("plans", "max_size", "__weakref__")
    _ALL = weakref.WeakSet()

    def __init__(self, max_size: int = 4096):
        self.plans: dict = {}
        self.max_size = max_size
        PlanCache._ALL.add(self)

    @classmethod
    def clear_all(cls) -> None:
        """Forget every plan of every cache (the device facts they were planned for changed)."""
        for cache in list(cls._ALL):
            cache.clear()

    def get(self, key):
        return self.plans.get(key)

    def get_or_make(self, signature, make, args: tuple):
        """The plan of ``signature(*args)``, made by ``make(*args)`` (which checks the arguments) on a
        miss. Arguments that have no signature (not tensors, unhashable options) are never cached:
        ``make`` names the culprit."""
        try:
            key = signature(*args)
            plan = self.plans.get(key)
        except (AttributeError, TypeError):
            key, plan = None, None
        if plan is None:
            plan = make(*args)
            if key is not None:
                self.put(key, plan)
        return plan

    def put(self, key, plan) -> None:
        if len(self.plans) >= self.max_size:
            self.plans.clear()
        self.plans[key] = plan

    def clear(self) -> None:
        self.plans.clear()

    def values(self):
        return self.plans.values()

    def items(self):
        return self.plans.items()

    def __len__(self) -> int:
        return len(self.plans)
