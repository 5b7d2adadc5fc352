"""The GPU profile harness's arguments (triton_swa.benchmark.splits) on this machine: tiles parsed or
refused by name, the wide-head prefill cases found, decode cases refused a tile sweep before any GPU
work, and no CUDA device said plainly."""

import pytest

from triton_swa.benchmark import splits


def test_a_tile_is_four_or_five_positive_ints():
    assert splits.parse_tile("64x32x8x2") == dict(block_m=64, block_n=32, num_warps=8, num_stages=2)
    assert splits.parse_tile("128x16x8x3x2") == dict(block_m=128, block_n=16, num_warps=8, num_stages=3, dv_parts=2)
    for bad in ("64x32x8", "64x32x8x0", "64x32xeightx2", "64x32x8x2x2x1", ""):
        with pytest.raises(ValueError, match=r"--tile must be BMxBNxWARPSxSTAGES\[xPARTS\]"):
            splits.parse_tile(bad)


def test_the_wide_head_prefill_cases_are_found():
    ids = ["prefill-g4full-B1-L8k-W-1-D512-P1", "prefill-g4full-B1-L32k-E8192-W-1-D512-P1", "decode-g4full-B1-L4k-W-1-D512-P1"]
    assert [c.id for c in splits._cases(ids)] == ids
    with pytest.raises(SystemExit, match="unknown case ids"):
        splits._cases(["prefill-g4full-B1-L9k-W-1-D512-P1"])


def test_a_decode_case_is_refused_a_tile_sweep():
    (case,) = splits._cases(["decode-g4full-B1-L4k-W-1-D512-P1"])
    with pytest.raises(ValueError, match="extend tiles"):
        splits.sweep(case, ({}, splits.parse_tile("64x32x8x2")))


def test_without_cuda_it_says_so(capsys, monkeypatch):
    monkeypatch.setattr(splits.torch.cuda, "is_available", lambda: False)
    assert splits.main(["--tile", "64x32x8x2"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
