"""The sgl_kernel stand-in's MoE ops (tests/integration/stubs_cuda/sgl_kernel: what SGLang's gpt-oss
path calls on the GPU engine tier), each against an independent reference of the contract SGLang
relies on: plain Python loops for the bookkeeping, float64 sums for the reduction. CPU, tiny shapes.

Each checker is also shown to fail on a wrong answer, so a passing case means something."""

from __future__ import annotations

import importlib.util
import math
import sys

import pytest
import torch

from triton_swa.testing.sglang_engine import CUDA_STUBS


@pytest.fixture(scope="module")
def stub():
    spec = importlib.util.spec_from_file_location("sgl_kernel_stand_in_moe", CUDA_STUBS / "sgl_kernel" / "__init__.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield mod
    # the stand-in installs a finder for its submodules; leave sys.meta_path as it was
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__module__ != "sgl_kernel_stand_in_moe"]


def _align_buffers(topk_ids: torch.Tensor, num_experts: int, block_size: int, fill: int = -7):
    """The buffers SGLang 0.5.23 allocates before the call (moe_align_block_size.py), pre-filled with
    ``fill`` so unwritten entries show."""
    numel = topk_ids.numel()
    if numel < num_experts + 1:
        max_padded = numel * block_size
    else:
        max_padded = numel + (num_experts + 1) * (block_size - 1)
    max_padded = (max_padded + 3) // 4 * 4
    sorted_ids = torch.full((max_padded,), fill, dtype=torch.int32)
    expert_ids = torch.full((math.ceil(max_padded / block_size),), fill, dtype=torch.int32)
    post_pad = torch.full((1,), fill, dtype=torch.int32)
    cumsum = torch.full((num_experts + 2,), fill, dtype=torch.int32)
    return sorted_ids, expert_ids, post_pad, cumsum


def check_align(topk_ids, buckets, block_size, sorted_ids, expert_ids, post_pad) -> None:
    """The contract (see the stand-in's docstring), from the ids alone with Python loops: bucket
    ``e + 1`` per pair, buckets in order, each padded to ``block_size``; the total; the block owners;
    each bucket's pair indices in its segment (any order) and ``numel`` in its padding."""
    flat = [int(x) for x in topk_ids.reshape(-1).tolist()]
    numel = len(flat)
    members = {b: [] for b in range(buckets)}
    for i, e in enumerate(flat):
        members[e + 1].append(i)
    start, layout = 0, []
    for b in range(buckets):
        size = -(-len(members[b]) // block_size) * block_size
        layout.append((b, start, size))
        start += size
    assert int(post_pad[0]) == start, f"num_tokens_post_pad {int(post_pad[0])}, want {start}"
    got = sorted_ids.tolist()
    for b, s, size in layout:
        seg = got[s : s + size]
        n = len(members[b])
        assert sorted(seg[:n]) == members[b], f"bucket {b}: pairs {seg[:n]}, want {members[b]} in any order"
        assert seg[n:] == [numel] * (size - n), f"bucket {b}: padding {seg[n:]}, want {numel}"
        for k in range(s // block_size, (s + size) // block_size):
            assert int(expert_ids[k]) == b - 1, f"block {k}: expert {int(expert_ids[k])}, want {b - 1}"


CASES = [
    # (tokens, top_k, experts, block_size, ids drawn from [-1, E) with -1 = filtered)
    (1, 4, 8, 16, False),
    (5, 4, 8, 16, False),
    (7, 2, 4, 4, True),
    (33, 4, 8, 64, False),
    (3, 4, 32, 16, True),
]


@pytest.mark.parametrize("tokens,top_k,experts,block_size,filtered", CASES)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_moe_align_block_size(stub, tokens, top_k, experts, block_size, filtered, dtype):
    gen = torch.Generator().manual_seed(tokens * 100 + experts)
    low = -1 if filtered else 0
    topk_ids = torch.randint(low, experts, (tokens, top_k), generator=gen).to(dtype)
    buckets = experts + 1  # SGLang passes E + 1
    sorted_ids, expert_ids, post_pad, cumsum = _align_buffers(topk_ids, experts, block_size)
    stub.moe_align_block_size(topk_ids, buckets, block_size, sorted_ids, expert_ids, post_pad, cumsum, True)
    check_align(topk_ids, buckets, block_size, sorted_ids, expert_ids, post_pad)
    # pad_sorted_token_ids: the whole buffer holds numel outside the written pairs
    total = int(post_pad[0])
    assert sorted_ids[total:].tolist() == [topk_ids.numel()] * (sorted_ids.numel() - total)


def test_moe_align_block_size_every_pair_of_one_expert(stub):
    """All pairs on one expert: one bucket of several blocks; the other buckets empty."""
    topk_ids = torch.full((9, 2), 3, dtype=torch.int32)
    sorted_ids, expert_ids, post_pad, cumsum = _align_buffers(topk_ids, 6, 4)
    stub.moe_align_block_size(topk_ids, 7, 4, sorted_ids, expert_ids, post_pad, cumsum, True)
    check_align(topk_ids, 7, 4, sorted_ids, expert_ids, post_pad)
    assert int(post_pad[0]) == 20 and expert_ids[:5].tolist() == [3] * 5


def test_moe_align_checker_catches_wrong_answers(stub):
    topk_ids = torch.tensor([[0, 2], [1, 2], [2, 0]], dtype=torch.int32)
    args = (topk_ids, 4, 4)
    sorted_ids, expert_ids, post_pad, cumsum = _align_buffers(topk_ids, 3, 4)
    stub.moe_align_block_size(topk_ids, 4, 4, sorted_ids, expert_ids, post_pad, cumsum, True)
    check_align(*args, sorted_ids, expert_ids, post_pad)
    # a pair moved to another expert's segment
    wrong = sorted_ids.clone()
    s0, s1 = 4, 8  # expert 0's and expert 1's segments (bucket 0, the filtered one, is empty)
    wrong[s0], wrong[s1] = wrong[s1].clone(), wrong[s0].clone()
    with pytest.raises(AssertionError, match="bucket"):
        check_align(*args, wrong, expert_ids, post_pad)
    # a block owned by the wrong expert
    wrong_e = expert_ids.clone()
    wrong_e[1] = 0
    with pytest.raises(AssertionError, match="block 1"):
        check_align(*args, sorted_ids, wrong_e, post_pad)
    # the total one block short
    with pytest.raises(AssertionError, match="num_tokens_post_pad"):
        check_align(*args, sorted_ids, expert_ids, post_pad - 4)
    # the old convention (ids not shifted by one) is caught too
    sorted_ids2, expert_ids2, post_pad2, cumsum2 = _align_buffers(topk_ids, 3, 4)
    stub.moe_align_block_size(topk_ids - 1, 4, 4, sorted_ids2, expert_ids2, post_pad2, cumsum2, True)
    with pytest.raises(AssertionError):
        check_align(*args, sorted_ids2, expert_ids2, post_pad2)


def test_moe_align_refuses_the_other_contract(stub):
    topk_ids = torch.zeros((1, 2), dtype=torch.int32)
    bufs = _align_buffers(topk_ids, 2, 4)
    with pytest.raises(NotImplementedError, match="ignore_invalid_expert"):
        stub.moe_align_block_size(topk_ids, 3, 4, *bufs, True, True)


def sum_reference(x: torch.Tensor, scale: float) -> torch.Tensor:
    """float64: the exact sum over top-k, scaled."""
    return x.to(torch.float64).sum(dim=1) * scale


def check_sum(got: torch.Tensor, x: torch.Tensor, scale: float) -> None:
    """Within one rounding of the output dtype of the float64 value (the stand-in sums in float32
    and rounds once)."""
    want = sum_reference(x, scale)
    eps = torch.finfo(got.dtype).eps
    tol = eps * want.abs() + 4 * torch.finfo(torch.float32).eps * x.to(torch.float64).abs().sum(dim=1) * abs(scale) + 1e-30
    err = (got.to(torch.float64) - want).abs()
    assert bool((err <= tol).all()), f"moe_sum_reduce: max error {float(err.max()):.3g} past the tolerance"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("tokens,top_k,hidden,scale", [(1, 4, 8, 1.0), (40, 4, 24, 1.0), (3, 8, 16, 2.5)])
def test_moe_sum_reduce(stub, dtype, tokens, top_k, hidden, scale):
    gen = torch.Generator().manual_seed(tokens + top_k)
    x = (torch.randn(tokens, top_k, hidden, generator=gen) * 3).to(dtype)
    out = torch.full((tokens, hidden), float("nan"), dtype=dtype)
    stub.moe_sum_reduce(x, out, scale)
    check_sum(out, x, scale)


def test_moe_sum_reduce_checker_catches_wrong_answers(stub):
    x = torch.randn(4, 4, 8, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    out = torch.empty(4, 8, dtype=torch.bfloat16)
    stub.moe_sum_reduce(x, out, 1.0)
    check_sum(out, x, 1.0)
    with pytest.raises(AssertionError, match="moe_sum_reduce"):
        check_sum(x[:, :3].sum(dim=1), x, 1.0)  # one expert left out
    with pytest.raises(AssertionError, match="moe_sum_reduce"):
        check_sum(out, x, 2.0)  # the scaling factor not applied
    with pytest.raises(ValueError, match="do not match"):
        stub.moe_sum_reduce(x, torch.empty(4, 4, dtype=torch.bfloat16), 1.0)


def test_stand_ins_are_listed(stub):
    assert {"weak_ref_tensor", "moe_align_block_size", "moe_sum_reduce"} <= set(stub.STOOD_IN)
    for name in stub.STOOD_IN:
        assert callable(getattr(stub, name)) and getattr(stub, name).__doc__
    with pytest.raises(RuntimeError, match="stub"):
        stub.topk_softmax(None, None, None, True)  # ops not stood in stay loud


def test_moe_cuda_path_plugin_sends_only_cuda_tensors_to_forward_cuda():
    """tests/engine/plugins/triton_swa_moe_cuda_path.py: under the forced torch backend SGLang calls
    ``forward_native`` of the unquantized MoE method; the plugin sends CUDA tensors to its
    ``forward_cuda`` (the Triton runner that calls the two stand-ins above) and leaves CPU tensors on
    SGLang's native path."""
    unquant = pytest.importorskip("sglang.srt.layers.quantization.unquant")
    from types import SimpleNamespace

    from triton_swa.benchmark.serve import ENGINE_PLUGINS

    cls = unquant.UnquantizedFusedMoEMethod
    saved = {k: cls.__dict__[k] for k in ("forward_native", "forward_cuda", "forward_cpu")}
    spec = importlib.util.spec_from_file_location("triton_swa_moe_cuda_path", ENGINE_PLUGINS / "triton_swa_moe_cuda_path.py")
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    calls = []
    try:
        cls.forward_cuda = lambda self, layer, dispatch_output: calls.append("cuda") or "cuda"
        cls.forward_native = lambda self, layer, dispatch_output: calls.append("native") or "native"
        plugin.register()
        plugin.register()  # idempotent: wrapped once
        method = object.__new__(cls)
        on_gpu = SimpleNamespace(hidden_states=SimpleNamespace(is_cuda=True))
        on_cpu = SimpleNamespace(hidden_states=torch.zeros(1))
        assert method.forward_native(None, on_gpu) == "cuda"
        assert method.forward_native(layer=None, dispatch_output=on_cpu) == "native"
        assert calls == ["cuda", "native"]
    finally:
        for k, v in saved.items():
            setattr(cls, k, v)
        if "_triton_swa_moe_cuda_path" in cls.__dict__:
            delattr(cls, "_triton_swa_moe_cuda_path")


@pytest.fixture
def gpu_standins():
    """tests/engine/plugins/triton_swa_gpu_standins.py, loaded; what it changes is put back after."""
    pytest.importorskip("sglang.srt.layers.dual_gemm")
    from sglang.srt.layers.dual_gemm import DualGemm
    from sglang.srt.speculative import dflash_utils

    from triton_swa.testing.sglang_engine import ENGINE_PLUGINS

    spec = importlib.util.spec_from_file_location("triton_swa_gpu_standins", ENGINE_PLUGINS / "triton_swa_gpu_standins.py")
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    saved_select = DualGemm.__dict__["_select_mode"]
    saved_flag = dflash_utils._DFLASH_SAMPLING_VERIFY_AVAILABLE
    saved_module = sys.modules.get(plugin.FLASHMLA_BACKEND)
    yield plugin
    DualGemm._select_mode = saved_select
    if "_triton_swa_standin" in DualGemm.__dict__:
        delattr(DualGemm, "_triton_swa_standin")
    dflash_utils._DFLASH_SAMPLING_VERIFY_AVAILABLE = saved_flag
    sys.modules.pop(plugin.FLASHMLA_BACKEND, None)
    if saved_module is not None:
        sys.modules[plugin.FLASHMLA_BACKEND] = saved_module


def test_gpu_standins_install_only_what_does_not_import(gpu_standins, monkeypatch):
    """Each stand-in is installed only where its package does not import, and once."""
    from sglang.srt.speculative import dflash_utils

    kernels = dflash_utils._DFLASH_SAMPLING_VERIFY_AVAILABLE  # off CUDA SGLang has no such kernel
    missing = [
        name
        for name, needed in (
            ("cutlass", not gpu_standins._imports("cutlass")),
            ("flash_mla", not gpu_standins._imports(gpu_standins.FLASHMLA_BACKEND)),
            ("flashinfer", kernels and not gpu_standins._imports("flashinfer")),
        )
        if needed
    ]
    assert gpu_standins.register() == missing
    assert gpu_standins.register() == []  # idempotent


def test_gpu_standin_dual_gemm_answers_as_sglang_does_off_sm100(gpu_standins, monkeypatch):
    """Off sm100 SGLang's own predicate refuses the CuteDSL dual GEMM; the stand-in gives that answer
    without importing cutlass, and leaves every other case to SGLang's method."""
    import sglang.srt.utils as sglang_utils
    from sglang.srt.layers.dual_gemm import DualGemm

    if gpu_standins._imports("cutlass"):
        pytest.skip("cutlass imports here: the stand-in is not installed")
    calls = []
    monkeypatch.setattr(DualGemm, "_select_mode", lambda self, gate_up, hidden: calls.append(hidden) or "sglang's")
    gpu_standins._dual_gemm()
    gemm = object.__new__(DualGemm)
    monkeypatch.setattr(sglang_utils, "is_cuda", lambda: True)
    monkeypatch.setattr(sglang_utils, "is_sm100_supported", lambda device=None: False)
    assert gemm._select_mode(None, 128) is None and calls == []  # sm90: no dual GEMM, no import
    monkeypatch.setattr(sglang_utils, "is_sm100_supported", lambda device=None: True)
    assert gemm._select_mode(None, 256) == "sglang's" and calls == [256]  # sm100: SGLang decides
    monkeypatch.setattr(sglang_utils, "is_cuda", lambda: False)
    assert gemm._select_mode(None, 512) == "sglang's" and calls == [256, 512]


def test_gpu_standin_flashmla_backend_is_no_backend(gpu_standins):
    """EAGLE's worker only asks isinstance(backend, FlashMLABackend): no backend is the stand-in."""
    if not gpu_standins._flashmla():
        pytest.skip("flashmla_backend imports here: the stand-in is not installed")
    from sglang.srt.layers.attention.flashmla_backend import FlashMLABackend

    from triton_swa.backend import TritonSWAAttnBackend

    assert not issubclass(TritonSWAAttnBackend, FlashMLABackend) and not isinstance(object(), FlashMLABackend)


def test_gpu_standin_dflash_sampling_verify_unavailable_without_flashinfer(gpu_standins, monkeypatch):
    """Without FlashInfer (whose headers SGLang's JIT sampling-verify kernel needs) DFLASH's sampling
    verify is marked unavailable: SGLang's own predicate then says so, as it does on NPUs."""
    from sglang.srt.speculative import dflash_utils

    if gpu_standins._imports("flashinfer"):
        pytest.skip("flashinfer imports here: the stand-in is not installed")
    monkeypatch.setattr(dflash_utils, "_DFLASH_SAMPLING_VERIFY_AVAILABLE", True)  # as on CUDA
    assert dflash_utils.is_dflash_sampling_verify_available()
    assert gpu_standins._dflash_sampling_verify()
    assert not dflash_utils.is_dflash_sampling_verify_available()
    assert not gpu_standins._dflash_sampling_verify()  # once


def _moe_cuda_path(tokens: int, top_k: int, block_m: int, broken: int = 0) -> dict:
    pytest.importorskip("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe")
    import numpy

    if tuple(int(x) for x in numpy.__version__.split(".")[:2]) >= (2, 4):
        # the probe runs SGLang's MoE kernel in Triton 3.6's interpreter, which fails under numpy 2.4+
        # (docs/contract.md §8); the CPU tier pins numpy<2.4 and runs it there, on every CI run
        pytest.skip(f"Triton 3.6's interpreter needs numpy<2.4 (docs/contract.md §8); this machine has numpy {numpy.__version__}")
    import json
    import os
    import subprocess

    from triton_swa.testing.sglang_engine import REPO_ROOT

    # no GPU seen, on a GPU machine too: SGLang's MoE kernel takes Hopper's PDL branch (gdc_wait) where
    # the device supports it, which Triton's interpreter cannot run; the probe binds the CUDA branches itself
    env = dict(os.environ, TRITON_INTERPRET="1", TORCHDYNAMO_DISABLE="1", CUDA_VISIBLE_DEVICES="")
    paths = [str(CUDA_STUBS), str(REPO_ROOT / "tests" / "integration" / "stubs"), str(REPO_ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))  # SGLang's own
    probe = REPO_ROOT / "tests" / "integration" / "moe_cuda_path_probe.py"
    argv = [sys.executable, str(probe), str(tokens), str(top_k), str(block_m), str(broken)]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


# SGLang's Triton MoE computes in float16 for float32 inputs (compute_type in fused_moe.py): the
# bound is float16 rounding of the operands, far below what a misrouted token costs (the broken case)
MOE_PATH_TOL = 2e-3


@pytest.mark.parametrize("tokens,top_k,block_m", [(5, 2, 16), (40, 4, 16)])
def test_moe_cuda_path_equals_per_expert_reference(tokens, top_k, block_m):
    """gpt-oss's stood-in MoE path on the GPU engine tier, end to end in Triton's interpreter: SGLang's
    fused-MoE sequence with the stand-in's aligner (and, at 40 tokens and top-4, its sum-reduce)
    equals a float64 per-expert loop up to float16 rounding."""
    r = _moe_cuda_path(tokens, top_k, block_m)
    assert r["finite"] and r["max_err"] <= MOE_PATH_TOL * r["ref_max"], r
    # SGLang's CUDA combine calls sgl_kernel's sum-reduce above 32 tokens with top-k > 2
    assert r["sum_reduce_calls"] == (1 if tokens > 32 and top_k > 2 else 0), r
    broken = _moe_cuda_path(tokens, top_k, block_m, broken=1)
    assert broken["max_err"] > 20 * MOE_PATH_TOL * broken["ref_max"], broken
