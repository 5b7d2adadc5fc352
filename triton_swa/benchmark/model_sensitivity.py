"""How far a random test model's greedy tokens can be trusted as a check: transformers alone, in
float64, float32 and bfloat16, on the same written weights.

A token check compares an engine's greedy tokens with transformers'. Two correct implementations in
one dtype differ by rounding; a deep random model can amplify that rounding until greedy decoding
picks another token, and from there the streams part for good. Then "tokens differ" shows no defect.
This tool measures, per prompt:

- the free-running float64 stream (the reference);
- for each lower dtype, the first output where its own free-running stream leaves float64's;
- the largest logit difference from float64, teacher-forced along float64's stream (one forward over
  prompt + stream: what rounding alone moves);
- ``decisive``: the outputs before the first position where float64's top-2 gap is within twice that
  difference. A token check in that dtype can decide only there.

Run: ``python -m triton_swa.benchmark.model_sensitivity gemma4-like [--prompts 600,1100,1700] [--new 48]``
(models of :data:`triton_swa.benchmark.serve.MODELS`, written on first use; the token check's prompts).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from triton_swa.testing.sglang_engine import first_divergence


def greedy(model, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """``n`` greedy tokens (prefill, then one token at a time with the cache) and float64's view of
    each step's top-2 gap."""
    import torch

    tokens, gaps = [], []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True, logits_to_keep=1)
        for _ in range(n):
            logits = out.logits[0, -1].double()
            top = logits.topk(2).values
            gaps.append(float(top[0] - top[1]))
            tokens.append(int(logits.argmax()))
            if len(tokens) == n:
                break
            out = model(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens, gaps


def teacher_forced(model, prompt: list[int], stream: list[int]):
    """Logits (float64, ``len(stream)`` x vocabulary) predicting each token of ``stream`` after ``prompt``."""
    import torch

    with torch.no_grad():
        ids = torch.tensor([prompt + stream[:-1]])
        return model(input_ids=ids, use_cache=False, logits_to_keep=len(stream)).logits[0].double()


def measure(path: str, prompts: list[list[int]], n: int, dtypes: tuple[str, ...] = ("float32", "bfloat16")) -> list[dict[str, Any]]:
    """Per prompt: float64's tokens and gaps, and per dtype its first divergence, teacher-forced
    max |logit difference| and the decisive prefix (see the module's docstring)."""
    import torch
    from transformers import AutoModelForCausalLM

    from triton_swa.testing.tiny_models import load_hf_config, repeats_one_token

    config = load_hf_config(path)

    def load(dtype: str):
        return AutoModelForCausalLM.from_pretrained(path, config=config, attn_implementation="eager", dtype=getattr(torch, dtype)).eval()

    model = load("float64")
    results = []
    for prompt in prompts:
        tokens, gaps = greedy(model, prompt, n)
        ref = teacher_forced(model, prompt, tokens)
        results.append(dict(prompt_len=len(prompt), tokens=tokens, gaps=gaps, echoes=repeats_one_token(tokens), ref=ref, dtypes={}))
    del model
    for dtype in dtypes:
        model = load(dtype)
        for r, prompt in zip(results, prompts):
            own, _ = greedy(model, prompt, n)
            diff = float((teacher_forced(model, prompt, r["tokens"]) - r["ref"]).abs().max())
            decisive = next((i for i, g in enumerate(r["gaps"]) if g <= 2 * diff), n)
            r["dtypes"][dtype] = dict(first_divergence=first_divergence(own, r["tokens"]), max_logit_diff=diff, decisive=decisive)
        del model
    for r in results:
        del r["ref"]
    return results


def report(results: list[dict[str, Any]]) -> str:
    lines = []
    for r in results:
        lines.append(
            f"prompt {r['prompt_len']}: float64 min top-2 gap {min(r['gaps']):.4f} over {len(r['tokens'])} outputs, "
            f"{len(set(r['tokens']))} distinct tokens" + (" (ECHOES one token: a token check says nothing)" if r["echoes"] else "")
        )
        for dtype, d in r["dtypes"].items():
            fd = "never" if d["first_divergence"] is None else f"at output {d['first_divergence']}"
            lines.append(
                f"  {dtype}: leaves float64's stream {fd}; teacher-forced max |logit diff| {d['max_logit_diff']:.2e}; "
                f"a token check is decisive for outputs 0..{d['decisive'] - 1} ({d['decisive']} of {len(r['tokens'])})"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    from triton_swa.benchmark.serve import MODELS, _prompts, build_model

    p = argparse.ArgumentParser(prog="python -m triton_swa.benchmark.model_sensitivity", description=__doc__.split("\n\n")[0])
    p.add_argument("model", help=f"one of {sorted(MODELS)}")
    p.add_argument("--prompts", default="600,1100,1700", help="prompt lengths (the token check's by default)")
    p.add_argument("--new", type=int, default=48, help="greedy tokens per prompt")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--model-root", default="/tmp/triton_swa_serve_models")
    a = p.parse_args(argv)
    if a.model not in MODELS:
        p.error(f"unknown model {a.model!r}; expected one of {sorted(MODELS)}")
    t0 = time.monotonic()
    path = build_model(a.model, a.model_root, weights=True)
    lens = [int(x) for x in a.prompts.split(",")]
    prompts = [pr for i, n in enumerate(lens) for pr in _prompts(1, n, 77 + i)]
    results = measure(path, prompts, a.new, tuple(filter(None, a.dtypes.split(","))))
    print(f"{a.model} ({path}), {a.new} greedy tokens per prompt, transformers only ({time.monotonic() - t0:.0f} s):")
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
