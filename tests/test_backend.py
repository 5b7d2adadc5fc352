"""The attention backend: the policy of docs/contract.md §3, and a model-level run against the reference path.

The model-level test drives a stack of random attention layers (sliding and full with different
head geometry, a KV-shared tail layer) through prefill, chunked prefill, decode and speculative
verify with rejected drafts, evicting out-of-window SWA slots after every step. Before each step
every pool slot that no layer may read is set to NaN; each layer's output is compared with dense
windowed attention over that request's own token history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from unittest.mock import MagicMock

import pytest
import torch

import triton_swa_reference as ref
from triton_swa import MHATokenToKVPool, ReqToTokenPool, SWAKVPool, SWATokenToKVPoolAllocator, TokenToKVPoolAllocator, evict_swa_window
from triton_swa.backend import TritonSWAAttnBackend
from triton_swa.engine import AttentionLayer, ForwardBatch, ForwardMode, ModelRunner, SpecInfo, SpeculativeAlgorithm
from triton_swa.testing import assert_close, legacy_backend, make_pool_state

# ----- policy ----------------------------------------------------------------------------------------


def _swa_pool(size=16, size_swa=16):
    return SWAKVPool(size, size_swa, 1, torch.float32, [0], [1], head_num=1, head_dim=8)


def _plain_pool(device="cpu"):
    return MHATokenToKVPool(16, 1, torch.float32, 1, 8, 2, device)


def _mock_runner(active, draft, algo, kvcache):
    r = MagicMock(spec=ModelRunner)
    r.token_to_kv_pool = active
    r.is_draft_worker = draft
    r.spec_algorithm = algo
    r.token_to_kv_pool_allocator = MagicMock()
    r.token_to_kv_pool_allocator.get_kvcache.return_value = kvcache
    r.req_to_token_pool = MagicMock()
    r.req_to_token_pool.req_to_token = torch.zeros(2, 8, dtype=torch.int32)
    r.sliding_window_size = 3
    r.device = "cpu"
    return r


A = SpeculativeAlgorithm
POLICY_CASES = [
    pytest.param("swa", False, A.NONE, None, "active", id="swa-active"),
    pytest.param("plain", False, A.NONE, "swa", "allocator", id="plain-active-swa-allocator"),
    pytest.param("plain", False, A.NONE, "plain", None, id="all-plain"),
    pytest.param("plain", True, A.EAGLE, "swa", None, id="eagle-draft"),
    pytest.param("plain", True, A.FROZEN_KV_MTP, "swa", "allocator", id="frozen-kv-mtp-draft"),
    pytest.param("plain", False, A.EAGLE, "swa", "allocator", id="eagle-target"),
    pytest.param("swa", True, A.DFLASH, "plain", "active", id="dflash-draft"),
    pytest.param("swa", True, A.EAGLE, "swa", "active", id="swa-active-eagle-draft"),
    pytest.param("plain", True, A.FROZEN_KV_MTP, "plain", None, id="frozen-kv-mtp-plain"),
]


@pytest.mark.reference
@pytest.mark.parametrize("active_kind, draft, algo, alloc_kind, want", POLICY_CASES)
@pytest.mark.parametrize("real_runner", [False, True], ids=["magicmock", "dataclass"])
def test_policy(active_kind, draft, algo, alloc_kind, want, real_runner):
    make = {"swa": _swa_pool, "plain": _plain_pool, None: lambda: None}
    active, kvcache = make[active_kind](), make[alloc_kind]()
    if real_runner:
        allocator = MagicMock()
        allocator.get_kvcache.return_value = kvcache
        runner = ModelRunner(active, allocator, ReqToTokenPool(1, 8), sliding_window_size=3, is_draft_worker=draft, spec_algorithm=algo)
    else:
        runner = _mock_runner(active, draft, algo, kvcache)
    backend = TritonSWAAttnBackend(runner)
    expected = {"active": active, "allocator": kvcache, None: None}[want]
    assert backend._swa_kv_pool is expected
    assert backend.use_sliding_window_kv_pool == (expected is not None)
    assert TritonSWAAttnBackend._resolve_swa_kv_pool(runner) is ref.resolve_swa_kv_pool(runner)


# ----- model-level simulation ------------------------------------------------------------------------

HQ = 4


def model_layers(window_left):
    return [
        AttentionLayer(0, HQ, 2, 16, sliding_window_size=window_left),
        AttentionLayer(1, HQ, 1, 32, v_head_dim=24, sliding_window_size=-1),
        AttentionLayer(2, HQ, 2, 16, sliding_window_size=window_left, logit_cap=4.0),
        AttentionLayer(3, HQ, 2, 16, sliding_window_size=window_left, kv_shared_layer_id=2),
    ]


@dataclass
class Sim:
    """The serving state plus each request's per-layer K/V history (position -> vectors)."""

    window_left: int
    page_size: int
    pool: SWAKVPool
    alloc: SWATokenToKVPoolAllocator
    rtp: ReqToTokenPool
    rows: list
    lens: list
    evicted: list
    hist: dict = field(default_factory=dict)  # (layer, row) -> (k list, v list)
    g: torch.Generator = None
    device: str = "cpu"

    def last_loc(self, i):
        n = self.lens[i]
        return int(self.rtp.req_to_token[self.rows[i], n - 1]) if n else -1

    def allocate(self, new):
        prefix = torch.tensor(self.lens, device=self.device)
        seq = prefix + torch.tensor(new, device=self.device)
        last = torch.tensor([self.last_loc(i) for i in range(len(self.rows))], device=self.device)
        slots = self.alloc.alloc_extend(prefix, seq, last, int(sum(new)))
        assert slots is not None, "simulation pools too small"
        at = 0
        for i, m in enumerate(new):
            self.rtp.req_to_token[self.rows[i], self.lens[i] : self.lens[i] + m] = slots[at : at + m].int()
            at += m
        return slots

    def poison(self):
        """NaN in every slot that no layer may read in the coming step (dummy slot 0 included)."""
        mapping = self.alloc.full_to_swa_index_mapping
        swa_live, full_live = [], []
        for r, n in zip(self.rows, self.lens):
            full = self.rtp.req_to_token[r, :n].long()
            full_live.append(full)
            start = ref.extend_window_start(n, self.window_left)
            swa_live.append(mapping[full[start:]])
        for sub, live in ((self.pool.swa_kv_pool, torch.cat(swa_live)), (self.pool.full_kv_pool, torch.cat(full_live))):
            dead = torch.ones(sub.k_buffer[0].shape[0], dtype=torch.bool, device=self.device)
            dead[live] = False
            for buf in sub.k_buffer + sub.v_buffer:
                buf[dead] = float("nan")

    def evict(self):
        for i, r in enumerate(self.rows):
            self.evicted[i] = evict_swa_window(self.alloc, self.rtp.req_to_token, r, self.lens[i], self.window_left, self.evicted[i])


def model_pools(size, size_swa, page_size, dtype, device, g):
    """The pools of :func:`model_layers` (sliding layers 0 and 2, full layer 1 of its own head
    geometry) and their allocator, both free lists shuffled by ``g``."""
    pool = SWAKVPool(
        size,
        size_swa,
        page_size,
        dtype,
        swa_attention_layer_ids=[0, 2],
        full_attention_layer_ids=[1],
        device=device,
        swa_head_num=2,
        swa_head_dim=16,
        full_head_num=1,
        full_head_dim=32,
        full_v_head_dim=24,
    )
    alloc = SWATokenToKVPoolAllocator(size, size_swa, page_size, dtype, device, pool)
    alloc.full_attn_allocator.shuffle_free_list(g)
    alloc.swa_attn_allocator.shuffle_free_list(g)
    return pool, alloc


def make_sim(window_left, page_size, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    pool, alloc = model_pools(256, 96, page_size, torch.float32, device, g)
    rtp = ReqToTokenPool(4, 64, device)
    rows = rtp.alloc(4)[1:]  # rows 2..4: row 1 stays unused, row 0 is padding
    return Sim(window_left, page_size, pool, alloc, rtp, rows, [0, 0, 0], [0, 0, 0], g=g, device=device)


def randn(sim, *shape):
    """Random values from the simulation's CPU generator, on its device."""
    return torch.randn(*shape, generator=sim.g).to(sim.device)


def expected_outputs(sim, layer, q, new_k, new_v, new_counts, q_pos_of):
    """Dense attention over each request's history (after appending the step's new K/V)."""
    src = layer.kv_shared_layer_id if layer.kv_shared_layer_id is not None else layer.layer_id
    outs, at = [], 0
    for i, r in enumerate(sim.rows):
        m = new_counts[i]
        ks, vs = sim.hist.setdefault((src, r), ([], []))
        if layer.kv_shared_layer_id is None:
            ks.extend(new_k[at : at + m])
            vs.extend(new_v[at : at + m])
        if m:
            k, v = torch.stack(ks), torch.stack(vs)
            q_pos = q_pos_of(i)
            mask = ref.window_mask(q_pos, torch.arange(len(ks)), layer.sliding_window_size).to(sim.device)
            outs.append(ref.attention(q[at : at + m], k, v, mask, sm_scale=layer.scaling, logit_cap=layer.logit_cap))
        at += m
    return torch.cat(outs).reshape(-1, HQ * layer.v_head_dim)


def step_batch(mode, rows, committed, new, out_cache_loc, device, spec_info=None):
    """The step's batch: ``new[i]`` tokens after request ``i``'s ``committed[i]`` (a verify's drafts
    are ``spec_info``'s; extend-shaped modes but EXTEND keep their mode)."""
    if mode == ForwardMode.TARGET_VERIFY:
        return ForwardBatch.verify(rows, committed, spec_info, out_cache_loc, device=device)
    if mode == ForwardMode.DECODE:
        return ForwardBatch.decode(rows, committed, out_cache_loc, device=device)
    return ForwardBatch.extend(rows, committed, new, out_cache_loc, device=device, mode=mode)


def run_step(sim, backend, layers, mode, new, *, draft_num=None, device_lens_only=False):
    """One forward step over every layer; returns nothing, asserts each layer's output.
    ``device_lens_only``: the batch carries no host copy of its prefix or sequence lengths (only of its
    new tokens), as SGLang's overlapped draft extend does."""
    committed = list(sim.lens)
    sim.poison()
    out_cache_loc = sim.allocate(new)
    dev = sim.device
    batch = step_batch(mode, sim.rows, committed, new, out_cache_loc, dev, SpecInfo(draft_num))
    if device_lens_only:
        batch.extend_prefix_lens_cpu = batch.seq_lens_cpu = None
    backend.init_forward_metadata(batch)
    t = sum(new)
    for layer in layers:
        q = randn(sim, t, HQ, layer.head_dim)
        k = randn(sim, t, layer.tp_k_head_num, layer.head_dim)
        v = randn(sim, t, layer.tp_k_head_num, layer.v_head_dim)
        out = torch.full((t, HQ * layer.v_head_dim), float("nan"), device=dev)
        out.copy_(backend.forward(q, k, v, layer, batch))
        want = expected_outputs(sim, layer, q, list(k), list(v), new, lambda i: committed[i] + torch.arange(new[i]))
        assert_close(out, want, name=f"{mode.name} layer {layer.layer_id}")
    for i, m in enumerate(new):
        sim.lens[i] += m


def reject_drafts(sim, layers, accepted, draft_num):
    """Keep ``accepted[i]`` of request i's drafts; free the rest (full and SWA slots)."""
    for i, r in enumerate(sim.rows):
        keep_upto = sim.lens[i] - draft_num + accepted[i]
        rejected = sim.rtp.req_to_token[r, keep_upto : sim.lens[i]].long()
        sim.alloc.free(rejected)
        sim.lens[i] = keep_upto
        for layer in layers:
            if layer.kv_shared_layer_id is None:
                ks, vs = sim.hist[(layer.layer_id, r)]
                del ks[keep_upto:], vs[keep_upto:]


@pytest.mark.interpreter
@pytest.mark.parametrize("window_left, page_size", [pytest.param(5, 1, id="W5-P1"), pytest.param(6, 4, id="W6-P4")])
def test_model_level_steps_match_reference(window_left, page_size, device):
    sim = make_sim(window_left, page_size, seed=window_left, device=device)
    runner = ModelRunner(sim.pool, sim.alloc, sim.rtp, sliding_window_size=window_left, device=device)
    backend = TritonSWAAttnBackend(runner)
    assert backend.use_sliding_window_kv_pool
    layers = model_layers(window_left)
    run_step(sim, backend, layers, ForwardMode.EXTEND, [7, 3, 12])  # prefill
    sim.evict()
    run_step(sim, backend, layers, ForwardMode.EXTEND, [2, 0, 9])  # chunked prefill, an empty entry
    sim.evict()
    for _ in range(2):
        run_step(sim, backend, layers, ForwardMode.DECODE, [1, 1, 1])
        sim.evict()
    run_step(sim, backend, layers, ForwardMode.TARGET_VERIFY, [3, 3, 3], draft_num=3)
    reject_drafts(sim, layers, [1, 3, 0], 3)
    sim.evict()
    run_step(sim, backend, layers, ForwardMode.DRAFT_EXTEND_V2, [2, 1, 0])  # extend-shaped, an empty entry
    sim.evict()
    run_step(sim, backend, layers, ForwardMode.DECODE, [1, 1, 1])
    assert sim.alloc.full_to_swa_index_mapping[sim.rtp.req_to_token[sim.rows[2], 0].long()] == 0, "eviction ran"


@pytest.mark.interpreter
def test_eager_extend_bounds_the_prefix_window(device, monkeypatch):
    """Eager EXTEND passes the batch's longest prefix (capped at the window) as ``max_window``, so a
    prompt without a prefix takes no empty split-KV programs; verify passes the layer's bound, as
    CUDA-graph replay does."""
    import triton_swa.backend.forward as forward_mod

    seen = []

    def spy(op):
        def call(*args, **kwargs):
            seen.append((kwargs["window_left"], kwargs["max_window"]))
            return op(*args, **kwargs)

        return call

    # the checked path calls swa_extend per layer, the planned path swa_extend_plan per kind of layer
    for name in ("swa_extend", "swa_extend_plan"):
        monkeypatch.setattr(forward_mod, name, spy(getattr(forward_mod, name)))
    window_left = 5
    sim = make_sim(window_left, 1, seed=2, device=device)
    runner = ModelRunner(sim.pool, sim.alloc, sim.rtp, sliding_window_size=window_left, device=device)
    backend = TritonSWAAttnBackend(runner)
    layers = model_layers(window_left)
    run_step(sim, backend, layers, ForwardMode.EXTEND, [7, 3, 12])
    assert seen and all(bound == 0 for _, bound in seen), seen
    seen.clear()
    sim.evict()
    run_step(sim, backend, layers, ForwardMode.EXTEND, [2, 0, 9])  # prefixes 7, 3, 12
    assert {bound for w, bound in seen if w >= 0} == {window_left}
    assert {bound for w, bound in seen if w < 0} == {12}
    seen.clear()
    sim.evict()
    run_step(sim, backend, layers, ForwardMode.TARGET_VERIFY, [3, 3, 3], draft_num=3)
    # verify passes the layer's bound (W keys of prefix window, req_to_token's width for full
    # layers), never the size of this batch's index buffers: CUDA-graph replay passes the same
    max_ctx = sim.rtp.req_to_token.shape[1]
    assert seen and all(bound == (w if w >= 0 else max_ctx) for w, bound in seen), seen


@pytest.mark.interpreter
@pytest.mark.parametrize("page_size", [1, 4])
def test_steps_with_lengths_on_the_device_only_read_none_back(device, page_size, monkeypatch):
    """A step whose prefix and sequence lengths only the device holds (SGLang's overlapped draft
    extend: only ``extend_seq_lens_cpu`` on the host; decode and verify without ``seq_lens_cpu``)
    plans without reading a length back: its lists are built at their bound and its splits follow the
    layer's bound, as verify's always do; every output equals the reference. With the lists' bound
    past ``DEVICE_PREFIX_MAX_INDICES`` the step reads its prefixes back instead, and still equals the
    reference."""
    import triton_swa.backend.metadata as metadata_mod

    window_left = 5
    sim = make_sim(window_left, page_size, seed=7, device=device)
    runner = ModelRunner(sim.pool, sim.alloc, sim.rtp, sliding_window_size=window_left, device=device)
    backend = TritonSWAAttnBackend(runner)
    layers = model_layers(window_left)
    run_step(sim, backend, layers, ForwardMode.EXTEND, [7, 3, 12])
    sim.evict()
    reads, inside = [], []
    for name in ("cpu", "tolist", "item", "__int__", "__bool__"):
        original = getattr(torch.Tensor, name)

        def spy(self, *a, _original=original, _name=name, **k):
            if inside and self.numel():  # a tensor value read on the host while the backend plans or runs
                reads.append(_name)
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, spy)
    for name in ("init_forward_metadata", "forward"):
        original = getattr(backend, name)

        def watched(*a, _original=original, **k):
            inside.append(1)
            try:
                return _original(*a, **k)
            finally:
                inside.pop()

        monkeypatch.setattr(backend, name, watched)
    run_step(sim, backend, layers, ForwardMode.DRAFT_EXTEND_V2, [3, 3, 3], device_lens_only=True)
    sim.evict()
    run_step(sim, backend, layers, ForwardMode.EXTEND, [2, 0, 9], device_lens_only=True)
    sim.evict()
    for _ in range(2):  # the first decode of its kind checks the batch in full, the second only its lengths
        run_step(sim, backend, layers, ForwardMode.DECODE, [1, 1, 1], device_lens_only=True)
        sim.evict()
    run_step(sim, backend, layers, ForwardMode.TARGET_VERIFY, [3, 3, 3], draft_num=3, device_lens_only=True)
    reject_drafts(sim, layers, [1, 3, 0], 3)
    assert reads == [], f"host reads: {reads}"
    sim.evict()
    from triton_swa.runtime.guard import refresh_debug_env

    monkeypatch.setenv("TRITON_SWA_DEBUG", "1")  # the guard's path checks each list against the device lengths
    assert refresh_debug_env()
    try:
        run_step(sim, backend, layers, ForwardMode.DRAFT_EXTEND_V2, [2, 2, 2], device_lens_only=True)
    finally:
        monkeypatch.delenv("TRITON_SWA_DEBUG")
        refresh_debug_env()
    sim.evict()
    monkeypatch.setattr(metadata_mod, "DEVICE_PREFIX_MAX_INDICES", 0)
    run_step(sim, backend, layers, ForwardMode.DRAFT_EXTEND_V2, [3, 3, 3], device_lens_only=True)
    assert "cpu" in reads, "past the bound the step reads its prefixes back"


@pytest.mark.interpreter
def test_draft_worker_regression_policy_vs_legacy_rule(device):
    """Gemma 4 + DFlash: the draft's active pool is SWA-backed and shares the target's mapping, its
    allocator is not the SWA allocator's type. The policy translates and reads the right K/V; the
    legacy rule does not translate, and once SWA and full slots differ it reads wrong K/V."""
    w = 3
    # The draft owns its own SWA pool (own buffers) registered on the target's mapping. Same sizes on
    # both sides so that the legacy rule's wrong slots stay in bounds.
    draft_pool = SWAKVPool(
        256, 256, 1, torch.float32, swa_attention_layer_ids=[0], full_attention_layer_ids=[1], device=device, head_num=2, head_dim=16
    )
    plain_alloc = TokenToKVPoolAllocator(16, torch.float32, device, _plain_pool(device))  # the pool has 16 slots
    layer = AttentionLayer(0, HQ, 2, 16, sliding_window_size=w)
    outs = {}
    for name, legacy in (("policy", None), ("legacy", SWATokenToKVPoolAllocator)):
        sim = make_sim(w, 1, seed=11, device=device)  # the target: the same allocation history each time
        draft_pool.register_mapping(sim.alloc.full_to_swa_index_mapping)
        for buf in draft_pool.swa_kv_pool.k_buffer + draft_pool.swa_kv_pool.v_buffer:
            buf.fill_(float("nan"))
        runner = ModelRunner(
            draft_pool,
            plain_alloc,
            sim.rtp,
            sliding_window_size=w,
            is_draft_worker=True,
            spec_algorithm=SpeculativeAlgorithm.DFLASH,
            device=device,
        )
        backend = TritonSWAAttnBackend(runner) if legacy is None else legacy_backend(runner, legacy)
        sim.g = torch.Generator().manual_seed(5)
        # Prefill 9 tokens per request, then one decode step; compare the decode output.
        q, outs[name], history = _prefill_then_decode(backend, sim, layer, [9, 9, 9])
        mask = ref.window_mask(torch.tensor([9]), torch.arange(10), w).to(device)
        outs["want"] = torch.cat([ref.attention(q[i : i + 1], k, v, mask, sm_scale=layer.scaling) for i, (k, v) in enumerate(history)])
    assert_close(outs["policy"], outs["want"], name="policy-resolved draft decode")
    legacy_err = (outs["legacy"].double() - outs["want"]).abs().nan_to_num(1e9).max()
    assert legacy_err > 1e-2, "the legacy rule should read wrong K/V once SWA and full slots differ"


@pytest.mark.reference
def test_idle_mode_builds_nothing_and_returns_empty(device):
    sim = make_sim(3, 1, seed=1, device=device)
    backend = TritonSWAAttnBackend(ModelRunner(sim.pool, sim.alloc, sim.rtp, sliding_window_size=3, device=device))
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    batch = ForwardBatch(ForwardMode.IDLE, 0, empty, empty, empty)
    backend.init_forward_metadata(batch)
    layer = model_layers(3)[0]
    out = backend.forward(torch.zeros(0, HQ, 16, device=device), None, None, layer, batch)
    assert out.shape == (0, HQ * 16)


def _prefill_then_decode(backend, sim, layer, prefill, save_kv_cache=True):
    """A prefill of ``prefill`` tokens per request, then one decode step; returns (q, decode output,
    each request's (K, V) history)."""
    batch = ForwardBatch.extend(sim.rows, [0, 0, 0], prefill, sim.allocate(prefill), device=sim.device)
    backend.init_forward_metadata(batch)
    t = sum(prefill)
    k, v = randn(sim, t, layer.tp_k_head_num, layer.head_dim), randn(sim, t, layer.tp_k_head_num, layer.v_head_dim)
    backend.forward(randn(sim, t, HQ, layer.head_dim), k, v, layer, batch)
    sim.lens = list(prefill)
    batch = ForwardBatch.decode(sim.rows, prefill, sim.allocate([1, 1, 1]), device=sim.device)
    backend.init_forward_metadata(batch)
    q = randn(sim, 3, HQ, layer.head_dim)
    k1, v1 = randn(sim, 3, layer.tp_k_head_num, layer.head_dim), randn(sim, 3, layer.tp_k_head_num, layer.v_head_dim)
    out = backend.forward(q, k1, v1, layer, batch, save_kv_cache=save_kv_cache).reshape(3, HQ, layer.v_head_dim)
    history = [
        (torch.cat([k[a : a + n], k1[i : i + 1]]), torch.cat([v[a : a + n], v1[i : i + 1]]))
        for i, (a, n) in enumerate(zip([0, prefill[0], prefill[0] + prefill[1]], prefill))
    ]
    return q, out, history


@pytest.mark.interpreter
def test_eagle_draft_with_a_full_only_pool_reads_windows_of_full_slots(device):
    """An EAGLE-like draft owns a plain pool: no translation, sliding layers read their window of full slots."""
    w = 4
    sim = make_sim(w, 1, seed=3, device=device)
    pool = MHATokenToKVPool(256, 1, torch.float32, 2, 16, 1, device)
    alloc = TokenToKVPoolAllocator(256, torch.float32, device, pool)
    alloc.shuffle_free_list(torch.Generator().manual_seed(4))
    sim.alloc = alloc
    runner = ModelRunner(
        pool, alloc, sim.rtp, sliding_window_size=w, is_draft_worker=True, spec_algorithm=SpeculativeAlgorithm.EAGLE, device=device
    )
    backend = TritonSWAAttnBackend(runner)
    assert not backend.use_sliding_window_kv_pool
    layer = AttentionLayer(0, HQ, 2, 16, sliding_window_size=w)
    q, out, history = _prefill_then_decode(backend, sim, layer, [9, 3, 6])
    for i, (k, v) in enumerate(history):
        pos = torch.arange(len(k))
        mask = ref.window_mask(pos[-1:], pos, w).to(device)
        assert_close(out[i : i + 1], ref.attention(q[i : i + 1], k, v, mask, sm_scale=layer.scaling), name=f"request {i}")


@pytest.mark.interpreter
def test_frozen_kv_mtp_draft_reads_the_targets_swa_pool(device):
    """FROZEN_KV MTP: the draft's active pool is plain, its allocator's is the target's SWA pool; the
    draft reads the target's K/V through the target's mapping and writes nothing."""
    w = 4
    sim = make_sim(w, 1, seed=6, device=device)
    target = TritonSWAAttnBackend(ModelRunner(sim.pool, sim.alloc, sim.rtp, sliding_window_size=w, device=device))
    layer = model_layers(w)[0]
    q, out, _ = _prefill_then_decode(target, sim, layer, [7, 10, 5])
    draft_runner = ModelRunner(
        _plain_pool(device),
        sim.alloc,
        sim.rtp,
        sliding_window_size=w,
        is_draft_worker=True,
        spec_algorithm=SpeculativeAlgorithm.FROZEN_KV_MTP,
        device=device,
    )
    draft = TritonSWAAttnBackend(draft_runner)
    assert draft._swa_kv_pool is sim.pool
    rows = torch.tensor(sim.rows, device=device)
    seq = torch.tensor([8, 11, 6])
    batch = ForwardBatch(ForwardMode.DECODE, 3, rows, seq.to(device), None, seq_lens_cpu=seq)
    draft.init_forward_metadata(batch)
    got = draft.forward_decode(q, None, None, layer, batch, save_kv_cache=False).reshape(3, HQ, 16)
    assert torch.equal(got, out), "the draft must read exactly the target's window"


def backend_setup(device, page_size, seq_lens, window_left, *, dtype=torch.float32, new_tokens=1):
    """A mid-step pool state of ``seq_lens`` (``new_tokens`` each new), its backend, and a sliding
    and a full layer of the pools' head geometry."""
    state = make_pool_state(
        seq_lens=list(seq_lens),
        window_left=window_left,
        page_size=page_size,
        device=device,
        dtype=dtype,
        new_tokens=new_tokens,
        swa_head_num=2,
        swa_head_dim=16,
        full_head_num=1,
        full_head_dim=32,
    )
    runner = ModelRunner(state.kv_pool, state.allocator, state.req_to_token_pool, sliding_window_size=window_left, device=device)
    layers = [AttentionLayer(0, HQ, 2, 16, sliding_window_size=window_left), AttentionLayer(1, HQ, 1, 32)]
    return state, TritonSWAAttnBackend(runner), layers


def _graph_setup(device, page_size):
    """Three decoding requests; graph buffers for 4 (a padded entry)."""
    state, backend, layers = backend_setup(device, page_size, [5, 17, 30], 6)
    backend.init_cuda_graph_state(max_bs=4, max_num_tokens=4)
    return state, backend, layers


def _padded_decode(rows, lens, order=None):
    """The requests (in ``order``) and one padding entry (row 0, length 1)."""
    if order is not None:
        rows, lens = rows[order], lens[order]
    return torch.cat([rows, rows.new_zeros(1)]), torch.cat([lens, lens.new_ones(1)])


def _replay_decode(backend, rows, lens, order):
    req_pad, seq_pad = _padded_decode(rows, lens, order)
    backend.init_forward_metadata_replay_cuda_graph(4, req_pad, seq_pad, int(seq_pad.sum()), None, ForwardMode.DECODE, None, seq_pad.cpu())


def _assert_graph_equals_eager(backend, layers, rows, lens, order, q, graph_out, what):
    """Each layer's graph output for the requests in ``order`` equals eager metadata's, bit for bit."""
    batch = ForwardBatch(ForwardMode.DECODE, 3, rows[order], lens[order], None, seq_lens_cpu=lens[order].cpu())
    backend.init_forward_metadata(batch)
    for layer, got in zip(layers, graph_out):
        eager = backend.forward_decode(q[:3, :, : layer.head_dim], None, None, layer, batch, save_kv_cache=False)
        assert torch.equal(got[:3], eager), f"layer {layer.layer_id}: {what} differs from eager"
        assert not torch.isnan(got[:3]).any()


@pytest.mark.interpreter
@pytest.mark.parametrize("page_size", [1, 4])
def test_cuda_graph_metadata_buffers_give_eager_results(device, page_size):
    """The fixed-buffer metadata path (capture, then replay with other requests and a padded entry)
    gives the same outputs as eager metadata, bit for bit."""
    state, backend, layers = _graph_setup(device, page_size)
    rows, lens = state.req_pool_indices(), state.seq_lens()
    backend.init_forward_metadata_capture_cuda_graph(4, 4, *_padded_decode(rows, lens), None, ForwardMode.DECODE, None)
    order = torch.tensor([2, 0, 1], device=rows.device)
    _replay_decode(backend, rows, lens, order)
    q = torch.randn(4, HQ, 32, device=device)
    graph_out = [backend.forward_decode(q[:, :, : layer.head_dim], None, None, layer, None, save_kv_cache=False) for layer in layers]
    _assert_graph_equals_eager(backend, layers, rows, lens, order, q, graph_out, "graph metadata")


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [1, 16])
def test_cuda_graph_capture_and_replay_equal_eager(page_size):
    state, backend, layers = _graph_setup("cuda", page_size)
    rows, lens = state.req_pool_indices(), state.seq_lens()
    static_q = torch.randn(4, HQ, 32, device="cuda")
    backend.init_forward_metadata_capture_cuda_graph(4, 4, *_padded_decode(rows, lens), None, ForwardMode.DECODE, None)
    run = lambda: [
        backend.forward_decode(static_q[:, :, : layer.head_dim], None, None, layer, None, save_kv_cache=False) for layer in layers
    ]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = run()
    order = torch.tensor([1, 2, 0], device="cuda")
    _replay_decode(backend, rows, lens, order)
    static_q.copy_(torch.randn(4, HQ, 32, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    _assert_graph_equals_eager(backend, layers, rows, lens, order, static_q, outs, "replay")


@pytest.mark.interpreter
def test_a_foreign_swa_pool_is_resolved_and_translated(device):
    """An engine's own SWA pool class (only the protocol, no triton-swa base class) is resolved by
    what it exposes: sliding layers read their SWA slots. Resolving by identity with triton-swa's
    class left it untranslated, reading swa_buffer[full_slot]."""
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent / "mem"))
    from test_pool_protocol import ForeignSWAPool

    w = 5
    state = make_pool_state(
        seq_lens=[9, 17, 30], window_left=w, page_size=1, device=device, swa_head_num=2, swa_head_dim=16, full_head_num=1, full_head_dim=32
    )
    foreign = ForeignSWAPool(state.kv_pool)
    runner = ModelRunner(foreign, state.allocator, state.req_to_token_pool, sliding_window_size=w, device=device)
    backend = TritonSWAAttnBackend(runner)
    assert backend._swa_kv_pool is foreign
    rows, lens = state.req_pool_indices(), state.seq_lens()
    batch = ForwardBatch(ForwardMode.DECODE, 3, rows, lens, state.new_slots(), seq_lens_cpu=lens.cpu())
    backend.init_forward_metadata(batch)
    layer = AttentionLayer(0, HQ, 2, 16, sliding_window_size=w)
    q = torch.randn(3, HQ, 16, device=device)
    got = backend.forward_decode(q, None, None, layer, batch, save_kv_cache=False).reshape(3, HQ, 16)
    ptr, idx, _ = ref.decode_window_indices(state.req_to_token, rows, lens, w, state.mapping)
    k_buf, v_buf = state.kv_pool.get_kv_buffer(0)
    want = ref.decode_attention(q, k_buf, v_buf, ptr, idx, sm_scale=layer.scaling)
    assert_close(got, want, name="foreign SWA pool, sliding layer")
