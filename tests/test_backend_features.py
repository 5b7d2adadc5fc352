"""Kernel features driven through the backend, against the float64 reference.

Tree verify (custom mask and tree positions), non-causal draft blocks, attention sinks, logit soft
capping and fp8 KV with per-tensor scales (numbers and one-element tensors), for decode,
TARGET_VERIFY and DRAFT_EXTEND_V2, at page sizes 1 and 4. The pools come from make_pool_state: the real allocators with
shuffled free lists (SWA slots differ from full slots), window eviction, and NaN in every slot no
window may read. The step's K/V are saved by the backend; the pools after the step must equal the
reference store bit for bit, and every layer's output the reference attention over those pools.
"""

from __future__ import annotations

import zlib

import pytest
import torch

import triton_swa_reference as ref
from triton_swa.backend import TritonSWAAttnBackend
from triton_swa.engine import AttentionLayer, ForwardBatch, ForwardMode, ModelRunner, SpecInfo
from triton_swa.testing import assert_close, make_pool_state

HQ, W, N = 4, 3, 4
FP8 = torch.float8_e4m3fn
PARENTS = [[-1, 0, 0, 1], [-1, 0, 1, 0], [-1, -1, 1, 2]]  # per request; -1: child of the committed prefix


def tree(prefix_lens, device):
    masks, positions = [], []
    for parents, p in zip(PARENTS, prefix_lens):
        mask = torch.eye(N, dtype=torch.bool)
        depth = []
        for i, j in enumerate(parents):
            d = 0
            while j >= 0:
                mask[i, j], d, j = True, d + 1, parents[j]
            depth.append(d)
        masks.append(mask.reshape(-1))
        positions.append(p + torch.tensor(depth))
    return torch.cat(masks).to(device), torch.cat(positions).to(device)


FEATURES = {
    "plain": {},
    "tree": dict(tree=True),
    "non-causal": dict(causal=False),
    "sinks-softcap": dict(sinks=True, logit_cap=2.5),
    "fp8-scales": dict(fp8="number"),
    "fp8-tensor-scales": dict(fp8="tensor"),
    "fp8nuz-scales": dict(fp8="number", fp8_dtype=torch.float8_e4m3fnuz),
    "all": dict(tree=True, sinks=True, logit_cap=2.5, fp8="tensor"),
}


def make_layers(feature, device, g):
    sinks = (lambda: (2 * torch.randn(HQ, generator=g)).to(device)) if feature.get("sinks") else (lambda: None)
    scales = {}
    if feature.get("fp8") == "number":
        scales = dict(k_scale=0.5, v_scale=0.25)
    elif feature.get("fp8") == "tensor":
        scales = dict(k_scale=torch.tensor([0.5], device=device), v_scale=torch.tensor([0.25], device=device))
    cap = feature.get("logit_cap", 0.0)
    return [
        AttentionLayer(0, HQ, 2, 16, sliding_window_size=W, sinks=sinks(), logit_cap=cap, **scales),
        AttentionLayer(1, HQ, 1, 32, sinks=sinks(), logit_cap=cap, **scales),
    ]


def run(device, page_size, feature, mode):
    g = torch.Generator().manual_seed(zlib.crc32(f"{page_size} {mode.name} {sorted(feature.items())}".encode()))
    new = 1 if mode == ForwardMode.DECODE else N
    dtype = feature.get("fp8_dtype", FP8) if feature.get("fp8") else torch.float32
    state = make_pool_state(
        seq_lens=[11, 23, 6], window_left=W, page_size=page_size, dtype=dtype, device=device, new_tokens=new, generator=g
    )
    runner = ModelRunner(state.kv_pool, state.allocator, state.req_to_token_pool, sliding_window_size=W, device=device)
    backend = TritonSWAAttnBackend(runner)
    rows, prefix, loc = state.req_pool_indices(), state.prefix_lens(), state.new_slots()
    bs = len(state.requests)
    spec = None
    if mode == ForwardMode.TARGET_VERIFY:
        mask, pos = tree(prefix.tolist(), device) if feature.get("tree") else (None, None)
        spec = SpecInfo(N, custom_mask=mask, positions=pos, causal=feature.get("causal", True))
        batch = ForwardBatch(mode, bs, rows, prefix, loc, seq_lens_cpu=prefix.cpu(), spec_info=spec)
    elif mode == ForwardMode.DRAFT_EXTEND_V2:  # a draft block proposed at once (DFlash): spec_info.causal
        seq = state.seq_lens()
        ext = seq - prefix
        spec = SpecInfo(N, causal=feature.get("causal", True))
        batch = ForwardBatch(
            mode,
            bs,
            rows,
            seq,
            loc,
            seq_lens_cpu=seq.cpu(),
            extend_prefix_lens=prefix,
            extend_seq_lens=ext,
            extend_prefix_lens_cpu=prefix.tolist(),
            extend_seq_lens_cpu=ext.tolist(),
            spec_info=spec,
        )
    else:
        seq = state.seq_lens()
        batch = ForwardBatch(mode, bs, rows, seq, loc, seq_lens_cpu=seq.cpu())
    backend.init_forward_metadata(batch)
    layers = make_layers(feature, device, g)
    for layer in layers:
        pool = state.kv_pool.swa_kv_pool if layer.sliding_window_size >= 0 else state.kv_pool.full_kv_pool
        kb, vb = pool.get_kv_buffer(0)
        mapping = state.mapping if layer.sliding_window_size >= 0 else None
        t = bs * new
        q = torch.randn(t, HQ, layer.head_dim, generator=g).to(device)
        k = torch.randn(t, layer.tp_k_head_num, layer.head_dim, generator=g).to(device)
        v = torch.randn(t, layer.tp_k_head_num, layer.v_head_dim, generator=g).to(device)
        want_k, want_v = kb.clone(), vb.clone()
        ref.store_kv(want_k, want_v, loc, k, v, mapping=mapping, k_scale=layer.k_scale, v_scale=layer.v_scale)
        out = backend.forward(q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1), layer, batch)
        name = f"{mode.name} layer {layer.layer_id} page {page_size}"
        for got, want, what in ((kb, want_k, "K"), (vb, want_v, "V")):
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), f"{name}: saved {what} differs"
        kw = dict(sm_scale=layer.scaling, logit_cap=layer.logit_cap, sinks=layer.sinks, k_scale=layer.k_scale, v_scale=layer.v_scale)
        if mode != ForwardMode.DECODE:
            indptr, indices, _ = ref.extend_window_indices(state.req_to_token, rows, prefix, layer.sliding_window_size, mapping)
            qo = torch.arange(0, (bs + 1) * N, N)
            want = ref.extend_attention(
                q,
                k,
                v,
                want_k,
                want_v,
                qo,
                indptr,
                indices,
                prefix,
                window_left=layer.sliding_window_size,
                causal=spec.causal,
                custom_mask=spec.custom_mask,
                q_positions=spec.positions,
                mask_indptr=torch.arange(0, bs * N * N, N * N),
                **kw,
            )
        else:
            indptr, indices, _ = ref.decode_window_indices(state.req_to_token, rows, state.seq_lens(), layer.sliding_window_size, mapping)
            want = ref.decode_attention(q, want_k, want_v, indptr, indices, **kw)
        assert not torch.isnan(out).any(), f"{name}: NaN (read a poisoned slot)"
        assert_close(out, want.reshape(out.shape), name=name)


@pytest.mark.interpreter
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("feature", list(FEATURES))
def test_verify_features_through_the_backend(device, page_size, feature):
    run(device, page_size, FEATURES[feature], ForwardMode.TARGET_VERIFY)


@pytest.mark.interpreter
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("feature", ["plain", "sinks-softcap", "fp8-scales", "fp8-tensor-scales", "fp8nuz-scales"])
def test_decode_features_through_the_backend(device, page_size, feature):
    run(device, page_size, FEATURES[feature], ForwardMode.DECODE)


@pytest.mark.interpreter
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("feature", ["plain", "non-causal", "sinks-softcap", "fp8-tensor-scales"])
def test_draft_extend_features_through_the_backend(device, page_size, feature):
    run(device, page_size, FEATURES[feature], ForwardMode.DRAFT_EXTEND_V2)
