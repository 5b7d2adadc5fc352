"""The serving loop over transformers' Gemma 4 code: greedy decode and speculative rounds, page sizes 1
and 4; every request's tokens equal transformers' own ``generate()`` (eager attention), the allocator's
state is exactly what the live requests hold after every step, and everything is freed at the end."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("transformers", reason="the serving tier needs transformers 5.19 (pip install '.[demo]')")

from triton_swa.demo import PRESETS, build_model, request_stream  # noqa: E402
from triton_swa.integrations import transformers as tswa  # noqa: E402
from triton_swa.mem import check_allocator_invariants  # noqa: E402
from triton_swa.serving import Engine  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TINY = dataclasses.replace(
    PRESETS["cpu"], layers=2, requests=2, prompt_lens=(9, 14), new_tokens=(5, 7), arrival_every=1, chunk=8, max_running=2
)


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    tswa.register()
    m = build_model(TINY, 0, DEV)
    m.set_attn_implementation("eager")
    want = {}
    for r in request_stream(TINY, 0):
        with torch.inference_mode():
            g = m.generate(
                torch.tensor([r.prompt], device=DEV),
                max_new_tokens=r.max_new_tokens,
                min_new_tokens=r.max_new_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
        want[r.rid] = g[0, len(r.prompt) :].tolist()
    m.set_attn_implementation(tswa.NAME)
    return m, want


@pytest.mark.parametrize("speculative", [False, True], ids=["greedy", "speculative"])
@pytest.mark.parametrize("page_size", [1, 4], ids=["P1", "P4"])
def test_engine_serves_generates_tokens(model, speculative, page_size):
    m, want = model
    p = dataclasses.replace(TINY, page_size=page_size, full_size=128, swa_size=64)
    target = tswa.build_paged_kv(
        m, size=p.full_size, size_swa=p.swa_size, page_size=page_size, max_num_reqs=p.max_running, max_context_len=40
    )
    draft = tswa.build_draft_paged_kv(m, target) if speculative else None
    engine = Engine(
        tswa.ModelWorker(m, target),
        None if draft is None else tswa.ModelWorker(m, draft),
        num_draft_tokens=p.num_draft,
        chunk_size=p.chunk,
        max_running=p.max_running,
    )
    engine.submit(request_stream(p, 0))
    accepted, evicted_any = [], False
    while (st := engine.step()) is not None:
        accepted.extend(st.accepted)
        live = [(q.row, q.kv_len, q.evicted) for q in engine.running]
        evicted_any |= any(e > 0 for _, _, e in live)
        check_allocator_invariants(target.allocator, target.req_to_token_pool.req_to_token, live)
    done = {q.rid: q.output for q in engine.finished}
    assert done == want, "the served tokens differ from transformers' generate()"
    assert evicted_any, "the windows never slid past a page: eviction was not exercised"
    if speculative:
        assert accepted and all(a == p.num_draft for a in accepted), accepted  # the draft runs the target's weights
    alloc = target.allocator
    assert alloc.full_available_size() == alloc.size and alloc.swa_available_size() == alloc.size_swa
    assert target.req_to_token_pool.available_size() == p.max_running
