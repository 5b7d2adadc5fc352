"""The load-and-fault scenario's pieces that need no engine (triton_swa.testing.sglang_load): the
engine arguments by concurrency and device, the requests and their faults, the checks on a report,
the retraction count from SGLang's log lines, the GPU server's environment, the CLI's parsing."""

from __future__ import annotations

import collections
import json

import pytest

from triton_swa.testing import sglang_load as sl

pytestmark = pytest.mark.reference


def _passing_report(**over) -> dict:
    counts = {"full": 640, "swa": 512, "req": 16, "cached": 0, "swa_cached": 0}
    r = dict(
        family="gemma4",
        backend="triton_swa",
        device="cpu",
        speculative="STANDALONE",
        requests=64,
        concurrency=16,
        fault_scale=1,
        faults=15,
        swa_pool=True,
        finished=55,
        aborted=5,
        left=3,
        refused=1,
        compared_tokens=600,
        problems=[],
        retractions=5,
        retraction_causes={"pool": 0, "forced": 5},
        before=dict(counts),
        after=dict(counts),
        flush_status=200,
        last_status=200,
        last_body=json.dumps({"output_ids": [5, 6, 7]}),
        last_want=[5, 6, 7],
        tracebacks=[],
        leak_warnings=[],
        reference_s=9.0,
        start_s=30.0,
        load_s=60.0,
        wall_s=100.0,
    )
    r.update(over)
    return r


def test_engine_args_cpu_tier_and_gpu_scale():
    # 16 clients on the CPU: the CPU tier's arguments, as they were in the test
    assert sl.scenario_engine_args(16, context_length=256) == dict(
        max_total_tokens=640,
        context_length=256,
        max_running_requests=16,
        chunked_prefill_size=128,
        schedule_conservativeness=0.3,
        log_level="warning",
        dtype="float32",
    )
    g4 = sl.scenario_engine_args(64, device="cuda", family="gemma4")
    assert g4["max_total_tokens"] == 2560 and g4["max_running_requests"] == 64 and g4["cuda_graph_max_bs_decode"] == 64
    assert g4["disable_prefill_cuda_graph"] is True  # SGLang's prefill graph refuses KV-shared layers
    assert "disable_prefill_cuda_graph" not in sl.scenario_engine_args(64, device="cuda", family="gemma3")
    # a request at the context limit always fits beside others
    assert sl.scenario_engine_args(2, context_length=256)["max_total_tokens"] == 640


@pytest.mark.parametrize("n, scale", [(64, 1), (1000, 15)])
def test_requests_carry_each_fault_set_scale_times(n, scale):
    reqs = sl.scenario_requests(n, window=16, context_length=256, seed=11, fault_scale=scale)
    assert len(reqs) == n and len({r.rid for r in reqs}) == n
    got = collections.Counter(r.fault for r in reqs if r.fault)
    assert got == collections.Counter({f: c * scale for f, c in collections.Counter(sl.FAULT_SET).items()})
    for r in reqs:
        if r.fault == "context_limit":
            assert len(r.input_ids) + r.max_new_tokens == 256
        elif r.fault == "over_context":
            assert len(r.input_ids) + r.max_new_tokens == 257
        else:
            assert len(r.input_ids) > 16 + 8  # past the window: every prompt holds a whole prefix
    with pytest.raises(ValueError, match="at least"):
        sl.scenario_requests(30, window=8, context_length=256, fault_scale=2)


def test_scenario_problems_passes_a_clean_report_and_names_each_failure():
    assert sl.scenario_problems(_passing_report()) == []
    assert sl.scenario_problems(_passing_report(fault_scale=15, requests=1000, finished=860, left=45, refused=15)) == []
    cases = {
        "traceback": dict(tracebacks=["Traceback (most recent call last):\nValueError: slot 7 evicted"]),
        "leak warning": dict(leak_warnings=["memory leak detected"]),
        "!=": dict(problems=["load-3-plain (plain, finish length): [1] != [2]"]),
        "finished": dict(finished=50),
        "aborted": dict(aborted=0),
        "left mid-stream": dict(left=2),
        "refused": dict(refused=0),
        "no retraction": dict(retractions=0),
        "no idle state": dict(after=None),
        "swa:": dict(after={"full": 640, "swa": 500, "req": 16, "cached": 0, "swa_cached": 0}),
        "no SWA allocator": dict(
            before={"full": 640, "swa": -1, "req": 16, "cached": 0, "swa_cached": -1},
            after={"full": 640, "swa": -1, "req": 16, "cached": 0, "swa_cached": -1},
        ),
        "/flush_cache": dict(flush_status=500),
        "answered 503": dict(last_status=503, last_body="down"),
        "returned [5, 6, 8]": dict(last_body=json.dumps({"output_ids": [5, 6, 8]})),
        "unreadable": dict(last_body="not json"),
    }
    for needle, over in cases.items():
        problems = sl.scenario_problems(_passing_report(**over))
        assert len(problems) == 1 and needle in problems[0], (needle, problems)
    # Gemma 3 has no SWA pool: -1 is its SWA count
    g3 = dict(before={"full": 640, "swa": -1, "req": 16}, after={"full": 640, "swa": -1, "req": 16}, swa_pool=False, family="gemma3")
    assert sl.scenario_problems(_passing_report(**g3)) == []


def test_report_line_says_counts_and_times():
    line = sl.report_line(_passing_report())
    for part in ("gemma4 + STANDALONE", "64 requests (15 with faults)", "55 finished", "5 aborted", "3 left", "1 refused"):
        assert part in line
    assert "5 retracted (0 pool full, 5 forced)" in line and "640/512/16 -> 640/512/16" in line and "0 problems" in line
    assert "none differ" in line and "radix cache hits unknown" in line
    m = {"sglang:cached_tokens_total": 1200.0, "sglang:prompt_tokens_total": 3000.0}
    assert "1200 of 3000 prompt tokens from the radix cache" in sl.report_line(_passing_report(metrics=m))


def test_mismatches_name_the_first_differing_token_and_its_gap():
    reqs = [sl.LoadRequest("a", [2, 5], 4), sl.LoadRequest("b", [2, 6], 4, fault="abort_decode"), sl.LoadRequest("c", [2, 7], 2)]
    outs = [sl.Outcome("a", [9, 8, 7, 6], {"type": "length"}, 4), sl.Outcome("b", [9, 1], None, 2), sl.Outcome("c", [9, 8], None, 2)]
    ref = {"a": [9, 8, 7, 6], "b": [9, 8, 7, 6], "c": [9, 8, 0, 0]}
    gaps = {k: [1.0, 2e-6, 0.5, 0.5] for k in ref}
    tops = {k: [20.0, 20.0, 20.0, 20.0] for k in ref}
    rows = sl.mismatches(reqs, outs, ref, gaps, tops)
    assert rows == [dict(rid="b", at=1, got=1, want=8, gap=2e-6, top=20.0, near_tie=True)]
    assert "1 differ (1 at a near-tie" in sl.report_line(_passing_report(mismatches=rows))


def test_retraction_counts_by_cause():
    log = "\n".join(
        [
            "[2026 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 2, #aborted_retracted_reqs: 0, #new_token_ratio: 0.3",
            "[2026 TP0] Testing retraction. #retracted_reqs: 1, #aborted_retracted_reqs: 0",
            "[2026 TP0] Testing retraction. #retracted_reqs: 1, #aborted_retracted_reqs: 0",
        ]
    )
    assert sl.retraction_counts(log) == {"pool": 2, "forced": 2}
    assert sl.retractions(log) == 4 and sl.retractions("") == 0


def test_gpu_server_environment_and_arguments(tmp_path):
    from triton_swa.testing.sglang_engine import CUDA_STUBS, ENGINE_PLUGINS

    srv = sl.Server(
        "/models/m",
        "triton_swa",
        engine_args={"max_total_tokens": 2560},
        pythonpath=[str(CUDA_STUBS), str(tmp_path)],
        plugins="triton_swa,triton_swa_pool_probe",
        env={"TRITON_SWA_DEBUG": "1"},
        device="cuda",
        log_path=str(tmp_path / "server.log"),
    )
    env, args = srv._env, srv.args
    # the CUDA stand-in image loads the compiled-package stand-ins for every backend, before the caller's plugins
    assert env["SGLANG_PLUGINS"] == "triton_swa,triton_swa_gpu_standins,triton_swa_fused_ops,triton_swa_pool_probe"
    assert env["TRITON_SWA_DEBUG"] == "1"
    assert env["SGLANG_FORCE_FUSED_OP_BACKEND"] == "torch" and env["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] == "python"
    assert env["SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK"] == "1" and "TRITON_INTERPRET" not in env and "SGLANG_USE_CPU_ENGINE" not in env
    assert env["PYTHONPATH"].split(":")[:3] == [str(CUDA_STUBS), str(tmp_path), str(ENGINE_PLUGINS)]
    assert args["device"] == "cuda" and args["disable_cuda_graph"] is False and args["max_total_tokens"] == 2560
    assert srv.log_path == str(tmp_path / "server.log")
    cpu = sl.Server("/models/m", "triton_swa", device="cpu")
    assert cpu._env["SGLANG_PLUGINS"] == "triton_swa" and str(ENGINE_PLUGINS) not in cpu._env.get("PYTHONPATH", "")
    assert cpu._env["TRITON_INTERPRET"] == "1" and cpu._env["SGLANG_USE_CPU_ENGINE"] == "1" and cpu.args["device"] == "cpu"


def test_cli_key_values():
    assert sl._parse_kv(["max_total_tokens=1536", "disable_cuda_graph=true", 'x={"a": 1}'], as_json=True) == {
        "max_total_tokens": 1536,
        "disable_cuda_graph": True,
        "x": {"a": 1},
    }
    assert sl._parse_kv(["SGLANG_TEST_RETRACT_INTERVAL=3"], as_json=False) == {"SGLANG_TEST_RETRACT_INTERVAL": "3"}


def test_batched_reference_equals_one_prompt_at_a_time(tmp_path):
    pytest.importorskip("transformers")
    from triton_swa.testing.tiny_models import build_tiny_model

    model = build_tiny_model("gemma3", str(tmp_path / "gemma3"), seed=0)
    reqs = sl.scenario_requests(23, window=8, context_length=64, seed=3)
    prompts = [r.input_ids for r in reqs if not r.fault][:6] + [reqs[0].input_ids[:20], reqs[1].input_ids[:20]]
    alone = sl.greedy_reference(model, prompts, 4)
    batched = sl.greedy_reference(model, prompts, 4, batched=True)
    assert batched[0] == alone[0] and all(len(t) == 4 for t in alone[0])
    for a, b in zip(alone[1] + alone[2], batched[1] + batched[2]):  # top-2 gaps and |top1| per token
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5)
