"""The backend's planned path (plan once per step and kind of layer, launch per layer) against its
checked path (every check and plan on every call, as under the debug guard): the same bits, layer
by layer, through prefill, decode and verify steps; plans follow a layer's attributes and refuse a
bad one before anything is written."""

from __future__ import annotations

import pytest
import torch

from tests.test_backend import HQ, make_sim, model_layers, run_step
from triton_swa.backend import TritonSWAAttnBackend
from triton_swa.engine import AttentionLayer, ForwardMode, ModelRunner


class _BothPaths(TritonSWAAttnBackend):
    """Each layer call runs the checked path, then the planned one, and asserts the same bits."""

    calls = 0

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
    _BothPaths.calls = 0
    run_step(sim, backend, layers, ForwardMode.EXTEND, [7, 3, 12])
    runs = len(backend.forward_metadata.runs)
    # layers 0 and 2 differ in their cap, 1 is full, 3 reads 2's K/V (the checked path): three kinds
    assert runs == 3, backend.forward_metadata.runs.keys()
    sim.evict()
    run_step(sim, backend, layers, ForwardMode.DECODE, [1, 1, 1])
    sim.evict()
    layers[0].scaling = 0.3  # a new attribute: the layer's plan is made again, with it
    run_step(sim, backend, layers, ForwardMode.TARGET_VERIFY, [3, 3, 3], draft_num=3)
    assert _BothPaths.calls == 3 * len(layers)


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
