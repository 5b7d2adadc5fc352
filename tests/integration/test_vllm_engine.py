"""vLLM 0.32's real engine (``vllm.LLM``: its scheduler, KV-cache manager, model runner, chunked prefill
and prefix cache) serving a small Gemma 4 with ``attention_backend="TRITON_SWA"`` on this CPU, triton-swa's
kernels in Triton's interpreter, through the GPU harness's own worker
(:func:`triton_swa.benchmark.vllm_serve.run_engine`), tokens checked against transformers' float32
``generate()``.

vLLM's CPU platform answers every layer's backend request with its own CPU_ATTN. The test-side
``vllm_cpu_platform/sitecustomize.py`` (first on the engine's ``PYTHONPATH``) makes it answer TRITON_SWA
where TRITON_SWA is asked for, and logs each answer; nothing else of vLLM is changed. The model
directory is the one the GPU harness hands vLLM (``tiny_models.transformers_dir``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from triton_swa.benchmark import serve, vllm_serve
from triton_swa.testing.sglang_engine import REPO_ROOT

pytest.importorskip("vllm", reason="vLLM tier not installed (scripts/setup_vllm.sh)")
PLATFORM_PATCH = Path(__file__).parent / "vllm_cpu_platform"


def test_vllm_engine_serves_gemma4_with_triton_swa_as_transformers_does(tmp_path):
    """Gemma 4 with sliding 64-wide and full 128-wide heads, two KV-shared layers, per-layer inputs,
    window 16. Prompts of 80 and 45 tokens in prefill chunks of 64 (vLLM's least: ``max_num_seqs``; the
    80-token one's second chunk reads a cached prefix), 12 greedy tokens each (decode past the window),
    then the same prompts again (prefix-cache hits of their full 16-token blocks): all equal to
    transformers' float32 tokens."""
    from triton_swa.testing.tiny_models import build_tiny_model, transformers_dir

    path = build_tiny_model("gemma4", str(tmp_path / "g4"), 0, shape=dict(sliding_head_dim=64, full_head_dim=128))
    prompts = [serve._prompts(1, n, 5 + n)[0] for n in (80, 45)]
    want = serve.hf_reference(path, prompts, 12, "cpu", "float32")[0]
    assert not any(len(set(t)) == 1 for t in want)  # the check is not vacuous
    # on a CPU vLLM reserves gpu_memory_utilization of the host's memory and refuses to start when less
    # is free (CI's other worker holds some): this model needs a few MiB
    kw = vllm_serve.llm_kwargs(
        transformers_dir(path), "TRITON_SWA", "eager", dtype="float32", max_model_len=256, chunk=64, extra={"gpu_memory_utilization": 0.05}
    )
    spec = {"llm_kwargs": kw, "tokens": {"prompts": prompts, "max_new_tokens": 12}, "load": [], "output_len": 1, "vocab": 384}
    selected = tmp_path / "selected.txt"
    env = {
        "PYTHONPATH": os.pathsep.join([str(PLATFORM_PATCH), str(REPO_ROOT)]),
        "TRITON_INTERPRET": "1",
        "TRITON_SWA_VLLM_CPU_LOG": str(selected),
    }
    log = tmp_path / "engine.log"
    r = vllm_serve.run_engine(spec, timeout_s=600, log_path=str(log), env=env)
    if not r["ok"]:  # the root cause is in the engine's log, not in the error the parent sees
        causes = [line for line in log.read_text().splitlines() if "Error" in line]
        pytest.fail(f"{r.get('stage')}: {r.get('error')}\n" + "\n".join(causes[-12:]))
    assert r["reported"]["attention_backend"].endswith("TRITON_SWA")
    assert selected.exists() and "TRITON_SWA" in selected.read_text()  # the layers were handed TRITON_SWA
    assert r["tokens"] == want, (r["tokens"], want)
    assert r["tokens_again"] == want
