"""Bad-input catalogue of the backend: constructor, init_forward_metadata, forward, CUDA-graph state.

Every case gets a TypeError (wrong type or dtype, a missing attribute) or a ValueError (wrong shape,
length, value, window, head count, pool) whose message names the argument, raised before anything is
launched or written: the pools (K/V buffers, mapping, req_to_token, the allocators' free lists) are
compared bit for bit with a snapshot taken before the call. Defect 9 of issue 11 (a failed forward
had already saved the step's K/V) and defect 10 (a full layer in the SWA sub-pool read SWA buffers at
full-slot indices) are among the cases.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from triton_swa import MHATokenToKVPool, SWAKVPool, TokenToKVPoolAllocator
from triton_swa.backend import TritonSWAAttnBackend
from triton_swa.engine import AttentionLayer, ForwardBatch, ForwardMode, ModelRunner, SpecInfo, SpeculativeAlgorithm
from triton_swa.testing import make_pool_state

# CPU tier: host-side checks on CPU-built pools; they do not depend on the device.
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tier: builds its pools on the CPU")

HQ, W, N = 4, 3, 2
DECODE, VERIFY, EXTEND = ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.EXTEND


def state_for(mode, device="cpu"):
    new = {DECODE: 1, VERIFY: N, EXTEND: [3, 1]}[mode]
    return make_pool_state(seq_lens=[9, 6], window_left=W, page_size=1, device=device, new_tokens=new, num_swa_layers=2, num_full_layers=1)


def runner_for(state, **over):
    kw = dict(sliding_window_size=W, device="cpu")
    kw.update(over)
    return ModelRunner(state.kv_pool, state.allocator, state.req_to_token_pool, **kw)


def batch_for(state, mode, **over):
    rows, prefix, loc = state.req_pool_indices(), state.prefix_lens(), state.new_slots()
    bs = len(state.requests)
    if mode == DECODE:
        seq = state.seq_lens()
        kw = dict(seq_lens_cpu=seq.cpu())
        args = [mode, bs, rows, seq, loc]
    elif mode == VERIFY:
        kw = dict(seq_lens_cpu=prefix.cpu(), spec_info=SpecInfo(N))
        args = [mode, bs, rows, prefix, loc]
    else:
        seq = state.seq_lens()
        ext = seq - prefix
        kw = dict(
            seq_lens_cpu=seq.cpu(),
            extend_prefix_lens=prefix,
            extend_seq_lens=ext,
            extend_prefix_lens_cpu=prefix.tolist(),
            extend_seq_lens_cpu=ext.tolist(),
        )
        args = [mode, bs, rows, seq, loc]
    batch = ForwardBatch(*args, **kw)
    for name, value in over.items():
        setattr(batch, name, value)
    return batch


def snapshot(state):
    """Bytes of everything a step may change: K/V buffers, mapping, req_to_token, free lists."""
    pool = state.kv_pool
    out = {}
    for side, sub in (("swa", pool.swa_kv_pool), ("full", pool.full_kv_pool)):
        for i, (k, v) in enumerate(zip(sub.k_buffer, sub.v_buffer)):
            out[f"{side}.k{i}"], out[f"{side}.v{i}"] = k.clone(), v.clone()
    out["mapping"] = state.mapping.clone()
    out["req_to_token"] = state.req_to_token.clone()
    for side in ("full_attn_allocator", "swa_attn_allocator"):
        for name, value in vars(getattr(state.allocator, side)).items():
            if isinstance(value, torch.Tensor):
                out[f"{side}.{name}"] = value.clone()
            elif isinstance(value, (list, int)):
                out[f"{side}.{name}"] = list(value) if isinstance(value, list) else value
    return out


def assert_unchanged(state, before):
    after = snapshot(state)
    assert after.keys() == before.keys()
    for name, old in before.items():
        new = after[name]
        if isinstance(old, torch.Tensor):
            same = (
                old.shape == new.shape
                and old.dtype == new.dtype
                and torch.equal(old.contiguous().view(torch.uint8), new.contiguous().view(torch.uint8))
            )
        else:
            same = old == new
        assert same, f"{name} changed although the call raised"


# ----- constructor ---------------------------------------------------------------------------------


def _runner_without(name):
    def make(state):
        r = runner_for(state)
        fields = {f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name != name}
        return SimpleNamespace(**fields)

    return make


def _runner(**over):
    return lambda state: runner_for(state, **over)


def _runner_rtp(req_to_token):
    def make(state):
        return ModelRunner(state.kv_pool, state.allocator, SimpleNamespace(**req_to_token(state)), sliding_window_size=W)

    return make


CONSTRUCTOR = [
    *[
        pytest.param(_runner_without(n), TypeError, n, id=f"runner-missing-{n}")
        for n in ("token_to_kv_pool", "token_to_kv_pool_allocator", "req_to_token_pool", "is_draft_worker", "spec_algorithm", "device")
    ],
    pytest.param(_runner_rtp(lambda s: {}), TypeError, "req_to_token", id="req_to_token_pool-without-table"),
    pytest.param(_runner_rtp(lambda s: {"req_to_token": s.req_to_token.long()}), TypeError, "req_to_token", id="req_to_token-int64"),
    pytest.param(_runner_rtp(lambda s: {"req_to_token": s.req_to_token[0]}), ValueError, "req_to_token", id="req_to_token-1d"),
    pytest.param(_runner_rtp(lambda s: {"req_to_token": s.req_to_token.tolist()}), TypeError, "req_to_token", id="req_to_token-list"),
    pytest.param(_runner(sliding_window_size=-2), ValueError, "sliding_window_size", id="window-below-minus-1"),
    pytest.param(_runner(sliding_window_size=3.0), TypeError, "sliding_window_size", id="window-float"),
    pytest.param(_runner(sliding_window_size=True), TypeError, "sliding_window_size", id="window-bool"),
    pytest.param(_runner(sliding_window_size=-1), ValueError, "sliding_window_size", id="swa-pool-but-no-window"),
    pytest.param(_runner(is_draft_worker="no"), TypeError, "is_draft_worker", id="draft-flag-str"),
    pytest.param(_runner(spec_algorithm="EAGLE"), TypeError, "spec_algorithm", id="spec-algorithm-str"),
    pytest.param(_runner(device="no-such-device"), ValueError, "device", id="device-bad-name"),
    pytest.param(_runner(device="meta"), ValueError, "req_to_token", id="req_to_token-on-other-device"),
]


@pytest.mark.reference
@pytest.mark.parametrize("make, exc, match", CONSTRUCTOR)
def test_constructor_rejects(make, exc, match):
    state = state_for(DECODE)
    before = snapshot(state)
    with pytest.raises(exc, match=match):
        TritonSWAAttnBackend(make(state))
    assert_unchanged(state, before)


@pytest.mark.reference
def test_constructor_accepts_a_full_only_runner_without_a_window():
    pool = MHATokenToKVPool(16, 1, torch.float32, 1, 8, 1)
    state = state_for(DECODE)
    runner = ModelRunner(pool, TokenToKVPoolAllocator(16, torch.float32, "cpu", pool), state.req_to_token_pool)
    assert TritonSWAAttnBackend(runner).sliding_window_size == -1


# ----- init_forward_metadata -----------------------------------------------------------------------


def _set(**over):
    return lambda s, b: [setattr(b, k, v(s, b) if callable(v) else v) for k, v in over.items()]


def _spec(**over):
    return lambda s, b: setattr(b, "spec_info", SpecInfo(**{"draft_token_num": N, **over}))


def _max_ctx(s):
    return s.req_to_token.shape[1]


BATCH = [
    # every mode
    *[
        pytest.param(mode, mutate, exc, match, id=f"{mode.name.lower()}-{name}")
        for mode in (DECODE, VERIFY, EXTEND)
        for name, mutate, exc, match in [
            ("req_pool_indices-short", _set(req_pool_indices=lambda s, b: b.req_pool_indices[:1]), ValueError, "req_pool_indices"),
            ("req_pool_indices-float", _set(req_pool_indices=lambda s, b: b.req_pool_indices.float()), TypeError, "req_pool_indices"),
            ("req_pool_indices-2d", _set(req_pool_indices=lambda s, b: b.req_pool_indices[None]), ValueError, "req_pool_indices"),
            ("seq_lens-long", _set(seq_lens=lambda s, b: torch.cat([b.seq_lens, b.seq_lens[:1]])), ValueError, "seq_lens"),
            ("seq_lens-float", _set(seq_lens=lambda s, b: b.seq_lens.float()), TypeError, "seq_lens"),
            ("seq_lens-list", _set(seq_lens=lambda s, b: b.seq_lens.tolist()), TypeError, "seq_lens"),
            ("seq_lens_cpu-short", _set(seq_lens_cpu=lambda s, b: b.seq_lens_cpu[:1]), ValueError, "seq_lens_cpu"),
            ("seq_lens_cpu-past-req_to_token", _set(seq_lens_cpu=lambda s, b: b.seq_lens_cpu + _max_ctx(s)), ValueError, "seq_lens_cpu"),
            ("seq_lens_cpu-negative", _set(seq_lens_cpu=lambda s, b: b.seq_lens_cpu - 100), ValueError, "seq_lens_cpu"),
            ("out_cache_loc-short", _set(out_cache_loc=lambda s, b: b.out_cache_loc[:-1]), ValueError, "out_cache_loc"),
            ("out_cache_loc-float", _set(out_cache_loc=lambda s, b: b.out_cache_loc.float()), TypeError, "out_cache_loc"),
            ("batch_size-mismatch", _set(batch_size=3), ValueError, "req_pool_indices"),
            ("batch_size-float", _set(batch_size=2.0), TypeError, "batch_size"),
            ("batch_size-negative", _set(batch_size=-1), ValueError, "batch_size"),
            ("forward_mode-str", _set(forward_mode="DECODE"), TypeError, "forward_mode"),
        ]
    ],
    # TARGET_VERIFY
    pytest.param(VERIFY, _set(spec_info=None), ValueError, "spec_info", id="verify-missing-spec_info"),
    pytest.param(VERIFY, _spec(draft_token_num=0), ValueError, "draft_token_num", id="verify-zero-drafts"),
    pytest.param(VERIFY, _spec(draft_token_num=2.0), TypeError, "draft_token_num", id="verify-float-drafts"),
    pytest.param(VERIFY, _spec(draft_token_num=3), ValueError, "out_cache_loc", id="verify-drafts-vs-out_cache_loc"),
    pytest.param(
        VERIFY, _spec(custom_mask=torch.ones(2 * N * N - 1, dtype=torch.bool)), ValueError, "custom_mask", id="verify-mask-length"
    ),
    pytest.param(VERIFY, _spec(custom_mask=torch.ones(2 * N * N)), TypeError, "custom_mask", id="verify-mask-float"),
    pytest.param(VERIFY, _spec(custom_mask=torch.ones(2, N * N, dtype=torch.bool)), ValueError, "custom_mask", id="verify-mask-2d"),
    pytest.param(VERIFY, _spec(positions=torch.zeros(2 * N + 1, dtype=torch.int64)), ValueError, "positions", id="verify-positions-length"),
    pytest.param(VERIFY, _spec(positions=torch.zeros(2 * N)), TypeError, "positions", id="verify-positions-float"),
    pytest.param(VERIFY, _spec(causal=1), TypeError, "causal", id="verify-causal-int"),
    pytest.param(
        VERIFY,
        _set(seq_lens_cpu=lambda s, b: b.seq_lens_cpu * 0 + _max_ctx(s) - 1),
        ValueError,
        "draft_token_num",
        id="verify-drafts-past-req_to_token",
    ),
    # EXTEND
    pytest.param(EXTEND, _set(extend_seq_lens=None), ValueError, "extend_seq_lens", id="extend-missing-seq-lens"),
    pytest.param(EXTEND, _set(extend_prefix_lens=None), ValueError, "extend_prefix_lens", id="extend-missing-prefix-lens"),
    pytest.param(
        EXTEND, _set(extend_seq_lens=lambda s, b: b.extend_seq_lens[:1]), ValueError, "extend_seq_lens", id="extend-seq-lens-short"
    ),
    pytest.param(
        EXTEND,
        _set(extend_prefix_lens=lambda s, b: b.extend_prefix_lens.float()),
        TypeError,
        "extend_prefix_lens",
        id="extend-prefix-lens-float",
    ),
    pytest.param(EXTEND, _set(extend_seq_lens_cpu=[3]), ValueError, "extend_seq_lens_cpu", id="extend-seq-lens-cpu-short"),
    pytest.param(EXTEND, _set(extend_prefix_lens_cpu=[-1, 5]), ValueError, "extend_prefix_lens_cpu", id="extend-prefix-lens-cpu-negative"),
    pytest.param(EXTEND, _set(extend_seq_lens_cpu=[3.0, 1.0]), TypeError, "extend_seq_lens_cpu", id="extend-seq-lens-cpu-float"),
    # issue 25 (4, 5): lengths that do not add up name the lengths, not out_cache_loc
    pytest.param(
        EXTEND,
        _set(extend_seq_lens_cpu=[4, 1]),
        ValueError,
        r"request 0: forward_batch.extend_prefix_lens_cpu\[0\] \+ extend_seq_lens_cpu\[0\] = 6 \+ 4 = 10, but seq_lens_cpu\[0\] = 9",
        id="extend-tokens-vs-out_cache_loc",
    ),
    pytest.param(
        EXTEND,
        _set(seq_lens_cpu=lambda s, b: b.seq_lens_cpu + torch.tensor([0, 1])),
        ValueError,
        r"request 1: forward_batch.extend_prefix_lens_cpu\[1\] \+ extend_seq_lens_cpu\[1\] = 5 \+ 1 = 6, but seq_lens_cpu\[1\] = 7",
        id="extend-prefix-plus-new-vs-seq_lens_cpu",
    ),
    pytest.param(
        EXTEND,
        _set(extend_prefix_lens_cpu=[6, 4]),
        ValueError,
        r"request 1: forward_batch.extend_prefix_lens_cpu\[1\] \+ extend_seq_lens_cpu\[1\] = 4 \+ 1 = 5, but seq_lens_cpu\[1\] = 6",
        id="extend-prefix-lens-cpu-short-of-seq_lens_cpu",
    ),
    pytest.param(
        EXTEND,
        _set(seq_lens_cpu=None, extend_seq_lens_cpu=[4, 1]),
        ValueError,
        r"out_cache_loc must have 5 entries \(one per new token: the sum of extend_seq_lens_cpu\), got 4",
        id="extend-tokens-vs-out_cache_loc-without-seq_lens_cpu",
    ),
    pytest.param(
        DECODE,
        _set(out_cache_loc=lambda s, b: b.out_cache_loc[:1]),
        ValueError,
        r"out_cache_loc must have 2 entries \(one per request in DECODE: batch_size\), got 1",
        id="decode-out_cache_loc-names-the-rule",
    ),
    pytest.param(
        VERIFY,
        _set(out_cache_loc=lambda s, b: b.out_cache_loc[:1]),
        ValueError,
        r"out_cache_loc must have 4 entries \(one per draft token: batch_size 2 x draft_token_num 2\), got 1",
        id="verify-out_cache_loc-names-the-rule",
    ),
    # issue 25 (3): an empty batch's tensors are int tensors of length 0; a float one is still a
    # dtype mistake (it would fail on the first non-empty batch anyway)
    pytest.param(
        EXTEND,
        _set(
            batch_size=0,
            req_pool_indices=torch.tensor([]),
            seq_lens=torch.zeros(0, dtype=torch.int64),
            seq_lens_cpu=torch.zeros(0, dtype=torch.int64),
            extend_prefix_lens=torch.zeros(0, dtype=torch.int64),
            extend_seq_lens=torch.zeros(0, dtype=torch.int64),
            extend_prefix_lens_cpu=[],
            extend_seq_lens_cpu=[],
            out_cache_loc=torch.zeros(0, dtype=torch.int64),
        ),
        TypeError,
        "req_pool_indices must have dtype",
        id="extend-empty-batch-float-req_pool_indices",
    ),
    pytest.param(EXTEND, _set(extend_prefix_lens_cpu=lambda s, b: [_max_ctx(s), 0]), ValueError, "exceeds", id="extend-past-req_to_token"),
    pytest.param(EXTEND, _spec(causal="yes"), TypeError, "causal", id="extend-causal-str"),
]


@pytest.mark.interpreter
@pytest.mark.parametrize("mode, mutate, exc, match", BATCH)
def test_init_forward_metadata_rejects(mode, mutate, exc, match):
    state = state_for(mode)
    backend = TritonSWAAttnBackend(runner_for(state))
    batch = batch_for(state, mode)
    backend.init_forward_metadata(batch)  # the unmodified batch is fine
    good = backend.forward_metadata
    mutate(state, batch)
    before = snapshot(state)
    with pytest.raises(exc, match=match):
        backend.init_forward_metadata(batch)
    assert backend.forward_metadata is good, "a rejected batch replaced the step's metadata"
    assert_unchanged(state, before)


@pytest.mark.interpreter
def test_missing_mapping_raises_instead_of_reading_nothing():
    state = state_for(DECODE)
    backend = TritonSWAAttnBackend(runner_for(state))
    state.kv_pool.full_to_swa_index_mapping = None
    with pytest.raises(ValueError, match="full_to_swa_index_mapping"):
        backend.init_forward_metadata(batch_for(state, DECODE))


class _NoLaunch:
    """Trap every kernel launch (interpreter, JIT and the ops' direct launcher)."""

    def __init__(self, monkeypatch):
        import triton.runtime.interpreter as interpreter
        import triton.runtime.jit as jit

        from triton_swa.runtime.launch import Launcher

        def trap(*args, **kwargs):
            raise AssertionError("a kernel was launched before the bad batch was rejected")

        monkeypatch.setattr(interpreter.InterpretedFunction, "run", trap)
        monkeypatch.setattr(jit.JITFunction, "run", trap)
        monkeypatch.setattr(Launcher, "__call__", trap)


def _device(**over):
    """Change device tensors only (their host copies keep the good values)."""
    return lambda s, b: [setattr(b, k, v(s, b)) for k, v in over.items()]


def _at(t, i, value):
    t = t.clone()
    t[i] = value
    return t


# Device contents only the debug mode reads (issue 25, items 2 and 5): each is named before any launch
# or read, with debug=True and with TRITON_SWA_DEBUG=1 alike.
DEBUG_BATCH = [
    *[
        pytest.param(
            mode, _device(req_pool_indices=lambda s, b, r=r: _at(b.req_pool_indices, 1, r(s))), msg, id=f"{mode.name.lower()}-{name}"
        )
        for mode in (DECODE, VERIFY, EXTEND)
        for name, r, msg in [
            ("row-just-past-req_to_token", lambda s: s.req_to_token.shape[0], r"req_pool_indices\[1\] = \d+ is not a row of req_to_token"),
            (
                "row-far-past-req_to_token",
                lambda s: s.req_to_token.shape[0] + 35,
                r"req_pool_indices\[1\] = \d+ is not a row of req_to_token",
            ),
            ("row-negative", lambda s: -1, r"req_pool_indices\[1\] = -1 is not a row of req_to_token"),
        ]
    ],
    *[
        pytest.param(
            mode,
            _set(seq_lens_cpu=lambda s, b: b.seq_lens_cpu - torch.tensor([1, 0])),
            r"request 0 \(batch index\): seq_lens_cpu\[0\] = \d+ disagrees with seq_lens\[0\]",
            id=f"{mode.name.lower()}-seq_lens_cpu-short",
        )
        for mode in (DECODE, VERIFY)
    ],
    pytest.param(
        DECODE,
        _device(seq_lens=lambda s, b: _at(b.seq_lens, 0, 10_000)),
        r"seq_lens_cpu\[0\] = 9 disagrees with seq_lens\[0\] = 10000",
        id="decode-device-seq_lens-past-req_to_token",
    ),
    pytest.param(
        EXTEND,
        _set(extend_prefix_lens_cpu=[5, 5], seq_lens_cpu=None),  # without seq_lens_cpu the host sum rule cannot see it
        r"extend_prefix_lens_cpu\[0\] = 5 disagrees with extend_prefix_lens\[0\] = 6",
        id="extend-prefix-lens-cpu-short",
    ),
    pytest.param(
        EXTEND,
        _device(extend_prefix_lens=lambda s, b: _at(b.extend_prefix_lens, 0, 5)),
        r"extend_prefix_lens_cpu\[0\] = 6 disagrees with extend_prefix_lens\[0\] = 5",
        id="extend-device-prefix-lens",
    ),
    pytest.param(
        EXTEND,
        _set(extend_prefix_lens_cpu=None, extend_seq_lens_cpu=None, extend_prefix_lens=lambda s, b: _at(b.extend_prefix_lens, 0, 5)),
        r"extend_prefix_lens\[0\] \+ extend_seq_lens\[0\] = 5 \+ 3 = 8, but seq_lens\[0\] = 9",
        id="extend-device-prefix-plus-new-vs-seq_lens",
    ),
]


@pytest.mark.interpreter
@pytest.mark.parametrize("how", ["debug=True", "TRITON_SWA_DEBUG=1"])
@pytest.mark.parametrize("mode, mutate, match", DEBUG_BATCH)
def test_debug_mode_names_bad_device_contents_before_any_launch(mode, mutate, match, how, monkeypatch):
    from triton_swa.runtime import guard

    state = state_for(mode)
    backend = TritonSWAAttnBackend(runner_for(state))
    batch = batch_for(state, mode)
    backend.init_forward_metadata(batch, debug=True)  # the unmodified batch passes the debug checks
    good = backend.forward_metadata
    mutate(state, batch)
    before = snapshot(state)
    if how == "TRITON_SWA_DEBUG=1":
        monkeypatch.setattr(guard, "_DEBUG_ENV", True)
    kw = {"debug": True} if how == "debug=True" else {}
    _NoLaunch(monkeypatch)
    with pytest.raises(ValueError, match=match):
        backend.init_forward_metadata(batch, **kw)
    assert backend.forward_metadata is good, "a rejected batch replaced the step's metadata"
    assert_unchanged(state, before)


def _empty_batch(mode, how):
    e = torch.zeros(0, dtype=torch.int64)
    if how == "engine-builders":
        if mode == DECODE:
            return ForwardBatch.decode([], [], e, device="cpu")
        if mode == VERIFY:
            return ForwardBatch.verify([], [], SpecInfo(N), e, device="cpu")
        return ForwardBatch.extend([], [], [], e, device="cpu", mode=mode)
    # as an engine pads: int32 device tensors of length 0 and empty host lists
    i = torch.zeros(0, dtype=torch.int32)
    kw = dict(seq_lens_cpu=e.clone())
    if mode == VERIFY:
        kw["spec_info"] = SpecInfo(N, custom_mask=torch.zeros(0, dtype=torch.bool), positions=e.clone())
    elif mode != DECODE:
        kw.update(extend_prefix_lens=i.clone(), extend_seq_lens=i.clone(), extend_prefix_lens_cpu=[], extend_seq_lens_cpu=[])
    return ForwardBatch(mode, 0, i.clone(), i.clone(), i.clone(), **kw)


EMPTY_MODES = [m for m in ForwardMode if m != ForwardMode.PREBUILT]


@pytest.mark.interpreter
@pytest.mark.parametrize("debug", [False, True], ids=["eager", "debug"])
@pytest.mark.parametrize("how", ["engine-builders", "engine-padding"])
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("mode", EMPTY_MODES, ids=lambda m: m.name.lower())
def test_empty_batch_is_a_no_op_in_every_mode(mode, page_size, how, debug):
    """Issue 25 (3): an empty batch (IDLE, DP-attention padding) in any mode: metadata builds, every layer
    returns a `[0, heads * head_dim]` output, nothing is written."""
    state = make_pool_state(seq_lens=[9, 6], window_left=W, page_size=page_size, new_tokens=1, num_swa_layers=2, num_full_layers=1)
    backend = TritonSWAAttnBackend(runner_for(state))
    batch = _empty_batch(mode, how)
    before = snapshot(state)
    backend.init_forward_metadata(batch, debug=debug)
    for layer in layers().values():
        q = torch.zeros(0, HQ * layer.head_dim)
        k = torch.zeros(0, layer.tp_k_head_num * layer.head_dim)
        v = torch.zeros(0, layer.tp_k_head_num * layer.v_head_dim)
        out = backend.forward(q, k, v, layer, batch)
        assert tuple(out.shape) == (0, HQ * layer.v_head_dim)
        assert out.dtype == q.dtype
    assert_unchanged(state, before)


# ----- forward -------------------------------------------------------------------------------------


def layers():
    return {"sliding": AttentionLayer(0, HQ, 2, 16, sliding_window_size=W), "full": AttentionLayer(2, HQ, 1, 32)}


def _q(fn):
    return lambda a: a.update(q=fn(a["q"], a))


def _k(fn):
    return lambda a: a.update(k=fn(a["k"], a))


def _v(fn):
    return lambda a: a.update(v=fn(a["v"], a))


def _layer(**over):
    return lambda a: a.update(layer=dataclasses.replace(a["layer"], **over))


def _loc(fn):
    return lambda a: setattr(a["batch"], "out_cache_loc", fn(a["batch"].out_cache_loc))


FORWARD = [
    ("q-extra-row", _q(lambda q, a: torch.cat([q, q[:1]])), ValueError, "q must have shape"),
    ("q-missing-row", _q(lambda q, a: q[1:]), ValueError, "q must have shape"),
    ("q-head-count", _q(lambda q, a: q.reshape(len(q), 2, -1)), ValueError, "q must have shape"),
    ("q-head-dim", _q(lambda q, a: q[:, :-1]), ValueError, "q must have shape"),
    ("q-4d", _q(lambda q, a: q.reshape(len(q), HQ, -1, 1)), ValueError, "q must have shape"),
    ("q-float16-vs-float32-pool", _q(lambda q, a: q.half()), TypeError, "q has dtype"),
    ("q-float64", _q(lambda q, a: q.double()), TypeError, "q must have dtype"),
    ("q-int", _q(lambda q, a: q.int()), TypeError, "q must have dtype"),
    ("q-list", _q(lambda q, a: q.tolist()), TypeError, "q must be a torch.Tensor"),
    ("q-other-device", _q(lambda q, a: q.to("meta")), ValueError, "q must be on device"),
    ("q-strided-last-dim", _q(lambda q, a: torch.stack([q, q], -1)[..., 0]), ValueError, "q must be contiguous"),
    ("k-extra-row", _k(lambda k, a: torch.cat([k, k[:1]])), ValueError, "k must have shape"),
    ("k-head-count", _k(lambda k, a: k.reshape(len(k), 1, -1)), ValueError, "k must have shape"),
    ("k-dtype", _k(lambda k, a: k.double()), TypeError, "k must have dtype"),
    ("v-head-dim", _v(lambda v, a: v[..., :-1]), ValueError, "v must have shape"),
    ("v-dtype", _v(lambda v, a: v.half()), TypeError, "v must have dtype"),
    ("v-missing", _v(lambda v, a: None), ValueError, "k and v"),
    ("tp_q_head_num-not-multiple", _layer(tp_q_head_num=3), ValueError, "tp_q_head_num"),
    ("tp_q_head_num-zero", _layer(tp_q_head_num=0), ValueError, "tp_q_head_num"),
    ("tp_k_head_num-vs-pool", _layer(tp_k_head_num=4), ValueError, "tp_k_head_num"),
    ("head_dim-vs-pool", _layer(head_dim=8, v_head_dim=8), ValueError, "head_dim"),
    ("v_head_dim-vs-pool", _layer(v_head_dim=8), ValueError, "v_head_dim"),
    ("head_dim-float", _layer(head_dim=16.0), TypeError, "head_dim"),
    ("sinks-shape", _layer(sinks=torch.zeros(HQ + 1)), ValueError, "sinks"),
    ("sinks-2d", _layer(sinks=torch.zeros(1, HQ)), ValueError, "sinks"),
    ("sinks-int", _layer(sinks=torch.zeros(HQ, dtype=torch.int32)), TypeError, "sinks"),
    ("sinks-list", _layer(sinks=[0.0] * HQ), TypeError, "sinks"),
    ("scaling-zero", _layer(scaling=0.0), ValueError, "scaling"),
    ("scaling-negative", _layer(scaling=-0.25), ValueError, "scaling"),
    ("scaling-nan", _layer(scaling=float("nan")), ValueError, "scaling"),
    ("scaling-inf", _layer(scaling=float("inf")), ValueError, "scaling"),
    ("scaling-str", _layer(scaling="0.25"), TypeError, "scaling"),
    ("logit_cap-negative", _layer(logit_cap=-1.0), ValueError, "logit_cap"),
    ("logit_cap-nan", _layer(logit_cap=float("nan")), ValueError, "logit_cap"),
    ("logit_cap-inf", _layer(logit_cap=float("inf")), ValueError, "logit_cap"),
    ("k_scale-zero", _layer(k_scale=0.0), ValueError, "k_scale"),
    ("k_scale-nan", _layer(k_scale=float("nan")), ValueError, "k_scale"),
    ("v_scale-negative", _layer(v_scale=-1.0), ValueError, "v_scale"),
    ("v_scale-two-elements", _layer(v_scale=torch.ones(2)), ValueError, "v_scale"),
    ("k_scale-int-tensor", _layer(k_scale=torch.ones(1, dtype=torch.int32)), TypeError, "k_scale"),
    ("k_scale-str", _layer(k_scale="1"), TypeError, "k_scale"),
    ("out_cache_loc-missing", _loc(lambda loc: None), ValueError, "out_cache_loc"),
    ("out_cache_loc-short", _loc(lambda loc: loc[:-1]), ValueError, "out_cache_loc"),
    ("out_cache_loc-float", _loc(lambda loc: loc.float()), TypeError, "out_cache_loc"),
    ("layer_id-unknown", _layer(layer_id=7), ValueError, "layer_id"),
    ("layer_id-str", _layer(layer_id="0"), TypeError, "layer_id"),
    ("kv_shared_layer_id-unknown", _layer(kv_shared_layer_id=9), ValueError, "layer_id"),
    ("window-differs-from-runner", _layer(sliding_window_size=W + 1), ValueError, "sliding_window_size"),
    ("window-below-minus-1", _layer(sliding_window_size=-2), ValueError, "sliding_window_size"),
    ("layer-missing-attribute", lambda a: a.update(layer=SimpleNamespace(layer_id=0, tp_q_head_num=HQ)), TypeError, "tp_k_head_num"),
]

# defect 10 and its opposite: the layer's declared kind against where its K/V live
POOL_KIND = [
    ("full-layer-in-swa-sub-pool", _layer(sliding_window_size=-1), ValueError, "declared full"),
    (
        "sliding-layer-in-full-sub-pool",
        lambda a: a.update(layer=dataclasses.replace(layers()["full"], sliding_window_size=W, tp_k_head_num=1, head_dim=32)),
        ValueError,
        "not in the SWA sub-pool",
    ),
]


def _forward_cases():
    for mode in (DECODE, VERIFY, EXTEND):
        for kind in ("sliding", "full"):
            for name, mutate, exc, match in FORWARD:
                if kind == "full" and not name.startswith(("q-", "sinks-", "scaling-", "k_scale-", "head_dim")):
                    continue  # the full layer repeats the q and scalar checks only
                if kind == "full" and name == "head_dim-vs-pool":
                    mutate = _layer(head_dim=16, v_head_dim=16)
                yield pytest.param(mode, kind, mutate, exc, match, id=f"{mode.name.lower()}-{kind}-{name}")
        for name, mutate, exc, match in POOL_KIND:
            yield pytest.param(mode, "sliding", mutate, exc, match, id=f"{mode.name.lower()}-{name}")
    yield pytest.param(VERIFY, "sliding", _k(lambda k, a: None), ValueError, "k and v", id="verify-k-and-v-missing")


@pytest.mark.interpreter
@pytest.mark.parametrize("mode, kind, mutate, exc, match", list(_forward_cases()))
def test_forward_rejects_before_writing_kv(mode, kind, mutate, exc, match):
    state = state_for(mode)
    backend = TritonSWAAttnBackend(runner_for(state))
    batch = batch_for(state, mode)
    backend.init_forward_metadata(batch)
    layer = layers()[kind]
    t = int(batch.out_cache_loc.numel())
    g = torch.Generator().manual_seed(0)
    args = dict(
        q=torch.randn(t, HQ * layer.head_dim, generator=g),
        k=torch.randn(t, layer.tp_k_head_num * layer.head_dim, generator=g),
        v=torch.randn(t, layer.tp_k_head_num * layer.v_head_dim, generator=g),
        layer=layer,
        batch=batch,
    )
    mutate(args)
    before = snapshot(state)
    with pytest.raises(exc, match=match):
        backend.forward(args["q"], args["k"], args["v"], args["layer"], args["batch"])
    assert_unchanged(state, before)


@pytest.mark.interpreter
def test_forward_before_metadata_and_the_good_call_still_work():
    """The catalogue's inputs are one mutation from a call that runs: that call runs and writes."""
    state = state_for(VERIFY)
    backend = TritonSWAAttnBackend(runner_for(state))
    layer = layers()["sliding"]
    batch = batch_for(state, VERIFY)
    q = torch.randn(4, HQ * 16)
    with pytest.raises(ValueError, match="init_forward_metadata"):
        backend.forward(q, torch.randn(4, 32), torch.randn(4, 32), layer, batch)
    backend.init_forward_metadata(batch)
    before = snapshot(state)
    out = backend.forward(q, torch.randn(4, 32), torch.randn(4, 32), layer, batch)
    assert out.shape == (4, HQ * 16) and not torch.isnan(out).any()
    with pytest.raises(AssertionError, match="swa.k0 changed"):
        assert_unchanged(state, before)


@pytest.mark.reference
def test_full_layer_in_a_swa_only_pool_names_the_layer():
    """Defect 10 with a pool that has no full sub-pool at all: the message names the layer and both facts."""
    pool = SWAKVPool(16, 16, 1, torch.float32, [0, 1], [], head_num=2, head_dim=16)
    state = state_for(DECODE)
    runner = ModelRunner(
        pool,
        state.allocator,
        state.req_to_token_pool,
        sliding_window_size=W,
        is_draft_worker=True,
        spec_algorithm=SpeculativeAlgorithm.DFLASH,
    )
    backend = TritonSWAAttnBackend(runner)
    backend.forward_metadata = SimpleNamespace(sliding=None, full=None)
    with pytest.raises(ValueError, match=r"layer 1 is declared full \(sliding_window_size=-1\).*SWA sub-pool"):
        backend._layer_setup(AttentionLayer(1, HQ, 2, 16))
