"""SGLang's real engine on a GPU, one attention backend at a time: its tokens and its speed.

``python -m triton_swa.benchmark.serve`` (``triton-swa bench --op serve`` runs the same) starts
``sglang.Engine`` once per (model, attention backend, CUDA graphs on/off, speculative algorithm) in a
fresh subprocess, and in that one engine start runs the phases asked for:

- ``tokens``: a few prompts longer than the sliding window, greedy, with SGLang's top-2 logprobs;
  the parent compares them with transformers' ``generate()`` on the same GPU and weights (bf16,
  eager attention) and with the other backends' tokens;
- ``load``: closed-loop streaming clients (``Engine.async_generate(stream=True)``) at each concurrency
  and prompt length, ``--output-len`` tokens each (greedy, EOS ignored): output tokens per second over
  the phase, time to first token and inter-token latency (p50 / p99). Before the first phase of each
  prompt length one request of that length warms the engine up (:data:`WARM_UP_TOKENS` new tokens);
  its time to first token is reported as the cold start (the JIT compiles a fresh engine meets on its
  first prompt of that size), and the timed phases are warm;
- ``profile``: one prefill, then a batch's decode steps, under SGLang's profiler: device time by
  kernel class (attention, GEMMs, the rest: :mod:`triton_swa.benchmark.engine_profile`).

Models are written here: random weights from Gemma-like and gpt-oss-like configs at real sizes (:data:`MODELS`), in
bf16. A model whose tokens are checked has its weights written (transformers loads the same bytes);
a speed-only model is a config with ``load_format="dummy"`` (SGLang's own seeded random init).

The engine's environment on a GPU (:func:`gpu_engine_env`): ``SGLANG_PLUGINS=triton_swa`` (for every
backend, so all run in the same set-up), ``SGLANG_FORCE_FUSED_OP_BACKEND=torch`` (SGLang's fused
layers take their plain-torch paths: its compiled ``sgl_kernel`` is built for another torch), the
``sgl_kernel`` stand-in (``tests/integration/stubs_cuda``) on ``PYTHONPATH``, where the real one
does not import, and the test-side plugin that gives the norm and rotary layers one Triton kernel
each where the real ``sgl_kernel`` would give them a fused one (``tests/engine/plugins/
triton_swa_fused_ops.py``; ``TRITON_SWA_ENGINE_FUSED_OPS=torch`` leaves it out). All are the same for
every backend compared.

Results: ``serve-<date>-<gpu>.csv`` (one row per phase and backend, :data:`COLUMNS`), ``serve-<sha>.json``
(everything each run returned), ``serve-<run id>.png`` (output tokens/s and TTFT per phase and
backend, where matplotlib is installed; ``triton-swa bench --replot CSV`` redraws it from the rows)
and a text report on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from triton_swa.benchmark.engine_profile import profile_decode, profile_first, profile_prefill, stream_one
from triton_swa.testing.sglang_engine import ENGINE_PLUGINS, fused_ops_standin, gpu_engine_env, sgl_kernel_path, tie_tol

__all__ = ["COLUMNS", "MODELS", "ServeModel", "build_model", "compare_tokens", "gpu_engine_env", "main", "run_backend", "tie_tol"]


COLUMNS = [
    "op",
    "case",
    "provider",
    "out_tok_s",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "itl_ms_p50",
    "itl_ms_p99",
    "requests",
    "output_tokens",
    "phase_s",
    "start_s",
    "accept_len",
    "gpu",
    "torch",
    "triton",
    "sglang",
    "git_sha",
    "date",
    "dirty",
    "run_id",
    "status",
]


@dataclasses.dataclass(frozen=True)
class ServeModel:
    """A Gemma-like model at a real size, random weights (see the module doc)."""

    family: str  # tiny_models family: gemma3, gemma4, gpt-oss
    window: int  # Hugging Face sliding_window
    layers: int
    shape: dict
    vocab_size: int
    note: str
    engine_args: dict = dataclasses.field(default_factory=dict)
    # test-side SGLang plugins (tests/engine/plugins) the engine loads for this model on a GPU, for
    # every backend alike
    plugins: tuple = ()


# Gemma 3 1B and 12B: the published text configs' dims. Gemma 4: a Gemma-4-like shape of this
# project's choosing (the SWAKVPool, 512-wide full layers, KV-shared layers), not a published model.
_GEMMA4_LIKE = dict(
    layers=24,
    hidden_size=2048,
    intermediate_size=8192,
    heads=8,
    sliding_head_dim=256,
    full_head_dim=512,
    sliding_kv_heads=2,
    full_kv_heads=1,
    kv_shared=6,
    full_every=6,
    ple=256,
    max_positions=40960,
)
MODELS: dict[str, ServeModel] = {
    "gemma3-1b": ServeModel(
        "gemma3",
        512,
        26,
        dict(hidden_size=1152, intermediate_size=6912, heads=4, kv_heads=1, head_dim=256, full_every=6, max_positions=40960),
        262144,
        "Gemma 3 1B's dims: 26 layers (every 6th full, and the last; window 512), 4 q / 1 kv heads of 256",
    ),
    "gemma3-12b": ServeModel(
        "gemma3",
        1024,
        48,
        dict(hidden_size=3840, intermediate_size=15360, heads=16, kv_heads=8, head_dim=256, full_every=6, max_positions=40960),
        262144,
        "Gemma 3 12B's dims: 48 layers (every 6th full; window 1024), 16 q / 8 kv heads of 256",
    ),
    "gemma4-like": ServeModel(
        "gemma4",
        512,
        24,
        _GEMMA4_LIKE,
        32768,
        "Gemma-4-like: 24 layers (5:1, window 512; the top 6 KV-shared), 8 q heads; sliding 2 kv x 256, full 1 kv x 512; "
        "vocabulary 32768 (per-layer inputs of 256 per layer and token: 200M parameters at this vocabulary)",
        # SGLang 0.5.23's prefill CUDA graph refuses KV-shared layers for every attention backend
        # ("invalid or duplicate attention layer_id: 16", cuda_graph_setup.index_attention_layers_by_global_id):
        # decode graphs stay on
        engine_args=dict(disable_prefill_cuda_graph=True),
    ),
    # the seed's scenario (--drift): the Gemma-4-like shape at window 16, so short requests pass the
    # window and SGLang evicts SWA slots (SGLANG_SWA_EVICTION_INTERVAL=4) while full ones stay
    "gemma4-drift": ServeModel(
        "gemma4",
        16,
        24,
        _GEMMA4_LIKE,
        32768,
        "the Gemma-4-like shape at window 16: the seed's scenario (a STANDALONE draft of its own weights)",
        engine_args=dict(disable_prefill_cuda_graph=True),
    ),
    # STANDALONE's draft: a 2-layer Gemma 3 of the targets' vocabulary
    "gemma3-draft": ServeModel(
        "gemma3",
        512,
        2,
        dict(hidden_size=640, intermediate_size=2048, heads=4, kv_heads=1, head_dim=256, full_every=2, max_positions=40960),
        262144,
        "a 2-layer Gemma 3 (hidden 640), the STANDALONE draft",
    ),
    # gpt-oss-20b's attention (64 q heads of 64, 8 kv heads, window 128, sinks, sliding and full layers
    # alternating, hidden 2880) and its MoE block (experts of 2880 with biases, clamped SwiGLU, top-4 of
    # softmax routing), at 4 layers, 8 experts and vocabulary 32768 instead of 24, 32 and 201088 (1.1B
    # parameters, 2.2 GB of bf16 to write and load); rope: default at theta 150000 (the published
    # config's YaRN scaling left out). Its MoE runs SGLang's Triton runner through the
    # triton_swa_moe_cuda_path plugin (the forced torch backend's native MoE cannot be captured in a
    # CUDA graph) with moe_align_block_size and moe_sum_reduce from the sgl_kernel stand-in.
    "gpt-oss-like": ServeModel(
        "gpt-oss",
        128,
        4,
        dict(
            hidden_size=2880,
            intermediate_size=2880,
            heads=64,
            kv_heads=8,
            head_dim=64,
            experts=8,
            experts_per_token=4,
            max_positions=131072,
            rope_theta=150000.0,
        ),
        32768,
        "gpt-oss-like: gpt-oss-20b's attention (64 q / 8 kv heads of 64, window 128, sinks; sliding and full alternating) "
        "and MoE block (hidden 2880, experts with biases, clamped SwiGLU, top-4), at 4 layers, 8 experts, vocabulary 32768",
        plugins=("triton_swa_moe_cuda_path",),
    ),
    # tiny shapes for a CPU run of this harness (the interpreter): the plumbing, not the speed
    "gemma3-tiny": ServeModel("gemma3", 8, 4, {}, 384, "the CPU engine tier's tiny Gemma 3"),
    "gemma3-tiny-draft": ServeModel("gemma3", 8, 1, {}, 384, "the CPU engine tier's STANDALONE draft"),
}


def build_model(name: str, root: str, *, weights: bool, seed: int = 0) -> str:
    """Write model ``name`` under ``root`` (once: an existing directory is reused); returns its path."""
    from triton_swa.testing.tiny_models import build_tiny_model

    m = MODELS[name]
    path = os.path.join(root, f"{name}-{'w' if weights else 'dummy'}")
    if os.path.exists(os.path.join(path, "triton_swa_tiny.json")):
        return path
    num_layers = m.layers if m.family != "gemma4" else None
    build_tiny_model(
        m.family,
        path,
        seed,
        window=m.window,
        num_layers=num_layers,
        shape=m.shape or None,
        vocab_size=m.vocab_size,
        dtype="bfloat16" if m.shape else None,
        weights=weights,
    )
    return path


# ----------------------------------------------------------------------------------------------
# the engine's side (a subprocess: `python -m triton_swa.benchmark.serve --worker SPEC RESULT`)


def _write(path: str, result: dict | list) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1, default=str)
    os.replace(tmp, path)


def _prompts(n: int, length: int, seed: int, vocab: int = 384) -> list[list[int]]:
    """``n`` prompts of ``length`` token ids (2 is <bos>), distinct from their first tokens on (no
    radix-cache hits between them)."""
    import random

    rng = random.Random(seed)
    return [[2] + [rng.randrange(4, vocab) for _ in range(length - 1)] for _ in range(n)]


def _top2_gaps(meta: dict) -> list[float | None]:
    """The top-2 logprob gap at each output token, from SGLang's ``output_top_logprobs``."""
    gaps = []
    for entry in meta.get("output_top_logprobs") or []:
        vals = sorted((e[0] for e in entry or [] if e and e[0] is not None), reverse=True)
        gaps.append(vals[0] - vals[1] if len(vals) >= 2 else None)
    return gaps


WARM_UP_TOKENS = 8  # new tokens of the warm-up request before each prompt length's first timed phase


def load_phases(engine, loads: list, output_len: int, result: dict, stage, profile_cold: str | None = None, stacks: bool = False) -> None:
    """Each ``(prompt_len, concurrency, requests)`` of ``loads`` timed on ``engine``, in order, each
    prompt length's first phase preceded by one warm-up request of that length (a prompt of its own,
    so SGLang's radix cache serves no timed prompt from it). Fills ``result["cold_ttft_ms"]`` (the
    warm-ups' times to first token by prompt length) and ``result["phases"]`` (one summary per phase)
    as they finish; ``stage(what)`` is called before each request set and once more at the end, so
    that a run cut short keeps what it measured. ``profile_cold`` (the device, "cuda" or "cpu"): the first
    warm-up (the engine's first request where no token check ran before it) runs under SGLang's
    profiler, host and device (``stacks``: Python calls too)
    (:func:`~triton_swa.benchmark.engine_profile.profile_first`), into ``result["profile"]``."""
    cold = result.setdefault("cold_ttft_ms", {})
    phases = result.setdefault("phases", [])
    for i, (prompt_len, concurrency, requests) in enumerate(loads):
        if str(prompt_len) not in cold:
            stage(f"warm-up P{prompt_len}")
            prompt = _prompts(1, prompt_len, 900 + i)[0]
            if profile_cold and not cold:
                pr = profile_first(engine, prompt, os.path.abspath("profile-first"), profile_cold, WARM_UP_TOKENS, stacks)
                result.setdefault("profile", {})[f"first request P{prompt_len} (cold)"] = pr
                cold[str(prompt_len)] = pr["ttft_ms"]
            else:
                sampling = {"temperature": 0.0, "max_new_tokens": WARM_UP_TOKENS, "ignore_eos": True}
                warm = engine.loop.run_until_complete(stream_one(engine, prompt, sampling))
                cold[str(prompt_len)] = 1e3 * warm["ttft"]
        stage(f"load P{prompt_len} C{concurrency}")
        ph = engine.loop.run_until_complete(_load_phase(engine, prompt_len, concurrency, requests, output_len, 1000 + i))
        rs = ph["results"]
        ttfts = [r["ttft"] for r in rs]
        itls = [x for r in rs for x in r["itls"]]
        toks = sum(r["tokens"] for r in rs)
        accepts = [r["accept_len"] for r in rs if r["accept_len"] is not None]
        phases.append(
            dict(
                prompt_len=prompt_len,
                concurrency=concurrency,
                requests=len(rs),
                output_tokens=toks,
                phase_s=ph["phase_s"],
                out_tok_s=toks / ph["phase_s"],
                ttft_ms_p50=1e3 * _quantile(ttfts, 0.5),
                ttft_ms_p99=1e3 * _quantile(ttfts, 0.99),
                itl_ms_p50=1e3 * _quantile(itls, 0.5),
                itl_ms_p99=1e3 * _quantile(itls, 0.99),
                accept_len=statistics.mean(accepts) if accepts else None,
            )
        )
    stage("load done")


async def _load_phase(engine, prompt_len: int, concurrency: int, requests: int, output_len: int, seed: int) -> dict:
    sampling = {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True}
    prompts = _prompts(requests, prompt_len, seed)
    queue = list(prompts)
    results: list[dict] = []

    async def client():
        while queue:
            results.append(await stream_one(engine, queue.pop(), sampling))

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    phase_s = time.perf_counter() - t0
    return {"phase_s": phase_s, "results": results}


def _quantile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def worker_main(spec_path: str, result_path: str) -> int:
    import traceback

    with open(spec_path) as f:
        spec = json.load(f)
    result: dict[str, Any] = {"ok": False, "stage": "import", "error": "", "phases": []}
    _write(result_path, result)
    engine = None
    try:
        t0 = time.monotonic()
        import sglang

        result["sglang"] = sglang.__version__
        result["stage"] = "launch"
        _write(result_path, result)
        engine = sglang.Engine(**spec["engine_args"])
        result["start_s"] = time.monotonic() - t0
        tok = spec.get("tokens")
        if tok:
            result["stage"] = "tokens"
            _write(result_path, result)
            sampling = {"temperature": 0.0, "max_new_tokens": tok["max_new_tokens"], "ignore_eos": True}
            outs = engine.generate(input_ids=tok["prompts"], sampling_params=sampling, return_logprob=True, top_logprobs_num=2)
            outs = outs if isinstance(outs, list) else [outs]
            result["tokens"] = [list(o["output_ids"]) for o in outs]
            result["top2_gaps"] = [_top2_gaps(o.get("meta_info", {})) for o in outs]
            result["spec_meta"] = [
                {k: o.get("meta_info", {}).get(k) for k in ("spec_accept_length", "spec_verify_ct", "completion_tokens")} for o in outs
            ]
            _write(result_path, result)
        if spec.get("load"):

            def stage(what: str) -> None:
                result["stage"] = what
                _write(result_path, result)

            cold_device = "cpu" if spec["engine_args"].get("device") == "cpu" else "cuda"
            cold = spec.get("profile_cold")
            load_phases(engine, spec["load"], spec["output_len"], result, stage, cold_device if cold else None, cold == "stacks")
        for i, (prompt_len, concurrency) in enumerate(spec.get("profile") or []):
            device = "cpu" if spec["engine_args"].get("device") == "cpu" else "cuda"
            profiles = result.setdefault("profile", {})
            result["stage"] = f"profile prefill P{prompt_len}"
            _write(result_path, result)
            prompt = _prompts(1, prompt_len, 4242 + i)[0]
            profiles[f"prefill P{prompt_len}"] = profile_prefill(engine, prompt, os.path.abspath(f"profile-prefill-{i}"), device)
            result["stage"] = f"profile decode P{prompt_len} C{concurrency}"
            _write(result_path, result)
            prompts = _prompts(concurrency, prompt_len, 4343 + i)
            folder = os.path.abspath(f"profile-decode-{i}")
            room = spec["engine_args"].get("context_length", 1 << 30) - prompt_len  # the context caps the outputs
            profiles[f"decode P{prompt_len} C{concurrency}"] = profile_decode(
                engine, prompts, PROFILE_STEPS, folder, device, max_new_tokens=min(16 * PROFILE_STEPS, room)
            )
        result["ok"], result["stage"] = True, "done"
    except BaseException as e:  # noqa: BLE001 - everything is reported to the parent
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc()
        traceback.print_exc()
    finally:
        _write(result_path, result)
        if engine is not None:
            try:
                engine.shutdown()
            except Exception:  # noqa: BLE001
                traceback.print_exc()
    return 0 if result["ok"] else 1


# ----------------------------------------------------------------------------------------------
# the parent's side


def run_backend(
    model_path: str,
    backend: str,
    *,
    engine_args: dict,
    tokens: dict | None,
    load: list[tuple[int, int, int]],
    output_len: int,
    pythonpath: list[str],
    profile: list[tuple[int, int]] | None = None,
    profile_cold: bool | str = False,
    env: dict | None = None,
    timeout_s: float = 600.0,
    log_path: str | None = None,
    device: str = "cuda",
) -> dict:
    """One engine start of ``backend`` on ``model_path`` running the phases asked for (the token check,
    the ``load`` phases, then each ``profile``'s prefill and decode under SGLang's profiler); never
    raises for an engine failure (``ok`` False, ``stage``, ``error``, ``tracebacks``)."""
    from triton_swa.testing.sglang_engine import _kill_group, extract_tracebacks

    args = dict(engine_args, model_path=model_path, attention_backend=backend)
    spec = dict(engine_args=args, tokens=tokens, load=[list(x) for x in load], output_len=output_len, profile=profile)
    spec["profile_cold"] = profile_cold
    with tempfile.TemporaryDirectory(prefix="triton_swa_serve_") as tmp:
        spec_path, result_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "result.json")
        log_path = log_path or os.path.join(tmp, "log.txt")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        t0 = time.monotonic()
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "triton_swa.benchmark.serve", "--worker", spec_path, result_path],
                cwd=tmp,
                env=gpu_engine_env(pythonpath, env, device),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            timed_out = False
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
        _kill_group(proc)
        wall = time.monotonic() - t0
        with open(log_path, errors="replace") as f:
            text = f.read()
        result = {"ok": False, "stage": "worker", "error": f"the worker exited with {proc.returncode} and wrote no result"}
        if os.path.exists(result_path):
            with open(result_path) as f:
                result = json.load(f)
        if timed_out:
            result["ok"] = False
            result["error"] = f"no result within {timeout_s:.0f} s (stage reached: {result.get('stage')})"
        result.update(backend=backend, model_path=model_path, engine_args=args, wall_s=wall, tracebacks=extract_tracebacks(text))
        if not result["ok"]:
            result["log_tail"] = "\n".join(text.splitlines()[-40:])
        return result


def hf_reference(
    model_path: str, prompts: list[list[int]], max_new_tokens: int, device: str, dtype: str | None = None
) -> tuple[list[list[int]], list[list[float]], list[list[float]]]:
    """transformers' greedy ``generate()`` on ``device`` in ``dtype`` (default: the saved weights'),
    eager attention: (tokens, top-2 logit gap per token, |top-1 logit| per token)."""
    import torch

    from triton_swa.testing.sglang_engine import hf_greedy
    from triton_swa.testing.tiny_models import model_info

    result = hf_greedy(model_path, prompts, max_new_tokens, dtype=dtype or model_info(model_path)["dtype"], device=device, return_top2=True)
    if device == "cuda":
        torch.cuda.empty_cache()
    return result


def compare_tokens(
    got: list[list[int]], want: list[list[int]], gaps: list[list[float]], tops: list[list[float]], dtype: str = "bfloat16"
) -> dict:
    """Per request: equal, or the first differing token with the reference's top-2 gap there and
    whether that is a near-tie in ``dtype`` (:func:`tie_tol`). ``one_token`` counts the reference
    streams that repeat one token (:func:`~triton_swa.testing.tiny_models.repeats_one_token`): on
    those, equal tokens say nothing about attention."""
    from triton_swa.testing.sglang_engine import first_divergence
    from triton_swa.testing.tiny_models import repeats_one_token

    out = {"equal": 0, "near_tie": 0, "differ": 0, "one_token": sum(map(repeats_one_token, want)), "requests": []}
    for g, w, gp, tp in zip(got, want, gaps, tops):
        i = first_divergence(g, w)
        if i is None:
            out["equal"] += 1
            out["requests"].append({"equal": True})
            continue
        gap = gp[i] if i < len(gp) else float("nan")
        tol = tie_tol(tp[i], dtype) if i < len(tp) else None
        tie = tol is not None and gap <= tol
        out["near_tie" if tie else "differ"] += 1
        out["requests"].append({"equal": False, "first": i, "gap": gap, "tol": tol, "near_tie": tie})
    return out


def _draft_args(algorithm: str, model: str, path: str, root: str, device: str) -> dict:
    """The engine arguments of ``algorithm`` on target ``model`` (at ``path``), its draft written under
    ``root``: NGRAM has none; STANDALONE's is a 2-layer Gemma 3 for a Gemma 3 and the target's own
    weights for a Gemma 4 (a vocabulary the Gemma 3 draft does not share); EAGLE, EAGLE3 and DFLASH get
    random-weight drafts of their own architectures (:mod:`triton_swa.benchmark.serve_drafts`)."""
    if algorithm == "NGRAM":
        return _spec_args(algorithm, None)
    if algorithm == "STANDALONE":
        if MODELS[model].family == "gemma4":
            return _spec_args(algorithm, path)
        return _spec_args(algorithm, build_model("gemma3-tiny-draft" if device == "cpu" else "gemma3-draft", root, weights=True))
    from triton_swa.benchmark.serve_drafts import build_draft, draft_engine_args

    return draft_engine_args(algorithm, build_draft(algorithm, path, root))


def _spec_args(algorithm: str, draft: str | None) -> dict:
    args: dict[str, Any] = {"speculative_algorithm": algorithm}
    if algorithm == "NGRAM":
        args.update(speculative_num_draft_tokens=4)
    else:
        args.update(speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    if draft:
        args["speculative_draft_model_path"] = draft
    return args


def drift_jobs(model: str, base_args: dict, *, root: str, pythonpath: list[str], out: Path, timeout_s: float, device: str) -> list[tuple]:
    """The seed's failure, live: ``model`` (written weights) with a STANDALONE draft of its own weights,
    on SGLang's engine with CUDA graphs as ``base_args`` set them, three starts (:func:`_run_jobs`'
    jobs): without speculation, with the policy, and with the pre-fix rule on the draft
    (tests/engine/plugins/triton_swa_prefix_rule.py: the draft's sliding layers read SWA buffers at full
    slots, writes stay right). The engine arguments of
    :data:`~triton_swa.testing.sglang_engine.DRIFT_ENGINE_ARGS` make the slot spaces drift mid-run; the
    plugin's step log (``drift_log``) gives each verify step's accepted drafts and the drift."""
    from triton_swa.testing.sglang_engine import DRIFT_ENGINE_ARGS

    path = build_model(model, root, weights=True)
    rng_prompts = [pr for i, n in enumerate((5, 29, 12)) for pr in _prompts(1, n, 7 + i)]
    tokens = {"prompts": rng_prompts, "max_new_tokens": 40}
    args = dict(base_args, **MODELS[model].engine_args, **DRIFT_ENGINE_ARGS, context_length=512)
    jobs = []
    for rule in ("", "policy", "legacy"):
        eargs = dict(args, **(_spec_args("STANDALONE", path) if rule else {}))
        log_path = out / f"drift-{model}-{rule or 'plain'}-steps.txt"
        env = {"SGLANG_SWA_EVICTION_INTERVAL": "4"}
        if rule:
            env.update(
                SGLANG_PLUGINS="triton_swa,triton_swa_prefix_rule",
                TRITON_SWA_PREFIX_RULE=rule,
                TRITON_SWA_PREFIX_RULE_WRITES="pool",
                TRITON_SWA_PREFIX_RULE_LOG=str(log_path),
            )
        run = dict(
            engine_args=eargs,
            tokens=tokens,
            load=[],
            output_len=0,
            pythonpath=[*pythonpath, str(ENGINE_PLUGINS)] if rule else pythonpath,
            env=env,
            timeout_s=timeout_s,
            log_path=str(out / f"engine-drift-{model}-{rule or 'plain'}.log"),
            device=device,
        )
        info = dict(
            model=model,
            graphs="off" if eargs.get("disable_cuda_graph") else "on",
            spec="STANDALONE" if rule else "",
            label=f"drift {rule or 'no speculation'}",
            rule=rule or "none",
            drift_log=str(log_path),
        )
        jobs.append((path, "triton_swa", run, info))
    return jobs


def report_drift(model: str, runs: list[dict]) -> list[dict]:
    """:func:`drift_jobs`' runs with their step logs read: acceptance per window of verify steps before
    and after the slot spaces drift, printed against the run without speculation; returns ``runs``."""
    from triton_swa.testing.sglang_engine import acceptance_windows, mean_accepted, steps_around_drift

    for r in runs:
        log_path = Path(r["drift_log"])
        steps = log_path.read_text().splitlines() if log_path.exists() else []
        r["step_log_lines"] = len(steps)
        if r["rule"] != "none":
            before, after = steps_around_drift(steps)
            r.update(
                steps_before=len(before),
                steps_after=len(after),
                accept_before=1 + mean_accepted(before),
                accept_after=1 + mean_accepted(after),
                windows_before=acceptance_windows(before),
                windows_after=acceptance_windows(after),
                resolutions=[line for line in steps if line.startswith("R ")][:2],
            )
    plain = runs[0].get("tokens")
    print(f"== the seed's scenario on {model} (graphs {runs[0]['graphs']}): acceptance length per window of 8 verify steps", flush=True)
    for r in runs[1:]:
        if not r["ok"]:
            continue
        same = "no plain run to compare" if plain is None else f"{sum(a == b for a, b in zip(r['tokens'], plain))}/{len(plain)} equal"
        print(
            f"  {r['rule']:7s} before the drift ({r['steps_before']} steps) {r['windows_before']} | after ({r['steps_after']} steps) "
            f"{r['windows_after']}; mean after {r['accept_after']:.2f}; tokens vs no speculation: {same}; "
            f"spec_accept_length per request {[m.get('spec_accept_length') for m in r.get('spec_meta', [])]}",
            flush=True,
        )
        for line in r["resolutions"]:
            print(f"    {line}", flush=True)
    _warn_vacuous(plain or [], "outputs without speculation", "a draft proposes them whatever its sliding layers read")
    return runs


def _warn_vacuous(streams: list[list[int]], what: str, why: str) -> None:
    """Print a VACUOUS line where some of ``streams`` repeat one token (a check over them is empty)."""
    from triton_swa.testing.tiny_models import repeats_one_token

    n = sum(map(repeats_one_token, streams))
    if n:
        print(f"  VACUOUS: {n} of {len(streams)} {what} repeat one token: {why}", flush=True)


def _environment() -> dict:
    import torch
    import triton

    gpu = torch.cuda.get_device_name(0).replace(" ", "_") if torch.cuda.is_available() else "cpu"
    return {"gpu": gpu, "torch": torch.__version__, "triton": triton.__version__}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m triton_swa.benchmark.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", nargs=2, metavar=("SPEC", "RESULT"), help=argparse.SUPPRESS)
    p.add_argument("--models", default="gemma3-1b", help=f"comma-separated, of {sorted(MODELS)}")
    p.add_argument("--backends", default="triton_swa,triton", help="SGLang attention backends, comma-separated")
    p.add_argument("--graphs", default="on", help="on, off or on,off: CUDA graphs (off: --disable-cuda-graph)")
    p.add_argument("--tokens", action="store_true", help="the token check (models with written weights)")
    p.add_argument("--token-prompts", default="600,1100,1700", help="prompt lengths of the token check")
    p.add_argument("--token-new", type=int, default=48, help="greedy tokens per prompt in the token check")
    p.add_argument("--load", default="", help="PROMPTxCONCURRENCY[xREQUESTS],... e.g. 4096x1x2,4096x16,32768x16")
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument(
        "--dtype", default="bfloat16", help="the engines' and transformers' dtype (float32 separates a defect from bf16 rounding)"
    )
    p.add_argument("--spec", default="", help="speculative algorithms, comma-separated (NGRAM, STANDALONE, ...)")
    p.add_argument("--spec-models", default="", help="the models --spec runs on (default: every model)")
    p.add_argument("--spec-load", action="store_true", help="speculative runs run the --load phases too (default: tokens only)")
    p.add_argument(
        "--spec-only", action="store_true", help="the --spec models' runs without speculation are left out (a call that times only those)"
    )
    p.add_argument(
        "--profile",
        default="",
        metavar="PROMPTxCONCURRENCY,...",
        help="after the other phases, under SGLang's profiler, for each: one prefill of PROMPT tokens, then CONCURRENCY such "
        f"requests' decode ({PROFILE_STEPS} steps): device time by kernel class",
    )
    p.add_argument(
        "--profile-cold",
        action="store_true",
        help="the first --load warm-up (each engine's first request) under SGLang's profiler, host and device: where a cold start goes",
    )
    p.add_argument(
        "--profile-cold-stacks",
        action="store_true",
        help="--profile-cold with Python stacks (every Python call an event: names the function a slow span sits in; slower). "
        "For a GPU: under Triton's interpreter every kernel operation is a Python call (the CPU engine's scheduler ran out of memory)",
    )
    p.add_argument("--jobs", type=int, default=1, help="engines side by side on the GPU, each pool capped (runs without --load only)")
    p.add_argument("--engine-arg", action="append", default=[], help="KEY=JSON, an extra sglang.Engine argument")
    p.add_argument(
        "--drift", default="", metavar="MODEL", help="the seed's scenario on MODEL (gemma4-drift): the pre-fix rule against the policy"
    )
    p.add_argument("--timeout", type=float, default=480.0, help="seconds per engine start")
    p.add_argument("--model-root", default=os.path.join(tempfile.gettempdir(), "triton_swa_serve_models"))
    p.add_argument("--out", default=None, help="folder for the CSV, the JSON and the engines' logs")
    p.add_argument("--git-sha", default=None)
    p.add_argument("--dirty", default=None)
    a = p.parse_args(argv)
    if a.worker:
        return worker_main(*a.worker)

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = Path(a.out or tempfile.mkdtemp(prefix="serve_"))
    out.mkdir(parents=True, exist_ok=True)
    env0 = _environment()
    from triton_swa.benchmark.runner import provenance

    sha, dirty = provenance(a.git_sha, a.dirty)
    run_id = datetime.datetime.now().strftime("%Y%m%dT%H%M%S")
    pythonpath = sgl_kernel_path(device)
    print(f"serve: {env0}, git {sha} ({dirty}); on PYTHONPATH: {pythonpath or 'nothing (the real sgl_kernel imports)'}", flush=True)
    if pythonpath and device == "cuda":
        layers = "Triton stand-ins (triton_swa_fused_ops)" if fused_ops_standin() else "plain torch (TRITON_SWA_ENGINE_FUSED_OPS=torch)"
        print(f"serve: SGLang's norm and rotary layers, every backend: {layers}", flush=True)
    load: list[tuple[int, int, int]] = []
    for item in filter(None, a.load.split(",")):
        parts = [int(x) for x in item.lower().replace("k", "000").split("x")]
        load.append((parts[0], parts[1], parts[2] if len(parts) > 2 else max(parts[1], 2)))
    base_args: dict[str, Any] = dict(
        dtype=a.dtype,
        random_seed=0,
        skip_tokenizer_init=True,
        log_level="warning",
        mem_fraction_static=0.8,
        cuda_graph_max_bs_decode=64,
        context_length=40960,
    )
    if device == "cpu":
        base_args.update(
            device="cpu", dtype="float32", disable_cuda_graph=True, mem_fraction_static=0.3, max_total_tokens=4096, context_length=512
        )
    for kv in a.engine_arg:
        k, v = kv.split("=", 1)
        base_args[k] = json.loads(v)
    records, rows = [], []
    json_path = out / f"serve-{sha}-{run_id}.json"
    # every model's weights and transformers' reference first, then every engine of the call (each
    # model's matrix and the drift's three starts) in one pool: --jobs engines side by side throughout
    plans, jobs = [], []
    for name in filter(None, a.models.split(",")):
        reference, model_jobs = _model_jobs(name, a, base_args, load, pythonpath, out, device)
        if reference is not None:
            records.append(dict(model=name, kind="transformers", ok=True, tokens=reference[0], gaps=reference[1]))
        plans.append((name, reference, len(model_jobs)))
        jobs += model_jobs
    drift = []
    if a.drift:
        drift = drift_jobs(a.drift, base_args, root=a.model_root, pythonpath=pythonpath, out=out, timeout_s=a.timeout, device=device)
    # engines side by side share the GPU's memory; only runs without a timed phase do
    parallel = 1 if any(_timed(job[2]) for job in jobs) else a.jobs
    # the drift's starts first: each runs longest (its pool is small, its requests wait for slots)
    csv_path = out / f"serve-{datetime.date.today().isoformat()}-{env0['gpu']}.csv"
    csv_rows = _CsvTail(csv_path)

    def on_done(done: list) -> None:
        # after each engine: the JSON and this run's CSV rows so far (a call cut short keeps both)
        _write(str(json_path), records + [r for r in done if r is not None])
        csv_rows.write(_rows_so_far(done[len(drift) :], plans, a.output_len, sha, dirty, run_id, env0))

    runs = _run_jobs(drift + jobs, parallel, on_done)
    drift_runs, runs, at = runs[: len(drift)], runs[len(drift) :], 0
    for name, reference, n in plans:
        model_runs, at = runs[at : at + n], at + n
        if reference is not None:
            print(f"== {name}: tokens", flush=True)
            _report_tokens(model_runs, reference, None if device == "cpu" else a.dtype)
        rows += _rows(model_runs, name, a.output_len, sha, dirty, run_id, env0)
        records.extend(model_runs)
    if drift:
        records.extend(report_drift(a.drift, drift_runs))
    csv_rows.write(rows)
    _write(str(json_path), records)
    print(f"rows: {csv_path}")
    from .runner import plot_serve

    png = csv_path.with_name(f"serve-{run_id}.png")
    if plot_serve(csv_path, png, run_id):  # where matplotlib is installed and a phase finished
        print(f"plot: {png}")
    return 0 if all(r["ok"] for r in records) else 1


def _model_jobs(name: str, a, base_args: dict, load: list, pythonpath: list[str], out: Path, device: str) -> tuple:
    """Model ``name``'s weights (or a dummy-load directory), transformers' reference tokens where
    ``--tokens`` asks (taken before any engine starts: a call cut short still leaves both sides), and
    its matrix as :func:`_run_jobs`' jobs: graphs x (no speculation unless ``--spec-only``, each ``--spec``)
    x backends."""
    weights = bool(a.tokens)
    t0 = time.monotonic()
    path = build_model(name, a.model_root, weights=weights)
    made = "weights written" if weights else "load_format dummy"
    print(f"== {name}: {MODELS[name].note}; {made} ({time.monotonic() - t0:.0f} s)", flush=True)
    margs = dict(base_args, **MODELS[name].engine_args)
    if not weights:
        margs["load_format"] = "dummy"
    tokens = reference = None
    if a.tokens:
        lens = [int(x) for x in a.token_prompts.split(",")]
        if device == "cpu":
            lens = [min(x, 40) for x in lens]
        tokens = {"prompts": [pr for i, n in enumerate(lens) for pr in _prompts(1, n, 77 + i)], "max_new_tokens": a.token_new}
        reference = reference_tokens(path, tokens, device, None if device == "cpu" else a.dtype)
    jobs = []
    spec_here = not a.spec_models or name in a.spec_models.split(",")
    for graphs in a.graphs.split(","):
        plain = [] if (a.spec_only and spec_here) else [""]
        for spec_algo in plain + [s for s in a.spec.split(",") if s and spec_here]:
            for backend in a.backends.split(","):
                eargs = dict(margs, disable_cuda_graph=(graphs == "off") or device == "cpu")
                if spec_algo:
                    eargs.update(_draft_args(spec_algo, name, path, a.model_root, device))
                tag = f"{name}-{backend}-{graphs}{'-' + spec_algo if spec_algo else ''}"
                label = f"{name} {backend} graphs {graphs}" + (f" spec {spec_algo}" if spec_algo else "")
                info = dict(model=name, graphs=graphs, spec=spec_algo, label=label)
                run = dict(engine_args=eargs, tokens=tokens, load=load if (a.spec_load or not spec_algo) else [], output_len=a.output_len)
                run["profile"] = [] if spec_algo else [[int(x) for x in item.split("x")] for item in filter(None, a.profile.split(","))]
                cold = "stacks" if getattr(a, "profile_cold_stacks", False) else bool(a.profile_cold)
                run["profile_cold"] = cold if run["load"] else False  # False, True or "stacks"
                run.update(pythonpath=pythonpath, timeout_s=a.timeout, log_path=str(out / f"engine-{tag}.log"), device=device)
                run.update(_plugin_args(name, pythonpath, device))
                jobs.append((path, backend, run, info))
    return reference, jobs


def row_provenance(sha: str, dirty: str, run_id: str, status: str, env0: dict) -> dict:
    """The columns every engine row carries (here and in vllm_serve): commit, date, run, status, device."""
    return dict(git_sha=sha, date=datetime.date.today().isoformat(), dirty=dirty, run_id=run_id, status=status, **env0)


class _CsvTail:
    """This call's rows at the end of the day's CSV (``serve-<date>-<gpu>.csv``, shared by the day's
    calls), rewritten whole after each engine, so a call stopped by its ``timeout`` keeps the rows of
    the engines that finished; the rows of earlier calls above them are never touched."""

    def __init__(self, path: Path):
        self.path = path
        self.start = path.stat().st_size if path.exists() else None

    def write(self, rows: list[dict]) -> None:
        import csv

        with open(self.path, "w" if self.start is None else "r+", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            if self.start is None:
                w.writeheader()
            else:
                f.seek(self.start)
                f.truncate()
            w.writerows(rows)


def _rows_so_far(runs: list, plans: list, output_len: int, sha: str, dirty: str, run_id: str, env0: dict) -> list[dict]:
    """:func:`_rows` of the finished runs (None: not finished) of ``plans``' models, in the jobs' order."""
    rows, at = [], 0
    for name, _reference, n in plans:
        rows += _rows([r for r in runs[at : at + n] if r is not None], name, output_len, sha, dirty, run_id, env0)
        at += n
    return rows


def _rows(runs: list[dict], name: str, output_len: int, sha: str, dirty: str, run_id: str, env0: dict) -> list[dict]:
    """The CSV rows (docs/contract.md section 7) of model ``name``'s runs: one per timed phase and one
    ``-cold`` row per prompt length's warm-up (its time to first token), or one ``-tokens`` row (with
    the mean acceptance length) for a run without phases that checked tokens or did not finish. A
    profile (``--profile``) has no row: the JSON and the report hold it."""
    rows = []
    for r in runs:
        if r["ok"] and not r.get("phases") and r.get("profile") and not r.get("tokens"):
            continue
        status = "ok" if r["ok"] else f"ERROR at {r.get('stage')}: {r.get('error', '')[:200]}"
        case_base = f"serve-{name}-{'graph' if r['graphs'] == 'on' else 'eager'}" + (f"-{r['spec']}" if r["spec"] else "")
        for prompt_len, ms in (r.get("cold_ttft_ms") or {}).items():
            # the warm-up before the phases of this prompt length: a fresh engine's first such prompt
            row = {c: "" for c in COLUMNS}
            row.update(op="serve", provider=r["backend"], start_s=f"{r.get('start_s', 0):.1f}", sglang=r.get("sglang", ""))
            row.update(row_provenance(sha, dirty, run_id, status, env0), case=f"{case_base}-P{prompt_len}-cold", requests=1)
            row.update(ttft_ms_p50=f"{ms:.3f}", ttft_ms_p99=f"{ms:.3f}")
            rows.append(row)
        for ph in r.get("phases") or [None]:
            row = {c: "" for c in COLUMNS}
            row.update(
                op="serve",
                provider=r["backend"],
                start_s=f"{r.get('start_s', 0):.1f}",
                sglang=r.get("sglang", ""),
                **row_provenance(sha, dirty, run_id, status, env0),
            )
            if ph is None:
                row["case"] = case_base + "-tokens"
                accepts = [s.get("spec_accept_length") for s in r.get("spec_meta", []) if s.get("spec_accept_length") is not None]
                row["accept_len"] = f"{statistics.mean(accepts):.3f}" if accepts else ""
            else:
                row["case"] = f"{case_base}-P{ph['prompt_len']}-C{ph['concurrency']}-O{output_len}"
                for k in ("out_tok_s", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99", "phase_s"):
                    row[k] = f"{ph[k]:.3f}"
                row.update(
                    requests=ph["requests"],
                    output_tokens=ph["output_tokens"],
                    accept_len="" if ph["accept_len"] is None else f"{ph['accept_len']:.3f}",
                )
            rows.append(row)
    return rows


def _plugin_args(name: str, pythonpath: list[str], device: str) -> dict:
    """``run_backend`` arguments that load model ``name``'s test-side plugins (:attr:`ServeModel.plugins`)
    on a GPU: their folder on ``PYTHONPATH`` and their names in ``SGLANG_PLUGINS``; none on a CPU."""
    plugins = MODELS[name].plugins
    if not plugins or device != "cuda":
        return {}
    return {"pythonpath": [*pythonpath, str(ENGINE_PLUGINS)], "env": {"SGLANG_PLUGINS": ",".join(("triton_swa", *plugins))}}


# decode steps a profile covers (``--profile``): enough that the window's edges (a step or two) are noise
PROFILE_STEPS = 32

# The KV pool of each engine that runs beside others (``--jobs``): enough for the token check's prompts
# (and a speculative run's drafts) at every model's size, small enough for 6 engines on an 80 GB GPU.
SIDE_BY_SIDE_TOKENS = 16384


def _side_by_side(engine_args: dict) -> dict:
    """``engine_args`` for an engine that starts while others start and allocate beside it.

    SGLang sizes its KV pool as the memory free after its weights load minus ``(1 - mem_fraction_static)``
    of the memory free before (``kv_cache_configurator.py``, ``_profile_available_bytes``), and refuses
    to start when that is not positive. Memory the other engines take between its two readings counts
    as its own, so a fraction divided among the engines fails (seen on the H200 at 0.8 / 6: "Loaded
    weights leave no GPU memory for the KV cache", minimum 0.14-0.26). The fraction stays; the pool is
    capped by ``max_total_tokens`` instead, so each engine takes only what its requests need."""
    capped = min(engine_args.get("max_total_tokens") or SIDE_BY_SIDE_TOKENS, SIDE_BY_SIDE_TOKENS)
    return dict(engine_args, max_total_tokens=capped)


def _timed(run: dict) -> bool:
    """Whether a run times something (a load phase or a profile): such a run takes the GPU alone, with a
    full-size pool."""
    return bool(run.get("load") or run.get("profile"))


def _run_job(path: str, backend: str, run: dict, info: dict, share: int = 1) -> dict:
    """One :func:`run_backend` of the matrix, labelled with ``info``; prints its outcome and phases as one
    block. Its pool is capped (:func:`_side_by_side`) where ``share`` engines run side by side, and for
    a run without timed phases alone too: a token check needs a small pool, and the memory a full-size
    pool leaves is too little for float32 activations (SGLang's `triton` on Gemma 3 1B dims, alone on an
    80 GB H100 at 0.8: out of memory in its warm-up, 2026-12-06)."""
    if share > 1 or not _timed(run):
        run = dict(run, engine_args=_side_by_side(run["engine_args"]))
    r = run_backend(path, backend, **run)
    r.update(info)
    r["late_compiles"] = late_compiles(run.get("log_path"))
    r["backend_notes"] = backend_notes(run.get("log_path"))
    status = "ok" if r["ok"] else f"FAILED at {r.get('stage')}: {r.get('error')}"
    lines = [f"  {r['label']}: {status} (start {r.get('start_s', 0):.0f} s, wall {r['wall_s']:.0f} s)"]
    lines += ["    " + "\n    ".join(tb.splitlines()[-6:]) for tb in r.get("tracebacks", [])[:2]]
    lines += [f"    {note[:300]}" for note in r["backend_notes"][:6]]
    if r["late_compiles"]:
        named = ", ".join(f"{name} {s:.1f} s" for name, s in r["late_compiles"])
        total = sum(s for _, s in r["late_compiles"])
        lines.append(f"    SGLang logged {len(r['late_compiles'])} kernel compile(s) after serving started, {total:.1f} s: {named}")
    for prompt_len, ms in (r.get("cold_ttft_ms") or {}).items():
        lines.append(f"    warm-up P{prompt_len}: first token in {ms:.1f} ms (cold: the phases below are warm)")
    for ph in r.get("phases", []):
        lines.append(
            f"    P{ph['prompt_len']} C{ph['concurrency']} x{ph['requests']}: {ph['out_tok_s']:.0f} out tok/s, "
            f"TTFT p50 {ph['ttft_ms_p50']:.1f} ms p99 {ph['ttft_ms_p99']:.1f}, ITL p50 {ph['itl_ms_p50']:.2f} ms p99 {ph['itl_ms_p99']:.2f}"
            + (f", accept length {ph['accept_len']:.2f}" if ph.get("accept_len") else "")
        )
    for what, pr in (r.get("profile") or {}).items():
        lines.append(_fmt_profile(what, pr))
    sys.stdout.write("\n".join(lines) + "\n")  # one write: engines side by side finish in threads
    sys.stdout.flush()
    return r


_LATE_COMPILE = re.compile(r"Triton kernel '([^']+)' took ([0-9.]+) s to compile after serving started")


def backend_notes(log_path: str | None) -> list[str]:
    """What triton_swa's SGLang plugin logged in an engine's log (its start-time precompile, the draft
    extend's graph capture, failures): the lines from ``triton_swa: `` on, as the engine's environment
    sets ``TRITON_SWA_LOG_LEVEL=INFO``."""
    try:
        with open(log_path, errors="replace") as f:
            return [line[line.index("triton_swa: ") :].rstrip() for line in f if "triton_swa: " in line]
    except (OSError, TypeError):
        return []


def late_compiles(log_path: str | None) -> list[tuple[str, float]]:
    """The kernels SGLang's load watch (``triton_load_watch``) logged as compiled after serving started
    in an engine's log, with their seconds: what a request waited for the compiler."""
    try:
        with open(log_path, errors="replace") as f:
            return [(m.group(1), float(m.group(2))) for m in map(_LATE_COMPILE.search, f) if m]
    except (OSError, TypeError):
        return []


# What a start beside other engines meets when they hold the GPU's memory: SGLang's refusal when they
# took memory between its two readings (``_side_by_side``), its SWA pool sizing squeezed the same way,
# and torch's out-of-memory in the warm-up (all three seen on the H100, 2026-12-06). Each is a fault of
# the side-by-side set-up until the same start fails alone too, so such a start runs once more alone.
MEMORY_RACE = (
    "Loaded weights leave no GPU memory for the KV cache",
    "leaves no room for the full KV pool",
    "torch.OutOfMemoryError: CUDA out of memory",
)


def _run_jobs(jobs: list[tuple], parallel: int, on_done) -> list[dict]:
    """Every job (:func:`_run_job`'s arguments), ``parallel`` at a time, in the jobs' order;
    ``on_done(runs)`` after each, the runs in the jobs' order, None for those not finished. A start
    that met :data:`MEMORY_RACE` beside others runs once more alone, after the rest (``retried_alone``)."""
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = [pool.submit(_run_job, *job, parallel) for job in jobs]
        for _ in as_completed(futures):
            on_done([f.result() if f.done() else None for f in futures])
        runs = [f.result() for f in futures]
    for i, r in enumerate(runs):
        if parallel > 1 and not r["ok"] and any(m in tb for m in MEMORY_RACE for tb in r.get("tracebacks") or []):
            print(f"  {r['label']}: refused for memory beside other engines; once more, alone", flush=True)
            runs[i] = dict(_run_job(*jobs[i], 1), retried_alone=True)
            on_done(runs)
    return runs


def _fmt_profile(what: str, pr: dict) -> str:
    """A profile (:mod:`triton_swa.benchmark.engine_profile`'s prefill or decode) as a few report lines."""
    classes = ", ".join(f"{k} {v:.1f}" for k, v in pr["class_ms"].items())
    head = f"    {what}"
    if "ttft_ms" in pr:
        head += f": first token in {pr['ttft_ms']:.1f} ms, {pr['tokens']} tokens;"
    if "steps" in pr:
        head += f", {pr['steps']} steps: {pr['device_ms_per_step']:.2f} ms of device time a step;"
    lines = [f"{head} {pr['wall_ms']:.1f} ms wall, device kernels {pr['total_ms']:.1f} ms ({pr['kernels']} kernels): {classes} ms"]
    lines += [f"      {ms:9.2f} ms {n:6d}x  [{cls}] {name}" for name, ms, n, cls in pr["top"]]
    if pr.get("host"):
        lines.append("      host events by summed time (nested events each count their whole span):")
        lines += [f"      {ms:9.2f} ms {n:6d}x  [{cat}] {name}" for name, ms, n, cat in pr["host"]]
    if pr.get("slow"):
        lines.append(f"      innermost host spans of 500 ms or more{' (Python stacks on)' if pr.get('stacks') else ''}:")
        lines += [f"      {ms:9.2f} ms  [{cat}] {name}  (in: {' > '.join(around) or '-'})" for name, ms, cat, around in pr["slow"]]
    return "\n".join(lines)


def _fmt_accept(x) -> str:
    return f"{x:.2f}" if isinstance(x, (int, float)) else str(x)


def reference_tokens(path: str, tokens: dict, device: str, dtype: str | None) -> tuple | None:
    """transformers' greedy tokens of the token check (tokens, top-2 gaps, |top-1 logits|), taken before
    the engines start (here and in vllm_serve), or None (printed) if they could not be had."""
    t0 = time.monotonic()
    try:
        ref = hf_reference(path, tokens["prompts"], tokens["max_new_tokens"], device, dtype)
    except Exception as e:  # noqa: BLE001 - reported, the engines' rows still count
        print(f"  transformers reference failed: {type(e).__name__}: {e}", flush=True)
        return None
    took = time.monotonic() - t0
    print(f"  transformers generate(): {len(ref[0])} prompts x {tokens['max_new_tokens']} tokens ({took:.0f} s)", flush=True)
    return ref


def _report_tokens(runs: list[dict], reference: tuple, dtype: str | None) -> None:
    """Each run's tokens against transformers' (``reference``, near-tie rule) and against a plain run's."""
    want, gaps, tops = reference
    from triton_swa.testing.sglang_engine import first_divergence

    # a speculative run against its own backend's run without speculation (speculation must not change
    # greedy tokens); a run without speculation against the first backend's
    plain = {(r["graphs"], r["backend"]): r for r in reversed(runs) if r.get("tokens") and not r["spec"]}
    first_plain = {r["graphs"]: r for r in reversed(runs) if r.get("tokens") and not r["spec"]}
    for r in runs:
        if not r.get("tokens"):
            continue
        c = compare_tokens(r["tokens"], want, gaps, tops, dtype or "float32")
        r["vs_transformers"] = c
        detail = "; ".join(
            f"req {i}: first differs at {q['first']}, gap {q['gap']:.4f} (tol {q['tol']:.4f})"
            for i, q in enumerate(c["requests"])
            if not q["equal"]
        )
        ref = plain.get((r["graphs"], r["backend"])) if r["spec"] else first_plain.get(r["graphs"])
        same = ""
        if ref is not None and ref is not r:
            firsts = [first_divergence(x, y) for x, y in zip(r["tokens"], ref["tokens"])]
            same = f"; vs {ref['backend']}{' (non-speculative)' if r['spec'] else ''}: {sum(f is None for f in firsts)}/{len(firsts)} equal"
        accept = ""
        if r["spec"]:
            accept = "; accept length per request " + ", ".join(_fmt_accept(s.get("spec_accept_length")) for s in r.get("spec_meta", []))
        print(
            f"  {r['label']}: vs transformers {c['equal']} equal, {c['near_tie']} differ first at a {dtype or 'float32'} near-tie, "
            f"{c['differ']} differ{same}{accept}" + (f" [{detail}]" if detail else ""),
            flush=True,
        )
    _warn_vacuous(want, "transformers outputs", "equal tokens there say nothing about attention")


if __name__ == "__main__":
    sys.exit(main())
