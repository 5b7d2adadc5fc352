"""Op ``sglang_backend`` of ``triton-swa bench``: SGLang's whole Triton backend beside ours on SGLang's
own pools. Its smoke run (tiny shapes; on a CPU through Triton's interpreter) checks both providers
and records the runner's rows; without SGLang the op says so and exits cleanly; it is no default op."""

from __future__ import annotations

import csv
import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from triton_swa.benchmark import sglang_backend as S
from triton_swa.benchmark.cases import ATTENTION_OPS, OPS

ROOT = Path(__file__).resolve().parents[2]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.sglang
@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="SGLang is not installed (bash scripts/setup_sglang.sh installs it)")
def test_smoke_checks_both_providers_then_times_them(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("TRITON_INTERPRET", None)  # the command turns the interpreter on by itself
    done = subprocess.run(
        [sys.executable, "-m", "triton_swa", "bench", "--op", "sglang_backend", "--smoke", "--out", str(tmp_path)]
        + ["--git-sha", "abc", "--dirty", "clean"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "n/a:" not in done.stdout, done.stdout[-3000:]  # the op ran, not just said why it could not
    (path,) = tmp_path.glob("bench-*.csv")
    rows = {(r["case"], r["provider"]): r for r in csv.DictReader(path.open())}
    cases = S.catalog(smoke=True, device=DEVICE)
    assert {c for c, _ in rows} == {c.id for c in cases}
    for case in cases:
        for provider in S.PROVIDERS:
            row = rows[(case.id, provider)]
            assert row["op"] == "sglang_backend" and row["git_sha"] == "abc" and row["dirty"] == "clean", row
            assert row["status"].startswith("ok") and float(row["max_abs_err"]) < 1e-2, row
            # SGLang's decode keeps W keys, one short of docs/contract.md §1: judged at W - 1, and says so
            assert ("at W-1" in row["status"]) == (provider == "sglang_triton" and case.kind == "decode"), row
            assert math.isfinite(float(row["us_p50"])) == case.timed, row
        if case.timed:
            assert rows[(case.id, "copy_same_bytes")]["status"].startswith("ok")
    assert "| decode-smoke-d16-w7-B3-ragged-P1 |" in done.stdout


def test_without_sglang_the_op_says_so_and_exits_cleanly(monkeypatch, capsys):
    from triton_swa.benchmark import main

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sglang" else find_spec(name, *a))
    assert main(["--smoke", "--op", "sglang_backend"]) == 0
    assert "n/a: SGLang is not installed" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--op", "sglang_backend,decode"], "--op sglang_backend runs alone"),
        (["--op", "sglang_backend", "--providers", "flex"], "['flex'] not of --op sglang_backend"),
        (["--op", "sglang_backend", "--shape", "gptoss"], "['gptoss'] not of --op sglang_backend"),
    ],
)
def test_bad_arguments_are_named(args, message, capsys):
    from triton_swa.benchmark import main

    with pytest.raises(SystemExit) as exc:
        main(["--smoke", *args])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_an_op_of_its_own_not_a_default():
    assert "sglang_backend" in OPS and "sglang_backend" not in ATTENTION_OPS
    cases = S.catalog()
    assert len({c.id for c in cases}) == len(cases)
    assert all(c.timed == (not c.shape.name.startswith("probe")) for c in cases)
    quick = S.catalog(quick=True)
    assert {c.kind for c in quick} == {"decode", "extend"} and len(quick) < len(cases)


def test_bytes_and_flops_as_the_script_before_counted_them():
    """The rows of ``bench/results/sglang-triton-2026-12-01-*`` (the script this op replaced) stay
    comparable: the same bytes and flops for the same case."""
    case = S.BackendCase("decode", S.MODELS["d128-w1023"], (4095,), 1)
    assert case.id == "decode-d128-w1023-B1-L4k-P1"
    assert (case.nbytes(), case.flops()) == (4218880, 16777216)
    extend = S.BackendCase("extend", S.MODELS["d128-w1023"], (32768,), 16, new=512)
    assert extend.id == "extend-d128-w1023-B1-pre32k-E512-P16" and extend.q_positions()[0][-1] == 32768 + 511


def test_outside_a_checkout_no_stand_ins_are_loaded(monkeypatch, tmp_path):
    """An install has no tests/: the op loads no stand-ins (and SGLang then imports as it can)."""
    monkeypatch.setattr(S, "STUBS", tmp_path / "sglang_stubs.py")
    assert S._install_stubs() == []
