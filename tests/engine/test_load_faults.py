"""SGLang's own server under load and faults, serving through triton_swa (on this CPU, the kernels in
Triton's interpreter).

One ``launch_server`` per model: Gemma 4 (SGLang's ``SWAKVPool``, SWA eviction every 4 tokens) with
STANDALONE speculative decoding (chain drafts: the target drafting for itself) and Gemma 3 without.
Each serves, over HTTP on 127.0.0.1 from 16 concurrent streaming clients, 64 requests over three
prefixes longer than the window (prefixes nest, so the radix cache hits at three depths while the
SWA side drops the window pages older prefix tokens no longer need), with small pools and running
decodes retracted (SGLang's ``SGLANG_TEST_RETRACT``: it frees their slots and prefills them again
later), and with faults (triton_swa.testing.sglang_load):
disconnects mid-stream, ``/abort_request`` right after sending and mid-decode (in a speculative
round on Gemma 4), ``max_new_tokens`` 1 and 0, a request that fills the context exactly and one
past it (SGLang refuses it) and stop tokens.

Checks: every request that finished on its own returns transformers' greedy tokens for its prompt
(cut by its own limits), aborted and abandoned ones a prefix of them; at least one retraction
happened; at idle, after ``/flush_cache``, the allocators' free counts (full and SWA) and the free
request rows equal their values before the load (``tests/engine/plugins/triton_swa_pool_probe.py``),
and SGLang's own idle memory check runs strict (``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE``,
which raises on a leak or a double free); triton-swa's index guard is on (``TRITON_SWA_DEBUG=1``:
every index a kernel reads is checked first, an evicted or foreign slot raises); the server log holds
no traceback and the server still answers at the end.

The scenario itself is ``triton_swa.testing.sglang_load.run_scenario`` and its checks
``scenario_problems``: the GPU entry (``python -m triton_swa.testing.sglang_load --device cuda``,
``bash scripts/gpu.sh load SHA``) runs the same at 1000 requests from 64 clients.
"""

from __future__ import annotations

import os

import pytest

from triton_swa.testing.sglang_load import SCENARIOS, report_line, run_scenario, scenario_engine_args, scenario_problems

pytestmark = pytest.mark.sglang_engine

N_REQUESTS = 64
CONCURRENCY = 16
CONTEXT = 256
# the engine arguments: 640 full slots for 64 requests of 19-100 tokens with 16 in flight, so decodes
# grow past what the scheduler admitted for; SGLang sizes the SWA pool from the full one. The
# families (window, STANDALONE or not, environment): SCENARIOS

_results: dict = {}


def _serve(family: str, tiny_models, engine_pythonpath, tmp_path_factory) -> dict:
    report = run_scenario(
        tiny_models[family],
        family,
        n_requests=N_REQUESTS,
        concurrency=CONCURRENCY,
        context_length=CONTEXT,
        engine_args=scenario_engine_args(CONCURRENCY, context_length=CONTEXT),
        pythonpath=engine_pythonpath,
        device="cpu",
        probe_log_dir=str(tmp_path_factory.mktemp("pool_probe")),
    )
    print("\n" + report_line(report))
    return report


@pytest.fixture(scope="module")
def load_report(tiny_models, engine_pythonpath, tmp_path_factory):
    def get(family: str) -> dict:
        if family not in _results:
            _results[family] = _serve(family, tiny_models, engine_pythonpath, tmp_path_factory)
        return _results[family]

    return get


# Gemma 4 with STANDALONE drafts takes over 8 minutes on the 2-core CI machine (the draft and the
# target both run in Triton's interpreter): run only where asked (TRITON_SWA_ENGINE_LOAD_SPEC=1)
SPEC_OPT_IN = os.environ.get("TRITON_SWA_ENGINE_LOAD_SPEC") == "1"


@pytest.mark.parametrize(
    "family",
    [
        pytest.param(
            f, marks=pytest.mark.skipif(sc["speculative"] and not SPEC_OPT_IN, reason="speculative load run: TRITON_SWA_ENGINE_LOAD_SPEC=1")
        )
        for f, sc in SCENARIOS.items()
    ],
)
def test_load_and_faults_tokens_pools_and_log(load_report, family):
    r = load_report(family)
    problems = scenario_problems(r)
    assert not problems, "\n".join(problems)
