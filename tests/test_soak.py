"""Soak: a long randomised serving run through the backend, every output against the reference.

A stream of requests arrives and finishes; each step is a chunked-prefill EXTEND (decoding requests may
ride along with one token or none), a DECODE, a DRAFT_EXTEND_V2, or a TARGET_VERIFY with chain or tree
drafts whose rejected tail is freed. Pools are sized near full, so allocations fail: a failed
allocation must change nothing, and the scheduler then retracts a request. After every step the
allocator invariants are checked (``check_allocator_invariants``) and the step's window indices are
compared with the reference path's (the backend's debug guard); before every step every pool slot that no layer may read holds NaN
(fp8: its NaN byte), so a kernel that reads outside its window or a store that misses its slot fails.

K/V values are exactly representable in the pool's dtype (fp8 with power-of-two scales), so the store
is checked exactly: what a layer wrote is read back and must equal what it was given.

``TRITON_SWA_SOAK_STEPS`` sets the scheduler steps per configuration (CI default below; thousands on a
GPU), ``TRITON_SWA_SOAK_SECONDS`` a time limit per configuration, ``TRITON_SWA_SOAK_LOG`` a file that
each configuration appends its counts to.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field

import pytest
import torch

import triton_swa_reference as ref
from tests.test_backend import model_pools, step_batch
from triton_swa import ReqToTokenPool, evict_swa_window
from triton_swa.backend import TritonSWAAttnBackend
from triton_swa.engine import AttentionLayer, ForwardMode, ModelRunner, SpecInfo
from triton_swa.mem import check_allocator_invariants
from triton_swa.testing import assert_close

pytestmark = pytest.mark.interpreter

HQ = 4
FP8 = torch.float8_e4m3fn
FP8_NAN_BYTE = 0x7F


@dataclass
class Request:
    row: int
    prompt_len: int
    target_len: int
    seq_len: int = 0
    evicted_len: int = 0
    hist: dict = field(default_factory=dict)  # source layer id -> (k [n, H, D], v [n, H, Dv]) by position


@dataclass
class Stats:
    steps: int = 0
    modes: dict = field(default_factory=dict)
    layer_checks: int = 0
    failed_allocs: int = 0
    retracted: int = 0
    finished: int = 0
    drafts_rejected: int = 0
    max_err: float = 0.0


class Soak:
    """A tiny scheduler over triton-swa's pools and backend, with a dense reference of every request."""

    def __init__(self, *, seed: int, page_size: int, kv_dtype: torch.dtype, window_left: int, device: str):
        self.rng = random.Random(seed)
        self.g = torch.Generator().manual_seed(seed)
        self.ps, self.w, self.dev, self.kv_dtype = page_size, window_left, device, kv_dtype
        self.q_dtype = torch.float32 if kv_dtype == torch.float32 else torch.float16
        ps = page_size
        self.max_reqs, self.max_ctx = 4, 128
        # Near full, so that allocations fail and the scheduler retracts: four requests of up to 120
        # tokens would need 480 full slots; the SWA side holds about three windows plus a chunk each.
        size = -(-128 // ps) * ps + 2 * ps
        per_req = window_left + 1 + 12 + 2 * ps
        size_swa = -(-(3 * per_req) // ps) * ps
        self.size, self.size_swa = size, size_swa
        self.pool, self.alloc = model_pools(size, size_swa, ps, kv_dtype, device, self.g)
        self.rtp = ReqToTokenPool(self.max_reqs, self.max_ctx, device)
        scale = dict(k_scale=0.5, v_scale=0.25) if kv_dtype == FP8 else {}
        sinks = torch.randn(HQ, generator=self.g).to(device) * 2
        self.layers = [
            AttentionLayer(0, HQ, 2, 16, sliding_window_size=window_left, logit_cap=5.0, sinks=sinks, **scale),
            AttentionLayer(1, HQ, 1, 32, v_head_dim=24, **scale),
            AttentionLayer(2, HQ, 2, 16, sliding_window_size=window_left, kv_shared_layer_id=0, logit_cap=5.0, sinks=sinks, **scale),
        ]
        runner = ModelRunner(self.pool, self.alloc, self.rtp, sliding_window_size=window_left, device=device)
        self.backend = TritonSWAAttnBackend(runner)
        assert self.backend.use_sliding_window_kv_pool
        self.requests: list[Request] = []
        self.stats = Stats()
        self.start_sizes = (self.alloc.full_available_size(), self.alloc.swa_available_size(), self.rtp.available_size())

    # ----- values ---------------------------------------------------------------------------------

    def values(self, *shape, scale=None) -> torch.Tensor:
        """Random values exactly representable in the pool's dtype (times ``scale`` for fp8)."""
        x = torch.randn(*shape, generator=self.g)
        if self.kv_dtype == FP8:
            x = (x / scale).to(FP8).float() * scale
        else:
            x = x.to(self.kv_dtype).float()
        return x.to(self.q_dtype).to(self.dev)

    def readback(self, layer, slots) -> tuple[torch.Tensor, torch.Tensor]:
        k_buf, v_buf = self.pool.get_kv_buffer(layer.layer_id)
        k, v = k_buf[slots].float(), v_buf[slots].float()
        if self.kv_dtype == FP8:
            k, v = k * layer.k_scale, v * layer.v_scale
        return k, v

    # ----- pool bookkeeping -----------------------------------------------------------------------

    def snapshot(self):
        a = self.alloc
        return [t.clone() for t in (a.full_attn_allocator.free_pages, a.swa_attn_allocator.free_pages, a.full_to_swa_index_mapping)]

    def allocate(self, reqs, new) -> torch.Tensor | None:
        prefix = torch.tensor([r.seq_len for r in reqs], device=self.dev)
        seq = prefix + torch.tensor(new, device=self.dev)
        last = torch.tensor([int(self.rtp.req_to_token[r.row, r.seq_len - 1]) if r.seq_len else -1 for r in reqs], device=self.dev)
        before = self.snapshot()
        slots = self.alloc.alloc_extend(prefix, seq, last, int(sum(new)))
        if slots is None:
            for x, y in zip(before, self.snapshot()):
                assert torch.equal(x, y), "a failed allocation changed the allocator"
            self.stats.failed_allocs += 1
            return None
        at = 0
        for r, m in zip(reqs, new):
            self.rtp.req_to_token[r.row, r.seq_len : r.seq_len + m] = slots[at : at + m].to(torch.int32)
            at += m
        return slots

    def release(self, r: Request) -> None:
        if r.seq_len:
            self.alloc.free(self.rtp.req_to_token[r.row, : r.seq_len].long())
        self.rtp.free(r.row)
        self.requests.remove(r)

    def poison(self) -> None:
        """The pool's NaN in every slot no layer may read in the coming step (dummy slot 0 included)."""
        mapping = self.alloc.full_to_swa_index_mapping
        swa_live, full_live = [torch.zeros(0, dtype=torch.long, device=self.dev)], [torch.zeros(0, dtype=torch.long, device=self.dev)]
        for r in self.requests:
            full = self.rtp.req_to_token[r.row, : r.seq_len].long()
            full_live.append(full)
            swa_live.append(mapping[full[ref.extend_window_start(r.seq_len, self.w) :]])
        for sub, live in ((self.pool.swa_kv_pool, torch.cat(swa_live)), (self.pool.full_kv_pool, torch.cat(full_live))):
            dead = torch.ones(sub.k_buffer[0].shape[0], dtype=torch.bool, device=self.dev)
            dead[live] = False
            for buf in sub.k_buffer + sub.v_buffer:
                buf[dead] = FP8_NAN_BYTE if self.kv_dtype == FP8 else float("nan")

    def check_invariants(self) -> None:
        check_allocator_invariants(self.alloc, self.rtp.req_to_token, [(r.row, r.seq_len, r.evicted_len) for r in self.requests])

    # ----- one step -------------------------------------------------------------------------------

    def admit(self) -> None:
        while len(self.requests) < self.max_reqs and self.rng.random() < 0.5:
            prompt = self.rng.randint(1, 64)
            target = min(self.max_ctx - 8, prompt + self.rng.randint(1, 56))
            rows = self.rtp.alloc(1)
            if rows is None:
                return
            self.requests.append(Request(rows[0], prompt, target))

    def plan(self):
        """(mode, requests, new tokens per request, drafts, tree parents or None)."""
        prefilling = [r for r in self.requests if r.seq_len < r.prompt_len]
        decoding = [r for r in self.requests if r.seq_len >= r.prompt_len]
        if prefilling and (not decoding or self.rng.random() < 0.6):
            reqs = prefilling + [r for r in decoding if self.rng.random() < 0.5]
            new = [
                min(r.prompt_len - r.seq_len, self.rng.randint(1, 12)) if r.seq_len < r.prompt_len else self.rng.randint(0, 1) for r in reqs
            ]
            return ForwardMode.EXTEND, reqs, new, 0, None
        if not decoding:
            return None
        x = self.rng.random()
        if x < 0.4:
            return ForwardMode.DECODE, decoding, [1] * len(decoding), 0, None
        if x < 0.5:
            new = [self.rng.randint(0, 3) for _ in decoding]
            new[0] = max(new[0], 1)
            return ForwardMode.DRAFT_EXTEND_V2, decoding, new, 0, None
        n = self.rng.randint(2, 5)
        parents = None
        if self.rng.random() < 0.5:
            # A tree whose first nodes form the main chain (node i's parent i - 1); the others branch
            # off any earlier node. Acceptance keeps a prefix of the main chain.
            chain = self.rng.randint(1, n)
            parents = [i - 1 for i in range(chain)] + [self.rng.randint(0, i - 1) for i in range(chain, n)]
        return ForwardMode.TARGET_VERIFY, decoding, [n] * len(decoding), n, parents

    def step(self) -> None:
        self.admit()
        planned = self.plan()
        if planned is None:
            return
        mode, reqs, new, n_draft, parents = planned
        self.poison()
        loc = self.allocate(reqs, new)
        if loc is None:
            victim = max(self.requests, key=lambda r: r.seq_len)
            self.release(victim)
            self.stats.retracted += 1
            self.check_invariants()
            return
        self.stats.steps += 1
        self.stats.modes[mode.name] = self.stats.modes.get(mode.name, 0) + 1
        bs, dev = len(reqs), self.dev
        committed = [r.seq_len for r in reqs]
        spec, q_pos = None, []
        depth = None
        if parents is not None:
            depth = [0] * n_draft
            for i, p in enumerate(parents):
                depth[i] = 0 if p < 0 else depth[p] + 1
        for c, m in zip(committed, new):
            q_pos.append(c + (torch.tensor(depth) if depth is not None else torch.arange(m)))
        if mode == ForwardMode.TARGET_VERIFY:
            mask = None
            if parents is not None:
                anc = torch.eye(n_draft, dtype=torch.bool)
                for i, p in enumerate(parents):
                    if p >= 0:
                        anc[i] |= anc[p]
                mask = anc.reshape(-1).repeat(bs).to(dev)
            positions = torch.cat(q_pos).to(dev) if parents is not None else None
            spec = SpecInfo(n_draft, custom_mask=mask, positions=positions)
        batch = step_batch(mode, [r.row for r in reqs], committed, new, loc, dev, spec)
        # debug: the step's indices are checked against the reference path and for live slots
        self.backend.init_forward_metadata(batch, debug=True)
        t = sum(new)
        mapping = self.alloc.full_to_swa_index_mapping
        for layer in self.layers:
            q = self.values(t, HQ, layer.head_dim, scale=1.0).to(self.q_dtype)
            shared = layer.kv_shared_layer_id is not None
            k = v = None
            if not shared:
                k = self.values(t, layer.tp_k_head_num, layer.head_dim, scale=layer.k_scale)
                v = self.values(t, layer.tp_k_head_num, layer.v_head_dim, scale=layer.v_scale)
            out = torch.full((t, HQ * layer.v_head_dim), float("nan"), dtype=self.q_dtype, device=dev)
            out.copy_(self.backend.forward(q, k, v, layer, batch, save_kv_cache=not shared))
            if not shared:
                slots = mapping[loc] if layer.sliding_window_size >= 0 else loc
                got_k, got_v = self.readback(layer, slots)
                assert torch.equal(got_k, k.float()) and torch.equal(got_v, v.float()), (
                    f"step {self.stats.steps} layer {layer.layer_id}: the store did not write what it was given"
                )
            want = self.expected(layer, reqs, committed, new, q, k, v, q_pos, spec, mode)
            assert_close(out, want, name=f"step {self.stats.steps} {mode.name} layer {layer.layer_id}")
            self.stats.max_err = max(self.stats.max_err, float((out.double() - want).abs().max()) if t else 0.0)
            self.stats.layer_checks += 1
        self.commit(mode, reqs, new, n_draft, parents)
        for r in list(self.requests):
            if r.seq_len >= r.target_len:
                self.release(r)
                self.stats.finished += 1
        for r in self.requests:
            r.evicted_len = evict_swa_window(self.alloc, self.rtp.req_to_token, r.row, r.seq_len, self.w, r.evicted_len)
        self.check_invariants()

    def expected(self, layer, reqs, committed, new, q, k, v, q_pos, spec, mode) -> torch.Tensor:
        src = layer.kv_shared_layer_id if layer.kv_shared_layer_id is not None else layer.layer_id
        outs, at = [], 0
        for i, r in enumerate(reqs):
            m, c = new[i], committed[i]
            kh, vh = r.hist.get(src, (None, None))
            if layer.kv_shared_layer_id is None:
                kn, vn = k[at : at + m].double(), v[at : at + m].double()
                r.hist[src] = (kn if kh is None else torch.cat([kh, kn]), vn if vh is None else torch.cat([vh, vn]))
            kh, vh = r.hist[src]
            if m:
                kk, vv = kh[: c + m], vh[: c + m]
                pos = q_pos[i].to(self.dev)
                mask = torch.cat(
                    [
                        ref.window_mask(pos, torch.arange(c, device=self.dev), layer.sliding_window_size),
                        ref.window_mask(pos, pos, layer.sliding_window_size, causal=False),
                    ],
                    dim=1,
                )
                if spec is not None and spec.custom_mask is not None:
                    n = spec.draft_token_num
                    mask[:, c:] &= spec.custom_mask[i * n * n : (i + 1) * n * n].reshape(n, n)
                else:
                    mask[:, c:] &= torch.ones(m, m, dtype=torch.bool, device=self.dev).tril()
                outs.append(
                    ref.attention(q[at : at + m], kk, vv, mask, sm_scale=layer.scaling, logit_cap=layer.logit_cap, sinks=layer.sinks)
                )
            at += m
        return torch.cat(outs).reshape(-1, HQ * layer.v_head_dim) if outs else q.new_zeros(0, HQ * layer.v_head_dim).double()

    def commit(self, mode, reqs, new, n_draft, parents) -> None:
        for r, m in zip(reqs, new):
            r.seq_len += m
        if mode != ForwardMode.TARGET_VERIFY:
            return
        chain = n_draft if parents is None else next((i for i, p in enumerate(parents) if p != i - 1), n_draft)
        for r in reqs:
            keep = r.seq_len - n_draft + self.rng.randint(0, chain)
            if keep < r.seq_len:
                self.alloc.free(self.rtp.req_to_token[r.row, keep : r.seq_len].long())
                self.stats.drafts_rejected += r.seq_len - keep
            r.seq_len = keep
            for src, (kh, vh) in r.hist.items():
                r.hist[src] = (kh[:keep], vh[:keep])

    def finish(self) -> None:
        for r in list(self.requests):
            self.release(r)
        assert (self.alloc.full_available_size(), self.alloc.swa_available_size(), self.rtp.available_size()) == self.start_sizes, (
            "slots or rows leaked"
        )
        assert bool((self.alloc.full_to_swa_index_mapping[:-1] == 0).all())


CI_STEPS = 40
CONFIGS = [
    pytest.param(1, torch.float32, 5, id="P1-fp32-W5"),
    pytest.param(4, torch.float16, 6, id="P4-fp16-W6"),
    pytest.param(16, FP8, 9, id="P16-fp8-W9"),
]


@pytest.mark.parametrize("page_size, kv_dtype, window_left", CONFIGS)
def test_soak(page_size, kv_dtype, window_left, device):
    steps = int(os.environ.get("TRITON_SWA_SOAK_STEPS", CI_STEPS))
    seconds = float(os.environ.get("TRITON_SWA_SOAK_SECONDS", "inf"))
    soak = Soak(seed=1000 + page_size, page_size=page_size, kv_dtype=kv_dtype, window_left=window_left, device=device)
    t0 = time.perf_counter()
    calls = 0
    while calls < steps and time.perf_counter() - t0 < seconds:
        soak.step()
        calls += 1
    soak.finish()
    s = soak.stats
    line = f"soak P{page_size} {kv_dtype} W{window_left} on {device}: {calls} calls in {time.perf_counter() - t0:.1f} s, {s}"
    print(line)
    if os.environ.get("TRITON_SWA_SOAK_LOG"):
        with open(os.environ["TRITON_SWA_SOAK_LOG"], "a") as f:
            f.write(line + "\n")
    assert s.steps >= calls // 2, "the scheduler mostly idled"
    assert s.layer_checks == 3 * s.steps
    assert {"EXTEND", "DECODE", "TARGET_VERIFY"} <= set(s.modes), s.modes
    assert s.failed_allocs and s.retracted, "the pools never ran full: the soak does not test failure paths"
