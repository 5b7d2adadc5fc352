"""How the demo's random models react to their context and to rounding-sized noise (CPU, eager attention).

    python scripts/demo_sensitivity.py [--preset gpu] [--requests 8]

1. Context: the greedy argmax of the last 40 positions of random 300-token sequences, and again after
   the first 250 tokens are replaced; a model whose argmax never changes only copies its current token,
   and no attention bug could change its proposals.
2. Noise: greedy generate() of the preset's first requests with and without 1e-5 relative noise on
   every attention output; how many requests' tokens change (what float32 kernels differing from eager
   by ~1e-5 can do to generate()'s tokens on this model).
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="gpu")
    ap.add_argument("--requests", type=int, default=8)
    args = ap.parse_args()
    from transformers.models.gemma4 import modeling_gemma4 as mg

    import triton_swa.demo as d

    torch.set_num_threads(1)
    p = d.PRESETS[args.preset]
    model = d.build_model(p, 0, "cpu")
    model.set_attn_implementation("eager")
    g = torch.Generator().manual_seed(5)
    changed = total = 0
    for _ in range(6):
        ids = torch.randint(1, p.vocab, (1, 300), generator=g)
        other = ids.clone()
        other[0, :250] = torch.randint(1, p.vocab, (250,), generator=g)
        with torch.no_grad():
            a = model(ids, use_cache=False).logits[0, -40:].argmax(-1)
            b = model(other, use_cache=False).logits[0, -40:].argmax(-1)
        changed += int((a != b).sum())
        total += 40
    print(f"context: the argmax changes at {changed} of {total} positions when the older context changes")

    plain = mg.eager_attention_forward

    def noisy(*a, **k):
        out, w = plain(*a, **k)
        return out * (1 + 1e-5 * torch.randn_like(out)), w

    moved = 0
    reqs = d.request_stream(p, 0)[: args.requests]
    for r in reqs:
        ids = torch.tensor([r.prompt])
        outs = []
        for fn in (plain, noisy):
            mg.eager_attention_forward = fn
            with torch.inference_mode():
                out = model.generate(
                    ids,
                    max_new_tokens=r.max_new_tokens,
                    min_new_tokens=r.max_new_tokens,
                    do_sample=False,
                    eos_token_id=None,
                    pad_token_id=0,
                )
            outs.append(out[0, len(r.prompt) :].tolist())
        mg.eager_attention_forward = plain
        moved += outs[0] != outs[1]
    print(f"noise: 1e-5 relative noise on attention outputs changes the greedy tokens of {moved} of {len(reqs)} requests")


if __name__ == "__main__":
    main()
