"""The subprocess side of :func:`triton_swa.testing.sglang_engine.run_engine` (not a public API).

``python -m triton_swa.testing._engine_worker SPEC.json RESULT.json``: starts ``sglang.Engine`` with
the spec's arguments, generates the spec's prompts in one batch, shuts the engine down and writes
the result (output ids, speculative meta, timings, or the stage that failed and its traceback).
The result file is rewritten after each stage, so a timeout still says how far the run got. The
engine spawns its scheduler with ``multiprocessing``'s spawn method, which re-imports this module:
everything runs under the ``__main__`` guard.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


def _write(path: str, result: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, path)


def _alias_backends_in_model_checks(aliases: dict) -> None:
    """Let SGLang's per-model server-argument checks read backend ``a`` as ``aliases[a]`` (through the
    same resolution-step hook the plugin uses for ``triton_swa``).

    Only for controls the caller asks for explicitly (e.g. ``{"torch_native": "triton"}``: SGLang
    0.5.23's Gemma 4 allow-list refuses its own ``torch_native``). The engine still builds the backend
    it was given; only the allow-list reads another name.
    """
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

    from triton_swa.integrations.sglang import read_backends_as

    register_resolution_hook("handle_model_specific_adjustments")(read_backends_as(aliases))


def main(spec_path: str, result_path: str) -> int:
    from triton_swa.testing.sglang_engine import _spec_meta

    with open(spec_path) as f:
        spec = json.load(f)
    result = {"ok": False, "stage": "import", "error": "", "outputs": [], "meta": [], "start_s": 0.0, "generate_s": 0.0}
    _write(result_path, result)
    engine = None
    try:
        t0 = time.monotonic()
        import sglang

        if spec.get("alias_backends_in_model_checks"):
            _alias_backends_in_model_checks(spec["alias_backends_in_model_checks"])
        result["stage"] = "launch"
        _write(result_path, result)
        engine = sglang.Engine(**spec["engine_args"])
        result["start_s"] = time.monotonic() - t0
        result["stage"] = "generate"
        _write(result_path, result)
        t1 = time.monotonic()
        outs = engine.generate(input_ids=spec["prompts"], sampling_params=spec["sampling_params"])
        result["generate_s"] = time.monotonic() - t1
        outs = outs if isinstance(outs, list) else [outs]
        result["outputs"] = [list(o["output_ids"]) for o in outs]
        result["meta"] = [_spec_meta(o.get("meta_info", {})) for o in outs]
        result["ok"], result["stage"] = True, "done"
    except BaseException as e:  # noqa: BLE001 - everything is reported to the parent
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc()
        traceback.print_exc()
    finally:
        _write(result_path, result)
        if engine is not None:
            try:
                engine.shutdown()
            except Exception:  # noqa: BLE001
                traceback.print_exc()
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
