"""Recorded launches as Triton's JIT tells compiled kernels apart, for tests of what a precompile covers."""

from __future__ import annotations

import torch

__all__ = ["launch_key"]


def launch_key(fn, args, constexprs: dict, options: dict) -> tuple:
    """The compiled kernel a launch recorded by :func:`~triton_swa.runtime.launch.recorded_launches`
    runs, as a hashable key: the kernel's name, its constexprs and options, and how Triton's JIT
    specialises each argument: a tensor by dtype and 16-byte alignment (a parameter marked
    ``do_not_specialize_on_alignment`` counts as aligned), a dtype as an aligned pointer (how
    ``recorded_launches(tensors_as_dtypes=True)`` records one), an integer by being 1 and being a
    multiple of 16 (not at all for ``do_not_specialize`` parameters), None and bools as they are,
    other values by type. Two launches with equal keys run one compiled kernel."""
    # the interpreter's function keeps the decorator's arguments; a JITFunction keeps them as attributes
    given = getattr(fn, "kwargs", None) or {}

    def marked(attr: str) -> set:
        found = given.get(attr) or getattr(fn, attr, None) or ()
        return {fn.arg_names[a] if isinstance(a, int) else a for a in found}

    plain, any_alignment = marked("do_not_specialize"), marked("do_not_specialize_on_alignment")
    spec = []
    for name, a in zip(fn.arg_names, args):
        if isinstance(a, torch.Tensor):
            spec.append((name, a.dtype, name in any_alignment or a.data_ptr() % 16 == 0))
        elif isinstance(a, torch.dtype):
            spec.append((name, a, True))
        elif a is None or isinstance(a, bool):
            spec.append((name, a))
        elif isinstance(a, int):
            spec.append((name, "int") if name in plain else (name, a == 1, a % 16 == 0))
        else:
            spec.append((name, type(a).__name__))
    kernel = getattr(fn, "fn", fn).__name__
    return (kernel, tuple(sorted(constexprs.items())), tuple(sorted(options.items())), tuple(spec))
