"""Inputs, providers and the float64 check of ``triton-swa bench``.

Every provider of a case reads the same K/V values from the same kind of pool: slots (page size 1)
or pages (page size 16) of the windows scattered over a pool by a random permutation, every slot
outside the windows NaN, outputs NaN before each call, so that an over-read or an unwritten output
shows up in the check. Inputs are seeded by the case id: every process builds the same ones.

Providers (a provider that cannot run a case says why, and is not timed):

- ``triton_swa``: ``swa_decode`` / ``swa_extend`` (public API); ``build_window_indices`` /
  ``build_window_page_table`` for op ``indices`` (:mod:`.indices`, with its ``two_pass`` and
  ``plain_gather``).
- ``triton_swa_debug``: the same with ``debug=True``: the guard reads every index back and checks it
  before the launch (it synchronises: timed eagerly, never captured); its cost is the difference.
- ``triton_swa_fp8_bytes`` / ``triton_swa_fp8nuz`` (fp8 cases): the fp8 pool read as bytes and
  decoded in the kernel, as on targets without Triton's fp8 conversion (sm_80/86), and the same values
  as float8_e4m3fnuz (MI300's format, decoded from its bytes elsewhere); against ``triton_swa``'s
  native e4m3fn loads and the bf16 case of the same shape.
- ``flex``: PyTorch's FlexAttention, compiled, over the window gathered into contiguous tensors
  beforehand (the gather is not timed: flex reads the same bytes triton-swa reads); decode and
  prefill without a cached prefix; no sinks, no fp8.
- ``gather_sdpa``: decode only, the window gathered from the pool (timed) then
  ``scaled_dot_product_attention``; no sinks, no fp8.
- ``sglang_triton``: SGLang's Triton kernels (when sglang is importable) at page size 1: decode given
  the window-trimmed token slots and the split counts its backend computes; prefill and verify by
  its extend kernel, given the window-trimmed prefix slots and ``sliding_window_size = W``.
- ``vllm_triton`` / ``vllm_triton_trimmed``: vLLM 0.32's Triton unified attention (from
  ``.peers/vllm_triton``, made by ``scripts/fetch_peers.sh``): decode over the case's pages of 16;
  prefill and verify over a paged copy of the window and the new K/V (pages of 16: it reads new K/V
  from its cache); its block table as its backend builds it (from position 0), and trimmed to the
  window's pages.
- ``flashinfer_decode_tc`` / ``flashinfer_decode_cc`` / ``flashinfer_prefill``: FlashInfer 0.7.2's
  fa2 kernels (from ``.peers/flashinfer_site``, made by ``scripts/fetch_peers.sh``, else an installed
  flashinfer; CUDA only; JIT-built on first use): ``BatchDecodeWithPagedKVCacheWrapper`` with tensor
  cores and with CUDA cores over the case's own pool (its window's slots or pages as the page list),
  ``BatchPrefillWithPagedKVCacheWrapper(backend="fa2")`` for prefill and verify over a paged copy of
  the window and the new K/V (it reads new K/V from its cache); ``window_left = W`` (its convention
  is ours), one wrapper per input set planned beforehand, one shared workspace, ``run`` timed. No
  sinks (its fa2 and CUDA-core kernels take none), no fp8 prefix in prefill / verify.
- ``copy_same_bytes``: a device copy of the case's bytes (read and write): the hardware's ceiling.
- ``read_same_bytes``: a read-only pass over the case's bytes (a max reduction), which an attention
  kernel, reading far more than it writes, may pass.
- ``launch_floor``: one Triton program that does nothing: what a launch costs before any byte moves
  (the floor of a small batch's decode, where a copy of its bytes is itself mostly a launch).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import zlib

import torch

from .cases import Case

__all__ = [
    "EAGER_ONLY",
    "PROVIDERS",
    "build",
    "check",
    "flashinfer_build_keys",
    "prepare",
    "start_flashinfer_build",
    "stop_flashinfer_build",
]

FP8_SCALE = 0.5
TOLERANCE = 2e-2  # bf16 outputs of magnitude ~1
CHECK_ROWS = 16  # new tokens checked per request (the last ones) for prefill and verify


def _seed(case: Case, index: int) -> int:
    return (zlib.crc32(case.id.encode()) << 8) + index


def build(case: Case, index: int, device: str) -> dict:
    """Input set ``index`` of ``case`` (seeded: the same in every process)."""
    gen = torch.Generator(device=device).manual_seed(_seed(case, index))
    if case.op == "indices":
        from . import indices

        return indices.build(case, gen, device)
    s, B = case.shape, case.batch
    bf16 = torch.bfloat16
    n, ps = case.window, case.page_size
    start = case.window_start
    end = start + n
    first = start // ps
    pages_per = (end - 1) // ps - first + 1 if n else 0
    used = B * pages_per
    pool_pages = used + max(used // 8, 2) + 1
    pages = (torch.randperm(pool_pages - 1, generator=gen, device=device)[:used] + 1).view(B, pages_per)
    pos = torch.arange(start, end, device=device)
    slots = pages[:, pos // ps - first] * ps + pos % ps if n else torch.zeros(B, 0, dtype=torch.int64, device=device)
    k_pool = torch.full((pool_pages * ps, s.h, s.d), float("nan"), dtype=bf16, device=device)
    v_pool = torch.full_like(k_pool, float("nan"))
    flat = slots.reshape(-1)
    k_pool[flat] = torch.randn(flat.numel(), s.h, s.d, generator=gen, device=device, dtype=bf16)
    v_pool[flat] = torch.randn(flat.numel(), s.h, s.d, generator=gen, device=device, dtype=bf16)
    if case.fp8:
        k_pool = (k_pool.float() / FP8_SCALE).to(torch.float8_e4m3fn)
        v_pool = (v_pool.float() / FP8_SCALE).to(torch.float8_e4m3fn)
    rows = B if case.op == "decode" else B * case.new
    x = dict(
        k_pool=k_pool,
        v_pool=v_pool,
        slots=slots,
        kv_indptr=(torch.arange(B + 1, device=device) * n).to(torch.int32),
        kv_indices=flat.to(torch.int32),
        page_table=pages.to(torch.int32),
        window_starts=torch.full((B,), start, dtype=torch.int32, device=device),
        seq_lens=torch.full((B,), end, dtype=torch.int32, device=device),
        q=torch.randn(rows, s.hq, s.d, generator=gen, device=device, dtype=bf16),
        sinks=torch.randn(s.hq, generator=gen, device=device) if s.sinks else None,
        out=torch.full((rows, s.hq, s.d), float("nan"), dtype=bf16, device=device),
    )
    if case.op != "decode":
        x["k"] = torch.randn(rows, s.h, s.d, generator=gen, device=device, dtype=bf16)
        x["v"] = torch.randn(rows, s.h, s.d, generator=gen, device=device, dtype=bf16)
        x["qo_indptr"] = (torch.arange(B + 1, device=device) * case.new).to(torch.int32)
        x["prefix_lens"] = torch.full((B,), case.prefix, dtype=torch.int32, device=device)
    return x


def _scales(case: Case) -> dict:
    return dict(k_scale=FP8_SCALE, v_scale=FP8_SCALE) if case.fp8 else {}


# ---- providers: prepare(case, inputs) -> a call, or a string saying why the case is not theirs ----


def _triton_swa(case: Case, x: dict, **extra):
    """``extra``: ``debug=True`` (the guard on), or the fp8 variants' own pools."""
    import triton_swa

    s, sm_scale = case.shape, 1.0 / math.sqrt(case.shape.d)
    k_pool, v_pool = extra.pop("pools", (x["k_pool"], x["v_pool"]))
    if case.page_size == 1:
        where = dict(kv_indptr=x["kv_indptr"], kv_indices=x["kv_indices"])
    else:
        where = dict(page_table=x["page_table"], window_starts=x["window_starts"], page_size=case.page_size)
    if case.op == "decode":
        if case.page_size > 1:
            where["seq_lens"] = x["seq_lens"]
        kw = dict(sm_scale=sm_scale, sinks=x["sinks"], out=x["out"], max_window=case.window, **_scales(case), **extra)
        return lambda: triton_swa.swa_decode(x["q"], k_pool, v_pool, **where, **kw)
    kw = dict(
        window_left=s.window_left, sm_scale=sm_scale, sinks=x["sinks"], out=x["out"], max_extend_len=case.new, **_scales(case), **extra
    )
    args = (x["q"], x["k"], x["v"], k_pool, v_pool, x["qo_indptr"], x["prefix_lens"])
    return lambda: triton_swa.swa_extend(*args, **where, **kw)


def _fp8_bytes(case: Case, x: dict):
    """``triton_swa`` planned as for a target without Triton's fp8 conversion (the pool read as bytes)."""
    if not case.fp8:
        return "fp8 cases only"
    from ..testing import without_native_fp8

    call, device = _triton_swa(case, x), x["q"].device

    def run():
        with without_native_fp8(device):
            call()

    return run


def _fp8nuz(case: Case, x: dict):
    """``triton_swa`` over a float8_e4m3fnuz copy of the pool (the same values: e4m3fn and e4m3fnuz share
    their 3 mantissa bits, and the pool's values are far below fnuz's 240), made before timing."""
    if not case.fp8:
        return "fp8 cases only"
    if "fp8nuz_pools" not in x:
        x["fp8nuz_pools"] = tuple(p.float().to(torch.float8_e4m3fnuz) for p in (x["k_pool"], x["v_pool"]))
    return _triton_swa(case, x, pools=x["fp8nuz_pools"])


_FLEX = {}


def _flex_fn():
    if "fn" not in _FLEX:
        from torch.nn.attention.flex_attention import flex_attention

        _FLEX["fn"] = torch.compile(flex_attention) if torch.cuda.is_available() else flex_attention
    return _FLEX["fn"]


def _flex(case: Case, x: dict):
    s = case.shape
    if s.sinks or case.fp8:
        return "no sinks / fp8 in FlexAttention"
    if case.op == "verify" or (case.op == "prefill" and case.prefix):
        return "decode and prefill without a cached prefix only"
    B, sm_scale = case.batch, 1.0 / math.sqrt(s.d)
    fn = _flex_fn()
    if case.op == "decode":
        n = case.window
        k = x["k_pool"][x["slots"].reshape(-1)].view(B, n, s.h, s.d).transpose(1, 2).contiguous()
        v = x["v_pool"][x["slots"].reshape(-1)].view(B, n, s.h, s.d).transpose(1, 2).contiguous()
        q = x["q"].unsqueeze(2)
        return lambda: x["out"].copy_(fn(q, k, v, scale=sm_scale, enable_gqa=True).squeeze(2))
    from torch.nn.attention.flex_attention import create_block_mask

    E, w = case.new, s.window_left

    def visible(b, h, qi, ki):
        return (ki <= qi) & (qi - ki <= w)

    mask = create_block_mask(visible, None, None, E, E, device=x["q"].device)
    q = x["q"].view(B, E, s.hq, s.d).transpose(1, 2)
    k = x["k"].view(B, E, s.h, s.d).transpose(1, 2)
    v = x["v"].view(B, E, s.h, s.d).transpose(1, 2)
    out = x["out"].view(B, E, s.hq, s.d)
    return lambda: out.copy_(fn(q, k, v, block_mask=mask, scale=sm_scale, enable_gqa=True).transpose(1, 2))


def _gather_sdpa(case: Case, x: dict):
    s = case.shape
    if case.op != "decode" or s.sinks or case.fp8:
        return "decode without sinks / fp8 only"
    B, n, sm_scale = case.batch, case.window, 1.0 / math.sqrt(s.d)

    def run():
        flat = x["slots"].reshape(-1)
        k = x["k_pool"].index_select(0, flat).view(B, n, s.h, s.d).transpose(1, 2)
        v = x["v_pool"].index_select(0, flat).view(B, n, s.h, s.d).transpose(1, 2)
        q = x["q"].view(B, s.h, s.hq // s.h, s.d)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=sm_scale)
        x["out"].copy_(o.reshape(B, s.hq, s.d))

    return run


INTERPRETED_BF16 = "its bf16 dots are wrong in Triton's interpreter (docs/contract.md §8)"


def _interpreted_bf16(x: dict) -> bool:
    """A peer's own Triton kernel under the interpreter with bf16 inputs (it cannot be checked there)."""
    return x["q"].device.type != "cuda" and x["q"].dtype == torch.bfloat16


SGLANG_MAX_KV_SPLITS = 8  # SGLang's default --triton-attention-num-kv-splits


def _sglang_triton(case: Case, x: dict):
    """SGLang's Triton kernels over token slots (page size 1): decode, or extend for prefill/verify."""
    if case.page_size != 1:
        return "token slots (page size 1) only"
    if case.op != "decode":
        return _sglang_extend(case, x)
    return _sglang_decode(case, x)


def _sglang_decode(case: Case, x: dict):
    """SGLang's Triton decode kernel, fed the window-trimmed token slots (it has no window logic of its
    own) and the split counts its backend computes (``get_num_kv_splits_triton``, at most 8)."""
    try:
        from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
        from sglang.kernels.ops.attention.metadata import get_num_kv_splits_triton
    except ImportError as exc:
        return f"sglang not importable ({type(exc).__name__})"
    s = case.shape
    if _interpreted_bf16(x):
        return INTERPRETED_BF16
    B, dev, splits = case.batch, x["q"].device, SGLANG_MAX_KV_SPLITS
    cores = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 4
    lens = torch.full((B,), case.window, dtype=torch.int32, device=dev)
    num_kv_splits = torch.empty(B, dtype=torch.int32, device=dev)
    get_num_kv_splits_triton[(1,)](num_kv_splits, lens, B, 1, s.hq, s.h, splits, cores, MAX_NUM_SEQ=max(256, 1 << (B - 1).bit_length()))
    logits = torch.empty(B, s.hq, splits, s.d, dtype=torch.float32, device=dev)
    lse = torch.empty(B, s.hq, splits, dtype=torch.float32, device=dev)
    scale = FP8_SCALE if case.fp8 else 1.0
    args = (x["q"], x["k_pool"], x["v_pool"], x["out"], x["kv_indptr"], x["kv_indices"], logits, lse, num_kv_splits, splits)
    return lambda: decode_attention_fwd(*args, 1.0 / math.sqrt(s.d), scale, scale, sinks=x["sinks"])


def _sglang_extend(case: Case, x: dict):
    """SGLang's Triton extend kernel (``extend_attention_fwd``), as its backend calls it for a sliding
    layer: the cached prefix as window-trimmed token slots (the last ``W`` of them), the step's new
    K/V contiguous, ``sliding_window_size = W`` (its mask keeps keys at most ``W`` behind the query),
    causal, per-tensor K/V scales."""
    try:
        from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
    except ImportError as exc:
        return f"sglang not importable ({type(exc).__name__})"
    if _interpreted_bf16(x):
        return INTERPRETED_BF16
    s = case.shape
    scale = FP8_SCALE if case.fp8 else 1.0
    args = (x["q"], x["k"], x["v"], x["out"], x["k_pool"], x["v_pool"], x["qo_indptr"], x["kv_indptr"], x["kv_indices"])
    kw = dict(
        custom_mask=None,
        is_causal=True,
        mask_indptr=None,
        max_len_extend=case.new,
        k_scale=scale,
        v_scale=scale,
        sm_scale=1.0 / math.sqrt(s.d),
        sliding_window_size=s.window_left,
        sinks=x["sinks"],
    )
    return lambda: extend_attention_fwd(*args, **kw)


def _peer_folder(name: str):
    """``.peers/<name>`` (made by scripts/fetch_peers.sh) under ``$TRITON_SWA_PEERS`` or the checkout."""
    root = os.environ.get("TRITON_SWA_PEERS") or os.path.join(os.path.dirname(__file__), "..", "..", ".peers")
    folder = os.path.abspath(os.path.join(root, name))
    return folder if os.path.isdir(folder) else None


def _vllm_unified_attention():
    folder = _peer_folder("vllm_triton")
    if folder is None:
        return None
    # An installed vLLM (the vLLM tier's) may already be imported: its CPU build swaps Triton for a
    # placeholder. The peer's copy is imported on its own, then the installed package is put back.
    installed = {name: sys.modules.pop(name) for name in list(sys.modules) if name == "vllm" or name.startswith("vllm.")}
    sys.path.insert(0, folder)
    try:
        from vllm.v1.attention.ops.triton_unified_attention import unified_attention
        from vllm.v1.kv_cache_interface import KVQuantMode
    finally:
        sys.path.remove(folder)
        if installed:
            for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
                del sys.modules[name]
            sys.modules.update(installed)
    return unified_attention, KVQuantMode


VLLM_MIN_GRID_2D, VLLM_SEGMENTS = 128, 16  # its backend's 2D-kernel grid floor and softmax segments
VLLM_PAGE = 16  # its KV block size for prefill/verify (a paged copy of the case's window)


def _paged_extend_cache(case: Case, x: dict, ps: int, before_window: bool = False):
    """A paged K/V cache for a peer's prefill/verify that reads the step's new K/V from its cache (its
    backend writes them there first, not timed here): the window's cached keys and the new ones at
    their positions in pages of ``ps`` scattered over the cache, every other slot NaN (page 0 too).
    ``before_window``: the slots of the first page before the window hold random keys, as a real
    cache's would (for a kernel that reads pages whole and masks scores: a NaN there would reach its
    output through ``0 * NaN``). Returns (k, v, pages): the caches ``[pages, ps, H, D]`` and the
    window's pages ``[B, n]``."""
    s, B, E, dev = case.shape, case.batch, case.new, x["q"].device
    start, end = case.window_start, case.context
    first = start // ps
    per = (end - 1) // ps - first + 1
    gen = torch.Generator(device=dev).manual_seed(_seed(case, 1 << 20))
    pages = (torch.randperm(B * per, generator=gen, device=dev) + 1).view(B, per).to(torch.int32)
    k = torch.full((B * per + 1, ps, s.h, s.d), float("nan"), dtype=x["k"].dtype, device=dev)
    v = torch.full_like(k, float("nan"))
    pos = torch.arange(start, end, device=dev)
    at = (pages[:, pos // ps - first].long(), (pos % ps).expand(B, -1))
    k[at] = torch.cat([x["k_pool"][x["slots"]], x["k"].view(B, E, s.h, s.d)], dim=1)
    v[at] = torch.cat([x["v_pool"][x["slots"]], x["v"].view(B, E, s.h, s.d)], dim=1)
    lead = torch.arange(first * ps, start, device=dev)
    if before_window and lead.numel():
        at = (pages[:, lead // ps - first].long(), (lead % ps).expand(B, -1))
        k[at] = torch.randn(B, lead.numel(), s.h, s.d, generator=gen, device=dev, dtype=k.dtype)
        v[at] = torch.randn(B, lead.numel(), s.h, s.d, generator=gen, device=dev, dtype=v.dtype)
    return k, v, pages


def _vllm(case: Case, x: dict, trimmed: bool):
    """vLLM's Triton unified attention (``.peers/vllm_triton``, scripts/fetch_peers.sh) over the pool
    as pages of 16 (its KV blocks), with the split buffers its backend allocates. Untrimmed: the block
    table from position 0, as its backend builds it, pages before the window on the NaN dummy page
    (its window logic must skip them); trimmed: the window's pages only."""
    peer = _vllm_unified_attention()
    if peer is None:
        return "no .peers/vllm_triton (bash scripts/fetch_peers.sh)"
    unified_attention, mode = peer
    s = case.shape
    if _interpreted_bf16(x):
        return INTERPRETED_BF16
    B, L, dev = case.batch, case.context, x["q"].device
    if case.op == "decode":
        if case.page_size < 16:
            return "decode over pages of 16 or more only (the case's own pool)"
        ps = case.page_size
        k, v, pages = x["k_pool"].view(-1, ps, s.h, s.d), x["v_pool"].view(-1, ps, s.h, s.d), x["page_table"]
    else:
        if case.fp8:
            return "its new K/V would be read back from its fp8 cache, not the step's bf16 K/V"
        ps = VLLM_PAGE
        if "vllm_cache" not in x:  # one copy for both block tables
            x["vllm_cache"] = _paged_extend_cache(case, x, ps)
        k, v, pages = x["vllm_cache"]
    first = case.window_start // ps  # the first page read
    if trimmed:
        table, seq_len = pages, L - first * ps
    else:
        table = torch.zeros(B, first + pages.shape[1], dtype=torch.int32, device=dev)
        table[:, first:] = pages
        seq_len = L
    lens = torch.full((B,), seq_len, dtype=torch.int32, device=dev)
    threshold = VLLM_MIN_GRID_2D // s.h
    segm = (
        torch.empty(threshold, s.hq, VLLM_SEGMENTS, 1 << (s.d - 1).bit_length(), dtype=torch.float32, device=dev),
        torch.empty(threshold, s.hq, VLLM_SEGMENTS, dtype=torch.float32, device=dev),
        torch.empty(threshold, s.hq, VLLM_SEGMENTS, dtype=torch.float32, device=dev),
    )
    descale = torch.full((1,), FP8_SCALE if case.fp8 else 1.0, dtype=torch.float32, device=dev).expand(B, s.h)
    kw = dict(
        q=x["q"],
        k=k,
        v=v,
        out=x["out"],
        cu_seqlens_q=torch.arange(B + 1, dtype=torch.int32, device=dev) * case.new,
        max_seqlen_q=case.new,
        seqused_k=lens,
        max_seqlen_k=seq_len,
        softmax_scale=1.0 / math.sqrt(s.d),
        causal=True,
        window_size=(s.window_left, 0) if s.window_left >= 0 else (-1, -1),
        block_table=table,
        softcap=0,
        q_descale=None,
        k_descale=descale,
        v_descale=descale,
        seq_threshold_3D=threshold,
        num_par_softmax_segments=VLLM_SEGMENTS,
        softmax_segm_output=segm[0],
        softmax_segm_max=segm[1],
        softmax_segm_expsum=segm[2],
        sinks=x["sinks"],
        kv_quant_mode=mode.FP8_PER_TENSOR if case.fp8 else mode.NONE,
    )
    return lambda: unified_attention(**kw)


# ---- FlashInfer: its fa2 kernels, JIT-built on first use ----

FLASHINFER_WORKSPACE_BYTES = 256 * 2**20  # one float workspace, shared by every wrapper of the process
FLASHINFER_PROVIDERS = ("flashinfer_decode_tc", "flashinfer_decode_cc", "flashinfer_prefill")
_FLASHINFER = {}


def flashinfer_unsupported(provider: str, case: Case) -> str | None:
    """Why FlashInfer's ``provider`` does not run ``case`` (None: it does). Decided from the case alone,
    so that the background build (:func:`flashinfer_build_keys`) builds only what will run."""
    s = case.shape
    if provider == "flashinfer_prefill":
        if case.op == "decode":
            return "prefill and verify only (decode: flashinfer_decode_tc, flashinfer_decode_cc)"
        if case.fp8:
            return "its new K/V would be read back from its fp8 cache, not the step's bf16 K/V"
    elif case.op != "decode":
        return "decode only (prefill and verify: flashinfer_prefill)"
    if s.sinks:
        return "no sinks in its fa2 and CUDA-core kernels (run() takes sinks= and does not apply them there)"
    return None


def _flashinfer_modules():
    """``(flashinfer.decode, flashinfer.prefill)``, or a string saying why they cannot be imported: the
    slim copy in ``.peers/flashinfer_site`` (scripts/fetch_peers.sh) first, else an installed one."""
    if "modules" not in _FLASHINFER:
        folder = _peer_folder("flashinfer_site")
        if folder is not None and folder not in sys.path:
            sys.path.insert(0, folder)
        try:
            import flashinfer.decode
            import flashinfer.prefill

            _FLASHINFER["modules"] = (flashinfer.decode, flashinfer.prefill)
        except Exception as exc:  # noqa: BLE001 - ImportError, or its compiled parts failing to load
            where = "" if folder else "no .peers/flashinfer_site (bash scripts/fetch_peers.sh); "
            _FLASHINFER["modules"] = f"flashinfer not importable ({where}{type(exc).__name__}: {str(exc)[:100]})"
    return _FLASHINFER["modules"]


def _flashinfer_workspace(device) -> torch.Tensor:
    key = ("workspace", str(device))
    if key not in _FLASHINFER:
        _FLASHINFER[key] = torch.zeros(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return _FLASHINFER[key]


def _flashinfer_ready(provider: str, case: Case, x: dict):
    """FlashInfer's modules for ``provider`` on ``case``, or the reason it does not run it."""
    why = flashinfer_unsupported(provider, case)
    if why is not None:
        return why
    if x["q"].device.type != "cuda":
        return "CUDA only"
    return _flashinfer_modules()


def _flashinfer_decode(case: Case, x: dict, tensor_cores: bool):
    """FlashInfer's decode (``BatchDecodeWithPagedKVCacheWrapper``, fa2) over the case's own pool: its
    page list is the window's slots (page size 1) or the window's pages, ``window_left = W``; planned
    here (the JIT build of a new kind happens here, untimed), ``run`` timed."""
    modules = _flashinfer_ready("flashinfer_decode_tc" if tensor_cores else "flashinfer_decode_cc", case, x)
    if isinstance(modules, str):
        return modules
    s, B, ps, dev = case.shape, case.batch, case.page_size, x["q"].device
    k, v = x["k_pool"], x["v_pool"]
    if ps == 1:
        indptr, indices = x["kv_indptr"], x["kv_indices"]
        last_page_len = torch.ones(B, dtype=torch.int32, device=dev)
    else:
        pages = x["page_table"]
        per, first = pages.shape[1], case.window_start // ps
        indptr = (torch.arange(B + 1, device=dev) * per).to(torch.int32)
        indices = pages.reshape(-1)
        last_page_len = torch.full((B,), case.context - (first + per - 1) * ps, dtype=torch.int32, device=dev)
        lead = case.window_start - first * ps
        if lead:
            # it reads the first page whole and masks scores: the pool's NaN before the window would
            # reach its output through 0 * NaN; a copy with zeros there
            slots = (pages[:, :1].long() * ps + torch.arange(lead, device=dev)).reshape(-1)
            k, v = k.clone(), v.clone()
            k.view(torch.uint8)[slots] = 0
            v.view(torch.uint8)[slots] = 0
    wrapper = modules[0].BatchDecodeWithPagedKVCacheWrapper(_flashinfer_workspace(dev), "NHD", use_tensor_cores=tensor_cores, backend="fa2")
    wrapper.plan(
        indptr,
        indices,
        last_page_len,
        s.hq,
        s.h,
        s.d,
        ps,
        window_left=s.window_left,
        q_data_type=x["q"].dtype,
        kv_data_type=k.dtype,
        sm_scale=1.0 / math.sqrt(s.d),
    )
    cache = (k.view(-1, ps, s.h, s.d), v.view(-1, ps, s.h, s.d))
    scales = _scales(case)  # k_scale folds into its sm_scale; v_scale scales its output (a second launch)
    return lambda: wrapper.run(x["q"], cache, out=x["out"], **scales)


def _flashinfer_prefill(case: Case, x: dict):
    """FlashInfer's prefill (``BatchPrefillWithPagedKVCacheWrapper``, ``backend="fa2"``: the default
    picks fa3 on Hopper, which needs CUTLASS) over a paged copy of the window and the new K/V in pages
    of the case's page size (the window's pages only), causal, ``window_left = W``."""
    modules = _flashinfer_ready("flashinfer_prefill", case, x)
    if isinstance(modules, str):
        return modules
    s, B, ps, dev = case.shape, case.batch, case.page_size, x["q"].device
    if "flashinfer_cache" not in x:  # one copy for every wrapper of this input set
        x["flashinfer_cache"] = _paged_extend_cache(case, x, ps, before_window=True)
    k, v, pages = x["flashinfer_cache"]
    per = pages.shape[1]
    kv_len = case.context - case.window_start // ps * ps
    wrapper = modules[1].BatchPrefillWithPagedKVCacheWrapper(_flashinfer_workspace(dev), "NHD", backend="fa2")
    wrapper.plan(
        x["qo_indptr"],
        (torch.arange(B + 1, device=dev) * per).to(torch.int32),
        pages.reshape(-1),
        torch.full((B,), kv_len - (per - 1) * ps, dtype=torch.int32, device=dev),
        s.hq,
        s.h,
        s.d,
        ps,
        causal=True,
        window_left=s.window_left,
        q_data_type=x["q"].dtype,
        kv_data_type=k.dtype,
        sm_scale=1.0 / math.sqrt(s.d),
    )
    return lambda: wrapper.run(x["q"], (k, v), out=x["out"])


def flashinfer_build_keys(cases, providers) -> list:
    """The JIT modules FlashInfer's selected providers will build for ``cases``, in the order they are
    first needed: ``[kind, kv dtype, head dim, sliding]`` with kind ``decode`` (its CUDA-core decode)
    or ``prefill`` (its fa2 prefill module, which tensor-core decode uses too)."""
    keys = []
    for case in cases:
        for provider in providers:
            if provider not in FLASHINFER_PROVIDERS or flashinfer_unsupported(provider, case) is not None:
                continue
            kind = "decode" if provider == "flashinfer_decode_cc" else "prefill"
            key = [kind, "float8_e4m3fn" if case.fp8 else "bfloat16", case.shape.d, case.shape.window_left >= 0]
            if key not in keys:
                keys.append(key)
    return keys


def start_flashinfer_build(keys: list, env: dict | None = None, log=subprocess.DEVNULL, errors=None):
    """Build FlashInfer's JIT modules ``keys`` in a child process (no GPU; the cores but two): all of
    them in one ninja run (FlashInfer's ``build_jit_specs``, under its own locks), so that their
    compiles overlap one another; built one module after another, the default grid's ten took 286 s
    on a fresh H100 machine (2026-12-07). Both callers wait for the child before they time anything.
    Set ``FLASHINFER_CUDA_ARCH_LIST`` alike in ``env`` and in the processes that plan. Returns the
    child (None: nothing to build), in a process group of its own with its compilers
    (:func:`stop_flashinfer_build` ends them all). Its output goes to ``log``, its errors there too
    unless ``errors`` says where."""
    if not keys:
        return None
    env = dict(os.environ if env is None else env, CUDA_VISIBLE_DEVICES="")
    if "FLASHINFER_CUDA_ARCH_LIST" not in env and torch.cuda.is_available():
        env["FLASHINFER_CUDA_ARCH_LIST"] = "{}.{}".format(*torch.cuda.get_device_capability())
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "triton_swa.benchmark.providers", "--flashinfer-build", json.dumps(keys)]
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=log if errors is None else errors, start_new_session=True)


def stop_flashinfer_build(child) -> None:
    """End the child of :func:`start_flashinfer_build` and its compilers (its own process group)."""
    if child is not None and child.poll() is None:
        try:
            os.killpg(child.pid, 9)
        except ProcessLookupError:
            pass
        child.wait()


def _flashinfer_build(keys: list) -> int:
    """The child of :func:`start_flashinfer_build`."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) > 4:
        os.sched_setaffinity(0, cores[2:])  # two cores left to the process that measures
        os.environ.setdefault("MAX_JOBS", str(min(16, len(cores) - 2)))
    modules = _flashinfer_modules()
    if isinstance(modules, str):
        print(modules, file=sys.stderr)
        return 1
    from flashinfer.jit import build_jit_specs
    from flashinfer.jit.attention import modules as jit

    specs = []
    for kind, kv_dtype, d, sliding in keys:
        args = (torch.bfloat16, getattr(torch, kv_dtype), torch.bfloat16, torch.int32, d, d, 0, sliding, False)
        spec = jit.gen_batch_decode_module(*args) if kind == "decode" else jit._gen_batch_prefill_primary_module("fa2", *args, False)
        specs.append((f"{kind} {kv_dtype} D{d} {'sliding' if sliding else 'full'}", spec))
    try:
        # every module's compiles in one ninja run (FlashInfer's own, under its locks), MAX_JOBS at a time
        build_jit_specs([spec for _, spec in specs])
    except Exception as exc:  # noqa: BLE001 - each module alone, next: the one that fails says why
        print(f"flashinfer: one ninja run for all modules failed ({type(exc).__name__}); building one by one", file=sys.stderr)
        for _, spec in specs:
            spec.build(need_lock=True)
    for what, spec in specs:
        print(f"built {what}: {spec.name}", file=sys.stderr, flush=True)
    return 0


def _ceiling_buffers(case: Case, x: dict):
    if "ceiling" not in x:
        n, device = max(case.nbytes() // 2, 1), x["seq_lens"].device
        x["ceiling"] = (torch.randn(n, device=device).to(torch.bfloat16), torch.empty(n, dtype=torch.bfloat16, device=device))
    return x["ceiling"]


def _copy(case: Case, x: dict):
    src, dst = _ceiling_buffers(case, x)
    return lambda: dst.copy_(src)


def _read(case: Case, x: dict):
    src, dst = _ceiling_buffers(case, x)
    return lambda: torch.amax(src, dim=0, out=dst[:1].view(()))


_EMPTY_KERNEL = []


def _launch_floor(case: Case, x: dict):
    if not _EMPTY_KERNEL:
        import triton

        @triton.jit
        def empty_kernel(ptr):
            pass

        _EMPTY_KERNEL.append(empty_kernel)
    kernel, arg = _EMPTY_KERNEL[0], x["seq_lens"]
    return lambda: kernel[(1,)](arg)


def _indices_only(case: Case, x: dict):
    return "op indices only"


PROVIDERS = {
    "triton_swa": _triton_swa,
    "triton_swa_debug": lambda case, x: _triton_swa(case, x, debug=True),
    "triton_swa_fp8_bytes": _fp8_bytes,
    "triton_swa_fp8nuz": _fp8nuz,
    "flex": _flex,
    "gather_sdpa": _gather_sdpa,
    "sglang_triton": _sglang_triton,
    "vllm_triton": lambda case, x: _vllm(case, x, trimmed=False),
    "vllm_triton_trimmed": lambda case, x: _vllm(case, x, trimmed=True),
    "flashinfer_decode_tc": lambda case, x: _flashinfer_decode(case, x, tensor_cores=True),
    "flashinfer_decode_cc": lambda case, x: _flashinfer_decode(case, x, tensor_cores=False),
    "flashinfer_prefill": _flashinfer_prefill,
    "copy_same_bytes": _copy,
    "read_same_bytes": _read,
    "launch_floor": _launch_floor,
    "two_pass": _indices_only,
    "plain_gather": _indices_only,
}
CEILINGS = ("copy_same_bytes", "read_same_bytes", "launch_floor")
EAGER_ONLY = ("triton_swa_debug",)  # it synchronises: a capture would fail, or time nothing
# left out unless named in --providers: triton_swa's own variants; the index builds' peers unless op indices runs
OPT_IN = ("triton_swa_debug", "triton_swa_fp8_bytes", "triton_swa_fp8nuz")
INDICES_ONLY = ("two_pass", "plain_gather")


def prepare(provider: str, case: Case, x: dict):
    if case.op == "indices" and provider not in CEILINGS:
        from . import indices

        fn = indices.PROVIDERS.get(provider)
        return fn(case, x) if fn else "attention ops only"
    return PROVIDERS[provider](case, x)


# ---- the float64 check ----


def _decode_reference(case: Case, x: dict) -> torch.Tensor:
    import triton_swa_reference as ref

    k, v = x["k_pool"], x["v_pool"]
    return ref.decode_attention(
        x["q"], k, v, x["kv_indptr"], x["kv_indices"], sm_scale=1.0 / math.sqrt(case.shape.d), sinks=x["sinks"], **_scales(case)
    )


def _extend_rows_reference(case: Case, x: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(row indices, float64 outputs) of the last ``CHECK_ROWS`` new tokens of every request."""
    s, E, n = case.shape, case.new, case.window
    scale = FP8_SCALE if case.fp8 else 1.0
    G = s.hq // s.h
    rows, outs = [], []
    for b in range(case.batch):
        slots = x["slots"][b]
        keys = torch.cat([x["k_pool"][slots].double() * scale, x["k"][b * E : (b + 1) * E].double()])
        vals = torch.cat([x["v_pool"][slots].double() * scale, x["v"][b * E : (b + 1) * E].double()])
        for i in range(max(0, E - CHECK_ROWS), E):
            seen = case.keys_seen(case.prefix + i)
            hi = n + i + 1  # keys are the cached window (n) then the new tokens
            kk, vv = keys[hi - seen : hi], vals[hi - seen : hi]
            q = x["q"][b * E + i].double().view(s.h, G, s.d)
            scores = torch.einsum("hgd,nhd->hgn", q, kk) / math.sqrt(s.d)
            if x["sinks"] is not None:
                sink = x["sinks"].double().view(s.h, G, 1)
                m = torch.maximum(scores.amax(-1, keepdim=True), sink)
                p = torch.exp(scores - m)
                p = p / (p.sum(-1, keepdim=True) + torch.exp(sink - m))
            else:
                p = torch.softmax(scores, -1)
            outs.append(torch.einsum("hgn,nhd->hgd", p, vv).reshape(s.hq, s.d))
            rows.append(b * E + i)
    return torch.tensor(rows, device=x["q"].device), torch.stack(outs)


def reference(case: Case, x: dict):
    """``(rows, expected)``: the rows of ``out`` to check (None: all) and their float64 values (op
    ``indices``: the exact outputs)."""
    if case.op == "indices":
        from . import indices

        return indices.reference(case, x)
    if case.op == "decode":
        return None, _decode_reference(case, x)
    return _extend_rows_reference(case, x)


def check(case: Case, x: dict, call, expected) -> float:
    """Max abs error of ``call``'s output against the reference, infinite when any output is NaN (op
    ``indices``: the count of entries that differ)."""
    if case.op == "indices":
        from . import indices

        return indices.check(case, x, call, expected)
    x["out"].fill_(float("nan"))
    call()
    rows, want = expected
    got = x["out"].double()
    if bool(torch.isnan(got).any()):
        return math.inf
    if rows is not None:
        got = got[rows]
    return float((got - want).abs().max()) if want.numel() else 0.0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--flashinfer-build"] and len(sys.argv) == 3:
        sys.exit(_flashinfer_build(json.loads(sys.argv[2])))
    sys.exit("usage: python -m triton_swa.benchmark.providers --flashinfer-build KEYS_JSON")
