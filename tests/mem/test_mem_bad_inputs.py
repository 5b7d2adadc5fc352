"""Bad-input catalogue of the memory model: every constructor and public method of the pools and
allocators, and ``evict_swa_window``.

Each case is one mistake a caller can make; it must raise the right exception type (``TypeError``
for a wrong type or dtype, bools passed as ints included; ``ValueError`` for a wrong value, shape,
device or range, double frees included) with a message naming the argument, and leave every pool,
free list, ownership mark, the mapping and ``req_to_token`` exactly as they were.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from triton_swa.mem import (
    MHATokenToKVPool,
    PagedTokenToKVPoolAllocator,
    ReqToTokenPool,
    SWAKVPool,
    SWATokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
    evict_swa_window,
)
from triton_swa.runtime import guard

pytestmark = pytest.mark.reference

PS = 4
F16 = torch.float16
T = torch.tensor


def make_state():
    g = torch.Generator().manual_seed(0)
    swa_pool = SWAKVPool(32, 16, PS, F16, [0, 2], [1], head_num=1, head_dim=4)
    swa = SWATokenToKVPoolAllocator(32, 16, PS, F16, "cpu", swa_pool)
    mha = MHATokenToKVPool(16, PS, F16, 2, 4, 2, v_head_dim=3, start_layer=5)
    paged = PagedTokenToKVPoolAllocator(16, PS, F16, "cpu", mha)
    plain_pool = MHATokenToKVPool(8, 1, F16, 1, 4, 1)
    plain = TokenToKVPoolAllocator(8, F16, "cpu", plain_pool)
    rtp = ReqToTokenPool(3, 32)
    (row,) = rtp.alloc(1)
    slots = swa.alloc_extend(T([0]), T([6]), T([-1]), 6)
    rtp.req_to_token[row, :6] = slots.int()
    freed = swa.alloc(PS)
    swa.free(freed)
    paged_slots = paged.alloc(8)
    paged_freed = paged.alloc(PS)
    paged.free(paged_freed)
    plain.alloc(3)
    for pool in (swa_pool.swa_kv_pool, swa_pool.full_kv_pool, mha, plain_pool):
        for buf in pool.k_buffer + pool.v_buffer:
            buf.copy_(torch.randn(buf.shape, generator=g).to(buf.dtype))
    return SimpleNamespace(
        swa_pool=swa_pool,
        swa=swa,
        mha=mha,
        paged=paged,
        plain_pool=plain_pool,
        plain=plain,
        rtp=rtp,
        row=row,
        slots=slots,
        freed=freed,
        paged_slots=paged_slots,
        paged_freed=paged_freed,
    )


def state_of(s):
    """Every tensor and list the mistakes could touch (cloned), plus the registered mapping's identity."""
    out = []
    for pool in (s.swa_pool.swa_kv_pool, s.swa_pool.full_kv_pool, s.mha, s.plain_pool):
        out += [b.clone() for b in pool.k_buffer + pool.v_buffer]
    for a in (s.swa.full_attn_allocator, s.swa.swa_attn_allocator, s.paged, s.plain):
        out += [a.free_pages.clone(), a.slot_owned.clone()]
    out += [
        s.swa.full_to_swa_index_mapping.clone(),
        s.rtp.req_to_token.clone(),
        list(s.rtp.free_slots),
        sorted(s.rtp._in_use),
        id(s.swa_pool.full_to_swa_index_mapping),
    ]
    return out


def assert_same_state(before, after):
    for i, (x, y) in enumerate(zip(before, after)):
        same = torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
        assert same, f"state item {i} changed"


def last_of(s, t):
    return s.rtp.req_to_token[s.row, t].long().reshape(1)


def mha(**kw):
    args = dict(size=16, page_size=PS, dtype=F16, head_num=2, head_dim=4, layer_num=2)
    args.update(kw)
    return lambda s: MHATokenToKVPool(**args)


def swa_pool(**kw):
    args = dict(
        size=32, size_swa=16, page_size=PS, dtype=F16, swa_attention_layer_ids=[0, 2], full_attention_layer_ids=[1], head_num=1, head_dim=4
    )
    args.update(kw)
    return lambda s: SWAKVPool(**args)


def swa_alloc(**kw):
    def build(s):
        args = dict(size=32, size_swa=16, page_size=PS, dtype=F16, device="cpu", kvcache=s.swa_pool)
        args.update(kw)
        if callable(args["kvcache"]):
            args["kvcache"] = args["kvcache"](s)
        return SWATokenToKVPoolAllocator(**args)

    return build


def paged_alloc(**kw):
    def build(s):
        args = dict(size=16, page_size=PS, dtype=F16, device="cpu", kvcache=s.mha)
        args.update(kw)
        if callable(args["kvcache"]):
            args["kvcache"] = args["kvcache"](s)
        return PagedTokenToKVPoolAllocator(**args)

    return build


def case(id, call, error, match):
    return pytest.param(call, error, match, id=id)


CONSTRUCTORS = [
    # ReqToTokenPool(size, max_context_len, device, enable_memory_saver)
    case("rtp-size-str", lambda s: ReqToTokenPool("4", 8), TypeError, "size must be an int"),
    case("rtp-size-bool", lambda s: ReqToTokenPool(True, 8), TypeError, "size must be an int"),
    case("rtp-size-0", lambda s: ReqToTokenPool(0, 8), ValueError, "size must be >= 1"),
    case("rtp-size-neg", lambda s: ReqToTokenPool(-2, 8), ValueError, "size must be >= 1"),
    case("rtp-maxlen-0", lambda s: ReqToTokenPool(4, 0), ValueError, "max_context_len must be >= 1"),
    case("rtp-maxlen-float", lambda s: ReqToTokenPool(4, 8.0), TypeError, "max_context_len must be an int"),
    case("rtp-device-bad", lambda s: ReqToTokenPool(4, 8, "gpu0"), ValueError, "device is not a valid device"),
    case("rtp-device-float", lambda s: ReqToTokenPool(4, 8, 1.5), TypeError, "device must be"),
    case("rtp-memsaver-str", lambda s: ReqToTokenPool(4, 8, "cpu", "yes"), TypeError, "enable_memory_saver"),
    # MHATokenToKVPool(size, page_size, dtype, head_num, head_dim, layer_num, device, v_head_dim, start_layer)
    case("mha-size-0", mha(size=0), ValueError, "size must be >= 1"),
    case("mha-size-neg", mha(size=-4), ValueError, "size must be >= 1"),
    case("mha-size-str", mha(size="16"), TypeError, "size must be an int"),
    case("mha-size-bool", mha(size=True, page_size=1), TypeError, "size must be an int"),
    case("mha-size-not-page-multiple", mha(size=10), ValueError, r"size \(10\) must be a multiple of page_size \(4\)"),
    case("mha-page-0", mha(page_size=0), ValueError, "page_size must be >= 1"),
    case("mha-page-bool", mha(page_size=True), TypeError, "page_size must be an int"),
    case("mha-dtype-int", mha(dtype=torch.int32), TypeError, "dtype must be one of"),
    case("mha-dtype-str", mha(dtype="float16"), TypeError, "dtype must be a torch.dtype"),
    case("mha-heads-0", mha(head_num=0), ValueError, "head_num must be >= 1"),
    case("mha-heads-bool", mha(head_num=True), TypeError, "head_num must be an int"),
    case("mha-head-dim-0", mha(head_dim=0), ValueError, "head_dim must be >= 1"),
    case("mha-head-dim-float", mha(head_dim=4.0), TypeError, "head_dim must be an int"),
    case("mha-layers-0", mha(layer_num=0), ValueError, "layer_num must be >= 1"),
    case("mha-v-head-dim-0", mha(v_head_dim=0), ValueError, "v_head_dim must be >= 1"),
    case("mha-start-layer-neg", mha(start_layer=-1), ValueError, "start_layer must be >= 0"),
    case("mha-start-layer-bool", mha(start_layer=True), TypeError, "start_layer must be an int"),
    case("mha-device-bad", mha(device="gpu0"), ValueError, "device is not a valid device"),
    # SWAKVPool(size, size_swa, page_size, dtype, swa ids, full ids, device, head geometry...)
    case("swapool-size-0", swa_pool(size=0), ValueError, "size must be >= 1"),
    case("swapool-size-bool", swa_pool(size=True), TypeError, "size must be an int"),
    case("swapool-size-swa-0", swa_pool(size_swa=0), ValueError, "size_swa must be >= 1"),
    case("swapool-size-swa-not-page-multiple", swa_pool(size_swa=6), ValueError, r"size_swa \(6\) must be a multiple"),
    case("swapool-size-not-page-multiple", swa_pool(size=30), ValueError, r"size \(30\) must be a multiple"),
    case("swapool-page-0", swa_pool(page_size=0), ValueError, "page_size must be >= 1"),
    case("swapool-swa-ids-empty", swa_pool(swa_attention_layer_ids=[]), ValueError, "swa_attention_layer_ids must name"),
    case("swapool-swa-ids-str", swa_pool(swa_attention_layer_ids="02"), TypeError, "swa_attention_layer_ids must be a list"),
    case("swapool-swa-ids-bool", swa_pool(swa_attention_layer_ids=[True]), TypeError, "swa_attention_layer_ids"),
    case("swapool-swa-ids-float", swa_pool(swa_attention_layer_ids=[0.0]), TypeError, "swa_attention_layer_ids"),
    case("swapool-swa-ids-neg", swa_pool(swa_attention_layer_ids=[-1]), ValueError, "swa_attention_layer_ids must hold"),
    case("swapool-swa-ids-twice", swa_pool(swa_attention_layer_ids=[0, 0]), ValueError, "names a layer twice"),
    case("swapool-full-ids-int", swa_pool(full_attention_layer_ids=1), TypeError, "full_attention_layer_ids must be a list"),
    case("swapool-ids-overlap", swa_pool(full_attention_layer_ids=[2]), ValueError, r"layer ids \[2\] are both"),
    case("swapool-geometry-missing", swa_pool(head_num=None), ValueError, "head geometry missing"),
    case("swapool-swa-head-dim-0", swa_pool(swa_head_dim=0), ValueError, "swa_head_dim must be >= 1"),
    case("swapool-full-heads-bool", swa_pool(full_head_num=True), TypeError, "full_head_num must be an int"),
    case("swapool-v-head-dim-float", swa_pool(v_head_dim=2.0), TypeError, "v_head_dim must be an int"),
    case("swapool-dtype-int8", swa_pool(dtype=torch.int8), TypeError, "dtype must be one of"),
    case("swapool-device-bad", swa_pool(device="tpu"), ValueError, "device is not a valid device"),
    # PagedTokenToKVPoolAllocator(size, page_size, dtype, device, kvcache, need_sort)
    case("paged-size-0", paged_alloc(size=0), ValueError, "size must be >= 1"),
    case("paged-size-bool", paged_alloc(size=True), TypeError, "size must be an int"),
    case("paged-size-not-page-multiple", paged_alloc(size=6), ValueError, r"size \(6\) must be a multiple"),
    case("paged-size-past-pool", paged_alloc(size=32), ValueError, r"size \(32\) exceeds the pool's size \(16"),
    case("paged-page-mismatch", paged_alloc(page_size=2), ValueError, r"page_size \(2\) disagrees with the pool's page_size \(4\)"),
    case("paged-page-0", paged_alloc(page_size=0), ValueError, "page_size must be >= 1"),
    case("paged-dtype-str", paged_alloc(dtype="fp16"), TypeError, "dtype must be a torch.dtype"),
    case("paged-device-other", paged_alloc(device="meta"), ValueError, r"device \(meta\) differs from the pool's device"),
    case("paged-device-bad", paged_alloc(device="gpu0"), ValueError, "device is not a valid device"),
    case("paged-need-sort-int", paged_alloc(need_sort=1), TypeError, "need_sort must be a bool"),
    case("paged-kvcache-none", paged_alloc(kvcache=None), TypeError, "kvcache"),
    case("token-size-0", lambda s: TokenToKVPoolAllocator(0, F16, "cpu", s.plain_pool), ValueError, "size must be >= 1"),
    case(
        "token-page-mismatch",
        lambda s: TokenToKVPoolAllocator(16, F16, "cpu", s.mha),
        ValueError,
        r"page_size \(1\) disagrees with the pool's page_size \(4\)",
    ),
    case(
        "token-size-past-pool",
        lambda s: TokenToKVPoolAllocator(9, F16, "cpu", s.plain_pool),
        ValueError,
        r"size \(9\) exceeds the pool's size \(8",
    ),
    # SWATokenToKVPoolAllocator(size, size_swa, page_size, dtype, device, kvcache, need_sort, req_to_token_pool)
    case("swa-kvcache-mha", swa_alloc(kvcache=lambda s: s.mha), TypeError, "kvcache must be an SWA pool"),
    case("swa-kvcache-none", swa_alloc(kvcache=None), TypeError, "kvcache must be an SWA pool"),
    case("swa-size-swa-past-swa-pool", swa_alloc(size_swa=32), ValueError, r"size_swa \(32\) exceeds the SWA sub-pool's size \(16"),
    case("swa-size-past-full-pool", swa_alloc(size=64), ValueError, r"size \(64\) exceeds the full sub-pool's size \(32"),
    case("swa-page-mismatch", swa_alloc(page_size=2), ValueError, r"page_size \(2\) disagrees with the full sub-pool"),
    case("swa-size-swa-0", swa_alloc(size_swa=0), ValueError, "size_swa must be >= 1"),
    case("swa-size-swa-not-page-multiple", swa_alloc(size_swa=6), ValueError, r"size_swa \(6\) must be a multiple"),
    case("swa-size-bool", swa_alloc(size=True), TypeError, "size must be an int"),
    case("swa-page-bool", swa_alloc(page_size=True), TypeError, "page_size must be an int"),
    case("swa-dtype-none", swa_alloc(dtype=None), TypeError, "dtype must be a torch.dtype"),
    case("swa-device-other", swa_alloc(device="meta"), ValueError, r"device \(meta\) differs"),
    case("swa-need-sort-str", swa_alloc(need_sort="no"), TypeError, "need_sort must be a bool"),
]


def _both(id, call, error, match):
    """A method case for the paged allocator and the SWA allocator alike."""
    return [case(f"paged-{id}", lambda s: call(s.paged, s), error, match), case(f"swa-{id}", lambda s: call(s.swa, s), error, match)]


def _last(a, s):
    return last_of(s, 5) if a is s.swa else s.paged_slots[5:6]


ALLOCATOR_METHODS = [
    *_both("alloc-str", lambda a, s: a.alloc("4"), TypeError, "need_size must be an int"),
    *_both("alloc-bool", lambda a, s: a.alloc(True), TypeError, "need_size must be an int"),
    *_both("alloc-neg", lambda a, s: a.alloc(-4), ValueError, "need_size must be >= 0"),
    *_both("alloc-not-page-multiple", lambda a, s: a.alloc(3), ValueError, r"need_size \(3\) must be a multiple"),
    *_both("extend-prefix-float", lambda a, s: a.alloc_extend(T([6.0]), T([7]), _last(a, s), 1), TypeError, "prefix_lens must have dtype"),
    *_both("extend-prefix-list", lambda a, s: a.alloc_extend([6], T([7]), _last(a, s), 1), TypeError, "prefix_lens must be a torch.Tensor"),
    *_both(
        "extend-prefix-2d",
        lambda a, s: a.alloc_extend(T([[6]]), T([[7]]), _last(a, s), 1),
        ValueError,
        "prefix_lens must have 1 dimensions",
    ),
    *_both(
        "extend-prefix-meta",
        lambda a, s: a.alloc_extend(T([6], device="meta"), T([7]), _last(a, s), 1),
        ValueError,
        "prefix_lens must be on device cpu or on the CPU",
    ),
    *_both(
        "extend-seq-shape",
        lambda a, s: a.alloc_extend(T([6]), T([7, 7]), _last(a, s), 1),
        ValueError,
        r"seq_lens must have shape \[1\] like prefix_lens",
    ),
    *_both("extend-seq-bool", lambda a, s: a.alloc_extend(T([6]), T([True]), _last(a, s), 1), TypeError, "seq_lens must have dtype"),
    *_both("extend-last-float", lambda a, s: a.alloc_extend(T([6]), T([7]), T([1.0]), 1), TypeError, "last_loc must have dtype"),
    *_both("extend-last-shape", lambda a, s: a.alloc_extend(T([6]), T([7]), T([1, 2]), 1), ValueError, r"last_loc must have shape \[1\]"),
    *_both(
        "extend-seq-below-prefix",
        lambda a, s: a.alloc_extend(T([6]), T([5]), _last(a, s)),
        ValueError,
        r"seq_lens must be >= prefix_lens, got seq_lens\[0\] = 5",
    ),
    *_both(
        "extend-prefix-neg",
        lambda a, s: a.alloc_extend(T([-1]), T([2]), T([-1])),
        ValueError,
        r"prefix_lens must be >= 0, got prefix_lens\[0\] = -1",
    ),
    *_both(
        "extend-num-tokens-wrong",
        lambda a, s: a.alloc_extend(T([6]), T([7]), _last(a, s), 2),
        ValueError,
        r"extend_num_tokens \(2\) != sum",
    ),
    *_both(
        "extend-num-tokens-bool",
        lambda a, s: a.alloc_extend(T([6]), T([7]), _last(a, s), True),
        TypeError,
        "extend_num_tokens must be an int",
    ),
    *_both(
        "extend-last-out-of-range",
        lambda a, s: a.alloc_extend(T([6]), T([7]), T([999]), 1),
        ValueError,
        r"last_loc\[0\] = 999 is neither -1 nor a slot",
    ),
    *_both(
        "extend-last-dummy-page",
        lambda a, s: a.alloc_extend(T([6]), T([7]), T([1]), 1),
        ValueError,
        r"last_loc\[0\] = 1 is neither -1 nor a slot",
    ),
    *_both(
        "extend-last-minus-one-mid-page",
        lambda a, s: a.alloc_extend(T([6]), T([7]), T([-1]), 1),
        ValueError,
        r"last_loc\[0\] = -1 is not the slot of token prefix_lens\[0\] - 1 = 5",
    ),
    *_both(
        "extend-last-wrong-offset",
        lambda a, s: a.alloc_extend(T([7]), T([8]), _last(a, s), 1),
        ValueError,
        r"last_loc\[0\] = \d+ is not the slot of token prefix_lens\[0\] - 1 = 6",
    ),
    *_both(
        "extend-last-stale",
        lambda a, s: a.alloc_extend(T([5]), T([6]), _last(a, s) - 1, 1),
        ValueError,
        r"last_loc\[0\] = \d+: slot \d+ after it is already allocated",
    ),
    *_both(
        "extend-same-page-twice",
        lambda a, s: a.alloc_extend(T([6, 6]), T([7, 7]), _last(a, s).repeat(2), 2),
        ValueError,
        "last_loc: two requests continue the same page",
    ),
    *_both("decode-seq-0", lambda a, s: a.alloc_decode(T([0]), T([-1])), ValueError, r"seq_lens must be >= 1 for decode"),
    *_both("decode-seq-float", lambda a, s: a.alloc_decode(T([7.0]), _last(a, s)), TypeError, "seq_lens must have dtype"),
    *_both("decode-seq-2d", lambda a, s: a.alloc_decode(T([[7]]), _last(a, s)), ValueError, "seq_lens must have 1 dimensions"),
    *_both("decode-last-shape", lambda a, s: a.alloc_decode(T([7]), T([1, 2])), ValueError, r"last_loc must have shape \[1\]"),
    *_both("free-list", lambda a, s: a.free([5]), TypeError, "free_index must be a torch.Tensor"),
    *_both("free-float", lambda a, s: a.free(T([5.0])), TypeError, "free_index must have dtype"),
    *_both("free-bool", lambda a, s: a.free(T([True])), TypeError, "free_index must have dtype"),
    *_both("free-meta", lambda a, s: a.free(T([5], device="meta")), ValueError, "free_index must be on device"),
    *_both("free-out-of-range", lambda a, s: a.free(T([1000])), ValueError, "free_index holds slot 1000, outside"),
    *_both("free-negative", lambda a, s: a.free(T([-1])), ValueError, "free_index holds slot -1, outside"),
    *_both("free-dummy-page", lambda a, s: a.free(T([2])), ValueError, "free_index holds slot 2, outside"),
    *_both("free-double", lambda a, s: a.free(s.freed if a is s.swa else s.paged_freed), ValueError, "which is not allocated"),
    *_both(
        "free-live-and-double",
        lambda a, s: a.free(torch.cat([_last(a, s), s.freed if a is s.swa else s.paged_freed])),
        ValueError,
        "which is not allocated",
    ),
    *_both("free-twice-in-one-call", lambda a, s: a.free(_last(a, s).repeat(2)), ValueError, r"slot \d+ twice"),
    case("paged-shuffle-generator-int", lambda s: s.paged.shuffle_free_list(3), TypeError, "generator must be a torch.Generator"),
    case("swa-free-swa-out-of-range", lambda s: s.swa.free_swa(T([1000])), ValueError, "free_index holds slot 1000"),
    case("swa-free-swa-twice", lambda s: s.swa.free_swa(last_of(s, 5).repeat(2)), ValueError, r"slot \d+ twice"),
    case("swa-free-swa-float", lambda s: s.swa.free_swa(T([5.0])), TypeError, "free_index must have dtype"),
    case("plain-free-double", lambda s: s.plain.free(T([1, 1])), ValueError, "free_index holds slot 1 twice"),
    case("plain-free-unallocated", lambda s: s.plain.free(T([7])), ValueError, "slot 7, which is not allocated"),
]


def _debug(monkeypatch):
    # The guard caches TRITON_SWA_DEBUG at import; monkeypatch restores the cached setting afterwards.
    monkeypatch.setattr(guard, "_DEBUG_ENV", True)


POOL_METHODS = [
    case("rtp-alloc-str", lambda s: s.rtp.alloc("1"), TypeError, "need_size must be an int"),
    case("rtp-alloc-bool", lambda s: s.rtp.alloc(True), TypeError, "need_size must be an int"),
    case("rtp-alloc-neg", lambda s: s.rtp.alloc(-1), ValueError, "need_size must be >= 0"),
    case("rtp-free-row-0", lambda s: s.rtp.free(0), ValueError, r"row 0, outside 1..3 \(row 0 is padding\)"),
    case("rtp-free-row-past", lambda s: s.rtp.free(4), ValueError, "row 4, outside 1..3"),
    case("rtp-free-unallocated", lambda s: s.rtp.free(2), ValueError, "row 2, which is not allocated"),
    case("rtp-free-twice-in-one-call", lambda s: s.rtp.free([s.row, s.row]), ValueError, "row 1 twice"),
    case("rtp-free-live-and-unallocated", lambda s: s.rtp.free([s.row, 3]), ValueError, "row 3, which is not allocated"),
    case("rtp-free-float", lambda s: s.rtp.free(1.0), TypeError, "free_index must be an int"),
    case("rtp-free-bool", lambda s: s.rtp.free([True]), TypeError, "free_index must be an int"),
    case("rtp-free-float-tensor", lambda s: s.rtp.free(T([1.0])), TypeError, "free_index must be an int"),
    case("rtp-free-2d-tensor", lambda s: s.rtp.free(T([[1]])), ValueError, "free_index must be a 0-/1-D tensor"),
    case("rtp-write-float", lambda s: s.rtp.write((s.row, slice(0, 2)), T([1.0, 2.0])), TypeError, "values must have dtype"),
    case("rtp-write-list", lambda s: s.rtp.write((s.row, slice(0, 2)), [1, 2]), TypeError, "values must be a torch.Tensor"),
    case("mha-get-key-layer-absent", lambda s: s.mha.get_key_buffer(0), ValueError, r"layer_id 0 is not in this pool \(layers 5..6\)"),
    case("mha-get-value-layer-str", lambda s: s.mha.get_value_buffer("5"), TypeError, "layer_id must be an int"),
    case("mha-get-kv-layer-bool", lambda s: s.mha.get_kv_buffer(True), TypeError, "layer_id must be an int"),
    case(
        "mha-set-layer-absent",
        lambda s: s.mha.set_kv_buffer(9, T([4]), torch.zeros(1, 2, 4), torch.zeros(1, 2, 3)),
        ValueError,
        "layer_id 9",
    ),
    case(
        "mha-set-layer-obj-str",
        lambda s: s.mha.set_kv_buffer(SimpleNamespace(layer_id="5"), T([4]), torch.zeros(1, 2, 4), torch.zeros(1, 2, 3)),
        TypeError,
        "layer.layer_id must be an int",
    ),
    case(
        "mha-set-loc-float",
        lambda s: s.mha.set_kv_buffer(5, T([4.0]), torch.zeros(1, 2, 4), torch.zeros(1, 2, 3)),
        TypeError,
        "loc must have dtype",
    ),
    case(
        "mha-set-loc-2d",
        lambda s: s.mha.set_kv_buffer(5, T([[4]]), torch.zeros(1, 2, 4), torch.zeros(1, 2, 3)),
        ValueError,
        "loc must have 1 dimensions",
    ),
    case(
        "mha-set-loc-meta",
        lambda s: s.mha.set_kv_buffer(5, T([4], device="meta"), torch.zeros(1, 2, 4), torch.zeros(1, 2, 3)),
        ValueError,
        "loc must be on device",
    ),
    case(
        "mha-set-k-head-dim",
        lambda s: s.mha.set_kv_buffer(5, T([4]), torch.zeros(1, 2, 3), torch.zeros(1, 2, 3)),
        ValueError,
        r"cache_k must have shape \[1, 2, 4\]",
    ),
    case(
        "mha-set-k-rows",
        lambda s: s.mha.set_kv_buffer(5, T([4]), torch.zeros(2, 2, 4), torch.zeros(1, 2, 3)),
        ValueError,
        r"cache_k must have shape \[1, 2, 4\]",
    ),
    case(
        "mha-set-v-heads",
        lambda s: s.mha.set_kv_buffer(5, T([4]), torch.zeros(1, 2, 4), torch.zeros(1, 1, 3)),
        ValueError,
        r"cache_v must have shape \[1, 2, 3\]",
    ),
    case(
        "mha-set-k-int",
        lambda s: s.mha.set_kv_buffer(5, T([4]), torch.zeros(1, 2, 4, dtype=torch.int32), torch.zeros(1, 2, 3)),
        TypeError,
        "cache_k must be a floating",
    ),
    case(
        "mha-set-k-list",
        lambda s: s.mha.set_kv_buffer(5, T([4]), [[0.0]], torch.zeros(1, 2, 3)),
        TypeError,
        "cache_k must be a torch.Tensor",
    ),
    case(
        "mha-set-k-scale-0",
        lambda s: s.mha.set_kv_buffer(5, T([4]), torch.zeros(1, 2, 4), torch.zeros(1, 2, 3), k_scale=0.0),
        ValueError,
        "k_scale must be finite and > 0",
    ),
    case(
        "mha-set-v-scale-nan",
        lambda s: s.mha.set_kv_buffer(5, T([4]), torch.zeros(1, 2, 4), torch.zeros(1, 2, 3), v_scale=math.nan),
        ValueError,
        "v_scale must be finite",
    ),
    case(
        "mha-set-k-scale-str",
        lambda s: s.mha.set_kv_buffer(5, T([4]), torch.zeros(1, 2, 4), torch.zeros(1, 2, 3), k_scale="1"),
        TypeError,
        "k_scale must be a number",
    ),
    case(
        "swapool-register-shape",
        lambda s: s.swa_pool.register_mapping(torch.zeros(5, dtype=torch.int64)),
        ValueError,
        r"full_to_swa_index_mapping must have shape \[37\]",
    ),
    case(
        "swapool-register-int32",
        lambda s: s.swa_pool.register_mapping(torch.zeros(37, dtype=torch.int32)),
        TypeError,
        "full_to_swa_index_mapping must have dtype",
    ),
    case("swapool-translate-float", lambda s: s.swa_pool.translate_loc_from_full_to_swa(T([4.0])), TypeError, "kv_indices must have dtype"),
    case(
        "swapool-translate-meta",
        lambda s: s.swa_pool.translate_loc_from_full_to_swa(T([4], device="meta")),
        ValueError,
        "kv_indices must be on device",
    ),
    case(
        "swapool-translate-unregistered",
        lambda s: swa_pool()(s).translate_loc_from_full_to_swa(T([4])),
        ValueError,
        "no full_to_swa_index_mapping registered",
    ),
    case("swapool-get-key-layer-absent", lambda s: s.swa_pool.get_key_buffer(7), ValueError, "layer_id 7 is not in layers_mapping"),
    case("swapool-get-kv-layer-str", lambda s: s.swa_pool.get_kv_buffer("0"), TypeError, "layer_id must be an int"),
    case("swapool-is-swa-layer-bool", lambda s: s.swa_pool.is_swa_layer(False), TypeError, "layer_id must be an int"),
    case(
        "swapool-set-layer-absent",
        lambda s: s.swa_pool.set_kv_buffer(3, last_of(s, 0), torch.zeros(1, 1, 4), torch.zeros(1, 1, 4)),
        ValueError,
        "layer_id 3",
    ),
    case(
        "swapool-set-loc-float",
        lambda s: s.swa_pool.set_kv_buffer(0, T([4.0]), torch.zeros(1, 1, 4), torch.zeros(1, 1, 4)),
        TypeError,
        "loc must have dtype",
    ),
    case(
        "swapool-set-sliding-k-shape",
        lambda s: s.swa_pool.set_kv_buffer(2, last_of(s, 0), torch.zeros(1, 2, 4), torch.zeros(1, 1, 4)),
        ValueError,
        "cache_k must have shape",
    ),
    case(
        "swapool-set-full-v-rows",
        lambda s: s.swa_pool.set_kv_buffer(1, last_of(s, 0), torch.zeros(1, 1, 4), torch.zeros(3, 1, 4)),
        ValueError,
        "cache_v must have shape",
    ),
    # evict_swa_window(allocator, req_to_token, req_pool_index, seq_len, window_left, evicted_len)
    case(
        "evict-allocator-pool",
        lambda s: evict_swa_window(s.swa_pool, s.rtp.req_to_token, s.row, 6, 1, 0),
        TypeError,
        "allocator must be an SWA allocator",
    ),
    case(
        "evict-rtt-float",
        lambda s: evict_swa_window(s.swa, s.rtp.req_to_token.float(), s.row, 6, 1, 0),
        TypeError,
        "req_to_token must have dtype",
    ),
    case(
        "evict-rtt-1d",
        lambda s: evict_swa_window(s.swa, s.rtp.req_to_token[s.row], s.row, 6, 1, 0),
        ValueError,
        "req_to_token must have 2 dimensions",
    ),
    case(
        "evict-row-0",
        lambda s: evict_swa_window(s.swa, s.rtp.req_to_token, 0, 6, 1, 0),
        ValueError,
        r"req_pool_index must be a request row 1..3 \(row 0 is padding\), got 0",
    ),
    case(
        "evict-row-past",
        lambda s: evict_swa_window(s.swa, s.rtp.req_to_token, 4, 6, 1, 0),
        ValueError,
        "req_pool_index must be a request row 1..3",
    ),
    case(
        "evict-row-bool", lambda s: evict_swa_window(s.swa, s.rtp.req_to_token, True, 6, 1, 0), TypeError, "req_pool_index must be an int"
    ),
    case(
        "evict-seq-past-max",
        lambda s: evict_swa_window(s.swa, s.rtp.req_to_token, s.row, 33, 1, 0),
        ValueError,
        r"seq_len \(33\) exceeds req_to_token's max_context_len \(32\)",
    ),
    case("evict-seq-neg", lambda s: evict_swa_window(s.swa, s.rtp.req_to_token, s.row, -1, 1, 0), ValueError, "seq_len must be >= 0"),
    case(
        "evict-evicted-past-seq",
        lambda s: evict_swa_window(s.swa, s.rtp.req_to_token, s.row, 6, 1, 8),
        ValueError,
        r"evicted_len \(8\) must be <= seq_len \(6\)",
    ),
    case(
        "evict-evicted-str",
        lambda s: evict_swa_window(s.swa, s.rtp.req_to_token, s.row, 6, 1, "0"),
        TypeError,
        "evicted_len must be an int",
    ),
    case(
        "evict-window-below-minus-one",
        lambda s: evict_swa_window(s.swa, s.rtp.req_to_token, s.row, 6, -2, 0),
        ValueError,
        "window_left must be >= -1",
    ),
    case(
        "evict-window-float",
        lambda s: evict_swa_window(s.swa, s.rtp.req_to_token, s.row, 6, 1.5, 0),
        TypeError,
        "window_left must be an int",
    ),
]

# issue 25 (5): an out-of-range loc named with its range (not torch's bare IndexError), without debug
# mode: CPU indices are host values, free to check
LOC_RANGE = [
    case(
        "mha-set-loc-past-the-pool",
        lambda s: s.mha.set_kv_buffer(5, T([4, 20]), torch.zeros(2, 2, 4), torch.zeros(2, 2, 3)),
        ValueError,
        r"loc\[1\] = 20 is outside this pool's slots 0..19",
    ),
    case(
        "mha-set-loc-negative",
        lambda s: s.mha.set_kv_buffer(5, T([-3]), torch.zeros(1, 2, 4), torch.zeros(1, 2, 3)),
        ValueError,
        r"loc\[0\] = -3 is outside this pool's slots 0..19",
    ),
    case(
        "swapool-translate-past-the-mapping",
        lambda s: s.swa_pool.translate_loc_from_full_to_swa(T([4, 36])),
        ValueError,
        r"kv_indices\[1\] = 36 is outside the full slots 0..35 \(or -1\)",
    ),
    case(
        "swapool-translate-below-minus-one",
        lambda s: s.swa_pool.translate_loc_from_full_to_swa(T([[4], [-2]])),
        ValueError,
        r"kv_indices \(flat index 1\) = -2 is outside the full slots 0..35 \(or -1\)",
    ),
    case(
        "swapool-set-sliding-loc-past-the-mapping",
        lambda s: s.swa_pool.set_kv_buffer(0, T([99]), torch.zeros(1, 1, 4), torch.zeros(1, 1, 4)),
        ValueError,
        r"loc\[0\] = 99 is outside the full slots 0..35",
    ),
    case(
        "swapool-set-sliding-loc-minus-one",
        lambda s: s.swa_pool.set_kv_buffer(0, T([-1]), torch.zeros(1, 1, 4), torch.zeros(1, 1, 4)),
        ValueError,
        r"loc\[0\] = -1 is outside the full slots 0..35",
    ),
    case(
        "swapool-set-full-loc-past-the-pool",
        lambda s: s.swa_pool.set_kv_buffer(1, T([40]), torch.zeros(1, 1, 4), torch.zeros(1, 1, 4)),
        ValueError,
        r"loc\[0\] = 40 is outside",
    ),
]

DEBUG_ONLY = [
    case(
        "debug-mha-set-loc-out-of-range",
        lambda s: s.mha.set_kv_buffer(5, T([20]), torch.zeros(1, 2, 4), torch.zeros(1, 2, 3)),
        ValueError,
        r"loc\[0\] = 20 is outside this pool's slots 0..19",
    ),
    case(
        "debug-mha-set-loc-negative",
        lambda s: s.mha.set_kv_buffer(5, T([-3]), torch.zeros(1, 2, 4), torch.zeros(1, 2, 3)),
        ValueError,
        r"loc\[0\] = -3 is outside",
    ),
    case(
        "debug-swapool-translate-out-of-range",
        lambda s: s.swa_pool.translate_loc_from_full_to_swa(T([4, 36])),
        ValueError,
        r"kv_indices\[1\] = 36 is outside the full slots 0..35 \(or -1\)",
    ),
    case(
        "debug-swapool-set-loc-out-of-range",
        lambda s: s.swa_pool.set_kv_buffer(1, T([99]), torch.zeros(1, 1, 4), torch.zeros(1, 1, 4)),
        ValueError,
        "kv_indices|loc",
    ),
]


@pytest.mark.parametrize("call, error, match", CONSTRUCTORS + ALLOCATOR_METHODS + POOL_METHODS + LOC_RANGE)
def test_bad_input_raises_and_changes_nothing(call, error, match):
    s = make_state()
    before = state_of(s)
    with pytest.raises(error, match=match):
        call(s)
    assert_same_state(before, state_of(s))


@pytest.mark.parametrize("call, error, match", DEBUG_ONLY)
def test_bad_input_raises_in_debug_mode(call, error, match, monkeypatch):
    """Range checks that read device values run only in debug mode (TRITON_SWA_DEBUG=1)."""
    _debug(monkeypatch)
    s = make_state()
    before = state_of(s)
    with pytest.raises(error, match=match):
        call(s)
    assert_same_state(before, state_of(s))


@pytest.mark.parametrize("outside", [True, False], ids=["outside-the-SWA-pool", "not-allocated"])
def test_free_of_a_corrupted_mapping_raises_on_both_free_paths(outside):
    """A full slot whose mapping entry points outside the SWA pool or at an unowned SWA slot."""
    s = make_state()
    live = last_of(s, 5)
    owned = s.swa.swa_attn_allocator.slot_owned
    mapped = 99 if outside else int((~owned[PS:]).nonzero()[0]) + PS
    s.swa.full_to_swa_index_mapping[live] = mapped
    before = state_of(s)
    want = "outside" if outside else "which is not allocated"
    for call in (s.swa.free, s.swa.free_swa):
        with pytest.raises(ValueError, match=rf"free_index holds \(mapped\) SWA slot {mapped}, {want}"):
            call(live)
        assert_same_state(before, state_of(s))
