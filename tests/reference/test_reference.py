"""The reference path against a brute-force per-query loop, over every edge case of docs/contract.md §1."""

import math

import pytest
import torch

import triton_swa_reference as ref
from triton_swa.testing import assert_close, make_pool_state

pytestmark = pytest.mark.reference


def brute_one_query(q, keys, values, *, sm_scale, logit_cap=0.0, sink=None):
    """Softmax attention of one query head over a Python list of (key, value) vectors, in float64."""
    if not keys and sink is None:
        return torch.zeros(values.shape[-1] if isinstance(values, torch.Tensor) else 0, dtype=torch.float64)
    scores = []
    for k in keys:
        s = float((q.double() * k.double()).sum()) * sm_scale
        if logit_cap > 0:
            s = logit_cap * math.tanh(s / logit_cap)
        scores.append(s)
    m = max(scores + ([float(sink)] if sink is not None else []))
    weights = [math.exp(s - m) for s in scores]
    denom = sum(weights) + (math.exp(float(sink) - m) if sink is not None else 0.0)
    out = torch.zeros_like(values[0], dtype=torch.float64) if len(values) else None
    for w, v in zip(weights, values):
        out = out + (w / denom) * v.double()
    return out


def brute_sequence(q, k, v, q_pos, k_pos, window_left, *, causal=True, sm_scale, logit_cap=0.0, sinks=None, allowed=None):
    """Per query, per head: collect the keys the rule of docs/contract.md §1 admits, then softmax over them."""
    tq, hq, _ = q.shape
    h, dv = k.shape[1], v.shape[-1]
    out = torch.zeros(tq, hq, dv, dtype=torch.float64)
    for i in range(tq):
        p = int(q_pos[i])
        for head in range(hq):
            kv_head = head // (hq // h)
            keys, vals = [], []
            for j in range(k.shape[0]):
                kp = int(k_pos[j])
                if causal and kp > p:
                    continue
                if window_left >= 0 and p - kp > window_left:
                    continue
                if allowed is not None and not allowed(i, j):
                    continue
                keys.append(k[j, kv_head])
                vals.append(v[j, kv_head])
            sink = None if sinks is None else sinks[head]
            res = brute_one_query(q[i, head], keys, vals, sm_scale=sm_scale, logit_cap=logit_cap, sink=sink)
            out[i, head] = res if res is not None and len(vals) else torch.zeros(dv, dtype=torch.float64)
    return out


@pytest.mark.parametrize("window_left", [-1, 0, 1, 4, 9, 100])
@pytest.mark.parametrize("softcap", [0.0, 5.0])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_dense_attention_matches_brute_force(window_left, softcap, with_sinks):
    g = torch.Generator().manual_seed(window_left + 7)
    t, hq, h, d, dv = 11, 6, 2, 5, 3
    q, k, v = torch.randn(t, hq, d, generator=g), torch.randn(t, h, d, generator=g), torch.randn(t, h, dv, generator=g)
    sinks = torch.randn(hq, generator=g) if with_sinks else None
    pos = torch.arange(t)
    mask = ref.window_mask(pos, pos, window_left)
    got = ref.attention(q, k, v, mask, sm_scale=0.7, logit_cap=softcap, sinks=sinks)
    want = brute_sequence(q, k, v, pos, pos, window_left, sm_scale=0.7, logit_cap=softcap, sinks=sinks)
    assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_window_counts_w_plus_one_keys():
    pos = torch.arange(20)
    for w in (0, 3, 7):
        counts = ref.window_mask(pos, pos, w).sum(1)
        assert counts.tolist() == [min(p + 1, w + 1) for p in range(20)]
    assert ref.window_mask(pos, pos, -1).sum(1).tolist() == [p + 1 for p in range(20)]


@pytest.mark.parametrize("seq_len, w, start", [(1, 0, 0), (1, 5, 0), (10, 0, 9), (10, 9, 0), (10, 8, 1), (10, 100, 0), (10, -1, 0)])
def test_decode_window_start_edges(seq_len, w, start):
    assert ref.decode_window_start(seq_len, w) == start
    assert int(ref.decode_window_start(torch.tensor([seq_len]), w)[0]) == start


@pytest.mark.parametrize("prefix, w, start", [(0, 3, 0), (2, 3, 0), (3, 3, 0), (10, 3, 7), (10, 0, 10), (10, -1, 0)])
def test_extend_window_start_edges(prefix, w, start):
    assert ref.extend_window_start(prefix, w) == start


def test_window_left_is_checked():
    with pytest.raises(ValueError, match="window_left"):
        ref.decode_window_start(5, -2)
    with pytest.raises(TypeError, match="window_left"):
        ref.window_mask(torch.arange(2), torch.arange(2), 1.5)


def test_all_masked_rows_are_zero_not_nan():
    q, k, v = torch.randn(3, 2, 4), torch.randn(5, 1, 4), torch.randn(5, 1, 4)
    mask = torch.zeros(3, 5, dtype=torch.bool)
    out = ref.attention(q, k, v, mask, sm_scale=1.0)
    assert torch.equal(out, torch.zeros_like(out))
    out = ref.attention(q, k, v, mask, sm_scale=1.0, sinks=torch.randn(2))
    assert torch.equal(out, torch.zeros_like(out))
    out = ref.attention(q, k[:0], v[:0], None, sm_scale=1.0)
    assert out.shape == (3, 2, 4) and not out.any()


@pytest.mark.parametrize("page_size", [1, 3, 4])
@pytest.mark.parametrize("window_left", [0, 2, 5, 7, 50])
def test_decode_through_pool_matches_dense_history(page_size, window_left):
    """Decode via the translated window index list and via the page table equals brute force."""
    lens = [1, 6, 7, 19, 30]
    state = make_pool_state(
        seq_lens=lens,
        window_left=window_left,
        page_size=page_size,
        swa_head_num=2,
        swa_head_dim=4,
        generator=torch.Generator().manual_seed(page_size),
    )
    k_buf, v_buf = state.kv_pool.get_kv_buffer(0)
    q = torch.randn(len(lens), 4, 4)
    kv_indptr, kv_indices, starts = ref.decode_window_indices(
        state.req_to_token, state.req_pool_indices(), state.seq_lens(), window_left, state.mapping
    )
    got = ref.decode_attention(q, k_buf, v_buf, kv_indptr, kv_indices, sm_scale=0.5)
    assert not torch.isnan(got).any(), "a window index reached a NaN (evicted or foreign) slot"
    table = ref.window_page_table(state.req_to_token, state.req_pool_indices(), starts, state.seq_lens(), page_size, state.mapping)
    assert_close(ref.decode_attention_paged(q, k_buf, v_buf, table, starts, state.seq_lens(), page_size, sm_scale=0.5), got, atol=0, rtol=0)
    for b, req in enumerate(state.requests):
        full = state.req_to_token[req.req_pool_index, : req.seq_len].long()
        swa = state.mapping[full]
        pos = torch.arange(req.seq_len)
        keep = ref.window_mask(pos[-1:], pos, window_left)[0]
        assert (swa[keep] > 0).all(), "an in-window token lost its SWA slot"
        k = torch.where(keep[:, None, None], k_buf[swa.clamp(min=0)].double(), 0.0)
        v = torch.where(keep[:, None, None], v_buf[swa.clamp(min=0)].double(), 0.0)
        want = brute_sequence(q[b : b + 1], k, v, pos[-1:], pos, window_left, sm_scale=0.5)
        assert_close(got[b : b + 1], want, atol=1e-12, rtol=1e-12)


def _extend_case(g, prefix, new, window_left, hq=4, h=2, d=4, dv=3):
    q = torch.randn(new, hq, d, generator=g)
    k_all = torch.randn(prefix + new, h, d, generator=g)
    v_all = torch.randn(prefix + new, h, dv, generator=g)
    return q, k_all, v_all


@pytest.mark.parametrize(
    "prefix, new, window_left",
    [
        pytest.param(0, 6, 2, id="prefill-no-prefix"),
        pytest.param(13, 4, 3, id="chunked-prefix-beyond-window"),
        pytest.param(3, 5, 20, id="prompt-shorter-than-window"),
        pytest.param(9, 1, 4, id="one-token-extend"),
        pytest.param(7, 0, 4, id="empty-extend"),
        pytest.param(8, 5, 0, id="W0-self-only"),
        pytest.param(8, 3, -1, id="full"),
    ],
)
@pytest.mark.parametrize("causal", [True, False])
def test_extend_matches_brute_force(prefix, new, window_left, causal):
    g = torch.Generator().manual_seed(prefix * 31 + new)
    q, k_all, v_all = _extend_case(g, prefix, new, window_left)
    # Pool: slot s + 1 holds position s, NaN elsewhere (and outside the prefix window).
    start = ref.extend_window_start(prefix, window_left)
    k_buf = torch.full((prefix + 2, 2, 4), float("nan"), dtype=torch.float64)
    v_buf = torch.full((prefix + 2, 2, 3), float("nan"), dtype=torch.float64)
    k_buf[1 + start : 1 + prefix] = k_all[start:prefix].double()
    v_buf[1 + start : 1 + prefix] = v_all[start:prefix].double()
    kv_indices = torch.arange(start, prefix) + 1
    got = ref.extend_attention(
        q,
        k_all[prefix:],
        v_all[prefix:],
        k_buf,
        v_buf,
        torch.tensor([0, new]),
        torch.tensor([0, prefix - start]),
        kv_indices,
        torch.tensor([prefix]),
        window_left=window_left,
        sm_scale=0.6,
        causal=causal,
    )
    k_pos = torch.arange(prefix + new)
    q_pos = prefix + torch.arange(new)
    allowed = (lambda i, j: j < prefix or j - prefix <= i) if causal else None
    want = brute_sequence(q, k_all, v_all, q_pos, k_pos, window_left, causal=False, sm_scale=0.6, allowed=allowed)
    assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_extend_tree_mask_and_positions():
    """Tree verify: drafts at P + depth, a custom mask among drafts; the prefix is visible within W."""
    g = torch.Generator().manual_seed(3)
    prefix, new, w = 10, 4, 3
    q, k_all, v_all = _extend_case(g, prefix, new, w)
    # Tree: 0 is the root, 1 and 2 its children, 3 a child of 1.
    parent = {0: None, 1: 0, 2: 0, 3: 1}
    depth = torch.tensor([0, 1, 1, 2])
    tree = torch.zeros(new, new, dtype=torch.bool)
    for i in range(new):
        j = i
        while j is not None:
            tree[i, j] = True
            j = parent[j]
    start = ref.extend_window_start(prefix, w)
    k_buf = k_all[:prefix].double().clone()
    v_buf = v_all[:prefix].double().clone()
    got = ref.extend_attention(
        q,
        k_all[prefix:],
        v_all[prefix:],
        k_buf,
        v_buf,
        torch.tensor([0, new]),
        torch.tensor([0, prefix - start]),
        torch.arange(start, prefix),
        torch.tensor([prefix]),
        window_left=w,
        sm_scale=0.6,
        custom_mask=tree.reshape(-1),
        mask_indptr=torch.tensor([0]),
        q_positions=prefix + depth,
    )
    q_pos = prefix + depth
    k_pos = torch.cat([torch.arange(prefix), prefix + depth])
    want = brute_sequence(
        q, k_all, v_all, q_pos, k_pos, w, causal=False, sm_scale=0.6, allowed=lambda i, j: j < prefix or bool(tree[i, j - prefix])
    )
    assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_fp8_kv_is_dequantised_with_scales():
    g = torch.Generator().manual_seed(5)
    k = torch.randn(6, 1, 8, generator=g)
    v = torch.randn(6, 1, 8, generator=g)
    k_scale, v_scale = 0.05, 0.02
    k8, v8 = (k / k_scale).to(torch.float8_e4m3fn), (v / v_scale).to(torch.float8_e4m3fn)
    q = torch.randn(1, 2, 8, generator=g)
    got = ref.decode_attention(q, k8, v8, torch.tensor([0, 6]), torch.arange(6), sm_scale=0.3, k_scale=k_scale, v_scale=v_scale)
    want = ref.attention(q, k8.double() * k_scale, v8.double() * v_scale, None, sm_scale=0.3)
    assert_close(got, want, atol=0, rtol=0)
    # And the quantisation is close to the original values, so the scale is applied the right way.
    assert_close(ref.attention(q, k, v, None, sm_scale=0.3).float(), want, atol=0.1, rtol=0.1)


def test_index_builders_and_translation():
    state = make_pool_state(seq_lens=[1, 9, 17], window_left=4, page_size=1)
    rows, lens = state.req_pool_indices(), state.seq_lens()
    indptr, full_idx, starts = ref.decode_window_indices(state.req_to_token, rows, lens, 4)
    _, swa_idx, _ = ref.decode_window_indices(state.req_to_token, rows, lens, 4, state.mapping)
    assert indptr.dtype == full_idx.dtype == swa_idx.dtype == starts.dtype == torch.int32
    assert indptr.tolist() == [0, 1, 6, 11] and starts.tolist() == [0, 4, 12]
    assert torch.equal(swa_idx, ref.translate_full_to_swa(full_idx, state.mapping))
    assert not torch.equal(swa_idx, full_idx), "permuted free lists should make SWA slots differ"
    # Extend windows end at the prefix: positions [P - W, P).
    e_indptr, _, e_starts = ref.extend_window_indices(state.req_to_token, rows, torch.tensor([0, 3, 16]), 4)
    assert e_indptr.tolist() == [0, 0, 3, 7] and e_starts.tolist() == [0, 0, 12]
    # -1 translates to -1; a CUDA-graph buffer gets a zero tail.
    assert int(ref.translate_full_to_swa(torch.tensor([-1]), state.mapping)[0]) == -1
    buf = ref.swa_out_cache_loc(full_idx[:3].long(), state.mapping, buffer_size=8)
    assert buf[3:].eq(0).all() and torch.equal(buf[:3], swa_idx[:3])
