"""SGLang tier, speculative workers and the engine's own plumbing, on SGLang 0.5.23's real classes.

- A DFlash draft worker (Gemma 4 + DFlash): its active pool is its own ``SWAKVPool``, registering
  the target allocator's mapping, and it shares the target's ``req_to_token`` and allocator. The
  policy reads the draft's K/V at the right SWA slots; SGLang's pre-fix rule ("a draft worker has
  no SWA pool") reads ``swa_buffer[full_slot]``, the regression this project exists to fix. The
  draft block is a bidirectional layer (``AttentionType.DECODER_BIDIRECTIONAL``).
- A FROZEN_KV MTP draft: its own plain pool, the target's SWA pool resolved through the shared
  allocator, and K/V read from the target's pool under SGLang's own ``frozen_kv_target_view`` /
  ``target_kv_pool_view``; outside them the sliding layer refuses loudly.
- Writes go through SGLang's ``set_kv_buffer`` at the SWA write ids of SGLang's
  ``KVIndexTranslator`` (a bound plan).
- The CUDA-graph metadata path (``init_forward_metadata_out_graph`` with and without
  ``in_capture``) over fixed buffers equals eager, padded batch included.
- What is not supported fails with a ValueError naming it.
"""

from __future__ import annotations

from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest
import torch

import triton_swa_reference as ref

pytest.importorskip(
    "sglang.srt.mem_cache.swa_memory_pool", reason="SGLang tier: sglang 0.5.23 is not installed (bash scripts/setup_sglang.sh installs it)"
)

from sglang.srt.layers.radix_attention import AttentionType, RadixAttention  # noqa: E402
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator  # noqa: E402
from sglang.srt.mem_cache.memory_pool import KVWriteLoc, MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode  # noqa: E402
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm as A  # noqa: E402

from triton_swa.backend import TritonSWAAttnBackend  # noqa: E402
from triton_swa.integrations.sglang import TritonSWASGLangBackend  # noqa: E402
from triton_swa.testing import assert_close  # noqa: E402

pytestmark = pytest.mark.sglang

HQ, H_SWA, D_SWA, H_FULL, D_FULL = 4, 2, 16, 1, 32
SIZE, SIZE_SWA, W = 96, 96, 5
# pools, allocators and batches on the GPU when there is one (kernels compiled), else on the CPU
# (kernels in the interpreter); inputs are drawn and references computed on the host
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def swa_pool(size=SIZE, size_swa=SIZE_SWA, page_size=1, h_swa=H_SWA):
    return SWAKVPool(
        size=size,
        size_swa=size_swa,
        page_size=page_size,
        dtype=torch.float32,
        head_num=H_FULL,
        head_dim=D_FULL,
        swa_attention_layer_ids=[0],
        full_attention_layer_ids=[1],
        device=DEV,
        enable_memory_saver=False,
        swa_head_num=h_swa,
        swa_head_dim=D_SWA,
        swa_v_head_dim=D_SWA,
    )


def layers(h_swa=H_SWA, attn_type=AttentionType.DECODER):
    return [
        RadixAttention(HQ, D_SWA, D_SWA**-0.5, h_swa, 0, sliding_window_size=W, attn_type=attn_type),
        RadixAttention(HQ, D_FULL, D_FULL**-0.5, H_FULL, 1),
    ]


def runner(pool, alloc, rtp, *, draft=False, algo=A.NONE):
    r = MagicMock()
    r.token_to_kv_pool, r.token_to_kv_pool_allocator, r.req_to_token_pool = pool, alloc, rtp
    r.is_draft_worker, r.spec_algorithm, r.sliding_window_size, r.device = draft, algo, W, DEV
    r.kv_index_translator = KVIndexTranslator(
        req_to_token=rtp.req_to_token,
        token_to_kv_pool_allocator=alloc,
        token_to_kv_pool=pool,
        page_size=1,
        device=DEV,
        is_draft_worker=draft,
    )
    return r


def drifted_state(g, rows_n=2, lens=(14, 10)):
    """Target pools whose SWA slots differ from their full slots, through SGLang's own allocator
    (sorted free lists): a burst that fills both pools, the window eviction of its first 30 tokens,
    then the rest freed; the requests then get full slots from 31 and SWA slots from 1. The SWA
    pool is as large as the full pool here, so that a rule reading the SWA buffer at full slots
    reads other tokens' K/V rather than past the buffer."""
    pool = swa_pool()
    alloc = SWATokenToKVPoolAllocator(SIZE, SIZE_SWA, 1, torch.float32, DEV, pool, True)  # need_sort
    rtp = ReqToTokenPool(4, 64, DEV, False)
    burst = alloc.alloc(SIZE)
    alloc.free_swa(burst[:30])
    alloc.free(burst[30:])
    rows = rtp.alloc_rows(rows_n)
    for r, n in zip(rows, lens):
        rtp.req_to_token[r, :n] = alloc.alloc(n).to(torch.int32)
    return pool, alloc, rtp, rows, list(lens)


def write_history(pool, rtp, rows, lens, layer_list, g):
    """Random K/V of every committed token, written by SGLang's own set_kv_buffer; then SGLang's
    window eviction of what lies before each window. Returns ``{(layer_id, row): (k, v)}``."""
    hist = {}
    for r, n in zip(rows, lens):
        full = rtp.req_to_token[r, :n].long()
        for layer in layer_list:
            k = torch.randn(n, layer.tp_k_head_num, layer.head_dim, generator=g)
            v = torch.randn(n, layer.tp_k_head_num, layer.v_head_dim, generator=g)
            pool.set_kv_buffer(layer, KVWriteLoc(full, swa_loc=pool.translate_loc_from_full_to_swa(full)), k.to(DEV), v.to(DEV))
            hist[(layer.layer_id, r)] = (k, v)
    return hist


def evict(alloc, rtp, rows, lens):
    old = [rtp.req_to_token[r, : n - W - 1].long() for r, n in zip(rows, lens) if n - W - 1 > 0]
    if old:
        alloc.free_swa(torch.cat(old))


def sgl_batch(mode, rows, prefix, new, loc, **kw):
    lens = [p + m for p, m in zip(prefix, new)]
    t = sum(new)
    fields = dict(
        forward_mode=mode,
        batch_size=len(rows),
        input_ids=torch.zeros(t, dtype=torch.long, device=DEV),
        req_pool_indices=torch.tensor(rows, device=DEV),
        seq_lens=torch.tensor(lens, device=DEV),
        out_cache_loc=loc,
        seq_lens_sum=sum(lens),
        seq_lens_cpu=torch.tensor(lens),
        spec_algorithm=A.NONE,
    )
    if not (mode.is_decode() or mode.is_target_verify()):  # EXTEND, MIXED, DRAFT_EXTEND_V2: extend-shaped
        fields.update(
            extend_prefix_lens=torch.tensor(prefix, device=DEV),
            extend_prefix_lens_cpu=list(prefix),
            extend_seq_lens=torch.tensor(new, device=DEV),
            extend_seq_lens_cpu=list(new),
            extend_num_tokens=t,
        )
    fields.update(kw)
    return ForwardBatch(**fields)


def place(alloc, rtp, rows, prefix, new):
    loc = alloc.alloc(sum(new))
    at = 0
    for r, p, m in zip(rows, prefix, new):
        rtp.req_to_token[r, p : p + m] = loc[at : at + m].to(torch.int32)
        at += m
    return loc


def want_extend(layer, hist, rows, prefix, new, q, k, v, *, causal=True):
    """Each request's expected output: its cached window plus its new tokens, float64 reference."""
    outs, at = [], 0
    for r, p, m in zip(rows, prefix, new):
        kp, vp = hist[(layer.layer_id, r)]
        kk = torch.cat([kp[:p], k[at : at + m]])
        vv = torch.cat([vp[:p], v[at : at + m]])
        q_pos, k_pos = torch.arange(p, p + m), torch.arange(p + m)
        win = layer.sliding_window_size
        mask = torch.cat([ref.window_mask(q_pos, k_pos[:p], win), ref.window_mask(q_pos, k_pos[p:], win, causal=causal)], 1)
        outs.append(ref.attention(q[at : at + m], kk, vv, mask, sm_scale=layer.scaling))
        at += m
    return torch.cat(outs)


def call(layer, q, k, v, fb, **kw):
    """``RadixAttention.forward`` with host inputs moved to the pools' device; the output on the host."""
    on = lambda x: None if x is None else x.flatten(1).to(DEV)  # noqa: E731
    return layer(on(q), on(k), on(v), fb, **kw).cpu()


def rand_qkv(layer, t, g):
    return (
        torch.randn(t, HQ, layer.head_dim, generator=g),
        torch.randn(t, layer.tp_k_head_num, layer.head_dim, generator=g),
        torch.randn(t, layer.tp_k_head_num, layer.v_head_dim, generator=g),
    )


def pre_fix_rule(model_runner):
    """SGLang's rule before the fix, as docs/contract.md §3 describes it: a non-FROZEN_KV draft worker has no SWA
    pool, whatever its active pool is; otherwise the allocator's pool when it is SWA-backed."""
    if model_runner.is_draft_worker and not model_runner.spec_algorithm.is_frozen_kv_mtp():
        return None
    kvcache = model_runner.token_to_kv_pool_allocator.get_kvcache()
    return kvcache if isinstance(kvcache, SWAKVPool) else None


def test_dflash_draft_worker_reads_its_own_swa_pool_and_the_pre_fix_rule_does_not(monkeypatch):
    """Gemma 4 + DFlash: the draft owns an SWAKVPool (other K/V head count than the target) that
    registers the target allocator's mapping and shares its req_to_token and allocator. Its draft
    block (bidirectional) runs as EXTEND over the cached window."""
    g = torch.Generator().manual_seed(10)
    target_pool, alloc, rtp, rows, lens = drifted_state(g)
    draft_pool = swa_pool(h_swa=1)
    draft_pool.register_mapping(alloc.full_to_swa_index_mapping)
    draft_layers = layers(h_swa=1, attn_type=AttentionType.DECODER_BIDIRECTIONAL)
    write_history(target_pool, rtp, rows, lens, layers(), g)
    hist = write_history(draft_pool, rtp, rows, lens, draft_layers, g)
    evict(alloc, rtp, rows, lens)
    live = torch.cat([rtp.req_to_token[r, n - W : n].long() for r, n in zip(rows, lens)])
    swa = draft_pool.translate_loc_from_full_to_swa(live)
    assert (swa > 0).all() and not torch.equal(swa, live), "the window's SWA slots must differ from its full slots"

    draft_runner = runner(draft_pool, alloc, rtp, draft=True, algo=A.DFLASH)
    backend = TritonSWASGLangBackend(draft_runner)
    assert backend._swa_kv_pool is draft_pool, "the DFlash draft must resolve its own active SWA pool"
    new = [4, 4]
    loc = place(alloc, rtp, rows, lens, new)
    fb = sgl_batch(ForwardMode.EXTEND, rows, lens, new, loc)
    draft_runner.kv_index_translator.bind_own_plan(fb)
    backend.init_forward_metadata(fb)
    assert torch.equal(backend.core.swa_loc, draft_pool.translate_loc_from_full_to_swa(loc))
    inputs = {}
    with forward_context(ForwardContext(attn_backend=backend)):
        for layer in draft_layers:
            q, k, v = inputs[layer.layer_id] = rand_qkv(layer, sum(new), g)
            out = call(layer, q, k, v, fb).view(-1, HQ, layer.v_head_dim)
            assert_close(
                out,
                want_extend(layer, hist, rows, lens, new, q, k, v, causal=layer.sliding_window_size < 0),
                name=f"draft layer {layer.layer_id}",
            )
            # SGLang's set_kv_buffer wrote the block at the translator's SWA slots
            k_buf = draft_pool.get_key_buffer(layer.layer_id)
            slots = backend.core.swa_loc if layer.sliding_window_size >= 0 else loc
            assert torch.equal(k_buf[slots.long()].cpu(), k), f"layer {layer.layer_id}: K/V not at the step's write ids"

    # The regression: the same step under SGLang's pre-fix rule reads the draft's SWA buffer at full slots.
    monkeypatch.setattr(TritonSWAAttnBackend, "_resolve_swa_kv_pool", staticmethod(pre_fix_rule))
    legacy = TritonSWASGLangBackend(draft_runner)
    assert legacy._swa_kv_pool is None
    legacy.init_forward_metadata(fb)
    sliding = draft_layers[0]
    q, k, v = inputs[0]
    with forward_context(ForwardContext(attn_backend=legacy)):
        out = call(sliding, q, k, v, fb, save_kv_cache=False).view(-1, HQ, D_SWA)
    err = (out - want_extend(sliding, hist, rows, lens, new, q, k, v, causal=False)).abs().max().item()
    assert err > 0.1, f"the pre-fix rule should read wrong K/V here, yet its error is only {err:.2e}"


def test_frozen_kv_mtp_draft_reads_the_targets_pool_under_sglangs_views():
    from sglang.srt.speculative.frozen_kv_mtp_info import FrozenKVMTPContext
    from sglang.srt.speculative.frozen_kv_mtp_utils import frozen_kv_target_view, target_kv_pool_view

    g = torch.Generator().manual_seed(11)
    target_pool, alloc, rtp, rows, lens = drifted_state(g)
    target_layers = layers()
    hist = write_history(target_pool, rtp, rows, lens, target_layers, g)
    evict(alloc, rtp, rows, lens)
    draft_own = MHATokenToKVPool(SIZE, 1, torch.float32, H_FULL, D_FULL, 1, DEV, False)
    draft_runner = runner(draft_own, alloc, rtp, draft=True, algo=A.FROZEN_KV_MTP)
    backend = TritonSWASGLangBackend(draft_runner)
    assert backend._swa_kv_pool is target_pool, "FROZEN_KV MTP resolves the target's pool through the allocator"
    ctx = FrozenKVMTPContext(target_token_to_kv_pool=target_pool, physical_layer_ids={0: 0, 1: 1})
    fb = sgl_batch(ForwardMode.DECODE, rows, [n - 1 for n in lens], [1, 1], None)
    with frozen_kv_target_view(fb, ctx, backend):
        backend.init_forward_metadata(fb)
    assert backend.token_to_kv_pool is draft_own, "SGLang's view must restore the draft's own pool"
    with target_kv_pool_view(fb, ctx, backend), forward_context(ForwardContext(attn_backend=backend)):
        for layer in target_layers:
            q = torch.randn(2, HQ, layer.head_dim, generator=g)
            out = call(layer, q, None, None, fb, save_kv_cache=False).view(2, HQ, layer.v_head_dim)
            for i, (r, n) in enumerate(zip(rows, lens)):
                kk, vv = hist[(layer.layer_id, r)]
                pos = torch.arange(n)
                mask = ref.window_mask(pos[-1:], pos, layer.sliding_window_size)
                assert_close(
                    out[i : i + 1],
                    ref.attention(q[i : i + 1], kk, vv, mask, sm_scale=layer.scaling),
                    name=f"frozen-kv layer {layer.layer_id} request {i}",
                )
    # Outside SGLang's view the draft's own (full-only) pool is current: the sliding layer refuses.
    with pytest.raises(ValueError, match="not in the SWA sub-pool"):
        backend.forward_decode(torch.zeros(2, HQ * D_SWA, device=DEV), None, None, target_layers[0], fb, save_kv_cache=False)


def test_cuda_graph_metadata_path_equals_eager():
    """init_cuda_graph_state, then SGLang's graph path: capture (``in_capture=True``) over one batch,
    replays over fresh batches (DECODE padded to the captured size; TARGET_VERIFY chain) give what
    eager metadata gives over the same batch."""
    g = torch.Generator().manual_seed(12)
    pool, alloc, rtp, rows, lens = drifted_state(g, rows_n=3, lens=(14, 10, 7))
    write_history(pool, rtp, rows, lens, layers(), g)
    evict(alloc, rtp, rows, lens)
    backend = TritonSWASGLangBackend(runner(pool, alloc, rtp))
    eager = TritonSWASGLangBackend(runner(pool, alloc, rtp))
    n = 3
    backend.init_cuda_graph_state(4, 4 * n)
    fill = backend.get_cuda_graph_seq_len_fill_value()

    def padded_decode(real_rows, real_lens, bs):
        pad = bs - len(real_rows)
        loc = torch.cat([place(alloc, rtp, real_rows, real_lens, [1] * len(real_rows)), torch.zeros(pad, dtype=torch.int64, device=DEV)])
        return sgl_batch(ForwardMode.DECODE, real_rows + [0] * pad, [x for x in real_lens] + [fill - 1] * pad, [1] * bs, loc)

    def run(b, fb, save):
        outs = []
        with forward_context(ForwardContext(attn_backend=b)):
            for layer in layers():
                gen = torch.Generator().manual_seed(100 + layer.layer_id)
                t = fb.out_cache_loc.shape[0]
                q, k, v = rand_qkv(layer, t, gen)
                outs.append(call(layer, q, k, v, fb, save_kv_cache=save))
        return outs

    capture = padded_decode(rows[:2], lens[:2], 4)
    backend.init_forward_metadata_out_graph(capture, in_capture=True)
    assert (backend.core.swa_loc == 0).all(), "capture writes the SWA dummy slot only"
    lens = [x + 1 for x in lens[:2]] + lens[2:]
    replay = padded_decode(rows, lens, 4)
    backend.init_forward_metadata_out_graph(replay)
    eager.init_forward_metadata(replay)
    assert torch.equal(backend.core.swa_loc, eager.core.swa_loc)
    want = run(eager, replay, save=True)
    got = run(backend, replay, save=True)  # writes the same K/V again
    for layer, a, b in zip(layers(), got, want):
        assert torch.equal(a, b), f"decode layer {layer.layer_id}: graph-path output differs from eager"

    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    lens = [x + 1 for x in lens]
    loc = place(alloc, rtp, rows, lens, [n] * 3)
    positions = torch.cat([p + torch.arange(n) for p in lens]).to(DEV)
    spec = DFlashVerifyInput(draft_token=torch.zeros(3 * n, dtype=torch.long, device=DEV), positions=positions, draft_token_num=n)
    verify = sgl_batch(ForwardMode.TARGET_VERIFY, rows, lens, [0] * 3, loc, positions=positions, spec_info=spec, spec_algorithm=A.DFLASH)
    backend.init_forward_metadata_out_graph(verify, in_capture=True)
    backend.init_forward_metadata_out_graph(verify)
    eager.init_forward_metadata(verify)
    want, got = run(eager, verify, save=True), run(backend, verify, save=True)
    for layer, a, b in zip(layers(), got, want):
        assert torch.equal(a, b), f"verify layer {layer.layer_id}: graph-path output differs from eager"


def test_what_is_not_supported_says_so():
    g = torch.Generator().manual_seed(13)
    pool, alloc, rtp, rows, lens = drifted_state(g)
    r = runner(pool, alloc, rtp)
    backend = TritonSWASGLangBackend(r)
    fb = sgl_batch(ForwardMode.SPLIT_PREFILL, rows, lens, [1, 1], alloc.alloc(2))
    with pytest.raises(ValueError, match="SPLIT_PREFILL"):
        backend.init_forward_metadata(fb)
    with pytest.raises(ValueError, match="init_cuda_graph_state"):
        backend.init_forward_metadata_out_graph(sgl_batch(ForwardMode.DECODE, rows, lens, [1, 1], alloc.alloc(2)))
    cross = RadixAttention(HQ, D_FULL, D_FULL**-0.5, H_FULL, 1, is_cross_attention=True)
    backend.init_forward_metadata(sgl_batch(ForwardMode.DECODE, rows, lens, [1, 1], alloc.alloc(2)))
    with pytest.raises(ValueError, match="cross-attention"):
        backend.forward_decode(torch.zeros(2, HQ * D_FULL, device=DEV), None, None, cross, None)
    unified = runner(pool, alloc, rtp)
    unified.kv_index_translator = SimpleNamespace(is_translating=True)
    with pytest.raises(ValueError, match="unified KV memory"):
        TritonSWASGLangBackend(unified)
    hnd = MHATokenToKVPool(SIZE, 1, torch.float32, H_FULL, D_FULL, 2, DEV, False, kv_cache_layout="hnd")
    plain = runner(hnd, alloc, rtp)
    plain.sliding_window_size = -1
    plain.token_to_kv_pool_allocator = MagicMock(get_kvcache=MagicMock(return_value=hnd))
    plain.kv_index_translator = None
    with pytest.raises(ValueError, match="'hnd' layout"):
        TritonSWASGLangBackend(plain)


def test_page_16_prefill_chunk_and_decode_through_the_backend():
    """Page size 16 end to end through the registered backend: SGLang's paged SWA allocator
    (alloc_extend / alloc_decode), the backend writing through SGLang's set_kv_buffer, whole-page
    free_swa eviction between steps, and its translator's write ids."""
    ps, w = 16, 20
    g = torch.Generator().manual_seed(14)
    pool = SWAKVPool(
        size=256,
        size_swa=128,
        page_size=ps,
        dtype=torch.float32,
        head_num=H_FULL,
        head_dim=D_FULL,
        swa_attention_layer_ids=[0],
        full_attention_layer_ids=[1],
        device=DEV,
        enable_memory_saver=False,
        swa_head_num=H_SWA,
        swa_head_dim=D_SWA,
        swa_v_head_dim=D_SWA,
    )
    alloc = SWATokenToKVPoolAllocator(256, 128, ps, torch.float32, DEV, pool, False)
    rtp = ReqToTokenPool(4, 128, DEV, False)
    rows = rtp.alloc_rows(2)
    r = runner(pool, alloc, rtp)
    r.sliding_window_size = w
    r.kv_index_translator = KVIndexTranslator(
        req_to_token=rtp.req_to_token, token_to_kv_pool_allocator=alloc, token_to_kv_pool=pool, page_size=ps, device=DEV
    )
    backend = TritonSWASGLangBackend(r)
    assert backend.core.page_size == ps
    step_layers = [
        RadixAttention(HQ, D_SWA, D_SWA**-0.5, H_SWA, 0, sliding_window_size=w),
        RadixAttention(HQ, D_FULL, D_FULL**-0.5, H_FULL, 1),
    ]
    hist = {
        (layer.layer_id, row): (torch.empty(0, layer.tp_k_head_num, layer.head_dim), torch.empty(0, layer.tp_k_head_num, layer.v_head_dim))
        for layer in step_layers
        for row in rows
    }
    lens = [0, 0]

    def step(mode, new):
        prefix = list(lens)
        seq_cpu = torch.tensor([p + m for p, m in zip(prefix, new)])
        seq = seq_cpu.to(DEV)
        last = torch.tensor([int(rtp.req_to_token[row, p - 1]) if p else -1 for row, p in zip(rows, prefix)], device=DEV)
        if mode.is_decode():
            loc = alloc.alloc_decode(seq, seq_cpu, last)
        else:
            pre_cpu = torch.tensor(prefix)
            loc = alloc.alloc_extend(pre_cpu.to(DEV), pre_cpu, seq, seq_cpu, last, sum(new))
        at = 0
        for row, p, m in zip(rows, prefix, new):
            rtp.req_to_token[row, p : p + m] = loc[at : at + m].to(torch.int32)
            at += m
        fb = sgl_batch(mode, rows, prefix, new, loc)
        r.kv_index_translator.bind_own_plan(fb)
        backend.init_forward_metadata(fb)
        with forward_context(ForwardContext(attn_backend=backend)):
            for layer in step_layers:
                q, k, v = rand_qkv(layer, sum(new), g)
                at = 0
                for row, m in zip(rows, new):
                    kh, vh = hist[(layer.layer_id, row)]
                    hist[(layer.layer_id, row)] = (torch.cat([kh, k[at : at + m]]), torch.cat([vh, v[at : at + m]]))
                    at += m
                out = call(layer, q, k, v, fb).view(-1, HQ, layer.v_head_dim)
                want = want_extend(layer, {key: val for key, val in hist.items()}, rows, prefix, new, q, k, v)
                assert_close(out, want, name=f"P16 {mode.name} layer {layer.layer_id}")
        lens[:] = seq.tolist()
        # SGLang's eviction: whole pages before each window
        old = [rtp.req_to_token[row, : (n - w) // ps * ps].long() for row, n in zip(rows, lens) if n - w >= ps]
        if old:
            alloc.free_swa(torch.cat(old))

    step(ForwardMode.EXTEND, [40, 23])
    step(ForwardMode.EXTEND, [17, 30])  # chunked prefill over a cached, partly evicted prefix
    step(ForwardMode.DECODE, [1, 1])
    live = torch.cat([rtp.req_to_token[row, n - w : n].long() for row, n in zip(rows, lens)])
    swa = pool.translate_loc_from_full_to_swa(live)
    assert (swa > 0).all() and (swa != live).any(), "the last windows' SWA slots must differ from their full slots"
    step(ForwardMode.DECODE, [1, 1])


def test_fp8_kv_written_by_sglang_and_read_with_its_scales():
    """fp8 (e4m3) pools: SGLang's set_kv_buffer quantizes with the layer's ``k_scale`` / ``v_scale``
    (the backend's write and SGLang's own), the kernels dequantize with ``k_scale_float``; the
    caller's k, v are left as they were (SGLang's pool divides in place)."""
    g = torch.Generator().manual_seed(15)
    pool = SWAKVPool(
        size=SIZE,
        size_swa=SIZE_SWA,
        page_size=1,
        dtype=torch.float8_e4m3fn,
        head_num=H_FULL,
        head_dim=D_FULL,
        swa_attention_layer_ids=[0],
        full_attention_layer_ids=[1],
        device=DEV,
        enable_memory_saver=False,
        swa_head_num=H_SWA,
        swa_head_dim=D_SWA,
        swa_v_head_dim=D_SWA,
    )
    alloc = SWATokenToKVPoolAllocator(SIZE, SIZE_SWA, 1, torch.float8_e4m3fn, DEV, pool, True)
    rtp = ReqToTokenPool(4, 64, DEV, False)
    burst = alloc.alloc(SIZE)
    alloc.free_swa(burst[:30])
    alloc.free(burst[30:])
    rows = rtp.alloc_rows(2)
    lens = [14, 10]
    for row, n in zip(rows, lens):
        rtp.req_to_token[row, :n] = alloc.alloc(n).to(torch.int32)
    fp8_layers = layers()
    for layer, (ks, vs) in zip(fp8_layers, ((0.5, 0.25), (0.75, 1.5))):
        layer.k_scale, layer.v_scale = torch.tensor(ks, device=DEV), torch.tensor(vs, device=DEV)
        layer.k_scale_float, layer.v_scale_float = ks, vs
    for row, n in zip(rows, lens):
        full = rtp.req_to_token[row, :n].long()
        for layer in fp8_layers:
            k = torch.randn(n, layer.tp_k_head_num, layer.head_dim, generator=g)
            v = torch.randn(n, layer.tp_k_head_num, layer.v_head_dim, generator=g)
            pool.set_kv_buffer(
                layer,
                KVWriteLoc(full, swa_loc=pool.translate_loc_from_full_to_swa(full)),
                k.to(DEV),
                v.to(DEV),
                layer.k_scale,
                layer.v_scale,
            )
    evict(alloc, rtp, rows, lens)
    backend = TritonSWASGLangBackend(runner(pool, alloc, rtp))
    loc = place(alloc, rtp, rows, lens, [1, 1])
    fb = sgl_batch(ForwardMode.DECODE, rows, lens, [1, 1], loc)
    backend.init_forward_metadata(fb)
    with forward_context(ForwardContext(attn_backend=backend)):
        for layer in fp8_layers:
            q, k, v = rand_qkv(layer, 2, g)
            k_dev = k.flatten(1).to(DEV)
            out = layer(q.flatten(1).to(DEV), k_dev, v.flatten(1).to(DEV), fb).view(2, HQ, layer.v_head_dim).cpu()
            assert torch.equal(k_dev.cpu(), k.flatten(1)), "the caller's k must not be divided in place"
            swa = layer.sliding_window_size >= 0
            k_buf, v_buf = pool.get_kv_buffer(layer.layer_id)
            for i, (row, n) in enumerate(zip(rows, lens)):
                full = rtp.req_to_token[row, : n + 1].long()
                slots = pool.translate_loc_from_full_to_swa(full) if swa else full
                if swa:
                    slots = slots[-(W + 1) :]
                kk = k_buf[slots].float().cpu() * layer.k_scale_float
                vv = v_buf[slots].float().cpu() * layer.v_scale_float
                want_new = (k[i] / layer.k_scale_float).to(torch.float8_e4m3fn)
                assert torch.equal(k_buf[slots[-1]].view(torch.uint8).cpu(), want_new.view(torch.uint8))
                assert_close(
                    out[i : i + 1],
                    ref.attention(q[i : i + 1], kk, vv, None, sm_scale=layer.scaling),
                    name=f"fp8 layer {layer.layer_id} request {i}",
                )


@pytest.mark.parametrize("mode", [ForwardMode.MIXED, ForwardMode.DRAFT_EXTEND_V2], ids=lambda m: m.name)
def test_mixed_and_draft_extend_v2_run_extend_shaped(mode):
    """SGLang's MIXED and DRAFT_EXTEND_V2 batches (extend-shaped: extend_prefix_lens / extend_seq_lens,
    as SGLang's own Triton backend reads them eagerly) over drifted, evicted pools."""
    g = torch.Generator().manual_seed(16)
    pool, alloc, rtp, rows, lens = drifted_state(g)
    hist = write_history(pool, rtp, rows, lens, layers(), g)
    evict(alloc, rtp, rows, lens)
    backend = TritonSWASGLangBackend(runner(pool, alloc, rtp))
    new = [3, 1]
    spec = None
    if mode == ForwardMode.DRAFT_EXTEND_V2:
        from sglang.srt.speculative.eagle_info import EagleDraftExtendInput

        spec = EagleDraftExtendInput()  # what SGLang's EAGLE / STANDALONE draft extend carries: no ``causal``
    fb = sgl_batch(mode, rows, lens, new, place(alloc, rtp, rows, lens, new), spec_info=spec)
    backend.init_forward_metadata(fb)
    with forward_context(ForwardContext(attn_backend=backend)):
        for layer in layers():
            q, k, v = rand_qkv(layer, sum(new), g)
            out = call(layer, q, k, v, fb).view(-1, HQ, layer.v_head_dim)
            assert_close(out, want_extend(layer, hist, rows, lens, new, q, k, v), name=f"{mode.name} layer {layer.layer_id}")


def layers_forward(backend, qkv: dict, n: int):
    """The model's forward over a batch of ``n`` tokens per request: every layer on its static inputs
    ``qkv[layer_id]`` (as a captured graph needs them), K/V saved, under SGLang's forward context."""

    def forward(fb):
        t = fb.batch_size * n
        with forward_context(ForwardContext(attn_backend=backend)):
            return [layer(*(x[:t].flatten(1) for x in qkv[layer.layer_id]), fb, save_kv_cache=True) for layer in layers()]

    return forward


def capture_as_sglang(backend, fb, forward) -> tuple:
    """One batch size of SGLang's graph capture: the graph metadata, its warm-up run, then on a GPU the
    captured run. Returns ``(graph or None, fb, outputs or None)``."""
    backend.init_forward_metadata_out_graph(fb, in_capture=True)
    forward(fb)  # SGLang's warm-up run before capture
    if DEV != "cuda":
        return None, fb, None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = forward(fb)
    return graph, fb, outs


def replay_as_sglang(captured: tuple, forward, view=None) -> list:
    """A replay of :func:`capture_as_sglang`'s graph (its metadata refilled by the caller); on the CPU the
    layers run again over the captured batch's buffers (or ``view``)."""
    graph, fb, outs = captured
    if graph is None:
        return forward(fb if view is None else view)
    graph.replay()
    return outs


def verify_mask_blocks(prefix, n, g, *, tree: bool, qlen: bool = False):
    """SGLang's verify mask, ``[n, prefix + n]`` per request (FULL_MASK: prefix visible) or ``[n, n]``
    (``qlen``: QLEN_ONLY), and the drafts' own ``[n, n]`` blocks: causal for a chain, a random subset
    of the ancestors (the diagonal kept) for a tree."""
    layout, blocks = [], []
    for p in prefix:
        block = torch.ones(n, n).tril().bool()
        if tree:
            block &= (torch.rand(n, n, generator=g) < 0.6) | torch.eye(n, dtype=torch.bool)
        layout.append(torch.cat([torch.ones(n, 0 if qlen else p, dtype=torch.bool), block], 1).reshape(-1))
        blocks.append(block)
    return torch.cat(layout), blocks


def want_verify(layer, hist, rows, prefix, n, q, k, v, blocks):
    """Float64 reference of a verify step whose drafts see each other through ``blocks``."""
    outs = []
    for i, (r, p) in enumerate(zip(rows, prefix)):
        kp, vp = hist[(layer.layer_id, r)]
        s = slice(i * n, (i + 1) * n)
        q_pos, k_pos = torch.arange(p, p + n), torch.arange(p + n)
        win = layer.sliding_window_size
        mask = torch.cat([ref.window_mask(q_pos, k_pos[:p], win), ref.window_mask(q_pos, k_pos[p:], win, causal=False) & blocks[i]], 1)
        outs.append(ref.attention(q[s], torch.cat([kp[:p], k[s]]), torch.cat([vp[:p], v[s]]), mask, sm_scale=layer.scaling))
    return torch.cat(outs)


@pytest.mark.parametrize("algo", ["eagle-tree", "eagle-chain", "ngram", "dflash", "dflash-masked-capture"])
def test_target_verify_graphs_captured_and_replayed_as_sglang_does(algo, monkeypatch):
    """SGLang's TARGET_VERIFY graph sequence on its own static buffers: ``_allocate_decode_buffers``
    (the mask sized for the largest batch at the fill length, handed whole to every batch size),
    capture at each batch size largest first with the verify input SGLang's graph runner builds,
    then a replay of 3 real requests padded to 4 the way its replay path pads them (the real
    inputs copied into the buffers, row 0 and the fill length after them). On a GPU each batch
    size is a captured ``torch.cuda.CUDAGraph`` that the replay replays; on the CPU the same layers
    run again over the same buffers. The real requests' outputs equal the float64 reference; the
    padded one is finite.

    ``dflash``: captured without a mask, as SGLang does once the plugin's policy hook is loaded;
    ``dflash-masked-capture``: captured with SGLang's all-true mask (no hook) and replayed, as
    DFlash always verifies, with ``custom_mask=None``.
    """
    from sglang.srt.model_executor.runner import base_runner
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput
    from sglang.srt.speculative.eagle_info import EagleVerifyInput
    from sglang.srt.speculative.ngram_info import NgramVerifyInput

    g = torch.Generator().manual_seed(31)
    pool, alloc, rtp, rows, lens = drifted_state(g, rows_n=3, lens=(14, 10, 7))
    hist = write_history(pool, rtp, rows, lens, layers(), g)
    evict(alloc, rtp, rows, lens)
    backend = TritonSWASGLangBackend(runner(pool, alloc, rtp, algo=A.DFLASH if algo.startswith("dflash") else A.EAGLE))
    n, capture_bs = 3, [1, 2, 4]
    max_bs = max(capture_bs)
    fill = backend.get_cuda_graph_seq_len_fill_value()
    backend.init_cuda_graph_state(max_bs, max_bs * n)
    # a single-rank process: the buffers' parallel-only fields are off
    monkeypatch.setattr(base_runner, "get_parallel", lambda: SimpleNamespace(pp_size=1, num_dp_ranks=1))
    monkeypatch.setattr(base_runner, "enable_num_token_non_padded", lambda: False)
    buffers = base_runner._allocate_decode_buffers(
        device=torch.device(DEV), max_bs=max_bs, max_num_token=max_bs * n, hidden_size=8, vocab_size=8, dtype=torch.float32,
        is_encoder_decoder=False, require_mlp_tp_gather=False, seq_len_fill_value=fill, encoder_len_fill_value=0,
        num_tokens_per_req=n, cache_loc_dtype=torch.int64, enable_mamba_track=False, allocate_logits_buffer=False,
    )  # fmt: skip
    # the model's per-layer inputs, static as a captured graph needs them
    qkv = {layer.layer_id: [x.to(DEV) for x in rand_qkv(layer, max_bs * n, g)] for layer in layers()}

    def spec_for(mask, positions):
        if algo.startswith("eagle"):
            return EagleVerifyInput(
                draft_token=None, custom_mask=mask, positions=positions, retrieve_index=None, retrieve_next_token=None,
                retrieve_next_sibling=None, retrieve_cum_len=None, spec_steps=n - 1, topk=2 if algo == "eagle-tree" else 1,
                draft_token_num=n, capture_hidden_mode=None, seq_lens_sum=None, seq_lens_cpu=None,
            )  # fmt: skip
        if algo == "ngram":
            return NgramVerifyInput(None, mask, positions, None, None, None, n)
        return DFlashVerifyInput(draft_token=None, positions=positions, draft_token_num=n, custom_mask=mask)

    def batch(bs, spec, seq_lens_cpu=None):
        return ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY, batch_size=bs, input_ids=buffers.input_ids[: bs * n],
            req_pool_indices=buffers.req_pool_indices[:bs], seq_lens=buffers.seq_lens[:bs], out_cache_loc=buffers.out_cache_loc[: bs * n],
            seq_lens_sum=int(buffers.seq_lens[:bs].sum()), seq_lens_cpu=seq_lens_cpu, positions=buffers.positions[: bs * n],
            spec_algorithm=A.EAGLE, spec_info=spec,
        )  # fmt: skip

    forward = layers_forward(backend, qkv, n)

    graphs = {}
    for bs in reversed(capture_bs):
        fb = batch(bs, spec_for(None if algo == "dflash" else buffers.custom_mask, None))
        graphs[bs] = capture_as_sglang(backend, fb, forward)

    raw = len(rows)
    loc = place(alloc, rtp, rows, lens, [n] * raw)
    positions = torch.cat([p + torch.arange(n) for p in lens])
    layout, blocks = verify_mask_blocks(lens, n, g, tree=algo == "eagle-tree")
    if algo.startswith("dflash"):
        layout, blocks = None, [torch.ones(n, n).tril().bool()] * raw
    spec = spec_for(None if layout is None else layout.to(DEV), positions.to(DEV))
    # SGLang's replay: the real inputs into the buffers, padded requests on row 0 at the fill length
    buffers.seq_lens.fill_(fill)
    buffers.out_cache_loc.zero_()
    buffers.req_pool_indices.zero_()
    buffers.positions.zero_()
    buffers.req_pool_indices[:raw].copy_(torch.tensor(rows))
    buffers.seq_lens[:raw].copy_(torch.tensor(lens))
    buffers.out_cache_loc[: raw * n].copy_(loc)
    buffers.positions[: raw * n].copy_(positions)
    view = batch(max_bs, spec, seq_lens_cpu=torch.tensor(lens + [fill] * (max_bs - raw)))
    backend.init_forward_metadata_out_graph(view)
    outs = replay_as_sglang(graphs[max_bs], forward, view)
    real = raw * n
    for layer, out in zip(layers(), outs):
        q, k, v = (x[:real].cpu() for x in qkv[layer.layer_id])
        out = out.cpu()
        assert_close(
            out[:real].view(real, HQ, -1), want_verify(layer, hist, rows, lens, n, q, k, v, blocks), name=f"{algo} layer {layer.layer_id}"
        )
        assert torch.isfinite(out[real:]).all(), "padded request"


def test_draft_extend_graphs_captured_and_replayed_as_sglang_does():
    """SGLang's EAGLE draft-extend graph sequence (``EAGLEDraftExtendCudaGraphRunner``, which the plugin
    builds for a triton_swa draft-extend backend): ``init_cuda_graph_state(max_bs, max_bs * width)``,
    capture at each batch size largest first over its static buffers (seq_lens at the fill length,
    ``extend_seq_lens`` the width, SGLang's own ``EagleDraftExtendInput``), then a replay of 3 real
    requests padded to 4 through the namespace view its ``execute`` builds (``seq_lens_cpu`` None,
    ``out_cache_loc`` only the real tokens'). Each request brings ``width`` new tokens after its
    cached ones, causal, their K/V written through SGLang's pool; the real rows equal the float64
    reference, the padded ones are finite. On a GPU each batch size is a captured graph, replayed."""
    from sglang.srt.speculative.eagle_info import EagleDraftExtendInput

    g = torch.Generator().manual_seed(37)
    pool, alloc, rtp, rows, lens = drifted_state(g, rows_n=3, lens=(14, 10, 7))
    hist = write_history(pool, rtp, rows, lens, layers(), g)
    evict(alloc, rtp, rows, lens)
    backend = TritonSWASGLangBackend(runner(pool, alloc, rtp, draft=True, algo=A.EAGLE))
    n, capture_bs = 3, [1, 2, 4]
    max_bs = max(capture_bs)
    fill = backend.get_cuda_graph_seq_len_fill_value()
    backend.init_cuda_graph_state(max_bs, max_bs * n)
    on = dict(device=DEV)
    buf = SimpleNamespace(
        req_pool_indices=torch.zeros(max_bs, dtype=torch.int64, **on), seq_lens=torch.full((max_bs,), fill, dtype=torch.int64, **on),
        extend_seq_lens=torch.full((max_bs,), n, dtype=torch.int32, **on), out_cache_loc=torch.ones(max_bs * n, dtype=torch.int64, **on),
        positions=torch.zeros(max_bs * n, dtype=torch.int64, **on),
    )  # fmt: skip
    qkv = {layer.layer_id: [x.to(DEV) for x in rand_qkv(layer, max_bs * n, g)] for layer in layers()}

    forward = layers_forward(backend, qkv, n)

    graphs = {}
    for bs in reversed(capture_bs):
        fb = ForwardBatch(
            forward_mode=ForwardMode.DRAFT_EXTEND_V2, batch_size=bs, input_ids=torch.zeros(bs * n, dtype=torch.int64, **on),
            req_pool_indices=buf.req_pool_indices[:bs], seq_lens=buf.seq_lens[:bs], seq_lens_cpu=torch.full((bs,), fill),
            extend_seq_lens=buf.extend_seq_lens[:bs], extend_seq_lens_cpu=[n] * bs, out_cache_loc=buf.out_cache_loc[: bs * n],
            seq_lens_sum=bs * fill, positions=buf.positions[: bs * n], spec_algorithm=A.EAGLE,
            spec_info=EagleDraftExtendInput(num_tokens_per_req=n, num_tokens_for_logprob_per_req=1),
        )  # fmt: skip
        graphs[bs] = capture_as_sglang(backend, fb, forward)

    raw = len(rows)
    loc = place(alloc, rtp, rows, lens, [n] * raw)
    # SGLang's execute: the real inputs into the buffers, padded requests on row 0 at the fill length
    buf.seq_lens.fill_(fill)
    buf.out_cache_loc.zero_()
    buf.req_pool_indices.zero_()
    buf.req_pool_indices[:raw].copy_(torch.tensor(rows))
    buf.seq_lens[:raw].copy_(torch.tensor([p + n for p in lens]))
    buf.out_cache_loc[: raw * n].copy_(loc)
    view = SimpleNamespace(
        batch_size=max_bs, forward_mode=ForwardMode.DRAFT_EXTEND_V2, req_pool_indices=buf.req_pool_indices, seq_lens=buf.seq_lens,
        seq_lens_sum=None, seq_lens_cpu=None, out_cache_loc=buf.out_cache_loc[: raw * n], kv_loc_plan=None, kv_loc_cols=None,
        spec_info=EagleDraftExtendInput(num_tokens_per_req=n, num_tokens_for_logprob_per_req=1),
    )  # fmt: skip
    backend.init_forward_metadata_out_graph(view)
    outs = replay_as_sglang(graphs[max_bs], forward)
    real = raw * n
    for layer, out in zip(layers(), outs):
        q, k, v = (x[:real].cpu() for x in qkv[layer.layer_id])
        out = out.cpu()
        want = want_extend(layer, hist, rows, lens, [n] * raw, q, k, v)
        assert_close(out[:real].view(real, HQ, -1), want, name=f"draft extend layer {layer.layer_id}")
        assert torch.isfinite(out[real:]).all(), "padded request"
        # the new K/V went to the pools at the requests' own slots (SWA ones translated)
        kb, _ = pool.get_kv_buffer(layer.layer_id)
        slots = loc if layer.sliding_window_size < 0 else pool.translate_loc_from_full_to_swa(loc)
        assert torch.equal(kb[slots.long()].cpu(), k), f"layer {layer.layer_id}: the draft's K/V not at its slots"


def want_draft_step(layer, hist, rows, lens, i, qs, ks, vs):
    """Float64 reference of draft decode step ``i``: each request's query at position ``L + i`` over its
    committed K/V and the K/V of draft steps ``0..i`` (``qs[j]``, ``ks[j]``, ``vs[j]``: ``[requests, ...]``)."""
    outs = []
    for b, (r, n) in enumerate(zip(rows, lens)):
        kp, vp = hist[(layer.layer_id, r)]
        kk = torch.cat([kp[:n]] + [ks[j][b : b + 1] for j in range(i + 1)])
        vv = torch.cat([vp[:n]] + [vs[j][b : b + 1] for j in range(i + 1)])
        mask = ref.window_mask(torch.tensor([n + i]), torch.arange(n + i + 1), layer.sliding_window_size)
        outs.append(ref.attention(qs[i][b : b + 1], kk, vv, mask, sm_scale=layer.scaling))
    return torch.cat(outs)


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_multi_step_draft_decode_runs_as_sglangs_draft_worker_drives_it(graphs):
    """EAGLE's chain draft decode (topk 1, 3 steps, so two attention steps) through
    ``TritonSWAMultiStepDraftBackend`` as SGLang's ``EagleDraftWorker.draft_forward`` drives it: the
    batch's ``out_cache_loc`` holds each request's draft slots (SGLang's ``per_step_draft_out_cache_loc``
    layout), placed in ``req_to_token`` right after its committed tokens; step ``i`` runs under
    ``attn_backends[i]`` with ``out_cache_loc`` set to its column and writes its K/V, which the next
    step reads. Eager: one ``init_forward_metadata`` before the steps. Graphs:
    ``EAGLEDraftCudaGraphRunner``'s sequence (``init_cuda_graph_state(max_bs, max_bs)``, capture at
    each batch size largest first, seq_lens at the fill length, then 3 real requests padded to 4
    through the namespace view its ``execute`` builds, ``num_padding`` on it). Each step's real rows
    equal the float64 reference over the window, on drifted pools (SWA slots differ from full slots);
    the padded rows are finite. On a GPU each batch size is a captured graph, replayed."""
    from sglang.srt.speculative.eagle_utils import per_step_draft_out_cache_loc

    from triton_swa.integrations.sglang import TritonSWAMultiStepDraftBackend

    g = torch.Generator().manual_seed(41)
    pool, alloc, rtp, rows, lens = drifted_state(g, rows_n=3, lens=(14, 10, 7))
    hist = write_history(pool, rtp, rows, lens, layers(), g)
    evict(alloc, rtp, rows, lens)
    steps, raw = 3, len(rows)
    md = TritonSWAMultiStepDraftBackend(runner(pool, alloc, rtp, draft=True, algo=A.EAGLE), 1, steps)
    assert len(md.attn_backends) == steps - 1
    loc = place(alloc, rtp, rows, lens, [steps] * raw)  # request-major: request b's step i at b * steps + i
    max_bs = 4 if graphs else raw
    # static inputs (a captured graph reads them): per (layer, step), max_bs rows
    qkv = {(layer.layer_id, i): [x.to(DEV) for x in rand_qkv(layer, max_bs, g)] for layer in layers() for i in range(steps - 1)}

    def draft_forward(fb):
        full, outs = fb.out_cache_loc, []
        per_step = per_step_draft_out_cache_loc(full, fb.batch_size, 1, steps)
        for i in range(steps - 1):  # the last step only samples
            fb.out_cache_loc = per_step[i]
            with forward_context(ForwardContext(attn_backend=md.attn_backends[i])):
                step_inputs = [[x[: fb.batch_size].flatten(1) for x in qkv[(layer.layer_id, i)]] for layer in layers()]
                outs.append([layer(*x, fb, save_kv_cache=True) for layer, x in zip(layers(), step_inputs)])
        fb.out_cache_loc = full
        return outs

    on = dict(device=DEV)
    if not graphs:
        fb = sgl_batch(ForwardMode.DECODE, rows, lens, [0] * raw, loc, spec_algorithm=A.EAGLE)
        md.init_forward_metadata(fb)
        outs = draft_forward(fb)
    else:
        capture_bs = [1, 2, max_bs]
        md.init_cuda_graph_state(max_bs, max_bs)
        fill = md.get_cuda_graph_seq_len_fill_value()
        buf = SimpleNamespace(
            req_pool_indices=torch.zeros(max_bs, dtype=torch.int64, **on), seq_lens=torch.full((max_bs,), fill, dtype=torch.int64, **on),
            seq_lens_cpu=torch.full((max_bs,), fill, dtype=torch.int64), out_cache_loc=torch.zeros(max_bs * steps, dtype=torch.int64, **on),
            positions=torch.zeros(max_bs, dtype=torch.int64, **on),
        )  # fmt: skip
        graphs_by_bs = {}
        for bs in reversed(capture_bs):
            fb = ForwardBatch(
                forward_mode=ForwardMode.DECODE, batch_size=bs, input_ids=torch.zeros(bs, dtype=torch.int64, **on),
                req_pool_indices=buf.req_pool_indices[:bs], seq_lens=buf.seq_lens[:bs], seq_lens_cpu=buf.seq_lens_cpu[:bs],
                out_cache_loc=buf.out_cache_loc[: bs * steps], seq_lens_sum=bs * fill, positions=buf.positions[:bs], spec_algorithm=A.EAGLE,
            )  # fmt: skip
            graphs_by_bs[bs] = capture_as_sglang(md, fb, draft_forward)
        # SGLang's execute: the real inputs into the buffers, padded requests on row 0 at the fill length
        buf.seq_lens.fill_(fill)
        buf.out_cache_loc.zero_()
        buf.req_pool_indices.zero_()
        buf.req_pool_indices[:raw].copy_(torch.tensor(rows))
        buf.seq_lens[:raw].copy_(torch.tensor(lens))
        buf.seq_lens_cpu.fill_(fill)
        buf.seq_lens_cpu[:raw].copy_(torch.tensor(lens))
        buf.out_cache_loc[: raw * steps].copy_(loc)
        _, captured, _ = graphs_by_bs[max_bs]
        view = SimpleNamespace(**vars(captured), num_padding=max_bs - raw)
        view.seq_lens_sum = sum(lens) + (max_bs - raw) * fill
        md.init_forward_metadata_out_graph(view)
        outs = replay_as_sglang(graphs_by_bs[max_bs], draft_forward)
    per_step = per_step_draft_out_cache_loc(loc, raw, 1, steps)
    for at, layer in enumerate(layers()):
        q, k, v = ([qkv[(layer.layer_id, i)][j][:raw].cpu() for i in range(steps - 1)] for j in range(3))
        for i in range(steps - 1):
            out = outs[i][at].cpu()
            want = want_draft_step(layer, hist, rows, lens, i, q, k, v)
            assert_close(out[:raw].view(raw, HQ, -1), want, name=f"draft step {i} layer {layer.layer_id}")
            assert torch.isfinite(out[raw:]).all(), "padded request"
            # the step's K/V went to the pools at its draft slots (SWA ones translated)
            kb, _ = pool.get_kv_buffer(layer.layer_id)
            slots = per_step[i] if layer.sliding_window_size < 0 else pool.translate_loc_from_full_to_swa(per_step[i])
            assert torch.equal(kb[slots.long()].cpu(), k[i]), f"layer {layer.layer_id} step {i}: the draft's K/V not at its slots"


@pytest.mark.parametrize("mode", ["FULL_MASK", "QLEN_ONLY"])
def test_eager_verify_takes_an_oversized_mask_and_names_a_short_one(mode, monkeypatch):
    """SGLang sizes an eager verify mask ``bs * max_context_len`` per draft when ``seq_lens_sum`` is
    unknown: the blocks lead, the tail is ignored. A mask too short for the batch is refused, named.
    In both of SGLang's layouts: FULL_MASK (its GPU default) and QLEN_ONLY (its CPU default, which its
    EAGLE and NGRAM workers then build)."""
    from sglang.srt.speculative import eagle_utils
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    monkeypatch.setattr(eagle_utils, "default_tree_mask_mode", lambda: eagle_utils.TreeMaskMode[mode])

    g = torch.Generator().manual_seed(32)
    pool, alloc, rtp, rows, lens = drifted_state(g, rows_n=2, lens=(14, 10))
    hist = write_history(pool, rtp, rows, lens, layers(), g)
    evict(alloc, rtp, rows, lens)
    backend = TritonSWASGLangBackend(runner(pool, alloc, rtp, algo=A.EAGLE))
    n = 3
    loc = place(alloc, rtp, rows, lens, [n] * 2)
    layout, blocks = verify_mask_blocks(lens, n, g, tree=True, qlen=mode == "QLEN_ONLY")
    positions = torch.cat([p + torch.arange(n) for p in lens]).to(DEV)

    def batch(mask):
        spec = EagleVerifyInput(
            draft_token=None, custom_mask=mask.to(DEV), positions=positions, retrieve_index=None, retrieve_next_token=None,
            retrieve_next_sibling=None, retrieve_cum_len=None, spec_steps=n - 1, topk=2, draft_token_num=n,
            capture_hidden_mode=None, seq_lens_sum=None, seq_lens_cpu=None,
        )  # fmt: skip
        return sgl_batch(ForwardMode.TARGET_VERIFY, rows, lens, [0, 0], loc, positions=positions, spec_info=spec, spec_algorithm=A.EAGLE)

    oversized = torch.cat([layout, torch.ones(2 * n * 64 - layout.numel(), dtype=torch.bool)])
    fb = batch(oversized)
    backend.init_forward_metadata(fb)
    with forward_context(ForwardContext(attn_backend=backend)):
        for layer in layers():
            q, k, v = rand_qkv(layer, 2 * n, g)
            out = call(layer, q, k, v, fb, save_kv_cache=True)
            assert_close(out.view(2 * n, HQ, -1), want_verify(layer, hist, rows, lens, n, q, k, v, blocks), name=f"layer {layer.layer_id}")
    short = layout.numel() - 1
    with pytest.raises(ValueError, match=rf"custom_mask has {short} entries, fewer than the {layout.numel()} "):
        backend.init_forward_metadata(batch(layout[:short]))


def test_gemma_image_tokens_attend_bidirectionally():
    """Gemma 3 / 4 prefill with images: SGLang's ``prepare_attn_masks`` of those models (through the
    plugin's hook) has the backend let each image's tokens see one another when the whole image is
    in the chunk; text stays causal, a split image stays causal, and the window still holds."""
    from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem, MultimodalInputs

    from triton_swa.integrations.sglang import _image_masks

    g = torch.Generator().manual_seed(33)
    pool, alloc, rtp, rows, lens = drifted_state(g, rows_n=2, lens=(4, 6))
    hist = write_history(pool, rtp, rows, lens, layers(), g)
    new = [9, 7]
    loc = place(alloc, rtp, rows, lens, new)
    # request 0: an image at absolute positions 6..9 (inside the chunk 4..12); request 1: one at 3..7,
    # begun in the cached prefix (split: stays causal), one at 8..10
    mm = [
        MultimodalInputs(mm_items=[MultimodalDataItem(modality=Modality.IMAGE, offsets=[(6, 9)])]),
        MultimodalInputs(mm_items=[MultimodalDataItem(modality=Modality.IMAGE, offsets=[(3, 7), (8, 10)])]),
    ]
    fb = sgl_batch(ForwardMode.EXTEND, rows, lens, new, loc, mm_inputs=mm)
    backend = TritonSWASGLangBackend(runner(pool, alloc, rtp))
    backend.init_forward_metadata(fb)
    with forward_context(ForwardContext(attn_backend=backend)):
        _image_masks(lambda *a: pytest.fail("the hook called SGLang's Triton-only mask builder"), None, fb, None, torch.bool)
        blocks = []
        for p, e, spans in zip(lens, new, ([(6, 9)], [(8, 10)])):
            block = torch.ones(e, e).tril().bool()
            for b, end in spans:
                block[b - p : end + 1 - p, b - p : end + 1 - p] = True
            blocks.append(block)
        for layer in layers():
            q, k, v = rand_qkv(layer, sum(new), g)
            out = call(layer, q, k, v, fb).view(sum(new), HQ, -1)
            want, at = [], 0
            for i, (r, p, e) in enumerate(zip(rows, lens, new)):
                kp, vp = hist[(layer.layer_id, r)]
                s = slice(at, at + e)
                q_pos, k_pos = torch.arange(p, p + e), torch.arange(p + e)
                win = layer.sliding_window_size
                mask = torch.cat(
                    [ref.window_mask(q_pos, k_pos[:p], win), ref.window_mask(q_pos, k_pos[p:], win, causal=False) & blocks[i]], 1
                )
                want.append(ref.attention(q[s], torch.cat([kp[:p], k[s]]), torch.cat([vp[:p], v[s]]), mask, sm_scale=layer.scaling))
                at += e
            assert_close(out, torch.cat(want), name=f"layer {layer.layer_id}")


def test_breakable_prefill_graph_capture_batch_runs_eagerly():
    """SGLang's default prefill graph mode (``breakable``) builds attention metadata eagerly with
    ``init_forward_metadata`` and runs attention outside its captured segments, over a capture batch
    laid out as its runner lays it (EXTEND; request slots ``arange(bs)`` from row 0, the unused ones
    of length 0; no prefix; ``out_cache_loc`` from its zeroed slot buffer): the batch runs, the used
    request's rows equal the reference, and the writes land in the dummy slot only."""
    g = torch.Generator().manual_seed(34)
    pool, alloc, rtp, rows, lens = drifted_state(g)
    backend = TritonSWASGLangBackend(runner(pool, alloc, rtp))
    capture_lens = [6, 0, 0]
    t = sum(capture_lens)
    fb = sgl_batch(
        ForwardMode.EXTEND, list(range(3)), [0, 0, 0], capture_lens, torch.zeros(t, dtype=torch.int64, device=DEV),
        req_pool_indices=torch.arange(3, device=DEV),
    )  # fmt: skip
    before = [pool.get_key_buffer(layer.layer_id).clone() for layer in layers()]
    backend.init_forward_metadata(fb)
    with forward_context(ForwardContext(attn_backend=backend)):
        for layer, buf in zip(layers(), before):
            q, k, v = rand_qkv(layer, t, g)
            out = call(layer, q, k, v, fb).view(t, HQ, -1)
            hist = {(layer.layer_id, 0): (k[:0], v[:0])}
            assert_close(out, want_extend(layer, hist, [0], [0], [t], q, k, v), name=f"layer {layer.layer_id}")
            after = pool.get_key_buffer(layer.layer_id)
            assert torch.equal(after[1:], buf[1:]), "a capture-batch write left the dummy slot"
