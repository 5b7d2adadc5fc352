"""Facts about the device a launch runs on: read once per device from Triton's driver (CUDA and HIP
alike), or a known target's for planning a launch offline (:func:`planning_for`).

Under Triton's interpreter (a CPU run) the ops size their work as for a small GPU: the numbers only
steer split counts and tiles there, never correctness.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

__all__ = ["TARGETS", "DeviceFacts", "device_facts", "interpreting", "kv_fp8_mode", "planning_for"]


@dataclass(frozen=True)
class DeviceFacts:
    """What the launch heuristics need to know of a GPU.

    Attributes:
        name (str): the target, e.g. ``"sm_90"`` or ``"gfx942"``.
        backend (str): ``"cuda"`` or ``"hip"``.
        arch (int | str): Triton's ``GPUTarget`` arch (``90``, ``"gfx942"``).
        num_sms (int): streaming multiprocessors (NVIDIA) or compute units (AMD).
        smem_per_program (int): most shared memory (LDS) one program may use, in bytes.
        smem_per_sm (int): shared memory the programs resident on one SM / CU share, in bytes.
        regs_per_sm (int): 32-bit registers per SM / CU that resident programs share (per lane).
        warp_size (int): threads of a warp (NVIDIA 32) or wavefront (CDNA 64, RDNA 32 in Triton).
        fp8 (tuple): the fp8 e4m3 KV formats the kernels load natively on the target (``"e4m3fn"``
            where Triton 3.6 converts it, ``"e4m3fnuz"`` on gfx942); any other fp8 pool is read as
            bytes and decoded in the kernel (:func:`kv_fp8_mode`).
    """

    name: str
    backend: str
    arch: int | str
    num_sms: int
    smem_per_program: int
    smem_per_sm: int
    regs_per_sm: int
    warp_size: int
    fp8: tuple = ()


KB = 1024
# Known targets, for planning and compiling ahead of time (the compile tier). Sources: NVIDIA's CUDA
# C++ Programming Guide, "Technical Specifications per Compute Capability" (shared memory per SM and
# per block: 8.0 164/163 KB, 8.6 and 8.9 100/99 KB, 9.0 228/227 KB, 12.0 128/99 KB; 64K registers
# per SM); AMD's CDNA2/CDNA3/CDNA4 and RDNA3 ISA guides (64 KB LDS per CU, 160 KB on CDNA4; wave64
# on CDNA, wave32 in Triton on RDNA). SM / CU counts of one product each (A100, A10, L4, H100 SXM,
# RTX 5090, MI250X GCD, MI300X, MI355X, RX 7900 XTX): they only size splits. ``fp8``: the formats
# loaded natively, as the compile tier found them: Triton 3.6 converts e4m3fn on sm_89+ and AMD but
# not on sm_80/86, and e4m3fnuz on gfx942 only (its LLVM cannot select the conversion elsewhere); the
# others, and e4m3fnuz under the interpreter (which cannot load it), are decoded from their bytes.
TARGETS = {
    "sm_80": DeviceFacts("sm_80", "cuda", 80, 108, 163 * KB, 164 * KB, 65536, 32),
    "sm_86": DeviceFacts("sm_86", "cuda", 86, 72, 99 * KB, 100 * KB, 65536, 32),
    "sm_89": DeviceFacts("sm_89", "cuda", 89, 58, 99 * KB, 100 * KB, 65536, 32, ("e4m3fn",)),
    "sm_90": DeviceFacts("sm_90", "cuda", 90, 132, 227 * KB, 228 * KB, 65536, 32, ("e4m3fn",)),
    "sm_120": DeviceFacts("sm_120", "cuda", 120, 170, 99 * KB, 128 * KB, 65536, 32, ("e4m3fn",)),
    "gfx90a": DeviceFacts("gfx90a", "hip", "gfx90a", 110, 64 * KB, 64 * KB, 131072, 64, ("e4m3fn",)),
    "gfx942": DeviceFacts("gfx942", "hip", "gfx942", 304, 64 * KB, 64 * KB, 131072, 64, ("e4m3fn", "e4m3fnuz")),
    "gfx950": DeviceFacts("gfx950", "hip", "gfx950", 256, 160 * KB, 160 * KB, 131072, 64, ("e4m3fn",)),
    "gfx1100": DeviceFacts("gfx1100", "hip", "gfx1100", 96, 64 * KB, 64 * KB, 65536, 32, ("e4m3fn",)),
}

# A small GPU, as the interpreter pretends to be: 4 SMs with Hopper's shared memory.
INTERPRETER = DeviceFacts("interpreter", "cuda", 90, 4, 227 * KB, 228 * KB, 65536, 32, ("e4m3fn",))

# How a kernel reads K/V (its KV_FP8 constexpr, see triton_swa.ops._common.fp8): in their own dtype,
# or as uint8 bytes of fp8 e4m3fn / e4m3fnuz decoded in the kernel.
KV_NATIVE, KV_E4M3FN_BITS, KV_E4M3FNUZ_BITS = 0, 1, 2

_FACTS: dict = {}
_PLANNING: list = []


def kv_fp8_mode(facts: DeviceFacts, kv_dtype: torch.dtype) -> tuple[int, torch.dtype | None]:
    """How the kernels read a K/V buffer of ``kv_dtype`` on ``facts``' target: ``(KV_FP8, view)``,
    the kernels' constexpr (:mod:`triton_swa.ops._common.fp8`) and the dtype to view the buffers as
    before the launch (None: as they are).

    uint8 is the pools' storage of float8_e4m3fn. Each format loads natively where the target
    converts it (``facts.fp8``), else as bytes decoded in the kernel: exact too, but about 1.5x slower
    on the H200, where the conversion is one instruction per two elements (B 64, W 1023, D 128: 195
    against 125 us; ``bench/results/fp8-decode-2026-12-01-*``).
    """
    if kv_dtype == torch.uint8:
        kv_dtype = torch.float8_e4m3fn
    fmt = {torch.float8_e4m3fn: "e4m3fn", torch.float8_e4m3fnuz: "e4m3fnuz"}.get(kv_dtype)
    if fmt is None:
        return KV_NATIVE, None
    if fmt in facts.fp8:
        return KV_NATIVE, kv_dtype
    return (KV_E4M3FN_BITS if fmt == "e4m3fn" else KV_E4M3FNUZ_BITS), torch.uint8


def interpreting() -> bool:
    """Whether Triton's interpreter runs the kernels (``TRITON_INTERPRET=1``, read at each call)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def device_facts(device: torch.device) -> DeviceFacts:
    """The facts of ``device``: Triton's driver's for a GPU, a small GPU's for a CPU tensor, or the
    target of an enclosing :func:`planning_for`."""
    if _PLANNING:
        return _PLANNING[-1]
    if device.type != "cuda":
        return INTERPRETER
    facts = _FACTS.get(device)
    if facts is None:
        facts = _FACTS[device] = _read_facts(torch.cuda.current_device() if device.index is None else device.index)
    return facts


def _read_facts(index: int) -> DeviceFacts:
    """One device's facts from Triton's active driver (CUDA or HIP)."""
    from triton.runtime import driver

    props = driver.active.utils.get_device_properties(index)
    target = driver.active.get_current_target()
    warp = int(props.get("warpSize", target.warp_size))
    smem = int(props["max_shared_mem"])
    if target.backend == "cuda":
        # A CUDA block may use all of its SM's shared memory but the 1 KB the system reserves per block.
        name, smem_sm, fp8 = f"sm_{target.arch}", smem + KB, ("e4m3fn",) if target.arch >= 89 else ()
    else:
        name, smem_sm = str(target.arch).split(":")[0], smem
        fp8 = TARGETS[name].fp8 if name in TARGETS else ()
    regs = int(props.get("max_num_regs", 65536))
    return DeviceFacts(name, target.backend, target.arch, int(props["multiprocessor_count"]), smem, smem_sm, regs, warp, fp8)


@contextlib.contextmanager
def planning_for(facts: DeviceFacts):
    """Plan launches for ``facts`` (a :data:`TARGETS` entry) whatever device the tensors are on:
    the compile tier uses it to compile, on a CPU, exactly what the launchers would launch there."""
    from .plans import PlanCache

    # plans are cached by input signature, which does not name the target
    PlanCache.clear_all()
    _PLANNING.append(facts)
    try:
        yield facts
    finally:
        _PLANNING.pop()
        PlanCache.clear_all()
