"""Test-side, for vLLM's real engine on a CPU (tests/integration/test_vllm_engine.py): vLLM 0.32's
``CpuPlatform.get_attn_backend_cls`` returns its own CPU_ATTN whatever a layer asks for; with this
folder first on ``PYTHONPATH`` it returns TRITON_SWA's path where TRITON_SWA is asked for, so the
engine's layers run triton-swa's kernels (in Triton's interpreter). Nothing else changes. Each such
answer appends a line to the file ``TRITON_SWA_VLLM_CPU_LOG`` names, so a test can tell it happened.

Python imports ``sitecustomize`` at every interpreter start, the engine's spawned processes too; the
patch is applied when ``vllm.platforms.cpu`` is first imported (an import hook), never before."""

import importlib.abc
import importlib.machinery
import os
import sys


class _PatchCpuPlatform(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "vllm.platforms.cpu":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            platform = module.CpuPlatform
            vllms_own = platform.get_attn_backend_cls.__func__

            def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None):
                if selected_backend is not None and selected_backend.name == "TRITON_SWA":
                    log = os.environ.get("TRITON_SWA_VLLM_CPU_LOG")
                    if log:
                        with open(log, "a") as f:
                            f.write(f"{os.getpid()} TRITON_SWA\n")
                    return selected_backend.get_path()
                return vllms_own(cls, selected_backend, attn_selector_config, num_heads)

            platform.get_attn_backend_cls = classmethod(get_attn_backend_cls)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PatchCpuPlatform())
