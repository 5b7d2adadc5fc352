"""Online-softmax pieces of the attention kernels, in log2 units (``exp2`` is the cheap exponential)."""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def soft_cap(b_s, scale, cap):
    """``cap * tanh(scale * s / cap)`` in log2 units, with ``tanh(x) = 2 sigmoid(2x) - 1`` (Triton 3.6
    has no tanh); ``scale`` is the score scale without the log2 factor."""
    return (cap * LOG2E) * (2.0 * tl.sigmoid(b_s * (2.0 * scale / cap)) - 1.0)


@triton.jit
def fold_sink(m_i, l_i, b_sink):
    """Fold one sink logit per row into an online softmax: ``(m, l, alpha)``, scale the accumulator
    by ``alpha``. ``m_i`` the running max (``-inf`` for a row without keys), ``l_i`` the sum of
    ``exp2(s - m_i)``, ``b_sink`` the sink (any of ``-inf``, finite, ``+inf``).

    A sink is one more logit in the denominator and brings no value. Every path (decode's direct
    output, the split merge, extend's direct output) folds it here, guarded so that no
    ``-inf - -inf`` or ``inf - inf`` reaches an exponent: a row without keys gives ``l = 0`` (no
    sink, or a ``-inf`` one) or ``alpha = 0`` (a finite sink), a ``+inf`` sink takes all the weight;
    the output is zeros in each of these cases (docs/contract.md §5), never NaN.
    """
    m_new = tl.maximum(m_i, b_sink)
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_ref)
    p_sink = tl.where(b_sink == m_ref, 1.0, tl.exp2(b_sink - m_ref))
    return m_new, l_i * alpha + p_sink, alpha
