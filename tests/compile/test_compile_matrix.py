"""The compile tier: every kernel, as each target's launcher plans it, compiled by Triton's own compiler
for NVIDIA and AMD targets on this machine (no GPU needed; ``triton_swa.testing.compile_matrix``).

One subprocess per target (the compiled ``@triton.jit`` path needs ``TRITON_INTERPRET`` unset, which
this session's interpreter tier sets). Each launch must compile and fit the target's shared memory,
fp8 pools of both formats included (read natively where Triton converts them, else as bytes decoded
in the kernel), and no launcher may refuse a case. On sm_90, ptxas may not serialise the wgmma of any
extend kernel (its warning C7515), the bf16 / fp16 launches may not spill (the D 512 prefill's wide
tile: at most 32 B), and the prefill's tensor-core path (wgmma or mma.sync) is pinned per head dim.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from triton_swa.runtime.device import TARGETS, kv_fp8_mode

pytestmark = pytest.mark.compile


KERNELS = ("_swa_decode_kernel", "_swa_extend_kernel")


@pytest.mark.parametrize("target", list(TARGETS))
def test_every_kernel_compiles_for(target):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITON_SWA_POISON")}
    done = subprocess.run(
        [sys.executable, "-m", "triton_swa.testing.compile_matrix", "--target", target, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert results, done.stderr[-3000:]
    failed = [f"{r['case']} {r['kernel']} [{r['variant']}]: {r['error']}" for r in results if not r["ok"]]
    assert not failed, "\n".join(failed)
    attention = [r for r in results if r["kernel"] in ("_swa_decode_kernel", "_swa_extend_kernel")]
    fp8 = {r["case"] for r in attention if "fp8" in r["case"]}
    assert {"decode-d128-fp8", "decode-d256-fp8nuz-pages", "extend-chunk-d128-fp8", "extend-chunk-d256-fp8nuz-pages"} <= fp8, fp8
    # each fp8 format compiled the way its launcher reads it there: natively, or as bytes decoded in the kernel
    mode, _ = kv_fp8_mode(TARGETS[target], torch.float8_e4m3fnuz)
    assert all(f"KV_FP8={mode}" in r["variant"].split() for r in attention if "fp8nuz" in r["case"]), target
    mode, _ = kv_fp8_mode(TARGETS[target], torch.float8_e4m3fn)
    assert all(f"KV_FP8={mode}" in r["variant"].split() for r in attention if "-fp8" in r["case"] and "fp8nuz" not in r["case"])
    # the decode and extend kernels' fused K/V store (a plan's), decode's with its in-place merge, compile too
    fused = {k: [r["variant"].split() for r in attention if r["case"].endswith("-fused-store") and r["kernel"] == k] for k in KERNELS}
    assert all(len(v) == 2 and all("STORE=True" in x for x in v) for v in fused.values()), fused
    assert any("FUSED_MERGE=True" in v for v in fused["_swa_decode_kernel"]), fused
    # ptxas keeps every extend kernel's wgmma asynchronous on Hopper (C7515 would halve its rate)
    serialised = [f"{r['case']} [{r['variant']}]" for r in results if r["wgmma_serialised"]]
    assert not serialised, serialised
    if target == "sm_90":
        # on Hopper the bf16 / fp16 launches keep every value in registers: spills (stack bytes) only in
        # the fp32 tiles and the fp8 paths. One measured exception: the D 512 prefill's WIDE_HEAD_TILE
        # (128 x 32) spills 32 B and still ran 1.27-1.33x faster than 128 x 16 with no spill (H100,
        # graph replay, 2026-12-07: 73.5 against 101.1 ms at 32k, 8.0 against 10.7 ms at 8k)
        wide_spill = {"extend-prefill-d512": 32, "extend-prefill-d512-dvparts": 32}
        spilled = [
            f"{r['case']} {r['kernel']}: {r['spills']} B"
            for r in attention
            if (r["spills"] or 0) > wide_spill.get(r["case"], 0) and "fp32" not in r["case"] and "fp8" not in r["case"]
        ]
        assert not spilled, spilled
        # tiles of 64 rows and more take Hopper's wgmma; the D 512 prefill's 32-row tiles take mma.sync
        # (docs/performance.md: the wide-head prefill runs far below the tensor cores' rate)
        cores = {r["case"]: r["tensor_cores"] for r in attention if r["case"].startswith("extend-prefill")}
        want = {"extend-prefill-d128": "wgmma", "extend-prefill-d256": "wgmma", "extend-prefill-d512": "wgmma"}
        assert cores == dict(want, **{"extend-prefill-d512-dvparts": "wgmma"}), cores
        # dv_parts halves the wide heads' accumulator: fewer registers than the tile whole (245, 2026-12-07)
        regs = {r["case"]: r["registers"] for r in attention if r["case"].startswith("extend-verify-d512")}
        assert regs["extend-verify-d512-dvparts"] < 200, regs
    kernels = {r["kernel"] for r in results}
    assert kernels >= {
        "_swa_decode_kernel",
        "_swa_merge_kernel",
        "_swa_extend_kernel",
        "_swa_window_indices_kernel",
        "_swa_translate_kernel",
        "_swa_store_kv_kernel",
    }, kernels
    assert done.returncode == 0, done.stderr[-3000:]
