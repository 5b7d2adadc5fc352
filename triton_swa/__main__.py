"""Command line: ``python -m triton_swa demo``.

The demo serves a small hybrid model (two sliding layers and one full layer with its own head
geometry) through :class:`triton_swa.backend.TritonSWAAttnBackend` and the Triton kernels: prefill,
chunked prefill, decode steps, and a speculative verify step whose rejected drafts are freed, with
window eviction after every step. Every layer's output is checked against dense windowed attention
over the request's own token history (the reference path). Without a GPU the kernels run in Triton's
interpreter.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def demo(args) -> int:
    import triton_swa_reference as ref

    from triton_swa import ReqToTokenPool, SWAKVPool, SWATokenToKVPoolAllocator, evict_swa_window
    from triton_swa.backend import TritonSWAAttnBackend
    from triton_swa.engine import AttentionLayer, ForwardBatch, ForwardMode, ModelRunner, SpecInfo
    from triton_swa.testing import assert_close

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(args.seed)
    W, ps, HQ = args.window_left, args.page_size, 4
    layers = [AttentionLayer(0, HQ, 2, 32, sliding_window_size=W), AttentionLayer(1, HQ, 1, 64),
              AttentionLayer(2, HQ, 2, 32, sliding_window_size=W, logit_cap=30.0)]
    pool = SWAKVPool(1024, 256, ps, torch.float32, swa_attention_layer_ids=[0, 2], full_attention_layer_ids=[1],
                     device=dev, swa_head_num=2, swa_head_dim=32, full_head_num=1, full_head_dim=64)
    alloc = SWATokenToKVPoolAllocator(1024, 256, ps, torch.float32, dev, pool)
    alloc.swa_attn_allocator.shuffle_free_list(g)  # so that SWA slots differ from full slots
    rtp = ReqToTokenPool(8, 512, dev)
    rows = rtp.alloc(3)
    lens, evicted = [0, 0, 0], [0, 0, 0]
    history = {}  # (layer, row) -> list of (k, v) per position
    backend = TritonSWAAttnBackend(ModelRunner(pool, alloc, rtp, sliding_window_size=W, device=dev))
    print(f"triton-swa demo on {dev}{' (Triton interpreter)' if dev == 'cpu' else ''}: window_left={W}, "
          f"page_size={ps}, layers: 2 sliding (4/2 heads, D 32) + 1 full (4/1 heads, D 64)")
    print(f"policy resolved the SWA pool: {backend.use_sliding_window_kv_pool}")
    rnd = lambda *shape: torch.randn(*shape, generator=g).to(dev)

    def step(mode: ForwardMode, new: list[int], draft_num: int = 0) -> None:
        prefix = torch.tensor(lens)
        last = torch.tensor([int(rtp.req_to_token[r, n - 1]) if n else -1 for r, n in zip(rows, lens)])
        loc = alloc.alloc_extend(prefix.to(dev), (prefix + torch.tensor(new)).to(dev), last.to(dev), sum(new))
        if loc is None:
            raise RuntimeError("pools full")
        at = 0
        for r, n, m in zip(rows, lens, new):
            rtp.req_to_token[r, n:n + m] = loc[at:at + m].int()
            at += m
        req = torch.tensor(rows, device=dev)
        seq = prefix + torch.tensor(new)
        if mode == ForwardMode.DECODE:
            batch = ForwardBatch(mode, 3, req, seq.to(dev), loc, seq_lens_cpu=seq)
        elif mode == ForwardMode.TARGET_VERIFY:
            batch = ForwardBatch(mode, 3, req, prefix.to(dev), loc, seq_lens_cpu=prefix, spec_info=SpecInfo(draft_num))
        else:
            batch = ForwardBatch(mode, 3, req, seq.to(dev), loc, seq_lens_cpu=seq, extend_prefix_lens=prefix.to(dev),
                                 extend_seq_lens=torch.tensor(new, device=dev), extend_prefix_lens_cpu=list(lens),
                                 extend_seq_lens_cpu=list(new))
        t0 = time.perf_counter()
        backend.init_forward_metadata(batch)
        worst = 0.0
        for layer in layers:
            t = sum(new)
            q, k = rnd(t, HQ, layer.head_dim), rnd(t, layer.tp_k_head_num, layer.head_dim)
            v = rnd(t, layer.tp_k_head_num, layer.v_head_dim)
            out = backend.forward(q, k, v, layer, batch).reshape(t, HQ, layer.v_head_dim)
            at = 0
            for r, n, m in zip(rows, lens, new):
                hist = history.setdefault((layer.layer_id, r), [])
                hist.extend(zip(k[at:at + m], v[at:at + m]))
                if m:
                    kk = torch.stack([h[0] for h in hist])
                    vv = torch.stack([h[1] for h in hist])
                    mask = ref.window_mask(n + torch.arange(m), torch.arange(len(hist)), layer.sliding_window_size)
                    want = ref.attention(q[at:at + m], kk, vv, mask.to(dev), sm_scale=layer.scaling,
                                         logit_cap=layer.logit_cap)
                    assert_close(out[at:at + m], want, name=f"{mode.name} layer {layer.layer_id} request row {r}")
                    worst = max(worst, float((out[at:at + m].double() - want).abs().max()))
                at += m
        for i, m in enumerate(new):
            lens[i] += m
        print(f"{mode.name:<13} new tokens {new}: seq_lens {lens}, every layer matches the reference "
              f"(max |err| {worst:.1e}, {time.perf_counter() - t0:.2f} s)")

    def evict() -> None:
        for i, r in enumerate(rows):
            evicted[i] = evict_swa_window(alloc, rtp.req_to_token, r, lens[i], W, evicted[i])
        print(f"{'':<13} eviction: SWA slots freed below positions {evicted}; "
              f"SWA free {alloc.swa_available_size()} of 256, full free {alloc.full_available_size()} of 1024")

    step(ForwardMode.EXTEND, [37, 5, 24])
    evict()
    step(ForwardMode.EXTEND, [0, 3, 40])  # chunked prefill of request 2, an empty entry for request 0
    evict()
    for _ in range(args.steps):
        step(ForwardMode.DECODE, [1, 1, 1])
        evict()
    step(ForwardMode.TARGET_VERIFY, [4, 4, 4], draft_num=4)
    accepted = [1, 4, 0]
    for i, r in enumerate(rows):
        keep = lens[i] - 4 + accepted[i]
        alloc.free(rtp.req_to_token[r, keep:lens[i]].long())
        lens[i] = keep
        for layer in layers:
            del history[(layer.layer_id, r)][keep:]
    print(f"{'':<13} drafts accepted {accepted}, rejected slots freed: seq_lens {lens}")
    evict()
    step(ForwardMode.DECODE, [1, 1, 1])
    print("demo done: sliding layers read only their windows through the SWA pool, full layers every token")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m triton_swa")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="serve a small hybrid model through the backend, checked against the reference")
    p.add_argument("--window-left", type=int, default=15)
    p.add_argument("--page-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=demo)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
