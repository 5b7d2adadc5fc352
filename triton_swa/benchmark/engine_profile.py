"""Where an engine's GPU time goes, under SGLang's own profiler (torch's profiler in the scheduler
process, a Chrome trace per rank, started and stopped through the engine's tokenizer manager as
``Engine.start_profile`` / ``stop_profile`` do).

``serve --profile PROMPT_LENxCONCURRENCY,...`` runs, in each engine start after its other phases and
for each item:

- :func:`profile_prefill`: one warm-up request of PROMPT_LEN tokens (compiles what it needs), then
  another prompt as long, one output token: the prefill alone, every chunk, profiled;
- :func:`profile_decode`: CONCURRENCY such requests streamed side by side; once all decode, about
  32 steps of the batch profiled.

``serve --profile-cold`` profiles the engine's very first request instead (:func:`profile_first`,
host and device), where a cold start's time goes when no kernel compiles in it.

The traces' device kernels are summed by class (:data:`KERNEL_CLASSES`): the attention kernels, the
GEMMs, copies, and the rest (norms, activations, rotary, sampling, the stand-in ops). Beside the
wall time (TTFT; the step's inter-token latency) this shows how much of each attention can move.
"""

from __future__ import annotations

import asyncio
import glob
import gzip
import json
import math
import os
import re
import statistics
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping

__all__ = [
    "KERNEL_CLASSES",
    "host_time",
    "kernel_class",
    "kernel_time",
    "profile_decode",
    "profile_first",
    "profile_prefill",
    "read_trace_events",
    "slow_leaves",
    "stream_one",
]

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


# host events of torch's profiler: operators, CUDA runtime and driver calls, annotated regions
HOST_CATEGORIES = ("cpu_op", "cuda_runtime", "cuda_driver", "user_annotation", "python_function")


def host_time(events: Iterable[Mapping], top: int = 12) -> list[tuple[str, float, int, str]]:
    """The ``top`` host event names of a trace by their summed time (name, ms, calls, category). Nested
    events each count their whole span, so an annotated region and the operators inside it both show:
    read the list as where the time sits, not as parts of a sum."""
    by_name: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in HOST_CATEGORIES:
            continue
        entry = by_name[(str(e.get("name", "?")), str(e.get("cat")))]
        entry[0] += float(e.get("dur", 0.0)) / 1e3
        entry[1] += 1
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    return [(name[:120], ms, int(n), cat) for (name, cat), (ms, n) in ranked]


def slow_leaves(events: Iterable[Mapping], min_ms: float = 500.0) -> list[tuple[str, float, str, list[str]]]:
    """The innermost slow host spans of a trace: host events (:data:`HOST_CATEGORIES`) of at least
    ``min_ms`` that hold no other such event of their thread, longest first, each as (name, ms,
    category, the names of the slow spans around it, outermost first). With Python stacks recorded
    (``python_function`` events) a leaf is the function the time sits in; without them, the
    narrowest annotated region or operator that holds it."""
    slow: dict[tuple, list[tuple[float, float, str, str]]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in HOST_CATEGORIES and float(e.get("dur", 0.0)) >= 1e3 * min_ms:
            t0 = float(e.get("ts", 0.0))
            slow[(e.get("pid"), e.get("tid"))].append((t0, t0 + float(e["dur"]), str(e.get("name", "?")), str(e.get("cat"))))
    leaves = []
    for spans in slow.values():
        spans.sort(key=lambda x: (x[0], -x[1]))  # a parent before the children it holds
        for i, (t0, t1, name, cat) in enumerate(spans):
            inside = [s for s in spans[i + 1 :] if s[0] < t1]
            if any(s[1] <= t1 for s in inside):
                continue  # holds a slow span: not a leaf
            around = [s[2] for s in spans[:i] if s[0] <= t0 and s[1] >= t1]
            leaves.append((name[:160], (t1 - t0) / 1e3, cat, [a[:80] for a in around]))
    return sorted(leaves, key=lambda x: -x[1])


def profile_fields(folder: str, device: str, profile_id: str, host: bool = False, stacks: bool = False) -> dict:
    """SGLang's ``ProfileReq`` fields of one profile: device kernels on a GPU (host ops on a CPU, where
    there are no device kernels; ``host``: both), no shapes, and no Python stacks unless ``stacks``
    (every Python call an event: the profiler's own cost grows with them)."""
    activities = (["CPU", "GPU"] if host else ["GPU"]) if device == "cuda" else ["CPU"]
    return dict(output_dir=folder, activities=activities, profile_id=profile_id, with_stack=stacks, record_shapes=False)


def _profile_req(folder: str, device: str, profile_id: str, host: bool = False, stacks: bool = False):
    from sglang.srt.managers.io_struct import ProfileReq

    return ProfileReq(**profile_fields(folder, device, profile_id, host, stacks))


async def stream_one(engine, prompt: list[int], sampling: dict) -> dict:
    """``prompt`` streamed through ``engine`` (SGLang's ``async_generate``) to its end: seconds to the first
    token (NaN if none came), the gaps between tokens, the tokens made and the speculative acceptance
    length SGLang reports (None without speculation)."""
    t0 = time.perf_counter()
    stamps, count = [], 0
    gen = engine.async_generate(input_ids=prompt, sampling_params=sampling, stream=True)
    if asyncio.iscoroutine(gen):
        gen = await gen
    meta: dict = {}
    async for chunk in gen:
        meta = chunk.get("meta_info", {})
        n = int(meta.get("completion_tokens", count))
        now = time.perf_counter()
        stamps.extend([now] * max(0, n - count))
        count = n
    ttft = (stamps[0] - t0) if stamps else float("nan")
    itls = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"ttft": ttft, "itls": itls, "tokens": count, "accept_len": meta.get("spec_accept_length")}


def profile_first(engine, prompt: list[int], folder: str, device: str, max_new_tokens: int, stacks: bool = False) -> dict:
    """The engine's first request (no warm-up before it: a cold start), streamed under SGLang's profiler
    with host and device activity (``stacks``: Python calls too). Returns its time to first token and
    wall time, :func:`kernel_time` of the trace, :func:`host_time` (``host``) and :func:`slow_leaves`
    (``slow``): whether the cold time is device work, a host call (a synchronisation, an allocation, a
    graph's instantiation) or neither (Python with no event unless ``stacks``)."""
    os.makedirs(folder, exist_ok=True)
    sampling = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    tm = engine.tokenizer_manager
    engine.loop.run_until_complete(tm.start_profile(_profile_req(folder, device, "first", host=True, stacks=stacks)))
    t0 = time.monotonic()
    first = engine.loop.run_until_complete(stream_one(engine, prompt, sampling))
    wall_ms = 1e3 * (time.monotonic() - t0)
    engine.loop.run_until_complete(tm.stop_profile())
    events = read_trace_events(folder)
    head = dict(prompt_len=len(prompt), ttft_ms=1e3 * first["ttft"], wall_ms=wall_ms, tokens=first["tokens"], events=len(events))
    return dict(head, stacks=stacks, host=host_time(events), slow=slow_leaves(events)[:12], **kernel_time(events))


def profile_prefill(engine, prompt: list[int], folder: str, device: str) -> dict:
    """A warm-up request as long as ``prompt`` (its tokens reversed), then ``prompt`` (one output token:
    its prefill, every chunk) under SGLang's profiler; the profiled request's wall time and
    :func:`kernel_time` of its trace."""
    sampling = {"temperature": 0.0, "max_new_tokens": 1, "ignore_eos": True}
    # the warm-up is the prompt reversed: as long, and no prefix the radix cache could serve the second
    engine.generate(input_ids=prompt[::-1], sampling_params=sampling)
    os.makedirs(folder, exist_ok=True)
    tm = engine.tokenizer_manager
    engine.loop.run_until_complete(tm.start_profile(_profile_req(folder, device, "prefill")))
    t0 = time.monotonic()
    engine.generate(input_ids=prompt, sampling_params=sampling)
    wall_ms = 1e3 * (time.monotonic() - t0)
    engine.loop.run_until_complete(tm.stop_profile())
    events = read_trace_events(folder)
    return dict(prompt_len=len(prompt), wall_ms=wall_ms, events=len(events), **kernel_time(events))


def profile_decode(engine, prompts: list[list[int]], steps: int, folder: str, device: str, max_new_tokens: int | None = None) -> dict:
    """``prompts`` streamed side by side; once every one is decoding, about ``steps`` decode steps of
    the batch under SGLang's profiler. Returns the window's wall time, the tokens each request made in
    it (the steps, one token per step without speculation) and :func:`kernel_time` of its trace, with
    the device time per step. Each request asks ``max_new_tokens`` (default ``16 * steps``; more than
    ``steps`` + 2, else the window cannot fill)."""
    max_new_tokens = 16 * steps if max_new_tokens is None else max_new_tokens
    if max_new_tokens < steps + 2:
        raise ValueError(f"max_new_tokens must be at least steps + 2 = {steps + 2}, got {max_new_tokens}")
    os.makedirs(folder, exist_ok=True)
    # long enough that no request ends before the window does: the first requests decode while the
    # last ones still prefill (32k prompts, 16 of them: seconds)
    sampling = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    made = [0] * len(prompts)
    tm = engine.tokenizer_manager

    async def consume(i: int, prompt: list[int]) -> None:
        gen = engine.async_generate(input_ids=prompt, sampling_params=sampling, stream=True)
        if asyncio.iscoroutine(gen):
            gen = await gen
        async for chunk in gen:
            made[i] = int(chunk.get("meta_info", {}).get("completion_tokens", made[i]))

    async def window() -> tuple[float, list[int]]:
        tasks = [asyncio.ensure_future(consume(i, p)) for i, p in enumerate(prompts)]
        while min(made) < 2 and not all(t.done() for t in tasks):
            await asyncio.sleep(0.002)
        await tm.start_profile(_profile_req(folder, device, "decode"))
        before, t0 = list(made), time.monotonic()
        while min(m - b for m, b in zip(made, before)) < steps and not any(t.done() for t in tasks):
            await asyncio.sleep(0.002)
        # the window's wall time ends here: stop_profile also writes the trace (a second or more)
        wall = time.monotonic() - t0
        advanced = [m - b for m, b in zip(made, before)]
        await tm.stop_profile()
        await asyncio.gather(*tasks)
        return wall, advanced

    wall_s, advanced = engine.loop.run_until_complete(window())
    events = read_trace_events(folder)
    t = kernel_time(events)
    n = statistics.median(advanced) if advanced else 0
    return dict(
        requests=len(prompts),
        prompt_len=len(prompts[0]) if prompts else 0,
        wall_ms=1e3 * wall_s,
        steps=n,
        tokens_per_request=advanced,
        device_ms_per_step=t["total_ms"] / n if n else math.nan,
        events=len(events),
        **t,
    )
