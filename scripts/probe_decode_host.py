"""Host cost per eager swa_decode call on the GPU (fast launch on/off), and whether plans hit the fast path.

Usage (GPU): PYTHONPATH=<tree> python3 scripts/probe_decode_host.py
"""

import time

import torch

import triton_swa.ops.decode.launcher as d
import triton_swa_reference as ref
from triton_swa.runtime.launch import set_fast_launch
from triton_swa.testing import make_pool_state

st = make_pool_state(seq_lens=[4000], window_left=1023, device="cuda", swa_head_num=16, swa_head_dim=128, dtype=torch.bfloat16)
k, v = st.kv_pool.get_kv_buffer(0)
q = torch.randn(1, 32, 128, device="cuda", dtype=torch.bfloat16)
ip, ix, _ = ref.decode_window_indices(st.req_to_token, st.req_pool_indices(), st.seq_lens(), 1023, st.mapping)
ip, ix = ip.int().cuda(), ix.int().cuda()
call = lambda: d.swa_decode(q, k, v, kv_indptr=ip, kv_indices=ix, max_window=1024)
for fast in (True, False):
    set_fast_launch(fast)
    for _ in range(50):
        call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(2000):
        call()
    torch.cuda.synchronize()
    print(f"{d.__file__}: fast_launch={fast}: {(time.perf_counter() - t0) / 2000 * 1e6:.1f} us per call")
for plan in d._PLANS.values():
    main = plan.main
    print(
        "plan split",
        plan.split,
        "fused",
        plan.fused,
        "main compiled keys",
        len(main.compiled),
        "merge",
        None if plan.merge is None else len(plan.merge.compiled),
    )

if __import__("os").environ.get("PROFILE"):
    import cProfile
    import pstats

    set_fast_launch(True)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(500):
        call()
    torch.cuda.synchronize()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(14)
