"""The demo in CI, at a tiny size: the real kernels, pools, serving loop and transformers' Gemma 4 code.

Under the policy of docs/contract.md §3 every draft is accepted (the draft runs the target's weights over its own
pool), the target's tokens equal transformers' ``generate()`` with eager attention, and the
spot-checked attention outputs match the reference. With the pre-fix rule on the draft worker, the
draft's sliding layers read other tokens' K/V once the slot spaces drift, and acceptance falls; the
tokens stay the target's (speculative decoding is lossless).
"""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("transformers", reason="the demo tier needs transformers 5.19 (pip install '.[demo]')")

from triton_swa.demo import PRESETS, run_demo  # noqa: E402

TINY = dataclasses.replace(PRESETS["cpu"], requests=3, prompt_lens=(10, 16), new_tokens=(16, 20), arrival_every=2, chunk=12, swa_size=56)


def test_tiny_demo_shows_the_collapse_and_its_fix():
    result = run_demo(TINY, quiet=True)  # on the GPU when there is one
    policy, legacy = result["runs"]["policy"], result["runs"]["legacy"]
    ideal = result["ideal"]
    assert policy["complete"] and legacy["complete"]
    # the policy: every draft accepted, unless an argmax near-tie explains a miss
    assert policy["accept"] and min(policy["accept"]) == ideal or result["near_ties"] > 0, policy["accept"]
    assert result["generate_match"] == result["generate_total"] == TINY.requests, result["mismatched"]
    # the legacy rule: acceptance falls within the run, once the slot spaces drift
    assert result["diverged_at"] is not None
    assert legacy["mean_accept"] < policy["mean_accept"] and min(legacy["accept"]) < ideal
    assert result["legacy_equals_policy"] == TINY.requests
    # spot-checked attention against the reference: right under the policy, wrong in the legacy draft
    for run, worker in (("policy", "target"), ("policy", "draft"), ("legacy", "target")):
        errors = result["runs"][run]["worst_error"][worker]
        assert set(errors) == {"sliding", "full"} and max(errors.values()) < 1e-4, (run, worker, errors)
    # wrong, but by other tokens' K/V: the pre-fix backend clamps its slots to the SWA buffer (no read
    # past it, whichever path built the step's indices), so the error stays that of real values
    assert 0.1 < result["runs"]["legacy"]["worst_error"]["draft"]["sliding"] < 100
