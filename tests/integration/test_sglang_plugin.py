"""SGLang tier: what triton-swa's plugin changes in SGLang 0.5.23, checked on SGLang's real code.

SGLang refuses or mis-serves an attention backend it does not know by name in a few places
(model allow-lists, the draft-backend factory, DFlash's verify-mask policy). The plugin hooks each
through SGLang's own mechanisms. ``sglang_plugin_probe.py`` runs SGLang's code paths in a fresh
process (plugins load once per process) twice: with SGLang's plugin loader selecting triton_swa,
and with no plugin as the control, so that a hook that stops taking effect, or an SGLang change
that makes it unnecessary, fails here loudly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("sglang.srt.plugins", reason="SGLang tier: sglang 0.5.23 is not installed (bash scripts/setup_sglang.sh installs it)")
# SGLang's model runner, which the hooked paths import, needs its serving packages
pytest.importorskip("uvicorn", reason="SGLang's serving packages are not installed (bash scripts/setup_sglang_engine.sh installs them)")

pytestmark = pytest.mark.sglang

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def probe_env() -> dict:
    """SGLang's imports on a CPU (the real-engine tier's environment): the torchvision stub, the
    engine tier's sgl_kernel stub."""
    from triton_swa.testing.sglang_engine import engine_env

    return engine_env([os.path.join(HERE, "stubs"), os.path.join(ROOT, "tests", "engine", "stubs")])


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    work = str(tmp_path_factory.mktemp("sglang-plugin"))
    out, env = {}, probe_env()
    # both probes at once, each in its own folder: each spends its time importing SGLang's model modules
    runs = {
        mode: subprocess.Popen(
            [sys.executable, os.path.join(HERE, "sglang_plugin_probe.py"), mode, os.path.join(work, mode)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mode in ("plugin", "none")
    }
    try:
        for mode, run in runs.items():
            stdout, stderr = run.communicate(timeout=600)
            lines = [line for line in stdout.splitlines() if line.startswith("PROBE ")]
            assert run.returncode == 0 and lines, f"the probe failed ({mode}):\n{stderr[-3000:]}"
            out[mode] = json.loads(lines[-1][len("PROBE ") :])
    finally:
        for run in runs.values():
            if run.poll() is None:
                run.kill()
    return out


def test_hooks_apply_through_sglangs_plugin_loader(probes):
    assert probes["plugin"]["patched"] == [
        "sglang.srt.models.gemma3_mm.Gemma3ForConditionalGeneration.prepare_attn_masks",
        "sglang.srt.models.gemma4_mm.Gemma4ForConditionalGeneration.prepare_attn_masks",
        "sglang.srt.speculative.dflash_utils.resolve_dflash_verify_mask_policy",
        "sglang.srt.speculative.draft_utils.DraftBackendFactory._create_backend",
    ]
    assert probes["none"]["patched"] == []
    # the draft worker's capture is hooked once a triton_swa draft-extend backend is made (not at load,
    # which would import SGLang's speculative worker into every process)
    assert probes["plugin"]["patched-after-draft-extend"] == [
        *probes["plugin"]["patched"],
        "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._capture_cuda_graphs",
    ]


@pytest.mark.parametrize("family", ["gemma4", "gpt-oss", "gemma3"])
def test_server_args_resolve_with_triton_swa(probes, family):
    got = probes["plugin"][f"resolve-{family}"]
    assert got == {"ok": True, "value": "triton_swa"}, got


@pytest.mark.parametrize("family", ["gemma4", "gpt-oss"])
def test_without_the_plugin_sglang_refuses_gemma4_and_gpt_oss(probes, family):
    """The control: the allow-lists the plugin's resolution hook opens are still there."""
    got = probes["none"][f"resolve-{family}"]
    assert not got["ok"] and got["error"].startswith("AssertionError") and "triton_swa" in got["error"], got


def test_split_prefill_and_decode_backends_resolve(probes):
    assert probes["plugin"]["resolve-gemma4-split"]["ok"], probes["plugin"]["resolve-gemma4-split"]
    assert not probes["none"]["resolve-gemma4-split"]["ok"]


def test_dflash_verifies_its_chain_without_a_mask(probes):
    """With the plugin, SGLang's graph runner captures DFlash's verify without a mask, as it replays it."""
    assert probes["plugin"]["dflash-policy"] == ["TritonSWASGLangBackend", False]
    assert probes["none"]["dflash-policy"] == ["TritonSWASGLangBackend", True]


def test_the_draft_backend_factory_builds_triton_swa_backends(probes):
    assert probes["plugin"]["draft-extend"] == {"ok": True, "value": "extend"}
    assert probes["plugin"]["draft-decode"] == {"ok": True, "value": "multistep-1-3"}
    assert "not supported in decode attention backend triton_swa" in probes["none"]["draft-decode"]["error"]


def test_the_draft_worker_captures_a_triton_swa_draft_extend(probes):
    """SGLang 0.5.23 builds its draft-extend graph runner only for its own backends' classes; with the
    plugin, the draft worker holds one for a triton_swa draft-extend backend (on CUDA, graphs on),
    none with TRITON_SWA_DRAFT_EXTEND_GRAPH=0, and none (eager, as before) when the capture fails."""
    plugin, none = probes["plugin"], probes["none"]
    assert plugin["draft-extend-graph"] == {"ok": True, "value": "Runner"}, plugin["draft-extend-graph"]
    assert plugin["draft-extend-graph-off"] == {"ok": True, "value": "NoneType"}
    assert plugin["draft-extend-graph-failed"] == {"ok": True, "value": "NoneType"}
    assert none["draft-extend-graph"] == {"ok": True, "value": "NoneType"}
