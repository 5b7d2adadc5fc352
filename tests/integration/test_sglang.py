"""SGLang tier: triton-swa against SGLang 0.5.23's own classes (``bash scripts/setup_sglang.sh`` installs it).

- The pool-resolution policy agrees with SGLang's own resolvers (``FlashInferAttnBackend`` and
  ``TRTLLMHAAttnBackend._resolve_swa_kv_pool``) on every case of docs/contract.md §3, on SGLang's real pools.
- The backend over SGLang's real ``SWAKVPool``, ``SWATokenToKVPoolAllocator`` and ``ReqToTokenPool``,
  with K/V written by SGLang's own ``set_kv_buffer`` and layers that are SGLang's ``RadixAttention``,
  reads the right K/V in its sliding layers once SWA slots differ from full slots (it read
  ``swa_buffer[full_slot]`` when the policy recognised only triton-swa's own pool class).

The whole module is skipped, saying so, when SGLang is not installed.
"""

from __future__ import annotations

import os
import random
from unittest.mock import MagicMock

import pytest
import torch

import triton_swa_reference as ref

pytest.importorskip(
    "sglang.srt.mem_cache.swa_memory_pool", reason="SGLang tier: sglang 0.5.23 is not installed (bash scripts/setup_sglang.sh installs it)"
)

from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend  # noqa: E402
from sglang.srt.layers.attention.trtllm_mha_backend import TRTLLMHAAttnBackend  # noqa: E402
from sglang.srt.layers.radix_attention import RadixAttention  # noqa: E402
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator  # noqa: E402
from sglang.srt.mem_cache.memory_pool import KVWriteLoc, MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

from triton_swa.backend import TritonSWAAttnBackend  # noqa: E402
from triton_swa.engine import ForwardBatch, ForwardMode, ModelRunner  # noqa: E402
from triton_swa.testing import assert_close, launch_key  # noqa: E402

pytestmark = pytest.mark.sglang

HQ, H_SWA, D_SWA, H_FULL, D_FULL = 4, 2, 16, 1, 32


def sglang_swa_pool(size=32, size_swa=16, page_size=1, device="cpu"):
    return SWAKVPool(
        size=size,
        size_swa=size_swa,
        page_size=page_size,
        dtype=torch.float32,
        head_num=H_FULL,
        head_dim=D_FULL,
        swa_attention_layer_ids=[0],
        full_attention_layer_ids=[1],
        device=device,
        enable_memory_saver=False,
        swa_head_num=H_SWA,
        swa_head_dim=D_SWA,
        swa_v_head_dim=D_SWA,
    )


def sglang_batch(alloc, rtp, rows, prefix, new, mode, device="cpu"):
    """SGLang's ``ForwardBatch`` of requests ``rows`` extending their ``prefix`` cached tokens by ``new``
    (slots allocated by ``alloc``, written to ``req_to_token``); returns it and the new lengths."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch as SGLBatch

    t = sum(new)
    loc = alloc.alloc(t)
    at = 0
    for r, p, m in zip(rows, prefix, new):
        rtp.req_to_token[r, p : p + m] = loc[at : at + m].to(torch.int32)
        at += m
    lens = [p + m for p, m in zip(prefix, new)]
    on = dict(device=device)
    fb = SGLBatch(
        forward_mode=mode,
        batch_size=len(rows),
        input_ids=torch.zeros(t, dtype=torch.long, **on),
        req_pool_indices=torch.tensor(rows, **on),
        seq_lens=torch.tensor(lens, **on),
        out_cache_loc=loc,
        seq_lens_sum=sum(lens),
        seq_lens_cpu=torch.tensor(lens),
        extend_prefix_lens=torch.tensor(prefix, **on),
        extend_prefix_lens_cpu=list(prefix),
        extend_seq_lens=torch.tensor(new, **on),
        extend_seq_lens_cpu=list(new),
        extend_num_tokens=t,
        spec_algorithm=A.NONE,
    )
    return fb, lens


def sglang_plain_pool(device="cpu"):
    return MHATokenToKVPool(32, 1, torch.float32, H_FULL, D_FULL, 2, device, False)


A = SpeculativeAlgorithm
# docs/contract.md §3: (active pool, draft worker, algorithm, allocator's kvcache, expected)
CASES = [
    pytest.param("swa", False, A.NONE, "plain", "active", id="swa-active"),
    pytest.param("plain", False, A.NONE, "swa", "allocator", id="plain-active-swa-allocator"),
    pytest.param("plain", False, A.NONE, "plain", None, id="all-plain"),
    pytest.param("plain", True, A.EAGLE, "swa", None, id="eagle-draft"),
    pytest.param("plain", True, A.FROZEN_KV_MTP, "swa", "allocator", id="frozen-kv-mtp-draft"),
    pytest.param("plain", False, A.EAGLE, "swa", "allocator", id="eagle-target"),
    pytest.param("swa", True, A.DFLASH, "plain", "active", id="dflash-draft"),
    pytest.param("swa", True, A.EAGLE, "swa", "active", id="swa-active-eagle-draft"),
    pytest.param("plain", True, A.FROZEN_KV_MTP, "plain", None, id="frozen-kv-mtp-plain"),
]


@pytest.mark.parametrize("active_kind, draft, algo, alloc_kind, want", CASES)
def test_policy_agrees_with_sglangs_resolvers(active_kind, draft, algo, alloc_kind, want, device):
    pools = {"swa": sglang_swa_pool(device=device), "plain": sglang_plain_pool(device)}
    active = pools[active_kind]
    kvcache = (
        pools[alloc_kind]
        if alloc_kind != active_kind
        else (sglang_swa_pool(device=device) if alloc_kind == "swa" else sglang_plain_pool(device))
    )
    runner = MagicMock()
    runner.token_to_kv_pool, runner.is_draft_worker, runner.spec_algorithm = active, draft, algo
    runner.token_to_kv_pool_allocator.get_kvcache.return_value = kvcache
    expected = {"active": active, "allocator": kvcache, None: None}[want]
    ours = TritonSWAAttnBackend._resolve_swa_kv_pool(runner)
    flashinfer = FlashInferAttnBackend._resolve_swa_kv_pool(runner)
    trtllm = TRTLLMHAAttnBackend._resolve_swa_kv_pool(runner)
    assert flashinfer is expected and trtllm is expected, "SGLang's resolvers disagree with docs/contract.md §3"
    assert ours is expected, f"triton-swa resolved {type(ours).__name__}, SGLang {type(expected).__name__}"


def decode_and_check(backend, batch, layers, hist, rows, g, name):
    """One decode step of every layer through ``backend``; each request's output against dense
    windowed attention over its history (``hist[(layer_id, row)] = (k, v)``, on the host) plus the
    new token."""
    device = batch.seq_lens.device
    backend.init_forward_metadata(batch)
    for layer in layers:
        q = torch.randn(len(rows), HQ, layer.head_dim, generator=g)
        k = torch.randn(len(rows), layer.tp_k_head_num, layer.head_dim, generator=g)
        v = torch.randn(len(rows), layer.tp_k_head_num, layer.v_head_dim, generator=g)
        out = backend.forward(q.to(device), k.to(device), v.to(device), layer, batch)
        out = out.reshape(len(rows), HQ, layer.v_head_dim).cpu()
        for i, r in enumerate(rows):
            kp, vp = hist[(layer.layer_id, r)]
            kk, vv = torch.cat([kp, k[i : i + 1]]), torch.cat([vp, v[i : i + 1]])
            pos = torch.arange(len(kk))
            mask = ref.window_mask(pos[-1:], pos, layer.sliding_window_size)
            assert_close(
                out[i : i + 1],
                ref.attention(q[i : i + 1], kk, vv, mask, sm_scale=layer.scaling),
                name=f"{name} layer {layer.layer_id} request {i}",
            )


def test_sliding_layer_reads_the_right_kv_over_sglangs_pools(device):
    """Decode of a sliding and a full layer over SGLang's real pools, K/V written by SGLang itself."""
    w = 3
    g = torch.Generator().manual_seed(0)
    pool = sglang_swa_pool(device=device)
    alloc = SWATokenToKVPoolAllocator(32, 16, 1, torch.float32, device, pool, False)
    rtp = ReqToTokenPool(4, 64, device, False)
    rows = rtp.alloc_rows(2)
    layers = [RadixAttention(HQ, D_SWA, D_SWA**-0.5, H_SWA, 0, sliding_window_size=w), RadixAttention(HQ, D_FULL, D_FULL**-0.5, H_FULL, 1)]
    hist = {(layer.layer_id, r): ([], []) for layer in layers for r in rows}

    def prefill(row, n):
        full = alloc.alloc(n)
        rtp.req_to_token[row, :n] = full.to(torch.int32)
        swa = pool.translate_loc_from_full_to_swa(full)
        for layer in layers:
            k = torch.randn(n, layer.tp_k_head_num, layer.head_dim, generator=g)
            v = torch.randn(n, layer.tp_k_head_num, layer.v_head_dim, generator=g)
            pool.set_kv_buffer(layer, KVWriteLoc(full, swa_loc=swa), k.to(device), v.to(device))
            hist[(layer.layer_id, row)][0].extend(k)
            hist[(layer.layer_id, row)][1].extend(v)
        return full

    first = prefill(rows[0], 12)
    alloc.free_swa(first[:8])  # the window has slid past request 0's first 8 tokens: SGLang's eviction
    prefill(rows[1], 10)
    lens = [12, 10]
    live = torch.cat([rtp.req_to_token[r, :n].long() for r, n in zip(rows, lens)])
    swa_live = pool.translate_loc_from_full_to_swa(live)
    assert not torch.equal(swa_live[swa_live > 0], live[swa_live > 0]), "SWA slots must differ from full slots"

    runner = ModelRunner(pool, alloc, rtp, sliding_window_size=w, device=device)
    backend = TritonSWAAttnBackend(runner)
    assert backend._swa_kv_pool is pool, "SGLang's SWAKVPool must be resolved"
    loc = alloc.alloc(2)
    for r, n, slot in zip(rows, lens, loc.tolist()):
        rtp.req_to_token[r, n] = slot
    seq = torch.tensor(lens) + 1
    batch = ForwardBatch(ForwardMode.DECODE, 2, torch.tensor(rows, device=device), seq.to(device), loc, seq_lens_cpu=seq)
    decode_and_check(backend, batch, layers, {key: (torch.stack(k), torch.stack(v)) for key, (k, v) in hist.items()}, rows, g, "P1")


# ----- the registered SGLang backend ------------------------------------------------------------------


def test_register_puts_the_backend_in_sglangs_registry_and_choices(device):
    from sglang.srt.arg_groups import choices
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

    from triton_swa.integrations.sglang import TritonSWASGLangBackend, register

    register()
    register()  # idempotent
    assert "triton_swa" in choices.ATTENTION_BACKEND_CHOICES and "triton_swa" in choices.DRAFT_ATTENTION_BACKEND_CHOICES
    assert choices.ATTENTION_BACKEND_CHOICES.count("triton_swa") == 1
    pool = sglang_swa_pool(device=device)
    alloc = SWATokenToKVPoolAllocator(32, 16, 1, torch.float32, device, pool, False)
    runner = MagicMock()
    runner.token_to_kv_pool, runner.token_to_kv_pool_allocator = pool, alloc
    runner.req_to_token_pool = ReqToTokenPool(4, 64, device, False)
    runner.is_draft_worker, runner.spec_algorithm, runner.sliding_window_size, runner.device = False, A.NONE, 3, device
    runner.kv_index_translator = KVIndexTranslator(
        req_to_token=runner.req_to_token_pool.req_to_token,
        token_to_kv_pool_allocator=alloc,
        token_to_kv_pool=pool,
        page_size=1,
        device=device,
    )
    backend = ATTENTION_BACKENDS["triton_swa"](runner)
    assert isinstance(backend, AttentionBackend) and isinstance(backend, TritonSWASGLangBackend)
    assert backend.token_to_kv_pool is pool and backend.core._swa_kv_pool is pool
    assert backend.get_cuda_graph_seq_len_fill_value() == 1


def test_register_dumps_stacks_on_a_timer_only_when_asked(monkeypatch, capsys):
    """TRITON_SWA_DUMP_STACKS_S (a diagnostic) starts one stack-dump thread in the process that
    registers, which writes the other threads' Python stacks to stderr on its timer (the function a
    thread waits in is named); unset, nothing starts; a value that is not seconds above 0 is refused,
    named."""
    import threading
    import time

    from triton_swa.integrations import sglang as plugin

    monkeypatch.setattr(plugin, "_stack_dumps", {})
    monkeypatch.delenv("TRITON_SWA_DUMP_STACKS_S", raising=False)
    plugin.register()
    assert plugin._stack_dumps == {}
    for bad in ("0", "-2", "soon", "nan", "inf"):
        monkeypatch.setenv("TRITON_SWA_DUMP_STACKS_S", bad)
        with pytest.raises(ValueError, match="TRITON_SWA_DUMP_STACKS_S must be a number of seconds above 0"):
            plugin.register()
    monkeypatch.setenv("TRITON_SWA_DUMP_STACKS_S", "0.05")
    plugin.register()
    plugin.register()  # one thread per process
    try:
        assert [t.name for t in threading.enumerate()].count("triton_swa-stack-dump") == 1

        def waiting_in_this_function():
            time.sleep(0.4)

        waiting_in_this_function()
    finally:
        plugin._stack_dumps[os.getpid()].set()
    err = capsys.readouterr().err
    assert "triton_swa: Python stacks of process" in err and "in waiting_in_this_function" in err


def test_the_plugin_entry_point_names_register():
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "triton_swa"]
    assert eps, "pyproject.toml's sglang.srt.plugins entry point is not installed"
    from triton_swa.integrations.sglang import register

    assert eps[0].load() is register


@pytest.mark.parametrize("precompiled", [False, True], ids=["plain", "after-precompile"])
def test_sglang_forward_batch_and_radix_attention_through_the_backend(device, precompiled, monkeypatch):
    """Prefill (EXTEND), then DECODE, driven the way SGLang drives a backend: SGLang's ForwardBatch and
    RadixAttention.forward under its forward context; a KV-shared layer (k = v = None, the shared
    layer's id) and sinks passed as a keyword. Every output against the float64 reference. After
    ``precompile_extend`` (its compile step stubbed: nothing compiles here) the same holds, and the
    synthetic steps it planned wrote nothing to the pools."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode as SGLMode
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    from triton_swa.integrations.sglang import TritonSWASGLangBackend

    w = 3
    g = torch.Generator().manual_seed(1)
    pool = sglang_swa_pool(size=64, size_swa=32, device=device)
    alloc = SWATokenToKVPoolAllocator(64, 32, 1, torch.float32, device, pool, False)
    rtp = ReqToTokenPool(4, 64, device, False)
    rows = rtp.alloc_rows(2)
    runner = ModelRunner(pool, alloc, rtp, sliding_window_size=w, device=device)
    backend = TritonSWASGLangBackend(runner)
    sliding = RadixAttention(HQ, D_SWA, D_SWA**-0.5, H_SWA, 0, sliding_window_size=w)
    full = RadixAttention(HQ, D_FULL, D_FULL**-0.5, H_FULL, 1)
    sinks = torch.randn(HQ, generator=g)
    hist = {(l, r): ([], []) for l in (0, 1) for r in rows}
    if precompiled:
        import triton_swa.runtime.launch as launch

        recorded = []
        monkeypatch.setattr(launch, "precompile", lambda launches, dev, jobs: (recorded.extend(launches), (0, []))[1])
        before = [buf.clone() for l in (0, 1) for buf in (pool.get_key_buffer(l), pool.get_value_buffer(l))]
        summary = backend.precompile_extend([sliding, full], tokens=6, dtype=torch.float32, kv_shared=True, draft_tokens=2)
        after = [buf for l in (0, 1) for buf in (pool.get_key_buffer(l), pool.get_value_buffer(l))]
        assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(before, after)), "precompiling wrote the pools"
        assert recorded and "prefills of 6 tokens, draft extends of 2;" in summary, summary
        assert "refused" not in summary, summary
        # a context too short for any draft-extend prefix (64 columns, 60 drafts): the prefills alone
        recorded.clear()
        summary = backend.precompile_extend([sliding, full], tokens=6, dtype=torch.float32, draft_tokens=60)
        assert recorded and "(" in summary and " 2 synthetic step(s)" in summary, summary
        assert backend.forward_metadata is None and not backend.core._layer_plans

    def check(layer, q, out, new, lens, use_sinks):
        at = 0
        for i, r in enumerate(rows):
            ks, vs = hist[(layer.layer_id, r)]
            kk, vv = torch.stack(ks), torch.stack(vs)
            pos = torch.arange(len(kk))
            q_pos = pos[lens[i] - new[i] : lens[i]]
            mask = ref.window_mask(q_pos, pos, layer.sliding_window_size)
            want = ref.attention(q[at : at + new[i]], kk, vv, mask, sm_scale=layer.scaling, sinks=sinks if use_sinks else None)
            assert_close(out[at : at + new[i]].reshape(-1, HQ, layer.v_head_dim).cpu(), want, name=f"layer {layer.layer_id} request {i}")
            at += new[i]

    def step(mode, new, prefix):
        t = sum(new)
        fb, lens = sglang_batch(alloc, rtp, rows, prefix, new, mode, device)
        backend.init_forward_metadata(fb)
        with forward_context(ForwardContext(attn_backend=backend)):
            for layer, use_sinks in ((sliding, True), (full, False)):
                q = torch.randn(t, HQ * layer.head_dim, generator=g)
                k = torch.randn(t, layer.tp_k_head_num * layer.head_dim, generator=g)
                v = torch.randn(t, layer.tp_k_head_num * layer.v_head_dim, generator=g)
                at = 0
                for i, r in enumerate(rows):
                    hist[(layer.layer_id, r)][0].extend(k[at : at + new[i]].view(-1, layer.tp_k_head_num, layer.head_dim))
                    hist[(layer.layer_id, r)][1].extend(v[at : at + new[i]].view(-1, layer.tp_k_head_num, layer.v_head_dim))
                    at += new[i]
                kw = {"sinks": sinks.to(device)} if use_sinks else {}
                out = layer(q.to(device), k.to(device), v.to(device), fb, **kw)
                check(layer, q.view(t, HQ, -1), out, new, lens, use_sinks)
                if layer is sliding:
                    # Gemma 4's KV-shared convention: the shared layer's id, no K/V, nothing saved
                    shared = layer(q.to(device), None, None, fb, save_kv_cache=False, **kw)
                    assert torch.equal(shared, out), "a KV-shared call must read the K/V the layer wrote"
        return lens

    lens = step(SGLMode.EXTEND, [7, 5], [0, 0])
    alloc.free_swa(torch.cat([rtp.req_to_token[r, : n - w - 1].long() for r, n in zip(rows, lens)]))  # eviction
    lens = step(SGLMode.DECODE, [1, 1], lens)
    # SGLang's stock float pools: the decode kernel wrote the sliding and the full layer's K/V itself
    # (at the SWA write ids and out_cache_loc), which the outputs above and the KV-shared read checked
    assert sum(run.fused_store for run in backend.core.forward_metadata.runs.values()) == 2
    lens = step(SGLMode.EXTEND, [3, 4], lens)  # chunked prefill over the cached window


def write_prefix(pool, layers, row, full, g, hist):
    """Random K/V of every layer at the full slots ``full`` (a request's committed prefix), written by
    SGLang's own ``set_kv_buffer``; kept on the host in ``hist[(layer_id, row)] = (k, v)``."""
    n = full.numel()
    for layer in layers:
        k = torch.randn(n, layer.tp_k_head_num, layer.head_dim, generator=g)
        v = torch.randn(n, layer.tp_k_head_num, layer.v_head_dim, generator=g)
        pool.set_kv_buffer(layer, KVWriteLoc(full, swa_loc=pool.translate_loc_from_full_to_swa(full)), k.to(full.device), v.to(full.device))
        hist[(layer.layer_id, row)] = (k, v)


@pytest.mark.parametrize("kind", ["dflash-chain", "eagle-tree", "eagle-tree-filled-after-plan"])
def test_target_verify_with_sglangs_verify_inputs(kind, device):
    """TARGET_VERIFY with SGLang's DFlashVerifyInput (a chain, no mask) or EagleVerifyInput (a tree:
    SGLang's mask spans each request's prefix plus its drafts, positions sit at prefix + depth),
    through RadixAttention.forward; sliding and full layers against the float64 reference. The
    last case plans the step before the draft fills the mask and positions (SGLang's overlapped
    EAGLE plan), then calls update_verify_buffers_to_fill_after_draft."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch as SGLBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode as SGLMode
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    from triton_swa.integrations.sglang import TritonSWASGLangBackend

    w, n = 3, 4
    g = torch.Generator().manual_seed(2)
    on = dict(device=device)
    pool = sglang_swa_pool(size=64, size_swa=32, device=device)
    alloc = SWATokenToKVPoolAllocator(64, 32, 1, torch.float32, device, pool, False)
    rtp = ReqToTokenPool(4, 64, device, False)
    rows = rtp.alloc_rows(2)
    backend = TritonSWASGLangBackend(ModelRunner(pool, alloc, rtp, sliding_window_size=w, device=device))
    layers = [RadixAttention(HQ, D_SWA, D_SWA**-0.5, H_SWA, 0, sliding_window_size=w), RadixAttention(HQ, D_FULL, D_FULL**-0.5, H_FULL, 1)]
    prefix = [9, 6]
    hist = {}
    for r, p in zip(rows, prefix):  # the committed prefixes, written by SGLang's own set_kv_buffer
        full = alloc.alloc(p)
        rtp.req_to_token[r, :p] = full.to(torch.int32)
        write_prefix(pool, layers, r, full, g, hist)
    tree = kind.startswith("eagle-tree")
    parents = [-1, 0, 1, 0] if tree else [-1, 0, 1, 2]
    depth = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    anc = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            anc[i] |= anc[p]
    loc = alloc.alloc(2 * n)
    for i, (r, p) in enumerate(zip(rows, prefix)):
        rtp.req_to_token[r, p : p + n] = loc[i * n : (i + 1) * n].to(torch.int32)
    positions = torch.cat([p + torch.tensor(depth) for p in prefix]).to(device)
    if tree:
        mask = torch.cat([torch.cat([torch.ones(n, p, dtype=torch.bool), anc], 1).reshape(-1) for p in prefix]).to(device)
        z = torch.zeros(1, dtype=torch.long, **on)
        spec = EagleVerifyInput(
            draft_token=torch.zeros(2 * n, dtype=torch.long, **on),
            custom_mask=mask,
            positions=positions,
            retrieve_index=z,
            retrieve_next_token=z,
            retrieve_next_sibling=z,
            retrieve_cum_len=z,
            spec_steps=3,
            topk=2,
            draft_token_num=n,
            capture_hidden_mode=None,
            seq_lens_sum=sum(prefix),
            seq_lens_cpu=torch.tensor(prefix),
        )
    else:
        spec = DFlashVerifyInput(draft_token=torch.zeros(2 * n, dtype=torch.long, **on), positions=positions, draft_token_num=n)
    fb = SGLBatch(
        forward_mode=SGLMode.TARGET_VERIFY,
        batch_size=2,
        input_ids=torch.zeros(2 * n, dtype=torch.long, **on),
        req_pool_indices=torch.tensor(rows, **on),
        seq_lens=torch.tensor(prefix, **on),
        out_cache_loc=loc,
        seq_lens_sum=sum(prefix),
        seq_lens_cpu=torch.tensor(prefix),
        positions=positions,
        spec_info=spec,
        spec_algorithm=A.EAGLE if tree else A.DFLASH,
    )
    if kind == "eagle-tree-filled-after-plan":
        filled_mask, filled_positions = mask.clone(), positions.clone()
        mask.fill_(True)
        positions.zero_()
        backend.init_forward_metadata(fb)
        mask.copy_(filled_mask)  # the draft fills SGLang's buffers in place
        positions.copy_(filled_positions)
        backend.update_verify_buffers_to_fill_after_draft(spec, None)
    else:
        backend.init_forward_metadata(fb)
    with forward_context(ForwardContext(attn_backend=backend)):
        for layer in layers:
            q = torch.randn(2 * n, HQ * layer.head_dim, generator=g)
            k = torch.randn(2 * n, layer.tp_k_head_num * layer.head_dim, generator=g)
            v = torch.randn(2 * n, layer.tp_k_head_num * layer.v_head_dim, generator=g)
            out = layer(q.to(device), k.to(device), v.to(device), fb).reshape(2 * n, HQ, layer.v_head_dim).cpu()
            for i, (r, p) in enumerate(zip(rows, prefix)):
                kp, vp = hist[(layer.layer_id, r)]
                kk = torch.cat([kp, k[i * n : (i + 1) * n].view(n, layer.tp_k_head_num, layer.head_dim)])
                vv = torch.cat([vp, v[i * n : (i + 1) * n].view(n, layer.tp_k_head_num, layer.v_head_dim)])
                q_pos = p + torch.tensor(depth)
                win = layer.sliding_window_size
                m = torch.cat([ref.window_mask(q_pos, torch.arange(p), win), ref.window_mask(q_pos, q_pos, win, causal=False) & anc], 1)
                want = ref.attention(q[i * n : (i + 1) * n].view(n, HQ, layer.head_dim), kk, vv, m, sm_scale=layer.scaling)
                assert_close(out[i * n : (i + 1) * n], want, name=f"{kind} layer {layer.layer_id} request {i}")


def test_page_16_decode_over_sglangs_paged_allocator(device):
    """Page size 16: SGLang's paged SWA allocator (lockstep in-page offsets) and whole-page free_swa;
    the backend's page tables of sliding layers read the right K/V."""
    w, ps = 20, 16
    g = torch.Generator().manual_seed(3)
    on = dict(device=device)
    pool = sglang_swa_pool(size=256, size_swa=128, page_size=ps, device=device)
    alloc = SWATokenToKVPoolAllocator(256, 128, ps, torch.float32, device, pool, False)
    rtp = ReqToTokenPool(4, 128, device, False)
    rows = rtp.alloc_rows(2)
    layers = [RadixAttention(HQ, D_SWA, D_SWA**-0.5, H_SWA, 0, sliding_window_size=w), RadixAttention(HQ, D_FULL, D_FULL**-0.5, H_FULL, 1)]
    hist = {}
    lens = [70, 37]
    for r, n in zip(rows, lens):
        t = torch.tensor([n])
        full = alloc.alloc_extend(torch.tensor([0], **on), torch.tensor([0]), t.to(device), t, torch.tensor([-1], **on), n)
        rtp.req_to_token[r, :n] = full.to(torch.int32)
        write_prefix(pool, layers, r, full, g, hist)
    # SGLang's eviction of the first request's out-of-window pages (whole pages)
    alloc.free_swa(rtp.req_to_token[rows[0], : (lens[0] - w) // ps * ps].long())
    seq = torch.tensor(lens) + 1
    last = torch.stack([rtp.req_to_token[r, n - 1].long() for r, n in zip(rows, lens)])
    loc = alloc.alloc_decode(seq.to(device), seq, last)
    for r, n, slot in zip(rows, lens, loc.tolist()):
        rtp.req_to_token[r, n] = slot
    backend = TritonSWAAttnBackend(ModelRunner(pool, alloc, rtp, sliding_window_size=w, page_size=ps, device=device))
    batch = ForwardBatch(ForwardMode.DECODE, 2, torch.tensor(rows, **on), seq.to(device), loc, seq_lens_cpu=seq)
    decode_and_check(backend, batch, layers, hist, rows, g, "P16")


def test_precompile_covers_every_kernel_that_prefills_then_launch(monkeypatch):
    """What ``precompile_extend`` compiles at a start is what later prefills launch: a fresh batch of
    two prompts, then the next chunk of each over its cached window, every layer with its K/V and as
    a KV-shared call. Planned as for an H100 (sm_90's tiles), bf16, launches recorded and not run."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode as SGLMode
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    import triton_swa.runtime.launch as launch
    from triton_swa.integrations.sglang import TritonSWASGLangBackend, attention_layers
    from triton_swa.runtime.device import TARGETS, planning_for

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # plan as compiled code plans (nothing is launched)
    warm = []
    monkeypatch.setattr(launch, "precompile", lambda launches, dev, jobs: (warm.extend(launches), (0, []))[1])
    w, dtype = 7, torch.bfloat16
    pool = SWAKVPool(
        size=512, size_swa=256, page_size=1, dtype=dtype, head_num=H_FULL, head_dim=D_FULL, swa_attention_layer_ids=[0],
        full_attention_layer_ids=[1], device="cpu", enable_memory_saver=False, swa_head_num=H_SWA, swa_head_dim=D_SWA,
        swa_v_head_dim=D_SWA,
    )  # fmt: skip
    alloc = SWATokenToKVPoolAllocator(512, 256, 1, dtype, "cpu", pool, False)
    rtp = ReqToTokenPool(4, 512, "cpu", False)
    rows = rtp.alloc_rows(2)
    model = torch.nn.Module()
    model.sliding = RadixAttention(HQ, D_SWA, D_SWA**-0.5, H_SWA, 0, sliding_window_size=w)
    model.full = RadixAttention(HQ, D_FULL, D_FULL**-0.5, H_FULL, 1)
    layers = attention_layers(model)
    assert layers == [model.sliding, model.full]
    with planning_for(TARGETS["sm_90"]):
        backend = TritonSWASGLangBackend(ModelRunner(pool, alloc, rtp, sliding_window_size=w, device="cpu"))
        backend.precompile_extend(layers, tokens=64, dtype=dtype, kv_shared=True)
        real = []
        lens = [0, 0]
        for new in ([40, 33], [30, 20]):  # a fresh batch, then each request's next chunk
            prefix, t = list(lens), sum(new)
            fb, lens = sglang_batch(alloc, rtp, rows, prefix, new, SGLMode.EXTEND)
            with launch.recorded_launches() as launches, forward_context(ForwardContext(attn_backend=backend)):
                backend.init_forward_metadata(fb)
                for layer in layers:
                    q = torch.zeros(t, HQ * layer.head_dim, dtype=dtype)
                    k = torch.zeros(t, layer.tp_k_head_num * layer.head_dim, dtype=dtype)
                    layer(q, k, k.clone(), fb)
                    layer(q, None, None, fb, save_kv_cache=False)
            real += launches
    attention = ("_swa_extend_kernel", "_swa_merge_kernel")
    want = {launch_key(*x[:4]) for x in real if getattr(x[0], "fn", x[0]).__name__ in attention}
    have = {launch_key(*x[:4]) for x in warm}
    assert len(want) >= 4, want  # two kinds of layer, each with its store and without
    assert want <= have, want - have


def test_precompile_covers_a_drafts_eager_extends(monkeypatch):
    """A draft's backend (EAGLE's ``draft_tokens``): what ``precompile_extend`` compiles covers the
    draft extends SGLang runs eagerly (DRAFT_EXTEND_V2: ``draft_tokens`` new tokens per request), at
    batch sizes and cached prefixes it did not plan, where the split-KV count changes with both, and
    with the lengths on the device only (SGLang's overlapped scheduling).
    Planned as for an H100 (sm_90), bf16, launches recorded and not run."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode as SGLMode
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    import triton_swa.runtime.launch as launch
    from triton_swa.integrations.sglang import TritonSWASGLangBackend
    from triton_swa.runtime.device import TARGETS, planning_for

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # plan as compiled code plans (nothing is launched)
    warm = []
    monkeypatch.setattr(launch, "precompile", lambda launches, dev, jobs: (warm.extend(launches), (0, []))[1])
    dtype, drafts, rows_n, context = torch.bfloat16, 4, 8, 4096
    pool = MHATokenToKVPool(4096, 1, dtype, H_FULL, D_FULL, 1, "cpu", False)
    alloc = TokenToKVPoolAllocator(4096, dtype, "cpu", pool, False)
    rtp = ReqToTokenPool(rows_n, context, "cpu", False)
    layer = RadixAttention(HQ, D_FULL, D_FULL**-0.5, H_FULL, 0)  # a one-layer draft, full attention
    rng = random.Random(5)
    with planning_for(TARGETS["sm_90"]):
        backend = TritonSWASGLangBackend(ModelRunner(pool, alloc, rtp, device="cpu"))
        backend.precompile_extend([layer], tokens=64, dtype=dtype, draft_tokens=drafts)
        real = []
        for bs in (1, 3, 5, 6, 8):
            for prefix_top in (20, 300, 3000, None):  # None: lengths on the device only (overlapped)
                alloc.clear()
                rows = list(range(bs))
                prefix = [rng.randint((prefix_top or 3000) // 2, prefix_top or 3000) for _ in rows]
                fb, _ = sglang_batch(alloc, rtp, rows, prefix, [drafts] * bs, SGLMode.DRAFT_EXTEND_V2)
                if prefix_top is None:
                    fb.extend_prefix_lens_cpu = fb.seq_lens_cpu = None
                with launch.recorded_launches() as launches, forward_context(ForwardContext(attn_backend=backend)):
                    backend.init_forward_metadata(fb)
                    q = torch.zeros(bs * drafts, HQ * D_FULL, dtype=dtype)
                    k = torch.zeros(bs * drafts, H_FULL * D_FULL, dtype=dtype)
                    layer(q, k, k.clone(), fb)
                real += launches
    attention = ("_swa_extend_kernel", "_swa_merge_kernel")
    want = {launch_key(*x[:4]) for x in real if getattr(x[0], "fn", x[0]).__name__ in attention}
    have = {launch_key(*x[:4]) for x in warm}
    assert any(getattr(x[0], "fn", x[0]).__name__ == "_swa_merge_kernel" for x in real), "no real batch took split-KV"
    assert want <= have, want - have


def test_the_draft_extends_precompiled_follow_the_runner():
    """Draft extends are planned for an EAGLE, EAGLE3 or STANDALONE draft runner, with SGLang's
    ``speculative_num_draft_tokens``; for a target, DFLASH's draft and NGRAM, none."""
    from triton_swa.integrations.sglang import _draft_extend_tokens

    def runner(algorithm, draft=True, tokens=4):
        return MagicMock(is_draft_worker=draft, spec_algorithm=A[algorithm], server_args=MagicMock(speculative_num_draft_tokens=tokens))

    assert [_draft_extend_tokens(runner(a)) for a in ("EAGLE", "EAGLE3", "STANDALONE")] == [4, 4, 4]
    assert [_draft_extend_tokens(runner(a)) for a in ("DFLASH", "NGRAM", "NONE")] == [0, 0, 0]
    assert _draft_extend_tokens(runner("EAGLE", draft=False)) == 0
    assert _draft_extend_tokens(runner("EAGLE", tokens=None)) == 0  # and SGLang's runtime settings not published here


def test_precompiling_at_start_never_stops_a_start(monkeypatch, caplog):
    """On a GPU the backend precompiles at construction: a failure there is a warning, not an error;
    ``TRITON_SWA_PRECOMPILE=0`` turns it off. Its arguments come from the runner: the chunk size, the
    model's dtype, its attention layers, and whether any layer is KV-shared (Gemma 4)."""
    import logging

    from triton_swa.integrations.sglang import TritonSWASGLangBackend

    pool = sglang_swa_pool()
    alloc = SWATokenToKVPoolAllocator(32, 16, 1, torch.float32, "cpu", pool, False)
    rtp = ReqToTokenPool(4, 64, "cpu", False)
    runner = ModelRunner(pool, alloc, rtp, sliding_window_size=3, device="cpu")
    backend = TritonSWASGLangBackend(runner)
    model = torch.nn.Module()
    model.attn = RadixAttention(HQ, D_SWA, D_SWA**-0.5, H_SWA, 0, sliding_window_size=3)
    model.shared = torch.nn.Module()
    model.shared.is_kv_shared_layer = True
    runner.model, runner.dtype = model, torch.bfloat16
    runner.server_args = MagicMock(chunked_prefill_size=4096)
    calls = []

    def fail(layers, **kw):
        calls.append((layers, kw))
        raise RuntimeError("no device")

    monkeypatch.setattr(backend, "precompile_extend", fail)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    backend.core.device = torch.device("cuda")  # as on a GPU (nothing runs: precompile_extend is stubbed)
    with caplog.at_level(logging.WARNING, logger="triton_swa.integrations.sglang"):
        backend._precompile_at_start(runner)
    assert calls == [([model.attn], dict(tokens=4096, dtype=torch.bfloat16, kv_shared=True, draft_tokens=0))]
    assert "precompiling the extend kernels failed (RuntimeError: no device); they compile at first use" in caplog.text
    backend._precompile_at_start(runner)  # once per model: a draft's several backends compile it once
    assert len(calls) == 1
    runner.model = model = torch.nn.Module()
    monkeypatch.setenv("TRITON_SWA_PRECOMPILE", "0")
    backend._precompile_at_start(runner)
    assert len(calls) == 1
