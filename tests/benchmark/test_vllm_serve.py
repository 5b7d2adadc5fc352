"""vLLM's real-engine harness (triton_swa.benchmark.vllm_serve) on this machine: its run plan, the
vllm.LLM arguments of each mode, its load syntax, the dry run (model written, plan saved), the report of
a failed engine and of the tokens, the worker's load phase (a stand-in vllm). vLLM's real engine on
this CPU with TRITON_SWA: tests/integration/test_vllm_engine.py; on a GPU: scripts/gpu.sh vllm-engine."""

from __future__ import annotations

import json
import os

import pytest

from triton_swa.benchmark import serve, vllm_serve
from triton_swa.testing.sglang_engine import REPO_ROOT


def test_plan_is_per_model_per_mode_per_backend_and_names_each_run():
    plan = vllm_serve.plan_runs(["gemma3-1b"], ["graphs", "eager"], ["TRITON_SWA", "TRITON_ATTN"])
    assert [(r["mode"], r["backend"]) for r in plan] == [
        ("graphs", "TRITON_SWA"),
        ("graphs", "TRITON_ATTN"),
        ("eager", "TRITON_SWA"),
        ("eager", "TRITON_ATTN"),
    ]
    assert plan[0]["label"] == "gemma3-1b TRITON_SWA graphs"


@pytest.mark.parametrize(
    "models, modes, match",
    [
        (["gpt-oss-like"], ["eager"], "only gemma3 and gemma4"),
        (["nope"], ["eager"], "unknown model"),
        (["gemma3-1b"], ["fast"], "unknown mode"),
    ],
)
def test_plan_refuses_what_is_not_wired(models, modes, match):
    with pytest.raises(ValueError, match=match):
        vllm_serve.plan_runs(models, modes, ["TRITON_SWA"])


def test_llm_kwargs_of_each_mode():
    common = dict(dtype="bfloat16", max_model_len=8192, chunk=1024)
    graphs = vllm_serve.llm_kwargs("/m", "TRITON_SWA", "graphs", **common)
    eager = vllm_serve.llm_kwargs("/m", "TRITON_SWA", "eager", **common)
    nocompile = vllm_serve.llm_kwargs("/m", "TRITON_ATTN", "graphs-nocompile", **common)
    assert graphs["enforce_eager"] is False and "compilation_config" not in graphs
    assert eager["enforce_eager"] is True
    assert nocompile["compilation_config"] == {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}
    assert nocompile["attention_backend"] == "TRITON_ATTN"
    for kw in (graphs, eager, nocompile):
        # token ids in and out; chunked prefill below the longest token prompt; prefix caching on
        assert kw["skip_tokenizer_init"] and kw["enable_chunked_prefill"] and kw["enable_prefix_caching"]
        assert kw["max_num_batched_tokens"] == 1024 and kw["model"] == "/m"
    assert vllm_serve.llm_kwargs("/m", "TRITON_SWA", "eager", **common, extra={"max_num_seqs": 8})["max_num_seqs"] == 8
    with pytest.raises(ValueError, match="unknown mode"):
        vllm_serve.llm_kwargs("/m", "TRITON_SWA", "turbo", **common)


def test_parse_load():
    assert vllm_serve.parse_load("2kx1x2,2048x16") == [(2000, 1, 2), (2048, 16, 32)]
    assert vllm_serve.parse_load("") == []
    with pytest.raises(ValueError, match="PROMPTxCONCURRENCY"):
        vllm_serve.parse_load("2048")


def test_dry_run_writes_the_model_and_the_plan(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    out = tmp_path / "out"
    rc = vllm_serve.main(
        ["--models", "gemma3-tiny", "--modes", "eager", "--dry-run", "--out", str(out), "--model-root", str(tmp_path / "m")]
    )
    assert rc == 0
    (plan_file,) = out.glob("vllm-serve-plan-*.json")
    plan = json.loads(plan_file.read_text())
    assert [(r["backend"], r["mode"]) for r in plan] == [("TRITON_SWA", "eager"), ("TRITON_ATTN", "eager")]
    spec = plan[0]["spec"]
    model = spec["llm_kwargs"]["model"]
    assert (tmp_path / "m" / "gemma3-tiny-w" / "config.json").exists() and model.endswith("gemma3-tiny-w")
    assert [len(p) for p in spec["tokens"]["prompts"]] == [600, 1100, 1700] and spec["tokens"]["max_new_tokens"] == 32
    assert spec["load"] == [[2048, 1, 2], [2048, 16, 32]] and spec["vocab"] == 384


def test_without_a_gpu_only_the_dry_run_runs(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert vllm_serve.main(["--models", "gemma3-tiny", "--out", str(tmp_path)]) == 2


def test_a_failed_engine_is_reported_with_its_stage_and_traceback(tmp_path):
    # a vllm package that fails to import stands first on the worker's path (vLLM may be installed here)
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("raise ImportError('stand-in: no vLLM here')\n")
    spec = {"llm_kwargs": {"model": "/nowhere"}, "tokens": None, "load": [], "output_len": 1, "vocab": 384}
    r = vllm_serve.run_engine(spec, timeout_s=120, env={"PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_ROOT)])})
    assert not r["ok"] and r["stage"] == "import"
    assert r["error"] == "ImportError: stand-in: no vLLM here"
    r.update(label="x")
    line = vllm_serve.run_line(r)
    assert line.startswith("  x: ERROR at import: ImportError") and "stand-in: no vLLM here" in line.splitlines()[-1]


def test_each_run_s_tokens_against_transformers_the_prefix_cached_pass_and_the_first_backend(monkeypatch, capsys):
    want = [[5, 6, 7], [5, 6, 7]]
    monkeypatch.setattr(serve, "hf_reference", lambda *a, **k: (want, [[1.0] * 3] * 2, [[20.0] * 3] * 2))
    reference = vllm_serve.reference_tokens("/m", {"prompts": [[2], [2]], "max_new_tokens": 3}, "cpu", "bfloat16")
    assert "transformers generate(): 2 prompts x 3 tokens" in capsys.readouterr().out
    runs = [
        dict(label="m TRITON_SWA eager", backend="TRITON_SWA", mode="eager", tokens=want, tokens_again=want),
        dict(label="m TRITON_ATTN eager", backend="TRITON_ATTN", mode="eager", tokens=[[5, 6, 7], [5, 9, 7]], tokens_again=None),
    ]
    first: dict = {}
    vllm_serve.report_run_tokens(runs[0], reference, first, "bfloat16")
    # the first run's line is out before the second run exists
    assert "m TRITON_SWA eager tokens: vs transformers 2 equal" in capsys.readouterr().out
    vllm_serve.report_run_tokens(runs[1], reference, first, "bfloat16")
    assert runs[0]["tokens_vs_hf"] == "2 equal, 0 near-tie, 0 differ" and "tokens_vs_first" not in runs[0]
    assert runs[1]["tokens_vs_hf"] == "1 equal, 0 near-tie, 1 differ" and runs[1]["tokens_vs_first"] == "1/2 equal to TRITON_SWA"
    text = capsys.readouterr().out
    assert "req 1: first differs at 1" in text and "prefix-cached" not in text


def test_a_failed_reference_leaves_the_engines_lines(monkeypatch, capsys):
    def boom(*a, **k):
        raise RuntimeError("no transformers here")

    monkeypatch.setattr(serve, "hf_reference", boom)
    assert vllm_serve.reference_tokens("/m", {"prompts": [[2]], "max_new_tokens": 3}, "cpu", "bfloat16") is None
    assert "transformers reference failed: RuntimeError: no transformers here" in capsys.readouterr().out
    r = dict(label="m TRITON_SWA eager", backend="TRITON_SWA", mode="eager", tokens=[[5]], tokens_again=[[5]])
    vllm_serve.report_run_tokens(r, None, {}, "bfloat16")
    assert "tokens_vs_hf" not in r and "prefix-cached pass 1/1 equal" in capsys.readouterr().out


def test_a_gemma4_directory_reaches_vllm_in_transformers_form(tmp_path):
    """SGLang reads Gemma 4's config.json in its flattened form (tiny_models); vLLM reads transformers'
    (``per_layer_config``, ``Gemma4ForCausalLM``). The directory vLLM gets has the latter, the same
    weights, and, where vLLM is installed, vLLM's own ModelConfig takes it as a Gemma 4 text model."""
    pytest.importorskip("transformers")
    from triton_swa.testing.tiny_models import build_tiny_model, load_hf_config, transformers_dir

    sglang_dir = build_tiny_model("gemma4", str(tmp_path / "g4"), 0)
    hf_dir = transformers_dir(sglang_dir)
    assert hf_dir == sglang_dir + "-hf" and transformers_dir(sglang_dir) == hf_dir  # made once
    raw = json.loads((tmp_path / "g4-hf" / "config.json").read_text())
    flat = json.loads((tmp_path / "g4" / "config.json").read_text())
    assert "per_layer_config" not in flat and "swa_head_dim" in flat  # SGLang's form stays for SGLang
    assert raw["architectures"] == ["Gemma4ForCausalLM"] and raw["model_type"] == "gemma4_text"
    want = load_hf_config(sglang_dir).to_dict()
    for key in ("head_dim", "num_kv_shared_layers", "layer_types", "hidden_size_per_layer_input", "sliding_window", "per_layer_config"):
        assert raw[key] == want[key], key
    # the sliding shape is the base; each full layer's own head dim and KV heads are SGLang's full ones
    assert raw["head_dim"] == flat["swa_head_dim"] != flat["head_dim"]
    full = [i for i, t in enumerate(raw["layer_types"]) if t == "full_attention"]
    assert full and sorted(raw["per_layer_config"], key=int) == [str(i) for i in full]
    for i in full:
        layer = raw["per_layer_config"][str(i)]
        assert (layer["head_dim"], layer["num_key_value_heads"]) == (flat["head_dim"], flat["num_key_value_heads"])
    weights = tmp_path / "g4-hf" / "model.safetensors"
    assert weights.is_symlink() and weights.resolve() == (tmp_path / "g4" / "model.safetensors").resolve()
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(hf_dir)
    assert type(cfg).__name__ == "Gemma4TextConfig" and cfg.to_dict()["layer_types"] == want["layer_types"]
    # a Gemma 3 directory is read as it is
    g3 = build_tiny_model("gemma3", str(tmp_path / "g3"), 0)
    assert transformers_dir(g3) == g3
    try:
        from vllm.config import ModelConfig
    except Exception:  # noqa: BLE001 - vLLM is an optional tier; what is above already ran
        return
    mc = ModelConfig(model=hf_dir, tokenizer=hf_dir, skip_tokenizer_init=True, dtype="float32")
    assert mc.architectures == ["Gemma4ForCausalLM"] and mc.get_head_size() in (flat["swa_head_dim"], flat["head_dim"])


FAKE_VLLM = '''
"""A stand-in vllm package (test-only): LLM.generate returns max_tokens ids per prompt, 10 ms per prompt."""
import time, types
__version__ = "stand-in"
class SamplingParams:
    def __init__(self, **kw):
        self.max_tokens = kw["max_tokens"]
class _Out:
    def __init__(self, ids):
        self.outputs = [types.SimpleNamespace(token_ids=ids)]
class LLM:
    def __init__(self, **kw):
        cfg = types.SimpleNamespace(backend="stand-in")
        comp = types.SimpleNamespace(cudagraph_mode="NONE", mode=0)
        self.llm_engine = types.SimpleNamespace(vllm_config=types.SimpleNamespace(attention_config=cfg, compilation_config=comp))
    def generate(self, prompts, params, use_tqdm=False):
        time.sleep(0.01 * len(prompts))
        return [_Out(list(range(params.max_tokens))) for p in prompts]
'''


def test_the_load_phase_reports_the_median_of_its_batches(tmp_path):
    """The worker's load phase through a stand-in vllm package: one untimed batch, then one batch per
    CONCURRENCY requests (each its own prompts); the phase's rate over all, and the median per batch."""
    pkg = tmp_path / "vllm"
    (pkg / "inputs").mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_VLLM)
    (pkg / "inputs" / "__init__.py").write_text("def TokensPrompt(prompt_token_ids):\n    return prompt_token_ids\n")
    spec = {"llm_kwargs": {"model": "/m"}, "tokens": None, "load": [[64, 2, 6]], "output_len": 5, "vocab": 384}
    r = vllm_serve.run_engine(spec, timeout_s=120, env={"PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_ROOT)])})
    assert r["ok"], r
    (ph,) = r["phases"]
    assert (ph["requests"], ph["batches"], ph["output_tokens"]) == (6, 3, 30)
    assert 0 < ph["batch_tok_s_p50"] and 0 < ph["out_tok_s"] <= 1.05 * 30 / (3 * 0.02)
    r.update(label="m TRITON_SWA eager")
    assert "per batch, median of 3:" in vllm_serve.run_line(r)
