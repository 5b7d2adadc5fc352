"""K/V stores: a layer's new K/V written at its slots, translated to SWA slots in the same kernel.

:func:`store_kv` equals ``triton_swa_reference.store_kv`` bit for bit: the encoders to bfloat16 and
float8 e4m3fn are written out by hand (Triton 3.6's interpreter rounds both wrongly), and the
division by a scale is correctly rounded, as torch's.

Scale convention (the pools' and SGLang's): an fp8 pool stores ``value / scale``; readers multiply
by the same per-tensor ``k_scale`` / ``v_scale``. A scale is a finite number ``> 0`` (passed by
value) or a one-element float tensor on the buffers' device (read in the kernel, so that a CUDA graph
replays with its current value).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..runtime.checks import INDEX_DTYPES, KV_DTYPES, check_kv_scale, check_tensor
from ..runtime.guard import check_store_kv, guarded
from ..runtime.launch import launcher_for
from ..runtime.plans import tensor_key
from .indices import check_mapping

__all__ = ["KVStorePlan", "store_kv", "store_kv_plan"]


@triton.jit
def _fp8_e4m3_bits(x, FNUZ: tl.constexpr):
    """Bits (uint8) of the float8 e4m3 value nearest to ``x`` (float32), ties to even, saturating
    (the library's rule, inf included): e4m3fn (bias 7) at ±448, NaN as 0x7F, the sign kept (-0.0 gives
    0x80); e4m3fnuz (``FNUZ``, bias 8, MI300's format) at ±240, NaN as 0x80, and no -0 (a value that
    rounds to 0 gives 0x00, since 0x80 is its NaN).

    Encoded by hand because triton 3.6's interpreter converts float32 -> e4m3 wrongly (ties away from
    even, a carry into the next binade drops a power of two: 7.99 -> 4.0, and -0.0 loses its sign) and
    cannot convert to e4m3fnuz at all. The GPU's own e4m3fn conversion agrees with this one; it costs a
    few integer ops in a memory-bound kernel.
    """
    if FNUZ:
        BIAS: tl.constexpr = 8
        LIMIT: tl.constexpr = 256.0  # the first power of two past the largest finite (240)
        TOP: tl.constexpr = 0x7F
    else:
        BIAS: tl.constexpr = 7
        LIMIT: tl.constexpr = 464.0  # halfway from the largest finite (448) to the NaN pattern's 480
        TOP: tl.constexpr = 0x7E
    sign = (x.to(tl.int32, bitcast=True) >> 24) & 0x80
    a = tl.where(tl.abs(x) < LIMIT, tl.abs(x), LIMIT)  # NaN -> LIMIT, fixed below
    # Binade exponent, clamped to the normal minimum 1 - BIAS (below it the subnormal step 2**(-BIAS-2)).
    e = tl.maximum(((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, 1 - BIAS)
    y = a * ((127 + 3 - e) << 23).to(tl.float32, bitcast=True)  # a * 2**(3 - e): [8, 16) or subnormal [0, 8)
    t = y.to(tl.int32)
    frac = y - t.to(tl.float32)
    n = t + ((frac > 0.5) | ((frac == 0.5) & ((t & 1) == 1))).to(tl.int32)
    carry = n >> 4  # 16: the rounding reached the next binade
    e += carry
    n = tl.where(carry == 1, 8, n)
    bits = tl.where(n >= 8, ((e + BIAS) << 3) | (n - 8), n)
    bits = tl.minimum(bits, TOP)
    if FNUZ:
        bits = tl.where(x != x, 0x80, tl.where(bits == 0, 0, bits | sign))
    else:
        bits = tl.where(x != x, 0x7F, bits) | sign
    return bits.to(tl.uint8)


@triton.jit
def _bf16_bits(x):
    """Bits (int16) of ``x`` (float32) rounded to bfloat16, ties to even; NaN as 0x7FC0 (torch's).

    By hand because triton 3.6's interpreter truncates float32 -> bfloat16 instead of rounding.
    """
    b = x.to(tl.int32, bitcast=True)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).to(tl.int16)
    return tl.where(x != x, 0x7FC0, r).to(tl.int16)


# the constexprs of an attention kernel's fused K/V store when it has none (decode's and extend's)
NO_STORE_CONSTEXPRS = dict(STORE=False, STORE_MAPPING=False, STORE_K_SCALE=0, STORE_V_SCALE=0, K_ENC=0, V_ENC=0)


@triton.jit
def store_slot(loc, i_n, stride_loc, mapping, n_mapping, HAS_MAPPING: tl.constexpr, SKIP_NEGATIVE: tl.constexpr):
    """The slot (int64) that token ``i_n``'s K/V go to: ``loc[i_n]``, through ``mapping`` for a sliding
    layer (a ``loc`` wrapped from the end like torch; one outside the mapping reads nothing and gives
    ``-(2**62)``, which lies outside every buffer after the caller's wrap). ``SKIP_NEGATIVE``: a
    negative ``loc`` is padding and gives ``-(2**62)`` too, instead of indexing from the end."""
    slot = tl.load(loc + i_n * stride_loc).to(tl.int64)
    if SKIP_NEGATIVE:
        slot = tl.where(slot < 0, -4611686018427387904, slot)
    if HAS_MAPPING:
        slot = tl.where(slot < 0, slot + n_mapping, slot)
        m_map = (slot >= 0) & (slot < n_mapping)
        slot = tl.load(mapping + slot, mask=m_map, other=0).to(tl.int64)
        slot = tl.where(m_map, slot, -4611686018427387904)
    return slot


@triton.jit
def store_rows(
    buf,
    stride_buf_s,
    stride_buf_h,
    stride_buf_d,
    slot,
    num_slots,
    x,
    stride_x_n,
    stride_x_h,
    stride_x_d,
    i_n,
    scale,
    scale_ptr,
    H,
    D,
    i_h,
    SCALE: tl.constexpr,
    ENC: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Write heads ``[i_h * BLOCK_H, ...)`` of token ``i_n`` of ``x`` into row ``slot`` of ``buf``:
    a negative ``slot`` is wrapped (``+ num_slots``, like torch), and a slot then outside ``[0,
    num_slots)`` writes nothing (no store can land past the buffer, whatever the indices hold).

    ``ENC``: 0 a plain cast to ``buf``'s dtype; 1 ``buf`` is int16 storage of bfloat16; 2 ``buf`` is
    uint8 storage of float8 e4m3fn; 3 of float8 e4m3fnuz (all rounded by hand, exactly as torch rounds).
    """
    slot = tl.where(slot < 0, slot + num_slots, slot)
    o_h = i_h * BLOCK_H + tl.arange(0, BLOCK_H)
    o_d = tl.arange(0, BLOCK_D)
    m_hd = (o_h < H)[:, None] & (o_d < D)[None, :] & ((slot >= 0) & (slot < num_slots))
    # [BLOCK_H, BLOCK_D]
    b_x = tl.load(x + i_n * stride_x_n + o_h[:, None] * stride_x_h + o_d[None, :] * stride_x_d, mask=m_hd, other=0.0).to(tl.float32)
    p_dst = buf + slot * stride_buf_s + o_h[:, None] * stride_buf_h + o_d[None, :] * stride_buf_d
    _encode_store(p_dst, b_x, m_hd, scale, scale_ptr, SCALE, ENC, BLOCK_H, BLOCK_D)


@triton.jit
def _encode_store(p_dst, b_x, mask, scale, scale_ptr, SCALE: tl.constexpr, ENC: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """Store the float32 tile ``b_x`` (`[ROWS, BLOCK_D]`) at ``p_dst`` where ``mask``: divided by the
    scale first (``SCALE`` 1: the number ``scale``, 2: the value at ``scale_ptr``), encoded as
    ``ENC`` (see :func:`store_rows`)."""
    # Correctly rounded division, as torch's x / scale (Triton's `/` on fp32 is approximate).
    # (div_rn does not broadcast: the scale is spread over the tile first.)
    if SCALE == 1:
        b_x = tl.math.div_rn(b_x, tl.full([ROWS, BLOCK_D], 1.0, tl.float32) * scale)
    elif SCALE == 2:
        b_x = tl.math.div_rn(b_x, tl.full([ROWS, BLOCK_D], 1.0, tl.float32) * tl.load(scale_ptr).to(tl.float32))
    if ENC == 2:
        tl.store(p_dst, _fp8_e4m3_bits(b_x, FNUZ=False), mask=mask)
    elif ENC == 3:
        tl.store(p_dst, _fp8_e4m3_bits(b_x, FNUZ=True), mask=mask)
    elif ENC == 1:
        tl.store(p_dst, _bf16_bits(b_x), mask=mask)
    else:
        tl.store(p_dst, b_x.to(p_dst.dtype.element_ty), mask=mask)


@triton.jit
def store_slots(loc, rows, m_rows, stride_loc, mapping, n_mapping, HAS_MAPPING: tl.constexpr):
    """:func:`store_slot` of a vector of tokens ``rows`` (int64), where ``m_rows``; the others, and a
    ``loc`` outside the mapping, give ``-(2**62)`` (nothing is written there)."""
    slot = tl.load(loc + rows * stride_loc, mask=m_rows, other=0).to(tl.int64)
    if HAS_MAPPING:
        slot = tl.where(slot < 0, slot + n_mapping, slot)
        m_map = m_rows & (slot >= 0) & (slot < n_mapping)
        slot = tl.load(mapping + slot, mask=m_map, other=0).to(tl.int64)
        slot = tl.where(m_map, slot, -4611686018427387904)
    return tl.where(m_rows, slot, -4611686018427387904)


@triton.jit
def store_token_rows(
    buf, stride_buf_s, stride_buf_h, slots, num_slots, x, stride_x_n, stride_x_h, rows, i_h, D,
    scale, scale_ptr, SCALE: tl.constexpr, ENC: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """:func:`store_rows` for head ``i_h`` of a tile of tokens: ``x``'s rows ``rows`` (`[BLOCK_T]`)
    into ``buf``'s rows ``slots`` (negative ones wrapped, then those outside ``[0, num_slots)``
    dropped); both with unit element strides."""
    slots = tl.where(slots < 0, slots + num_slots, slots)
    o_d = tl.arange(0, BLOCK_D)
    m = ((slots >= 0) & (slots < num_slots))[:, None] & (o_d < D)[None, :]
    # [BLOCK_T, BLOCK_D]
    b_x = tl.load(x + rows[:, None] * stride_x_n + i_h * stride_x_h + o_d[None, :], mask=m, other=0.0).to(tl.float32)
    p_dst = buf + slots[:, None] * stride_buf_s + i_h * stride_buf_h + o_d[None, :]
    _encode_store(p_dst, b_x, m, scale, scale_ptr, SCALE, ENC, BLOCK_T, BLOCK_D)


# slots and mapping are read one entry per program: no specialisation on their alignment (an engine's
# out_cache_loc is often a slice at any 8-byte offset)
@triton.jit(do_not_specialize=["n_mapping", "num_slots_k", "num_slots_v"], do_not_specialize_on_alignment=["loc", "mapping"])
def _swa_store_kv_kernel(
    k_buffer,
    stride_kb_s,
    stride_kb_h,
    stride_kb_d,
    v_buffer,
    stride_vb_s,
    stride_vb_h,
    stride_vb_d,
    k,
    stride_k_n,
    stride_k_h,
    stride_k_d,
    v,
    stride_v_n,
    stride_v_h,
    stride_v_d,
    loc,
    stride_loc,
    mapping,
    n_mapping,
    num_slots_k,
    num_slots_v,
    k_scale,
    k_scale_ptr,
    v_scale,
    v_scale_ptr,
    H,
    D,
    HV,
    DV,
    HAS_MAPPING: tl.constexpr,
    SKIP_NEGATIVE: tl.constexpr,
    K_SCALE: tl.constexpr,
    V_SCALE: tl.constexpr,
    K_ENC: tl.constexpr,
    V_ENC: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    """One program per (token, block of heads): translate the slot once, write its K and V rows.

    ``K_SCALE``/``V_SCALE``: 0 no scale, 1 scale passed by value, 2 scale read from a 1-element tensor.
    Out-of-range indices are dropped, never followed (see :func:`store_kv`): a ``loc`` outside
    ``[-n_mapping, n_mapping)`` reads no mapping entry and writes nothing, and a row is written only
    where its (wrapped) slot lies inside its buffer.
    """
    i_n = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1)
    slot = store_slot(loc, i_n, stride_loc, mapping, n_mapping, HAS_MAPPING, SKIP_NEGATIVE)
    store_rows(
        k_buffer,
        stride_kb_s,
        stride_kb_h,
        stride_kb_d,
        slot,
        num_slots_k,
        k,
        stride_k_n,
        stride_k_h,
        stride_k_d,
        i_n,
        k_scale,
        k_scale_ptr,
        H,
        D,
        i_h,
        K_SCALE,
        K_ENC,
        BLOCK_H,
        BLOCK_D,
    )
    store_rows(
        v_buffer,
        stride_vb_s,
        stride_vb_h,
        stride_vb_d,
        slot,
        num_slots_v,
        v,
        stride_v_n,
        stride_v_h,
        stride_v_d,
        i_n,
        v_scale,
        v_scale_ptr,
        HV,
        DV,
        i_h,
        V_SCALE,
        V_ENC,
        BLOCK_H,
        BLOCK_DV,
    )


def _store_blocks(H: int, D: int, DV: int) -> tuple[int, int, int]:
    """(BLOCK_H, BLOCK_D, BLOCK_DV): head dims padded to powers of two; heads grouped so that a
    program moves about 4k elements of K plus V (enough bytes per program, few programs per token)."""
    block_d, block_dv = triton.next_power_of_2(D), triton.next_power_of_2(DV)
    block_h = max(1, min(triton.next_power_of_2(H), 4096 // max(block_d, block_dv)))
    return block_h, block_d, block_dv


def _scale_arg(name: str, scale, device):
    """(mode, value, pointer) of a scale checked by ``check_kv_scale``: None -> 0; a number -> 1 (by
    value); a tensor -> 2 (read in-kernel, so that a graph replays with the tensor's current value)."""
    value, tensor = check_kv_scale(name, scale, device)
    if tensor is not None:
        return 2, 1.0, tensor
    return (0 if scale is None else 1), value, None


# compiled store kernels bound by specialisation, shared by the plans of every step
_BOUND: dict = {}


def _scale_kind(scale):
    """What a store plan depends on of a scale: a tensor's dtype, shape and device (read in the kernel),
    else whether it is None (a number's value is an argument of each run)."""
    return (scale.dtype, scale.shape, scale.device) if isinstance(scale, torch.Tensor) else scale is None


def store_view(buf: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The buffer as the kernel writes it, and its ``ENC``: bfloat16 as int16 bits (1), float8 e4m3fn
    (typed, or the pools' uint8 storage) as uint8 bits (2), float8 e4m3fnuz as uint8 bits (3), others
    as themselves (0)."""
    if buf.dtype == torch.bfloat16:
        return buf.view(torch.int16), 1
    if buf.dtype in (torch.uint8, torch.float8_e4m3fn):
        return buf.view(torch.uint8), 2
    if buf.dtype == torch.float8_e4m3fnuz:
        return buf.view(torch.uint8), 3
    return buf, 0


@guarded(check_store_kv)
def store_kv(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mapping: torch.Tensor | None = None,
    k_scale: float | torch.Tensor | None = None,
    v_scale: float | torch.Tensor | None = None,
    skip_negative: bool = False,
) -> None:
    """Write a layer's new K/V rows at full slots ``loc``, translated to SWA slots in the same kernel.

    ``k_buffer[slot] = (k / k_scale).to(k_buffer.dtype)`` (division only when a scale is given, in
    float32, correctly rounded), likewise for V, with ``slot = mapping[loc]`` for a sliding layer and
    ``loc`` for a full layer. Equals ``triton_swa_reference.store_kv`` bit for bit.

    Args:
        k_buffer (torch.Tensor): `[num_slots, H, D]` float16/bfloat16/float32/float8_e4m3fn/
            float8_e4m3fnuz, or uint8 storage of float8_e4m3fn (as the pools keep fp8); written in place.
        v_buffer (torch.Tensor): `[num_slots_v, HV, DV]`, same dtype rules.
        loc (torch.Tensor): int32/int64 `[n]` full slots (negative slots index from the end, like torch).
        k (torch.Tensor): `[n, H, D]` floating; ``v`` `[n, HV, DV]`. Any strides.
        mapping (torch.Tensor | None): ``full_to_swa_index_mapping`` for a sliding layer.
        k_scale, v_scale (float | torch.Tensor | None): per-tensor scales: a finite number > 0, or a
            one-element float tensor on the buffers' device (read in the kernel, so CUDA-graph replays
            see its current value; its value is checked only by the debug guard).
        skip_negative (bool): a negative ``loc`` is padding (vLLM's ``-1``): nothing is written for it,
            instead of indexing from the end.
        debug (bool | None): check every index this call reads or writes before launching (a host
            sync; ValueError naming request, position and slot); None follows ``TRITON_SWA_DEBUG``
            (see :mod:`triton_swa.runtime.guard`).

    Out-of-range slots are dropped, not written (the kernel cannot read ``loc`` on the host, and
    a store past a buffer would land in a neighbouring tensor). Exactly: with ``mapping``, a ``loc``
    ``l`` is first wrapped (``l + len(mapping)`` when ``l < 0``) and dropped unless ``0 <= l <
    len(mapping)``; then the slot ``s`` (``mapping[l]``, or ``loc`` itself without a mapping) is
    wrapped per buffer (``s + rows`` when ``s < 0``, ``rows = k_buffer.shape[0]`` for K,
    ``v_buffer.shape[0]`` for V) and that buffer's row is written only when ``0 <= s < rows``. The
    debug guard (``TRITON_SWA_DEBUG=1``) turns the same condition into a ValueError.

    fp8 e4m3 buffers saturate, on every device: a value beyond the format's range, ``inf``
    included, is stored as ``±448`` (e4m3fn, bytes ``0x7E``/``0xFE``) or ``±240`` (e4m3fnuz, bytes
    ``0x7F``/``0xFF``), so a finite or infinite input never becomes a NaN byte; only a NaN input is
    stored as NaN (e4m3fn ``0x7F``/``0xFF``, e4m3fnuz ``0x80``). Values inside the range round to the
    nearest e4m3 value, ties to even.

    Raises:
        TypeError, ValueError: on a wrong dtype, device, shape or scale, before any launch.
    """
    plan = _check_and_plan(k_buffer, v_buffer, loc, k, v, mapping, k_scale, v_scale, skip_negative)
    if plan is not None:
        plan.run(k_buffer, v_buffer, k, v, k_scale=k_scale, v_scale=v_scale)


def _check_and_plan(k_buffer, v_buffer, loc, k, v, mapping, k_scale, v_scale, skip_negative=False) -> KVStorePlan | None:
    """Check a store (raising TypeError/ValueError naming the argument) and plan it; None: no rows."""
    k_mode, v_mode = check_store_kv_args(k_buffer, v_buffer, loc, k, v, mapping, k_scale, v_scale)
    if not isinstance(skip_negative, bool):
        raise TypeError(f"skip_negative must be a bool, got {type(skip_negative).__name__}")
    if loc.shape[0] == 0:
        return None
    return KVStorePlan(k_buffer, v_buffer, loc, k, v, mapping, k_scale, v_scale, k_mode, v_mode, skip_negative)


def check_store_kv_args(k_buffer, v_buffer, loc, k, v, mapping, k_scale, v_scale, names=("loc", "k", "v", "mapping")) -> tuple[int, int]:
    """Check :func:`store_kv`'s arguments, naming ``loc``, ``k``, ``v`` and ``mapping`` as ``names``
    (a fused store calls them otherwise); returns the scales' modes (0 none, 1 a number, 2 a tensor)."""
    loc_name, k_name, v_name, mapping_name = names
    allowed = KV_DTYPES + (torch.uint8,)
    check_tensor("k_buffer", k_buffer, dtype=allowed, ndim=3)
    device = k_buffer.device
    check_tensor("v_buffer", v_buffer, dtype=allowed, device=device, ndim=3)
    check_tensor(loc_name, loc, dtype=INDEX_DTYPES, device=device, ndim=1)
    n = loc.shape[0]
    _, H, D = k_buffer.shape
    _, HV, DV = v_buffer.shape
    check_tensor(k_name, k, device=device, shape=(n, H, D))
    check_tensor(v_name, v, device=device, shape=(n, HV, DV))
    for name, x in ((k_name, k), (v_name, v)):
        if not x.dtype.is_floating_point:
            raise TypeError(f"{name} must be floating, got {x.dtype}")
    if mapping is not None:
        check_mapping(mapping, device, None, mapping_name)
    return _scale_arg("k_scale", k_scale, device)[0], _scale_arg("v_scale", v_scale, device)[0]


class KVStorePlan:
    """:func:`store_kv` checked and planned once for a step's slots; :meth:`run` writes one layer.

    Made by :func:`store_kv_plan`. The plan holds the slots (``loc``, and ``mapping`` for a sliding
    layer), the kernel's specialisation and grid; a run checks that its buffers and rows are the
    planned kind in O(1) and launches the compiled kernel directly.
    """

    __slots__ = (
        "_keys",
        "_loc",
        "_mapping",
        "_modes",
        "_scale_kinds",
        "_ints",
        "_strides",
        "_heads",
        "_ptrs",
        "_launcher",
        "_grid",
        "_key",
    )

    def __init__(self, k_buffer, v_buffer, loc, k, v, mapping, k_scale, v_scale, k_mode: int, v_mode: int, skip_negative: bool = False):
        kb, k_enc = store_view(k_buffer)
        vb, v_enc = store_view(v_buffer)
        _, H, D = k_buffer.shape
        _, HV, DV = v_buffer.shape
        self._keys = (tensor_key(k_buffer), tensor_key(v_buffer), tensor_key(k), tensor_key(v))
        self._loc, self._mapping, self._modes = loc, mapping, (k_mode, v_mode)
        self._scale_kinds = (_scale_kind(k_scale), _scale_kind(v_scale))
        self._ptrs = (loc.data_ptr(), (mapping if mapping is not None else loc).data_ptr())
        self._ints = (mapping.numel() if mapping is not None else 0, kb.shape[0], vb.shape[0])
        self._strides = (kb.stride(), vb.stride(), k.stride(), v.stride())
        self._heads = (H, D, HV, DV)
        block_h, block_d, block_dv = _store_blocks(max(H, HV), D, DV)
        self._grid = (loc.shape[0], triton.cdiv(max(H, HV), block_h), 1)
        constexprs = dict(
            HAS_MAPPING=mapping is not None,
            SKIP_NEGATIVE=skip_negative,
            K_SCALE=k_mode,
            V_SCALE=v_mode,
            K_ENC=k_enc,
            V_ENC=v_enc,
            BLOCK_H=block_h,
            BLOCK_D=block_d,
            BLOCK_DV=block_dv,
        )
        self._launcher = launcher_for(_swa_store_kv_kernel, constexprs)
        # what the compiled kernel depends on beside the runs' own pointers (whose alignment each run
        # checks): the launcher (constexprs), the integers, the dtypes
        dtypes = (kb.dtype, vb.dtype, k.dtype, v.dtype, loc.dtype, None if mapping is None else mapping.dtype)
        scales = (self._scale_kinds, kb.dtype, vb.dtype)
        ints = (self._strides, loc.stride(0), self._ints, self._heads, self._grid)
        self._key = (self._launcher, ints, dtypes, scales)

    def run(self, k_buffer, v_buffer, k, v, *, k_scale=None, v_scale=None) -> None:
        """Write ``k``/``v`` (rows of the planned kind) into ``k_buffer``/``v_buffer`` (buffers of the
        planned kind: any layer's) at the planned slots; scales of the planned kinds.

        Raises:
            TypeError, ValueError: a tensor or scale not of the planned kind, before any launch.
        """
        for name, x, key in zip(("k_buffer", "v_buffer", "k", "v"), (k_buffer, v_buffer, k, v), self._keys):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
            if tensor_key(x) != key:
                raise ValueError(f"{name} must be what the plan was made for ({key}), got {tensor_key(x)}: make a new plan")
        device = k_buffer.device
        k_mode, k_val, k_ptr = _scale_arg("k_scale", k_scale, device)
        v_mode, v_val, v_ptr = _scale_arg("v_scale", v_scale, device)
        if (k_mode, v_mode) != self._modes or (_scale_kind(k_scale), _scale_kind(v_scale)) != self._scale_kinds:
            raise ValueError(
                "k_scale and v_scale must be of the planned kinds (None, a number, or a tensor of the planned dtype, shape, device)"
            )
        self._launch(*self.views(k_buffer, v_buffer), k, v, k_val, k_ptr, v_val, v_ptr)

    @staticmethod
    def views(k_buffer, v_buffer) -> tuple:
        """The buffers as the kernel writes them (bfloat16 and fp8 as their bits): what
        :meth:`_launch` takes, to be kept by a caller that writes the same buffers every step."""
        return store_view(k_buffer)[0], store_view(v_buffer)[0]

    def _launch(self, kb, vb, k, v, k_val, k_ptr, v_val, v_ptr) -> None:
        """:meth:`run` after its checks: buffers as :meth:`views` gives them, the scales as
        ``_scale_arg`` splits them. Rows are read by pointer with the planned strides (a ``[n, H *
        D]`` view of planned ``[n, H, D]`` rows is the same call)."""
        kb_s, vb_s, k_s, v_s = self._strides
        n_mapping, rows_k, rows_v = self._ints
        bound = _BOUND.get(self._key)
        if bound is not False:
            # the compiled kernel, for runs whose own pointers are 16-byte aligned (as the plan's stay),
            # launched with addresses: the checks vouch for their devices
            kbp, vbp, kp, vp = kb.data_ptr(), vb.data_ptr(), k.data_ptr(), v.data_ptr()
            ksp = kbp if k_ptr is None else k_ptr.data_ptr()
            vsp = vbp if v_ptr is None else v_ptr.data_ptr()
            if (kbp | vbp | kp | vp | ksp | vsp) & 15 == 0:
                if bound is None:
                    if len(_BOUND) >= 256:
                        _BOUND.clear()
                    bound = _BOUND[self._key] = (
                        self._launcher.bind(self._args(kb, vb, k, v, k_val, k_ptr, v_val, v_ptr), self._grid) or False
                    )
                if bound:
                    loc, mapping = self._ptrs
                    bound(
                        (
                            kbp,
                            *kb_s,
                            vbp,
                            *vb_s,
                            kp,
                            *k_s,
                            vp,
                            *v_s,
                            loc,
                            self._loc.stride(0),
                            mapping,
                            n_mapping,
                            rows_k,
                            rows_v,
                            k_val,
                            ksp,
                            v_val,
                            vsp,
                            *self._heads,
                        )
                    )
                    return
        self._launcher(self._args(kb, vb, k, v, k_val, k_ptr, v_val, v_ptr), self._grid)

    def _args(self, kb, vb, k, v, k_val, k_ptr, v_val, v_ptr) -> tuple:
        """The kernel's arguments as tensors (the JIT's launch, and the binding)."""
        kb_s, vb_s, k_s, v_s = self._strides
        n_mapping, rows_k, rows_v = self._ints
        loc, mapping = self._loc, self._mapping
        return (
            kb,
            *kb_s,
            vb,
            *vb_s,
            k,
            *k_s,
            v,
            *v_s,
            loc,
            loc.stride(0),
            mapping if mapping is not None else loc,
            n_mapping,
            rows_k,
            rows_v,
            k_val,
            kb if k_ptr is None else k_ptr,
            v_val,
            vb if v_ptr is None else v_ptr,
            *self._heads,
        )


@guarded(check_store_kv)
def store_kv_plan(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mapping: torch.Tensor | None = None,
    k_scale: float | torch.Tensor | None = None,
    v_scale: float | torch.Tensor | None = None,
    skip_negative: bool = False,
) -> KVStorePlan | None:
    """Check and plan :func:`store_kv` once for a step's slots (``loc``, ``mapping``); returns a
    :class:`KVStorePlan` whose ``run(k_buffer, v_buffer, k, v, *, k_scale=None, v_scale=None)`` then
    writes any layer's rows of the planned kind, or None when ``loc`` is empty (nothing to write).
    ``debug`` checks the slots against the buffers once, here. ``loc`` (and ``mapping``) are read at
    each run: refill them in place between runs if you like.

    Raises:
        TypeError, ValueError: as :func:`store_kv`, before anything is launched.
    """
    return _check_and_plan(k_buffer, v_buffer, loc, k, v, mapping, k_scale, v_scale, skip_negative)
