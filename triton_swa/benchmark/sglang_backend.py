"""Op ``sglang_backend`` of ``triton-swa bench``: SGLang's whole Triton attention backend beside ours on
one SGLang pool state (issue 12, item 4). Needs SGLang 0.5.23 (``pip install 'triton-swa[sglang]'``);
without it the op says so and exits cleanly. Not among the default ops.

    triton-swa bench --op sglang_backend                                  # the grid (GPU)
    triton-swa bench --op sglang_backend --shape d128-w1023 --batch 1,64 --ctx 4k
    triton-swa bench --op sglang_backend --smoke          # tiny shapes; on a CPU through Triton's interpreter

Both backends run on SGLang 0.5.23's real ``ReqToTokenPool``, ``SWAKVPool`` and
``SWATokenToKVPoolAllocator`` (``sglang.srt.mem_cache.allocator.swa``), a ``KVIndexTranslator``,
SGLang's ``ForwardBatch`` bound to its own plan and a sliding ``RadixAttention`` layer called through
``RadixAttention.forward`` under SGLang's forward context (providers):

- ``sglang_triton``: ``sglang.srt.layers.attention.triton_backend.TritonAttnBackend`` (its Triton
  kernels, from the installed wheel);
- ``triton_swa``: ``triton_swa.integrations.sglang.TritonSWASGLangBackend`` (public API only).

The history of every request is allocated in rounds by SGLang's allocator, and after each round the
tokens that left the window get ``free_swa`` (whole pages at page size 16), so the SWA slots drift
away from the full slots (the fraction that differ is printed). The sliding layer's SWA buffers are
filled with NaN first and only the window's history is written (SGLang's ``set_kv_buffer``), so a
read outside the window gives NaN; each backend writes the step's new K/V itself.

Correctness first. Each provider's output on the first input set (NaN-poisoned where the caller can
reach it: a NaN block of the output's size is freed just before the call, which PyTorch's caching
allocator hands back to ``empty_like``; triton-swa's own buffers with ``TRITON_SWA_POISON=1``) is
compared with ``triton_swa_reference`` (float64) on the window of docs/contract.md §1 (``W + 1``
keys). SGLang's Triton decode keeps ``min(seq_len, W)`` keys, one short (docs/contract.md §1,
docs/sglang-0.5.23-facts.md §11), so it is judged against the reference at window ``W - 1`` (status
``ok (at W-1)``), its extend at ``W`` when it agrees there, else at ``W - 1``; both errors are printed
per case (``CHECK`` lines), ``max_abs_err`` is the one it is judged by. A provider that disagrees is
WRONG and not timed. Probe cases (ragged lengths, ``W + 1 >= L``, ``W`` not a multiple of the page)
are checked only (status ``... checked only``).

Timing is the runner's (:func:`.runner.time_row`): the input sets are disjoint groups of requests of
one pool state, together over 4x the L2 on a GPU; each provider's whole ``RadixAttention.forward``
step (K/V write and attention; metadata built before) on every set is captured in a CUDA graph and
replayed, and the replayed output of the first set is checked again (``WRONG (under graph replay)``
when it differs); then eagerly. The same-bytes copy of each timed case (``copy_same_bytes``) gives
``pct_copy``. Rows (op ``sglang_backend``, case ``<decode|extend>-<shape>-B<batch>-<L<context> |
pre<prefix>-E<new> | ragged>-P<page>``) go through :func:`.runner.to_csv_rows` into the run's CSV.
The cases run in the driver's process: a provider that takes the CUDA context down ends the run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import math
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from .cases import SHAPES, Shape

OP = "sglang_backend"
PROVIDERS = ("triton_swa", "sglang_triton")
# SGLang 0.5.23's imports need stand-ins where torchvision or sgl_kernel do not import (a CPU torch,
# a GPU without SGLang's kernel wheel): the test tier's, from a checkout; an install has none.
STUBS = Path(__file__).resolve().parents[2] / "tests" / "integration" / "sglang_stubs.py"

MODELS = {
    s.name: s
    for s in (
        Shape("d128-w1023", 32, 8, 128, 1023),
        Shape("d256-w1023", 32, 8, 256, 1023),
        Shape("d128-w4095", 32, 8, 128, 4095),
        Shape("d256-w4095", 32, 8, 256, 4095),
    )
}
# --shape may also name the harness's sliding shapes without sinks
SLIDING_SHAPES = {**MODELS, **{n: s for n, s in SHAPES.items() if s.window_left >= 0 and not s.sinks and n != "tiny"}}
# Tiny shapes for the interpreter: W + 1 >= L, W not a multiple of the page, ragged lengths.
SMOKE_MODELS = (Shape("smoke-d16-w7", 4, 2, 16, 7), Shape("smoke-d32-w13", 4, 1, 32, 13))
# Probes (checked only): windows small enough that the one key SGLang's decode leaves out shows.
PROBE_MODELS = (Shape("probe-d128-w15", 32, 8, 128, 15), Shape("probe-d256-w37", 32, 8, 256, 37))
EXTEND_MODELS, EXTEND_PREFIX, EXTEND_NEW = ("d128-w1023", "d256-w4095"), 32768, 512


def _size(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 and n else str(n)


@dataclass(frozen=True)
class BackendCase:
    """One step of ``len(lens)`` requests after ``lens[b]`` tokens of history each: ``decode`` (one new
    token) or ``extend`` (``new`` tokens, a chunked prefill), at page size ``page_size``; a case that
    is not ``timed`` is checked only. What :func:`.runner.to_csv_rows` reads of a case: ``op``,
    ``id``, ``nbytes()``, ``flops()``."""

    kind: str
    shape: Shape
    lens: tuple
    page_size: int
    new: int = 1
    timed: bool = True
    dtype: str = "bfloat16"
    op = OP

    @property
    def batch(self) -> int:
        return len(self.lens)

    @property
    def id(self) -> str:
        if len(set(self.lens)) > 1:
            tag = "ragged"
        elif self.kind == "decode":
            tag = f"L{_size(self.lens[0] + 1)}"
        else:
            tag = f"pre{_size(self.lens[0])}-E{self.new}"
        return f"{self.kind}-{self.shape.name}-B{self.batch}-{tag}-P{self.page_size}"

    def q_positions(self) -> list:
        return [list(range(n, n + self.new)) for n in self.lens]

    def _keys_and_pairs(self) -> tuple[int, int]:
        w, keys, pairs = self.shape.window_left, 0, 0
        for pos in self.q_positions():
            keys += pos[-1] + 1 - max(0, pos[0] - w)
            pairs += sum(p + 1 - max(0, p - w) for p in pos)
        return keys, pairs

    def nbytes(self) -> int:
        """docs/contract.md §7: the fewest bytes (the window's K/V once, q, o, the new K/V written, one
        int32 index per key), at the window of docs/contract.md §1."""
        s, item = self.shape, torch.empty(0, dtype=getattr(torch, self.dtype)).element_size()
        keys, _ = self._keys_and_pairs()
        tokens = self.batch * self.new
        return keys * s.h * s.d * 2 * item + tokens * (2 * s.hq * s.d + 2 * s.h * s.d) * item + 4 * keys

    def flops(self) -> int:
        """4 * D * HQ per attended (query, key) pair."""
        return 4 * self._keys_and_pairs()[1] * self.shape.hq * self.shape.d


def catalog(shapes=None, batches=None, contexts=None, pages=None, quick=False, smoke=False, device="cuda") -> list[BackendCase]:
    """The cases, cheapest and most telling first: the probes (checked only; unless ``shapes``), decode
    over ``shapes`` x ``pages`` x ``contexts`` x ``batches``, then extend (``EXTEND_NEW`` tokens after a
    ``contexts`` prefix, 32k by default). ``smoke``: tiny shapes (float32 on a CPU: SGLang's Triton
    kernels give garbage on bf16 pools in Triton 3.6's interpreter, ~1e8; float32 agrees to 1e-7)."""
    dtype = "bfloat16" if device == "cuda" else "float32"
    case = lambda *a, **kw: BackendCase(*a, dtype=dtype, **kw)
    if smoke:
        cases = []
        for s in SMOKE_MODELS:
            w = s.window_left
            for page in pages or (1, 4):
                cases.append(case("decode", s, (5, w + 9, 3 * w + 2), page))
                cases.append(case("extend", s, (0, 6, 2 * w + 3), page, new=5, timed=False))
        return cases
    pages = pages or (1, 16)
    cases = []
    if not shapes:
        for s in PROBE_MODELS:
            w = s.window_left
            for page in pages:
                cases.append(case("decode", s, (1, w - 1, w, w + 1, 5 * w + 3, 200), page, timed=False))
                cases.append(case("extend", s, (0, 3, w + 2, 4 * w + 1), page, new=w + 6, timed=False))
    names = shapes or (EXTEND_MODELS if quick else list(MODELS))
    for s in (SLIDING_SHAPES[n] for n in names):
        for page in pages:
            for length in contexts or ((4096,) if quick else (4096, 32768)):
                cases += [case("decode", s, (length - 1,) * b, page) for b in batches or ((1, 64) if quick else (1, 8, 64))]
    for s in (SLIDING_SHAPES[n] for n in shapes or EXTEND_MODELS):
        for page in pages:
            for prefix in contexts or (EXTEND_PREFIX,):
                cases += [case("extend", s, (prefix,) * b, page, new=EXTEND_NEW) for b in batches or ((8,) if quick else (1, 8))]
    return cases


# ----- SGLang: importing it, its runtime, the runner both backends read ---------------------------------


def _install_stubs() -> list:
    """The test tier's stand-ins that SGLang's imports need here (``tests/integration/sglang_stubs.py``,
    loaded by path: tests/ is no package); none outside a checkout."""
    if not STUBS.is_file():
        return []
    spec = importlib.util.spec_from_file_location("_triton_swa_sglang_stubs", STUBS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.install()


def sglang_status() -> tuple[bool, str]:
    """Whether the op can run here, and what to say: SGLang's version and the stand-ins used, or why
    not. On a CPU, Triton's interpreter must be on before this (SGLang imports triton)."""
    if importlib.util.find_spec("sglang") is None:
        return False, "n/a: SGLang is not installed (pip install 'triton-swa[sglang]')"
    stubbed = _install_stubs()
    try:
        import sglang
        import sglang.srt.layers.attention.triton_backend  # noqa: F401
        import sglang.srt.mem_cache.swa_memory_pool  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - an SGLang that does not import here is the op's answer
        return False, f"n/a: SGLang does not import here ({type(exc).__name__}: {str(exc)[:200]})"
    return True, f"SGLang {getattr(sglang, '__version__', '?')}, stand-ins for {', '.join(stubbed) or 'nothing'}"


def publish_sglang_context(device: str) -> None:
    """SGLang's backends read ``get_exec()``, ``get_spec()``, ``get_parallel()``: a published
    ``ServerArgs`` (the defaults, ``--attention-backend triton``) stands in for a server's."""
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    reset_context()
    publish(ServerArgs(model_path="dummy", device=device, attention_backend="triton"), role="bench", ranks=SpawnRanks(world_rank=0))


class ModelConfig:
    """What SGLang's ``TritonAttnBackend`` reads off ``model_runner.model_config`` (MHA, one window)."""

    is_encoder_decoder = False
    is_draft_model = False
    linear_attn_registry_result = None

    def __init__(self, shape: Shape, context_len: int):
        from sglang.srt.configs.model_config import AttentionArch
        from transformers import PretrainedConfig

        self.attention_arch = AttentionArch.MHA
        self.hf_config = PretrainedConfig()
        self.head_dim = self.v_head_dim = self.swa_v_head_dim = shape.d
        self.context_len = context_len
        self._hq, self._h = shape.hq, shape.h

    def get_max_num_attention_heads(self):
        return self._hq

    def get_num_kv_heads(self, tp_size=1, dcp_size=1):
        return self._h


class Runner:
    """The model runner both backends are built from (SGLang's attribute names)."""

    def __init__(self, shape: Shape, pool, alloc, rtp, translator, page_size: int, device: str, dtype):
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.token_to_kv_pool, self.token_to_kv_pool_allocator, self.req_to_token_pool = pool, alloc, rtp
        self.kv_index_translator = translator
        self.sliding_window_size, self.page_size = shape.window_left, page_size
        self.is_draft_worker, self.spec_algorithm = False, SpeculativeAlgorithm.NONE
        self.device, self.gpu_id, self.dtype, self.kv_cache_dtype = device, 0, dtype, dtype
        self.model_config = ModelConfig(shape, rtp.req_to_token.shape[1])

    def decode_num_tokens_per_req(self, **kwargs):
        return 1


def _sglang_triton(runner):
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    return TritonAttnBackend(runner)


def _triton_swa(runner):
    from triton_swa.integrations.sglang import TritonSWASGLangBackend

    return TritonSWASGLangBackend(runner)


BACKENDS = {"sglang_triton": _sglang_triton, "triton_swa": _triton_swa}


# ----- the pool state and the step --------------------------------------------------------------------


@dataclass
class State:
    """SGLang's pools holding the history of ``lens[b]`` tokens of the request on row ``rows[b]``."""

    shape: Shape
    page_size: int
    device: str
    dtype: torch.dtype
    lens: list
    rows: list
    pool: object
    alloc: object
    rtp: object
    translator: object
    runner: object
    layer: object
    k_hist: list  # per request: the window's history K [n_b, H, D] (what the reference reads)
    v_hist: list
    drift: float  # fraction of the window's history whose SWA slot differs from its full slot


def requests(state: State, first: int, count: int) -> State:
    """Requests ``first .. first + count - 1`` of ``state`` (the same pools): one input set."""
    part = slice(first, first + count)
    return dataclasses.replace(state, lens=state.lens[part], rows=state.rows[part], k_hist=state.k_hist[part], v_hist=state.v_hist[part])


def _floor(x: int, page: int) -> int:
    return x // page * page


def build_state(shape: Shape, lens: list, page: int, device: str, dtype, seed: int, extra_per_req: int) -> State:
    """SGLang's pools with ``lens[b]`` history tokens per request, allocated in rounds by SGLang's
    allocator with ``free_swa`` of what leaves the window; only the window's K/V is written."""
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc, ReqToTokenPool
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    B, W = len(lens), shape.window_left
    chunk = max(page, _floor(2048, page)) if device == "cuda" else max(page, 8)
    slack = 8 * page + 16
    size = -(-(sum(lens) + B * (extra_per_req + page) + slack) // page) * page
    size_swa = -(-(B * (W + 2 * page + chunk + extra_per_req + page) + slack) // page) * page
    pool = SWAKVPool(
        size=size,
        size_swa=size_swa,
        page_size=page,
        dtype=dtype,
        head_num=1,
        head_dim=shape.d,
        swa_attention_layer_ids=[0],
        full_attention_layer_ids=[1],
        device=device,
        enable_memory_saver=False,
        swa_head_num=shape.h,
        swa_head_dim=shape.d,
        swa_v_head_dim=shape.d,
    )
    alloc = SWATokenToKVPoolAllocator(size, size_swa, page, dtype, device, pool, False)
    rtp = ReqToTokenPool(B + 1, max(lens) + extra_per_req + 1, device, False)
    rows = rtp.alloc_rows(B)
    translator = KVIndexTranslator(
        req_to_token=rtp.req_to_token, token_to_kv_pool_allocator=alloc, token_to_kv_pool=pool, page_size=page, device=device
    )
    # NaN everywhere in the sliding layer's SWA buffers: only the window's history is written below.
    k_buf, v_buf = pool.get_kv_buffer(0)
    k_buf.fill_(float("nan"))
    v_buf.fill_(float("nan"))

    # Offset the SWA slots against the full ones from the start: SGLang's SWA sub-allocator hands a few
    # pages to a holder outside this batch (as another request's live window would hold them).
    held = alloc.swa_attn_allocator.alloc(3 * page if page > 1 else 5)
    assert held is not None
    done = [0] * B
    freed = [0] * B
    while any(d < n for d, n in zip(done, lens)):
        take = [min(chunk, n - d) for d, n in zip(done, lens)]
        active = [b for b in range(B) if take[b] > 0]
        if page == 1:
            full = alloc.alloc(sum(take[b] for b in active))
        else:
            pre = torch.tensor([done[b] for b in active], dtype=torch.int64)
            seq = torch.tensor([done[b] + take[b] for b in active], dtype=torch.int64)
            last = torch.tensor(
                [int(rtp.req_to_token[rows[b], done[b] - 1]) if done[b] else -1 for b in active], dtype=torch.int64, device=device
            )
            full = alloc.alloc_extend(pre.to(device), pre, seq.to(device), seq, last, int((seq - pre).sum()))
        if full is None:
            raise RuntimeError(f"SGLang's allocator ran out (size {size}, size_swa {size_swa})")
        at = 0
        for b in active:
            rtp.req_to_token[rows[b], done[b] : done[b] + take[b]] = full[at : at + take[b]].to(torch.int32)
            at += take[b]
            done[b] += take[b]
        # SGLang's eviction: tokens older than the window of a decode after this round (whole pages).
        evict = []
        for b in range(B):
            upto = _floor(max(0, done[b] - W), page)
            if upto > freed[b]:
                evict.append(rtp.req_to_token[rows[b], freed[b] : upto].long())
                freed[b] = upto
        if evict:
            alloc.free_swa(torch.cat(evict))

    layer = RadixAttention(shape.hq, shape.d, shape.d**-0.5, shape.h, 0, sliding_window_size=W)
    g = torch.Generator(device=device).manual_seed(seed)
    k_hist, v_hist, same, total = [], [], 0, 0
    for b in range(B):
        # the decode after this history attends positions [lens - W, lens] (the new token is lens)
        start = max(0, lens[b] - W)
        full = rtp.req_to_token[rows[b], start : lens[b]].long()
        swa = pool.translate_loc_from_full_to_swa(full)
        if bool((swa <= 0).any()):
            raise RuntimeError("a token inside the window has no SWA slot: the eviction above is wrong")
        same += int((swa == full).sum())
        total += full.numel()
        k = torch.randn(full.numel(), shape.h, shape.d, generator=g, device=device).to(dtype)
        v = torch.randn(full.numel(), shape.h, shape.d, generator=g, device=device).to(dtype)
        pool.set_kv_buffer(layer, KVWriteLoc(full, swa_loc=swa), k.clone(), v.clone())
        k_hist.append(k)
        v_hist.append(v)
    runner = Runner(shape, pool, alloc, rtp, translator, page, device, dtype)
    drift = 1.0 - same / max(total, 1)
    return State(shape, page, device, dtype, list(lens), rows, pool, alloc, rtp, translator, runner, layer, k_hist, v_hist, drift)


@dataclass
class Step:
    """One forward step of a state's requests: SGLang's ``ForwardBatch`` and fresh q / k / v."""

    state: State
    batch: object
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor


def _random_qkv(st: State, tokens: int, seed: int) -> tuple:
    g = torch.Generator(device=st.device).manual_seed(seed)
    s = st.shape
    return tuple(torch.randn(tokens, heads * s.d, generator=g, device=st.device).to(st.dtype) for heads in (s.hq, s.h, s.h))


def decode_step(st: State, seed: int) -> Step:
    """A DECODE step of every request: SGLang's ForwardBatch (its own plan bound), the new token's slot
    from SGLang's allocator."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    dev, B = st.device, len(st.lens)
    seq_cpu = torch.tensor([n + 1 for n in st.lens], dtype=torch.int64)
    if st.page_size == 1:
        loc = st.alloc.alloc(B)
    else:
        last = torch.stack([st.rtp.req_to_token[r, n - 1].long() for r, n in zip(st.rows, st.lens)])
        loc = st.alloc.alloc_decode(seq_cpu.to(dev), seq_cpu, last)
    for r, n, slot in zip(st.rows, st.lens, loc.tolist()):
        st.rtp.req_to_token[r, n] = slot
    fb = ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=B,
        input_ids=torch.zeros(B, dtype=torch.long, device=dev),
        req_pool_indices=torch.tensor(st.rows, device=dev),
        seq_lens=seq_cpu.to(dev),
        out_cache_loc=loc,
        seq_lens_sum=int(seq_cpu.sum()),
        seq_lens_cpu=seq_cpu,
        positions=torch.tensor(st.lens, device=dev),
        spec_algorithm=SpeculativeAlgorithm.NONE,
    )
    st.translator.bind_own_plan(fb)
    return Step(st, fb, *_random_qkv(st, B, seed))


def extend_step(st: State, new: int, seed: int) -> Step:
    """An EXTEND step (chunked prefill): ``new`` tokens per request after its history."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    dev, B = st.device, len(st.lens)
    pre = torch.tensor(st.lens, dtype=torch.int64)
    seq = pre + new
    if st.page_size == 1:
        loc = st.alloc.alloc(B * new)
    else:
        last = torch.tensor(
            [int(st.rtp.req_to_token[r, n - 1]) if n else -1 for r, n in zip(st.rows, st.lens)], dtype=torch.int64, device=dev
        )
        loc = st.alloc.alloc_extend(pre.to(dev), pre, seq.to(dev), seq, last, B * new)
    for i, (r, n) in enumerate(zip(st.rows, st.lens)):
        st.rtp.req_to_token[r, n : n + new] = loc[i * new : (i + 1) * new].to(torch.int32)
    fb = ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        batch_size=B,
        input_ids=torch.zeros(B * new, dtype=torch.long, device=dev),
        req_pool_indices=torch.tensor(st.rows, device=dev),
        seq_lens=seq.to(dev),
        out_cache_loc=loc,
        seq_lens_sum=int(seq.sum()),
        seq_lens_cpu=seq,
        extend_prefix_lens=pre.to(dev),
        extend_prefix_lens_cpu=pre.tolist(),
        extend_seq_lens=torch.full((B,), new, device=dev),
        extend_seq_lens_cpu=[new] * B,
        extend_num_tokens=B * new,
        positions=torch.cat([torch.arange(n, n + new) for n in st.lens]).to(dev),
        spec_algorithm=SpeculativeAlgorithm.NONE,
    )
    st.translator.bind_own_plan(fb)
    return Step(st, fb, *_random_qkv(st, B * new, seed))


def reference(step: Step, q_positions: list, window_left: int) -> torch.Tensor:
    """float64 reference of every query: the window's history (as written) plus this step's K/V."""
    import triton_swa_reference as ref

    st, s = step.state, step.state.shape
    out, at = [], 0
    for b, pos in enumerate(q_positions):
        t = len(pos)
        n_hist = st.k_hist[b].shape[0]
        k = torch.cat([st.k_hist[b], step.k[at : at + t].view(t, s.h, s.d)])
        v = torch.cat([st.v_hist[b], step.v[at : at + t].view(t, s.h, s.d)])
        k_pos = torch.arange(pos[0] - n_hist, pos[-1] + 1, device=step.q.device)
        mask = ref.window_mask(torch.tensor(pos, device=step.q.device), k_pos, window_left)
        out.append(ref.attention(step.q[at : at + t].view(t, s.hq, s.d), k, v, mask, sm_scale=st.layer.scaling))
        at += t
    return torch.cat(out)


def forward(backend, step: Step, poison: bool = False):
    """``RadixAttention.forward`` under SGLang's forward context (metadata built by the caller)."""
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    s, q = step.state.shape, step.q
    if poison:
        # A freed NaN block of the output's size: the caching allocator hands it to empty_like.
        torch.full((q.shape[0], s.hq * s.d), float("nan"), dtype=q.dtype, device=q.device)
    with forward_context(ForwardContext(attn_backend=backend)):
        return step.state.layer(q, step.k, step.v, step.batch)


# ----- the check --------------------------------------------------------------------------------------


@dataclass
class Verdict:
    err_w: float  # max abs error against the reference at window W (docs/contract.md §1)
    err_w1: float  # ... and at window W - 1 (SGLang's Triton decode keeps one key fewer)
    ok: bool
    at_w_minus_1: bool  # judged at W - 1
    why: str = ""

    @property
    def error(self) -> float:
        return self.err_w1 if self.at_w_minus_1 else self.err_w


def _close(got, want, name: str) -> tuple[bool, str]:
    from triton_swa.testing import assert_close

    try:
        assert_close(got, want, name=name)
        return True, ""
    except AssertionError as exc:
        return False, str(exc).split("\n")[0][:300]


def judge(provider: str, case: BackendCase, out, want: dict) -> Verdict:
    """Both errors (``want``: the references by ``at W - 1``); triton_swa is judged at W, sglang_triton's
    decode at W - 1 (its documented one-short window), its extend at W when it agrees there, else at W - 1."""
    s = case.shape
    got = out.view(-1, s.hq, s.d)
    finite = bool(torch.isfinite(got).all())
    err = {w1: float((got.double() - want[w1]).abs().max()) if finite else math.nan for w1 in (False, True)}
    ok_w, why_w = _close(got, want[False], f"{provider} vs reference at W={s.window_left}")
    ok_w1, why_w1 = _close(got, want[True], f"{provider} vs reference at W-1={s.window_left - 1}")
    at_w1 = provider == "sglang_triton" and (case.kind == "decode" or not ok_w)
    ok = ok_w1 if at_w1 else ok_w
    return Verdict(err[False], err[True], ok, at_w1, "" if ok else (why_w1 if at_w1 else why_w))


@contextlib.contextmanager
def _poisoned():
    """triton-swa's own buffers start as NaN (``TRITON_SWA_POISON=1``) inside the block."""
    from triton_swa.runtime import poison

    before = os.environ.get("TRITON_SWA_POISON")
    os.environ["TRITON_SWA_POISON"] = "1"
    poison.refresh_poison_env()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TRITON_SWA_POISON")
        else:
            os.environ["TRITON_SWA_POISON"] = before
        poison.refresh_poison_env()


# ----- the run ----------------------------------------------------------------------------------------


def _ok(notes: list) -> str:
    return "ok" + (f" ({', '.join(notes)})" if notes else "")


def _check_then_time(row: dict, provider: str, case: BackendCase, steps: list, want: dict, device: str) -> Verdict:
    """``provider`` checked on ``steps[0]``, then (a timed case that passed) timed on every step."""
    from .runner import time_row

    backends = [BACKENDS[provider](step.state.runner) for step in steps]
    with _poisoned():
        backends[0].init_forward_metadata(steps[0].batch)
        verdict = judge(provider, case, forward(backends[0], steps[0], poison=True), want)
    row["max_abs_err"] = verdict.error
    notes = ["at W-1"] if verdict.at_w_minus_1 else []
    if not verdict.ok:
        row["status"] = "WRONG"
        return verdict
    if not case.timed:
        row["status"] = _ok([*notes, "checked only"])
        return verdict
    for backend, step in zip(backends, steps):
        backend.init_forward_metadata(step.batch)
    captured = {}

    def first():
        out = forward(backends[0], steps[0])
        if device == "cuda" and torch.cuda.is_current_stream_capturing():
            captured["out"] = out  # the graph's own output: every replay writes it

    calls = [first, *(lambda b=b, s=s: forward(b, s) for b, s in zip(backends[1:], steps[1:]))]
    how = time_row(row, calls, device)
    if how == "graph":
        # the replayed graph must give what was checked (a replay that keeps stale state would not)
        ok, why = _close(captured["out"].view(-1, case.shape.hq, case.shape.d), want[verdict.at_w_minus_1], f"{provider} replayed")
        if not ok:
            row.update(status="WRONG (under graph replay)", us=None, eager_us=None)
            return Verdict(verdict.err_w, verdict.err_w1, False, verdict.at_w_minus_1, why)
    row["status"] = _ok(notes if how == "graph" else [*notes, how])
    return verdict


def run_case(case: BackendCase, providers: list, device: str) -> list[dict]:
    """The runner's rows of one case (``case``, ``provider``, ``status``, ``us``, ``eager_us``,
    ``max_abs_err``): each provider checked, then timed; then the same-bytes copy (timed cases)."""
    from . import providers as P
    from .runner import input_set_count, time_row

    sets = input_set_count(case.nbytes(), device) if case.timed else 1
    seed = zlib.crc32(case.id.encode())
    extra = case.new + 1
    state = build_state(case.shape, list(case.lens) * sets, case.page_size, device, getattr(torch, case.dtype), seed, extra)
    B = case.batch
    make = (lambda st, i: decode_step(st, seed + i)) if case.kind == "decode" else (lambda st, i: extend_step(st, case.new, seed + i))
    steps = [make(requests(state, i * B, B), i) for i in range(sets)]
    w = case.shape.window_left
    want = {False: reference(steps[0], case.q_positions(), w), True: reference(steps[0], case.q_positions(), w - 1)}
    rows, verdicts = [], {}
    for provider in providers:
        row = dict(case=case.id, provider=provider, status="ok", max_abs_err=None, us=None)
        try:
            verdicts[provider] = _check_then_time(row, provider, case, steps, want, device)
        except Exception as exc:  # noqa: BLE001 - a provider that cannot run the case is reported, not hidden
            row["status"] = f"ERROR {_first_line(exc)[:120]}"
            verdicts[provider] = Verdict(math.nan, math.nan, False, False, _first_line(exc)[:300])
        rows.append(row)
    statuses = {r["provider"]: r["status"] for r in rows}
    print(
        f"CHECK {case.id:<48} sets {sets:>2} drift {100 * state.drift:5.1f}%  "
        + "  ".join(f"{p}: {statuses[p]} err(W) {v.err_w:.2e} err(W-1) {v.err_w1:.2e}" for p, v in verdicts.items()),
        flush=True,
    )
    for p, v in verdicts.items():
        if v.why:
            print(f"    {p}: {v.why}", flush=True)
    if case.timed:
        copy = dict(case=case.id, provider="copy_same_bytes", status="ok", us=None)
        how = time_row(copy, [P.prepare("copy_same_bytes", case, dict(seq_lens=s.batch.seq_lens)) for s in steps], device)
        copy["status"] = _ok([] if how == "graph" else [how])
        rows.append(copy)
    return rows


def _first_line(exc: Exception) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"


def run(cases: list, providers: list, device: str) -> list[dict]:
    """Every case's rows (:func:`run_case`), in this process; a case whose inputs cannot be built gets
    an ``ERROR (inputs)`` row per provider."""
    publish_sglang_context(device)
    rows = []
    for case in cases:
        try:
            rows += run_case(case, providers, device)
        except Exception as exc:  # noqa: BLE001 - SGLang's allocator or pools refused the case: its result
            print(f"CHECK {case.id}: inputs failed: {_first_line(exc)[:300]}", flush=True)
            rows += [dict(case=case.id, provider=p, status=f"ERROR (inputs) {_first_line(exc)[:120]}", us=None) for p in providers]
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows
