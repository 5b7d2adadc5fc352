"""The GPU engine tier's fused norm and rotary stand-ins (tests/engine/plugins/triton_swa_fused_ops.py)
against the ``forward_native`` of SGLang 0.5.23's own layer classes, which they replace on CUDA tensors.

The kernels run in Triton's interpreter on CPU tensors (the plugin's ``DEVICES`` widened for the
test). In float16 and float32 the residual sums and every rotary output must be bit for bit those of
torch's eager code; a normalised output may differ from it only by the order of the float32 sum of
squares and of the reciprocal square root: one unit in the last place of a float16 output, eight of a
float32 one (nothing rounds it to a narrower type). The interpreter truncates float32 to bfloat16 (a
GPU rounds to nearest even), and a Gemma residual is rounded twice before the norm reads it, so
bfloat16 cases are held to one unit for a sum and four for a normalised output. Cases the kernels do
not cover must reach the original code."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from triton_swa.testing.sglang_engine import ENGINE_PLUGINS

pytest.importorskip("sglang.srt.layers.layernorm", reason="SGLang tier: sglang 0.5.23 is not installed (scripts/setup_sglang.sh)")
# on a GPU the plugin's kernels compile, and contraction into fused multiply-adds moves the last bit
# the bounds above are written against; there the GPU engine tier runs them in every engine
pytestmark = [pytest.mark.sglang, pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tier: the stand-ins in Triton's interpreter")]


@pytest.fixture(scope="module")
def ops():
    spec = importlib.util.spec_from_file_location("triton_swa_fused_ops_under_test", ENGINE_PLUGINS / "triton_swa_fused_ops.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.DEVICES = {"cpu"}
    return mod


def _ulp(ref: torch.Tensor) -> torch.Tensor:
    """One unit in the last place of each element of ``ref`` in its dtype (at least the smallest normal's)."""
    bits = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}[ref.dtype]
    mag = ref.float().abs().clamp_min(torch.finfo(ref.dtype).tiny)
    return torch.exp2(torch.floor(torch.log2(mag)) - (bits - 1))


def assert_within_ulp(got: torch.Tensor, want: torch.Tensor, ulps: int | None = None) -> None:
    """``got`` within ``ulps`` units in the last place of ``want`` (by default as the module says)."""
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    ulps = ulps or {torch.float16: 1, torch.bfloat16: 4, torch.float32: 8}[want.dtype]
    err = (got.float() - want.float()).abs()
    bad = err > ulps * _ulp(want)
    assert not bad.any(), f"{int(bad.sum())} of {want.numel()} elements off by more than {ulps} ulp (max {err.max().item():.3g})"


def assert_sum_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    """A residual sum: bit for bit, but for the interpreter's bfloat16 truncation (one ulp)."""
    if want.dtype == torch.bfloat16:
        assert_within_ulp(got, want, 1)
    else:
        assert torch.equal(got, want), "the residual sum differs"


def test_the_ulp_check_fails_on_a_wrong_answer():
    want = torch.randn(64, 32).to(torch.bfloat16)
    assert_within_ulp(want.clone(), want)
    with pytest.raises(AssertionError):
        assert_within_ulp((want.float() * (1 + 2**-4)).to(torch.bfloat16), want)
    want = torch.randn(64, 32).to(torch.float16)
    with pytest.raises(AssertionError):
        assert_within_ulp((want.float() * (1 + 2**-9)).to(torch.float16), want)
    with pytest.raises(AssertionError):
        assert_sum_equal(want + 2**-9, want)


def _call(wrapper, cls, layer, *args):
    """The plugin's forward for ``cls`` (not installed on the class: other tests share the process)."""
    return wrapper(cls.forward_native)(layer, *args)


def _rand(*shape, dtype=torch.bfloat16, scale=1.0):
    return (torch.randn(*shape) * scale).to(dtype)


def check_norm(ops_wrapper, cls, layer, x, res=None, post=None):
    """``cls``'s norm of ``x`` (with the residual, and its post addition, given) by the plugin
    against SGLang's ``forward_native``: the output within the bound, the residual sum exact."""
    args = tuple(a for a in (x, res, post) if a is not None)
    want = cls.forward_native(layer, *args)
    got = _call(ops_wrapper, cls, layer, *args)
    if res is None:
        assert_within_ulp(got, want)
        return
    assert_within_ulp(got[0], want[0])
    assert_sum_equal(got[1], want[1])
    assert not torch.equal(want[1], res), "the case adds nothing"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(5, 48), (3, 2, 40)])
@pytest.mark.parametrize("adds", [0, 1, 2])
def test_rmsnorm(ops, dtype, shape, adds):
    from sglang.srt.layers.layernorm import RMSNorm

    layer = RMSNorm(shape[-1], eps=1e-5).to(dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(shape[-1]))
    x, res, post = _rand(*shape, dtype=dtype), _rand(*shape, dtype=dtype, scale=4), _rand(*shape, dtype=dtype)
    check_norm(ops._rmsnorm, RMSNorm, layer, x, res if adds else None, post if adds == 2 else None)


# bfloat16 without the second addition: under the interpreter's truncation, two rounded sums of
# magnitude 8 move a normalised output by more than the bound (a GPU rounds them to nearest)
@pytest.mark.parametrize("dtype, adds", [(torch.float16, a) for a in (0, 1, 2)] + [(torch.bfloat16, a) for a in (0, 1)])
def test_gemma_rmsnorm(ops, adds, dtype):
    from sglang.srt.layers.layernorm import GemmaRMSNorm

    layer = GemmaRMSNorm(40, eps=1e-6).to(dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(40) * 0.5)
    x, res, post = _rand(6, 40, dtype=dtype), _rand(6, 40, dtype=dtype, scale=8), _rand(6, 40, dtype=dtype)
    check_norm(ops._gemma_rmsnorm, GemmaRMSNorm, layer, x, res if adds else None, post if adds == 2 else None)


@pytest.mark.parametrize("residual", [False, True])
def test_gemma3_rmsnorm(ops, residual):
    from sglang.srt.layers.layernorm import Gemma3RMSNorm

    layer = Gemma3RMSNorm(32, eps=1e-6).to(torch.float16)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(32) * 0.5)
    x, res = _rand(2, 3, 32, dtype=torch.float16), _rand(2, 3, 32, dtype=torch.float16, scale=8)
    check_norm(ops._gemma3_rmsnorm, Gemma3RMSNorm, layer, x, res if residual else None)


@pytest.mark.parametrize("with_scale, shift", [(True, 0.0), (True, 1.0), (False, 0.0)])
def test_gemma4_rmsnorm(ops, with_scale, shift):
    from sglang.srt.layers.layernorm import Gemma4RMSNorm

    layer = Gemma4RMSNorm(24, eps=1e-6, scale_shift=shift, with_scale=with_scale)
    if with_scale:
        with torch.no_grad():
            layer.weight.copy_(torch.randn(24))
    x = _rand(7, 2, 24)[:, 1]  # a strided view, as the model's head slices are
    want = Gemma4RMSNorm.forward_native(layer, x)
    got = _call(ops._gemma4_rmsnorm, Gemma4RMSNorm, layer, x)
    assert_within_ulp(got, want)


def _rope(cls, head: int, rotary_dim: int, neox: bool, positions: int = 64):
    """SGLang's ``RotaryEmbedding`` as a CUDA engine holds it (a float32 cos/sin cache), built without
    its ``__init__``: on a CPU without SGLang's CPU-engine switch that imports vLLM's kernels."""
    from sglang.kernels.fused_op import BaseFusedOp
    from sglang.srt.layers.rotary_embedding.utils import apply_rotary_emb

    rope = cls.__new__(cls)
    BaseFusedOp.__init__(rope)
    rope.head_size, rope.rotary_dim, rope.max_position_embeddings, rope.base = head, rotary_dim, positions, 10000
    rope.is_neox_style, rope.position_start, rope._force_native = neox, 0, False
    rope.register_buffer("cos_sin_cache", rope._compute_cos_sin_cache(), persistent=False)
    rope._apply_rotary_emb_wrapped = apply_rotary_emb
    return rope


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [16, 8])
def test_rotary(ops, dtype, neox, rotary_dim):
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding

    head, hq, hk, tokens = 16, 3, 1, 5
    rope = _rope(RotaryEmbedding, head, rotary_dim, neox)
    qkv = _rand(tokens, (hq + 2 * hk) * head, dtype=dtype)
    q, k, _ = qkv.split([hq * head, hk * head, hk * head], dim=-1)  # strided, as in the models
    positions = torch.randint(0, 64, (tokens,))
    want = RotaryEmbedding.forward_native(rope, positions, q.clone(), k.clone())
    got = _call(ops._rotary, RotaryEmbedding, rope, positions, q, k)
    for g, w, name in zip(got, want, "qk"):
        assert g.shape == w.shape and torch.equal(g, w), f"{name} differs"
    assert not torch.equal(want[0], q), "the case rotates nothing"


def test_uncovered_cases_reach_the_original(ops, monkeypatch):
    """A layer setting the kernels do not cover, or a tensor off their devices, runs SGLang's code."""
    from sglang.srt.layers.layernorm import RMSNorm

    def no_kernel(*a, **k):
        raise AssertionError("the kernel was called")

    monkeypatch.setattr(ops, "rms_norm", no_kernel)
    x, res = _rand(3, 16), _rand(3, 16)
    for layer, args in [
        (RMSNorm(16, cast_x_before_out_mul=True).to(torch.bfloat16), (x,)),
        (RMSNorm(16, fp32_residual=True).to(torch.bfloat16), (x, res)),
        (RMSNorm(16, var_hidden_size=8).to(torch.bfloat16), (x,)),
        (RMSNorm(16).to(torch.bfloat16), (x, res[:1])),  # a broadcast residual
    ]:
        want = RMSNorm.forward_native(layer, *args)
        got = _call(ops._rmsnorm, RMSNorm, layer, *args)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert torch.equal(g, w)
    monkeypatch.setattr(ops, "DEVICES", {"cuda"})
    layer = RMSNorm(16).to(torch.bfloat16)
    assert torch.equal(_call(ops._rmsnorm, RMSNorm, layer, x), RMSNorm.forward_native(layer, x))


def test_register_patches_each_class_once(ops, monkeypatch):
    from sglang.srt.layers import layernorm
    from sglang.srt.layers.rotary_embedding import base

    for cls in (layernorm.RMSNorm, layernorm.GemmaRMSNorm, layernorm.Gemma3RMSNorm, layernorm.Gemma4RMSNorm, base.RotaryEmbedding):
        monkeypatch.setattr(cls, "forward_native", cls.forward_native)
        monkeypatch.setattr(cls, "_triton_swa_fused_ops", False, raising=False)
    assert ops.register() == ["RMSNorm", "GemmaRMSNorm", "Gemma3RMSNorm", "Gemma4RMSNorm", "RotaryEmbedding"]
    assert ops.register() == []
