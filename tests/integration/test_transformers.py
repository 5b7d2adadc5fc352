"""transformers tier: tiny random Hugging Face models run through the ``triton_swa`` attention function.

Each model (seeded random weights, float32) serves two requests over triton-swa's paged pools: a
packed prefill of both (one only partly: its second chunk is a chunked prefill over the cached
prefix), decode steps, a TARGET_VERIFY of chain drafts (some accepted, the rest freed), and more
decode steps. The window is small, out-of-window SWA slots are freed after every step as an engine
would, the SWA free list is shuffled (SWA slots differ from full slots), and before every step
every pool slot that no layer may read is set to NaN. Every step's logits must match the same model
run with ``attn_implementation="eager"`` on each request alone.

Two controls show the comparison can fail: the window translated off by one (``W = S`` instead of
``S - 1``), and sliding layers reading SWA buffers at full slots (no translation, the old rule).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install triton-swa[demo])")

from triton_swa.integrations import transformers as tswa  # noqa: E402
from triton_swa.testing import assert_close, legacy_backend  # noqa: E402

pytestmark = pytest.mark.interpreter

VOCAB = 48
# the model and its pools on the GPU when there is one (kernels compiled), else the CPU (the interpreter)
DEV = "cuda" if torch.cuda.is_available() else "cpu"
ATOL = 1e-4


def _gemma2():
    cfg = transformers.Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=4,
        attn_logit_softcapping=2.0,
        layer_types=["sliding_attention", "full_attention"],
        initializer_range=0.3,
    )
    return transformers.Gemma2ForCausalLM(cfg)


def _gpt_oss():
    cfg = transformers.GptOssConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=5,
        num_local_experts=2,
        num_experts_per_tok=1,
        layer_types=["sliding_attention", "full_attention"],
        initializer_range=0.3,
    )
    model = transformers.GptOssForCausalLM(cfg)
    for layer in model.model.layers:
        torch.nn.init.normal_(layer.self_attn.sinks, std=1.0)  # sinks that matter
    return model


def _gemma4():
    # sliding layers: 2 KV heads of dim 8; full layers: 1 KV head of dim 16 (k = v); layers 2, 3 share 0's and 1's K/V
    cfg = transformers.Gemma4TextConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        global_head_dim=16,
        attention_k_eq_v=True,
        num_global_key_value_heads=1,
        sliding_window=4,
        num_kv_shared_layers=2,
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=VOCAB,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        initializer_range=0.3,
    )
    return transformers.Gemma4ForCausalLM(cfg)


def _mistral():
    # every layer slides (no layer_types): the pools have no full layer
    cfg = transformers.MistralConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=3,
        initializer_range=0.3,
    )
    return transformers.MistralForCausalLM(cfg)


def _gemma3():
    cfg = transformers.Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        initializer_range=0.3,
    )
    return transformers.Gemma3ForCausalLM(cfg)


def _ministral():
    cfg = transformers.MinistralConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        initializer_range=0.3,
    )
    return transformers.MinistralForCausalLM(cfg)


def _gemma3n():
    # Gemma 3n names the layer a KV-shared one reads (kv_shared_layer_index)
    cfg = transformers.Gemma3nTextConfig(
        vocab_size=VOCAB,
        vocab_size_per_layer_input=VOCAB,
        hidden_size=32,
        hidden_size_per_layer_input=8,
        intermediate_size=48,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=4,
        num_kv_shared_layers=2,
        laurel_rank=4,
        altup_num_inputs=2,
        activation_sparsity_pattern=[0.0] * 4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        initializer_range=0.3,
    )
    return transformers.Gemma3nForCausalLM(cfg)


MODELS = {
    "gemma2": _gemma2,
    "gpt_oss": _gpt_oss,
    "gemma4": _gemma4,
    "mistral": _mistral,
    "gemma3": _gemma3,
    "ministral": _ministral,
    "gemma3n": _gemma3n,
}
# Models whose attention adds nothing the default set lacks run only on request (CPU time of the tier).
ALL_MODELS = bool(os.environ.get("TRITON_SWA_HF_ALL_MODELS"))
_more = pytest.mark.skipif(not ALL_MODELS, reason="set TRITON_SWA_HF_ALL_MODELS=1 to run it")


def make_model(name: str):
    torch.manual_seed(0)
    return MODELS[name]().eval().to(DEV)


@dataclass
class Req:
    row: int
    tokens: torch.Tensor  # every committed token of the whole run
    rejected: torch.Tensor  # the drafts the verify step rejects
    len: int = 0
    evicted: int = 0


@dataclass
class Scenario:
    """New tokens per request and step: a packed prefill, then an EXTEND of both over their cached
    prefixes (the rest of request 1's prompt, a chunked prefill, beside request 0's next token), decode
    steps, a verify of ``num_draft`` chain drafts of which ``accepted[i]`` are kept, decode steps."""

    prefill: list[int] = field(default_factory=lambda: [9, 5])
    chunk: list[int] = field(default_factory=lambda: [1, 3])
    decode_before: int = 2
    num_draft: int = 3
    accepted: list[int] = field(default_factory=lambda: [2, 0])
    decode_after: int = 1

    def committed_len(self, i: int) -> int:
        return self.prefill[i] + self.chunk[i] + self.decode_before + self.accepted[i] + self.decode_after


SCENARIO = Scenario()


def eager_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    model.set_attn_implementation("eager")
    with torch.no_grad():
        return model(input_ids=tokens[None], use_cache=False).logits[0]


def poison(kv, reqs):
    """NaN in every pool slot no layer may read in the coming step (the dummy slot 0 included)."""
    rtt, mapping, w = kv.req_to_token_pool.req_to_token, kv.allocator.full_to_swa_index_mapping, kv.window_left
    full_live = [rtt[r.row, : r.len].long() for r in reqs]
    swa_live = [mapping[f[max(0, r.len - w) :]] for f, r in zip(full_live, reqs)]
    for sub, live in ((kv.pool.full_kv_pool, full_live), (kv.pool.swa_kv_pool, swa_live)):
        if sub is None:
            continue
        dead = torch.ones(sub.k_buffer[0].shape[0], dtype=torch.bool, device=sub.k_buffer[0].device)
        dead[torch.cat(live)] = False
        for buf in sub.k_buffer + sub.v_buffer:
            buf[dead] = float("nan")


def serve(model, kv, sc: Scenario, seed: int = 1, atol: float = ATOL):
    """Run the scenario, checking every step's logits against eager as it goes.

    Returns the requests (their rows, lengths and eviction marks) and the largest error seen.
    """
    g = torch.Generator().manual_seed(seed)
    rows = kv.req_to_token_pool.alloc(3)[1:]  # row 1 stays unused, row 0 is padding
    reqs = [
        Req(
            r,
            torch.randint(0, VOCAB, (sc.committed_len(i),), generator=g).to(DEV),
            torch.randint(0, VOCAB, (sc.num_draft - sc.accepted[i],), generator=g).to(DEV),
        )
        for i, r in enumerate(rows)
    ]
    want = [eager_logits(model, r.tokens) for r in reqs]
    worst = [0.0]

    def run(name, step, ids, expected):
        model.set_attn_implementation(tswa.NAME)
        with torch.no_grad():
            logits = model(input_ids=ids[None], **step.model_kwargs()).logits[0]
        assert_close(logits, expected.double(), atol=atol, rtol=0.0, name=name)
        worst[0] = max(worst[0], float((logits.double() - expected.double()).abs().max()))

    def evict_all():
        for r in reqs:
            r.evicted = kv.evict(r.row, r.len, r.evicted)

    def extend(name, active, counts):
        poison(kv, reqs)
        step = kv.extend([reqs[i].row for i in active], [reqs[i].len for i in active], counts)
        ids = torch.cat([reqs[i].tokens[reqs[i].len : reqs[i].len + m] for i, m in zip(active, counts)])
        run(name, step, ids, torch.cat([want[i][reqs[i].len : reqs[i].len + m] for i, m in zip(active, counts)]))
        for i, m in zip(active, counts):
            reqs[i].len += m
        evict_all()

    def decode(name):
        poison(kv, reqs)
        step = kv.decode([r.row for r in reqs], [r.len for r in reqs])
        ids = torch.stack([r.tokens[r.len] for r in reqs])
        run(name, step, ids, torch.stack([w[r.len] for w, r in zip(want, reqs)]))
        for r in reqs:
            r.len += 1
        evict_all()

    extend("prefill", [0, 1], sc.prefill)
    extend("chunked prefill", [0, 1], sc.chunk)
    for s in range(sc.decode_before):
        decode(f"decode {s}")

    # verify: each request's accepted drafts (its next committed tokens), then rejected ones
    n = sc.num_draft
    drafts = [torch.cat([r.tokens[r.len : r.len + a], r.rejected]) for r, a in zip(reqs, sc.accepted)]
    expected = torch.cat([eager_logits(model, torch.cat([r.tokens[: r.len], d]))[r.len :] for r, d in zip(reqs, drafts)])
    poison(kv, reqs)
    step = kv.verify([r.row for r in reqs], [r.len for r in reqs], n)
    run("verify", step, torch.cat(drafts), expected)
    for r, a in zip(reqs, sc.accepted):
        kv.free(r.row, r.len + a, r.len + n)  # the rejected drafts
        r.len += a
    evict_all()

    for s in range(sc.decode_after):
        decode(f"decode {sc.decode_before + s} (after verify)")
    assert all(r.len == sc.committed_len(i) for i, r in enumerate(reqs))
    return reqs, worst[0]


def build(model, page_size, size_swa=32):
    kv = tswa.build_paged_kv(
        model, size=64, size_swa=size_swa, page_size=page_size, max_num_reqs=3, max_context_len=32, dtype=torch.float32, device=DEV
    )
    kv.allocator.swa_attn_allocator.shuffle_free_list(torch.Generator().manual_seed(7))
    return kv


@pytest.fixture(autouse=True, scope="module")
def _registered():
    tswa.register()


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    # The interpreter runs the kernels in numpy while the model runs in torch: with xdist's workers on
    # every core, torch's second intra-op thread only spins (tiny linears took milliseconds).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize(
    "name, page_size",
    [
        pytest.param("gemma2", 1, id="gemma2-softcap-P1"),
        pytest.param("gpt_oss", 4, id="gpt_oss-sinks-P4"),
        pytest.param("gemma4", 2, id="gemma4-kvshared-P2"),
        pytest.param("mistral", 1, id="mistral-allsliding-P1"),
        pytest.param("gemma3", 2, id="gemma3-P2", marks=_more),
        pytest.param("ministral", 1, id="ministral-P1", marks=_more),
        pytest.param("gemma3n", 1, id="gemma3n-kvshared-P1", marks=_more),
    ],
)
def test_steps_match_eager(name, page_size):
    model = make_model(name)
    kv = build(model, page_size)
    reqs, worst = serve(model, kv, SCENARIO)
    print(f"{name}: max |logits - eager| = {worst:.2e}")
    # the run exercised what it claims: tokens were evicted, and live SWA slots differ from their full slots
    assert all(r.evicted > 0 for r in reqs), [r.evicted for r in reqs]
    rtt, mapping = kv.req_to_token_pool.req_to_token, kv.allocator.full_to_swa_index_mapping
    full = torch.cat([rtt[r.row, r.evicted : r.len].long() for r in reqs])
    assert bool((mapping[full] > 0).all()) and bool((mapping[full] != full).any())


def test_layer_specs_from_modules():
    specs = {s.layer_id: s for s in tswa.model_layer_specs(make_model("gemma4"))}
    assert [(s.window_left, s.num_kv_heads, s.head_dim, s.kv_shared_layer_id) for s in specs.values()] == [
        (3, 2, 8, None),
        (-1, 1, 16, None),
        (3, 2, 8, 0),
        (-1, 1, 16, 1),
    ]
    assert [s.window_left for s in tswa.model_layer_specs(make_model("mistral"))] == [2, 2]
    assert tswa.window_left_from_hf(None) == -1 and tswa.window_left_from_hf(1) == 0


def test_off_by_one_window_is_caught(monkeypatch):
    model = make_model("gemma2")
    monkeypatch.setattr(tswa, "window_left_from_hf", lambda s: -1 if s is None else s)  # W = S: one key too many
    with pytest.raises(AssertionError, match="prefill"):
        serve(model, build(model, 1), SCENARIO)


class _NotTheAllocator:
    pass


def test_untranslated_sliding_reads_are_caught():
    model = make_model("gemma2")
    # SWA buffers as large as the full ones, so that reading them at full slots stays in bounds
    kv = build(model, 1, size_swa=64)
    kv.backend = legacy_backend(kv.model_runner, _NotTheAllocator)
    assert not kv.backend.use_sliding_window_kv_pool
    # the prefill reads only its own new K/V; the chunked prefill is the first read of the pools
    with pytest.raises(AssertionError, match="chunked prefill"):
        serve(model, kv, SCENARIO)


@pytest.mark.parametrize(
    "name, dropped", [pytest.param("gemma2", "softcap", id="gemma2-no-softcap"), pytest.param("gpt_oss", "s_aux", id="gpt_oss-no-sinks")]
)
def test_dropped_softcap_or_sinks_are_caught(name, dropped, monkeypatch):
    def without(module, *args, **kwargs):
        kwargs[dropped] = None
        return tswa.triton_swa_attention_forward(module, *args, **kwargs)

    monkeypatch.setitem(transformers.AttentionInterface._global_mapping, tswa.NAME, without)
    model = make_model(name)
    with pytest.raises(AssertionError, match="prefill"):
        serve(model, build(model, 1), SCENARIO)


def test_bad_calls_raise():
    model = make_model("gemma2")
    kv = build(model, 1)
    model.set_attn_implementation(tswa.NAME)
    ids = torch.randint(0, VOCAB, (1, 4), device=DEV)
    with torch.no_grad():
        with pytest.raises(ValueError, match="triton_swa_step"):
            model(input_ids=ids, use_cache=False)
        row = kv.req_to_token_pool.alloc(1)[0]
        step = kv.extend([row], [0], [4])
        with pytest.raises(ValueError, match="padding mask"):
            model(input_ids=ids, attention_mask=torch.tensor([[0, 1, 1, 1]], device=DEV), **step.model_kwargs())
        # an HF cache that already holds this request's keys would hand the attention more keys than queries
        cache = transformers.DynamicCache(config=model.config)
        model(input_ids=ids, position_ids=step.position_ids, past_key_values=cache, triton_swa_step=step)
        step = kv.decode([row], [4])
        with pytest.raises(ValueError, match="use_cache=False"):
            model(input_ids=ids[:, :1], position_ids=step.position_ids, past_key_values=cache, triton_swa_step=step)
