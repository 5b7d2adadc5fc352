"""The GPU engine tier's random-weight drafts (triton_swa.benchmark.serve_drafts): EAGLE, EAGLE3 and
DFLASH drafts of the tiny Gemma 3 and Gemma 4 targets, written here and loaded by SGLang 0.5.23's own
draft classes on the CPU (their ``load_weights``, every parameter compared with the checkpoint), in one
subprocess (the check publishes SGLang's runtime context and builds a gloo world of one). A draft with
a renamed tensor, one with a tensor left out and one with a wrong shape must fail that check. The
engine runs with these drafts need a GPU (scripts/gpu.sh engine)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from triton_swa.benchmark import serve
from triton_swa.benchmark import serve_drafts as D

ROOT = Path(__file__).resolve().parents[2]
TORCHVISION_STUBS = ROOT / "tests" / "integration" / "stubs"
HAS_SGLANG = importlib.util.find_spec("sglang") is not None


@pytest.fixture(scope="module")
def targets(tmp_path_factory) -> dict[str, str]:
    """The tiny targets, configs and tokenizers only (the drafts read nothing else of them)."""
    from triton_swa.testing.tiny_models import build_tiny_model

    root = tmp_path_factory.mktemp("targets")
    return {
        "gemma3": serve.build_model("gemma3-tiny", str(root), weights=False),
        "gemma4": build_tiny_model("gemma4", str(root / "gemma4-tiny"), weights=False),
    }


@pytest.fixture(scope="module")
def drafts(targets, tmp_path_factory) -> dict[tuple[str, str], str]:
    root = str(tmp_path_factory.mktemp("drafts"))
    return {(t, a): D.build_draft(a, path, root) for t, path in targets.items() for a in D.ALGORITHMS}


def _tensors(path: str) -> dict:
    from safetensors.torch import load_file

    return load_file(os.path.join(path, "model.safetensors"))


def _config(path: str) -> dict:
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


def test_drafts_take_the_targets_dims_and_are_reused(targets, drafts, tmp_path):
    for (t, algorithm), path in drafts.items():
        cfg, target = _config(path), D.target_dims(_config(targets[t]))
        assert cfg["architectures"] == [D._ARCH[algorithm]]
        assert (cfg["hidden_size"], cfg["vocab_size"]) == (target["hidden_size"], target["vocab_size"])
        assert (cfg["head_dim"], cfg["num_key_value_heads"]) == (target["head_dim"], target["kv_heads"])
        assert os.path.exists(os.path.join(path, "tokenizer.json"))
        tensors = _tensors(path)
        assert {n: tuple(x.shape) for n, x in tensors.items()} == D.draft_tensor_shapes(algorithm, cfg)
        assert all(str(x.dtype) == "torch.bfloat16" for x in tensors.values())
        assert not any(n.startswith(("embed_tokens", "lm_head")) or "d2t" in n for n in tensors)  # the target's are used
    # Gemma 4: the sliding layers' head dim (16), not the full layers' (32)
    assert _config(drafts[("gemma4", "EAGLE")])["head_dim"] == 16
    eagle3 = _config(drafts[("gemma3", "EAGLE3")])
    assert eagle3["draft_vocab_size"] == eagle3["vocab_size"] and eagle3["tie_word_embeddings"]
    dflash = _config(drafts[("gemma4", "DFLASH")])["dflash_config"]
    assert dflash["block_size"] == 4 and dflash["target_layer_ids"] == [1, 2, 3] and dflash["mask_token_id"] == 383
    # built once: the same directory, not rewritten
    path = drafts[("gemma3", "EAGLE")]
    stamp = os.stat(os.path.join(path, "model.safetensors")).st_mtime_ns
    assert D.build_draft("EAGLE", targets["gemma3"], os.path.dirname(path)) == path
    assert os.stat(os.path.join(path, "model.safetensors")).st_mtime_ns == stamp
    # seeded: another root, the same bytes
    again = D.build_draft("EAGLE", targets["gemma3"], str(tmp_path))
    a, b = _tensors(path), _tensors(again)
    assert all(a[n].equal(b[n]) for n in a)


def test_layer_ids_are_distinct_and_inside_the_target():
    # SGLang's own points where distinct: EAGLE3 [2, n//2, n-3] as capture points, DFLASH build_target_layer_ids
    assert D.layer_ids("EAGLE3", 26) == [1, 12, 22] and D.layer_ids("DFLASH", 26) == [1, 12, 23]
    assert D.layer_ids("EAGLE3", 24) == [1, 11, 20] and D.layer_ids("DFLASH", 6) == [1, 2, 3]
    for n in range(3, 50):
        for algorithm in ("EAGLE3", "DFLASH"):
            ids = D.layer_ids(algorithm, n)
            assert len(set(ids)) == 3 and ids == sorted(ids) and 0 <= ids[0] and ids[-1] < n, (algorithm, n, ids)
    with pytest.raises(ValueError):
        D.layer_ids("EAGLE3", 2)


def test_engine_args():
    for algorithm in ("EAGLE", "EAGLE3"):
        args = D.draft_engine_args(algorithm, "/d")
        assert args == dict(
            speculative_algorithm=algorithm,
            speculative_draft_model_path="/d",
            speculative_num_steps=3,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=4,
        )
    args = D.draft_engine_args("DFLASH", "/d")
    assert args["speculative_num_draft_tokens"] == D.DFLASH_BLOCK_SIZE == 4
    assert (args["speculative_num_steps"], args["speculative_eagle_topk"]) == (1, 1)
    with pytest.raises(ValueError):
        D.draft_engine_args("MEDUSA", "/d")


def _broken(drafts, tmp_path) -> dict[str, str]:
    """Copies of good drafts, each with one defect."""
    from safetensors.torch import save_file

    out = {}

    def copy(key, name, edit):
        dst = tmp_path / name
        shutil.copytree(drafts[key], dst)
        tensors = _tensors(str(dst))
        edit(tensors)
        save_file(tensors, str(dst / "model.safetensors"))
        out[name] = str(dst)

    copy(("gemma3", "EAGLE3"), "renamed", lambda t: t.update({"layers.0.mlp.upproj.weight": t.pop("layers.0.mlp.up_proj.weight")}))
    copy(("gemma4", "EAGLE"), "dropped", lambda t: t.pop("fc.bias"))
    copy(("gemma4", "DFLASH"), "reshaped", lambda t: t.update({"hidden_norm.weight": t["hidden_norm.weight"][:-1].clone()}))
    return out


@pytest.mark.sglang
@pytest.mark.skipif(not HAS_SGLANG, reason="SGLang is not installed (bash scripts/setup_sglang.sh installs it)")
def test_sglang_draft_classes_load_every_parameter(drafts, tmp_path):
    broken = _broken(drafts, tmp_path)
    good = list(drafts.values())
    env = dict(os.environ)
    # the check is a CPU one (serve_drafts' doc): on a GPU machine too, where SGLang's CUDA layers would
    # import sgl_kernel and its CuteDSL, neither of which the lent GPU's image loads; and SGLang's CPU
    # engine (with the CPU engine tier's sgl_kernel stand-in), whose rotary layers take their CPU path
    # (elsewhere off CUDA they import vLLM's op, which the lent GPU's image does not have)
    env.update(CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="1", SGLANG_USE_CPU_ENGINE="1")
    paths = [str(ROOT / "tests" / "engine" / "stubs"), str(ROOT)]
    if subprocess.run([sys.executable, "-c", "import torchvision.transforms"], capture_output=True, timeout=300).returncode != 0:
        paths.insert(0, str(TORCHVISION_STUBS))  # sglang.srt.configs imports torchvision.transforms
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    done = subprocess.run(
        [sys.executable, "-m", "triton_swa.benchmark.serve_drafts", "--check", *good, *broken.values()],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.stdout.strip(), done.stderr[-3000:]
    reports = {r["path"]: r for r in json.loads(done.stdout.strip().splitlines()[-1])}
    assert done.returncode == 1  # the broken ones

    for (t, algorithm), path in drafts.items():
        r = reports[path]
        assert r["ok"], {k: r.get(k) for k in ("error", "traceback", "missing", "unexpected", "mismatched", "binding", "capture_ok")}
        assert r["sglang_class"].endswith(D._ARCH[algorithm]) and r["error"] is None
        assert r["from_target"] == sorted(D.from_target(algorithm))
        assert len(r["loaded"]) + len(r["from_target"]) == r["parameters"]
        assert r["binding"] == "ok" and r["dims_ok"] and not r["hybrid_swa"]
        if algorithm != "EAGLE":
            assert r["capture_ok"] and r["context_features"] == 3 and len(set(r["capture_points"])) == 3
        # SGLang 0.5.23's Gemma 3 target has no DFLASH capture hook; the Gemma 4 one has every hook
        hooks = ["set_dflash_layers_to_capture|set_dspark_layers_to_capture"] if (t, algorithm) == ("gemma3", "DFLASH") else []
        assert r["missing_target_hooks"] == hooks, (t, algorithm)
    eagle3 = reports[drafts[("gemma3", "EAGLE3")]]
    assert "model.layers.0.mlp.gate_up_proj.weight" in eagle3["loaded"] and "model.fc.weight" in eagle3["loaded"]

    r = reports[broken["renamed"]]
    assert not r["ok"] and "layers.0.mlp.upproj.weight" in r["unexpected"]
    assert "model.layers.0.mlp.gate_up_proj.weight" in r["missing"] + r["mismatched"]
    r = reports[broken["dropped"]]
    assert not r["ok"] and r["missing"] == ["model.fc.bias"]
    r = reports[broken["reshaped"]]
    assert not r["ok"] and (r["error"] or r["mismatched"])
