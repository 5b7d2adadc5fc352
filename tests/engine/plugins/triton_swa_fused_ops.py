"""Test-side SGLang plugin: Triton stand-ins for the fused norm and rotary kernels of SGLang's compiled
``sgl_kernel``, for the GPU engine tier, loaded for every attention backend it compares.

Why: ``sgl_kernel`` 0.4.10 does not load on the lent GPU's torch, so the tier forces SGLang's fused
layers onto their plain-torch ``forward_native`` paths (``SGLANG_FORCE_FUSED_OP_BACKEND=torch``). There
a norm is seven to nine kernels (casts, square, mean, rsqrt, products) and a rotary embedding about
twenty (gathers, halves, products, concatenations). In a Gemma-like decode step those small kernels
outweighed the model's GEMMs (SGLang's profiler on the H100: 3.7 ms of a 7.2 ms step), which a
production install runs as one fused kernel each. This plugin gives each of these layers one Triton
kernel on CUDA tensors, computing what its ``forward_native`` computes:

- ``RMSNorm`` (optionally adding ``residual`` and ``post_residual_addition`` in float32 first),
  ``GemmaRMSNorm`` and ``Gemma3RMSNorm`` (the residual added in the input dtype, weight ``1 + w``),
  ``Gemma4RMSNorm`` (weight ``w + scale_shift``, or none): sums of squares in float32;
- ``RotaryEmbedding`` (Neox and GPT-J layouts, a partial rotary width): the same roundings as the
  eager torch code (cos and sin in the activation dtype, each product and sum rounded to it).

The only difference from ``forward_native`` is the order of the float32 sum of squares. Any case these
kernels do not cover (a variance width override, a float32 residual, the HF cast order, position
offsets, a CPU tensor, ...) calls the original ``forward_native``. Subclasses that define their own
``forward_native`` keep it.

Loaded by ``triton_swa.testing.sglang_engine.gpu_engine_env`` on the stand-in image (the same for
every backend); ``TRITON_SWA_ENGINE_FUSED_OPS=torch`` leaves it out (the plain-torch set-up of the
runs before 2026-12-07). ``register()`` returns the names of the layers it patched.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# devices whose tensors take the kernels (tests add "cpu" to run them in Triton's interpreter)
DEVICES = {"cuda"}

ADD_NONE, ADD_FP32, ADD_NATIVE = 0, 1, 2


@triton.jit
def _rms_norm_kernel(
    X,
    R,
    P,
    W,
    Y,
    RO,
    n_cols,
    eps,
    shift,
    ADD: tl.constexpr,  # 0: none; 1: x + r (+ p) in float32; 2: r + p, then x + r, each rounded to the dtype
    HAS_POST: tl.constexpr,
    HAS_W: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64) * n_cols
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    x = tl.load(X + row + cols, mask=m, other=0.0)
    xf = x.to(tl.float32)
    if ADD == 1:
        xf = xf + tl.load(R + row + cols, mask=m, other=0.0).to(tl.float32)
        if HAS_POST:
            xf = xf + tl.load(P + row + cols, mask=m, other=0.0).to(tl.float32)
        tl.store(RO + row + cols, xf.to(RO.dtype.element_ty), mask=m)
    elif ADD == 2:
        r = tl.load(R + row + cols, mask=m, other=0.0)
        if HAS_POST:
            r = (r.to(tl.float32) + tl.load(P + row + cols, mask=m, other=0.0).to(tl.float32)).to(r.dtype)
        s = (xf + r.to(tl.float32)).to(RO.dtype.element_ty)
        tl.store(RO + row + cols, s, mask=m)
        xf = s.to(tl.float32)
    y = xf * tl.rsqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    if HAS_W:
        y = y * (tl.load(W + cols, mask=m, other=0.0).to(tl.float32) + shift)
    tl.store(Y + row + cols, y.to(Y.dtype.element_ty), mask=m)


def rms_norm(x, weight, eps, shift=0.0, residual=None, post=None, add=ADD_NONE, out_dtype=None):
    """One launch: ``y = norm(x [+ residual [+ post]]) * (weight + shift)``; returns ``y`` or
    ``(y, the sum)``, each shaped like ``x`` (see ``_rms_norm_kernel`` for the two addition orders)."""
    n = x.shape[-1]
    x = x.contiguous()
    out_dtype = out_dtype or x.dtype
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    res_out = torch.empty(x.shape, dtype=out_dtype if add == ADD_FP32 else x.dtype, device=x.device) if add else y
    rows = x.numel() // n if n else 0
    if rows:
        r = residual.contiguous() if residual is not None else x
        p = post.contiguous() if post is not None else x
        w = weight if weight is not None else x
        _rms_norm_kernel[(rows,)](
            x,
            r,
            p,
            w,
            y,
            res_out,
            n,
            float(eps),
            float(shift),
            ADD=add,
            HAS_POST=post is not None,
            HAS_W=weight is not None,
            BLOCK=triton.next_power_of_2(n),
        )
    return (y, res_out) if add else y


@triton.jit
def _rope_kernel(
    X,
    Y,
    POS,
    CS,
    heads,
    stride_xt,
    stride_xh,
    head_size,
    half,
    NEOX: tl.constexpr,
    PASS: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    dt = Y.dtype.element_ty
    pos = tl.load(POS + t).to(tl.int64)
    i = tl.arange(0, BLOCK_HALF)
    mi = i < half
    cos = tl.load(CS + pos * 2 * half + i, mask=mi, other=0.0).to(dt).to(tl.float32)
    sin = tl.load(CS + pos * 2 * half + half + i, mask=mi, other=0.0).to(dt).to(tl.float32)
    if NEOX:
        i1 = i
        i2 = i + half
    else:
        i1 = 2 * i
        i2 = 2 * i + 1
    x_row = X + t * stride_xt + h * stride_xh
    y_row = Y + (t * heads + h) * head_size
    x1 = tl.load(x_row + i1, mask=mi, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + i2, mask=mi, other=0.0).to(tl.float32)
    o1 = ((x1 * cos).to(dt).to(tl.float32) - (x2 * sin).to(dt).to(tl.float32)).to(dt)
    o2 = ((x2 * cos).to(dt).to(tl.float32) + (x1 * sin).to(dt).to(tl.float32)).to(dt)
    tl.store(y_row + i1, o1, mask=mi)
    tl.store(y_row + i2, o2, mask=mi)
    if PASS:
        j = 2 * half + tl.arange(0, BLOCK_D)
        mj = j < head_size
        tl.store(y_row + j, tl.load(x_row + j, mask=mj, other=0.0).to(dt), mask=mj)


def rotary(x, positions, cos_sin_cache, head_size, rotary_dim, neox):
    """``x`` ([tokens, heads * head_size], or any shape whose last dims hold that) rotated by
    ``cos_sin_cache[positions]`` in its first ``rotary_dim`` dims; a new contiguous tensor, shaped
    like ``x``."""
    tokens = positions.numel()
    view = x.view(tokens, -1, head_size)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if tokens and view.shape[1]:
        if view.stride(-1) != 1:
            view = view.contiguous()
        half = rotary_dim // 2
        _rope_kernel[(tokens, view.shape[1])](
            view,
            y,
            positions,
            cos_sin_cache.contiguous(),
            view.shape[1],
            view.stride(0),
            view.stride(1),
            head_size,
            half,
            NEOX=bool(neox),
            PASS=rotary_dim < head_size,
            BLOCK_HALF=triton.next_power_of_2(half),
            BLOCK_D=triton.next_power_of_2(max(head_size - rotary_dim, 1)),
        )
    return y


def _takes(*tensors) -> bool:
    """Every given tensor on a kernel device, in a dtype the kernels keep, on one device."""
    live = [t for t in tensors if t is not None]
    return (
        all(t.device.type in DEVICES and t.dtype in (torch.float16, torch.bfloat16, torch.float32) for t in live)
        and len({t.device for t in live}) == 1
    )


def _same_shape(x, *others) -> bool:
    return all(o is None or o.shape == x.shape for o in others)


def _rmsnorm(native):
    def forward_native(self, x, residual=None, post_residual_addition=None, quant_linear=None):
        ok = (
            self.variance_size_override is None
            and not self.cast_x_before_out_mul
            and not self.fp32_residual
            and x.shape[-1] == self.hidden_size
            and (residual is not None or post_residual_addition is None)
            and _same_shape(x, residual, post_residual_addition)
            and _takes(x, residual, post_residual_addition, self.weight)
        )
        if not ok:
            return native(self, x, residual, post_residual_addition, quant_linear)
        dtype = self.override_orig_dtype or x.dtype
        add = ADD_FP32 if residual is not None else ADD_NONE
        return rms_norm(x, self.weight, self.variance_epsilon, 0.0, residual, post_residual_addition, add, dtype)

    return forward_native


def _gemma_rmsnorm(native):
    def forward_native(self, x, residual=None, post_residual_addition=None):
        ok = (
            (residual is not None or post_residual_addition is None)
            and _same_shape(x, residual, post_residual_addition)
            and _takes(x, residual, post_residual_addition, self.weight)
            and (residual is None or residual.dtype == x.dtype)
        )
        if not ok:
            return native(self, x, residual, post_residual_addition)
        add = ADD_NATIVE if residual is not None else ADD_NONE
        return rms_norm(x, self.weight, self.variance_epsilon, 1.0, residual, post_residual_addition, add)

    return forward_native


def _gemma3_rmsnorm(native):
    def forward_native(self, x, residual=None):
        ok = _same_shape(x, residual) and _takes(x, residual, self.weight) and (residual is None or residual.dtype == x.dtype)
        if not ok:
            return native(self, x, residual)
        return rms_norm(x, self.weight, self.eps, 1.0, residual, None, ADD_NATIVE if residual is not None else ADD_NONE)

    return forward_native


def _gemma4_rmsnorm(native):
    def forward_native(self, x):
        if not _takes(x, self.weight):
            return native(self, x)
        return rms_norm(x, self.weight if self.with_scale else None, self.eps, self.scale_shift)

    return forward_native


def _rotary(native):
    def forward_native(self, positions, query, key, offsets=None, fused_set_kv_buffer_arg=None):
        cache = getattr(self, "cos_sin_cache", None)
        ok = (
            offsets is None
            and fused_set_kv_buffer_arg is None
            and not hasattr(self, "sin_cos_cache")
            and cache is not None
            and cache.shape[-1] == self.rotary_dim
            and self.rotary_dim % 2 == 0
            and _takes(query, key)
            and cache.device == query.device
            and positions.device == query.device
            and query.shape[-1] % self.head_size == 0
            and key.shape[-1] % self.head_size == 0
        )
        if not ok:
            return native(self, positions, query, key, offsets, fused_set_kv_buffer_arg)
        positions = positions.flatten()
        return (
            rotary(query, positions, cache, self.head_size, self.rotary_dim, self.is_neox_style),
            rotary(key, positions, cache, self.head_size, self.rotary_dim, self.is_neox_style),
        )

    return forward_native


def _layers():
    from sglang.srt.layers.layernorm import Gemma3RMSNorm, Gemma4RMSNorm, GemmaRMSNorm, RMSNorm
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding

    return {
        RMSNorm: _rmsnorm,
        GemmaRMSNorm: _gemma_rmsnorm,
        Gemma3RMSNorm: _gemma3_rmsnorm,
        Gemma4RMSNorm: _gemma4_rmsnorm,
        RotaryEmbedding: _rotary,
    }


def register() -> list[str]:
    patched = []
    for cls, wrap in _layers().items():
        if cls.__dict__.get("_triton_swa_fused_ops", False):
            continue
        cls.forward_native = wrap(cls.forward_native)
        cls._triton_swa_fused_ops = True
        patched.append(cls.__name__)
    return patched
