"""The real-engine tier: SGLang's own ``sglang.Engine`` on this CPU, serving tiny random-weight models.

Needs sglang 0.5.23 (scripts/setup_sglang.sh) and the engine's serving packages
(scripts/setup_sglang_engine.sh); skipped with the missing names otherwise. The engine runs in
subprocesses (triton_swa.testing.sglang_engine) with ``tests/engine/stubs`` (an ``sgl_kernel``
stand-in) and, where the real torchvision does not import, ``tests/integration/stubs`` on their
``PYTHONPATH``.

Session fixtures share what is expensive: the models are built once, each engine run (model x backend
x speculative settings) happens at most once and serves every test that reads it, and each
transformers reference is computed once.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ENGINE_STUBS = os.path.join(HERE, "stubs")
TORCHVISION_STUBS = os.path.join(os.path.dirname(HERE), "integration", "stubs")

# import name -> what provides it (scripts/setup_sglang_engine.sh installs them)
ENGINE_MODULES = {
    "sglang": "sglang==0.5.23 (scripts/setup_sglang.sh)",
    "triton": "triton",
    "transformers": "transformers",
    "tokenizers": "tokenizers",
    "uvloop": "uvloop",
    "fastapi": "fastapi",
    "opentelemetry": "opentelemetry-api",
    "uvicorn": "uvicorn",
    "setproctitle": "setproctitle",
    "prometheus_client": "prometheus-client",
    "multipart": "python-multipart",
    "interegular": "interegular",
    "xxhash": "xxhash",
    "dateutil": "python-dateutil",
    "jsonschema": "jsonschema",
    "soundfile": "soundfile",
    "xgrammar": "xgrammar",
}


def _missing_modules() -> list[str]:
    return [f"{mod} ({pkg})" for mod, pkg in ENGINE_MODULES.items() if importlib.util.find_spec(mod) is None]


def _torchvision_imports() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import torchvision.transforms"], capture_output=True, timeout=120)
    return probe.returncode == 0


@pytest.fixture(scope="session")
def engine_pythonpath() -> list[str]:
    """What the engine's processes need on PYTHONPATH; skips the tier when its packages are missing."""
    missing = _missing_modules()
    if missing:
        pytest.skip("real-engine tier needs: " + ", ".join(missing) + " (scripts/setup_sglang.sh, then scripts/setup_sglang_engine.sh)")
    if importlib.util.find_spec("sgl_kernel") is not None:
        paths = []  # a real sgl_kernel wins
    else:
        paths = [ENGINE_STUBS]
    if not _torchvision_imports():
        paths.append(TORCHVISION_STUBS)
    return paths


@pytest.fixture(scope="session")
def tiny_models(engine_pythonpath, tmp_path_factory) -> dict[str, str]:
    """family -> directory of its tiny model (built once per session)."""
    from triton_swa.testing.tiny_models import FAMILIES, build_tiny_model

    root = tmp_path_factory.mktemp("tiny_models")
    return {family: build_tiny_model(family, str(root / family), seed=0) for family in FAMILIES}
