"""The compile tier: every kernel of the library compiled ahead of time for GPU targets, on any machine.

For a target of :data:`triton_swa.runtime.device.TARGETS` and a case (an op and its inputs, on the
CPU), the op's launcher runs as it would on that GPU (:func:`~triton_swa.runtime.device.planning_for`)
up to the launch, which is recorded instead (:class:`~triton_swa.runtime.launch.Launcher`); each
recorded launch is then compiled with ``triton.compile(ASTSource(...), target=GPUTarget(...))``,
with the launcher's exact constexprs and options and the argument specialisation Triton's JIT would
derive, and its shared memory is checked against the target's limit. Registers and spills come from
cuobjdump's resource usage (NVIDIA: ``STACK`` bytes per thread, where spills land) or the AMDGPU
assembly's notes.

It needs the compiled path of ``@triton.jit`` (``TRITON_INTERPRET`` unset): the tests run it in a
subprocess. Report: ``python -m triton_swa.testing.compile_matrix [--target sm_90 ...] [--case ...]``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["CASES", "CompileResult", "compile_case"]


@dataclass
class CompileResult:
    """One compiled launch: kernel, target, constexprs that name it, and what the compiler reports."""

    case: str
    target: str
    kernel: str
    variant: str
    ok: bool
    shared: int = 0
    shared_limit: int = 0
    registers: int | None = None
    spills: int | None = None
    wgmma_serialised: bool = False
    tensor_cores: str = ""
    seconds: float = 0.0
    error: str = ""


def _specialise(fn, args: tuple, constexprs: dict, backend):
    """Signature, constexprs and attributes as Triton's JIT derives them for these arguments."""
    from triton._C.libtriton import native_specialize_impl

    signature, consts, attrs = {}, {}, {}
    runtime = [p for p in fn.params if not p.is_constexpr]
    if len(runtime) != len(args):
        raise ValueError(f"{fn.__name__}: {len(args)} arguments for {len(runtime)} parameters")
    values = iter(args)
    for i, param in enumerate(fn.params):
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            consts[(i,)] = constexprs[param.name]
            continue
        arg = next(values)
        kind, attr = native_specialize_impl(backend, arg, False, not param.do_not_specialize, not param.do_not_specialize_on_alignment)
        signature[param.name] = kind
        if kind == "constexpr":
            consts[(i,)] = arg
        elif attr:
            attrs[(i,)] = backend.parse_attr(attr)
    return signature, consts, attrs


def _nvidia_registers(cubin: bytes) -> tuple[int | None, int | None]:
    """(registers, stack bytes per thread: spills) of the kernel in ``cubin``, from the cuobjdump that
    Triton bundles. Register spills land in the stack frame (``STACK``; ``ptxas -v`` says "N bytes
    stack frame, M bytes spill stores"); ``LOCAL`` counts only declared local arrays, which Triton
    kernels have none of, so it read 0 for kernels that spill (D 512 prefill at 64-row tiles on sm_90:
    ``STACK:280``, ``LOCAL:0``)."""
    tool = os.path.join(os.path.dirname(importlib.import_module("triton.backends.nvidia").__file__), "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        done = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True)
    regs = re.search(r"REG:(\d+)", done.stdout)
    stack = re.search(r"STACK:(\d+)", done.stdout)
    return (int(regs.group(1)) if regs else None), (int(stack.group(1)) if stack else None)


def _amd_registers(amdgcn: str) -> tuple[int | None, int | None]:
    regs = re.search(r"\.vgpr_count:\s+(\d+)", amdgcn) or re.search(r"NumVgprs:\s+(\d+)", amdgcn)
    spill = re.search(r"\.vgpr_spill_count:\s+(\d+)", amdgcn)
    return (int(regs.group(1)) if regs else None), (int(spill.group(1)) if spill else None)


def _first_error_line(exc: BaseException) -> str:
    """The compiler's own message: the innermost cause's last meaningful line (Triton's compilation
    errors end with a source excerpt and a caret)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    lines = [line.strip() for line in str(exc).splitlines() if line.strip() and set(line.strip()) != {"^"}]
    return f"{type(exc).__name__}: {(lines[-1] if lines else '')[:300]}"


def wgmma_serialised(ptx: str) -> bool:
    """Whether ptxas serialises the kernel's wgmma for sm_90a (its warning C7515: about half of
    Hopper's tensor-core rate), as ``ptxas -v`` reports it."""
    from triton import knobs

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        info = subprocess.run([knobs.nvidia.ptxas.path, "-arch=sm_90a", "-v", path, "-o", path + ".cubin"], capture_output=True, text=True)
    return "C7515" in info.stdout + info.stderr


def tensor_core_path(ptx: str) -> str:
    """The tensor-core instructions of a kernel's PTX: ``wgmma`` (Hopper's asynchronous warpgroup MMA),
    ``mma`` (the warp-level ``mma.sync`` of Ampere and later, on Hopper at a fraction of wgmma's
    rate) or ``none``. On sm_90, Triton 3.6 takes wgmma only for tiles of at least 64 rows: the D 512
    extend's 32-row tiles run on ``mma``."""
    if "wgmma.mma_async" in ptx:
        return "wgmma"
    return "mma" if "mma.sync" in ptx else "none"


def _variant(constexprs: dict, options: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in {**constexprs, **options}.items())


def compile_case(name: str, make_call: Callable[[], None], target: str) -> list[CompileResult]:
    """Compile every launch that ``make_call()`` makes, as planned for ``target``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    from ..runtime.device import TARGETS, planning_for
    from ..runtime.launch import recorded_launches

    facts = TARGETS[target]
    gpu = GPUTarget(facts.backend, facts.arch, facts.warp_size)
    backend = make_backend(gpu)
    try:
        with planning_for(facts), recorded_launches() as launches:
            make_call()
    except ValueError as exc:
        # every case is meant to plan on every target: a launcher's refusal is a failure here
        return [CompileResult(name, target, "-", "", False, error=f"refused: {exc}")]
    results, seen = [], set()
    for fn, args, constexprs, options, _grid in launches:
        signature, consts, attrs = _specialise(fn, args, constexprs, backend)
        key = (fn.__name__, tuple(signature.items()), tuple(sorted(map(str, consts.items()))), tuple(options.items()))
        if key in seen:
            continue
        seen.add(key)
        res = CompileResult(name, target, fn.__name__, _variant(constexprs, options), False, shared_limit=facts.smem_per_program)
        t0 = time.perf_counter()
        try:
            kernel = triton.compile(ASTSource(fn, signature, consts, attrs), target=gpu, options=options)
        except Exception as exc:  # noqa: BLE001 - the compiler's own error is the result
            res.error = _first_error_line(exc)
        else:
            res.shared = int(kernel.metadata.shared)
            if facts.backend == "cuda":
                res.registers, res.spills = _nvidia_registers(kernel.asm["cubin"])
                res.tensor_cores = tensor_core_path(kernel.asm["ptx"])
                if facts.name == "sm_90" and fn.__name__ == "_swa_extend_kernel":
                    res.wgmma_serialised = wgmma_serialised(kernel.asm["ptx"])
            else:
                res.registers, res.spills = _amd_registers(kernel.asm["amdgcn"])
            res.ok = res.shared <= facts.smem_per_program
            if not res.ok:
                res.error = f"shared memory {res.shared} B > the target's {facts.smem_per_program} B"
        res.seconds = time.perf_counter() - t0
        results.append(res)
    return results


# ---- the cases: every kernel, each feature combination that matters ----------------------------------


def _decode_call(hq, h, d, dv=None, *, batch, window, page=1, dtype=torch.bfloat16, kv=None, softcap=0.0, sinks=False, fused_store=False):
    """``swa_decode``; with ``fused_store``, a plan that writes the step's K/V in its launch (through a
    mapping, with the default merge: in place up to head dim 256) and its run."""
    from ..ops.decode import swa_decode, swa_decode_plan

    dv = dv or d
    kv = kv or dtype
    slots = batch * window + page
    slots += (-slots) % page
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, hq, d, generator=g).to(dtype)
    k = torch.zeros(slots, h, d).to(kv)
    v = torch.zeros(slots, h, dv).to(kv)
    extra = dict(sinks=torch.zeros(hq) if sinks else None, logit_cap=softcap)
    if kv not in (torch.float16, torch.bfloat16, torch.float32):
        extra.update(k_scale=0.5, v_scale=0.5)
    if page == 1:
        index = dict(
            kv_indptr=torch.arange(batch + 1, dtype=torch.int32) * window,
            kv_indices=torch.arange(page, page + batch * window, dtype=torch.int32),
        )
    else:
        pages = -(-window // page)
        index = dict(
            page_table=torch.ones(batch, pages, dtype=torch.int32),
            window_starts=torch.zeros(batch, dtype=torch.int32),
            seq_lens=torch.full((batch,), window, dtype=torch.int32),
            page_size=page,
        )
    if fused_store:
        store = dict(
            store_loc=torch.arange(batch, dtype=torch.int64) * window + page,
            store_mapping=torch.arange(slots, dtype=torch.int64),
            k_new=torch.randn(batch, h, d, generator=g).to(dtype),
            v_new=torch.randn(batch, h, dv, generator=g).to(dtype),
        )
        new = dict(k_new=store["k_new"], v_new=store["v_new"])
        return lambda: swa_decode_plan(q, k, v, **index, **extra, max_window=window, **store, debug=False).run(q, k, v, **new)
    return lambda: swa_decode(q, k, v, **index, **extra, max_window=window, debug=False)


def _extend_call(
    hq, h, d, *, batch, new, prefix, window_left, dtype=torch.bfloat16, kv=None, page=1, mode="causal", softcap=0.0, sinks=False,
    fused_store=False, dv_parts=None,
):  # fmt: skip
    """``swa_extend``; with ``fused_store``, a plan that writes the step's K/V in its launch (through a
    mapping) and its run; ``dv_parts`` its override."""
    from ..ops.extend import swa_extend, swa_extend_plan

    kv = kv or dtype
    g = torch.Generator().manual_seed(0)
    T = batch * new
    q = torch.randn(T, hq, d, generator=g).to(dtype)
    k = torch.randn(T, h, d, generator=g).to(dtype)
    cached = prefix if window_left < 0 else min(prefix, window_left)
    slots = batch * max(cached, 1) + page
    slots += (-slots) % page
    kb = torch.zeros(slots, h, d).to(kv)
    extra = dict(sinks=torch.zeros(hq) if sinks else None, logit_cap=softcap, dv_parts=dv_parts)
    if kv not in (torch.float16, torch.bfloat16, torch.float32):
        extra.update(k_scale=0.5, v_scale=0.5)
    if mode == "tree":
        extra.update(
            custom_mask=torch.ones(batch * new * new, dtype=torch.bool),
            mask_indptr=torch.arange(batch + 1, dtype=torch.int32) * new * new,
            q_positions=torch.arange(T, dtype=torch.int32) % new + prefix,
        )
    elif mode == "noncausal":
        extra.update(causal=False)
    if page == 1:
        index = dict(
            kv_indptr=torch.arange(batch + 1, dtype=torch.int32) * cached, kv_indices=torch.arange(1, 1 + batch * cached, dtype=torch.int32)
        )
    else:
        index = dict(
            page_table=torch.ones(batch, -(-cached // page) + 1, dtype=torch.int32),
            window_starts=torch.full((batch,), prefix - cached, dtype=torch.int32),
            page_size=page,
        )
    args = (q, k, k, kb, kb, torch.arange(batch + 1, dtype=torch.int32) * new, torch.full((batch,), prefix, dtype=torch.int32))
    if fused_store:
        store = dict(store_loc=torch.arange(T, dtype=torch.int64), store_mapping=torch.arange(slots, dtype=torch.int64))
        plan = lambda: swa_extend_plan(*args, window_left=window_left, **index, **extra, max_extend_len=new, **store, debug=False)  # noqa: E731
        return lambda: plan().run(*args[:5])
    return lambda: swa_extend(*args, window_left=window_left, **index, **extra, max_extend_len=new, debug=False)


def _indices_call(kind: str, *, batch=8, context=4096, window_left=1023, page=1):
    from ..ops.indices import build_window_indices, build_window_page_table, swa_out_cache_loc
    from ..ops.kv_store import store_kv

    rtt = torch.arange(1, 1 + (batch + 1) * context, dtype=torch.int32).view(batch + 1, context)
    rows = torch.arange(1, batch + 1, dtype=torch.int32)
    lens = torch.full((batch,), context, dtype=torch.int32)
    mapping = torch.arange((batch + 1) * context + page + 1, dtype=torch.int64)
    if kind == "csr":
        return lambda: build_window_indices(
            rtt, rows, lens, window_left=window_left, mapping=mapping, num_indices=batch * (window_left + 1), debug=False
        )
    if kind == "csr-pair":  # a backend's eager step: the full and sliding lists in one launch
        from ..ops.indices import _window_lists_plan

        plan = _window_lists_plan(rtt, rows, lens, window_left=window_left, extend=False, mapping=mapping)
        return lambda: plan.run(rtt, rows, lens, mapping, batch * context, batch * (window_left + 1))
    if kind == "pages":
        return lambda: build_window_page_table(
            rtt, rows, lens, window_left=window_left, page_size=page, mapping=mapping, max_pages=64, debug=False
        )
    if kind == "loc":
        return lambda: swa_out_cache_loc(rows.long(), mapping, debug=False)
    if kind == "block-table":
        from ..ops.indices import WindowPageTable, max_window_pages, window_page_table_from_block_table

        width = max_window_pages(window_left, 16, context)
        out = WindowPageTable(torch.zeros(batch, width, dtype=torch.int32), torch.zeros(batch, dtype=torch.int32))
        table = torch.arange(batch * context // 16, dtype=torch.int32).view(batch, -1)
        return lambda: window_page_table_from_block_table(table, lens, window_left=window_left, block_size=16, out=out)
    buffers = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn, "fp8nuz": torch.float8_e4m3fnuz}[kind]
    kb = torch.zeros(64, 8, 128).to(buffers)
    new = torch.randn(batch, 8, 128, dtype=torch.bfloat16)
    scale = dict(k_scale=0.5, v_scale=0.5) if kind.startswith("fp8") else {}
    return lambda: store_kv(kb, kb, rows.long(), new, new, mapping=mapping, **scale, debug=False)


# (name, call maker): Gemma-3-like (32/16 heads, D 128), Gemma-4 sliding (D 256) and full (D 512),
# gpt-oss-like (64/8, D 64, sinks), Mistral-like (32/8); decode split (B 1) and unsplit (B 64).
CASES: dict[str, Callable[[], Callable[[], None]]] = {
    "decode-d128-split": lambda: _decode_call(32, 16, 128, batch=1, window=1024),
    "decode-d128-b64": lambda: _decode_call(32, 16, 128, batch=64, window=1024),
    "decode-d128-pages-softcap": lambda: _decode_call(32, 8, 128, batch=8, window=4096, page=16, softcap=30.0),
    "decode-d64-sinks": lambda: _decode_call(64, 8, 64, batch=64, window=128, sinks=True),
    "decode-d256-split": lambda: _decode_call(32, 16, 256, batch=1, window=1024),
    "decode-d256-b64": lambda: _decode_call(32, 16, 256, batch=64, window=1024),
    "decode-d512-split": lambda: _decode_call(32, 4, 512, batch=1, window=4096),
    "decode-d512-b64-pages": lambda: _decode_call(32, 4, 512, batch=64, window=4096, page=16),
    # float32 pools (the GPU engine tier's float32 token runs): at D 512 the widest tiles of all
    "decode-d512-fp32-split": lambda: _decode_call(32, 4, 512, batch=1, window=4096, dtype=torch.float32),
    "decode-d128-fp8": lambda: _decode_call(32, 16, 128, batch=64, window=1024, kv=torch.float8_e4m3fn),
    "decode-d256-fp8nuz-pages": lambda: _decode_call(32, 16, 256, batch=64, window=1024, page=16, kv=torch.float8_e4m3fnuz),
    "decode-d256-fp16": lambda: _decode_call(32, 16, 256, batch=8, window=1024, dtype=torch.float16),
    "decode-d256-split-fused-store": lambda: _decode_call(32, 16, 256, batch=1, window=1024, fused_store=True),
    "decode-d128-pages-fp8-fused-store": lambda: _decode_call(
        32, 8, 128, batch=8, window=1024, page=16, kv=torch.float8_e4m3fn, fused_store=True
    ),
    "extend-prefill-d128": lambda: _extend_call(32, 16, 128, batch=1, new=2048, prefix=0, window_left=1023),
    "extend-prefill-d256": lambda: _extend_call(32, 16, 256, batch=1, new=2048, prefix=0, window_left=1023),
    "extend-prefill-d512": lambda: _extend_call(32, 4, 512, batch=1, new=512, prefix=0, window_left=-1),
    # the value width in two programs (the wide heads' accumulator halved) at the default tiles
    "extend-prefill-d512-dvparts": lambda: _extend_call(32, 4, 512, batch=1, new=512, prefix=0, window_left=-1, dv_parts=2),
    "extend-verify-d512-dvparts": lambda: _extend_call(32, 4, 512, batch=8, new=8, prefix=2048, window_left=-1, dv_parts=2),
    "extend-chunk-d64-pages-sinks": lambda: _extend_call(64, 8, 64, batch=4, new=256, prefix=512, window_left=127, page=16, sinks=True),
    "extend-verify-d128-split": lambda: _extend_call(32, 8, 128, batch=1, new=8, prefix=4096, window_left=1023),
    "extend-verify-d512-fp32": lambda: _extend_call(32, 4, 512, batch=8, new=8, prefix=2048, window_left=-1, dtype=torch.float32),
    "extend-verify-d128-fp16-pages": lambda: _extend_call(
        32, 8, 128, batch=8, new=4, prefix=2048, window_left=1023, dtype=torch.float16, page=16
    ),
    "extend-verify-d256-tree": lambda: _extend_call(32, 16, 256, batch=4, new=8, prefix=2048, window_left=1023, mode="tree"),
    "extend-draft-d128-noncausal-softcap": lambda: _extend_call(
        32, 16, 128, batch=2, new=16, prefix=1024, window_left=1023, mode="noncausal", softcap=50.0
    ),
    "extend-chunk-d128-fp8": lambda: _extend_call(32, 16, 128, batch=2, new=512, prefix=2048, window_left=1023, kv=torch.float8_e4m3fn),
    "extend-chunk-d256-fp8nuz-pages": lambda: _extend_call(
        32, 16, 256, batch=2, new=256, prefix=2048, window_left=1023, page=16, kv=torch.float8_e4m3fnuz
    ),
    "extend-verify-d128-split-fused-store": lambda: _extend_call(
        32, 8, 128, batch=1, new=8, prefix=4096, window_left=1023, fused_store=True
    ),
    "extend-chunk-d128-pages-fp8-fused-store": lambda: _extend_call(
        32, 16, 128, batch=2, new=64, prefix=512, window_left=1023, page=16, kv=torch.float8_e4m3fn, fused_store=True
    ),
    "indices-csr": lambda: _indices_call("csr"),
    "indices-csr-pair": lambda: _indices_call("csr-pair"),
    "indices-pages": lambda: _indices_call("pages", page=16),
    "indices-loc": lambda: _indices_call("loc"),
    "indices-block-table": lambda: _indices_call("block-table"),
    "store-bf16": lambda: _indices_call("bf16"),
    "store-fp8": lambda: _indices_call("fp8"),
    "store-fp8nuz": lambda: _indices_call("fp8nuz"),
}


def main(argv=None) -> int:
    from ..runtime.device import TARGETS

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", action="append", help=f"default: all of {', '.join(TARGETS)}")
    parser.add_argument("--case", action="append", help="default: every case")
    parser.add_argument("--json", action="store_true", help="one JSON object per compiled launch")
    args = parser.parse_args(argv)
    failed = 0
    summary = []
    for target in args.target or list(TARGETS):
        results = []
        for case in args.case or list(CASES):
            for r in compile_case(case, CASES[case](), target):
                results.append(r)
                failed += not r.ok
                if args.json:
                    print(json.dumps(r.__dict__), flush=True)
                else:
                    regs = "-" if r.registers is None else r.registers
                    spill = "-" if r.spills is None else r.spills
                    status = "ok" if r.ok else f"FAIL {r.error}"
                    print(
                        f"{r.target:8} {r.case:38} {r.kernel:28} smem {r.shared:>7} regs {regs:>4} spill {spill:>5} "
                        f"tc {r.tensor_cores or '-':5} {r.seconds:5.1f}s {status}",
                        flush=True,
                    )
        summary.append(_summary_row(target, results))
    if not args.json:
        print("\n| target | launches compiled | heaviest shared memory (limit) | most registers | spills |")
        print("| --- | ---: | --- | --- | --- |")
        print("\n".join(summary))
    return 1 if failed else 0


def _summary_row(target: str, results: list[CompileResult]) -> str:
    """One markdown row: what compiled for ``target``, its heaviest launches and any spills."""
    done = [r for r in results if r.ok]
    if not done:
        return f"| {target} | 0 of {len(results)} | - | - | - |"
    smem = max(done, key=lambda r: r.shared)
    regs = max(done, key=lambda r: r.registers or 0)
    spills = [f"{r.case} {r.spills} B" for r in done if r.spills]
    return (
        f"| {target} | {len(done)} of {len(results)} | {smem.shared // 1024} KB, {smem.case} "
        f"({smem.shared_limit // 1024} KB) | {regs.registers}, {regs.case} | {'; '.join(spills) or 'none'} |"
    )


if __name__ == "__main__":
    sys.exit(main())
