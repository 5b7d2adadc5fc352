"""Bad-input catalogue of the public ops: every mistake raises before any kernel launch or write.

For each public op (``swa_decode``, ``swa_extend``, ``build_window_indices``,
``build_window_page_table``, ``swa_out_cache_loc``, ``store_kv`` and the host helpers
``window_index_count``, ``max_window_len``, ``max_window_pages``), one valid call is mutated one
argument at a time: wrong dtype, rank, shape, device (a ``meta`` tensor stands for another device),
stride, window, page size, head ratio, head dim, scale and out-of-range host-side length. Each must
raise the exception of its kind, with a message naming the argument:

- ``TypeError``: a wrong type or dtype (a string for a float, a bool for an int, an int tensor for
  a float one);
- ``ValueError``: a wrong value, shape, rank, stride or device (NaN, inf, 0 or a negative scale, a
  tensor of the wrong length, a strided view where the kernel assumes unit strides, ...).

and it must raise before any kernel is launched (launches are trapped) and before any buffer
changes (every tensor argument, outputs and pools included, is snapshot and compared).

Values the host cannot see without a device synchronisation (indices in range, lengths read from
device tensors, monotone offsets) are the debug guard's, not this catalogue's.
"""

from __future__ import annotations

import pytest
import torch
import triton.runtime.interpreter as interpreter
import triton.runtime.jit as jit

from triton_swa import (
    WindowIndices,
    WindowPageTable,
    build_window_indices,
    build_window_page_table,
    max_window_len,
    max_window_pages,
    store_kv,
    swa_decode,
    swa_extend,
    swa_out_cache_loc,
    window_index_count,
)
from triton_swa.runtime.launch import Launcher

pytestmark = pytest.mark.interpreter

NAN, INF = float("nan"), float("inf")
I32, I64 = torch.int32, torch.int64
DROP = object()  # remove the argument


def _strided(x: torch.Tensor) -> torch.Tensor:
    """The same values as a non-contiguous view (every other element of a twice-as-long tensor)."""
    wide = torch.zeros(x.shape[0] * 2, *x.shape[1:], dtype=x.dtype, device=x.device)
    wide[::2] = x
    return wide[::2]


def _meta(x: torch.Tensor) -> torch.Tensor:
    return x.to("meta")


# ---- valid calls (tiny CPU tensors) ----


def decode_args(paged: bool = False) -> dict:
    g = torch.Generator().manual_seed(0)
    a = dict(
        q=torch.randn(2, 4, 16, generator=g), k_buffer=torch.randn(16, 2, 16, generator=g), v_buffer=torch.randn(16, 2, 8, generator=g)
    )
    if paged:
        a.update(
            page_table=torch.tensor([[1, 2], [3, 0]], dtype=I32),
            window_starts=torch.tensor([2, 0], dtype=I32),
            seq_lens=torch.tensor([9, 4], dtype=I64),
            page_size=4,
        )
    else:
        a.update(kv_indptr=torch.tensor([0, 3, 5], dtype=I32), kv_indices=torch.tensor([1, 2, 3, 5, 6], dtype=I32))
    a.update(sinks=torch.zeros(4), out=torch.full((2, 4, 8), NAN))
    return a


def extend_args(paged: bool = False) -> dict:
    g = torch.Generator().manual_seed(1)
    a = dict(
        q=torch.randn(5, 4, 16, generator=g),
        k=torch.randn(5, 2, 16, generator=g),
        v=torch.randn(5, 2, 16, generator=g),
        k_buffer=torch.randn(16, 2, 16, generator=g),
        v_buffer=torch.randn(16, 2, 16, generator=g),
        qo_indptr=torch.tensor([0, 3, 5], dtype=I32),
        prefix_lens=torch.tensor([4, 0], dtype=I32),
        window_left=3,
    )
    if paged:
        a.update(page_table=torch.tensor([[1, 2], [0, 0]], dtype=I32), window_starts=torch.tensor([1, 0], dtype=I32), page_size=4)
    else:
        a.update(kv_indptr=torch.tensor([0, 3, 3], dtype=I32), kv_indices=torch.tensor([1, 2, 3], dtype=I32))
    a.update(sinks=torch.zeros(4), out=torch.full((5, 4, 16), NAN))
    return a


def tree_args() -> dict:
    a = extend_args()
    a.update(
        custom_mask=torch.ones(13, dtype=torch.bool),
        mask_indptr=torch.tensor([0, 9], dtype=I64),
        q_positions=torch.tensor([4, 5, 5, 0, 1], dtype=I32),
    )
    return a


def _req_to_token() -> torch.Tensor:
    rt = torch.zeros(3, 16, dtype=I32)
    rt[1] = torch.arange(1, 17)
    rt[2] = torch.arange(17, 33)
    return rt


def _mapping() -> torch.Tensor:
    m = torch.arange(0, 32 + 4 + 1, dtype=I64) % 20  # size 32 + page 4 + 1 entries, ending in -1
    m[-1] = -1
    return m


def window_args() -> dict:
    return dict(
        req_to_token=_req_to_token(),
        req_pool_indices=torch.tensor([1, 2], dtype=I64),
        seq_lens=torch.tensor([5, 9], dtype=I32),
        window_left=3,
        mapping=_mapping(),
        out=WindowIndices(torch.full((3,), -7, dtype=I32), torch.full((8,), -7, dtype=I32), torch.full((2,), -7, dtype=I32)),
    )


def page_table_args() -> dict:
    return dict(
        req_to_token=_req_to_token(),
        req_pool_indices=torch.tensor([1, 2], dtype=I64),
        seq_lens=torch.tensor([5, 9], dtype=I32),
        window_left=3,
        page_size=4,
        mapping=_mapping(),
        out=WindowPageTable(torch.full((2, 3), -7, dtype=I32), torch.full((2,), -7, dtype=I32)),
    )


def out_loc_args() -> dict:
    return dict(out_cache_loc=torch.tensor([3, 4, 9], dtype=I64), mapping=_mapping(), out=torch.full((4,), -7, dtype=I32))


def store_args() -> dict:
    g = torch.Generator().manual_seed(2)
    return dict(
        k_buffer=torch.full((10, 2, 4), NAN),
        v_buffer=torch.full((10, 2, 3), NAN),
        loc=torch.tensor([1, 5, 7], dtype=I64),
        k=torch.randn(3, 2, 4, generator=g),
        v=torch.randn(3, 2, 3, generator=g),
        mapping=torch.tensor([0, 2, 3, 4, 5, 6, 7, 8, 9, 1, -1]),
        k_scale=1.5,
        v_scale=torch.tensor([0.5]),
    )


OPS = {
    "decode": (swa_decode, lambda: decode_args()),
    "decode_paged": (swa_decode, lambda: decode_args(paged=True)),
    "extend": (swa_extend, lambda: extend_args()),
    "extend_paged": (swa_extend, lambda: extend_args(paged=True)),
    "extend_tree": (swa_extend, tree_args),
    "window_indices": (build_window_indices, window_args),
    "window_page_table": (build_window_page_table, page_table_args),
    "out_cache_loc": (swa_out_cache_loc, out_loc_args),
    "store_kv": (store_kv, store_args),
    "window_index_count": (window_index_count, lambda: dict(seq_lens=torch.tensor([5, 9]), window_left=3)),
    "max_window_len": (max_window_len, lambda: dict(window_left=3, max_context_len=64)),
    "max_window_pages": (max_window_pages, lambda: dict(window_left=3, page_size=4, max_context_len=64)),
}
POSITIONAL = {
    swa_decode: ("q", "k_buffer", "v_buffer"),
    swa_extend: ("q", "k", "v", "k_buffer", "v_buffer", "qo_indptr", "prefix_lens"),
    build_window_indices: ("req_to_token", "req_pool_indices", "seq_lens"),
    build_window_page_table: ("req_to_token", "req_pool_indices", "seq_lens"),
    swa_out_cache_loc: ("out_cache_loc", "mapping"),
    store_kv: ("k_buffer", "v_buffer", "loc", "k", "v"),
}


def _call(fn, args: dict):
    pos = POSITIONAL.get(fn, ())
    return fn(*[args[n] for n in pos], **{k: v for k, v in args.items() if k not in pos})


# ---- the catalogue: (op, id, changes, exception, message) ----


def _set(**changes):
    return lambda a: {**a, **changes}


def _map(name, f):
    return lambda a: {**a, name: f(a[name])}


def _scalar_cases(op: str, names=("sm_scale", "logit_cap", "k_scale", "v_scale")) -> list:
    cases = []
    if "sm_scale" in names:
        cases += [
            (op, "sm_scale-str", _set(sm_scale="0.1"), TypeError, "sm_scale must be a float"),
            (op, "sm_scale-bool", _set(sm_scale=True), TypeError, "sm_scale must be a float"),
            (op, "sm_scale-zero", _set(sm_scale=0.0), ValueError, "sm_scale must be finite and > 0"),
            (op, "sm_scale-negative", _set(sm_scale=-0.5), ValueError, "sm_scale must be finite and > 0"),
            (op, "sm_scale-nan", _set(sm_scale=NAN), ValueError, "sm_scale must be finite and > 0"),
            (op, "sm_scale-inf", _set(sm_scale=INF), ValueError, "sm_scale must be finite and > 0"),
        ]
    if "logit_cap" in names:
        cases += [
            (op, "logit_cap-str", _set(logit_cap="30"), TypeError, "logit_cap must be a float"),
            (op, "logit_cap-negative", _set(logit_cap=-1.0), ValueError, "logit_cap must be finite and >= 0"),
            (op, "logit_cap-nan", _set(logit_cap=NAN), ValueError, "logit_cap must be finite and >= 0"),
            (op, "logit_cap-inf", _set(logit_cap=INF), ValueError, "logit_cap must be finite and >= 0"),
        ]
    for name in ("k_scale", "v_scale"):
        if name in names:
            cases += [
                (op, f"{name}-str", _set(**{name: "1.0"}), TypeError, f"{name} must be a float"),
                (op, f"{name}-bool", _set(**{name: True}), TypeError, f"{name} must be a float"),
                (op, f"{name}-zero", _set(**{name: 0.0}), ValueError, f"{name} must be finite and > 0"),
                (op, f"{name}-negative", _set(**{name: -2.0}), ValueError, f"{name} must be finite and > 0"),
                (op, f"{name}-nan", _set(**{name: NAN}), ValueError, f"{name} must be finite and > 0"),
                (op, f"{name}-inf", _set(**{name: INF}), ValueError, f"{name} must be finite and > 0"),
                (
                    op,
                    f"{name}-int-tensor",
                    _set(**{name: torch.ones(1, dtype=I32)}),
                    TypeError,
                    f"{name} must be a float or a one-element float tensor",
                ),
                (op, f"{name}-two-elements", _set(**{name: torch.ones(2)}), ValueError, f"{name} must hold one value"),
                (op, f"{name}-device", _set(**{name: torch.ones(1, device="meta")}), ValueError, f"{name} must be on device"),
            ]
    return cases


def _decode_cases() -> list:
    d = "decode"
    p = "decode_paged"
    return (
        [
            (d, "q-list", _map("q", lambda x: x.tolist()), TypeError, "q must be a torch.Tensor"),
            (d, "q-int-dtype", _map("q", lambda x: x.long()), TypeError, "q must have dtype"),
            (d, "q-rank2", _map("q", lambda x: x[0]), ValueError, "q must have 3 dimensions"),
            (
                d,
                "q-last-stride",
                _map("q", lambda x: torch.randn(2, 4, 32)[..., ::2]),
                ValueError,
                "q must have a contiguous last dimension",
            ),
            (d, "head-ratio", _map("q", lambda x: torch.randn(2, 3, 16)), ValueError, "multiple of KV heads"),
            (d, "head-dim-mismatch", _map("k_buffer", lambda x: torch.randn(16, 2, 8)), ValueError, "k_buffer head dim"),
            (
                d,
                "head-dim-too-wide",
                lambda a: {**a, "q": torch.randn(2, 4, 520), "k_buffer": torch.randn(16, 2, 520)},
                ValueError,
                "head dim D must be between 1 and 512",
            ),
            (d, "k_buffer-dtype", _map("k_buffer", lambda x: x.double()), TypeError, "k_buffer must have q's dtype"),
            (d, "k_buffer-rank2", _map("k_buffer", lambda x: x[:, 0]), ValueError, "k_buffer must have 3 dimensions"),
            (d, "k_buffer-device", _map("k_buffer", _meta), ValueError, "k_buffer must be on device"),
            (
                d,
                "k_buffer-last-stride",
                _map("k_buffer", lambda x: torch.randn(16, 2, 32)[..., ::2]),
                ValueError,
                "k_buffer must have a contiguous last dimension",
            ),
            (d, "v_buffer-dtype", _map("v_buffer", lambda x: x.double()), TypeError, "v_buffer must have k_buffer's dtype"),
            (d, "v_buffer-slots", _map("v_buffer", lambda x: x[:15]), ValueError, "v_buffer must have k_buffer's"),
            (d, "v_buffer-device", _map("v_buffer", _meta), ValueError, "v_buffer must be on device"),
            (d, "kv_indptr-float", _map("kv_indptr", lambda x: x.float()), TypeError, "kv_indptr must have dtype"),
            (d, "kv_indptr-shape", _map("kv_indptr", lambda x: x[:2]), ValueError, "kv_indptr must have shape"),
            (d, "kv_indptr-strided", _map("kv_indptr", _strided), ValueError, "kv_indptr must be contiguous"),
            (d, "kv_indptr-device", _map("kv_indptr", _meta), ValueError, "kv_indptr must be on device"),
            (d, "kv_indices-float", _map("kv_indices", lambda x: x.float()), TypeError, "kv_indices must have dtype"),
            (d, "kv_indices-rank2", _map("kv_indices", lambda x: x[None]), ValueError, "kv_indices must have 1 dim"),
            (d, "kv_indices-strided", _map("kv_indices", _strided), ValueError, "kv_indices must be contiguous"),
            (d, "kv_indices-device", _map("kv_indices", _meta), ValueError, "kv_indices must be on device"),
            (d, "kv_indices-missing", _set(kv_indices=DROP), ValueError, "needs both kv_indptr and kv_indices"),
            (d, "page_size-with-csr", _set(page_size=16), ValueError, "page_size must be 1 with CSR"),
            (d, "page_size-float", _set(page_size=1.0), TypeError, "page_size must be an int"),
            (d, "sinks-shape", _map("sinks", lambda x: x[:3]), ValueError, "sinks must have shape"),
            (d, "sinks-int", _map("sinks", lambda x: x.int()), TypeError, "sinks must have dtype"),
            (d, "sinks-strided", _map("sinks", _strided), ValueError, "sinks must be contiguous"),
            (d, "sinks-device", _map("sinks", _meta), ValueError, "sinks must be on device"),
            (d, "out-dtype", _map("out", lambda x: x.double()), TypeError, "out must have dtype"),
            (d, "out-shape", _map("out", lambda x: x[:1]), ValueError, "out must have shape"),
            (d, "out-device", _map("out", _meta), ValueError, "out must be on device"),
            (
                d,
                "out-last-stride",
                _set(out=torch.full((2, 4, 16), NAN)[..., ::2]),
                ValueError,
                "out must have a contiguous last dimension",
            ),
            (d, "max_window-negative", _set(max_window=-1), ValueError, "max_window must be >= 0"),
            (d, "max_window-float", _set(max_window=8.0), TypeError, "max_window must be an int"),
            (d, "num_splits-zero", _set(num_splits=0), ValueError, "num_splits must be >= 1"),
            (d, "num_splits-65", _set(num_splits=65), ValueError, "num_splits must be at most 64"),
            (d, "block_n-not-pow2", _set(block_n=24), ValueError, "block_n must be a power of two"),
            (p, "page_table-float", _map("page_table", lambda x: x.float()), TypeError, "page_table must have dtype"),
            (p, "page_table-rows", _map("page_table", lambda x: torch.zeros(3, 2, dtype=I32)), ValueError, "page_table must have 2 rows"),
            (p, "page_table-rank1", _map("page_table", lambda x: x[0]), ValueError, "page_table must have 2 dim"),
            (
                p,
                "page_table-col-stride",
                _map("page_table", lambda x: torch.zeros(2, 4, dtype=I32)[:, ::2]),
                ValueError,
                "page_table must have a contiguous last dimension",
            ),
            (p, "page_table-device", _map("page_table", _meta), ValueError, "page_table must be on device"),
            (p, "page_table-missing", _set(page_table=DROP), ValueError, "needs page_table"),
            (p, "window_starts-shape", _map("window_starts", lambda x: x[:1]), ValueError, "window_starts must have shape"),
            (p, "window_starts-strided", _map("window_starts", _strided), ValueError, "window_starts must be contiguous"),
            (p, "seq_lens-float", _map("seq_lens", lambda x: x.float()), TypeError, "seq_lens must have dtype"),
            (p, "seq_lens-strided", _map("seq_lens", _strided), ValueError, "seq_lens must be contiguous"),
            (p, "seq_lens-device", _map("seq_lens", _meta), ValueError, "seq_lens must be on device"),
            (p, "page_size-zero", _set(page_size=0), ValueError, "page_size must be >= 1"),
            (p, "page_size-not-dividing-pool", _set(page_size=5), ValueError, "not a whole number of pages"),
            (p, "both-forms", _set(kv_indptr=torch.zeros(3, dtype=I32), kv_indices=torch.zeros(1, dtype=I32)), ValueError, "not both"),
        ]
        + _scalar_cases(d)
        + [(p, "k_scale-nan", _set(k_scale=NAN), ValueError, "k_scale must be finite and > 0")]
    )


def _extend_cases() -> list:
    e, p, t = "extend", "extend_paged", "extend_tree"
    return (
        [
            (e, "q-list", _map("q", lambda x: x.tolist()), TypeError, "q must be a torch.Tensor"),
            (e, "q-int-dtype", _map("q", lambda x: x.int()), TypeError, "q must have dtype"),
            (e, "q-rank2", _map("q", lambda x: x[:, 0]), ValueError, "q must have 3 dimensions"),
            (e, "q-last-stride", _map("q", lambda x: torch.randn(5, 4, 32)[..., ::2]), ValueError, "q must be contiguous along its last"),
            (e, "k-dtype", _map("k", lambda x: x.double()), TypeError, "k must have dtype"),
            (e, "k-shape", _map("k", lambda x: x[:4]), ValueError, "k must have shape"),
            (e, "k-device", _map("k", _meta), ValueError, "k must be on device"),
            (e, "k-last-stride", _map("k", lambda x: torch.randn(5, 2, 32)[..., ::2]), ValueError, "k must be contiguous along its last"),
            (
                e,
                "head-ratio",
                lambda a: {
                    **a,
                    "k": torch.randn(5, 3, 16),
                    "v": torch.randn(5, 3, 16),
                    "k_buffer": torch.randn(16, 3, 16),
                    "v_buffer": torch.randn(16, 3, 16),
                },
                ValueError,
                "multiple of KV heads",
            ),
            (
                e,
                "head-dim-too-wide",
                lambda a: {**a, "q": torch.randn(5, 4, 520), "k": torch.randn(5, 2, 520)},
                ValueError,
                "head_dim must be in",
            ),
            (e, "v-heads", _map("v", lambda x: x[:, :1]), ValueError, "v must have shape"),
            (e, "v-dtype", _map("v", lambda x: x.half()), TypeError, "v must have dtype"),
            (e, "k_buffer-dtype", _map("k_buffer", lambda x: x.double()), TypeError, "k_buffer must have dtype"),
            (e, "k_buffer-rank2", _map("k_buffer", lambda x: x[:, 0]), ValueError, "k_buffer must have shape"),
            (e, "k_buffer-head-dim", _map("k_buffer", lambda x: x[..., :8].contiguous()), ValueError, "k_buffer must have shape"),
            (e, "k_buffer-device", _map("k_buffer", _meta), ValueError, "k_buffer must be on device"),
            (e, "v_buffer-slots", _map("v_buffer", lambda x: x[1:]), ValueError, "v_buffer must have shape"),
            (e, "v_buffer-dtype", _map("v_buffer", lambda x: x.half()), TypeError, "v_buffer must have dtype"),
            (e, "qo_indptr-float", _map("qo_indptr", lambda x: x.float()), TypeError, "qo_indptr must have dtype"),
            (e, "qo_indptr-shape", _map("qo_indptr", lambda x: x[:2]), ValueError, "qo_indptr must have shape"),
            (e, "qo_indptr-strided", _map("qo_indptr", _strided), ValueError, "qo_indptr must be contiguous"),
            (e, "qo_indptr-device", _map("qo_indptr", _meta), ValueError, "qo_indptr must be on device"),
            (e, "prefix_lens-float", _map("prefix_lens", lambda x: x.float()), TypeError, "prefix_lens must have dtype"),
            (e, "prefix_lens-rank2", _map("prefix_lens", lambda x: x[None]), ValueError, "prefix_lens must have 1 dim"),
            (e, "prefix_lens-strided", _map("prefix_lens", _strided), ValueError, "prefix_lens must be contiguous"),
            (e, "kv_indptr-shape", _map("kv_indptr", lambda x: x[:2]), ValueError, "kv_indptr must have shape"),
            (e, "kv_indptr-strided", _map("kv_indptr", _strided), ValueError, "kv_indptr must be contiguous"),
            (e, "kv_indptr-float", _map("kv_indptr", lambda x: x.float()), TypeError, "kv_indptr must have dtype"),
            (e, "kv_indices-strided", _map("kv_indices", _strided), ValueError, "kv_indices must be contiguous"),
            (e, "kv_indices-device", _map("kv_indices", _meta), ValueError, "kv_indices must be on device"),
            (e, "kv_indices-missing", _set(kv_indices=DROP), ValueError, "cached window is missing"),
            (e, "page_size-with-csr", _set(page_size=4), ValueError, "page_size must be 1 with CSR"),
            (e, "window_left-below-minus-one", _set(window_left=-2), ValueError, "window_left must be >= -1"),
            (e, "window_left-float", _set(window_left=3.0), TypeError, "window_left must be an int"),
            (e, "window_left-str", _set(window_left="3"), TypeError, "window_left must be an int"),
            (e, "causal-int", _set(causal=1), TypeError, "causal must be a bool"),
            (e, "sinks-shape", _map("sinks", lambda x: x[:3]), ValueError, "sinks must have shape"),
            (e, "sinks-int", _map("sinks", lambda x: x.int()), TypeError, "sinks must have dtype"),
            (e, "sinks-strided", _map("sinks", _strided), ValueError, "sinks must be contiguous"),
            (e, "out-dtype", _map("out", lambda x: x.double()), TypeError, "out must have dtype"),
            (e, "out-shape", _map("out", lambda x: x[:4]), ValueError, "out must have shape"),
            (e, "out-device", _map("out", _meta), ValueError, "out must be on device"),
            (e, "out-last-stride", _set(out=torch.full((5, 4, 32), NAN)[..., ::2]), ValueError, "out must be contiguous along its last"),
            (e, "max_extend_len-negative", _set(max_extend_len=-1), ValueError, "max_extend_len must be >= 0"),
            (e, "max_extend_len-float", _set(max_extend_len=3.0), TypeError, "max_extend_len must be an int"),
            (e, "max_window-negative", _set(max_window=-1), ValueError, "max_window must be >= 0"),
            (e, "num_splits-zero", _set(num_splits=0), ValueError, "num_splits must be >= 1"),
            (e, "num_splits-65", _set(num_splits=65), ValueError, "num_splits must be at most 64"),
            (e, "block_m-not-pow2", _set(block_m=24), ValueError, "block_m must be a power of two"),
            (e, "pack-not-dividing", _set(pack=3), ValueError, "pack"),
            (
                e,
                "mask_indptr-without-mask",
                _set(mask_indptr=torch.zeros(2, dtype=I64)),
                ValueError,
                "mask_indptr given without custom_mask",
            ),
            (p, "page_table-rows", _map("page_table", lambda x: x[:1]), ValueError, "page_table must have 2 rows"),
            (p, "page_table-float", _map("page_table", lambda x: x.float()), TypeError, "page_table must have dtype"),
            (
                p,
                "page_table-col-stride",
                _map("page_table", lambda x: torch.zeros(2, 4, dtype=I32)[:, ::2]),
                ValueError,
                "page_table rows must be contiguous",
            ),
            (p, "page_table-device", _map("page_table", _meta), ValueError, "page_table must be on device"),
            (p, "page_table-missing", _set(page_table=DROP), ValueError, "needs both page_table and window_starts"),
            (p, "window_starts-strided", _map("window_starts", _strided), ValueError, "window_starts must be contiguous"),
            (p, "window_starts-shape", _map("window_starts", lambda x: x[:1]), ValueError, "window_starts must have shape"),
            (p, "page_size-zero", _set(page_size=0), ValueError, "page_size must be >= 1"),
            (p, "page_size-not-dividing-pool", _set(page_size=5), ValueError, "not a whole number of pages"),
            (p, "both-forms", _set(kv_indptr=torch.zeros(3, dtype=I32)), ValueError, "not both"),
            (t, "custom_mask-float", _map("custom_mask", lambda x: x.float()), TypeError, "custom_mask must have dtype"),
            (t, "custom_mask-strided", _map("custom_mask", _strided), ValueError, "custom_mask must be contiguous"),
            (t, "custom_mask-device", _map("custom_mask", _meta), ValueError, "custom_mask must be on device"),
            (t, "custom_mask-without-indptr", _set(mask_indptr=DROP), ValueError, "needs mask_indptr"),
            (t, "mask_indptr-strided", _map("mask_indptr", _strided), ValueError, "mask_indptr must be contiguous"),
            (t, "mask_indptr-short", _map("mask_indptr", lambda x: x[:1]), ValueError, "mask_indptr must have at least"),
            (t, "mask_indptr-float", _map("mask_indptr", lambda x: x.float()), TypeError, "mask_indptr must have dtype"),
            (t, "q_positions-strided", _map("q_positions", _strided), ValueError, "q_positions must be contiguous"),
            (t, "q_positions-shape", _map("q_positions", lambda x: x[:3]), ValueError, "q_positions must have shape"),
            (t, "q_positions-float", _map("q_positions", lambda x: x.float()), TypeError, "q_positions must have dtype"),
        ]
        + _scalar_cases(e)
        + [(p, "v_scale-zero", _set(v_scale=0.0), ValueError, "v_scale must be finite and > 0")]
    )


def _window_cases() -> list:
    w, t = "window_indices", "window_page_table"
    cases = []
    for op in (w, t):
        cases += [
            (op, "req_to_token-int64", _map("req_to_token", lambda x: x.long()), TypeError, "req_to_token must have dtype"),
            (op, "req_to_token-rank1", _map("req_to_token", lambda x: x[0]), ValueError, "req_to_token must have 2 dim"),
            (op, "req_pool_indices-float", _map("req_pool_indices", lambda x: x.float()), TypeError, "req_pool_indices must have dtype"),
            (op, "req_pool_indices-rank2", _map("req_pool_indices", lambda x: x[None]), ValueError, "req_pool_indices must have 1 dim"),
            (op, "req_pool_indices-strided", _map("req_pool_indices", _strided), ValueError, "req_pool_indices must be contiguous"),
            (op, "req_pool_indices-device", _map("req_pool_indices", _meta), ValueError, "req_pool_indices must be on device"),
            (op, "seq_lens-shape", _map("seq_lens", lambda x: x[:1]), ValueError, "seq_lens must have shape"),
            (op, "seq_lens-float", _map("seq_lens", lambda x: x.float()), TypeError, "seq_lens must have dtype"),
            (op, "seq_lens-strided", _map("seq_lens", _strided), ValueError, "seq_lens must be contiguous"),
            (op, "prefix_lens-shape", _set(prefix_lens=torch.zeros(3, dtype=I32)), ValueError, "prefix_lens must have shape"),
            (
                op,
                "prefix_lens-strided",
                _set(prefix_lens=_strided(torch.zeros(2, dtype=I32))),
                ValueError,
                "prefix_lens must be contiguous",
            ),
            (op, "window_left-below-minus-one", _set(window_left=-2), ValueError, "window_left must be >= -1"),
            (op, "window_left-float", _set(window_left=3.0), TypeError, "window_left must be an int"),
            (op, "mapping-float", _map("mapping", lambda x: x.float()), TypeError, "mapping must have dtype"),
            (op, "mapping-strided", _map("mapping", _strided), ValueError, "mapping must be contiguous"),
            (op, "mapping-device", _map("mapping", _meta), ValueError, "mapping must be on device"),
            (op, "page_size-disagrees-with-mapping", _set(page_size=8), ValueError, "page_size=8 disagrees"),
            (op, "num_splits-zero", _set(num_splits=0), ValueError, "num_splits must be >= 1"),
            (op, "block-not-pow2", _set(block=6), ValueError, "block must be a power of two"),
        ]
    cases += [
        (w, "page_size-zero", _set(page_size=0), ValueError, "page_size must be >= 1"),
        (w, "num_indices-negative", _set(out=DROP, num_indices=-1), ValueError, "num_indices must be >= 0"),
        (w, "num_indices-float", _set(out=DROP, num_indices=4.0), TypeError, "num_indices must be an int"),
        (w, "num_indices-and-out", _set(num_indices=8), ValueError, "give num_indices or out, not both"),
        (w, "out-tuple", _map("out", tuple), TypeError, "out must be a WindowIndices"),
        (
            w,
            "out.kv_indptr-int64",
            _map("out", lambda o: o._replace(kv_indptr=o.kv_indptr.long())),
            TypeError,
            "out.kv_indptr must have dtype",
        ),
        (
            w,
            "out.kv_indptr-shape",
            _map("out", lambda o: o._replace(kv_indptr=o.kv_indptr[:2])),
            ValueError,
            "out.kv_indptr must have shape",
        ),
        (
            w,
            "out.kv_indices-strided",
            _map("out", lambda o: o._replace(kv_indices=_strided(o.kv_indices))),
            ValueError,
            "out.kv_indices must be contiguous",
        ),
        (
            w,
            "out.window_starts-device",
            _map("out", lambda o: o._replace(window_starts=_meta(o.window_starts))),
            ValueError,
            "out.window_starts must be on device",
        ),
        (w, "block_reqs-not-pow2", _set(block_reqs=3), ValueError, "block_reqs must be a power of two"),
        (t, "page_size-zero", _set(page_size=0), ValueError, "page_size must be >= 1"),
        (t, "page_size-float", _set(page_size=4.0), TypeError, "page_size must be an int"),
        (t, "max_pages-negative", _set(out=DROP, max_pages=-1), ValueError, "max_pages must be >= 0"),
        (t, "max_pages-and-out", _set(max_pages=3), ValueError, "give max_pages or out, not both"),
        (t, "out-tuple", _map("out", tuple), TypeError, "out must be a WindowPageTable"),
        (
            t,
            "out.page_table-rows",
            _map("out", lambda o: o._replace(page_table=o.page_table[:1])),
            ValueError,
            "out.page_table must have shape",
        ),
        (
            t,
            "out.page_table-col-stride",
            _map("out", lambda o: o._replace(page_table=torch.zeros(2, 6, dtype=I32)[:, ::2])),
            ValueError,
            "out.page_table rows must be contiguous",
        ),
        (
            t,
            "out.page_table-int64",
            _map("out", lambda o: o._replace(page_table=o.page_table.long())),
            TypeError,
            "out.page_table must have dtype",
        ),
        (
            t,
            "out.window_starts-strided",
            _map("out", lambda o: o._replace(window_starts=_strided(o.window_starts))),
            ValueError,
            "out.window_starts must be contiguous",
        ),
    ]
    return cases


def _out_loc_cases() -> list:
    o = "out_cache_loc"
    return [
        (o, "out_cache_loc-float", _map("out_cache_loc", lambda x: x.float()), TypeError, "out_cache_loc must have dtype"),
        (o, "out_cache_loc-rank2", _map("out_cache_loc", lambda x: x[None]), ValueError, "out_cache_loc must have 1 dim"),
        (o, "mapping-float", _map("mapping", lambda x: x.float()), TypeError, "mapping must have dtype"),
        (o, "mapping-strided", _map("mapping", _strided), ValueError, "mapping must be contiguous"),
        (o, "mapping-device", _map("mapping", _meta), ValueError, "mapping must be on device"),
        (o, "out-int64", _map("out", lambda x: x.long()), TypeError, "out must have dtype"),
        (o, "out-short", _map("out", lambda x: x[:2]), ValueError, "out holds 2 entries, fewer than the 3"),
        (o, "out-strided", _map("out", _strided), ValueError, "out must be contiguous"),
        (o, "out-device", _map("out", _meta), ValueError, "out must be on device"),
        (o, "block-not-pow2", _set(block=3), ValueError, "block must be a power of two"),
        (o, "block-float", _set(block=4.0), TypeError, "block must be an int"),
    ]


def _store_cases() -> list:
    s = "store_kv"
    return [
        (s, "k_buffer-int", _map("k_buffer", lambda x: torch.zeros(10, 2, 4, dtype=I32)), TypeError, "k_buffer must have dtype"),
        (s, "k_buffer-rank2", _map("k_buffer", lambda x: x[:, 0]), ValueError, "k_buffer must have 3 dim"),
        (s, "v_buffer-device", _map("v_buffer", _meta), ValueError, "v_buffer must be on device"),
        (s, "v_buffer-int", _map("v_buffer", lambda x: torch.zeros(10, 2, 3, dtype=I64)), TypeError, "v_buffer must have dtype"),
        (s, "loc-float", _map("loc", lambda x: x.float()), TypeError, "loc must have dtype"),
        (s, "loc-rank2", _map("loc", lambda x: x[None]), ValueError, "loc must have 1 dim"),
        (s, "loc-device", _map("loc", _meta), ValueError, "loc must be on device"),
        (s, "k-shape", _map("k", lambda x: x[:, :, :3]), ValueError, "k must have shape"),
        (s, "k-heads", _map("k", lambda x: torch.randn(3, 1, 4)), ValueError, "k must have shape"),
        (s, "k-tokens", _map("k", lambda x: x[:2]), ValueError, "k must have shape"),
        (s, "k-int", _map("k", lambda x: x.int()), TypeError, "k must be floating"),
        (s, "v-device", _map("v", _meta), ValueError, "v must be on device"),
        (s, "mapping-float", _map("mapping", lambda x: x.float()), TypeError, "mapping must have dtype"),
        (s, "mapping-strided", _map("mapping", _strided), ValueError, "mapping must be contiguous"),
        (s, "mapping-device", _map("mapping", _meta), ValueError, "mapping must be on device"),
    ] + _scalar_cases(s, names=("k_scale", "v_scale"))


def _host_cases() -> list:
    c, l, p = "window_index_count", "max_window_len", "max_window_pages"
    return [
        (c, "seq_lens-str", _set(seq_lens="5,9"), TypeError, "seq_lens must be an int32/int64 tensor or a list"),
        (c, "seq_lens-float-list", _set(seq_lens=[5.0, 9.0]), TypeError, "seq_lens must be an int32/int64"),
        (c, "seq_lens-float-tensor", _map("seq_lens", lambda x: x.float()), TypeError, "seq_lens must be an int32"),
        (c, "seq_lens-rank2", _map("seq_lens", lambda x: x[None]), ValueError, "seq_lens must be 1-D"),
        (c, "seq_lens-negative", _set(seq_lens=[5, -1]), ValueError, "seq_lens must be >= 0"),
        (c, "prefix_lens-negative", _set(prefix_lens=torch.tensor([-3, 2])), ValueError, "prefix_lens must be >= 0"),
        (c, "prefix_lens-length", _set(prefix_lens=[1, 2, 3]), ValueError, "prefix_lens must have one entry per"),
        (c, "window_left-below-minus-one", _set(window_left=-2), ValueError, "window_left must be >= -1"),
        (c, "window_left-float", _set(window_left=3.5), TypeError, "window_left must be an int"),
        (l, "window_left-below-minus-one", _set(window_left=-5), ValueError, "window_left must be >= -1"),
        (l, "window_left-str", _set(window_left="3"), TypeError, "window_left must be an int"),
        (l, "max_context_len-negative", _set(max_context_len=-1), ValueError, "max_context_len must be >= 0"),
        (l, "max_context_len-float", _set(max_context_len=64.0), TypeError, "max_context_len must be an int"),
        (p, "page_size-zero", _set(page_size=0), ValueError, "page_size must be >= 1"),
        (p, "page_size-bool", _set(page_size=True), TypeError, "page_size must be an int"),
        (p, "window_left-below-minus-one", _set(window_left=-2), ValueError, "window_left must be >= -1"),
        (p, "max_context_len-negative", _set(max_context_len=-4), ValueError, "max_context_len must be >= 0"),
    ]


def _debug_cases() -> list:
    """Device contents, in debug mode (``debug=True``): named before any launch (issue 25, items 1 and 5)."""
    e, ep, w, pt = "extend", "extend_paged", "window_indices", "window_page_table"
    qo_past = _set(qo_indptr=torch.tensor([0, 3, 9], dtype=I32), debug=True)
    return [
        (e, "debug-qo_indptr-past-q", qo_past, ValueError, r"qo_indptr\[2\] = 9 runs past the 5 entries of q"),
        (ep, "debug-qo_indptr-past-q", qo_past, ValueError, r"qo_indptr\[2\] = 9 runs past the 5 entries of q"),
        (
            e,
            "debug-qo_indptr-decreasing",
            _set(qo_indptr=torch.tensor([0, 4, 3], dtype=I32), debug=True),
            ValueError,
            "qo_indptr decreases from 4 to 3",
        ),
        (
            "decode",
            "debug-kv_indptr-past-kv_indices",
            _set(kv_indptr=torch.tensor([0, 3, 9], dtype=I32), debug=True),
            ValueError,
            r"kv_indptr\[2\] = 9 runs past the 5 entries of kv_indices",
        ),
        (
            pt,
            "debug-max_pages-too-small",
            _set(out=DROP, max_pages=1, debug=True),
            ValueError,
            r"window \[1, 5\) spans 2 pages of page_size 4, more than max_pages=1: the pages past it would be dropped",
        ),
        (
            pt,
            "debug-out-page_table-too-narrow",
            _set(out=WindowPageTable(torch.full((2, 1), -7, dtype=I32), torch.full((2,), -7, dtype=I32)), debug=True),
            ValueError,
            r"more than out.page_table's width \(1 columns\)",
        ),
        (
            w,
            "debug-num_indices-from-other-lengths",
            _set(out=DROP, num_indices=5, debug=True),
            ValueError,
            r"num_indices=5, but the windows hold 8 indices \(window_index_count of the device seq_lens\)",
        ),
        (
            w,
            "debug-req_pool_indices-past-req_to_token",
            _set(req_pool_indices=torch.tensor([1, 3], dtype=I64), debug=True),
            ValueError,
            r"req_pool_indices\[1\] = 3 is not a row of req_to_token \[0, 3\)",
        ),
    ]


CATALOGUE = _decode_cases() + _extend_cases() + _window_cases() + _out_loc_cases() + _store_cases() + _host_cases() + _debug_cases()


# ---- the runner ----


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _snapshot(args: dict) -> list:
    return [(t, t.clone()) for v in args.values() for t in _tensors(v) if t.device.type != "meta"]


def _unchanged(before: torch.Tensor, now: torch.Tensor) -> bool:
    if before.dtype == torch.float8_e4m3fn:
        before, now = before.view(torch.uint8), now.view(torch.uint8)
    if before.dtype.is_floating_point:
        return torch.equal(before.isnan(), now.isnan()) and torch.equal(before.nan_to_num(0), now.nan_to_num(0))
    return torch.equal(before, now)


class _NoLaunch:
    """Trap every kernel launch (interpreter, JIT and decode/extend's direct launcher)."""

    def __init__(self, monkeypatch):
        self.launches = []

        def trap(*args, **kwargs):
            self.launches.append(args[:1])
            raise AssertionError("a kernel was launched before the bad input was rejected")

        monkeypatch.setattr(interpreter.InterpretedFunction, "run", trap)
        monkeypatch.setattr(jit.JITFunction, "run", trap)
        monkeypatch.setattr(Launcher, "__call__", trap)


def _to_device(args: dict, device) -> dict:
    def move(v):
        if isinstance(v, torch.Tensor):
            if v.device.type == "meta" or v.device == torch.device(device):
                return v
            # keep the strides: a strided view must reach the op as a strided view on the device too
            base = v._base if v._base is not None else v
            moved = base.to(device)
            return moved.as_strided(v.shape, v.stride(), v.storage_offset() - base.storage_offset())
        if isinstance(v, tuple) and hasattr(v, "_replace"):
            return type(v)(*[move(x) for x in v])
        return v

    return {k: move(v) for k, v in args.items()}


@pytest.mark.parametrize(
    "op, change, exc, match", [pytest.param(op, change, exc, match, id=f"{op}-{name}") for op, name, change, exc, match in CATALOGUE]
)
def test_bad_input(op, change, exc, match, device, monkeypatch):
    fn, make = OPS[op]
    args = _to_device({k: v for k, v in change(make()).items() if v is not DROP}, device)
    before = _snapshot(args)
    _NoLaunch(monkeypatch)
    with pytest.raises(exc, match=match):
        _call(fn, args)
    for t, copy in before:
        assert _unchanged(copy, t), "a buffer changed before the error"


@pytest.mark.parametrize("op", sorted(OPS))
def test_valid_calls_pass(op, device):
    """The unmutated calls of the catalogue are valid (so each case fails for its own mistake)."""
    fn, make = OPS[op]
    _call(fn, _to_device(make(), device))


def test_decode_scalars_checked_after_a_cached_plan(device):
    """Decode caches checked plans by the types of its scalars: the values are still checked on every
    call, after a good call of the same signature."""
    args = _to_device(decode_args(), device)
    _call(swa_decode, args)
    for _op, _name, change, exc, match in _scalar_cases("decode"):
        bad = change(args)
        if isinstance(bad.get("k_scale"), torch.Tensor) or isinstance(bad.get("v_scale"), torch.Tensor):
            continue  # tensors change the signature
        with pytest.raises(exc, match=match):
            _call(swa_decode, bad)


def test_catalogue_size():
    """Every op is covered, and the catalogue does not shrink silently."""
    ops = {c[0] for c in CATALOGUE}
    assert ops == set(OPS), set(OPS) - ops
    assert len(CATALOGUE) >= 250, len(CATALOGUE)
    ids = [f"{c[0]}-{c[1]}" for c in CATALOGUE]
    assert len(ids) == len(set(ids))
