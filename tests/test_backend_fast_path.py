"""The backend's planned path (plan once per step and kind of layer, launch per layer) against its
checked path (every check and plan on every call, as under the debug guard): the same bits, layer
by layer, through prefill, decode and verify steps; plans follow a layer's attributes and refuse a
bad one before anything is written."""

from __future__ import annotations

import functools

import pytest
import torch

from tests.test_backend import HQ, make_sim, model_layers, run_step
from triton_swa.backend import TritonSWAAttnBackend
from triton_swa.engine import AttentionLayer, ForwardMode, ModelRunner


class _BothPaths(TritonSWAAttnBackend):
    """Each layer call runs the checked path, then the planned one, and asserts the same bits."""

    calls = 0
    followed = 0

    def _follow_decode(self, *args):
        run = super()._follow_decode(*args)
        type(self).followed += run is not None
        return run

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        want = self._forward_decode_checked(q, k, v, layer, forward_batch, save_kv_cache)
        return self._same(want, super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache), layer)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        want = self._forward_extend_checked(q, k, v, layer, forward_batch, save_kv_cache)
        return self._same(want, super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache), layer)

    def _same(self, want, got, layer):
        assert got.shape == want.shape and torch.equal(got, want), f"layer {layer.layer_id}: planned != checked"
        type(self).calls += 1
        return got


def _stack(window_left, page_size, device):
    sim = make_sim(window_left, page_size, seed=5, device=device)
    runner = ModelRunner(sim.pool, sim.alloc, sim.rtp, sliding_window_size=window_left, device=device)
    return sim, _BothPaths(runner), model_layers(window_left)


@pytest.mark.interpreter
@pytest.mark.parametrize("page_size", [1, 4])
def test_planned_path_equals_checked_path(page_size, device):
    window_left = 5
    sim, backend, layers = _stack(window_left, page_size, device)
    _BothPaths.calls = _BothPaths.followed = 0
    run_step(sim, backend, layers, ForwardMode.EXTEND, [7, 3, 12])
    runs = len(backend.forward_metadata.runs)
    # layers 0 and 2 differ in their cap, 1 is full, 3 reads 2's K/V (the checked path): three kinds
    assert runs == 3, backend.forward_metadata.runs.keys()
    sim.evict()
    run_step(sim, backend, layers, ForwardMode.DECODE, [1, 1, 1])
    sim.evict()
    # a second decode step: each kind follows the first's plans to this step's windows and slots
    assert _BothPaths.followed == 0
    run_step(sim, backend, layers, ForwardMode.DECODE, [1, 1, 1])
    assert _BothPaths.followed == 3  # the writing kinds (layer 3 writes none)
    sim.evict()
    layers[0].scaling = 0.3  # a new attribute: the layer's plan is made again, with it
    run_step(sim, backend, layers, ForwardMode.TARGET_VERIFY, [3, 3, 3], draft_num=3)
    assert _BothPaths.calls == 4 * len(layers)


@pytest.mark.interpreter
def test_a_bad_attribute_after_the_first_call_raises_before_writing(device, monkeypatch):
    """Two sliding layers of one kind; the second's k_scale turns bad (a number, as the kind allows)
    after a step: its next call raises naming it, though the first layer planned the step's launches
    for their kind, and its K/V stay unwritten."""
    window_left = 5
    sim, checked, _ = _stack(window_left, 1, device)
    backend = TritonSWAAttnBackend(checked.model_runner)
    first, second = (AttentionLayer(i, HQ, 2, 16, sliding_window_size=window_left, k_scale=1.0, v_scale=1.0) for i in (0, 2))
    run_step(sim, backend, [first, second], ForwardMode.EXTEND, [4, 2, 3])
    sim.evict()
    sim.poison()
    monkeypatch.setattr(sim, "poison", lambda: None)  # nothing but the layers may touch the pool now
    second.k_scale = -1.0
    pool = sim.pool.swa_kv_pool
    before = [pool.k_buffer[1].clone(), pool.v_buffer[1].clone()]  # layer 2's buffers
    with pytest.raises(ValueError, match="k_scale"):
        run_step(sim, backend, [first, second], ForwardMode.DECODE, [1, 1, 1])
    for got, want in zip((pool.k_buffer[1], pool.v_buffer[1]), before):
        assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0)), "a refused layer wrote K/V"


def _record(calls: list, name: str, args: tuple) -> None:
    calls.append((name, args))


@pytest.mark.interpreter
def test_a_layers_direct_launch_passes_what_the_plans_launch_passes(device, monkeypatch):
    """``forward_decode``'s direct launch (the layer's pointers kept by its plan) hands the bound
    kernels the arguments the decode plan's own bound launch would, position by position; only the
    stand-ins for absent tensors (sinks, scales, a store's buffers) may differ, and they stay valid
    16-byte-aligned addresses. Layers with and without sinks and tensor scales, fused store on."""
    window_left = 5
    sim, _, layers = _stack(window_left, 1, device)
    backend = TritonSWAAttnBackend(ModelRunner(sim.pool, sim.alloc, sim.rtp, sliding_window_size=window_left, device=device))
    one = torch.ones((), device=device)
    layers = layers[:3] + [
        AttentionLayer(0, HQ, 2, 16, sliding_window_size=window_left, sinks=torch.randn(HQ, device=device), k_scale=one, v_scale=one)
    ]
    run_step(sim, backend, layers[:3], ForwardMode.EXTEND, [4, 2, 3])
    sim.evict()
    run_step(sim, backend, layers[:3], ForwardMode.DECODE, [1, 1, 1])  # the step the calls below plan in
    fb_loc = sim.allocate([1, 1, 1])  # a further step's slots, for the calls below
    fb = type("Batch", (), {"out_cache_loc": fb_loc})()
    checked = 0
    for layer in layers:
        T, H = 3, layer.tp_k_head_num
        q = torch.randn(T, HQ * layer.head_dim, device=device)
        k, v = torch.randn(T, H * layer.head_dim, device=device), torch.randn(T, H * layer.v_head_dim, device=device)
        lp, k_buf, v_buf, run, out = backend._planned_call(q, k, v, layer, fb, True, extend=False)
        attend = run.attend
        assert lp.decode_ptrs is not None and run.fused_store
        calls = []
        main = functools.partial(_record, calls, "main")
        merge = None if attend._plan.merge is None else functools.partial(_record, calls, "merge")
        monkeypatch.setattr(attend._plan, "bound", (main, merge))
        (k_f, k_t), (v_f, v_t) = lp.scales
        attend._launch(q, k_buf, v_buf, out, layer.sinks, k_f, k_t, v_f, v_t, (k, v, *lp.store_views))
        want, calls[:] = list(calls), []
        assert attend._run_layer(q, out, lp.decode_ptrs, k_f, v_f, k, v)
        assert [c[0] for c in calls] == [c[0] for c in want] and want[0][0] == "main"
        (_, got), (_, ref) = calls[0], want[0]
        assert len(got) == len(ref)
        n = 4 + len(attend._ptrs)  # q, k, v, out, the plan's own: then sinks, k_scale, v_scale
        stand_ins = {n + i for i, t in enumerate((layer.sinks, k_t, v_t)) if t is None}
        for i, (a, b) in enumerate(zip(got, ref)):
            if i in stand_ins:
                assert a == lp.buffers[0] and b == q.data_ptr(), i
            else:
                assert a == b, f"layer {layer.layer_id}: argument {i}: {a} != {b}"
        for (_, a), (_, b) in zip(calls[1:], want[1:]):  # the merge: its sinks may be a stand-in
            assert a[0] == b[0] and a[2:] == b[2:] and (a[1] == b[1] or layer.sinks is None)
        checked += 1
        monkeypatch.undo()
    assert checked == len(layers)
