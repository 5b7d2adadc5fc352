"""Running the kernels on a CPU through Triton's interpreter.

Triton decides at decoration time (``@triton.jit``) whether a kernel is compiled or interpreted, so
``TRITON_INTERPRET=1`` must be set before triton is first imported. triton-swa never sets it on its
own: a test harness (``tests/conftest.py``), a script or the shell does, for instance with
:func:`use_interpreter` as the first thing a CPU script runs. The launchers then pick the smallest
tiles and run bf16 dots in float32 (the interpreter's bf16 ``tl.dot`` is wrong, docs/contract.md §8).
"""

from __future__ import annotations

import os
import sys

__all__ = ["use_interpreter"]


def use_interpreter() -> None:
    """Set ``TRITON_INTERPRET=1`` for this process, before triton is imported.

    Raises:
        RuntimeError: triton is already imported without the interpreter, so kernels decorated by
            then would run compiled; set the variable earlier (or in the shell).
    """
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    if "triton" in sys.modules:
        raise RuntimeError(
            "triton is already imported: set TRITON_INTERPRET=1 before anything imports triton "
            "(triton_swa, torch's compiled paths) to run the kernels in Triton's interpreter"
        )
    os.environ["TRITON_INTERPRET"] = "1"
