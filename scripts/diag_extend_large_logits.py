"""Diagnose the GPU-only NaN of tests/ops/test_numeric_edges.py::test_extend_large_logits[nocap-direct-bf16-q1e17-v1e30].

Runs the test's case with variants (magnitude, sinks, splits, dtype, tiles) and prints NaN counts and the
largest error against the float64 reference. Usage (GPU): python3 scripts/diag_extend_large_logits.py
"""

import sys

sys.path.insert(0, "tests/ops")
import test_extend as ext  # noqa: E402
import torch  # noqa: E402

import triton_swa_reference as ref  # noqa: E402

dev = "cuda"
rows = []
for dtype in (torch.bfloat16, torch.float16):
    for sinks in (True, False):
        for mult, v_mult in ((1e17, 1e30), (1e17, 1.0), (1e15, 1e30), (1.0, 1e30), (1e8, 1.0)):
            if dtype == torch.float16 and mult > 1e3:
                continue
            for splits in (1, 2):
                for bm, bn in ((16, 16), (64, 64)):
                    case = ext.Case(**ext._mix((14, 5), (6, 6), (9, 1)), W=7, dtype=dtype, softcap=0.0, sinks=sinks, bm=bm, bn=bn)
                    built = ext.build(case, dev, seed=9)
                    a = built["args"]
                    for name, m in (("q", mult), ("k", mult), ("v", v_mult), ("k_buffer", mult), ("v_buffer", v_mult)):
                        a[name] = (a[name].float() * m).to(dtype)
                    st = built["state"]
                    indptr, indices, _ = ref.extend_window_indices(
                        st.req_to_token, st.req_pool_indices(), a["prefix_lens"], case.W, st.mapping
                    )
                    want = ref.extend_attention(
                        a["q"],
                        a["k"],
                        a["v"],
                        a["k_buffer"],
                        a["v_buffer"],
                        a["qo_indptr"],
                        indptr.to(dev),
                        indices.to(dev),
                        a["prefix_lens"],
                        **built["kw"],
                    )
                    try:
                        got = ext.run_kernel(case, built, num_splits=splits)
                        nan = torch.isnan(got.float())
                        where = nan.nonzero()[:4].tolist()
                        err = float((got.double() - want).abs().nan_to_num(0).max() / max(v_mult, 1e-30))
                        rows.append(
                            (str(dtype)[6:], sinks, f"{mult:g}", f"{v_mult:g}", splits, f"{bm}x{bn}", int(nan.sum()), f"{err:.2e}", where)
                        )
                    except Exception as e:  # noqa: BLE001
                        rows.append((str(dtype)[6:], sinks, f"{mult:g}", f"{v_mult:g}", splits, f"{bm}x{bn}", "ERR", repr(e)[:60], ""))
print("dtype sinks mult v_mult splits tile nan_count rel_err first_nan")
for r in rows:
    print(*r)
