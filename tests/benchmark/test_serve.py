"""The GPU engine tier's harness (triton_swa.benchmark.serve) on this machine: its token rule, its
models at real sizes (configs only) and its engine environment. The engine runs themselves need a GPU
(scripts/gpu.sh engine); the same harness ran on SGLang's CPU engine while it was written."""

from __future__ import annotations

import json
import os

import pytest

from triton_swa.benchmark import serve
from triton_swa.testing import sglang_engine


def test_tie_tol_is_two_ulps_at_the_top_logit():
    # bf16 keeps 8 significant bits: at |logit| in [16, 32) its spacing is 2**-3
    assert sglang_engine.tie_tol(20.0) == 0.25
    assert sglang_engine.tie_tol(1.5) == 2 * 2.0**-7
    assert sglang_engine.tie_tol(20.0, "float32") == 2 * 2.0 ** (4 - 23)
    assert sglang_engine.tie_tol(0.0) > 0 and sglang_engine.tie_tol(float("nan")) > 0


def test_compare_tokens_counts_equal_near_ties_and_real_differences():
    want = [[5, 6, 7], [5, 6, 7], [5, 6, 7]]
    got = [[5, 6, 7], [5, 9, 9], [8, 6, 7]]
    gaps = [[1.0, 1.0, 1.0], [1.0, 0.1, 1.0], [3.0, 1.0, 1.0]]
    tops = [[20.0] * 3] * 3
    c = serve.compare_tokens(got, want, gaps, tops)
    assert (c["equal"], c["near_tie"], c["differ"]) == (1, 1, 1)
    assert c["requests"][1] == {"equal": False, "first": 1, "gap": 0.1, "tol": 0.25, "near_tie": True}
    assert c["requests"][2]["first"] == 0 and not c["requests"][2]["near_tie"]
    # a length difference is a difference too
    assert serve.compare_tokens([[5, 6]], [[5, 6, 7]], [[1.0] * 3], [[20.0] * 3])["equal"] == 0


@pytest.mark.parametrize("name", ["gemma3-1b", "gemma4-like"])
def test_models_at_real_size_write_their_configs(tmp_path, name):
    """A speed-only model is a config (load_format dummy): the dims the engine reads are the table's."""
    path = serve.build_model(name, str(tmp_path), weights=False)
    assert serve.build_model(name, str(tmp_path), weights=False) == path  # built once
    assert not any(f.endswith(".safetensors") for f in os.listdir(path))
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    m = serve.MODELS[name]
    assert cfg["vocab_size"] == m.vocab_size and cfg["sliding_window"] == m.window
    types = cfg["layer_types"]
    # every sixth layer full (5 sliding : 1 full), and the last one
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    assert len(types) == m.layers and full == sorted({*range(5, m.layers, 6), m.layers - 1})
    if name == "gemma4-like":
        # SGLang's flattened Gemma 4 form: full layers' head dim and KV heads, the sliding ones apart
        assert (cfg["head_dim"], cfg["swa_head_dim"]) == (512, 256)
        assert (cfg["num_key_value_heads"], cfg["swa_num_key_value_heads"]) == (1, 2)
        assert cfg["num_kv_shared_layers"] == 6
        from triton_swa.testing.tiny_models import load_hf_config

        hf = load_hf_config(path)
        assert (hf.hidden_size, hf.num_kv_shared_layers, hf.num_hidden_layers) == (2048, 6, 24)
    else:
        assert (cfg["head_dim"], cfg["num_key_value_heads"], cfg["hidden_size"]) == (256, 1, 1152)


def test_gpu_engine_env(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.delenv("TRITON_SWA_ENGINE_FUSED_OPS", raising=False)
    env = sglang_engine.gpu_engine_env([str(sglang_engine.CUDA_STUBS)])
    assert "TRITON_INTERPRET" not in env  # the real kernels on the GPU
    # the stand-in image loads the same plugins for every backend
    standins = "triton_swa,triton_swa_gpu_standins,triton_swa_fused_ops"
    assert env["SGLANG_PLUGINS"] == standins and env["SGLANG_FORCE_FUSED_OP_BACKEND"] == "torch"
    assert env["SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK"] == "1"  # only with the stand-in
    paths = env["PYTHONPATH"].split(os.pathsep)
    assert paths[0] == str(sglang_engine.CUDA_STUBS) and str(sglang_engine.ENGINE_PLUGINS) in paths
    assert env["PYTHONPATH"].endswith("/elsewhere")
    real = sglang_engine.gpu_engine_env([])
    assert "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK" not in real and real["SGLANG_PLUGINS"] == "triton_swa"
    # a run's own plugins are added, each name once
    more = sglang_engine.gpu_engine_env([str(sglang_engine.CUDA_STUBS)], {"SGLANG_PLUGINS": "triton_swa,triton_swa_prefix_rule", "X": "1"})
    assert more["SGLANG_PLUGINS"] == standins + ",triton_swa_prefix_rule" and more["X"] == "1"
    cpu = sglang_engine.gpu_engine_env([], device="cpu")
    assert cpu["TRITON_INTERPRET"] == "1" and cpu["SGLANG_USE_CPU_ENGINE"] == "1"
    assert cpu["SGLANG_PLUGINS"] == "triton_swa"  # the CPU engine runs SGLang's own CPU layers
    # the plain-torch layers of the earlier runs, on request; anything else is refused by name
    monkeypatch.setenv("TRITON_SWA_ENGINE_FUSED_OPS", "torch")
    assert sglang_engine.gpu_engine_env([str(sglang_engine.CUDA_STUBS)])["SGLANG_PLUGINS"] == "triton_swa,triton_swa_gpu_standins"
    monkeypatch.setenv("TRITON_SWA_ENGINE_FUSED_OPS", "cuda")
    with pytest.raises(ValueError, match="TRITON_SWA_ENGINE_FUSED_OPS"):
        sglang_engine.gpu_engine_env([str(sglang_engine.CUDA_STUBS)])


def test_stand_in_weak_ref_tensor():
    """The one op the GPU engine calls from the sgl_kernel stand-in: same memory, same values."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("sgl_kernel_stand_in", sglang_engine.CUDA_STUBS / "sgl_kernel" / "__init__.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    try:
        x = torch.arange(6.0).reshape(2, 3)
        y = mod.weak_ref_tensor(x)
        assert y.data_ptr() == x.data_ptr() and torch.equal(x, y) and y.shape == x.shape
        with pytest.raises(TypeError, match="weak_ref_tensor"):
            mod.weak_ref_tensor([x])
        assert "weak_ref_tensor" in mod.STOOD_IN
        with pytest.raises(RuntimeError, match="stub"):
            mod.rmsnorm(x)  # any op not stood in stays loud
    finally:
        import sys

        sys.meta_path[:] = [f for f in sys.meta_path if type(f).__module__ != "sgl_kernel_stand_in"]


def test_bench_op_serve_hands_its_arguments_to_the_harness():
    from triton_swa.benchmark import _serve_args

    assert _serve_args(["--op", "serve", "--models", "gemma4-like"]) == ["--models", "gemma4-like"]
    assert _serve_args(["--tokens", "--op=serve"]) == ["--tokens"]
    assert _serve_args(["--op", "decode,prefill"]) is None and _serve_args(["--op"]) is None


def test_drift_step_log_splits_at_the_first_drifted_write():
    """The seed's scenario's reading of the prefix-rule plugin's log: verify steps before the first
    draft write whose SWA slot differs from its full slot, and after it."""
    from triton_swa.testing.sglang_engine import acceptance_windows, mean_accepted, steps_around_drift

    log = ["R draft resolves None", "D 0 4", "V 3 3", "D 0 2", "V 2 3", "D 1 2", "V 0 1", "D 0 2", "V 0"]
    before, after = steps_around_drift(log)
    assert before == [[3, 3], [2, 3]] and after == [[0, 1], [0]]
    assert mean_accepted(after) == 1 / 3 and mean_accepted([]) != mean_accepted([])  # NaN for none
    assert acceptance_windows(before, size=1) == "4.00 3.50"


def test_draft_args_pick_each_algorithms_draft(tmp_path):
    """NGRAM drafts from the prompt; STANDALONE on a Gemma 4 drafts with the target's own weights (the
    Gemma 3 draft's vocabulary is another), on a Gemma 3 with the 2-layer Gemma 3."""
    assert "speculative_draft_model_path" not in serve._draft_args("NGRAM", "gemma4-like", "/target", str(tmp_path), "cuda")
    g4 = serve._draft_args("STANDALONE", "gemma4-like", "/target", str(tmp_path), "cuda")
    assert g4["speculative_draft_model_path"] == "/target" and g4["speculative_eagle_topk"] == 1
    g3 = serve._draft_args("STANDALONE", "gemma3-1b", "/target", str(tmp_path), "cpu")
    assert g3["speculative_draft_model_path"].endswith("gemma3-tiny-draft-w")


def test_gpt_oss_like_writes_gpt_oss_20b_attention_and_transformers_reads_it(tmp_path):
    """The gpt-oss-like model (config only, as for load_format dummy): gpt-oss-20b's attention dims and
    MoE block at a reduced depth; transformers builds the model from it (on the meta device: shapes,
    no memory), sinks and expert biases included."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = serve.build_model("gpt-oss-like", str(tmp_path), weights=False)
    cfg = AutoConfig.from_pretrained(path)
    assert cfg.architectures == ["GptOssForCausalLM"] and cfg.sliding_window == 128
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size) == (64, 8, 64, 2880)
    assert (cfg.num_local_experts, cfg.num_experts_per_tok, cfg.intermediate_size) == (8, 4, 2880)
    assert cfg.layer_types == ["sliding_attention", "full_attention"] * 2 and cfg.vocab_size == 32768
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    params = dict(model.named_parameters())
    assert params["model.layers.0.self_attn.sinks"].shape == (64,)
    assert params["model.layers.0.mlp.experts.gate_up_proj"].shape == (8, 2880, 2 * 2880)
    assert params["model.layers.0.mlp.experts.gate_up_proj_bias"].shape == (8, 2 * 2880)
    assert 1.0e9 < sum(p.numel() for p in params.values()) < 1.3e9


def test_gpt_oss_shape_reaches_written_weights(tmp_path):
    """The same builder path with weights, at a tiny shape: transformers loads what was written."""
    import torch
    from transformers import AutoModelForCausalLM

    from triton_swa.testing.tiny_models import build_tiny_model

    shape = dict(hidden_size=32, intermediate_size=48, heads=8, kv_heads=2, head_dim=8, experts=3, experts_per_token=2)
    path = build_tiny_model("gpt-oss", str(tmp_path / "g"), 0, window=4, num_layers=2, shape=shape, dtype="bfloat16")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    assert model.config.num_local_experts == 3 and model.model.layers[0].self_attn.sinks.shape == (8,)
    out = model(torch.tensor([[2, 5, 6, 7, 8, 9]])).logits
    assert out.shape[-1] == model.config.vocab_size and torch.isfinite(out.float()).all()


def test_plugin_args_only_where_a_model_asks_on_a_gpu():
    got = serve._plugin_args("gpt-oss-like", ["/stubs"], "cuda")
    assert got["pythonpath"] == ["/stubs", str(serve.ENGINE_PLUGINS)]
    assert got["env"] == {"SGLANG_PLUGINS": "triton_swa,triton_swa_moe_cuda_path"}
    assert (serve.ENGINE_PLUGINS / "triton_swa_moe_cuda_path.py").exists()
    assert serve._plugin_args("gpt-oss-like", [], "cpu") == {} and serve._plugin_args("gemma4-like", [], "cuda") == {}


def test_side_by_side_engines_keep_their_fraction_and_cap_their_pool():
    """--jobs: a divided mem_fraction_static refuses to start (other engines' allocations fall between
    SGLang's two memory readings); each engine keeps the fraction and caps its pool instead."""
    args = {"mem_fraction_static": 0.8, "context_length": 40960}
    got = serve._side_by_side(args)
    assert got == {"mem_fraction_static": 0.8, "context_length": 40960, "max_total_tokens": serve.SIDE_BY_SIDE_TOKENS}
    assert serve._side_by_side(dict(args, max_total_tokens=4096))["max_total_tokens"] == 4096  # a smaller cap stays
    assert serve._side_by_side(dict(args, max_total_tokens=10**6))["max_total_tokens"] == serve.SIDE_BY_SIDE_TOKENS
    assert args == {"mem_fraction_static": 0.8, "context_length": 40960}  # not changed in place


def test_compare_tokens_counts_reference_streams_of_one_token():
    want = [[7, 7, 7, 7], [5, 6, 7, 8], [9, 9, 9]]
    c = serve.compare_tokens(want, want, [[1.0] * 4] * 3, [[20.0] * 4] * 3)
    # all equal, but the first stream repeats one token: equality there says nothing about attention
    assert c["equal"] == 3 and c["one_token"] == 1


def _echo_fraction(path: str, prompt: list[int]) -> float:
    """How often the greedy next token is the input token itself, over a prompt's positions."""
    import torch
    from transformers import AutoModelForCausalLM

    from triton_swa.testing.tiny_models import load_hf_config

    model = AutoModelForCausalLM.from_pretrained(path, config=load_hf_config(path), attn_implementation="eager", dtype=torch.float32)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        top = model(ids, use_cache=False).logits[0].argmax(-1)
    return float((top == ids[0]).float().mean())


def test_wide_gemma_does_not_echo_its_input(tmp_path, monkeypatch):
    """At real widths Gemma's tied, sqrt(width)-scaled embeddings made every random model of the GPU
    tier repeat the last prompt token (2026-12-05). tiny_models.embed_std shrinks their spread with the
    width: a Gemma 4 at width 512 then predicts other tokens than its input, where the fixed spread of
    the tiny models (0.05) still echoes it at most positions."""
    from triton_swa.testing import tiny_models

    shape = dict(serve._GEMMA4_LIKE, layers=6, hidden_size=512, intermediate_size=1024, kv_shared=2, full_every=3, ple=32)
    prompt = serve._prompts(1, 24, 8)[0]

    def build(name):
        return tiny_models.build_tiny_model("gemma4", str(tmp_path / name), 0, window=16, shape=shape, vocab_size=32768)

    assert tiny_models.embed_std("gemma4", 512) < 0.05 == tiny_models.embed_std("gemma4", 64) == tiny_models.embed_std("gpt-oss", 2880)
    scaled = _echo_fraction(build("scaled"), prompt)
    print("echo fraction, scaled spread:", scaled)
    assert scaled < 0.25
    # a shaped model also gets the calm q/k norms (tiny_models.qk_norm_init), its other norms keep theirs
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "scaled" / "model.safetensors"))
    q_norms = [v.float().mean().item() for n, v in weights.items() if n.endswith("q_norm.weight")]
    others = [v.float().mean().item() for n, v in weights.items() if n.endswith("input_layernorm.weight")]
    centres = [tiny_models.qk_norm_init("gemma4", d)[0] for d in (256, 512)]  # sliding and full heads
    assert q_norms and all(min(abs(m / c - 1) for c in centres) < 0.1 for m in q_norms) and min(others) > 0.8
    monkeypatch.setattr(tiny_models, "embed_std", lambda family, hidden: 0.05)
    assert _echo_fraction(build("fixed"), prompt) > 0.6


def test_vacuous_warning_names_the_streams_of_one_token(capsys):
    serve._warn_vacuous([[3, 3, 3, 3], [1, 2, 3, 4]], "outputs", "why")
    assert capsys.readouterr().out.strip() == "VACUOUS: 1 of 2 outputs repeat one token: why"
    serve._warn_vacuous([[1, 2, 3, 4]], "outputs", "why")
    assert capsys.readouterr().out == ""


def test_speculative_runs_are_checked_against_their_own_backend_without_speculation(monkeypatch, capsys):
    want = [[5, 6, 7]]
    monkeypatch.setattr(serve, "hf_reference", lambda *a, **k: (want, [[1.0] * 3], [[20.0] * 3]))
    reference = serve.reference_tokens("/m", {"prompts": [[2]], "max_new_tokens": 3}, "cpu", "float32")

    def run(backend, spec, tokens, accept=None):
        meta = [{"spec_accept_length": accept}] if spec else []
        label = f"{backend} graphs on" + (f" spec {spec}" if spec else "")
        return dict(label=label, backend=backend, spec=spec, graphs=True, tokens=tokens, spec_meta=meta)

    runs = [
        run("triton_swa", "", [[5, 6, 7]]),
        run("triton", "", [[5, 9, 9]]),
        run("triton_swa", "EAGLE", [[5, 6, 7]], 1.5),
        run("triton", "EAGLE", [[5, 9, 9]], 1.25),
    ]
    serve._report_tokens(runs, reference, "float32")
    lines = {line.split(":")[0].strip(): line for line in capsys.readouterr().out.splitlines() if "graphs on" in line}
    # SGLang's triton differs from triton_swa without speculation, and its EAGLE run equals its own plain run
    assert "vs triton_swa: 0/1 equal" in lines["triton graphs on"]
    assert "vs triton (non-speculative): 1/1 equal" in lines["triton graphs on spec EAGLE"]
    assert "vs triton_swa (non-speculative): 1/1 equal" in lines["triton_swa graphs on spec EAGLE"]
    assert "accept length per request 1.25" in lines["triton graphs on spec EAGLE"]


def test_a_run_without_timed_phases_gets_the_capped_pool_even_alone(monkeypatch, capsys):
    seen = {}

    def fake_backend(path, backend, **run):
        seen[backend] = run["engine_args"].get("max_total_tokens")
        return dict(ok=True, wall_s=1.0)

    monkeypatch.setattr(serve, "run_backend", fake_backend)
    base = {"engine_args": {"mem_fraction_static": 0.8}}
    serve._run_job("/m", "tokens-alone", dict(base, load=[]), {"label": "t"}, 1)
    serve._run_job("/m", "timed-alone", dict(base, load=[(4096, 16, 32)]), {"label": "l"}, 1)
    serve._run_job("/m", "timed-beside", dict(base, load=[(4096, 16, 32)]), {"label": "b"}, 3)
    assert seen == {"tokens-alone": serve.SIDE_BY_SIDE_TOKENS, "timed-alone": None, "timed-beside": serve.SIDE_BY_SIDE_TOKENS}


@pytest.mark.parametrize("race", range(3))
def test_a_start_refused_for_memory_beside_others_runs_again_alone(monkeypatch, capsys, race):
    calls = []
    refusal = f"Error: {serve.MEMORY_RACE[race]} (the rest of the message)."

    def fake_job(path, backend, run, info, share=1):
        calls.append((backend, share))
        refused = backend == "b" and share > 1
        tb = [refusal] if refused else []
        return dict(info, ok=not refused, tracebacks=tb)

    monkeypatch.setattr(serve, "_run_job", fake_job)
    seen = []
    jobs = [("/m", name, {}, {"label": name}) for name in ("a", "b", "c")]
    runs = serve._run_jobs(jobs, 3, lambda done: seen.append(sum(r is not None for r in done)))
    assert [r["label"] for r in runs] == ["a", "b", "c"] and all(r["ok"] for r in runs)
    assert runs[1]["retried_alone"] and ("b", 1) in calls and calls.count(("b", 3)) == 1
    assert seen[-1] == 3 and "b: refused for memory beside other engines; once more, alone" in capsys.readouterr().out
    # alone from the start (no side-by-side), or another failure: no second start
    calls.clear()
    assert not serve._run_jobs(jobs, 1, lambda done: None)[1].get("retried_alone")
    monkeypatch.setattr(serve, "MEMORY_RACE", ("something else",))
    calls.clear()
    assert not serve._run_jobs(jobs, 3, lambda done: None)[1]["ok"] and len(calls) == 3


@pytest.mark.parametrize("family, head_dim", [("gemma4", 256), ("gemma4", 512), ("gemma3", 256)])
def test_real_width_qk_norms_give_scores_a_spread_of_about_three(family, head_dim):
    # the calm models' attention temperature: unit-RMS q and k through the q/k norm weights at their
    # centre, scored as each family scores them (Gemma 4 at scaling 1.0 on w; Gemma 3 at d**-0.5 on 1 + w)
    torch = pytest.importorskip("torch")
    from triton_swa.testing.tiny_models import QK_SCORE_STD, qk_norm_init

    centre, spread = qk_norm_init(family, head_dim)
    assert 0 < spread < centre + (1 if family == "gemma3" else 0)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 20000, head_dim, generator=gen, dtype=torch.float64)
    q, k = (x / x.pow(2).mean(-1, keepdim=True).sqrt() for x in (q, k))
    w = centre if family == "gemma4" else 1 + centre
    scores = (q * w * k * w).sum(-1) * (1.0 if family == "gemma4" else head_dim**-0.5)
    assert abs(float(scores.std()) / QK_SCORE_STD - 1) < 0.05


class _StreamingEngine:
    """Streams ``max_new_tokens`` tokens a request, one a millisecond (the first after ``first_ms``
    on the engine's first request: a cold start), and records each request's prompt and length."""

    def __init__(self, first_ms=30.0):
        import asyncio

        self.loop = asyncio.new_event_loop()
        self.requests = []
        self.first_ms = first_ms

    async def async_generate(self, input_ids, sampling_params, stream):
        import asyncio

        assert stream
        cold = not self.requests
        self.requests.append((tuple(input_ids), sampling_params["max_new_tokens"]))

        async def chunks():
            await asyncio.sleep(self.first_ms / 1e3 if cold else 0.001)
            for n in range(1, sampling_params["max_new_tokens"] + 1):
                await asyncio.sleep(0.001)
                yield {"meta_info": {"completion_tokens": n}}

        return chunks()


def test_load_phases_warm_up_each_prompt_length_once_and_report_its_cold_start():
    engine = _StreamingEngine(first_ms=40.0)
    result, stages = {}, []
    serve.load_phases(engine, [(24, 1, 2), (24, 2, 4), (40, 2, 2)], 5, result, stages.append)
    lengths = [(len(p), n) for p, n in engine.requests]
    warm = serve.WARM_UP_TOKENS
    # one warm-up before the first phase of each prompt length, then the phase's requests
    assert lengths == [(24, warm)] + [(24, 5)] * 6 + [(40, warm)] + [(40, 5)] * 2
    assert stages == ["warm-up P24", "load P24 C1", "load P24 C2", "warm-up P40", "load P40 C2", "load done"]
    # no timed prompt is the warm-up's (the radix cache would serve it)
    assert engine.requests[0][0] not in {p for p, _ in engine.requests[1:7]}
    assert set(result["cold_ttft_ms"]) == {"24", "40"} and result["cold_ttft_ms"]["24"] >= 40.0
    # the cold start stays out of the timed phases
    assert [(ph["prompt_len"], ph["concurrency"], ph["requests"], ph["output_tokens"]) for ph in result["phases"]] == [
        (24, 1, 2, 10),
        (24, 2, 4, 20),
        (40, 2, 2, 10),
    ]
    assert all(ph["ttft_ms_p99"] < 40.0 for ph in result["phases"]), result["phases"]


def test_cold_starts_get_a_csv_row_of_their_own(capsys):
    phase = dict(prompt_len=32768, concurrency=1, requests=4, output_tokens=256, phase_s=2.0, out_tok_s=128.0, accept_len=None)
    phase.update(ttft_ms_p50=400.0, ttft_ms_p99=500.0, itl_ms_p50=3.0, itl_ms_p99=5.0)
    run = dict(ok=True, backend="triton_swa", graphs="on", spec="", start_s=60.0, wall_s=90.0, label="g", phases=[phase])
    run["cold_ttft_ms"] = {"32768": 17195.1}
    rows = serve._rows([run], "gemma4-like", 64, "abc1234", "clean", "r", {"gpu": "G"})
    assert [r["case"] for r in rows] == ["serve-gemma4-like-graph-P32768-cold", "serve-gemma4-like-graph-P32768-C1-O64"]
    assert rows[0]["ttft_ms_p50"] == "17195.100" and rows[0]["requests"] == 1 and rows[0]["out_tok_s"] == ""
    assert all(set(r) == set(serve.COLUMNS) for r in rows)


def test_a_call_cut_short_keeps_the_csv_rows_of_the_engines_that_finished(tmp_path, monkeypatch):
    # the day's CSV holds an earlier call's rows; this call's rows are rewritten after each engine
    path = tmp_path / "serve-day-gpu.csv"
    earlier = serve._CsvTail(path)
    earlier.write([dict.fromkeys(serve.COLUMNS, "earlier")])
    tail = serve._CsvTail(path)
    seen = []

    def fake_job(path_, backend, run, info, share=1):
        return dict(info, ok=True, backend=backend, graphs="on", spec="", phases=[], cold_ttft_ms={4096: 10.0 + len(seen)})

    monkeypatch.setattr(serve, "_run_job", fake_job)
    plans = [("m1", None, 2), ("m2", None, 1)]
    jobs = [("/m", b, {}, {"label": b}) for b in ("x", "y", "z")]

    def on_done(done):
        rows = serve._rows_so_far(done, plans, 8, "sha", "clean", "run", {"gpu": "g"})
        tail.write(rows)
        seen.append([r["case"] for r in rows])

    serve._run_jobs(jobs, 1, on_done)
    assert seen[0] == ["serve-m1-graph-P4096-cold", "serve-m1-graph-tokens"]
    assert seen[-1][-2:] == ["serve-m2-graph-P4096-cold", "serve-m2-graph-tokens"] and len(seen[-1]) == 6
    import csv

    lines = list(csv.DictReader(open(path)))
    assert [r["op"] for r in lines] == ["earlier"] + ["serve"] * 6  # one header; earlier rows untouched
    assert [r["provider"] for r in lines[1:]] == ["x", "x", "y", "y", "z", "z"]
    # a shorter rewrite (a retried run) leaves no stale rows behind
    tail.write([])
    assert [r["op"] for r in csv.DictReader(open(path))] == ["earlier"]


@pytest.mark.parametrize("spec_only", [False, True])
def test_spec_only_leaves_out_the_plain_runs_of_the_spec_models_alone(monkeypatch, tmp_path, spec_only):
    import argparse

    monkeypatch.setattr(serve, "build_model", lambda name, root, weights: f"/m/{name}")
    monkeypatch.setattr(serve, "_draft_args", lambda algo, name, path, root, device: {"speculative_algorithm": algo})
    monkeypatch.setattr(serve, "_plugin_args", lambda name, pythonpath, device: {})
    a = argparse.Namespace(
        tokens=False, graphs="on", spec="DFLASH,EAGLE", spec_models="gemma4-like", spec_only=spec_only, spec_load=True,
        backends="triton_swa,triton", output_len=8, profile="", timeout=1.0, model_root=str(tmp_path),
        profile_cold=True, profile_cold_stacks=False,
    )  # fmt: skip
    labels = {}
    for name in ("gemma4-like", "gemma3-1b"):
        _, jobs = serve._model_jobs(name, a, {}, [(4096, 16, 32)], [], tmp_path, "cuda")
        labels[name] = [info["label"] for _, _, _, info in jobs]
        # --profile-cold reaches every run with load phases, speculative or not
        assert all(run["profile_cold"] for _, _, run, _ in jobs)
    spec = [f"gemma4-like {b} graphs on spec {s}" for s in ("DFLASH", "EAGLE") for b in ("triton_swa", "triton")]
    plain = ["gemma4-like triton_swa graphs on", "gemma4-like triton graphs on"]
    assert labels["gemma4-like"] == (spec if spec_only else plain + spec)
    # a model outside --spec-models keeps its plain runs
    assert labels["gemma3-1b"] == ["gemma3-1b triton_swa graphs on", "gemma3-1b triton graphs on"]


def test_the_kernels_sglang_compiled_after_serving_started_are_reported(tmp_path, monkeypatch, capsys):
    log = tmp_path / "engine.log"
    log.write_text(
        "[2026-12-07 16:03:05] Triton kernel '_swa_extend_kernel' took 3.90 s to compile after serving started. Serving-time ...\n"
        "[2026-12-07 16:03:06] something else\n"
        "[2026-12-07 16:03:11] Triton kernel '_fwd_kernel' took 5.03 s to compile after serving started. Serving-time ...\n"
        "[2026-12-07 16:03:12] triton_swa: captured the draft extend's CUDA graphs in 2.1 s\n"
    )
    assert serve.late_compiles(str(log)) == [("_swa_extend_kernel", 3.9), ("_fwd_kernel", 5.03)]
    assert serve.backend_notes(str(log)) == ["triton_swa: captured the draft extend's CUDA graphs in 2.1 s"]
    assert serve.late_compiles(str(tmp_path / "none.log")) == [] and serve.late_compiles(None) == []
    monkeypatch.setattr(serve, "run_backend", lambda path, backend, **run: dict(ok=True, wall_s=1.0, start_s=1.0, phases=[]))
    run = {"log_path": str(log), "load": [(4096, 1, 1)], "engine_args": {}}
    r = serve._run_job("/m", "triton_swa", run, {"label": "m triton_swa graphs on"})
    assert r["late_compiles"] == [("_swa_extend_kernel", 3.9), ("_fwd_kernel", 5.03)]
    out = capsys.readouterr().out
    assert "SGLang logged 2 kernel compile(s) after serving started, 8.9 s: _swa_extend_kernel 3.9 s, _fwd_kernel 5.0 s" in out
    assert "    triton_swa: captured the draft extend's CUDA graphs in 2.1 s" in out


def test_replot_draws_an_engine_csv_run_by_run(tmp_path, capsys):
    """``triton-swa bench --replot`` on an engine CSV: one PNG per run with a finished phase (tokens/s
    and time to first token per phase and backend); a run whose rows all failed draws nothing and
    says so."""
    import csv

    from triton_swa.benchmark import main as bench_main

    pytest.importorskip("matplotlib")
    rows = []
    for run_id, status in (("run-ok", "ok"), ("run-failed", "ERROR at start: no memory")):
        for provider, tok_s, ttft in (("triton_swa", 520.3, 3636.1), ("triton", 236.3, 9323.4)):
            row = {c: "" for c in serve.COLUMNS}
            row.update(op="serve", case="serve-g-graph-P32768-C16-O256", provider=provider, out_tok_s=tok_s, ttft_ms_p50=ttft)
            row.update(run_id=run_id, status=status, gpu="H", git_sha="abc1234")
            rows.append(row)
            cold = dict(row, case="serve-g-graph-P32768-cold", out_tok_s="", ttft_ms_p50=13839.9)
            rows.append(cold)
    path = tmp_path / "serve-2026-12-07-H.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=serve.COLUMNS)
        w.writeheader()
        w.writerows(rows)
    assert bench_main(["--replot", str(path)]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "serve-run-ok.png").stat().st_size > 10_000
    assert not (tmp_path / "serve-run-failed.png").exists() and "run run-failed has no row to draw" in out
