"""Command line: ``python -m triton_swa demo``.

The demo plays a small hybrid model's serving loop on the pools: it allocates prompts, writes K/V for
a sliding and a full layer, evicts out-of-window SWA slots, decodes a few steps, and checks that the
sliding layer's attention through the SWA pool equals dense attention over the request's own window.
"""

from __future__ import annotations

import argparse
import sys

import torch


def demo(args) -> int:
    import triton_swa_reference as ref

    from triton_swa import ReqToTokenPool, SWAKVPool, SWATokenToKVPoolAllocator, evict_swa_window
    from triton_swa.testing import assert_close

    g = torch.Generator().manual_seed(args.seed)
    W, ps, H, HQ, D = args.window_left, args.page_size, 2, 4, 32
    prompts = [37, 5, 64]
    print(f"triton-swa demo: window_left={W}, page_size={ps}, {len(prompts)} requests, prompts {prompts}")
    pool = SWAKVPool(512, 128, ps, torch.float32, swa_attention_layer_ids=[0], full_attention_layer_ids=[1],
                     head_num=H, head_dim=D)
    alloc = SWATokenToKVPoolAllocator(512, 128, ps, torch.float32, "cpu", pool)
    alloc.swa_attn_allocator.shuffle_free_list(g)  # so SWA slots differ from full slots
    rtp = ReqToTokenPool(8, 256)
    rows = rtp.alloc(len(prompts))
    seq = [0] * len(prompts)
    evicted = [0] * len(prompts)
    history_k = {r: [] for r in rows}  # the sliding layer's K/V per token, to check against
    history_v = {r: [] for r in rows}

    def append(b: int, n: int) -> None:
        r = rows[b]
        last = rtp.req_to_token[r, seq[b] - 1].long().reshape(1) if seq[b] else torch.tensor([-1])
        loc = alloc.alloc_extend(torch.tensor([seq[b]]), torch.tensor([seq[b] + n]), last, n)
        if loc is None:
            raise RuntimeError("pool full")
        rtp.req_to_token[r, seq[b]:seq[b] + n] = loc.int()
        k, v = torch.randn(n, H, D, generator=g), torch.randn(n, H, D, generator=g)
        pool.set_kv_buffer(0, loc, k, v)  # sliding layer: written at mapping[loc]
        pool.set_kv_buffer(1, loc, k, v)  # full layer: written at loc
        history_k[r].append(k)
        history_v[r].append(v)
        seq[b] += n

    for b, n in enumerate(prompts):
        append(b, n)
    print(f"prefill: full slots free {alloc.full_available_size()}, SWA slots free {alloc.swa_available_size()}")
    for step in range(args.steps):
        for b in range(len(prompts)):
            evicted[b] = evict_swa_window(alloc, rtp.req_to_token, rows[b], seq[b], W, evicted[b])
            append(b, 1)
        req = torch.tensor(rows)
        lens = torch.tensor(seq)
        kv_indptr, kv_indices, starts = ref.decode_window_indices(rtp.req_to_token, req, lens, W,
                                                                  alloc.full_to_swa_index_mapping)
        q = torch.randn(len(prompts), HQ, D, generator=g)
        out = ref.decode_attention(q, *pool.get_kv_buffer(0), kv_indptr, kv_indices, sm_scale=D**-0.5)
        # The same attention from each request's own history, dense, with the window mask.
        for b, r in enumerate(rows):
            k, v = torch.cat(history_k[r]), torch.cat(history_v[r])
            pos = torch.arange(seq[b])
            mask = ref.window_mask(pos[-1:], pos, W)
            dense = ref.attention(q[b:b + 1], k, v, mask, sm_scale=D**-0.5)
            assert_close(out[b:b + 1], dense, name=f"step {step} request {b}")
        print(f"decode step {step}: seq_lens {seq}, windows start at {starts.tolist()}, "
              f"SWA slots free {alloc.swa_available_size()}, evicted up to {evicted}; "
              "sliding-layer attention through the SWA pool matches dense windowed attention")
    print("demo done")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m triton_swa")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="pools, eviction and windowed attention on a small hybrid model")
    p.add_argument("--window-left", type=int, default=15)
    p.add_argument("--page-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=demo)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
