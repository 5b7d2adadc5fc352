"""Run in a fresh process by test_sglang_plugin.py: SGLang's own code paths that select attention
backends by name, with or without triton-swa's plugin loaded by SGLang's own loader. Prints one
JSON object: what each path did with ``triton_swa``.

    python sglang_plugin_probe.py plugin|none WORKDIR
"""

from __future__ import annotations

import json
import os
import sys
from unittest.mock import MagicMock


def outcome(fn):
    try:
        return {"ok": True, "value": fn()}
    except Exception as e:  # the probe reports what SGLang raised; the test decides
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def resolve(path: str, **kwargs) -> str:
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(model_path=path, device="cpu", skip_tokenizer_init=True, **kwargs)
    args.resolve_once()
    return f"{args.attention_backend}"


def main() -> None:
    mode, work = sys.argv[1], sys.argv[2]
    os.environ["SGLANG_PLUGINS"] = "triton_swa" if mode == "plugin" else "none-at-all"
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.plugins.hook_registry import HookRegistry

    from triton_swa.testing.tiny_models import build_tiny_model

    report = {"patched": sorted(HookRegistry._patched)}
    for family in ("gemma4", "gpt-oss", "gemma3"):
        path = os.path.join(work, family)
        if not os.path.exists(os.path.join(path, "config.json")):
            build_tiny_model(family, path)
        report[f"resolve-{family}"] = outcome(lambda path=path: resolve(path, attention_backend="triton_swa"))
    report["resolve-gemma4-split"] = outcome(
        lambda: resolve(os.path.join(work, "gemma4"), prefill_attention_backend="triton_swa", decode_attention_backend="triton_swa")
    )

    from sglang.srt.speculative import draft_utils
    from sglang.srt.speculative.dflash_utils import resolve_dflash_verify_mask_policy

    from triton_swa.integrations.sglang import TritonSWAMultiStepDraftBackend, TritonSWASGLangBackend

    backend = object.__new__(TritonSWASGLangBackend)
    report["dflash-policy"] = list(resolve_dflash_verify_mask_policy(backend))

    # The draft-backend factory over a runner whose draft backend is triton_swa; each created
    # backend is replaced by a marker (constructing one needs a live runner: the engine tier does).
    draft_utils.attention_backends = lambda: ("triton_swa", "triton_swa")
    draft_utils.get_spec = lambda: MagicMock(speculative_attention_mode="prefill")
    made = []
    import triton_swa.integrations.sglang as adapter

    adapter.TritonSWASGLangBackend = lambda runner: made.append("extend") or MagicMock(attn_backends=[])
    adapter.TritonSWAMultiStepDraftBackend = lambda runner, topk, steps: (
        made.append(f"multistep-{topk}-{steps}") or MagicMock(attn_backends=[MagicMock()])
    )
    runner = MagicMock()
    runner.draft_attention_backend = "triton_swa"
    factory = draft_utils.DraftBackendFactory(runner, 1, 3)
    report["draft-extend"] = outcome(lambda: factory.create_draft_extend_backend() is not None and made[-1])
    report["patched-after-draft-extend"] = sorted(HookRegistry._patched)
    report["draft-decode"] = outcome(lambda: factory.create_decode_backend() is not None and made[-1])
    adapter.TritonSWASGLangBackend, adapter.TritonSWAMultiStepDraftBackend = TritonSWASGLangBackend, TritonSWAMultiStepDraftBackend
    report.update(draft_extend_graphs(TritonSWASGLangBackend))
    print("PROBE " + json.dumps(report))


def draft_extend_graphs(backend_class) -> dict:
    """The EAGLE draft worker's ``_capture_cuda_graphs`` with a triton_swa draft-extend backend, as on a
    CUDA machine with graphs on where SGLang's own capture built no draft-extend runner (here it stops
    at its CPU check): the runner the worker then holds, by class name (SGLang's runner class is a
    recording stand-in: a real capture needs a GPU, which the GPU engine tier has). Also with
    ``TRITON_SWA_DRAFT_EXTEND_GRAPH=0``, and with a runner whose capture fails."""
    import torch
    from sglang.srt.speculative import eagle_worker_v2 as sg

    class Runner:
        def __init__(self, worker):
            if worker.fail:
                raise RuntimeError("capture failed")

    sg._is_cuda, sg.EAGLEDraftExtendCudaGraphRunner = True, Runner
    sg.check_cuda_graph_backend = lambda phase, backend: False
    backend = object.__new__(backend_class)
    backend.core = MagicMock(device=torch.device("cuda"))

    def held(fail=False, env="1"):
        os.environ["TRITON_SWA_DRAFT_EXTEND_GRAPH"] = env
        worker = MagicMock(draft_extend_attn_backend=backend, fail=fail)
        sg.EagleDraftWorker._capture_cuda_graphs(worker)
        return type(worker.cuda_graph_runner_for_draft_extend).__name__

    return {
        "draft-extend-graph": outcome(held),
        "draft-extend-graph-off": outcome(lambda: held(env="0")),
        "draft-extend-graph-failed": outcome(lambda: held(fail=True)),
    }


if __name__ == "__main__":
    main()
