"""serve's engine profiles (triton_swa.benchmark.engine_profile): kernel names to classes, a Chrome
trace's device time summed by class, and each profile's protocol against a recording engine: the
prefill's (a warm-up first, one output token), the decode's (the window opens once every request
decodes and closes after the steps asked), each trace read from the profiler's folder. SGLang's real
profiler runs them in serve's CPU check (docs/sglang.md)."""

import asyncio
import gzip
import json

import pytest

from triton_swa.benchmark.engine_profile import (
    host_time,
    kernel_class,
    kernel_time,
    profile_decode,
    profile_first,
    profile_prefill,
    slow_leaves,
)


@pytest.mark.parametrize(
    "name, label",
    [
        ("_swa_extend_kernel", "attention"),
        ("_swa_decode_kernel", "attention"),
        ("_fwd_kernel", "attention"),  # SGLang's Triton extend
        ("_fwd_grouped_kernel_stage1", "attention"),  # SGLang's Triton decode
        ("BatchPrefillWithPagedKVCacheKernel<flashinfer::...>", "attention"),
        ("flash_fwd_kernel", "attention"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
        ("nvjet_hsh_128x256_64x4_1x2_h_bz_coopB_TNT", "gemm"),
        ("void cutlass::Kernel2<cutlass_80_tensorop>", "gemm"),
        ("Memcpy DtoD (Device -> Device)", "copy"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>", "other"),
        ("_rms_norm_kernel", "other"),
    ],
)
def test_kernel_names_fall_in_their_class(name, label):
    assert kernel_class(name) == label


def test_kernel_time_sums_device_events_by_class_and_ranks_the_top():
    events = [
        {"ph": "X", "cat": "kernel", "name": "_swa_extend_kernel", "dur": 1500.0},
        {"ph": "X", "cat": "kernel", "name": "_swa_extend_kernel", "dur": 500.0},
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16", "dur": 3000.0},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "dur": 250.0},
        {"ph": "X", "cat": "kernel", "name": "elementwise_kernel", "dur": 750.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 99999.0},  # host ops are not device time
        {"ph": "i", "cat": "kernel", "name": "_swa_extend_kernel", "dur": 99999.0},  # not a complete event
    ]
    t = kernel_time(events, top=2)
    assert t["total_ms"] == pytest.approx(6.0)
    assert t["class_ms"] == pytest.approx({"attention": 2.0, "gemm": 3.0, "copy": 0.25, "other": 0.75})
    assert t["kernels"] == 5
    assert t["top"] == [("sm90_xmma_gemm_bf16", pytest.approx(3.0), 1, "gemm"), ("_swa_extend_kernel", pytest.approx(2.0), 2, "attention")]


@pytest.fixture(autouse=True)
def _plain_profile_req(monkeypatch):
    """SGLang's ProfileReq as a plain record of the same fields: its module imports SGLang's multimodal
    stack (torchvision), which this venv lacks; the engine's worker has it loaded already."""
    import types

    from triton_swa.benchmark import engine_profile

    monkeypatch.setattr(engine_profile, "_profile_req", lambda *a, **k: types.SimpleNamespace(**engine_profile.profile_fields(*a, **k)))


class _TokenizerManager:
    """What profile_* call on ``engine.tokenizer_manager``; stop_profile writes a gzipped Chrome trace
    where SGLang's profiler does (``<output_dir>/<profile_id>-TP-0.trace.json.gz``)."""

    def __init__(self, calls, kernels_per_stop, host_events=()):
        self.calls, self.kernels, self.host_events = calls, kernels_per_stop, list(host_events)

    async def start_profile(self, req):
        self.calls.append(("start", req.activities, req.profile_id, req.with_stack, req.record_shapes))
        self.out = f"{req.output_dir}/{req.profile_id}-TP-0.trace.json.gz"

    async def stop_profile(self):
        self.calls.append(("stop",))
        events = [{"ph": "X", "cat": "kernel", "name": "_swa_extend_kernel", "dur": 1000.0}] * self.kernels + self.host_events
        with gzip.open(self.out, "wt") as f:
            json.dump({"traceEvents": events}, f)


class _RecordingEngine:
    """Records the calls profile_prefill and profile_decode make: ``generate`` and a streaming
    ``async_generate`` (one token per 1 ms step, as SGLang's stream reports ``completion_tokens``)."""

    def __init__(self, kernels_per_stop=1, host_events=()):
        self.calls = []
        self.loop = asyncio.new_event_loop()
        self.tokenizer_manager = _TokenizerManager(self.calls, kernels_per_stop, host_events)

    def generate(self, input_ids, sampling_params):
        self.calls.append(("generate", len(input_ids), dict(sampling_params)))

    async def async_generate(self, input_ids, sampling_params, stream):
        assert stream
        self.calls.append(("stream", len(input_ids), sampling_params["max_new_tokens"]))

        async def chunks():
            for n in range(1, sampling_params["max_new_tokens"] + 1):
                await asyncio.sleep(0.001)
                yield {"meta_info": {"completion_tokens": n}}

        return chunks()


def test_profile_prefill_warms_up_then_profiles_one_prefill(tmp_path):
    engine = _RecordingEngine()
    pr = profile_prefill(engine, list(range(64)), str(tmp_path / "profile"), "cuda")
    one_token = {"temperature": 0.0, "max_new_tokens": 1, "ignore_eos": True}
    assert engine.calls == [
        ("generate", 64, one_token),
        ("start", ["GPU"], "prefill", False, False),
        ("generate", 64, one_token),
        ("stop",),
    ]
    assert pr["prompt_len"] == 64 and pr["events"] == 1 and pr["wall_ms"] >= 0
    assert pr["class_ms"]["attention"] == pytest.approx(1.0) and pr["total_ms"] == pytest.approx(1.0)


def test_profile_decode_profiles_steps_once_every_request_decodes(tmp_path):
    engine = _RecordingEngine(kernels_per_stop=40)
    pr = profile_decode(engine, [list(range(16))] * 3, 8, str(tmp_path / "decode"), "cpu")
    streams = [c for c in engine.calls if c[0] == "stream"]
    assert streams == [("stream", 16, 16 * 8)] * 3
    assert [c[0] for c in engine.calls if c[0] != "stream"] == ["start", "stop"]
    assert engine.calls[3][1:] == (["CPU"], "decode", False, False)
    # every request made at least the steps asked in the window, and no request ran out before it closed
    assert all(8 <= n < 16 * 8 for n in pr["tokens_per_request"]), pr
    assert pr["steps"] >= 8 and pr["requests"] == 3 and pr["prompt_len"] == 16
    assert pr["device_ms_per_step"] == pytest.approx(40.0 / pr["steps"])


def test_profile_decode_refuses_outputs_too_short_to_fill_its_window(tmp_path):
    with pytest.raises(ValueError, match="max_new_tokens must be at least steps"):
        profile_decode(_RecordingEngine(), [[1, 2, 3]], 8, str(tmp_path), "cpu", max_new_tokens=9)


def test_host_time_sums_host_events_by_name_and_leaves_device_events_out():
    spans = [
        ("X", "cuda_runtime", "cudaStreamSynchronize", 4000.0),
        ("X", "cuda_runtime", "cudaStreamSynchronize", 2000.0),
        ("X", "user_annotation", "forward", 7000.0),
        ("X", "cpu_op", "aten::mm", 500.0),
        ("X", "kernel", "_swa_extend_kernel", 99999.0),  # device time, not host
        ("i", "cpu_op", "aten::add", 99999.0),  # not a complete event
    ]
    events = [dict(ph=ph, cat=cat, name=name, dur=dur) for ph, cat, name, dur in spans]
    assert host_time(events, top=2) == [
        ("forward", pytest.approx(7.0), 1, "user_annotation"),
        ("cudaStreamSynchronize", pytest.approx(6.0), 2, "cuda_runtime"),
    ]
    assert [name for name, *_ in host_time(events)] == ["forward", "cudaStreamSynchronize", "aten::mm"]


def test_slow_leaves_name_the_innermost_slow_span_of_each_thread_and_what_holds_it():
    def span(name, ts, dur_ms, cat="python_function", tid=1):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur_ms * 1e3, "pid": 7, "tid": tid}

    events = [
        span("run_batch", 0, 12000, "user_annotation"),
        span("draft", 100, 10000, "user_annotation"),
        span("replay", 200, 9000),
        span("slow_fn", 300, 8000),  # the leaf: nothing slow inside it
        span("fast_child", 400, 100),  # under the threshold
        span("other_leaf", 11_000_000, 600),  # after draft, still inside run_batch
        span("gpu_kernel", 300, 9000, "kernel"),  # device time is not a host span
        span("elsewhere", 0, 700, tid=2),  # another thread: a leaf of its own
    ]
    leaves = slow_leaves(events, min_ms=500)
    assert [(name, around) for name, _, _, around in leaves] == [
        ("slow_fn", ["run_batch", "draft", "replay"]),
        ("elsewhere", []),
        ("other_leaf", ["run_batch"]),
    ]
    assert leaves[0][1] == pytest.approx(8000.0) and leaves[0][2] == "python_function"
    assert slow_leaves(events, min_ms=20000) == []


_HOST = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphInstantiate", "dur": 9000.0, "ts": 0.0, "pid": 1, "tid": 1}]


def test_profile_first_streams_the_cold_request_under_a_host_and_device_profile(tmp_path):
    engine = _RecordingEngine(kernels_per_stop=3, host_events=_HOST)
    pr = profile_first(engine, list(range(32)), str(tmp_path / "first"), "cuda", 8)
    # no warm-up before it: the engine's first request is the one profiled
    assert engine.calls == [("start", ["CPU", "GPU"], "first", False, False), ("stream", 32, 8), ("stop",)]
    assert pr["prompt_len"] == 32 and pr["tokens"] == 8 and 0 < pr["ttft_ms"] <= pr["wall_ms"]
    assert pr["total_ms"] == pytest.approx(3.0) and pr["host"] == [("cudaGraphInstantiate", pytest.approx(9.0), 1, "cuda_runtime")]
    assert pr["slow"] == [] and not pr["stacks"]  # 9 ms: under the slow spans' 500 ms
    engine = _RecordingEngine(host_events=[dict(_HOST[0], dur=9e5)])
    pr = profile_first(engine, list(range(32)), str(tmp_path / "stacks"), "cuda", 8, stacks=True)
    assert engine.calls[0] == ("start", ["CPU", "GPU"], "first", True, False)  # with_stack on
    assert pr["stacks"] and pr["slow"] == [("cudaGraphInstantiate", pytest.approx(900.0), "cuda_runtime", [])]


def test_serve_profiles_only_the_engines_first_request_when_asked(tmp_path, monkeypatch):
    from triton_swa.benchmark import serve

    monkeypatch.chdir(tmp_path)
    engine = _RecordingEngine(host_events=_HOST)
    result = {}
    serve.load_phases(engine, [(16, 1, 1), (24, 1, 1)], 4, result, lambda what: None, profile_cold="cuda", stacks=True)
    assert [c[0] for c in engine.calls].count("start") == 1
    assert list(result["profile"]) == ["first request P16 (cold)"]
    assert set(result["cold_ttft_ms"]) == {"16", "24"}
    assert result["cold_ttft_ms"]["16"] == result["profile"]["first request P16 (cold)"]["ttft_ms"]
    report = serve._fmt_profile("first request P16 (cold)", result["profile"]["first request P16 (cold)"])
    assert "first token in" in report and "cudaGraphInstantiate" in report
    assert engine.calls[0][3]  # Python stacks asked for


def test_a_profile_only_run_writes_no_csv_row():
    from triton_swa.benchmark.serve import _rows

    base = dict(backend="triton_swa", graphs="on", spec="", ok=True, start_s=1.0, sglang="0.5.23")
    profiled = dict(base, profile={"prefill P8": {}})
    checked = dict(base, tokens=[[1, 2]], spec_meta=[])
    failed = dict(base, ok=False, stage="launch", error="no memory")
    rows = _rows([profiled, checked, failed], "m", 4, "abc", "clean", "run", dict(gpu="g", torch="t", triton="tr"))
    assert [(r["case"], r["status"][:5]) for r in rows] == [("serve-m-graph-tokens", "ok"), ("serve-m-graph-tokens", "ERROR")]
