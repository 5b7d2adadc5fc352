"""A ``triton-swa bench --plugin`` for the split heuristic of short-window verify: ``swa_extend`` with
forced split counts beside the automatic one (``extend_num_splits``), on the bench's own inputs.

    python -m triton_swa bench --plugin bench.verify_splits_plugin --op verify \
        --providers triton_swa,triton_swa_s1,triton_swa_s2,triton_swa_s4,vllm_triton_trimmed
"""

from __future__ import annotations

import math

from triton_swa.benchmark.cases import Case
from triton_swa.benchmark.providers import FP8_SCALE


def _forced(num_splits: int):
    def prepare(case: Case, x: dict):
        import triton_swa

        if case.op == "decode":
            return "prefill/verify only"
        s = case.shape
        if case.page_size == 1:
            where = dict(kv_indptr=x["kv_indptr"], kv_indices=x["kv_indices"])
        else:
            where = dict(page_table=x["page_table"], window_starts=x["window_starts"], page_size=case.page_size)
        scales = dict(k_scale=FP8_SCALE, v_scale=FP8_SCALE) if case.fp8 else {}
        kw = dict(window_left=s.window_left, sm_scale=1.0 / math.sqrt(s.d), sinks=x["sinks"], out=x["out"], max_extend_len=case.new)
        args = (x["q"], x["k"], x["v"], x["k_pool"], x["v_pool"], x["qo_indptr"], x["prefix_lens"])
        return lambda: triton_swa.swa_extend(*args, **where, **kw, **scales, num_splits=num_splits)

    return prepare


PROVIDERS = {f"triton_swa_s{n}": _forced(n) for n in (1, 2, 4, 8)}
