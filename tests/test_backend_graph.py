"""CUDA-graph metadata of the backend: fixed buffers, fresh SpecInfo per replay, replay equals eager.

On the CPU a "graph" is emulated exactly: the kernels of a captured graph keep the tensors (and
host scalars) they were launched with at capture, and replay only refills those tensors in place.
So the layers run on the metadata object built at capture, after the replay call has refilled it.
A tensor that the replay call replaces instead of refilling (the old ``q_positions`` taken from
``spec_info``) is then seen stale, as on the GPU.
"""

from __future__ import annotations

import pytest
import torch

import triton_swa_reference as ref
from tests.test_backend import backend_setup
from triton_swa.backend import LayerIndices, TritonSWAAttnBackend
from triton_swa.engine import AttentionLayer, ForwardBatch, ForwardMode, ModelRunner, SpecInfo
from triton_swa.testing import assert_close, make_pool_state

HQ = 4
W = 3
N_DRAFT = 4
VERIFY = ForwardMode.TARGET_VERIFY
DRAFT_EXTEND = ForwardMode.DRAFT_EXTEND_V2

# Trees over 4 drafts: parent of each draft (-1: child of the last committed token).
TREE_A = [-1, 0, 0, 1]
TREE_B = [-1, 0, 1, 0]


def tree_spec(parents_per_request, prefix_lens, device, *, causal=True, with_mask=True):
    """SpecInfo of tree drafts: mask row i sees its ancestors and itself; position = prefix + depth."""
    masks, positions = [], []
    for parents, p in zip(parents_per_request, prefix_lens):
        n = len(parents)
        mask = torch.zeros(n, n, dtype=torch.bool)
        depth = []
        for i, par in enumerate(parents):
            mask[i, i] = True
            d, j = 0, par
            while j >= 0:
                mask[i, j] = True
                d, j = d + 1, parents[j]
            depth.append(d)
        masks.append(mask.reshape(-1))
        positions.append(p + torch.tensor(depth))
    return SpecInfo(
        N_DRAFT, custom_mask=torch.cat(masks).to(device) if with_mask else None, positions=torch.cat(positions).to(device), causal=causal
    )


def setup(device, page_size, seq_lens=(9, 21, 14), dtype=torch.float32):
    """Three requests mid-verify (4 drafts each allocated), SWA and full slots shuffled and evicted."""
    # full layer: 4 query heads on 1 KV head, one program per request, so the CPU's 4 "SMs" split its prefix
    return backend_setup(device, page_size, seq_lens, W, dtype=dtype, new_tokens=N_DRAFT)


def verify_batch(state, which, spec, device):
    rows = state.req_pool_indices()[which]
    prefix = state.prefix_lens()[which]
    loc = torch.cat([state.req_to_token[int(r), int(p) : int(p) + N_DRAFT].long() for r, p in zip(rows, prefix)])
    return ForwardBatch(VERIFY, len(which), rows, prefix, loc, seq_lens_cpu=prefix.cpu(), spec_info=spec)


def inputs(layers, tokens, seed, device, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    out = []
    for layer in layers:
        q = torch.randn(tokens, HQ, layer.head_dim, generator=g).to(device, dtype)
        k = torch.randn(tokens, layer.tp_k_head_num, layer.head_dim, generator=g).to(device, dtype)
        v = torch.randn(tokens, layer.tp_k_head_num, layer.v_head_dim, generator=g).to(device, dtype)
        out.append((q, k, v))
    return out


def reference(state, layer, batch, q, k, v):
    """Float64 extend attention of the verify step, read straight from the pools."""
    sliding = layer.sliding_window_size >= 0
    pool = state.kv_pool.swa_kv_pool if sliding else state.kv_pool.full_kv_pool
    kb, vb = pool.get_kv_buffer(0)
    mapping = state.mapping if sliding else None
    kv_indptr, kv_indices, _ = ref.extend_window_indices(
        state.req_to_token, batch.req_pool_indices, batch.seq_lens, layer.sliding_window_size, mapping
    )
    bs, spec = batch.batch_size, batch.spec_info
    qo = torch.arange(0, (bs + 1) * N_DRAFT, N_DRAFT)
    mask_indptr = torch.arange(0, bs * N_DRAFT * N_DRAFT, N_DRAFT * N_DRAFT)
    return ref.extend_attention(
        q,
        k,
        v,
        kb,
        vb,
        qo,
        kv_indptr,
        kv_indices,
        batch.seq_lens,
        window_left=layer.sliding_window_size,
        sm_scale=layer.scaling,
        causal=spec.causal,
        custom_mask=spec.custom_mask,
        mask_indptr=mask_indptr if spec.custom_mask is not None else None,
        q_positions=spec.positions,
    )


def tensors(meta):
    """Every tensor of a ForwardMetadata (and its LayerIndices), by field name."""
    out = {}
    for name, value in vars(meta).items():
        if isinstance(value, torch.Tensor):
            out[name] = value
        elif isinstance(value, LayerIndices):
            out.update({f"{name}.{k}": t for k, t in vars(value).items() if isinstance(t, torch.Tensor)})
    return out


def run_layers(backend, layers, data, batch):
    return [
        backend.forward_extend(q.reshape(len(q), -1), k, v, layer, batch, save_kv_cache=False) for layer, (q, k, v) in zip(layers, data)
    ]


@pytest.mark.interpreter
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("kind", ["tree", "chain-positions", "non-causal"])
def test_verify_replay_with_fresh_spec_info_equals_eager_and_reference(device, page_size, kind):
    """Capture with one batch and SpecInfo, replay with another batch and a FRESH SpecInfo (other
    positions, other tree): the captured metadata, refilled by the replay call, gives eager's output
    for the new SpecInfo bit for bit, and the float64 reference's.

    Before the fix the graph read the capture-time positions (``q_positions`` was the capture
    SpecInfo's own tensor), and its full layers took another split count than eager (the launcher
    sized the splits from the graph's larger ``kv_indices`` buffer)."""
    state, backend, layers = setup(device, page_size)
    backend.init_cuda_graph_state(max_bs=4, max_num_tokens=4 * N_DRAFT)
    with_mask, causal = kind == "tree", kind != "non-causal"
    trees_cap = [TREE_A, TREE_B] if kind == "tree" else [[-1, 0, 1, 2]] * 2
    trees_new = [TREE_B, TREE_A] if kind == "tree" else [[-1, 0, 1, 2]] * 2
    cap_which, new_which = torch.tensor([0, 1]), torch.tensor([2, 0])
    cap_batch = verify_batch(state, cap_which, None, device)
    cap_spec = tree_spec(trees_cap, cap_batch.seq_lens.tolist(), device, causal=causal, with_mask=with_mask)
    backend.init_forward_metadata_capture_cuda_graph(2, 2 * N_DRAFT, cap_batch.req_pool_indices, cap_batch.seq_lens, None, VERIFY, cap_spec)
    captured = backend.forward_metadata
    ptrs = {name: t.data_ptr() for name, t in tensors(captured).items()}
    run_layers(backend, layers, inputs(layers, 2 * N_DRAFT, 0, device), cap_batch)  # the "captured" run

    new_batch = verify_batch(state, new_which, None, device)
    new_spec = tree_spec(trees_new, new_batch.seq_lens.tolist(), device, causal=causal, with_mask=with_mask)
    new_batch.spec_info = new_spec
    backend.init_forward_metadata_replay_cuda_graph(
        2, new_batch.req_pool_indices, new_batch.seq_lens, int(new_batch.seq_lens.sum()), None, VERIFY, new_spec, new_batch.seq_lens_cpu
    )
    replayed = backend.forward_metadata
    assert {name: t.data_ptr() for name, t in tensors(replayed).items()} == ptrs, "replay moved a graph buffer"
    backend.forward_metadata = captured  # what the captured kernels read
    data = inputs(layers, 2 * N_DRAFT, 1, device)
    graph_out = run_layers(backend, layers, data, new_batch)

    backend.init_forward_metadata(new_batch)
    eager_out = run_layers(backend, layers, data, new_batch)
    for layer, (q, k, v), got, eager in zip(layers, data, graph_out, eager_out):
        assert not torch.isnan(got).any()
        assert torch.equal(got, eager), f"layer {layer.layer_id}: replay differs from eager (max {float((got - eager).abs().max()):.3e})"
        want = reference(state, layer, new_batch, q, k, v).reshape(got.shape)
        assert_close(got, want, name=f"{kind} layer {layer.layer_id}")


@pytest.mark.interpreter
def test_verify_replay_with_padding_reads_only_the_given_requests(device):
    """A replay whose SpecInfo covers fewer requests than the graph's bs (padding): the given requests
    equal eager over the same padded batch, and their buffers' tails are padded, not stale."""
    state, backend, layers = setup(device, 1)
    backend.init_cuda_graph_state(max_bs=3, max_num_tokens=3 * N_DRAFT)
    cap = verify_batch(state, torch.tensor([0, 1, 2]), None, device)
    spec = tree_spec([TREE_A, TREE_B, TREE_A], cap.seq_lens.tolist(), device)
    backend.init_forward_metadata_capture_cuda_graph(3, 3 * N_DRAFT, cap.req_pool_indices, cap.seq_lens, None, VERIFY, spec)
    captured = backend.forward_metadata
    real = verify_batch(state, torch.tensor([1, 2]), None, device)
    fresh = tree_spec([TREE_B, TREE_B], real.seq_lens.tolist(), device)
    rows = torch.cat([real.req_pool_indices, real.req_pool_indices.new_zeros(1)])
    lens = torch.cat([real.seq_lens, real.seq_lens.new_ones(1)])
    backend.init_forward_metadata_replay_cuda_graph(3, rows, lens, int(lens.sum()), None, VERIFY, fresh)
    g = backend.cuda_graph
    assert torch.equal(g["positions"][2 * N_DRAFT : 3 * N_DRAFT].cpu(), 1 + torch.arange(N_DRAFT)), "padded positions"
    assert not g["custom_mask"][2 * N_DRAFT * N_DRAFT :].any(), "stale tree mask past the given requests"
    backend.forward_metadata = captured
    data = inputs(layers, 3 * N_DRAFT, 2, device)
    pad_batch = ForwardBatch(VERIFY, 3, rows, lens, None, spec_info=fresh)
    got = run_layers(backend, layers, data, pad_batch)
    real.spec_info = fresh
    for layer, (q, k, v), out in zip(layers, data, got):
        t = 2 * N_DRAFT
        want = reference(state, layer, real, q[:t], k[:t], v[:t]).reshape(t, -1)
        assert_close(out[:t], want, name=f"padded replay layer {layer.layer_id}")


def _captured_backend(device, page_size=1, max_bs=2):
    state, backend, layers = setup(device, page_size)
    backend.init_cuda_graph_state(max_bs=max_bs, max_num_tokens=max_bs * N_DRAFT)
    batch = verify_batch(state, torch.tensor([0, 1]), None, device)
    spec = tree_spec([TREE_A, TREE_B], batch.seq_lens.tolist(), device)
    backend.init_forward_metadata_capture_cuda_graph(2, 2 * N_DRAFT, batch.req_pool_indices, batch.seq_lens, None, VERIFY, spec)
    return state, backend, batch, spec


@pytest.mark.interpreter
@pytest.mark.parametrize(
    "case, match",
    [
        ("more-drafts", "max_num_tokens"),
        ("bs-over-max", "max_bs"),
        ("mask-dropped", "custom_mask given"),
        ("causal-changed", "causal"),
        ("positions-dropped", "positions given"),
        ("mask-too-long", "whole requests"),
        ("mask-ragged", "whole requests"),
        ("positions-dtype", "spec_info.positions"),
        ("no-spec", "spec_info"),
        ("not-captured", "no CUDA graph was captured"),
        ("short-seq-lens", "seq_lens"),
    ],
)
def test_replay_that_needs_more_than_was_captured_raises(device, case, match):
    state, backend, batch, spec = _captured_backend(device)
    rows, lens, bs = batch.req_pool_indices, batch.seq_lens, 2
    n = N_DRAFT
    if case == "more-drafts":
        spec = SpecInfo(n + 1, custom_mask=torch.ones(bs * (n + 1) ** 2, dtype=torch.bool, device=device))
    elif case == "bs-over-max":
        bs = 3
    elif case == "mask-dropped":
        spec = SpecInfo(n, positions=spec.positions)
    elif case == "causal-changed":
        spec = SpecInfo(n, custom_mask=spec.custom_mask, positions=spec.positions, causal=False)
    elif case == "positions-dropped":
        spec = SpecInfo(n, custom_mask=spec.custom_mask)
    elif case == "mask-too-long":
        spec = SpecInfo(n, custom_mask=torch.ones(3 * n * n, dtype=torch.bool, device=device), positions=spec.positions)
    elif case == "mask-ragged":
        spec = SpecInfo(n, custom_mask=spec.custom_mask[:-1], positions=spec.positions)
    elif case == "positions-dtype":
        spec = SpecInfo(n, custom_mask=spec.custom_mask, positions=spec.positions.float())
    elif case == "no-spec":
        spec = None
    elif case == "not-captured":
        bs, rows, lens = 1, rows[:1], lens[:1]
        spec = SpecInfo(n, custom_mask=spec.custom_mask[: n * n], positions=spec.positions[:n])
    elif case == "short-seq-lens":
        lens = lens[:1]
    before = {k: v.clone() for k, v in backend.cuda_graph.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(TypeError if case == "positions-dtype" else ValueError, match=match):
        backend.init_forward_metadata_replay_cuda_graph(bs, rows, lens, 0, None, VERIFY, spec)
    for k, v in before.items():
        assert torch.equal(backend.cuda_graph[k], v), f"a failed replay changed the {k} buffer"


@pytest.mark.reference
def test_init_cuda_graph_state_sizes_the_verify_buffers_by_sglang_convention():
    state, backend, _ = setup("cpu", 1)
    backend.init_cuda_graph_state(max_bs=3, max_num_tokens=3 * 5 + 2)  # draft_token_num = 17 // 3 = 5
    g = backend.cuda_graph
    assert g["draft_token_num"] == 5
    assert g["custom_mask"].numel() == 3 * 5 * 5 and g["positions"].numel() == 17
    assert g["mask_indptr"].numel() == 4
    for bad, exc in (((0, 4), ValueError), ((4, 3), ValueError), ((2.0, 4), TypeError), ((2, None), TypeError)):
        with pytest.raises(exc, match="max_bs|max_num_tokens"):
            backend.init_cuda_graph_state(*bad)


@pytest.mark.interpreter
@pytest.mark.parametrize("page_size", [1, 4])
def test_verify_graph_metadata_equals_eager_for_the_same_spec_info(device, page_size):
    """Same batch, same SpecInfo: the graph buffers and eager metadata give the same bits. Before the
    fix the launcher bounded the split-KV prefix by ``kv_indices.numel()``, the exact count eager
    but the whole fixed buffer under the graph, so the full layer (one program per request here)
    split its prefix 2 ways eager and 4 ways replayed at page 1 (the H200's bf16 3.9e-3; page 4's
    tables happen to be as wide both ways)."""
    state, backend, layers = setup(device, page_size, seq_lens=(9, 21))
    backend.init_cuda_graph_state(max_bs=4, max_num_tokens=4 * N_DRAFT)
    batch = verify_batch(state, torch.tensor([0, 1]), None, device)
    batch.spec_info = tree_spec([TREE_A, TREE_B], batch.seq_lens.tolist(), device)
    backend.init_forward_metadata_capture_cuda_graph(2, 2 * N_DRAFT, batch.req_pool_indices, batch.seq_lens, None, VERIFY, batch.spec_info)
    data = inputs(layers, 2 * N_DRAFT, 3, device)
    graph_out = run_layers(backend, layers, data, batch)
    backend.init_forward_metadata(batch)
    for layer, got, eager in zip(layers, graph_out, run_layers(backend, layers, data, batch)):
        assert torch.equal(got, eager), (
            f"layer {layer.layer_id}: graph metadata differs from eager (max {float((got - eager).abs().max()):.3e})"
        )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_cuda_graph_verify_capture_and_replay_with_fresh_spec_info_equal_eager(page_size, dtype):
    """A real captured TARGET_VERIFY graph, replayed with another batch and a fresh SpecInfo (as an
    engine passes each live batch): bit for bit eager's output for that SpecInfo, and the reference's."""
    state, backend, layers = setup("cuda", page_size, dtype=dtype)
    backend.init_cuda_graph_state(max_bs=4, max_num_tokens=4 * N_DRAFT)
    cap = verify_batch(state, torch.tensor([0, 1]), None, "cuda")
    cap_spec = tree_spec([TREE_A, TREE_B], cap.seq_lens.tolist(), "cuda")
    backend.init_forward_metadata_capture_cuda_graph(2, 2 * N_DRAFT, cap.req_pool_indices, cap.seq_lens, None, VERIFY, cap_spec)
    static = inputs(layers, 2 * N_DRAFT, 0, "cuda", dtype)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run_layers(backend, layers, static, cap)  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = run_layers(backend, layers, static, cap)
    new = verify_batch(state, torch.tensor([2, 0]), None, "cuda")
    new.spec_info = tree_spec([TREE_B, TREE_A], new.seq_lens.tolist(), "cuda")
    backend.init_forward_metadata_replay_cuda_graph(
        2, new.req_pool_indices, new.seq_lens, int(new.seq_lens.sum()), None, VERIFY, new.spec_info, new.seq_lens_cpu
    )
    for dst, src in zip(static, inputs(layers, 2 * N_DRAFT, 1, "cuda", dtype)):
        for d, s_ in zip(dst, src):
            d.copy_(s_)
    graph.replay()
    torch.cuda.synchronize()
    backend.init_forward_metadata(new)
    eager = run_layers(backend, layers, static, new)
    for layer, (q, k, v), got, want_eager in zip(layers, static, outs, eager):
        assert not torch.isnan(got).any()
        assert torch.equal(got, want_eager), (
            f"layer {layer.layer_id}: replay differs from eager (max {float((got.float() - want_eager.float()).abs().max()):.3e})"
        )
        assert_close(got, reference(state, layer, new, q, k, v).reshape(got.shape), name=f"layer {layer.layer_id}")


def _padded(t, fill):
    return torch.cat([t, t.new_full((1,), fill)])


@pytest.mark.interpreter
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("mode", [ForwardMode.DECODE, VERIFY, DRAFT_EXTEND], ids=["decode", "verify", "draft-extend"])
def test_padded_replay_promise(device, page_size, mode):
    """Issue 25 (6), exactly what ``init_forward_metadata_replay_cuda_graph`` promises for a batch padded
    the engine's way (a last request on ``req_to_token`` row 0 with the fill length, its drafts past
    the ``spec_info``): (1) the metadata equals eager metadata over the same padded batch bit for bit,
    padding included (verify: eager given the replay's padding mask, all zeros, and positions prefix +
    i); (2) the real requests' output rows equal eager's bit for bit; (3) the padded rows read the dummy
    slot 0 and nothing else: they change with its contents (which the padded tokens' own stores at
    ``out_cache_loc`` 0 write concurrently, in no fixed order on a GPU), while the real rows do not.
    So padded rows are unspecified and must be discarded; nothing else about them is promised.
    DRAFT_EXTEND_V2 (n new tokens per request, the last of ``seq_lens``): eager is given the same
    step with its lengths on the device only (as SGLang's overlapped draft extend), and the padded
    request, whose fill length leaves it no prefix, reads no slot at all."""
    n = 1 if mode == ForwardMode.DECODE else N_DRAFT
    state = make_pool_state(
        seq_lens=[9, 21], window_left=W, page_size=page_size, device=device, new_tokens=n, swa_head_num=2, swa_head_dim=16,
        full_head_num=1, full_head_dim=32,
    )  # fmt: skip
    runner = ModelRunner(state.kv_pool, state.allocator, state.req_to_token_pool, sliding_window_size=W, device=device)
    backend = TritonSWAAttnBackend(runner)
    layers = [AttentionLayer(0, HQ, 2, 16, sliding_window_size=W), AttentionLayer(1, HQ, 1, 32)]
    fill = backend.get_cuda_graph_seq_len_fill_value()
    rows = _padded(state.req_pool_indices(), 0)
    if mode == VERIFY:
        lens = _padded(state.prefix_lens(), fill)
        real_spec = tree_spec([TREE_A, TREE_B], lens[:2].tolist(), device)
        # eager needs the whole padded batch's spec: the replay's padding (no draft seen, prefix + i)
        full_spec = SpecInfo(
            N_DRAFT,
            custom_mask=torch.cat([real_spec.custom_mask, torch.zeros(N_DRAFT * N_DRAFT, dtype=torch.bool, device=device)]),
            positions=torch.cat([real_spec.positions, fill + torch.arange(N_DRAFT, device=device)]),
        )
        eager_batch = ForwardBatch(VERIFY, 3, rows, lens, None, seq_lens_cpu=lens.cpu(), spec_info=full_spec)
    elif mode == DRAFT_EXTEND:
        lens = _padded(state.prefix_lens() + n, fill)
        real_spec = None
        prefix = (lens - n).clamp(min=0)
        # eager over the step as the graph reads it: the padded request's n tokens after no prefix
        eager_batch = ForwardBatch(
            mode,
            3,
            rows,
            prefix + n,
            None,
            extend_prefix_lens=prefix,
            extend_seq_lens=torch.full_like(lens, n),
            extend_seq_lens_cpu=[n] * 3,
        )
    else:
        lens = _padded(state.seq_lens(), fill)
        real_spec = None
        eager_batch = ForwardBatch(ForwardMode.DECODE, 3, rows, lens, None, seq_lens_cpu=lens.cpu())
    backend.init_cuda_graph_state(max_bs=3, max_num_tokens=3 * n)
    backend.init_forward_metadata_capture_cuda_graph(3, 3 * n, rows, lens, None, mode, real_spec)
    backend.init_forward_metadata_replay_cuda_graph(3, rows, lens, int(lens.sum()), None, mode, real_spec)
    replay = backend.forward_metadata
    graph_meta = {k: v.clone() for k, v in tensors(replay).items()}
    backend.init_forward_metadata(eager_batch, debug=True)
    eager = backend.forward_metadata
    # (1) metadata, padding included
    eager_meta = {k: v for k, v in tensors(eager).items() if k != "prefix_lens_cpu"}  # a host copy, eager only
    assert eager_meta.keys() == graph_meta.keys()
    for name, want in eager_meta.items():
        got = graph_meta[name]
        if name.endswith("kv_indices"):
            got = got[: want.numel()]  # the graph's buffer is larger; readers stop at kv_indptr[B]
        elif name.endswith("page_table"):
            assert not got[:, want.shape[1] :].any(), f"{name}: columns past eager's width"
            got = got[:, : want.shape[1]]
        elif name == "custom_mask":
            got = got[: want.numel()]
        assert torch.equal(got.cpu().long(), want.cpu().long()), name

    data = inputs(layers, 3 * n, 5, device)

    def run(meta):
        backend.forward_metadata = meta
        outs = []
        for layer, (q, k, v) in zip(layers, data):
            fwd = backend.forward_decode if mode == ForwardMode.DECODE else backend.forward_extend
            outs.append(fwd(q.reshape(len(q), -1), k, v, layer, eager_batch, save_kv_cache=False))
        return outs

    t = 2 * n  # the real requests' rows
    for layer, got, want in zip(layers, run(replay), run(eager)):
        assert torch.equal(got[:t], want[:t]), f"layer {layer.layer_id}: a real request's row differs from eager"
    # (3) padded rows follow the dummy slot 0, real rows do not
    before = run(replay)
    for pool in (state.kv_pool.swa_kv_pool, state.kv_pool.full_kv_pool):
        for buf in pool.k_buffer + pool.v_buffer:
            buf[0] = 100.0 * torch.randn(buf[0].shape, generator=torch.Generator().manual_seed(9)).to(buf.dtype)
    after = run(replay)
    for layer, b, a in zip(layers, before, after):
        assert torch.equal(a[:t], b[:t]), f"layer {layer.layer_id}: a real request read the dummy slot"
        if mode == DRAFT_EXTEND:
            assert torch.equal(a[t:], b[t:]), f"layer {layer.layer_id}: the padded request read a slot"
        else:
            assert not torch.equal(a[t:], b[t:]), f"layer {layer.layer_id}: the padded request did not read the dummy slot"
