"""The demo: a Gemma-4-style model served with speculative decoding, and the acceptance collapse the
SWA pool-resolution policy prevents, as it happens.

A tiny Gemma 4 text model is built from a transformers config with seeded random weights (sliding
layers and full layers of different head dims, KV-shared tail layers) and served by
:class:`triton_swa.serving.Engine` over triton-swa's pools, through
``triton_swa.integrations.transformers`` and the Triton kernels. A draft worker in the Gemma 4 +
DFlash topology (its own SWA-backed pool, the target's ``req_to_token``, allocator and mapping) runs
the target's own weights, so with the right K/V it proposes exactly what the target decides: every
draft is accepted, ``k + 1`` tokens per round.

The same request stream is served twice, side by side: once with the policy of docs/contract.md §3 on both workers,
once with the rule it replaced on the draft worker (**this demo's own option, never a default of the
library**): a draft worker other than FROZEN_KV MTP resolves no SWA pool, so its sliding layers read
``swa_buffer[full_slot]``. The allocators start fresh and unshuffled, so full and SWA slots agree at
first and drift apart only when eviction and reuse recycle SWA slots; then the legacy draft reads
other tokens' K/V and its acceptance falls. Slots past the SWA buffer, which that rule would read out
of bounds (on a GPU: another buffer's bytes, or a fault), are clamped to its last row.

At the end: acceptance per window of rounds, the first round where the legacy proposals diverge from
the policy's, tokens per second, KV bytes against a full-pool-only layout, the largest attention error
against the reference path (spot-checked layers), and whether the target's tokens equal
transformers' own ``generate()`` with eager attention.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from dataclasses import dataclass, field

import torch

__all__ = ["PRESETS", "main", "run_demo"]


@dataclass(frozen=True)
class Preset:
    """Sizes of one demo configuration."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int  # sliding layers
    head_dim: int  # sliding layers
    global_kv_heads: int  # full layers
    global_head_dim: int  # full layers
    kv_shared: int  # trailing KV-shared layers
    vocab: int
    sliding_window: int  # Hugging Face's S (W = S - 1)
    requests: int
    prompt_lens: tuple[int, int]  # uniform in [lo, hi]
    new_tokens: tuple[int, int]
    arrival_every: int  # a request arrives every this many steps
    num_draft: int
    chunk: int
    max_running: int
    full_size: int
    swa_size: int
    page_size: int
    spot_every: int  # spot-check attention every this many steps
    dtype: str = "float32"
    # Random weights with tied embeddings make the next token mostly a copy of the current one (the
    # scaled embedding dominates the residual stream); a louder attention output (the post-attention
    # norm's weight) makes it depend on the context, as a trained model's does.
    attention_gain: float = 4.0


PRESETS = {
    # finishes in a few minutes on 2 CPU cores with the kernels in Triton's interpreter
    "cpu": Preset(
        layers=3,
        hidden=64,
        heads=4,
        kv_heads=2,
        head_dim=16,
        global_kv_heads=1,
        global_head_dim=32,
        kv_shared=0,
        vocab=128,
        sliding_window=8,
        requests=5,
        prompt_lens=(12, 24),
        new_tokens=(22, 32),
        arrival_every=4,
        num_draft=3,
        chunk=16,
        max_running=2,
        full_size=256,
        swa_size=64,
        page_size=1,
        spot_every=4,
    ),
    "gpu": Preset(
        layers=12,
        hidden=512,
        heads=8,
        kv_heads=4,
        head_dim=128,
        global_kv_heads=2,
        global_head_dim=256,
        kv_shared=4,
        vocab=4096,
        sliding_window=128,
        requests=32,
        prompt_lens=(64, 384),
        new_tokens=(64, 128),
        arrival_every=2,
        num_draft=4,
        chunk=512,
        max_running=16,
        full_size=32768,
        swa_size=8192,
        page_size=16,
        spot_every=8,
        attention_gain=16.0,
    ),
}


def build_model(p: Preset, seed: int, device):
    """A tiny Gemma 4 text model with seeded random weights (larger than the default init, so that its
    greedy tokens are decided by clear margins; see ``Preset.attention_gain``)."""
    import transformers

    types = ["sliding_attention" if (i + 1) % 3 else "full_attention" for i in range(p.layers)]
    types[-1] = "full_attention"
    cfg = transformers.Gemma4TextConfig(
        vocab_size=p.vocab,
        hidden_size=p.hidden,
        intermediate_size=2 * p.hidden,
        num_hidden_layers=p.layers,
        num_attention_heads=p.heads,
        num_key_value_heads=p.kv_heads,
        head_dim=p.head_dim,
        global_head_dim=p.global_head_dim,
        num_global_key_value_heads=p.global_kv_heads,
        sliding_window=p.sliding_window,
        num_kv_shared_layers=p.kv_shared,
        hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=p.vocab,
        layer_types=types,
        initializer_range=0.3,
        max_position_embeddings=4096,
        eos_token_id=None,
        pad_token_id=0,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = transformers.Gemma4ForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.post_attention_layernorm.weight.mul_(p.attention_gain)
    return model.to(device=device, dtype=getattr(torch, p.dtype))


def request_stream(p: Preset, seed: int):
    from .serving import Request

    g = torch.Generator().manual_seed(seed + 1)
    reqs = []
    for i in range(p.requests):
        n = int(torch.randint(p.prompt_lens[0], p.prompt_lens[1] + 1, (1,), generator=g))
        m = int(torch.randint(p.new_tokens[0], p.new_tokens[1] + 1, (1,), generator=g))
        prompt = torch.randint(1, p.vocab, (n,), generator=g).tolist()
        reqs.append(Request(i, prompt, m, arrival=i * p.arrival_every))
    return reqs


def _legacy_backend_class():
    from .backend import TritonSWAAttnBackend

    class PreFixDraftBackend(TritonSWAAttnBackend):
        """The rule before the fix (demo only): a draft worker other than FROZEN_KV MTP resolves no SWA
        pool, whatever its active pool is. Its sliding layers then read the SWA buffer at full slots;
        slots past that buffer are clamped to its last row (they would be out-of-bounds reads)."""

        @staticmethod
        def _resolve_swa_kv_pool(model_runner):
            if model_runner.is_draft_worker and not model_runner.spec_algorithm.is_frozen_kv_mtp():
                return None
            return TritonSWAAttnBackend._resolve_swa_kv_pool(model_runner)

        def _layer_indices(self, kv_indptr, kv_indices, page_table, window_starts, lens, window_left, extend, translate):
            # every index build of a step (eager, paired, CUDA-graph buffers) ends here
            swa = getattr(self.kv_pool, "swa_kv_pool", None)
            if window_left >= 0 and not translate and swa is not None:
                rows = swa.k_buffer[0].shape[0]
                if kv_indices is not None:
                    kv_indices.clamp_(max=rows - 1)
                if page_table is not None:
                    page_table.clamp_(max=rows // self.page_size - 1)
            return super()._layer_indices(kv_indptr, kv_indices, page_table, window_starts, lens, window_left, extend, translate)

    return PreFixDraftBackend


class SpotCheck:
    """An observer of the attention calls: every ``every``-th step, the last (up to four) queries of the
    step's first request in one sliding and one full layer against dense attention (float64) over the
    K/V this worker computed for each position (kept here, by request row and position)."""

    def __init__(self, layers, window_left: int, every: int):
        import triton_swa_reference as ref

        self.ref = ref
        sliding = [s.layer_id for s in layers if s.is_sliding and s.kv_shared_layer_id is None]
        full = [s.layer_id for s in layers if not s.is_sliding and s.kv_shared_layer_id is None]
        self.layers = set(sliding[:1] + full[:1])
        self.window_left, self.every = window_left, every
        self.history: dict[tuple[int, int], dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
        self.calls = 0
        self.worst: dict[str, float] = {}
        self.checked = 0

    def __call__(self, layer, q, k, v, out, step):
        if layer.layer_id not in self.layers:
            return
        fb = step.forward_batch
        rows = fb.req_pool_indices.tolist()
        pos = step.position_ids.view(-1).tolist()
        counts = self._counts(fb)
        at = 0
        for r, n in zip(rows, counts):
            hist = self.history.setdefault((layer.layer_id, r), {})
            for j in range(n):
                hist[pos[at + j]] = (k[at + j].detach().double().cpu(), v[at + j].detach().double().cpu())
            at += n
        if layer.layer_id == min(self.layers):
            self.calls += 1
        if self.calls % self.every or not rows:
            return
        hist = self.history[(layer.layer_id, rows[0])]
        w = layer.sliding_window_size
        errs = []
        for j in range(max(0, counts[0] - 4), counts[0]):  # its last (up to) four queries
            p = pos[j]
            keys = [t for t in range(0 if w < 0 else max(0, p - w), p + 1)]
            kk = torch.stack([hist[t][0] for t in keys])
            vv = torch.stack([hist[t][1] for t in keys])
            want = self.ref.attention(q[j : j + 1].double().cpu(), kk, vv, None, sm_scale=layer.scaling, logit_cap=layer.logit_cap)
            errs.append(float((out[j : j + 1].double().cpu() - want).abs().max()))
        kind = "sliding" if w >= 0 else "full"
        self.worst[kind] = max(self.worst.get(kind, 0.0), max(errs))
        self.checked += 1

    @staticmethod
    def _counts(fb) -> list[int]:
        mode = fb.forward_mode
        if mode.is_decode():
            return [1] * fb.batch_size
        if mode.is_target_verify():
            return [fb.spec_info.draft_token_num] * fb.batch_size
        return list(fb.extend_seq_lens_cpu)


@dataclass
class Run:
    """One serving run of the demo and what it measured."""

    name: str
    engine: object
    checks: dict
    kv: object
    accept: list[float] = field(default_factory=list)  # mean acceptance length per speculative round
    proposals: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    peak_full: int = 0
    peak_swa: int = 0
    tokens: int = 0

    def mean_accept(self) -> float:
        return sum(self.accept) / len(self.accept) if self.accept else float("nan")


def _make_run(name, model, p: Preset, legacy: bool, requests, device) -> Run:
    from .backend import TritonSWAAttnBackend
    from .integrations import transformers as tswa
    from .serving import Engine

    max_ctx = p.prompt_lens[1] + p.new_tokens[1] + p.num_draft + 8
    target = tswa.build_paged_kv(
        model, size=p.full_size, size_swa=p.swa_size, page_size=p.page_size, max_num_reqs=p.max_running, max_context_len=max_ctx
    )
    draft = tswa.build_draft_paged_kv(model, target, backend_class=_legacy_backend_class() if legacy else TritonSWAAttnBackend)
    checks = {
        "target": SpotCheck(target.layers, target.window_left, p.spot_every),
        "draft": SpotCheck(draft.layers, draft.window_left, p.spot_every),
    }
    engine = Engine(
        tswa.ModelWorker(model, target, checks["target"]),
        tswa.ModelWorker(model, draft, checks["draft"]),
        num_draft_tokens=p.num_draft,
        chunk_size=p.chunk,
        max_running=p.max_running,
    )
    engine.submit(requests)
    return Run(name, engine, checks, target)


def _kv_bytes(kv, full_slots: int, swa_slots: int) -> tuple[int, int]:
    """Bytes of K/V held by ``full_slots`` / ``swa_slots`` tokens here, and by a full-pool-only layout
    (every owning layer at full slots)."""
    pool = kv.pool
    per_full = per_swa = 0
    for lid, (_, is_swa) in pool.layers_mapping.items():
        k, v = pool.get_kv_buffer(lid)
        b = (k[0].numel() * k.element_size()) + (v[0].numel() * v.element_size())
        if is_swa:
            per_swa += b
        else:
            per_full += b
    return full_slots * per_full + swa_slots * per_swa, full_slots * (per_full + per_swa)


def _generate_reference(model, requests, device):
    """transformers' own greedy ``generate()`` with eager attention, request by request."""
    model.set_attn_implementation("eager")
    outs = {}
    for r in requests:
        ids = torch.tensor([r.prompt], device=device)
        with torch.inference_mode():
            g = model.generate(
                ids,
                max_new_tokens=r.max_new_tokens,
                min_new_tokens=r.max_new_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
                output_scores=True,
                return_dict_in_generate=True,
            )
        outs[r.rid] = (g.sequences[0, len(r.prompt) :].tolist(), [s[0].float() for s in g.scores])
    return outs


def _serve(p: Preset, legacy: bool, seed: int, device: str, steps: int | None, queue) -> None:
    """One run, in its own process: serve the stream, report every step and then the summary."""
    from .integrations import transformers as tswa

    if device == "cpu":
        torch.set_num_threads(1)  # the interpreter's numpy work and a second torch thread slow each other
    tswa.register()
    model = build_model(p, seed, device)
    model.set_attn_implementation("triton_swa")
    name = "legacy" if legacy else "policy"
    run = _make_run(name, model, p, legacy, request_stream(p, seed), device)
    n = 0
    while steps is None or n < steps:
        t0 = time.perf_counter()
        st = run.engine.step()
        run.seconds += time.perf_counter() - t0
        if st is None:
            break
        n += 1
        alloc = run.kv.allocator
        run.peak_full = max(run.peak_full, alloc.size - alloc.full_available_size())
        run.peak_swa = max(run.peak_swa, alloc.size_swa - alloc.swa_available_size())
        run.tokens += st.committed
        if st.mode == "speculative":
            run.accept.append(sum(a + 1 for a in st.accepted) / len(st.accepted))
            run.proposals.append(st.proposals)
        queue.put(("step", name, st.committed, run.mean_accept()))
    used, full_only = _kv_bytes(run.kv, run.peak_full, run.peak_swa)
    done = not run.engine.waiting and not run.engine.running
    queue.put(
        (
            "done",
            name,
            {
                "accept": run.accept,
                "mean_accept": run.mean_accept(),
                "tokens": run.tokens,
                "seconds": run.seconds,
                "steps": n,
                "tokens_per_s": run.tokens / run.seconds if run.seconds else float("nan"),
                "kv_bytes_peak": used,
                "kv_bytes_full_only": full_only,
                "proposals": run.proposals,
                "complete": done,
                "outputs": {r.rid: r.output for r in run.engine.finished},
                "worst_error": {w: dict(c.worst) for w, c in run.checks.items()},
                "checked": {w: c.checked for w, c in run.checks.items()},
            },
        )
    )


@contextlib.contextmanager
def _interpreter_env(on: bool):
    """``TRITON_INTERPRET=1`` in the environment the serving processes are spawned with (a CPU run:
    they import triton fresh, so their kernels run in Triton's interpreter); this process's own
    environment is left as it was."""
    saved = os.environ.get("TRITON_INTERPRET")
    if on:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


def run_demo(
    preset: str | Preset = "cpu",
    device: str | None = None,
    steps: int | None = None,
    seed: int = 0,
    plot: str | None = None,
    quiet: bool = False,
) -> dict:
    """Serve the demo's stream twice, side by side in two processes (policy; the pre-fix rule on the
    draft worker), and return what was measured.

    Returns:
        dict: ``"runs"``: per run (``"policy"``, ``"legacy"``) its acceptance per round, spot-check
        errors, tokens per second, KV bytes, outputs; ``"generate_match"`` / ``"generate_total"``,
        ``"near_ties"``, ``"mismatched"`` (rid, first differing index, generate's top-two logit gap there),
        ``"diverged_at"``.
    """
    import multiprocessing as mp

    p = PRESETS[preset] if isinstance(preset, str) else preset
    preset = preset if isinstance(preset, str) else "custom"
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_serve, args=(p, legacy, seed, device, steps, queue), daemon=True) for legacy in (False, True)]
    with _interpreter_env(device == "cpu"):
        for proc in procs:
            proc.start()
    requests = request_stream(p, seed)
    bar = None
    if not quiet:
        from tqdm import tqdm

        bar = tqdm(total=2 * sum(r.max_new_tokens for r in requests), desc="tokens served (both runs)", unit="tok", dynamic_ncols=True)
    live = {"policy": float("nan"), "legacy": float("nan")}
    runs = {}
    while len(runs) < 2:
        try:
            kind, name, payload, *rest = queue.get(timeout=5)
        except Exception:  # noqa: BLE001 - a queue timeout: check the children are alive
            dead = [proc for proc in procs if proc.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a demo run failed (exit code {dead[0].exitcode}); its traceback is above") from None
            continue
        if kind == "done":
            runs[name] = payload
            continue
        live[name] = rest[0]
        if bar is not None:
            bar.update(payload)
            bar.set_postfix_str(f"mean acceptance: policy {live['policy']:.2f}, legacy {live['legacy']:.2f} (ideal {p.num_draft + 1})")
    for proc in procs:
        proc.join()
    if bar is not None:
        bar.close()

    policy, legacy = runs["policy"], runs["legacy"]
    diverged = next((i for i, (a, b) in enumerate(zip(policy["proposals"], legacy["proposals"])) if a != b), None)
    match, ties, mismatched = 0, 0, []
    # an argmax "near-tie": the top two logits closer than what the dtype's rounding can move them
    tie_tol = 1e-3 if p.dtype == "float32" else 6e-2
    if policy["complete"]:
        from .integrations import transformers as tswa

        tswa.register()
        model = build_model(p, seed, device)
        ref = _generate_reference(model, requests, device)
        for r in requests:
            got = policy["outputs"][r.rid]
            want, scores = ref[r.rid]
            if got == want:
                match += 1
                continue
            j = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            gap = float(scores[j].topk(2).values.diff().abs()) if j < len(scores) else float("nan")
            ties += int(gap < tie_tol)
            mismatched.append((r.rid, j, round(gap, 5)))
    same = sum(policy["outputs"].get(r.rid) == legacy["outputs"].get(r.rid) for r in requests)
    result = {
        "preset": preset,
        "device": device,
        "ideal": p.num_draft + 1,
        "diverged_at": diverged,
        "legacy_equals_policy": same,
        "tie_tol": tie_tol,
        "generate_match": match,
        "generate_total": len(requests) if policy["complete"] else 0,
        "near_ties": ties,
        "mismatched": mismatched,
        "runs": runs,
    }
    if not quiet:
        _report(result, p)
    if plot:
        _plot(result, plot)
    return result


def _report(result: dict, p: Preset) -> None:
    ideal = result["ideal"]
    print(
        f"\ntriton-swa demo, preset {result['preset']} on {result['device']}"
        f"{' (Triton interpreter)' if result['device'] == 'cpu' else ''}: tiny Gemma 4 text model "
        f"({p.layers} layers, window S={p.sliding_window}), {p.requests} requests, k={p.num_draft} drafts "
        f"(ideal acceptance {ideal})"
    )
    width = 8
    policy, legacy = result["runs"]["policy"]["accept"], result["runs"]["legacy"]["accept"]
    print(f"\nmean acceptance length per {width} rounds")
    print(f"{'rounds':>10} | {'policy':>7} | {'legacy':>7}")
    for at in range(0, max(len(policy), len(legacy)), width):
        cells = []
        for acc in (policy, legacy):
            part = acc[at : at + width]
            cells.append(f"{sum(part) / len(part):7.2f}" if part else f"{'-':>7}")
        print(f"{at:>4}-{at + width - 1:<5} | {cells[0]} | {cells[1]}")
    d = result["diverged_at"]
    print(f"\nfirst round where the legacy draft's proposals differ from the policy's: {'none' if d is None else d}")
    print(
        f"\n{'run':<8} {'mean acc':>8} {'tokens':>7} {'tok/s':>8} {'KV MB peak':>11} {'full-only':>10} "
        f"{'max err target (sliding/full)':>30} {'max err draft (sliding/full)':>29}"
    )
    for name, r in result["runs"].items():

        def errs(w, r=r):
            e = r["worst_error"][w]
            return f"{e.get('sliding', float('nan')):.1e} / {e.get('full', float('nan')):.1e}"

        print(
            f"{name:<8} {r['mean_accept']:8.2f} {r['tokens']:7d} {r['tokens_per_s']:8.1f} "
            f"{r['kv_bytes_peak'] / 2**20:11.2f} {r['kv_bytes_full_only'] / 2**20:10.2f} {errs('target'):>30} "
            f"{errs('draft'):>29}"
        )
    print(
        "(tok/s: committed tokens over the run's own step time; the two runs share the machine while both run, "
        "and the attention spot-checks copy K/V to the host)"
    )
    ties = [m for m in result["mismatched"] if m[2] < result["tie_tol"]]
    beyond = [m for m in result["mismatched"] if not m[2] < result["tie_tol"]]
    print(
        f"\ntarget tokens agree with transformers' generate() (eager attention) on "
        f"{result['generate_match'] + len(ties)} of {result['generate_total']} requests: {result['generate_match']} equal"
        + (
            f", {len(ties)} first differ where generate()'s own top two logits are < {result['tie_tol']:g} apart "
            f"(a near-tie that the dtype's rounding decides; request, token, gap): {ties}"
            if ties
            else ""
        )
        + (f"\n{len(beyond)} DIFFER beyond that rule (request, token, gap): {beyond}" if beyond else "")
    )
    print(
        f"the legacy run's tokens equal the policy run's: {result['legacy_equals_policy']} of {p.requests} requests "
        "(speculative decoding is lossless: the wrong K/V cost only acceptance, silently)"
    )


def _plot(result: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot needs matplotlib (pip install 'triton-swa[demo]')")
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    for name, r in result["runs"].items():
        ax.plot(range(len(r["accept"])), r["accept"], label=name)
    ax.axhline(result["ideal"], color="gray", linestyle=":", label="ideal (k + 1)")
    ax.set_xlabel("speculative round")
    ax.set_ylabel("mean acceptance length")
    ax.set_title(f"triton-swa demo ({result['preset']}): policy vs the pre-fix rule on the draft worker")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot written to {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="triton-swa demo", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="cpu",
        help="cpu: a few minutes on 2 cores in Triton's interpreter; gpu: a larger model and stream",
    )
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when present")
    ap.add_argument("--steps", type=int, default=None, help="stop after this many engine steps (default: serve all)")
    ap.add_argument("--seed", type=int, default=0, help="weights and request stream")
    ap.add_argument("--plot", metavar="PATH", default=None, help="write a PNG of acceptance over rounds")
    args = ap.parse_args(argv)
    result = run_demo(args.preset, args.device, args.steps, args.seed, args.plot)
    ok = result["runs"]["policy"]["mean_accept"] > result["runs"]["legacy"]["mean_accept"]
    return 0 if ok or args.steps else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
