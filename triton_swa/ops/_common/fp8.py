"""fp8 e4m3 K/V read as bytes and decoded in the kernel.

Triton 3.6 converts ``float8_e4m3fn`` natively on sm_89+ and AMD but not on sm_80/86, converts
``float8_e4m3fnuz`` (MI300's format) on gfx942 only, and its interpreter cannot load e4m3fnuz at all.
Where a target lacks the conversion, the kernels load the bytes as uint8 and decode them with
integer ops into float16: the byte's sign,
exponent and mantissa shifted into float16's fields, which is exact (e4m3's 3 mantissa bits fit in
float16's 10, and its subnormals stay float16 subnormals) but leaves the value scaled by
``2**(15 - bias)``: ``2**-8`` for e4m3fn (bias 7), ``2**-7`` for e4m3fnuz (bias 8). The kernels put
the missing factor (:func:`fp8_rescale`) into their score and value scales, where the per-tensor
``k_scale`` / ``v_scale`` already go, so it costs no multiply per element.

``KV_FP8`` (a kernel constexpr, chosen by ``runtime.device.kv_fp8_mode``): ``KV_NATIVE`` (0) K/V
are loaded in their own dtype (float16, bfloat16, float32, or an fp8 format the target converts);
``KV_E4M3FN_BITS`` (1) and ``KV_E4M3FNUZ_BITS`` (2) they are uint8 bytes of that format.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...runtime.device import KV_E4M3FN_BITS, KV_E4M3FNUZ_BITS, KV_NATIVE

__all__ = ["KV_E4M3FNUZ_BITS", "KV_E4M3FN_BITS", "KV_NATIVE", "fp8_decode", "fp8_rescale"]


@triton.jit
def fp8_decode(x, KV_FP8: tl.constexpr):
    """float16 holding the fp8 value of each byte of ``x`` (uint8) times ``2**-8`` (e4m3fn) or
    ``2**-7`` (e4m3fnuz), exactly; a NaN byte (e4m3fn ``0x7F``/``0xFF``, e4m3fnuz ``0x80``) gives NaN.

    ``sext(byte) << 7`` puts the 4 exponent and 3 mantissa bits in float16's exponent (low four bits)
    and mantissa (top three), and the sign in bit 15; the mask drops the sign extension's bit 14.
    """
    w = (x.to(tl.int8, bitcast=True).to(tl.int32) << 7) & 0xBF80
    if KV_FP8 == 1:
        nan = (x & 0x7F) == 0x7F
    else:
        nan = x == 0x80
    w = tl.where(nan, 0x7E00, w)
    return w.to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def fp8_rescale(scale, KV_FP8: tl.constexpr):
    """``scale`` times the factor :func:`fp8_decode` leaves out (``scale`` itself for native loads)."""
    if KV_FP8 == 1:
        scale = scale * 256.0
    elif KV_FP8 == 2:
        scale = scale * 128.0
    return scale
