"""Numeric edges of the attention and store kernels: no NaN anywhere, results equal to the reference.

- rows that see no key (empty decode windows, W = 0 under a custom mask that hides the row itself,
  masked-out rows without a prefix), with and without sinks, through every output path (decode
  direct, the merge kernel and decode's in-place merge, extend direct and split-KV);
- empty requests (0 new tokens), lengths 0 and 1;
- sinks of -inf (the same as no sink) and very large finite ones (all weight on the sink: zeros);
- logits near the fp16/bf16 limits (q and k scaled up until q . k approaches the dtype's and
  float32's range), with and without the soft cap;
- fp8 e4m3 stores beyond the format's range: saturated to +-448, never a NaN byte.

The reference (``triton_swa_reference``) computes in float64. Pools are NaN outside the windows and
outputs start as NaN (plus the suite-wide poisoned allocations, ``tests/conftest.py``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import test_decode as dec
import test_extend as ext
import torch
import triton
import triton.language as tl

import triton_swa_reference as ref
from triton_swa import store_kv
from triton_swa.ops._common.fp8 import KV_E4M3FN_BITS, KV_E4M3FNUZ_BITS, fp8_decode, fp8_rescale
from triton_swa.ops._common.softmax import fold_sink as _fold_sink
from triton_swa.testing import DEFAULT_TOLERANCES, assert_close

pytestmark = pytest.mark.interpreter

INF = float("inf")
NAN = float("nan")
f16, bf16 = torch.float16, torch.bfloat16


def _assert_no_nan(x: torch.Tensor, name: str) -> None:
    assert not bool(torch.isnan(x.float()).any()), f"{name}: NaN in the output"


# ---- the sink fold itself ----


@triton.jit
def _fold_sink_probe(p_m, p_l, p_sink, p_out, N: tl.constexpr):
    o = tl.arange(0, N)
    m, l, alpha = _fold_sink(tl.load(p_m + o), tl.load(p_l + o), tl.load(p_sink + o))
    tl.store(p_out + o, m)
    tl.store(p_out + N + o, l)
    tl.store(p_out + 2 * N + o, alpha)


def test_fold_sink_has_no_nan(device):
    """Every (running max, sink) pair, the empty row (m = -inf, l = 0) against a -inf sink included
    (decode's direct path used to compute exp2(-inf - -inf) there), folds without NaN: (m, l, alpha)
    equal the float64 fold, with a row that has no key left at l = 0 or alpha = 0 (zeros out)."""
    cases = [  # (m_i, l_i, sink) in log2 units
        (-INF, 0.0, -INF),
        (-INF, 0.0, 0.0),
        (-INF, 0.0, 3.0),
        (-INF, 0.0, 1e30),
        (-INF, 0.0, INF),
        (2.0, 1.5, -INF),
        (2.0, 1.5, 2.0),
        (2.0, 1.5, 5.0),
        (2.0, 1.5, -5.0),
        (2.0, 1.5, 1e30),
        (2.0, 1.5, INF),
        (-1e30, 1.0, -INF),
        (1e30, 2.0, 0.0),
        (0.0, 1.0, -1e30),
    ]
    n = 16
    cases += [cases[0]] * (n - len(cases))
    m = torch.tensor([c[0] for c in cases], device=device)
    l = torch.tensor([c[1] for c in cases], device=device)
    s = torch.tensor([c[2] for c in cases], device=device)
    out = torch.full((3 * n,), NAN, device=device)
    _fold_sink_probe[(1,)](m, l, s, out, N=n)
    got_m, got_l, got_alpha = out.cpu().double().reshape(3, n)
    _assert_no_nan(out, "fold")
    # expectations in float64 from the float32 inputs the kernel saw
    as32 = [(float(m[i]), float(l[i]), float(s[i])) for i in range(n)]
    for i, (mi, li, si) in enumerate(as32):
        m_new = max(mi, si)
        if m_new == -INF:  # no key and no sink: nothing to weigh
            want_l, want_alpha = 0.0, 0.0
        elif si == INF:  # the sink takes all the weight
            want_l, want_alpha = 1.0, 0.0
        else:
            want_alpha = 2.0 ** (mi - m_new) if mi > -INF else 0.0
            want_l = li * want_alpha + 2.0 ** (si - m_new)
        assert got_m[i] == m_new, (i, cases[i], float(got_m[i]))
        assert abs(float(got_alpha[i]) - want_alpha) <= 1e-6 * want_alpha, (i, cases[i], float(got_alpha[i]))
        assert abs(float(got_l[i]) - want_l) <= 1e-6 * max(want_l, 1.0), (i, cases[i], float(got_l[i]))


# ---- decode: empty windows, lengths 0 and 1, sinks at the extremes ----


def _decode_paths(case: dec.Case) -> list:
    """The same batch through the direct output, the merge kernel and the in-place merge, CSR and paged."""
    return [
        replace(case, num_splits=1),
        replace(case, num_splits=2, merge="kernel", form="paged", page=4),
        replace(case, num_splits=3, merge="fused"),
    ]


SINK_VALUES = [
    pytest.param(-INF, id="sink-ninf"),
    pytest.param(0.5, id="sink-finite"),
    pytest.param(1e4, id="sink-huge"),
    pytest.param(None, id="no-sink"),
]


@pytest.mark.parametrize("sink", SINK_VALUES)
def test_decode_empty_and_short_windows(sink, device):
    """Lengths 0 and 1 beside a longer one: an empty window gives zeros whatever the sink (a -inf
    sink is no sink, a finite one has no value), the others equal the reference, no NaN."""
    base = dec.Case((0, 1, 21, 0), 6, 4, 2, 16, dtype=f16, sinks=sink is not None, block_n=16)
    for case in _decode_paths(base):
        b = dec.build(case, device)
        if sink is not None:
            b.sinks = torch.full_like(b.sinks, sink)
        got = dec.run(case, b)
        _assert_no_nan(got, case.id)
        assert bool((got[0] == 0).all()) and bool((got[3] == 0).all()), f"{case.id}: empty window not zero"
        assert_close(got, dec.expected(case, b), name=f"{case.id} sink={sink}")


def test_decode_sinks_per_head_mixed(device):
    """Per-head sinks mixing -inf, 0, a large finite value and ordinary ones, over empty and full windows."""
    case = dec.Case((0, 23, 1), 9, 8, 2, 16, dtype=f16, sinks=True, num_splits=2, block_n=16)
    for c in (case, replace(case, num_splits=1)):
        b = dec.build(c, device)
        b.sinks = torch.tensor([-INF, 0.0, 60.0, -2.0, -INF, 1.5, 9.0, -INF], device=device)
        got = dec.run(c, b)
        _assert_no_nan(got, c.id)
        assert bool((got[0] == 0).all())
        assert_close(got, dec.expected(c, b), name=c.id)


def _scaled_decode(case: dec.Case, device, q_mult: float, k_mult: float, v_mult: float = 1.0) -> dec.Built:
    b = dec.build(case, device)
    b.q = (b.q.float() * q_mult).to(case.dtype)
    b.k = (b.k.float() * k_mult).to(case.dtype)
    b.v = (b.v.float() * v_mult).to(case.dtype)
    return b


# fp16: entries ~100 (q . k * scale ~ 1e4, scores far past fp16's exp range); bf16: entries ~1e17
# (q . k ~ 1e35, near float32's limit of 3.4e38, which the dot accumulates in).
LARGE = [pytest.param(f16, 100.0, 1000.0, id="f16-q100-v1000"), pytest.param(bf16, 1e17, 1e30, id="bf16-q1e17-v1e30")]


@pytest.mark.parametrize("dtype, mult, v_mult", LARGE)
@pytest.mark.parametrize("cap", [0.0, 20.0], ids=["nocap", "cap20"])
def test_decode_large_logits(dtype, mult, v_mult, cap, device):
    case = dec.Case((1, 30, 17), 12, 4, 2, 16, dtype=dtype, softcap=cap, sinks=True, block_n=16)
    for c in (replace(case, num_splits=1), replace(case, num_splits=2)):
        b = _scaled_decode(c, device, mult, mult, v_mult)
        got = dec.run(c, b)
        _assert_no_nan(got, c.id)
        # averages of values of magnitude v_mult, signs may cancel: the dtype's atol at that scale
        assert_close(got, dec.expected(c, b), atol=DEFAULT_TOLERANCES[dtype][0] * v_mult, name=c.id)


# ---- extend: all-masked rows, empty requests, lengths 0 and 1, sinks, large logits ----


def _extend_cases() -> list:
    E = ext._mix
    cases = [
        # W = 0 under a mask that hides some rows from themselves: those rows see nothing at all
        # (no prefix key is within W = 0 of them), with and without sinks, direct and split
        (ext.Case(**E((20, 6), (7, 7), (12, 4), (9, 0)), W=0, mode="mask_empty_rows"), 1),
        (ext.Case(**E((20, 6), (7, 7), (12, 4), (9, 0)), W=0, mode="mask_empty_rows", sinks=True), 2),
        # W = 0 chunked prefill: every row sees itself only
        (ext.Case(**E((20, 12), (9, 5), (5, 1)), W=0, sinks=True), 1),
        (ext.Case(**E((20, 12), (9, 5), (5, 1)), W=0, paged=True, ps=4), 2),
        # lengths 0 and 1: no prefix and one new token, a one-token prefix, empty requests
        (ext.Case(**E((1, 1), (2, 1), (2, 0), (0, 0), (1, 0), (3, 2)), W=5, sinks=True), 1),
        (ext.Case(**E((1, 1), (2, 1), (2, 0), (0, 0), (1, 0), (3, 2)), W=0, paged=True, ps=4), 2),
    ]
    return [pytest.param(c, n, id=f"{c.id}-S{n}") for c, n in cases]


@pytest.mark.parametrize("case, num_splits", _extend_cases())
def test_extend_edges_match_reference(case, num_splits, device):
    built = ext.build(case, device, seed=5)
    got = ext.run_kernel(case, built, num_splits=num_splits)
    _assert_no_nan(got, case.id)
    assert_close(got, built["expected"], name=case.id)


def _extend_with_sinks(case: ext.Case, built: dict, sinks: torch.Tensor, device, num_splits: int) -> torch.Tensor:
    built["kw"]["sinks"] = sinks
    _rebuild_expected(case, built)
    return ext.run_kernel(case, built, num_splits=num_splits)


def _rebuild_expected(case: ext.Case, built: dict) -> None:
    """``built["expected"]`` again from the reference, after a test changed ``built``'s inputs or keywords."""
    args = built["args"]
    state = built["state"]
    indptr, indices, _ = ref.extend_window_indices(state.req_to_token, state.req_pool_indices(), args["prefix_lens"], case.W, state.mapping)
    dev = args["q"].device
    built["expected"] = ref.extend_attention(
        args["q"],
        args["k"],
        args["v"],
        args["k_buffer"],
        args["v_buffer"],
        args["qo_indptr"],
        indptr.to(dev),
        indices.to(dev),
        args["prefix_lens"],
        **built["kw"],
    )


@pytest.mark.parametrize("num_splits", [1, 2], ids=["direct", "split2"])
def test_extend_extreme_sinks(num_splits, device):
    """Sinks of -inf (no sink), 0, a huge finite value (all weight on the sink) and ordinary ones,
    per head, over rows with and without visible keys."""
    case = ext.Case(**ext._mix((12, 5), (6, 6)), W=3, HQ=8, mode="mask_empty_rows")
    built = ext.build(case, device, seed=7)
    sinks = torch.tensor([-INF, 0.0, 1e4, -2.0, -INF, 80.0, 1.0, -INF], device=device)
    got = _extend_with_sinks(case, built, sinks, device, num_splits)
    _assert_no_nan(got, case.id)
    assert_close(got, built["expected"], name=f"{case.id} S{num_splits}")


LARGE_EXTEND = LARGE + [pytest.param(bf16, 30.0, 1e30, id="bf16-q30-v1e30")]


@pytest.mark.parametrize("dtype, mult, v_mult", LARGE_EXTEND)
@pytest.mark.parametrize("cap, num_splits", [(0.0, 1), (20.0, 2)], ids=["nocap-direct", "cap20-split2"])
def test_extend_large_logits(dtype, mult, v_mult, cap, num_splits, device):
    """Outputs are averages of values of magnitude ``v_mult`` whose signs may cancel, so the absolute
    tolerance is the dtype's, scaled by that magnitude.

    Compiled without softcap, the exponent is one FFMA of the unrounded score against the rounded row
    max (in log2 units), so the row's own maximum gets an exponent of up to half an ulp of the score
    instead of 0: beyond |score| ~ 3e5 (log2 units) that moves weights by more than bf16's tolerance.
    On the H200 the q1e17 case (scores ~1e34) gave NaN rows until the exponent was clamped at 0; it
    must stay finite, and is compared with the reference where no FFMA rounds (the interpreter, or
    softcap, which bounds the scores). q30 (scores ~1e3) must match everywhere."""
    case = ext.Case(**ext._mix((14, 5), (6, 6), (9, 1)), W=7, dtype=dtype, softcap=cap, sinks=True)
    built = ext.build(case, device, seed=9)
    args = built["args"]
    for name, m in (("q", mult), ("k", mult), ("v", v_mult), ("k_buffer", mult), ("v_buffer", v_mult)):
        args[name] = (args[name].float() * m).to(dtype)
    _rebuild_expected(case, built)
    got = ext.run_kernel(case, built, num_splits=num_splits)
    _assert_no_nan(got, case.id)
    if device == "cuda" and cap == 0 and mult > 1e3:
        return
    atol = DEFAULT_TOLERANCES[dtype][0] * v_mult
    assert_close(got, built["expected"], atol=atol, name=f"{case.id} S{num_splits}")


# ---- fp8 stores beyond the e4m3 range ----

E4M3_MAX = 448.0


def test_store_kv_fp8_saturates(device):
    """Values beyond +-448 (after the scale), +-inf included, are stored as +-448 (bytes 0x7E/0xFE),
    bit for bit as the reference's store; only a NaN input gives a NaN byte."""
    values = torch.tensor(
        [447.0, 448.0, 449.0, 463.9, 464.0, 465.0, 500.0, 1e6, 3e38, INF, -449.0, -464.0, -1e6, -INF, 0.0, -0.0, 1e-12, 240.0, 7.99, NAN]
    )
    n = values.numel()
    kb = torch.zeros(n + 4, 1, 1, dtype=torch.uint8, device=device)
    vb = torch.zeros(n + 4, 1, 1, dtype=torch.uint8, device=device)
    loc = torch.arange(1, n + 1, device=device)
    x = values.reshape(n, 1, 1).to(device)
    store_kv(kb, vb, loc, x, x * 3, v_scale=0.5)  # V: x * 3 / 0.5, past the range sooner
    exp_k = torch.zeros(n + 4, 1, 1, dtype=torch.float8_e4m3fn)
    exp_v = exp_k.clone()
    ref.store_kv(exp_k, exp_v, loc.cpu(), x.cpu(), x.cpu() * 3, v_scale=0.5)
    for got, exp, name in ((kb, exp_k, "k_buffer"), (vb, exp_v, "v_buffer")):
        bits = got.cpu().reshape(-1)[1 : n + 1]
        assert torch.equal(bits, exp.view(torch.uint8).reshape(-1)[1 : n + 1]), name
        finite_or_inf = ~torch.isnan(values)
        nan_bytes = (bits & 0x7F) == 0x7F
        assert not bool(nan_bytes[finite_or_inf].any()), f"{name}: a non-NaN input became a NaN byte"
        decoded = bits.view(torch.float8_e4m3fn).float()
        assert bool((decoded[finite_or_inf].abs() <= E4M3_MAX).all())
    big = values.abs() > 464  # past the rounding boundary of 448
    assert bool((kb.cpu().reshape(-1)[1 : n + 1][big & (values > 0)] == 0x7E).all())
    assert bool((kb.cpu().reshape(-1)[1 : n + 1][big & (values < 0)] == 0xFE).all())


def test_store_kv_fp8nuz_saturates(device):
    """e4m3fnuz (MI300's format: bias 8, largest 240, NaN 0x80, no -0): values beyond +-240, +-inf
    included, are stored as +-240 (bytes 0x7F/0xFF), where torch's own cast gives NaN; a value that
    rounds to zero, -0.0 included, gives 0x00; only a NaN input gives the NaN byte. Bit for bit as the
    reference's store."""
    values = torch.tensor(
        [
            225.0,
            240.0,
            247.9,
            248.0,
            250.0,
            256.0,
            1e6,
            INF,
            -248.0,
            -INF,
            0.0,
            -0.0,
            -1e-12,
            2.0**-10,
            -(2.0**-10),
            2.0**-11,
            2.0**-7,
            7.99,
            NAN,
        ]
    )
    n = values.numel()
    kb = torch.zeros(n + 4, 1, 1, dtype=torch.float8_e4m3fnuz, device=device)
    vb = kb.clone()
    loc = torch.arange(1, n + 1, device=device)
    x = values.reshape(n, 1, 1).to(device)
    store_kv(kb, vb, loc, x, x * 3, v_scale=0.5)
    exp_k = torch.zeros(n + 4, 1, 1, dtype=torch.float8_e4m3fnuz)
    exp_v = exp_k.clone()
    ref.store_kv(exp_k, exp_v, loc.cpu(), x.cpu(), x.cpu() * 3, v_scale=0.5)
    for got, exp, name in ((kb, exp_k, "k_buffer"), (vb, exp_v, "v_buffer")):
        bits = got.cpu().view(torch.uint8).reshape(-1)[1 : n + 1]
        assert torch.equal(bits, exp.view(torch.uint8).reshape(-1)[1 : n + 1]), name
        assert not bool((bits[~torch.isnan(values)] == 0x80).any()), f"{name}: a non-NaN input became the NaN byte"
    k_bits = kb.cpu().view(torch.uint8).reshape(-1)[1 : n + 1]
    assert k_bits.tolist()[:8] == [0x7F - 1, 0x7F, 0x7F, 0x7F, 0x7F, 0x7F, 0x7F, 0x7F]
    assert k_bits.tolist()[8:13] == [0xFF, 0xFF, 0x00, 0x00, 0x00] and k_bits.tolist()[-1] == 0x80


@triton.jit
def _decode_all_bytes(x, out, KV_FP8: tl.constexpr):
    o = tl.arange(0, 256)
    tl.store(out + o, fp8_rescale(fp8_decode(tl.load(x + o), KV_FP8).to(tl.float32), KV_FP8))


@pytest.mark.parametrize("fmt", ["e4m3fn", "e4m3fnuz"])
def test_fp8_decode_every_byte(fmt, device):
    """The in-kernel byte decoder (sm_80/86 and e4m3fnuz reads) against torch's own decoding of all
    256 bytes, NaN bytes included, with its power of two put back: exact."""
    dtype, mode = {"e4m3fn": (torch.float8_e4m3fn, KV_E4M3FN_BITS), "e4m3fnuz": (torch.float8_e4m3fnuz, KV_E4M3FNUZ_BITS)}[fmt]
    x = torch.arange(256, dtype=torch.uint8)
    out = torch.full((256,), NAN, device=device)
    _decode_all_bytes[(1,)](x.to(device), out, KV_FP8=mode)
    assert_close(out.cpu(), x.view(dtype).float(), atol=0, rtol=0, name=fmt)


def test_attention_over_saturated_fp8_pool(device):
    """A pool written by store_kv with values far beyond e4m3's range reads back as +-448 * scale:
    decode and extend give no NaN and equal the reference over the same bytes."""
    case = dec.Case((9, 30), 12, 4, 2, 16, dtype=f16, fp8=True, num_splits=2, block_n=16)
    b = dec.build(case, device)
    slots = b.kv_indices.long()
    g = torch.Generator().manual_seed(3)
    big = (torch.randn(slots.numel(), case.h, case.d, generator=g) * 2000).to(device)
    store_kv(b.k, b.v, slots, big, -big, k_scale=b.k_scale, v_scale=b.v_scale)
    stored = torch.cat([b.k[slots].float().reshape(-1), b.v[slots].float().reshape(-1)])
    assert not bool(torch.isnan(stored).any()) and float(stored.abs().max()) == E4M3_MAX
    got = dec.run(case, b)
    _assert_no_nan(got, case.id)
    assert_close(got, dec.expected(case, b), name=case.id)


def test_store_kv_docstring_states_the_saturation_rule():
    """Issue 25 (8): store_kv's documentation states the library's own fp8 rule (saturate to ±448 /
    ±240 on every device) without comparing it to a torch cast, which saturates on the CPU only (its
    CUDA cast gives NaN from 464 up)."""
    from triton_swa.ops import kv_store

    for doc in (
        store_kv.__doc__,
        kv_store._fp8_e4m3_bits.fn.__doc__ if hasattr(kv_store._fp8_e4m3_bits, "fn") else kv_store._fp8_e4m3_bits.__doc__,
    ):
        assert "torch's cast" not in doc and "torch's e4m3fn cast" not in doc, doc
    doc = " ".join(store_kv.__doc__.split())
    assert "saturate" in doc and "``±448`` (e4m3fn" in doc and "``±240`` (e4m3fnuz" in doc
    assert "on every device" in doc
