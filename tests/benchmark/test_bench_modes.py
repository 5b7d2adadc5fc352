"""The ops and modes of ``triton-swa bench`` beyond the attention ops: ``indices`` (the window index
build against a two-pass build and a plain gather), the guard-on and fp8 variants of ``triton_swa``,
``--compare`` (another source tree in its own workers) and ``--op step`` (its tables and rows; its
timing needs CUDA)."""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from triton_swa.benchmark import compare, step
from triton_swa.benchmark.cases import SHAPES, Case

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CPU_ONLY = pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU smoke run; the GPU runs the real grid")


def _bench(*args, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run(
        [sys.executable, "-m", "triton_swa", "bench", "--smoke", "--out", str(tmp_path), "--git-sha", "abc", "--dirty", "clean", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    paths = list(tmp_path.glob("bench-*.csv"))
    rows = list(csv.DictReader(paths[0].open())) if paths else []
    return done, {(r["case"], r["provider"]): r for r in rows}


@CPU_ONLY
def test_index_builds_and_the_triton_swa_variants_are_checked_then_timed(tmp_path):
    providers = "triton_swa,triton_swa_debug,triton_swa_fp8_bytes,triton_swa_fp8nuz,two_pass,plain_gather"
    done, rows = _bench("--op", "decode,indices", "--providers", providers, tmp_path=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    for case in ("indices-tiny-B3-L64-W15-D32-P1", "indices-tiny-B2-L100-W15-D32-P16"):
        for p in ("triton_swa", "triton_swa_debug", "two_pass", "plain_gather"):
            assert rows[(case, p)]["status"].startswith("ok") and float(rows[(case, p)]["max_abs_err"]) == 0, rows[(case, p)]
        assert rows[(case, "triton_swa_fp8_bytes")]["status"].startswith("n/a")
        assert int(rows[(case, "triton_swa")]["bytes"]) > 0
    for p in ("triton_swa_fp8_bytes", "triton_swa_fp8nuz"):
        assert rows[("decode-tiny-B2-L40-W15-D32-P1-fp8", p)]["status"].startswith("ok")
        assert rows[("decode-tiny-B2-L40-W15-D32-P1", p)]["status"] == "n/a: fp8 cases only"
    assert rows[("decode-tiny-B2-L40-W15-D32-P1", "two_pass")]["status"] == "n/a: op indices only"
    assert rows[("decode-tiny-B2-L40-W15-D32-P4", "triton_swa_debug")]["status"].startswith("ok")


def test_an_index_mismatch_is_wrong():
    """A build that leaves one entry unwritten (the poison stays) fails the exact check."""
    import torch

    from triton_swa.benchmark import providers as P

    case = Case("indices", SHAPES["tiny"], 3, 64)
    x = P.build(case, 0, "cpu")
    expected = P.reference(case, x)

    def partial():
        x["out"][0].copy_(expected[0])
        x["out"][1][:-1].copy_(expected[1][:-1])
        x["out"][2].copy_(expected[2])

    assert P.check(case, x, partial, expected) == 1.0
    assert x["out"][1][-1] == -7 and x["out"][1].dtype == torch.int32


@CPU_ONLY
def test_compare_runs_each_tree_in_its_own_workers(tmp_path):
    done, rows = _bench("--op", "decode", "--compare", f"same={ROOT}", "--rounds", "1", tmp_path=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert {p for _, p in rows} == {"triton_swa", "triton_swa@same"}
    assert all(r["status"].startswith("ok") for r in rows.values())
    assert f"worker: triton_swa {ROOT}/triton_swa/__init__.py" in done.stderr
    assert "| triton_swa us | triton_swa@same us |" in done.stdout


@CPU_ONLY
def test_compare_refuses_a_tree_whose_package_comes_from_elsewhere(tmp_path):
    """A tree whose triton_swa resolves outside it (here a link to this checkout's) is not measured."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "triton_swa").symlink_to(ROOT / "triton_swa")
    (tree / "triton_swa_reference").symlink_to(ROOT / "triton_swa_reference")
    out = tmp_path / "out"
    out.mkdir()
    done, rows = _bench("--op", "prefill", "--compare", f"linked={tree}", "--rounds", "1", tmp_path=out)
    assert done.returncode == 1
    assert rows[("prefill-tiny-B1-L48-W15-D32-P1", "triton_swa@linked")]["status"].startswith("CRASHED (inputs)")
    assert "outside the tree" in rows[("prefill-tiny-B1-L48-W15-D32-P1", "triton_swa@linked")]["status"]


def test_compare_trees_and_the_median_round():
    trees = compare.parse_trees([f"before={ROOT}", str(ROOT)])
    assert [n for n, _ in trees] == ["this", "before", ROOT.name]
    with pytest.raises(ValueError, match="taken"):
        compare.parse_trees([f"this={ROOT}"])
    rounds = [dict(status="ok", us=(1, t, 1)) for t in (3.0, 1.0, 2.0, 9.0)]
    assert compare._median_round(rounds)["us"][1] == 2.0
    assert compare._median_round([*rounds, dict(status="WRONG", us=None)])["status"] == "WRONG"


def test_step_needs_cuda(capsys):
    from triton_swa.benchmark import main

    if __import__("torch").cuda.is_available():
        pytest.skip("on a GPU the step runs")
    assert main(["--smoke", "--op", "step"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_step_host_only_times_the_host_path_on_the_cpu(monkeypatch, capsys):
    """``--op step --host-only``: every eager row of a (smaller) stack timed on the CPU with the launches
    stubbed out, the graph rows n/a, and the launcher restored afterwards."""
    from triton_swa.benchmark import main
    from triton_swa.runtime.launch import Launcher

    for name, value in (("CONTEXT", 256), ("WINDOW_LEFT", 63), ("SLIDING", 4), ("FULL", 2), ("CHUNK", 32), ("CHUNK_PREFIX", 63)):
        monkeypatch.setattr(step, name, value)
    call, bind = Launcher.__call__, Launcher.bind
    rows = step.measure("t", batches=[1, 2], verify_batches=[1], rounds=1, host_only=True)
    assert Launcher.__call__ is call and Launcher.bind is bind
    values = {(m, b): v for m, b, v in rows}
    eager = [k for k in values if not k[0].endswith("graph_us")]
    assert len(eager) == 21 and all(values[k] > 0 for k in eager), values
    assert all(math.isnan(v) for (m, _), v in values.items() if m.endswith("graph_us"))
    assert "host-only cost of t" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--op", "decode", "--host-only"])


FAKE = [("launch_floor_us", 1, 9.7), ("metadata_us", 1, 177.25), ("metadata_us", 8, 119.6), ("fi_decode_tc_max_abs_diff", 8, 0.0039)]


def test_step_tables_and_rows_from_fake_timings(tmp_path):
    assert step.table(FAKE).splitlines() == [
        "| metric | B1 | B8 |",
        "| --- | --- | --- |",
        "| launch_floor_us | 9.7 |  |",
        "| metadata_us | 177.2 | 119.6 |",
        "| fi_decode_tc_max_abs_diff |  | 0.0039 |",
    ]
    before = [("launch_floor_us", 1, 19.4), ("metadata_us", 1, math.nan)]
    lines = step.compare_table({"this": FAKE, "before": before}).splitlines()
    assert lines[0] == "| metric | B | this | before | before / this |"
    assert "| launch_floor_us | 1 | 9.7 | 19.4 | 2.00x |" in lines and "| metadata_us | 1 | 177.2 | n/a | - |" in lines
    assert "| metadata_us | 8 | 119.6 | n/a | - |" in lines
    rows = step.csv_rows(FAKE, "before:", "abc", "clean", "run")
    assert rows[1]["case"] == f"{step.STACK}-B1" and rows[1]["provider"] == "before:metadata_us" and rows[1]["us_p50"] == 177.25
    assert rows[3]["max_abs_err"] == 0.0039 and math.isnan(rows[3]["us_p50"]) and rows[3]["op"] == "step"
    from triton_swa.benchmark.runner import COLUMNS, write_csv

    assert all(set(r) == set(COLUMNS) for r in rows)
    write_csv(tmp_path / "step.csv", rows)
    assert len(list(csv.DictReader((tmp_path / "step.csv").open()))) == len(FAKE)


def test_split_sweep_cases_and_device(capsys):
    """``python -m triton_swa.benchmark.splits``: its default cases are catalogue decode cases, verify
    cases of the heuristics grid resolve too, an unknown id is refused by name, and without CUDA it
    says so (exit 2); on a GPU it runs in ``scripts/gpu.sh profile``."""
    from triton_swa.benchmark import splits

    assert [c.id for c in splits._cases(splits.DEFAULT_CASES)] == list(splits.DEFAULT_CASES)
    (verify,) = splits._cases(["verify-g3-B1-L8200-E8-W1023-D128-P16"])
    assert (verify.op, verify.batch, verify.new, verify.page_size) == ("verify", 1, 8, 16)
    with pytest.raises(SystemExit, match="decode-g4full-B1-L4k-W-9"):
        splits._cases(["decode-g4full-B1-L4k-W-9"])
    if __import__("torch").cuda.is_available():
        pytest.skip("on a GPU the sweep runs")
    assert splits.main(["--once", splits.DEFAULT_CASES[0]]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
