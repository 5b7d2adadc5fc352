"""serve's prefill profile (triton_swa.benchmark.engine_profile): kernel names to classes, a Chrome
trace's device time summed by class, and the profiled request's protocol (a warm-up first, one output
token, the trace read from the profiler's folder)."""

import gzip
import json

import pytest

from triton_swa.benchmark.engine_profile import kernel_class, kernel_time, profile_prefill


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


class _RecordingEngine:
    """Records the calls profile_prefill makes; stop_profile writes a gzipped Chrome trace where
    SGLang's profiler would (``<output_dir>/<profile_id>-TP-0.trace.json.gz``)."""

    def __init__(self):
        self.calls = []

    def generate(self, input_ids, sampling_params):
        self.calls.append(("generate", len(input_ids), dict(sampling_params)))

    def start_profile(self, output_dir, activities, profile_id):
        self.calls.append(("start", activities))
        self.out = f"{output_dir}/{profile_id}-TP-0.trace.json.gz"

    def stop_profile(self):
        self.calls.append(("stop",))
        with gzip.open(self.out, "wt") as f:
            json.dump({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "_swa_extend_kernel", "dur": 1000.0}]}, f)


def test_profile_prefill_warms_up_then_profiles_one_prefill(tmp_path):
    engine = _RecordingEngine()
    pr = profile_prefill(engine, list(range(64)), str(tmp_path / "profile"), "cuda")
    one_token = {"temperature": 0.0, "max_new_tokens": 1, "ignore_eos": True}
    assert engine.calls == [("generate", 64, one_token), ("start", ["GPU"]), ("generate", 64, one_token), ("stop",)]
    assert pr["prompt_len"] == 64 and pr["events"] == 1 and pr["wall_ms"] >= 0
    assert pr["class_ms"]["attention"] == pytest.approx(1.0) and pr["total_ms"] == pytest.approx(1.0)
