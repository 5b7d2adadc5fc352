"""Registry checks of the vLLM tier, each in a fresh interpreter (vLLM's registry is process-global).

    python tests/integration/vllm_plugin_probe.py MODE        prints one JSON object

Modes:
- ``plugins``: vLLM's own ``load_general_plugins()`` (the ``vllm.general_plugins`` entry point) makes
  ``TRITON_SWA`` resolvable by name, by ``CUSTOM`` and through ``AttentionConfig``; a second
  ``register()`` is a no-op; ``TORCH_SDPA``'s value ``""`` still maps to ``TORCH_SDPA``.
- ``unpickle``: reads the pickles of ``CUSTOM`` and ``TRITON_SWA`` from stdin and loads them, in that
  order, without loading plugins first (a spawned worker); then loads the plugins and resolves both.
- ``collision``: another class path registered as ``TRITON_SWA`` first; ``register()`` must raise.
"""

from __future__ import annotations

import json
import pickle
import sys


def main(mode: str) -> dict:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum as Backends

    if mode == "plugins":
        from vllm.config import AttentionConfig
        from vllm.plugins import load_general_plugins

        before = "TRITON_SWA" in Backends.__members__
        load_general_plugins()
        import triton_swa.integrations.vllm as integration

        integration.register()  # again: idempotent
        member = Backends["TRITON_SWA"]
        cls = member.get_class()
        config = AttentionConfig(backend="triton_swa", backend_per_kind={"sliding_window": "TRITON_SWA"})
        return {
            "registered_before_plugins": before,
            "name": member.name,
            "class": f"{cls.__module__}.{cls.__qualname__}",
            "get_name": cls.get_name(),
            "custom": Backends.CUSTOM.get_path(),
            "config_backend": config.backend.name,
            "config_per_kind": config.backend_per_kind["sliding_window"].name,
            "empty_value_is": Backends("").name,
        }
    if mode == "unpickle":
        custom_pickle, member_pickle = pickle.loads(sys.stdin.buffer.read())
        custom = pickle.loads(custom_pickle)
        custom_overridden = custom.is_overridden()  # not before a plugin registered it
        member = pickle.loads(member_pickle)  # registers TRITON_SWA (and CUSTOM) on the way
        from vllm.plugins import load_general_plugins

        load_general_plugins()
        return {
            "names": [custom.name, member.name],
            "same_objects": custom is Backends.CUSTOM and member is Backends["TRITON_SWA"],
            "custom_overridden_on_unpickle": custom_overridden,
            "triton_swa_path": member.get_path(),
            "custom_path": custom.get_path(),
        }
    if mode == "collision":
        from vllm.v1.attention.backends.registry import register_backend

        register_backend("TRITON_SWA", "somebody.else.Backend")
        import triton_swa.integrations.vllm as integration

        try:
            integration.register()
        except RuntimeError as e:
            return {"raised": str(e)}
        return {"raised": None}
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    result = main(sys.argv[1])
    sys.stdout.flush()
    print("PROBE " + json.dumps(result))
