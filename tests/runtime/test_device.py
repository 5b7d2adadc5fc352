"""Device facts and what follows from them: how each target reads an fp8 pool."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from triton_swa.runtime.device import (
    INTERPRETER,
    KV_E4M3FN_BITS,
    KV_E4M3FNUZ_BITS,
    KV_NATIVE,
    TARGETS,
    device_facts,
    kv_fp8_mode,
    planning_for,
)
from triton_swa.testing import without_native_fp8

FN, FNUZ, U8 = torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.uint8
NATIVE_FN, BYTES_FN = (KV_NATIVE, FN), (KV_E4M3FN_BITS, U8)
NATIVE_FNUZ, BYTES_FNUZ = (KV_NATIVE, FNUZ), (KV_E4M3FNUZ_BITS, U8)


@pytest.mark.parametrize(
    "target, fn, fnuz",
    [
        ("sm_80", BYTES_FN, BYTES_FNUZ),
        ("sm_86", BYTES_FN, BYTES_FNUZ),
        ("sm_89", NATIVE_FN, BYTES_FNUZ),
        ("sm_90", NATIVE_FN, BYTES_FNUZ),
        ("sm_120", NATIVE_FN, BYTES_FNUZ),
        ("gfx90a", NATIVE_FN, BYTES_FNUZ),
        ("gfx942", NATIVE_FN, NATIVE_FNUZ),
        ("gfx950", NATIVE_FN, BYTES_FNUZ),
        ("gfx1100", NATIVE_FN, BYTES_FNUZ),
    ],
)
def test_each_target_reads_fp8_natively_only_where_triton_converts_it(target, fn, fnuz):
    facts = TARGETS[target]
    assert kv_fp8_mode(facts, FN) == fn
    assert kv_fp8_mode(facts, U8) == fn, "uint8 storage means e4m3fn"
    assert kv_fp8_mode(facts, FNUZ) == fnuz
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        assert kv_fp8_mode(facts, dtype) == (KV_NATIVE, None)


def test_the_interpreter_decodes_e4m3fnuz_from_its_bytes():
    """Triton 3.6's interpreter cannot load float8_e4m3fnuz: the CPU tier runs the byte decoder."""
    assert kv_fp8_mode(INTERPRETER, FNUZ) == BYTES_FNUZ and kv_fp8_mode(INTERPRETER, FN) == NATIVE_FN


def test_without_native_fp8_plans_the_byte_path_and_restores():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    before = device_facts(device)
    with without_native_fp8(device):
        inside = device_facts(device)
        assert inside.fp8 == () and dataclasses.replace(inside, fp8=before.fp8) == before
        assert kv_fp8_mode(inside, FN) == BYTES_FN
    assert device_facts(device) == before
    with planning_for(TARGETS["gfx942"]):
        assert device_facts(device).name == "gfx942"
    assert device_facts(device) == before


@pytest.mark.parametrize("target, fp8_keys", [("sm_90", 128), ("sm_80", 128), ("gfx942", 128), ("gfx1100", 64)])
def test_fp8_decode_tiles_double_the_keys_except_on_rdna(target, fp8_keys, monkeypatch):
    """fp8 decode tiles hold as many bytes as bf16 ones (twice the keys), except on RDNA (32-lane AMD
    waves), where the converted tile spills and keeps bf16's key count (``decode_block_config``).
    Planned as compiled code plans it (recorded, not run)."""
    import triton_swa.ops.decode.launcher as launcher
    from triton_swa.ops.decode import swa_decode
    from triton_swa.runtime.launch import recorded_launches

    monkeypatch.setattr(launcher, "interpreting", lambda: False)

    def block_n(kv_dtype):
        q = torch.randn(64, 32, 128, dtype=torch.bfloat16)
        k = torch.zeros(64 * 1024 + 1, 16, 128, dtype=kv_dtype)
        indptr = torch.arange(65, dtype=torch.int32) * 1024
        indices = torch.arange(1, 64 * 1024 + 1, dtype=torch.int32)
        with planning_for(TARGETS[target]), recorded_launches() as launches:
            swa_decode(q, k, k, kv_indptr=indptr, kv_indices=indices, max_window=1024)
        return launches[0][2]["BLOCK_N"]

    assert block_n(torch.bfloat16) == 64
    assert block_n(FN) == fp8_keys
