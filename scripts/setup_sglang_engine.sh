#!/usr/bin/env bash
# Install the real-engine tier (tests/engine: SGLang's own sglang.Engine and launch_server on a CPU,
# serving tiny random-weight models) on top of the SGLang tier (scripts/setup_sglang.sh).
#
#   scripts/setup_sglang_engine.sh [VENV_PYTHON]      (default: .venv/bin/python)
#
# What it installs, every version pinned, all with --no-deps (as scripts/setup_sglang.sh: pip never
# resolves a torch or SGLang's CUDA dependencies): the serving packages that `sglang.Engine` and
# `python -m sglang.launch_server` import beyond the SGLang tier's pins, and their pure-Python (or
# CPU wheel) closure, found by starting an engine on a CPU until nothing was missing. Where SGLang
# pins a version (xgrammar, soundfile) that pin is used. python-dateutil is only installed where none
# is (SGLang asks for <3; any version present is kept, other packages of the venv may depend on it).
#
# Not installed, on purpose:
#   - sgl-kernel (SGLang's compiled kernels; CUDA wheels, several hundred MiB): tests/engine/stubs
#     stands in for it, put on the engine processes' PYTHONPATH by triton_swa.testing.sglang_engine;
#   - torchvision (does not load beside a CPU torch): tests/integration/stubs, as for the SGLang tier.
#
# Idempotent: pins already satisfied are not reinstalled, and a complete venv needs no network.
# Prints "SGLang engine tier: installed", or "SGLang engine tier: SKIPPED (reason)" and exits 0 when
# the package registry cannot be reached or the SGLang tier is not installed; any other failure exits 1.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
ENGINE_STUBS="$PWD/tests/engine/stubs"
TV_STUBS="$PWD/tests/integration/stubs"
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT

skip() { echo "SGLang engine tier: SKIPPED ($*)"; exit 0; }
fail() { echo "SGLang engine tier: FAILED ($*)" >&2; [ -s "$LOG" ] && tail -n 20 "$LOG" >&2; exit 1; }

[ -x "$PY" ] || fail "no python at $PY; create the venv first (scripts/setup_env.sh)"
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"

PINS=(
  # what sglang.Engine / launch_server import at start-up
  uvloop==0.23.0 fastapi==0.165.0 uvicorn==0.54.0 setproctitle==1.3.8 prometheus-client==0.26.0
  python-multipart==0.0.34 interegular==0.3.3 xxhash==4.1.0 jsonschema==4.26.0
  soundfile==0.13.1 xgrammar==0.2.7
  # their closure (fastapi -> opentelemetry-api, annotated-doc; jsonschema -> referencing, ...;
  # soundfile -> cffi)
  opentelemetry-api==1.45.2 importlib-metadata==10.2.0 zipp==4.1.2 annotated-doc==0.0.7 click==8.5.1
  jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
  cffi==2.1.1 pycparser==3.12
)

source "$(dirname "$0")/pins.sh"

"$PY" -m pip --version >/dev/null 2>&1 || fail "$PY has no pip"
"$PY" -c "import sglang" >/dev/null 2>&1 || skip "sglang is not installed in $PY; run scripts/setup_sglang.sh first"

if ! "$PY" -c "import dateutil" >/dev/null 2>&1; then
  PINS+=(python-dateutil==2.9.0.post0)
fi
install_pins setup_sglang_engine "${PINS[@]}"

# The import check, as the engine's processes see it: the sgl_kernel stub (unless a real one
# imports), the torchvision stub where the real one does not import, SGLang's CPU paths.
STUB_PATH="$ENGINE_STUBS"
if "$PY" -c "import sgl_kernel" >/dev/null 2>&1; then
  STUB_PATH=""
fi
if ! "$PY" -c "import torchvision.transforms" >/dev/null 2>&1; then
  STUB_PATH="${STUB_PATH:+$STUB_PATH:}$TV_STUBS"
fi
if ! (cd /tmp && SGLANG_USE_CPU_ENGINE=1 TORCHDYNAMO_DISABLE=1 TRITON_INTERPRET=1 \
      PYTHONPATH="$STUB_PATH${PYTHONPATH:+:$PYTHONPATH}" "$PY" - >"$LOG" 2>&1 <<'EOF'
import fastapi, uvicorn, uvloop, setproctitle, prometheus_client, multipart, interegular, xxhash
import dateutil, jsonschema, soundfile, xgrammar
import sglang
from sglang.srt.entrypoints.engine import Engine
from sglang.srt.entrypoints.http_server import launch_server
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.models.gemma3_causal import Gemma3ForCausalLM
from sglang.srt.models.gemma4_causal import Gemma4ForCausalLM
from sglang.srt.models.gpt_oss import GptOssForCausalLM
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
import triton_swa.testing.sglang_engine, triton_swa.testing.tiny_models
EOF
); then
  fail "engine imports"
fi
echo "SGLang engine tier: installed"
