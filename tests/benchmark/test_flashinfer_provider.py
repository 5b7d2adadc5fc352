"""``triton-swa bench``'s FlashInfer providers without FlashInfer: which cases they take and why not,
what the background build builds, and the inputs the adapters hand FlashInfer's wrappers, run here
through a float64 stand-in for the wrappers that computes what FlashInfer's documentation says its
``plan`` / ``run`` compute (paged lists, ``last_page_len``, bottom-right causal mask, ``window_left``
keeping ``W + 1`` keys, ``k_scale`` folded into the softmax scale, ``v_scale`` on the output, pages
read whole so that a NaN in a masked slot still reaches the output through ``0 * NaN``)."""

from __future__ import annotations

import math

import pytest
import torch

from triton_swa.benchmark import providers as P
from triton_swa.benchmark.cases import SHAPES, Case, Shape
from triton_swa.benchmark.runner import COLUMNS, read_csv, summary, to_csv_rows, write_csv

TINY = SHAPES["tiny"]
FLASHINFER = ("flashinfer_decode_tc", "flashinfer_decode_cc", "flashinfer_prefill")


def test_each_provider_says_which_cases_are_not_its_own():
    decode, verify = Case("decode", TINY, 2, 40), Case("verify", TINY, 2, 40, new=4)
    assert P.flashinfer_unsupported("flashinfer_decode_tc", decode) is None
    assert P.flashinfer_unsupported("flashinfer_decode_cc", Case("decode", TINY, 2, 40, page_size=4, fp8=True)) is None
    assert P.flashinfer_unsupported("flashinfer_prefill", verify) is None
    assert "decode only" in P.flashinfer_unsupported("flashinfer_decode_cc", verify)
    assert "prefill and verify only" in P.flashinfer_unsupported("flashinfer_prefill", decode)
    assert "fp8 cache" in P.flashinfer_unsupported("flashinfer_prefill", Case("verify", TINY, 2, 40, new=4, fp8=True))
    sinks = Case("decode", SHAPES["gptoss"], 1, 8192)
    assert all("no sinks" in P.flashinfer_unsupported(p, sinks) for p in ("flashinfer_decode_tc", "flashinfer_decode_cc"))


def test_on_a_cpu_every_case_is_named_not_applicable():
    case = Case("decode", TINY, 2, 40)
    x = P.build(case, 0, "cpu")
    assert all(P.prepare(p, case, x) == "CUDA only" for p in ("flashinfer_decode_tc", "flashinfer_decode_cc"))
    assert P.prepare("flashinfer_prefill", case, x).startswith("prefill and verify only")


def test_the_background_build_builds_what_the_run_will_plan_once_each():
    g4 = SHAPES["g4swa"]
    cases = [Case("decode", g4, 1, 8192), Case("decode", g4, 8, 8192), Case("decode", g4, 8, 8192, fp8=True)]
    cases += [Case("verify", g4, 8, 4104, new=8), Case("decode", SHAPES["g4full"], 1, 4096), Case("decode", SHAPES["gptoss"], 1, 8192)]
    keys = P.flashinfer_build_keys(cases, ["triton_swa", *FLASHINFER])
    assert keys == [
        ["prefill", "bfloat16", 256, True],  # tensor-core decode and prefill share fa2's prefill module
        ["decode", "bfloat16", 256, True],
        ["prefill", "float8_e4m3fn", 256, True],
        ["decode", "float8_e4m3fn", 256, True],
        ["prefill", "bfloat16", 512, False],
        ["decode", "bfloat16", 512, False],
    ]  # none for the sinks shape, none for fp8 verify
    assert P.flashinfer_build_keys(cases, ["triton_swa"]) == []


class _Spec:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def build(self, need_lock=False):
        assert need_lock
        self.log.append(("build", self.name))


def _fake_flashinfer_jit(monkeypatch, log, one_run_fails=False):
    """``flashinfer.jit`` and ``flashinfer.jit.attention.modules`` as far as the build child uses them."""
    import sys
    import types

    def build_jit_specs(specs):
        log.append(("one run", [s.name for s in specs]))
        if one_run_fails:
            raise RuntimeError("Ninja build failed.")

    modules = types.SimpleNamespace(
        gen_batch_decode_module=lambda *a: _Spec(f"decode-{a[1]}-{a[4]}-{a[7]}", log),
        _gen_batch_prefill_primary_module=lambda backend, *a: _Spec(f"prefill-{backend}-{a[1]}-{a[4]}-{a[7]}", log),
    )
    jit = types.ModuleType("flashinfer.jit")
    jit.build_jit_specs = build_jit_specs
    attention = types.ModuleType("flashinfer.jit.attention")
    attention.modules = modules
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))
    monkeypatch.setitem(sys.modules, "flashinfer.jit", jit)
    monkeypatch.setitem(sys.modules, "flashinfer.jit.attention", attention)
    monkeypatch.setitem(sys.modules, "flashinfer.jit.attention.modules", modules)
    monkeypatch.setattr(P, "_flashinfer_modules", lambda: ("decode", "prefill"))


KEYS = [["prefill", "bfloat16", 256, True], ["decode", "bfloat16", 256, True], ["decode", "float8_e4m3fn", 512, False]]
NAMES = ["prefill-fa2-torch.bfloat16-256-True", "decode-torch.bfloat16-256-True", "decode-torch.float8_e4m3fn-512-False"]


def test_the_build_child_compiles_every_module_in_one_ninja_run(monkeypatch, capsys):
    log = []
    _fake_flashinfer_jit(monkeypatch, log)
    assert P._flashinfer_build(KEYS) == 0
    assert log == [("one run", NAMES)]  # no module built alone
    assert capsys.readouterr().err.count("built ") == 3


def test_the_build_child_builds_one_module_at_a_time_when_the_one_run_fails(monkeypatch, capsys):
    log = []
    _fake_flashinfer_jit(monkeypatch, log, one_run_fails=True)
    assert P._flashinfer_build(KEYS) == 0
    assert log == [("one run", NAMES)] + [("build", n) for n in NAMES]
    assert "building one by one" in capsys.readouterr().err


# ---- a stand-in for FlashInfer's wrappers: what they are documented to compute ----


def _paged_attention(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, last_page_len, window_left, scale, causal):
    ps = k_cache.shape[1]
    outs = []
    for b in range(len(kv_indptr) - 1):
        pages = kv_indices[kv_indptr[b] : kv_indptr[b + 1]].long()
        kv_len = (len(pages) - 1) * ps + int(last_page_len[b])
        K = k_cache[pages].reshape(-1, *k_cache.shape[2:])[:kv_len].double()
        V = v_cache[pages].reshape(-1, *v_cache.shape[2:])[:kv_len].double()
        rows = range(int(qo_indptr[b]), int(qo_indptr[b + 1]))
        for i, r in enumerate(rows):
            last = kv_len - len(rows) + i  # bottom-right aligned: the query's own key
            j = torch.arange(kv_len)
            keep = (j <= last) if causal or len(rows) == 1 else torch.ones_like(j, dtype=torch.bool)
            if window_left >= 0:
                keep &= last - j <= window_left
            H = K.shape[1]
            s = torch.einsum("hgd,nhd->hgn", q[r].double().view(H, -1, q.shape[-1]), K) * scale
            p = torch.softmax(torch.where(keep, s, -math.inf), -1)
            outs.append(torch.einsum("hgn,nhd->hgd", p, V).reshape(q.shape[1], -1))  # 0 * NaN stays NaN
    return torch.stack(outs)


class _Wrapper:
    def __init__(self, workspace, layout, use_tensor_cores=False, backend="auto"):
        assert layout == "NHD" and backend == "fa2" and workspace.dtype == torch.uint8
        self.decode = None

    def _plan(
        self, qo_indptr, indptr, indices, last_page_len, hq, h, d, page_size, *, window_left, q_data_type, kv_data_type, sm_scale, causal
    ):
        for t in (qo_indptr, indptr, indices, last_page_len):
            assert t.dtype == torch.int32
        assert int(indptr[-1]) == len(indices) and bool((last_page_len >= 1).all()) and bool((last_page_len <= page_size).all())
        self.args = (qo_indptr.clone(), indptr.clone(), indices.clone(), last_page_len.clone(), window_left, sm_scale, causal)
        self.kinds = (hq, h, d, page_size, q_data_type, kv_data_type)

    def run(self, q, kv, out=None, k_scale=None, v_scale=None):
        k, v = kv
        hq, h, d, ps, q_dtype, kv_dtype = self.kinds
        assert q.dtype == q_dtype and k.dtype == kv_dtype and tuple(k.shape[1:]) == (ps, h, d) and q.shape[1:] == (hq, d)
        qo, indptr, indices, last, window_left, scale, causal = self.args
        scale = scale * (k_scale or 1.0)
        got = _paged_attention(q, k.double(), v.double(), qo, indptr, indices, last, window_left, scale, causal)
        out.copy_((got * (v_scale or 1.0)).to(out.dtype))
        return out


class _Decode(_Wrapper):
    def plan(self, indptr, indices, last_page_len, hq, h, d, page_size, **kw):
        qo = torch.arange(len(indptr), dtype=torch.int32)
        self._plan(qo, indptr.cpu(), indices.cpu(), last_page_len.cpu(), hq, h, d, page_size, causal=False, **kw)


class _Prefill(_Wrapper):
    def plan(self, qo_indptr, indptr, indices, last_page_len, hq, h, d, page_size, *, causal, **kw):
        self._plan(qo_indptr.cpu(), indptr.cpu(), indices.cpu(), last_page_len.cpu(), hq, h, d, page_size, causal=causal, **kw)


class _Modules:
    decode = type("decode", (), {"BatchDecodeWithPagedKVCacheWrapper": _Decode})
    prefill = type("prefill", (), {"BatchPrefillWithPagedKVCacheWrapper": _Prefill})


@pytest.mark.parametrize(
    "case",
    [
        Case("decode", TINY, 2, 40),
        Case("decode", TINY, 2, 40, page_size=4),
        Case("decode", TINY, 2, 41, page_size=4),  # the window starts inside a page
        Case("decode", TINY, 2, 40, fp8=True),
        Case("decode", TINY, 2, 40, page_size=4, fp8=True),
        Case("decode", Shape("tfull", 4, 1, 32, -1), 2, 40, page_size=4),
        Case("verify", TINY, 2, 40, new=4),
        Case("verify", TINY, 2, 40, new=4, page_size=4),  # the window starts inside a page
        Case("prefill", TINY, 1, 48, new=48),
        Case("prefill", TINY, 1, 48, new=48, page_size=4),
    ],
    ids=lambda c: c.id,
)
def test_the_adapters_inputs_give_the_reference(case, monkeypatch):
    """Each adapter's page lists, lengths, window and scales, run through the stand-in, give the
    bench's float64 reference: FlashInfer fed this way computes the case (its own kernels are then
    checked the same way on the GPU before they are timed)."""
    monkeypatch.setattr(
        P, "_flashinfer_ready", lambda provider, case, x: P.flashinfer_unsupported(provider, case) or (_Modules.decode, _Modules.prefill)
    )
    x = P.build(case, 0, "cpu")
    expected = P.reference(case, x)
    ran = 0
    for name in FLASHINFER:
        call = P.prepare(name, case, x)
        if isinstance(call, str):
            continue
        ran += 1
        assert P.check(case, x, call, expected) <= P.TOLERANCE, name
    assert ran == (2 if case.op == "decode" else 1)


def test_a_nan_before_the_window_would_reach_the_stand_in():
    """The stand-in reads pages whole, as FlashInfer does: without the adapter's finite slots before a
    window that starts inside a page, its output is NaN (so the test above tests those slots)."""
    case = Case("verify", TINY, 2, 40, new=4, page_size=4)
    assert case.window_start % 4
    x = P.build(case, 0, "cpu")
    k, v, pages = P._paged_extend_cache(case, x, 4)
    per, first = pages.shape[1], case.window_start // 4
    last = torch.full((2,), case.context - (first + per - 1) * 4, dtype=torch.int32)
    got = _paged_attention(x["q"], k, v, x["qo_indptr"], torch.arange(3) * per, pages.reshape(-1), last, TINY.window_left, 1.0, True)
    assert bool(torch.isnan(got).any())


# ---- the eager column ----


def test_rows_carry_an_eager_time_and_older_files_take_the_new_column(tmp_path):
    case = Case("decode", TINY, 2, 40)
    old_columns = [c for c in COLUMNS if c != "eager_us_p50"]
    path = tmp_path / "bench.csv"
    numbers = ("us_p50", "us_p20", "us_p80", "tbps", "tflops", "pct_copy", "copy_tbps")
    path.write_text(",".join(old_columns) + "\n" + ",".join("1" if c in numbers else "x" for c in old_columns) + "\n")
    row = dict(case=case.id, provider="triton_swa", status="ok", us=(1.0, 2.0, 3.0), eager_us=(4.0, 5.0, 6.0), max_abs_err=0.0)
    write_csv(path, to_csv_rows([case], [row], "abc", "clean", "r1"))
    assert path.read_text().splitlines()[0] == ",".join(COLUMNS)
    (new,) = read_csv(path, "r1")
    assert new["us_p50"] == 2.0 and new["eager_us_p50"] == 5.0
    (old,) = read_csv(path, "x")
    assert math.isnan(old["eager_us_p50"])
    text = summary([new])
    assert "Eager, back to back" in text and "| 5.00 |" in text
    assert "Eager" not in summary([old | dict(status="ok", provider="triton_swa", case=case.id, tbps=1.0, pct_copy=1.0)])
