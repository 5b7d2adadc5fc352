"""Where an engine's prefill spends its GPU time: one long prompt under SGLang's own profiler.

``serve --profile PROMPT_LEN`` runs :func:`profile_prefill` in each engine start after its other
phases: one warm-up request of that length (compiles what the prompt needs), then the same length
again, one output token (the prefill alone, all its chunks), under ``Engine.start_profile`` /
``stop_profile`` (torch's profiler in the scheduler process, a Chrome trace per rank). The trace's
device kernels are summed by class (:data:`KERNEL_CLASSES`): the attention kernels, the GEMMs, and
the rest (norms, activations, rotary, the stand-in ops, copies). Comparing the classes across
attention backends shows how much of the time to first token attention can move.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import re
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping

__all__ = ["KERNEL_CLASSES", "kernel_class", "kernel_time", "profile_prefill", "read_trace_events"]

# First match wins. Attention: triton-swa's kernels (_swa_*), SGLang's Triton attention (its extend,
# decode and merge kernels are _fwd_*), FlashInfer's and FlashAttention's. GEMMs: cuBLAS / CUTLASS
# names on NVIDIA (sm90_xmma_*, nvjet_*, cutlass*), rocBLAS / hipBLASLt on AMD (Cijk_*), Triton matmuls.
KERNEL_CLASSES: tuple[tuple[str, re.Pattern], ...] = (
    ("attention", re.compile(r"_swa_|_fwd_kernel|_fwd_grouped|extend_attention|decode_att|flash|fmha|attention", re.I)),
    ("gemm", re.compile(r"gemm|xmma|nvjet|cutlass|cublas|Cijk_|matmul|_mm_", re.I)),
    ("copy", re.compile(r"memcpy|memset|Memcpy|Memset")),
)


def kernel_class(name: str) -> str:
    """The class of a device kernel's name: one of :data:`KERNEL_CLASSES`' names, else ``other``."""
    for label, pattern in KERNEL_CLASSES:
        if pattern.search(name):
            return label
    return "other"


def read_trace_events(folder: str) -> list[dict]:
    """The events of every Chrome trace (``*.trace.json.gz`` or ``*.json``) under ``folder``."""
    events: list[dict] = []
    for path in sorted(glob.glob(os.path.join(folder, "**", "*.json*"), recursive=True)):
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            trace = json.load(f)
        events += trace.get("traceEvents", []) if isinstance(trace, Mapping) else trace
    return events


def kernel_time(events: Iterable[Mapping], top: int = 8) -> dict:
    """Device time of a trace's kernels, copies and fills (events of category ``kernel``,
    ``gpu_memcpy``, ``gpu_memset``; ``dur`` in microseconds): the total and per class in ms, the
    number of kernels, and the ``top`` kernel names by time (name, ms, calls, class)."""
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        entry = by_name[str(e.get("name", "?"))]
        entry[0] += float(e.get("dur", 0.0)) / 1e3
        entry[1] += 1
    classes: dict[str, float] = {label: 0.0 for label, _ in KERNEL_CLASSES}
    classes["other"] = 0.0
    for name, (ms, _) in by_name.items():
        classes[kernel_class(name)] += ms
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    return dict(
        total_ms=sum(classes.values()),
        class_ms=classes,
        kernels=sum(n for _, n in by_name.values()),
        top=[(name[:120], ms, int(n), kernel_class(name)) for name, (ms, n) in ranked],
    )


def profile_prefill(engine, prompt: list[int], folder: str, device: str) -> dict:
    """One warm-up request of ``prompt``, then ``prompt`` again (one output token) under SGLang's
    profiler; returns the profiled request's wall time and :func:`kernel_time` of its trace."""
    sampling = {"temperature": 0.0, "max_new_tokens": 1, "ignore_eos": True}
    engine.generate(input_ids=prompt, sampling_params=sampling)
    os.makedirs(folder, exist_ok=True)
    activities = ["GPU"] if device == "cuda" else ["CPU"]
    engine.start_profile(output_dir=folder, activities=activities, profile_id="prefill")
    t0 = time.monotonic()
    engine.generate(input_ids=prompt, sampling_params=sampling)
    wall_ms = 1e3 * (time.monotonic() - t0)
    engine.stop_profile()
    events = read_trace_events(folder)
    return dict(prompt_len=len(prompt), wall_ms=wall_ms, events=len(events), **kernel_time(events))
