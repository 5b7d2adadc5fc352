"""Inputs, providers and the float64 check of ``triton-swa bench``.

Every provider of a case reads the same K/V values from the same kind of pool: slots (page size 1)
or pages (page size 16) of the windows scattered over a pool by a random permutation, every slot
outside the windows NaN, outputs NaN before each call, so that an over-read or an unwritten output
shows up in the check. Inputs are seeded by the case id: every process builds the same ones.

Providers (a provider that cannot run a case says why, and is not timed):

- ``triton_swa``: ``swa_decode`` / ``swa_extend`` (public API).
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
- ``copy_same_bytes``: a device copy of the case's bytes (read and write): the hardware's ceiling.
- ``read_same_bytes``: a read-only pass over the case's bytes (a max reduction), which an attention
  kernel, reading far more than it writes, may pass.
"""

from __future__ import annotations

import math
import os
import sys
import zlib

import torch

from .cases import Case

__all__ = ["PROVIDERS", "build", "check", "prepare"]

FP8_SCALE = 0.5
TOLERANCE = 2e-2  # bf16 outputs of magnitude ~1
CHECK_ROWS = 16  # new tokens checked per request (the last ones) for prefill and verify


def _seed(case: Case, index: int) -> int:
    return (zlib.crc32(case.id.encode()) << 8) + index


def build(case: Case, index: int, device: str) -> dict:
    """Input set ``index`` of ``case`` (seeded: the same in every process)."""
    gen = torch.Generator(device=device).manual_seed(_seed(case, index))
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


def _triton_swa(case: Case, x: dict):
    import triton_swa

    s, sm_scale = case.shape, 1.0 / math.sqrt(case.shape.d)
    if case.page_size == 1:
        where = dict(kv_indptr=x["kv_indptr"], kv_indices=x["kv_indices"])
    else:
        where = dict(page_table=x["page_table"], window_starts=x["window_starts"], page_size=case.page_size)
    if case.op == "decode":
        if case.page_size > 1:
            where["seq_lens"] = x["seq_lens"]
        kw = dict(sm_scale=sm_scale, sinks=x["sinks"], out=x["out"], max_window=case.window, **_scales(case))
        return lambda: triton_swa.swa_decode(x["q"], x["k_pool"], x["v_pool"], **where, **kw)
    kw = dict(window_left=s.window_left, sm_scale=sm_scale, sinks=x["sinks"], out=x["out"], max_extend_len=case.new, **_scales(case))
    args = (x["q"], x["k"], x["v"], x["k_pool"], x["v_pool"], x["qo_indptr"], x["prefix_lens"])
    return lambda: triton_swa.swa_extend(*args, **where, **kw)


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


INTERPRETED_BF16 = "its bf16 dots are wrong in Triton's interpreter (SPEC §8)"


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


def _vllm_extend_cache(case: Case, x: dict, ps: int):
    """A paged K/V cache for vLLM's prefill/verify, which reads the step's new K/V from its cache (its
    backend writes them there first, not timed here): the window's cached keys and the new ones at
    their positions in pages of ``ps`` scattered over the cache, every other slot NaN (page 0 too).
    Returns (k, v, pages): the caches ``[pages, ps, H, D]`` and the window's pages ``[B, n]``."""
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
            x["vllm_cache"] = _vllm_extend_cache(case, x, ps)
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


def _ceiling_buffers(case: Case, x: dict):
    if "ceiling" not in x:
        n = max(case.nbytes() // 2, 1)
        x["ceiling"] = (torch.randn(n, device=x["q"].device).to(torch.bfloat16), torch.empty(n, dtype=torch.bfloat16, device=x["q"].device))
    return x["ceiling"]


def _copy(case: Case, x: dict):
    src, dst = _ceiling_buffers(case, x)
    return lambda: dst.copy_(src)


def _read(case: Case, x: dict):
    src, dst = _ceiling_buffers(case, x)
    return lambda: torch.amax(src, dim=0, out=dst[:1].view(()))


PROVIDERS = {
    "triton_swa": _triton_swa,
    "flex": _flex,
    "gather_sdpa": _gather_sdpa,
    "sglang_triton": _sglang_triton,
    "vllm_triton": lambda case, x: _vllm(case, x, trimmed=False),
    "vllm_triton_trimmed": lambda case, x: _vllm(case, x, trimmed=True),
    "copy_same_bytes": _copy,
    "read_same_bytes": _read,
}
CEILINGS = ("copy_same_bytes", "read_same_bytes")


def prepare(provider: str, case: Case, x: dict):
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
    """``(rows, expected)``: the rows of ``out`` to check (None: all) and their float64 values."""
    if case.op == "decode":
        return None, _decode_reference(case, x)
    return _extend_rows_reference(case, x)


def check(case: Case, x: dict, call, expected) -> float:
    """Max abs error of ``call``'s output against the reference, infinite when any output is NaN."""
    x["out"].fill_(float("nan"))
    call()
    rows, want = expected
    got = x["out"].double()
    if bool(torch.isnan(got).any()):
        return math.inf
    if rows is not None:
        got = got[rows]
    return float((got - want).abs().max()) if want.numel() else 0.0
