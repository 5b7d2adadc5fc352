"""The index guard (``triton_swa.runtime.guard``): debug-mode checks of every index a kernel reads.

Valid serving states come from ``make_pool_state`` (real allocators, permuted free lists, window
eviction); each corruption must raise a ``ValueError`` naming the request, position and slot before
anything is launched. Corrupt states are never run through a kernel: the guard raises first, and the
wiring tests use spies.
"""

from __future__ import annotations

import inspect

import pytest
import torch

import triton_swa.runtime.guard as guard
import triton_swa_reference as ref
from triton_swa import build_window_indices, build_window_page_table, store_kv, swa_decode, swa_extend, swa_out_cache_loc
from triton_swa.backend import TritonSWAAttnBackend
from triton_swa.engine import ForwardBatch, ForwardMode, ModelRunner, SpecInfo
from triton_swa.testing import make_pool_state

# CPU tier: the guard's checks on CPU-built pools. On a GPU, the soak (tests/test_soak.py) runs every
# step with debug=True on CUDA tensors.
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tier: builds its pools on the CPU")

HQ = 4
W = 6
LENS = [5, 17, 30]
OPS = [swa_decode, swa_extend, build_window_indices, build_window_page_table, swa_out_cache_loc, store_kv]


class Called(Exception):
    """Raised by a spy check so that no kernel runs after it."""


@pytest.fixture(autouse=True)
def guard_off_by_default(monkeypatch):
    """These tests pass ``debug`` themselves: run them with the environment's switch off, whatever CI sets."""
    monkeypatch.delenv(guard.ENV_VAR, raising=False)
    guard.refresh_debug_env()
    yield
    monkeypatch.undo()
    guard.refresh_debug_env()


@pytest.fixture
def env(monkeypatch):
    """Set TRITON_SWA_DEBUG for one test; the cached setting is restored afterwards."""

    def set_env(value):
        monkeypatch.setenv(guard.ENV_VAR, value)
        return guard.refresh_debug_env()

    yield set_env
    monkeypatch.undo()
    guard.refresh_debug_env()


def raises(match_request=None, position=None, slot=None, text=None):
    """pytest.raises(ValueError) whose message names the request, position and slot."""
    parts = []
    if match_request is not None:
        parts.append(rf"request {match_request} \(batch index")
    if position is not None:
        parts.append(rf"(position|window entry) {position}\b")
    if slot is not None:
        parts.append(rf"slot {slot}\b")
    if text is not None:
        parts.append(text)
    return pytest.raises(ValueError, match="".join(f"(?=.*(?:{p}))" for p in parts) or None)


# ----- the wrapper -----------------------------------------------------------------------------------


def _toy():
    seen = []

    def check(a, b=2, *, c=3, **extra):
        seen.append((a, b, c, extra))

    @guard.guarded(check)
    def toy(a, b=2, *, c=3, d_cpu=None):
        """Toy docstring."""
        return a + b + c

    return toy, seen


def test_wrapper_off_does_not_call_the_check():
    toy, seen = _toy()
    assert toy(1) == 6 and toy(1, 5, c=0, debug=False) == 6
    assert seen == []


def test_wrapper_on_binds_every_argument_with_defaults():
    toy, seen = _toy()
    assert toy(1, debug=True) == 6
    assert toy(a=4, c=1, debug=True) == 7
    assert seen == [(1, 2, 3, {"d_cpu": None}), (4, 2, 1, {"d_cpu": None})]


def test_wrapper_keeps_name_doc_signature_and_the_undecorated_function():
    toy, _ = _toy()
    assert toy.__name__ == "toy" and toy.__doc__ == "Toy docstring."
    params = inspect.signature(toy).parameters
    assert list(params) == ["a", "b", "c", "d_cpu", "debug"]
    assert params["debug"].kind is inspect.Parameter.KEYWORD_ONLY and params["debug"].default is None
    assert toy.__wrapped__(1) == 6
    for op in OPS:
        assert "debug" in inspect.signature(op).parameters, op.__name__
        assert op.guard_check is getattr(guard, f"check_{op.__name__}"), op.__name__
        assert op.__doc__ == op.__wrapped__.__doc__


def test_wrapper_rejects_a_check_that_cannot_take_the_arguments_and_a_bad_debug():
    with pytest.raises(TypeError, match="cannot take"):
        guard.guarded(lambda a: None)(lambda a, b: None)
    toy, _ = _toy()
    with pytest.raises(TypeError, match="debug must be a bool"):
        toy(1, debug=1)


def test_env_turns_the_guard_on_for_calls_without_the_argument(env):
    toy, seen = _toy()
    assert env("1") is True and guard.debug_enabled() is True
    toy(1)
    assert len(seen) == 1
    toy(1, debug=False)
    assert len(seen) == 1, "debug=False overrides the environment"
    assert env("0") is False
    toy(1)
    assert len(seen) == 1


def test_env_rejects_unknown_values(env):
    with pytest.raises(ValueError, match="TRITON_SWA_DEBUG"):
        env("maybe")


def test_real_ops_call_their_check_only_in_debug(monkeypatch, env):
    """store_kv (a cheap kernel) runs with debug off without calling the check; every op with debug
    on calls its check with its own arguments before launching anything."""
    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs)
        raise Called

    for op in OPS:
        monkeypatch.setattr(op, "guard_check", spy)
    buf = torch.zeros(8, 1, 4)
    store_kv(buf, buf.clone(), torch.tensor([1, 2]), torch.ones(2, 1, 4), torch.ones(2, 1, 4))
    store_kv(buf, buf.clone(), torch.tensor([1, 2]), torch.ones(2, 1, 4), torch.ones(2, 1, 4), debug=False)
    assert calls == [] and buf[1:3].eq(1).all()
    with pytest.raises(Called):
        store_kv(buf, buf.clone(), torch.tensor([3]), torch.ones(1, 1, 4), torch.ones(1, 1, 4), debug=True)
    assert calls[-1]["mapping"] is None and "k_scale" in calls[-1]
    env("1")
    with pytest.raises(Called):
        swa_out_cache_loc(torch.tensor([1]), torch.tensor([0, 5, -1]))
    with pytest.raises(Called):
        swa_decode(torch.zeros(1, 1, 4), buf, buf, kv_indptr=torch.tensor([0, 1]), kv_indices=torch.tensor([1]))
    assert calls[-1]["page_size"] == 1 and calls[-1]["max_window"] is None


# ----- states ----------------------------------------------------------------------------------------


def decode_state(page_size=1):
    state = make_pool_state(seq_lens=LENS, window_left=W, page_size=page_size, swa_head_num=2, swa_head_dim=16)
    k, v = state.kv_pool.get_kv_buffer(0)  # layer 0 is sliding
    rows, lens = state.req_pool_indices(), state.seq_lens()
    ptr, idx, starts = ref.decode_window_indices(state.req_to_token, rows, lens, W, state.mapping)
    table = ref.window_page_table(state.req_to_token, rows, starts, lens, page_size, state.mapping)
    q = torch.randn(len(LENS), HQ, 16)
    return state, q, k, v, dict(ptr=ptr, idx=idx, starts=starts, lens=lens, table=table)


def extend_state(page_size=1, new=(3, 1, 4)):
    lens = [n + m for n, m in zip(LENS, new)]
    state = make_pool_state(seq_lens=lens, window_left=W, page_size=page_size, new_tokens=list(new), swa_head_num=2, swa_head_dim=16)
    kb, vb = state.kv_pool.get_kv_buffer(0)
    rows, prefix = state.req_pool_indices(), state.prefix_lens()
    ptr, idx, starts = ref.extend_window_indices(state.req_to_token, rows, prefix, W, state.mapping)
    table = ref.window_page_table(state.req_to_token, rows, starts, prefix, page_size, state.mapping)
    T = sum(new)
    qo = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32)
    q, k, v = torch.randn(T, HQ, 16), torch.randn(T, 2, 16), torch.randn(T, 2, 16)
    args = (q, k, v, kb, vb, qo, prefix.to(torch.int32))
    return state, args, dict(ptr=ptr, idx=idx, starts=starts, table=table, new=list(new))


def _entry(ptr, b, offset_from_end=1):
    """Index in kv_indices of request b's entry ``offset_from_end`` from its window's end."""
    return int(ptr[b + 1]) - offset_from_end


# ----- swa_decode ------------------------------------------------------------------------------------


def test_decode_valid_states_pass_and_run(monkeypatch):
    state, q, k, v, d = decode_state()
    out = swa_decode(q, k, v, kv_indptr=d["ptr"], kv_indices=d["idx"], max_window=W + 1, debug=True)
    assert not torch.isnan(out).any()
    state, q, k, v, d = decode_state(page_size=4)
    guard.check_swa_decode(q, k, v, page_table=d["table"], window_starts=d["starts"], seq_lens=d["lens"], page_size=4, max_window=W + 1)


@pytest.mark.parametrize(
    "value, why", [(0, "dummy slot 0"), (-2, "negative"), (None, "past the buffer")], ids=["slot0", "negative", "past-buffer"]
)
def test_decode_csr_bad_slot(value, why):
    state, q, k, v, d = decode_state()
    idx = d["idx"].clone()
    e = _entry(d["ptr"], 1, 3)
    value = k.shape[0] if value is None else value
    idx[e] = value
    with raises(1, 4, value, why):  # request 1's window has 7 entries; entry 4 of them
        swa_decode(q, k, v, kv_indptr=d["ptr"], kv_indices=idx, debug=True)


def test_decode_csr_evicted_slot_in_window():
    """Evicting a token inside request 2's window: the fresh indices translate it to 0."""
    state, q, k, v, d = decode_state()
    r = state.requests[2]
    pos = r.seq_len - 3
    full = state.req_to_token[r.req_pool_index, pos].long()
    state.mapping[full] = 0
    ptr, idx, _ = ref.decode_window_indices(state.req_to_token, state.req_pool_indices(), d["lens"], W, state.mapping)
    with raises(2, W + 1 - 3, 0, "evicted"):
        swa_decode(q, k, v, kv_indptr=ptr, kv_indices=idx, debug=True)
    # the builder names the absolute position and the full slot
    with raises(2, pos, 0, "evicted"):
        build_window_indices(state.req_to_token, state.req_pool_indices(), d["lens"], window_left=W, mapping=state.mapping, debug=True)


def test_decode_csr_lengths():
    state, q, k, v, d = decode_state()
    ptr = d["ptr"].clone()
    ptr[2] = ptr[1] - 1
    with raises(1, text="decreases"):
        swa_decode(q, k, v, kv_indptr=ptr, kv_indices=d["idx"], debug=True)
    ptr = d["ptr"].clone()
    ptr[-1] += 1
    with raises(2, text="runs past"):
        swa_decode(q, k, v, kv_indptr=ptr, kv_indices=d["idx"], debug=True)
    ptr = d["ptr"].clone()
    ptr[0] = 1
    with raises(text=r"kv_indptr\[0\] must be 0"):
        swa_decode(q, k, v, kv_indptr=ptr, kv_indices=d["idx"], debug=True)
    with raises(1, text="more than max_window=6"):
        swa_decode(q, k, v, kv_indptr=d["ptr"], kv_indices=d["idx"], max_window=W, debug=True)


def test_decode_csr_slot_listed_twice():
    state, q, k, v, d = decode_state()
    idx = d["idx"].clone()
    idx[_entry(d["ptr"], 2, 2)] = idx[_entry(d["ptr"], 2, 1)]
    with raises(2, 5, int(idx[_entry(d["ptr"], 2, 1)]), "share one slot"):
        swa_decode(q, k, v, kv_indptr=d["ptr"], kv_indices=idx, debug=True)


def test_decode_padding_entry_reads_the_dummy_slot():
    """A CUDA-graph padding entry (row 0, length 1) has a one-slot window on slot 0: allowed."""
    state, q, k, v, d = decode_state()
    ptr = torch.cat([d["ptr"], d["ptr"][-1:] + 1])
    idx = torch.cat([d["idx"], d["idx"].new_zeros(1)])
    guard.check_swa_decode(torch.cat([q, q[:1]]), k, v, kv_indptr=ptr, kv_indices=idx)


def test_decode_page_table_bad_pages():
    state, q, k, v, d = decode_state(page_size=4)
    kw = dict(window_starts=d["starts"], seq_lens=d["lens"], page_size=4)
    table = d["table"].clone()
    table[1, 1] = 0
    start = int(d["starts"][1])
    pos = (start // 4 + 1) * 4
    with raises(1, pos, pos % 4, "dummy page 0"):
        swa_decode(q, k, v, page_table=table, debug=True, **kw)
    table = d["table"].clone()
    table[2, 0] = k.shape[0] // 4
    with raises(2, int(d["starts"][2]), text="past the buffer"):
        swa_decode(q, k, v, page_table=table, debug=True, **kw)
    with raises(1, text=r"window \[10, 17\) needs 3 page_table columns from window_starts 10, more than the page_table.s 2"):
        swa_decode(q, k, v, page_table=d["table"][:, :2].contiguous(), debug=True, **kw)
    starts = d["starts"].clone()
    starts[0] = d["lens"][0] + 1
    with raises(0, text="past seq_lens"):
        swa_decode(q, k, v, page_table=d["table"], window_starts=starts, seq_lens=d["lens"], page_size=4, debug=True)


# ----- swa_extend ------------------------------------------------------------------------------------


def test_extend_valid_states_pass_and_run():
    state, args, d = extend_state()
    out = swa_extend(*args, window_left=W, kv_indptr=d["ptr"], kv_indices=d["idx"], debug=True)
    assert not torch.isnan(out).any()
    state, args, d = extend_state(page_size=4)
    guard.check_swa_extend(*args, window_left=W, page_table=d["table"], window_starts=d["starts"], page_size=4)


def test_extend_csr_corruptions():
    state, args, d = extend_state()
    kw = dict(window_left=W, kv_indptr=d["ptr"])
    P = args[6]
    idx = d["idx"].clone()
    idx[_entry(d["ptr"], 1, 2)] = 0
    with raises(1, int(P[1]) - 2, 0, "dummy slot 0"):
        swa_extend(*args, kv_indices=idx, debug=True, **kw)
    idx = d["idx"].clone()
    idx[_entry(d["ptr"], 2, 1)] = args[3].shape[0] + 5
    with raises(2, int(P[2]) - 1, args[3].shape[0] + 5, "past the buffer"):
        swa_extend(*args, kv_indices=idx, debug=True, **kw)
    # a decode window (W + 1 keys, ending at the new tokens) passed as the prefix window
    ptr, idx, _ = ref.decode_window_indices(state.req_to_token, state.req_pool_indices(), state.seq_lens(), W, state.mapping)
    with raises(0, text=r"holds 7 keys in kv_indices, more than its 5 prefix tokens"):
        swa_extend(*args, window_left=W, kv_indptr=ptr, kv_indices=idx, debug=True)
    # the whole prefix listed (the kernel reads only the window's last W entries): entries before the
    # window are never read, so even a dummy slot there passes; one key short of the window fails
    rows, prefix = state.req_pool_indices(), state.prefix_lens()
    ptr, idx, _ = ref.extend_window_indices(state.req_to_token, rows, prefix, -1, state.mapping)
    assert int(idx[int(ptr[2])]) == 0, "request 2's oldest token is evicted"
    guard.check_swa_extend(*args, window_left=W, kv_indptr=ptr, kv_indices=idx)
    short = torch.cat([d["ptr"][:2], d["ptr"][2:] - 1])
    with raises(1, text=r"holds 5 keys in kv_indices, fewer than the window's 6 \(positions \[11, 17\)\)"):
        swa_extend(*args, window_left=W, kv_indptr=short, kv_indices=d["idx"][1:], debug=True)


def test_extend_lengths_and_layout():
    state, args, d = extend_state()
    q, k, v, kb, vb, qo, P = args
    kw = dict(window_left=W, kv_indptr=d["ptr"], kv_indices=d["idx"])
    bad = qo.clone()
    bad[2] = bad[1] - 1
    with raises(1, text="qo_indptr decreases"):
        swa_extend(q, k, v, kb, vb, bad, P, debug=True, **kw)
    bad = qo.clone()
    bad[-1] -= 1
    guard.check_swa_extend(q, k, v, kb, vb, bad, P, **kw)  # q rows past the last request: never read
    bad[-1] += 2
    with raises(2, text=r"qo_indptr\[3\] = 9 runs past the 8 entries of q"):
        swa_extend(q, k, v, kb, vb, bad, P, debug=True, **kw)
    bad = P.clone()
    bad[0] = -1
    with raises(0, text="negative"):
        swa_extend(q, k, v, kb, vb, qo, bad, debug=True, **kw)
    with raises(2, text="more than max_extend_len=3"):
        swa_extend(*args, max_extend_len=3, debug=True, **kw)
    positions = torch.cat([P[b] + torch.arange(n) for b, n in enumerate(d["new"])]).to(torch.int32)
    guard.check_swa_extend(*args, q_positions=positions, **kw)
    positions[4] = P[2] + 4
    with raises(2, text=r"new token 0: q_positions\[4\] = 34 is outside its new tokens' positions \[30, 34\)"):
        swa_extend(*args, q_positions=positions, debug=True, **kw)
    E = torch.tensor(d["new"])
    mask = torch.ones(int((E * E).sum()), dtype=torch.bool)
    mask_indptr = torch.cat([torch.zeros(1), (E * E).cumsum(0)]).to(torch.int32)
    guard.check_swa_extend(*args, custom_mask=mask, mask_indptr=mask_indptr, **kw)
    guard.check_swa_extend(*args, custom_mask=mask, mask_indptr=mask_indptr[:-1], **kw)
    with raises(2, text="runs past custom_mask's 25"):
        swa_extend(*args, custom_mask=mask[:-1], mask_indptr=mask_indptr[:-1], debug=True, **kw)
    bad = mask_indptr.clone()
    bad[1] = 4
    with raises(0, text="mask_indptr steps by 4"):
        swa_extend(*args, custom_mask=mask, mask_indptr=bad, debug=True, **kw)


def test_extend_page_table_corruptions():
    state, args, d = extend_state(page_size=4)
    kw = dict(window_left=W, page_size=4)
    P = args[6]
    table = d["table"].clone()
    last = int(P[2]) - 1
    table[2, last // 4 - int(d["starts"][2]) // 4] = 0
    with raises(2, last // 4 * 4, text="dummy page 0"):
        swa_extend(*args, page_table=table, window_starts=d["starts"], debug=True, **kw)
    starts = d["starts"].clone()
    starts[1] += 1
    with raises(1, text=r"window_starts\[1\] = 12 is past the first position the window reads, 11"):
        swa_extend(*args, page_table=d["table"], window_starts=starts, debug=True, **kw)


def test_cpu_copies_must_agree():
    """A host copy (``<name>_cpu``) that disagrees with its device tensor, as an op may take one."""
    seen = []

    @guard.guarded(lambda lens, lens_cpu=None: guard._check_cpu_copies("toy", {"lens": lens, "lens_cpu": lens_cpu}))
    def toy(lens, lens_cpu=None):
        seen.append(1)

    toy(torch.tensor([3, 4]), lens_cpu=torch.tensor([3, 4]), debug=True)
    with raises(1, text=r"lens_cpu\[1\] = 5 disagrees with lens\[1\] = 4"):
        toy(torch.tensor([3, 4]), lens_cpu=torch.tensor([3, 5]), debug=True)
    assert seen == [1], "the op must not run after a failed check"
    with raises(text="lens_cpu has 1 entries but lens has 2"):
        toy(torch.tensor([3, 4]), lens_cpu=[3], debug=True)


# ----- index builders --------------------------------------------------------------------------------


@pytest.mark.parametrize("page_size", [1, 4])
def test_builders_valid_states_pass(page_size):
    state, *_ = decode_state(page_size)
    rows, lens = state.req_pool_indices(), state.seq_lens()
    got = build_window_indices(state.req_to_token, rows, lens, window_left=W, mapping=state.mapping, debug=True)
    want = ref.decode_window_indices(state.req_to_token, rows, lens, W, state.mapping)
    assert torch.equal(got.kv_indices, want[1])
    build_window_page_table(state.req_to_token, rows, lens, window_left=W, page_size=page_size, mapping=state.mapping, debug=True)
    guard.check_build_window_indices(state.req_to_token, rows, lens, window_left=-1)
    guard.check_build_window_indices(state.req_to_token, rows, lens, window_left=W, prefix_lens=lens - 1, mapping=state.mapping)


def test_builders_lengths_and_rows():
    state, *_ = decode_state()
    rtt, rows, lens = state.req_to_token, state.req_pool_indices(), state.seq_lens()
    kw = dict(window_left=W, mapping=state.mapping)
    bad = rows.clone()
    bad[1] = rtt.shape[0]
    with raises(1, text="not a row of req_to_token"):
        build_window_indices(rtt, bad, lens, debug=True, **kw)
    bad = lens.clone()
    bad[2] = rtt.shape[1] + 1
    with raises(2, text="outside"):
        build_window_indices(rtt, rows, bad, debug=True, **kw)
    with raises(0, text=r"prefix_lens\[0\] = 6 is outside \[0, seq_lens\[0\] = 5\]"):
        build_window_indices(rtt, rows, lens, prefix_lens=lens + 1, debug=True, **kw)
    with raises(text="num_indices=20, but the windows hold 19"):
        build_window_indices(rtt, rows, lens, num_indices=20, debug=True, **kw)
    with raises(0, text=r"window \[0, 5\) spans 2 pages of page_size 4, more than max_pages=1: the pages past it would be dropped"):
        build_window_page_table(rtt, rows, lens, window_left=W, page_size=4, max_pages=1, debug=True)


def test_builders_unwritten_and_foreign_slots():
    state, *_ = decode_state()
    rtt, rows, lens = state.req_to_token.clone(), state.req_pool_indices(), state.seq_lens()
    r1, r2 = state.requests[1], state.requests[2]
    rtt[r1.req_pool_index, r1.seq_len - 2] = 0
    with raises(1, r1.seq_len - 2, 0, "dummy slot"):
        build_window_indices(rtt, rows, lens, window_left=W, mapping=state.mapping, debug=True)
    # the mapping points a token of request 1 at an SWA slot of request 2's window
    mapping = state.mapping.clone()
    full1 = int(state.req_to_token[r1.req_pool_index, r1.seq_len - 2])
    full2 = int(state.req_to_token[r2.req_pool_index, r2.seq_len - 1])
    mapping[full1] = mapping[full2]
    with raises(1, r1.seq_len - 2, text=f"request 2 \\(batch index\\) position {r2.seq_len - 1}.*share one slot"):
        build_window_indices(state.req_to_token, rows, lens, window_left=W, mapping=mapping, debug=True)
    # a full slot past the mapping
    rtt = state.req_to_token.clone()
    rtt[r2.req_pool_index, r2.seq_len - 1] = mapping.numel() - 1
    with raises(2, r2.seq_len - 1, mapping.numel() - 1, "past the"):
        build_window_indices(rtt, rows, lens, window_left=W, mapping=state.mapping, debug=True)


def test_builders_padding_row_is_exempt():
    state, *_ = decode_state()
    rows = torch.cat([state.req_pool_indices(), torch.zeros(1, dtype=torch.int64)])
    lens = torch.cat([state.seq_lens(), torch.ones(1, dtype=torch.int64)])
    guard.check_build_window_indices(state.req_to_token, rows, lens, window_left=W, mapping=state.mapping)


def test_page_table_builder_offsets():
    state, *_ = decode_state(page_size=4)
    rtt, rows, lens = state.req_to_token.clone(), state.req_pool_indices(), state.seq_lens()
    r = state.requests[2]
    pos = r.seq_len - 1  # 29: offset 1 of the page of positions 28-31 (30 and 31 unused)
    assert pos % 4 == 1
    rtt[r.req_pool_index, pos] += 2
    with raises(2, pos, text="sits at offset 3 of its page, not at the position's offset 1"):
        build_window_page_table(rtt, rows, lens, window_left=W, page_size=4, debug=True)
    rtt = state.req_to_token.clone()
    rtt[r.req_pool_index, pos] += 4 * 1000
    with raises(2, pos, text="but its page's first token \\(position 28\\) is on page"):
        build_window_page_table(rtt, rows, lens, window_left=W, page_size=4, debug=True)


# ----- writes ----------------------------------------------------------------------------------------


def test_out_cache_loc_and_store_kv():
    state, *_ = decode_state()
    loc = state.new_slots()
    mapping = state.mapping
    kb, vb = state.kv_pool.get_kv_buffer(0)
    k, v = torch.randn(len(loc), 2, 16), torch.randn(len(loc), 2, 16)
    swa = swa_out_cache_loc(loc, mapping, debug=True)
    store_kv(kb, vb, loc, k, v, mapping=mapping, debug=True)
    store_kv(kb, vb, torch.cat([swa, swa.new_zeros(1)]), torch.cat([k, k[:1]]), torch.cat([v, v[:1]]), debug=True)
    bad = loc.clone()
    bad[1] = -1  # the mapping's sentinel passes through translation, never into a store
    assert swa_out_cache_loc(bad, mapping, debug=True)[1] == -1
    with raises(text=r"token 1: full slot -1 \(loc\[1\]\) is negative"):
        store_kv(kb, vb, bad, k, v, mapping=mapping, debug=True)
    with raises(text=r"token 1: slot -1 \(loc\[1\]\) is negative"):
        store_kv(kb, vb, bad, k, v, debug=True)
    bad[1] = -2
    with raises(text=r"token 1: full slot -2 \(out_cache_loc\[1\]\) is negative"):
        swa_out_cache_loc(bad, mapping, debug=True)
    bad[1] = mapping.numel()
    with raises(text=r"token 1: full slot \d+ .*past the"):
        swa_out_cache_loc(bad, mapping, debug=True)
    evicted = mapping.clone()
    evicted[loc[2]] = 0
    with raises(text=r"token 2: .*has SWA slot 0"):
        swa_out_cache_loc(loc, evicted, debug=True)
    with raises(text=r"token 2: .*has SWA slot 0"):
        store_kv(kb, vb, loc, k, v, mapping=evicted, debug=True)
    bad = swa.clone()
    bad[0] = kb.shape[0]
    with raises(text=rf"token 0: slot {kb.shape[0]} \(loc\[0\]\) is past the {kb.shape[0]} rows of k_buffer"):
        store_kv(kb, vb, bad, k, v, debug=True)
    bad[0] = bad[2]
    with raises(text="token 0 and token 2 share one slot"):
        store_kv(kb, vb, bad, k, v, debug=True)
    foreign = mapping.clone()
    foreign[loc[0]] = kb.shape[0] + 3
    with raises(text=rf"token 0: slot {kb.shape[0] + 3} \(mapping"):
        store_kv(kb, vb, loc, k, v, mapping=foreign, debug=True)


# ----- backend step ----------------------------------------------------------------------------------


def backend_step(page_size=1, mode=ForwardMode.DECODE):
    new = [1, 1, 1] if mode == ForwardMode.DECODE else [3, 1, 2]
    lens = LENS if mode == ForwardMode.DECODE else [n + m for n, m in zip(LENS, new)]
    state = make_pool_state(seq_lens=lens, window_left=W, page_size=page_size, new_tokens=new, swa_head_num=2, swa_head_dim=16)
    runner = ModelRunner(state.kv_pool, state.allocator, state.req_to_token_pool, sliding_window_size=W)
    backend = TritonSWAAttnBackend(runner)
    rows, seq, prefix = state.req_pool_indices(), state.seq_lens(), state.prefix_lens()
    loc = state.new_slots()
    if mode == ForwardMode.DECODE:
        batch = ForwardBatch(mode, 3, rows, seq, loc, seq_lens_cpu=seq.clone())
    elif mode == ForwardMode.TARGET_VERIFY:
        state = make_pool_state(
            seq_lens=[n + 2 for n in LENS], window_left=W, page_size=page_size, new_tokens=2, swa_head_num=2, swa_head_dim=16
        )
        runner = ModelRunner(state.kv_pool, state.allocator, state.req_to_token_pool, sliding_window_size=W)
        backend = TritonSWAAttnBackend(runner)
        rows, prefix = state.req_pool_indices(), state.prefix_lens()
        batch = ForwardBatch(mode, 3, rows, prefix, state.new_slots(), seq_lens_cpu=prefix.clone(), spec_info=SpecInfo(2))
    else:
        e = torch.tensor(new)
        batch = ForwardBatch(
            mode,
            3,
            rows,
            seq,
            loc,
            seq_lens_cpu=seq.clone(),
            extend_prefix_lens=prefix,
            extend_seq_lens=e,
            extend_prefix_lens_cpu=prefix.tolist(),
            extend_seq_lens_cpu=new,
        )
    backend.init_forward_metadata(batch)
    return state, backend, batch


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY], ids=["decode", "extend", "verify"])
def test_forward_metadata_valid_steps_pass(page_size, mode):
    state, backend, batch = backend_step(page_size, mode)
    guard.check_forward_metadata(backend, batch)


@pytest.mark.parametrize("page_size", [1, 4])
def test_forward_metadata_evicted_token_in_window(page_size):
    state, backend, batch = backend_step(page_size)
    r = state.requests[1]
    pos = r.seq_len - 2
    state.mapping[state.req_to_token[r.req_pool_index, pos].long()] = 0  # after the metadata was built
    with raises(1, pos, text="kv_indices|evicted"):
        guard.check_forward_metadata(backend, batch)
    backend.init_forward_metadata(batch)  # rebuilt: now it agrees with the reference, but the slot is dead
    with raises(1, text="SWA slot 0|evicted"):
        guard.check_forward_metadata(backend, batch)


def test_forward_metadata_foreign_slot_and_free_slot():
    state, backend, batch = backend_step()
    r1, r2 = state.requests[1], state.requests[2]
    full1 = state.req_to_token[r1.req_pool_index, r1.seq_len - 3].long()
    full2 = state.req_to_token[r2.req_pool_index, r2.seq_len - 3].long()
    state.mapping[full1] = state.mapping[full2]
    backend.init_forward_metadata(batch)
    with raises(1, r1.seq_len - 3, text="share one slot"):
        guard.check_forward_metadata(backend, batch)
    state, backend, batch = backend_step()
    r = state.requests[0]
    swa = state.mapping[state.req_to_token[r.req_pool_index, r.seq_len - 2].long()]
    state.allocator.swa_attn_allocator.free_pages = torch.cat([state.allocator.swa_attn_allocator.free_pages, swa.reshape(1)])
    with raises(0, r.seq_len - 2, int(swa), "free page"):
        guard.check_forward_metadata(backend, batch)


def test_forward_metadata_corrupt_indices_and_lengths():
    state, backend, batch = backend_step()
    meta = backend.forward_metadata
    e = int(meta.sliding.kv_indptr[2]) + 1
    meta.sliding.kv_indices[e] = meta.sliding.kv_indices[e - 1]
    with raises(2, int(meta.sliding.window_starts[2]) + 1, text="sliding layers.*kv_indices"):
        guard.check_forward_metadata(backend, batch)
    state, backend, batch = backend_step()
    batch.seq_lens_cpu[1] += 1
    with raises(1, text="seq_lens_cpu"):
        guard.check_forward_metadata(backend, batch)
    state, backend, batch = backend_step()
    batch.out_cache_loc = batch.out_cache_loc.flip(0)
    with raises(0, LENS[0] - 1, text="out_cache_loc"):
        guard.check_forward_metadata(backend, batch)
    state, backend, batch = backend_step(mode=ForwardMode.EXTEND)
    backend.forward_metadata.prefix_lens_cpu[2] -= 1
    with raises(2, text="prefix_lens_cpu"):
        guard.check_forward_metadata(backend, batch)


def test_malformed_arguments_get_the_ops_own_error():
    """In debug mode the op's own argument checks still name a malformed argument (the guard defers)."""
    state, q, k, v, d = decode_state()
    with pytest.raises(ValueError, match="kv_indptr must have shape"):
        swa_decode(q, k, v, kv_indptr=d["ptr"][:-1], kv_indices=d["idx"], debug=True)
    with pytest.raises(TypeError, match="kv_indices must have dtype"):
        swa_decode(q, k, v, kv_indptr=d["ptr"], kv_indices=d["idx"].float(), debug=True)
    with pytest.raises(ValueError, match="kv_indices must be on device cpu"):
        swa_decode(q, k, v, kv_indptr=d["ptr"], kv_indices=d["idx"].to("meta"), debug=True)
    with pytest.raises(ValueError, match="max_window must be >= 0"):
        swa_decode(q, k, v, kv_indptr=d["ptr"], kv_indices=d["idx"], max_window=-1, debug=True)
    rows, lens = state.req_pool_indices(), state.seq_lens()
    with pytest.raises(ValueError, match="page_size=7 disagrees"):
        build_window_page_table(state.req_to_token, rows, lens, window_left=W, page_size=7, mapping=state.mapping, debug=True)
    with pytest.raises(ValueError, match="window_left"):
        build_window_indices(state.req_to_token, rows, lens, window_left=-2, debug=True)


@pytest.mark.parametrize("page_size", [1, 4])
def test_forward_metadata_of_a_padded_cuda_graph_replay(page_size):
    """The fixed-buffer (CUDA-graph) metadata with a padding entry (row 0, length 1) passes; a slot
    evicted inside a real request's window is still found."""
    state, backend, _ = backend_step(page_size)
    rows, lens = state.req_pool_indices(), state.seq_lens()
    rows, lens = torch.cat([rows, rows.new_zeros(1)]), torch.cat([lens, lens.new_ones(1)])
    backend.init_cuda_graph_state(max_bs=4, max_num_tokens=4)
    backend.init_forward_metadata_capture_cuda_graph(4, 4, rows, lens, None, ForwardMode.DECODE, None)
    backend.init_forward_metadata_replay_cuda_graph(4, rows, lens, int(lens.sum()), None, ForwardMode.DECODE, None)
    padded = ForwardBatch(ForwardMode.DECODE, 4, rows, lens, None)
    guard.check_forward_metadata(backend, padded)
    r = state.requests[0]
    state.mapping[state.req_to_token[r.req_pool_index, r.seq_len - 1].long()] = 0
    backend.init_forward_metadata_replay_cuda_graph(4, rows, lens, int(lens.sum()), None, ForwardMode.DECODE, None)
    with raises(0, r.seq_len - 1, text="SWA slot 0"):
        guard.check_forward_metadata(backend, padded)
