"""triton_swa.benchmark.model_sensitivity on the CPU engine tier's tiny Gemma 3: the float64 reference,
each dtype's departure from it and the prefix a token check can decide."""

from __future__ import annotations

import pytest

from triton_swa.benchmark import model_sensitivity as ms


def test_first_divergence():
    assert ms.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert ms.first_divergence([1, 2, 3], [1, 5, 3]) == 1


def test_tiny_gemma_float32_follows_float64_and_bfloat16_moves_more(tmp_path):
    pytest.importorskip("transformers")
    from triton_swa.benchmark.serve import _prompts, build_model

    path = build_model("gemma3-tiny", str(tmp_path), weights=True)
    prompts = [_prompts(1, 24, 77)[0], _prompts(1, 40, 78)[0]]
    results = ms.measure(path, prompts, 6)
    for r in results:
        assert len(r["tokens"]) == len(r["gaps"]) == 6 and all(g >= 0 for g in r["gaps"])
        f32, bf16 = r["dtypes"]["float32"], r["dtypes"]["bfloat16"]
        # float32 rounding against float64: far below any logit gap of note; bfloat16's is larger
        assert 0 < f32["max_logit_diff"] < 1e-3 < bf16["max_logit_diff"]
        # decisive: the outputs before the first float64 gap within twice the dtype's difference
        gaps = r["gaps"]
        assert f32["decisive"] == next((i for i, g in enumerate(gaps) if g <= 2 * f32["max_logit_diff"]), 6)
        assert bf16["decisive"] <= f32["decisive"]
    text = ms.report(results)
    assert "prompt 24: float64 min top-2 gap" in text and "float32: leaves float64's stream" in text


def test_cli_refuses_an_unknown_model(capsys):
    with pytest.raises(SystemExit):
        ms.main(["no-such-model"])
    assert "unknown model 'no-such-model'" in capsys.readouterr().err
